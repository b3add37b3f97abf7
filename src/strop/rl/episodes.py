"""What a rollout plays: a dataset row as a one-turn episode, or a tool-use environment's task as an episode of
several turns. Both answer the same four questions, so one rollout loop (`strop.rl.rollouts.play`) runs both:

    messages = episode.start()                    # what the model reads first
    prompt = episode.prompt(renderer, messages)   # the conversation so far as tokens
    observation = episode.act(reply_text)         # what comes back; None once the episode is over
    rollout = episode.finish(turns, messages)     # the frozen Rollout, reward and errors included

A row's episode scores the one reply with the run's reward terms and ends. An environment's episode hands a
`<tool_call>` in the reply to the environment and the tool's reply becomes the next message; a call that cannot
be parsed, or a reply with no call, gets an observation saying so. It ends when the environment says done or
after its turn limit (then its reward is 0). Whatever an environment returns (a remote one included), the model
reads at most OBSERVATION_CHARS characters of it, with a line saying what was cut (`cap_observation`).

A source makes the episodes of one step (`group_size` per row or task) and says how its rollouts are recorded:
`ProblemSource` for datasets, `EnvironmentSource` for environments.
"""

from __future__ import annotations

import dataclasses
import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from strop import types
from strop.data import Row
from strop.envs import get_env
from strop.envs.base import Task, call_tool_safely  # noqa: F401 - call_tool_safely was defined here
from strop.envs.rubrics import rubric_metrics
from strop.renderers.tools import STOP, parse_tool_calls
from strop.rl.types import Rollout, Turn
from strop.scoring import score_terms
from strop.scoring.terms import is_group_term, score_group_terms
from strop.scoring.score_range import SCORE_RANGE, score_problem

JUDGE_GROUPS_AT_ONCE = 8  # a step's groups judged side by side (group terms: one judge call a group)
OBSERVATION_CHARS = 16_000  # ~4,000 tokens: a page of rows; one 37 MB observation would have gone in whole
NO_CALL = ("No tool call found. Call a tool as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>; "
           "give your final answer with the submit_answer tool.")


class Episode(Protocol):
    """What the rollout loop plays: `ProblemEpisode` (a dataset row, one turn) and `ToolEpisode` (an environment's
    task, several turns) are the two kinds."""

    def start(self) -> list[dict]: ...

    def prompt(self, renderer, messages: list[dict]) -> types.ModelInput: ...

    def stop_sequences(self, renderer) -> list[str]: ...

    def act(self, text: str) -> str | None: ...

    def finish(self, turns: list[Turn], messages: list[dict]) -> Rollout: ...


class EpisodeSource(Protocol):
    """Where a step's episodes come from (`ProblemSource` for datasets, `EnvironmentSource` for environments), and
    how their rollouts are recorded and summed up."""

    def episodes(self, items: list, group_size: int) -> list[list[Episode]]: ...

    def record(self, rollout: Rollout, renderer) -> dict: ...

    def metrics(self, rollouts: list[Rollout]) -> dict: ...

    def score_groups(self, groups: list) -> list: ...


def problem_messages(row: Row, system_prompt: str | None = None, question_suffix: str = "") -> list[dict]:
    """The conversation a dataset row starts: the system prompt, if any, then the question (or the row's own
    messages, `Row.conversation`)."""
    return row.conversation(system_prompt, question_suffix)


class ProblemEpisode:
    """A dataset row as a one-turn environment: the reply is scored by every reward term and the episode ends.
    Each term's grader call is one check; a grader that raises or returns a non-number is a failed check."""

    max_turns = 1

    def __init__(self, row: Row, terms, *, system_prompt: str | None = None, question_suffix: str = ""):
        self.row, self.terms = row, terms
        # graders in other processes (a sandbox pool's workers, Ray's): a step's completions are scored at once
        self.concurrent = any(getattr(t.fn, "concurrent", False) for t in terms)
        self.system_prompt, self.question_suffix = system_prompt, question_suffix
        self.scored = None

    def start(self) -> list[dict]:
        return problem_messages(self.row, self.system_prompt, self.question_suffix)

    def prompt(self, renderer, messages: list[dict]) -> types.ModelInput:
        return renderer.build_generation_prompt(messages)

    def stop_sequences(self, renderer) -> list[str]:
        return renderer.get_stop_sequences()

    def act(self, text: str) -> None:
        self.scored = score_terms(self.terms, text, self.row)
        return None

    def finish(self, turns: list[Turn], messages: list[dict]) -> Rollout:
        scored = self.scored
        return Rollout(turns=tuple(turns), reward=scored.total if scored else 0.0,
                       scores=dict(scored.scores) if scored else {}, question=self.row.question, gold=self.row.gold,
                       messages=tuple(messages), checks=len(self.terms),
                       failed=len(scored.errors) if scored else 0, errors=tuple(scored.errors) if scored else ())


class ToolEpisode:
    """A task of a tool-use environment: each reply's first tool call goes to the environment until it says done
    or `max_turns` replies were made. The episode is one check; it failed when the environment raised."""

    def __init__(self, env, task: Task, *, system_prompt: str | None = None, max_turns: int | None = None,
                 tools: list[dict] | None = None):
        self.env, self.task, self.system_prompt = env, task, system_prompt
        self.max_turns = max_turns or env.max_turns
        self.tools: list[dict] = tools if tools is not None else []
        self._ask_tools = tools is None
        self.done, self.reward, self.info = False, 0.0, {}
        self.parse_errors = 0
        self.environment_errors: list[str] = []

    @property
    def concurrent(self) -> bool:
        return getattr(self.env, "concurrent", False)  # an environment in another process

    def start(self) -> list[dict]:
        if self._ask_tools:
            self.tools = self.env.tools()
        first = self.env.reset(self.task)
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": cap_observation(first.content)})
        return messages

    def prompt(self, renderer, messages: list[dict]) -> types.ModelInput:
        return renderer.build_tool_prompt(messages, self.tools)

    def stop_sequences(self, renderer) -> list[str]:
        return [*renderer.get_stop_sequences(), STOP]

    def act(self, text: str) -> str | None:
        calls, problems = parse_tool_calls(text)
        if not calls:
            self.parse_errors += 1
            return problems[0] + " Write the call again as valid JSON." if problems else NO_CALL
        result = call_tool_safely(self.env, calls[0])
        observation = cap_observation(result.observation.content)
        if result.info.get("environmentError"):
            self.environment_errors.append(str(result.info["environmentError"]))
        if len(calls) > 1:
            observation += f"\n(only the first of your {len(calls)} tool calls was run; make one call per turn)"
        if result.done:
            self.done, self.reward, self.info = True, self._reward(result.reward), dict(result.info)
            return None
        return observation

    def _reward(self, raw) -> float:
        """The episode's reward, or 0.0 and an environment error when it is not a score (NaN, 1e39: see
        `strop.scoring.score_range`)."""
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value, problem = 0.0, f"{type(raw).__name__} {str(raw)[:60]!r}"
        else:
            problem = score_problem(value)
        if problem:
            self.environment_errors.append(f"environment {getattr(self.env, 'name', '?')!r} gave the reward "
                                           f"{problem}; a reward must be {SCORE_RANGE} (scored 0.0)")
            return 0.0
        return value

    def finish(self, turns: list[Turn], messages: list[dict]) -> Rollout:
        return Rollout(turns=tuple(turns), reward=self.reward, scores={}, question=self.task.prompt,
                       gold=self.task.answer, task_id=self.task.id, messages=tuple(messages), checks=1,
                       failed=1 if self.environment_errors else 0, errors=tuple(self.environment_errors),
                       parse_errors=self.parse_errors, state=self.env.state(), info=self.info)


def cap_observation(text: str, limit: int = OBSERVATION_CHARS) -> str:
    """An environment's text as a model reads it: whole, or its first `limit` characters and a line saying how
    much was cut (so the model, and whoever reads the transcript, can tell)."""
    text = text if isinstance(text, str) else str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[observation truncated: {len(text):,} characters, only the first {limit:,} shown]"


class EnvPool:
    """One environment per episode of a step (batch x group), made once and reset for every episode. Only the
    first is made at once (its tools and tasks size the run); `fill()` makes the rest once the run is admitted:
    in this process, or, with `ray` settings naming environment workers, in worker actors on the cluster
    (`strop.cluster.envs`; the first stays here for the tasks)."""

    def __init__(self, spec: dict, size: int, ray=None):
        self.name, self.options, self.size = spec["name"], dict(spec.get("options") or {}), size
        self.first = get_env(self.name, **self.options)
        self.envs = [self.first]
        self.ray = ray if ray is not None and ray.env_workers else None
        self.workers = None

    def fill(self) -> EnvPool:
        if self.ray is not None:
            if self.workers is None:
                from strop.cluster.envs import EnvWorkers  # lazy: Ray is an extra
                self.workers = EnvWorkers({"name": self.name, "options": self.options}, self.size, settings=self.ray)
                self.envs = self.workers.envs
            return self
        while len(self.envs) < self.size:
            self.envs.append(get_env(self.name, **self.options))
        return self

    def facts(self) -> dict:
        """Where the environments run, for the run's engine.json."""
        return {"envWorkers": self.workers.facts} if self.workers is not None else {}

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        return self.first.tasks(split, limit)

    def close(self) -> None:
        if self.workers is not None:
            self.workers.close()
            self.first.close()
            return
        for env in self.envs:
            env.close()


class ProblemSource:
    """Dataset rows, each the start of `group_size` one-turn episodes scored by the reward terms."""

    failure = "grader calls failed"

    def __init__(self, terms, *, system_prompt: str | None = None, question_suffix: str = ""):
        self.terms, self.system_prompt, self.question_suffix = terms, system_prompt, question_suffix
        self._judged = {t.name: _judge_stats(t) for t in terms if _judge_stats(t) is not None}

    def episodes(self, rows: list[Row], group_size: int) -> list[list[ProblemEpisode]]:
        return [[ProblemEpisode(row, self.terms, system_prompt=self.system_prompt,
                                question_suffix=self.question_suffix) for _ in range(group_size)] for row in rows]

    def record(self, rollout: Rollout, renderer) -> dict:
        turn = rollout.turns[0]
        return {"prompt": renderer.tokenizer.decode(turn.prompt.to_ints()), "question": rollout.question,
                "gold": rollout.gold, "completion": rollout.text, "scores": rollout.scores,
                "tokens": len(turn.tokens), "stop_reason": turn.stop_reason, "errors": list(rollout.errors)}

    def score_groups(self, groups: list) -> list:
        """Each complete group with its group terms scored (a judge ranking the group's completions against each
        other) and added to every rollout's scores and reward; the other terms were scored reply by reply."""
        if not any(is_group_term(t) for t in self.terms):
            return groups
        weights = {t.name: t.weight for t in self.terms}

        def judged(group) -> tuple[list[dict], list[str]]:
            return score_group_terms(self.terms, group[0].question, group[0].gold, [r.text for r in group])
        # the step's groups are judged at once: an endpoint serves the calls side by side, and a local judge's
        # sampler batches them, where one after another a step of 8 groups waited for 8 calls in turn
        with ThreadPoolExecutor(max_workers=max(1, min(JUDGE_GROUPS_AT_ONCE, len(groups)))) as pool:
            verdicts = list(pool.map(judged, groups))
        return [tuple(dataclasses.replace(
            r, scores={**r.scores, **s}, reward=r.reward + sum(weights[k] * v for k, v in s.items()),
            failed=r.failed + len(errors), errors=r.errors + tuple(errors)) for r, s in zip(group, scores))
            for group, (scores, errors) in zip(groups, verdicts)]

    def metrics(self, rollouts: list[Rollout]) -> dict:
        row = {"terms": {t.name: t.weight * statistics.fmean(r.scores.get(t.name, 0.0) for r in rollouts)
                         for t in self.terms}}
        if self._judged:  # what the judge terms cost since the last step's report
            now = {t.name: _judge_stats(t) for t in self.terms if t.name in self._judged}
            spent = {k: sum(now[n][k] - self._judged[n][k] for n in now)
                     for k in ("calls", "cacheHits", "failures", "seconds")}
            self._judged = now
            row.update(judgeCalls=spent["calls"], judgeCacheHits=spent["cacheHits"],
                       judgeFailures=spent["failures"], judgeSeconds=spent["seconds"])
        return row


def _judge_stats(term) -> dict | None:
    """A judge term's cost so far (`JudgeGrader.stats`); None for any other grader."""
    stats = getattr(term.fn, "stats", None)
    return stats() if (term.ref or "").startswith("judge:") and callable(stats) else None


class EnvironmentSource:
    """An environment's tasks, each the start of `group_size` episodes, one pooled environment per episode."""

    failure = "episodes met an environment error"

    def __init__(self, pool: EnvPool, *, system_prompt: str | None = None, max_turns: int | None = None):
        self.pool, self.system_prompt, self.max_turns = pool, system_prompt, max_turns

    def episodes(self, tasks: list[Task], group_size: int) -> list[list[ToolEpisode]]:
        envs = self.pool.fill().envs
        if len(envs) < len(tasks) * group_size:
            raise ValueError(f"need {len(tasks) * group_size} environments for {len(tasks)} tasks x {group_size}, "
                             f"got {len(envs)}")
        tools = envs[0].tools()  # once a step: every pooled environment is the same one (a remote one asks its server)
        return [[ToolEpisode(envs[t * group_size + g], task, system_prompt=self.system_prompt,
                             max_turns=self.max_turns, tools=tools) for g in range(group_size)]
                for t, task in enumerate(tasks)]

    def record(self, rollout: Rollout, renderer) -> dict:
        return {"task": rollout.task_id, "question": rollout.question, "gold": rollout.gold,
                "turns": len(rollout.turns), "transcript": rollout.transcript(), "state": rollout.state,
                "info": rollout.info, "errors": list(rollout.errors)}

    def score_groups(self, groups: list) -> list:
        return groups  # an environment's reward is its own: no group terms

    def metrics(self, rollouts: list[Rollout]) -> dict:
        turns = sum(len(r.turns) for r in rollouts)
        return {"terms": {self.pool.name: statistics.fmean(r.reward for r in rollouts)},
                "toolCallParseErrors": sum(r.parse_errors for r in rollouts) / len(rollouts),
                "modelTurns": turns / len(rollouts), "rubrics": rubric_metrics([r.state for r in rollouts])}
