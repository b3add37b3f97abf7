"""Evaluate a model in a tool-use environment: pass@1 per split, with the behaviour rubrics.

    report = evaluate_env("HuggingFaceTB/SmolLM2-135M-Instruct", "finance-sql", splits=["eval-single", "eval-multi"])
    report["splits"]["eval-multi"]["pass@1"], report["splits"]["eval-multi"]["rubrics"]

A local model (a base model id or folder, optionally with an adapter) answers greedily through strop's
sampler, tools described Hermes-style. An `openai:NAME@URL` endpoint gets the tools through the API's native
`tools` parameter and answers with `tool_calls`. An episode counts as passed when the environment says the
submitted answer is correct (`info["correct"]`), or, for environments that do not say, when its reward is 1.
"""

from __future__ import annotations

import json
import statistics
import threading
from dataclasses import asdict
from concurrent.futures import ThreadPoolExecutor

from strop import model_info
from strop.client import ServiceClient
from strop.cluster.settings import RaySettings
from strop.envs import get_env
from strop.envs.rubrics import rubric_metrics
from strop.errors import StropError
from strop.evals.headroom import EPISODES_AT_ONCE, SAMPLES, TaskOutcome, headroom
from strop.evals.openai_client import client_for, parse_openai_ref
from strop.renderers import get_renderer
from strop.rl.episodes import EnvironmentSource, EnvPool, cap_observation  # an endpoint model reads what a local one reads
from strop.rl.limits import LIMITS
from strop.rl.rollouts import play
from strop.tokenizer_utils import get_tokenizer
from strop.tool_calls import ToolCall


# episodes played at a time through strop's own engine (`episodes_at_once`)
ENGINE_EPISODES = 32


def _passed(reward: float, info: dict) -> bool:
    return bool(info["correct"]) if "correct" in info else reward >= 1.0


def _summary(episodes: list[dict]) -> dict:
    n = len(episodes)
    return {"n": n, "pass@1": sum(e["passed"] for e in episodes) / n if n else 0.0,
            "meanReward": statistics.fmean(e["reward"] for e in episodes) if n else 0.0,
            "rubrics": {**{k.removeprefix("rubric/"): v for k, v in rubric_metrics([e["state"] for e in episodes]).items()},
                        **valid_call_rate(episodes)},
            "episodes": episodes}


def valid_call_rate(episodes: list[dict]) -> dict[str, float]:
    """The share of the model's turns that made a well-formed tool call (a reply with no call, or one that does
    not parse, is not); whether the call was right is the environment's to say."""
    turns = sum(e["turns"] for e in episodes)
    return {"validToolCalls": 1 - sum(e["invalidCalls"] for e in episodes) / turns} if turns else {}


def evaluate_env(model: str, env_name: str, *, splits: list[str] | None = None, limit: int | None = None,
                 options: dict | None = None, adapter: str | None = None, max_tokens: int = 256,
                 max_turns: int | None = None, api_key_env: str = "OPENAI_API_KEY", concurrency: int = 4,
                 on_progress=None, samples: int | None = None, temperature: float = 1.0, seed: int = 0) -> dict:
    """pass@1, mean reward and rubrics per split of `env_name` for `model` (local, or openai:NAME@URL).
    `on_progress(split, finished, total)` is called as episodes finish. With `samples=K` a local model also
    plays each task K times at `temperature` (seeded from `seed`), and out["headroom"] holds greedy pass@1,
    sampled pass@1, pass@K and the RL pool per kind of task (`strop.evals.headroom`)."""
    _check_sampling(model, samples, temperature)
    probe = get_env(env_name, **(options or {}))
    try:
        splits = splits or [s for s in probe.splits() if s != "train"] or probe.splits()
        tasks = {split: probe.tasks(split, limit) for split in splits}
    finally:
        probe.close()
    out = {"model": model, "environment": env_name, "splits": {}}
    outcomes: list[TaskOutcome] = []
    for split, split_tasks in tasks.items():
        if model.startswith("openai:"):
            episodes = _endpoint_episodes(model, env_name, options or {}, split_tasks, max_tokens=max_tokens,
                                          max_turns=max_turns, api_key_env=api_key_env, concurrency=concurrency,
                                          on_progress=_bound(on_progress, split))
        else:
            episodes = _local_episodes(model, env_name, options or {}, split_tasks, adapter=adapter,
                                       max_tokens=max_tokens, max_turns=max_turns,
                                       on_progress=_bound(on_progress, split))
        out["splits"][split] = _summary(episodes)
        if samples:
            sampled = _sampled_episodes(model, env_name, options or {}, split_tasks, adapter=adapter,
                                        max_tokens=max_tokens, max_turns=max_turns, samples=samples,
                                        temperature=temperature, seed=seed)
            outcomes += [TaskOutcome(split, i, task.id, task.meta.get("kind"), greedy["passed"],
                                     sum(e["passed"] for e in group), samples)
                         for i, (task, greedy, group) in enumerate(zip(split_tasks, episodes, sampled))]
            out["splits"][split]["samples"] = [[{k: e[k] for k in ("reward", "passed", "turns")} for e in group]
                                               for group in sampled]
    if samples:
        out["headroom"] = {**headroom(outcomes, samples), "temperature": temperature,
                           "tasks": [asdict(o) for o in outcomes]}
    return out


def _check_sampling(model: str, samples: int | None, temperature: float) -> None:
    # checked even without --samples: a bad value the greedy run would ignore is still a mistake worth naming
    problem = LIMITS["temperature"].problem(temperature)
    if problem:
        raise StropError(f"--temperature {problem}")
    if samples is None:
        if temperature != 1.0:
            raise StropError(f"--temperature {temperature:g} applies to the --samples K episodes; without --samples "
                             "every episode is played greedily once. Add --samples K or leave --temperature out")
        return
    problem = SAMPLES.problem(samples)
    if problem:
        raise StropError(f"--samples {problem}")
    if model.startswith("openai:"):
        raise StropError("--samples is for local models (base or tuned); an openai:NAME@URL endpoint is evaluated "
                         "greedily once")


def _sampled_episodes(model, env_name, options, tasks, *, adapter, max_tokens, max_turns, samples, temperature,
                      seed) -> list[list[dict]]:
    """Each task's `samples` episodes, a group each, as GRPO samples a group: one request of `samples`
    completions for the group's shared first prompt."""
    return _local_groups(model, env_name, options, tasks, adapter=adapter, max_tokens=max_tokens,
                         max_turns=max_turns, on_progress=None, group=samples, temperature=temperature, seed=seed)


def _bound(on_progress, split: str):
    return None if on_progress is None else (lambda finished, total: on_progress(split, finished, total))


def _local_episodes(model, env_name, options, tasks, *, adapter, max_tokens, max_turns, on_progress) -> list[dict]:
    """Greedy episodes through strop's sampler: the rollout path training uses (`strop.rl.rollouts.play`)."""
    return [e for [e] in _local_groups(model, env_name, options, tasks, adapter=adapter, max_tokens=max_tokens,
                                       max_turns=max_turns, on_progress=on_progress)]


def _local_groups(model, env_name, options, tasks, *, adapter, max_tokens, max_turns, on_progress, group=1,
                  temperature=0.0, seed=0) -> list[list[dict]]:
    """Each task's `group` episodes, played in chunks of at most `episodes_at_once` episodes (a chunk's groups
    seeded as they would be in one batch: the same tokens)."""
    sampler = ServiceClient().create_sampling_client(base_model=model, model_path=adapter)
    renderer = get_renderer(model_info.get_recommended_renderer_name(model), get_tokenizer(model))
    chunk = max(1, episodes_at_once(sampler) // group)
    pool = EnvPool({"name": env_name, "options": options}, min(len(tasks), chunk) * group,
                   ray=RaySettings.from_environment())
    groups = []
    try:
        source = EnvironmentSource(pool, max_turns=max_turns)
        for start in range(0, len(tasks), chunk):
            progress = None if on_progress is None else \
                (lambda finished, _, done=start * group: on_progress(done + finished, len(tasks) * group))
            groups += play(sampler, renderer, source.episodes(tasks[start:start + chunk], group),
                           max_tokens=max_tokens, temperature=temperature, seed=seed + start, on_turn=progress)
    finally:
        pool.close()
    return [[{"task": r.task_id, "gold": r.gold, "reward": r.reward, "passed": _passed(r.reward, r.info),
              "turns": len(r.turns), "invalidCalls": r.parse_errors, "state": r.state, "transcript": r.transcript()}
             for r in g] for g in groups]


def episodes_at_once(sampler) -> int:
    """How many episodes an evaluation plays at a time. strop's own engine keeps each conversation's keys and values
    for its next turn in a prefix cache of at most 4 GiB (`strop.engine.prefix_cache`); more conversations than it
    holds evict one another every turn, and each is then prefilled whole again. ENGINE_EPISODES of them (32:
    finance-sql conversations of ~2,000 tokens, SmolLM2 in float32, take 2.9 GB) run at once there; vLLM, which
    manages its own cache, takes EPISODES_AT_ONCE."""
    return ENGINE_EPISODES if getattr(getattr(sampler, "backend", None), "sampler", "strop") == "strop" \
        else EPISODES_AT_ONCE


def _endpoint_episodes(model, env_name, options, tasks, *, max_tokens, max_turns, api_key_env, concurrency,
                       on_progress=None):
    ref = parse_openai_ref(model)
    client = client_for(ref, api_key_env=api_key_env)
    finished = 0
    lock = threading.Lock()

    def one(task):
        nonlocal finished
        env = get_env(env_name, **options)
        try:
            return _endpoint_episode(client, ref.model, env, task, max_tokens, max_turns or env.max_turns)
        finally:
            env.close()
            if on_progress is not None:
                with lock:
                    finished += 1
                    on_progress(finished, len(tasks))

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(one, tasks))


def _endpoint_episode(client, model_name, env, task, max_tokens, max_turns) -> dict:
    messages = [{"role": "user", "content": cap_observation(env.reset(task).content)}]
    reward, info, turns, error, invalid = 0.0, {}, 0, None, 0
    for turns in range(1, max_turns + 1):
        try:
            reply = client.chat.completions.create(model=model_name, messages=messages, tools=env.tools(),
                                                   max_tokens=max_tokens, temperature=0.0).choices[0].message
        except Exception as exc:  # noqa: BLE001 - after the client's retries: the episode ends, recorded
            error = f"request failed: {type(exc).__name__}: {exc}"
            break
        calls = list(reply.tool_calls or [])
        messages.append({"role": "assistant", "content": reply.content or "",
                         **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})})
        if not calls:
            invalid += 1
            messages.append({"role": "user", "content": "Call a tool; give your final answer with submit_answer."})
            continue
        done = False
        for call in calls:
            try:
                arguments = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError as exc:
                arguments, content = None, f"arguments are not valid JSON: {exc.msg}"
                invalid += 1
            if arguments is not None:
                result = env.step(ToolCall(call.function.name, arguments if isinstance(arguments, dict) else {}, call.id))
                content, done = cap_observation(result.observation.content), result.done
                if done:
                    reward, info = float(result.reward), dict(result.info)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
            if done:
                break
        if done:
            break
    return {"task": task.id, "gold": task.answer, "reward": reward, "passed": _passed(reward, info), "turns": turns,
            "invalidCalls": invalid, "state": env.state(), "transcript": messages, **({"error": error} if error else {})}
