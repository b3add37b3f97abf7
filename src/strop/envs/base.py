"""The protocol of a multi-turn tool-use environment, independent of transport (in-process, WebSocket, OpenEnv).

    env = get_env("finance-sql", seed=0)
    [task] = env.tasks("train", limit=1)
    first = env.reset(task)                     # an Observation: the question and how to answer
    result = env.step(ToolCall("list_tables", {}))
    result.observation.content, result.reward, result.done
    env.state()                                 # the episode so far: turns, calls, errors, answer, rubric counts

An episode: `reset(task)` gives the first observation (what the model reads as the user's message); each model
turn that makes a tool call goes to `step`, whose observation is the tool's reply (what the model reads next);
the episode ends when `done` is true (an answer was submitted, or the turn limit was reached). The reward of
the episode is the reward of the step that ended it. A bad call (an unknown tool, arguments that do not fit
the schema, a call that cannot be parsed) is an observation saying what was wrong, never an exception.

`tools()` are OpenAI-style function schemas:
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": {JSON schema}}}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from strop.tool_calls import ToolCall  # noqa: F401 - part of the protocol; the type is shared with renderers


@dataclass(frozen=True)
class Task:
    """One problem: `prompt` is what the model is asked; `answer` the gold answer (text); `split` names where it
    comes from (e.g. train, eval-single, eval-multi); `meta` anything else (tables involved, kind of question)."""

    id: str
    prompt: str
    answer: str
    split: str
    meta: dict = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Task:
        return cls(id=data["id"], prompt=data["prompt"], answer=data["answer"], split=data["split"],
                   meta=dict(data.get("meta") or {}))


@dataclass(frozen=True)
class Observation:
    content: str
    metadata: dict = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class StepResult:
    observation: Observation
    reward: float = 0.0
    done: bool = False
    info: dict = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict:
        return {"observation": {"content": self.observation.content, "metadata": self.observation.metadata},
                "reward": self.reward, "done": self.done, "info": self.info}


@runtime_checkable
class Environment(Protocol):
    """What strop's rollouts, `strop envs try` and `strop envs serve` need of an environment."""

    name: str
    max_turns: int

    def tools(self) -> list[dict[str, Any]]:
        """The tools the model may call, as OpenAI-style function schemas."""

    def tasks(self, split: str, limit: int | None = None) -> list[Task]:
        """The tasks of a split, in a fixed order (seeded by the environment's options)."""

    def splits(self) -> list[str]:
        """The names `tasks` accepts."""

    def reset(self, task: Task) -> Observation:
        """Start an episode on `task`; any previous episode is discarded."""

    def step(self, call: ToolCall) -> StepResult:
        """Carry out one tool call of the current episode."""

    def state(self) -> dict[str, Any]:
        """The current episode: task id, turns used, calls, errors, submitted answer, done, and the behaviour
        counters the rubrics read (JSON-ready)."""

    def close(self) -> None:
        """Release what the environment holds (database connections, files)."""


def call_tool_safely(env, call: ToolCall) -> StepResult:
    """`env.step(call)`; an environment that raises is turned into an observation (a broken environment must
    not kill a run, but it is counted)."""
    try:
        return env.step(call)
    except Exception as exc:  # noqa: BLE001
        reason = f"{type(exc).__name__}: {exc}"
        return StepResult(observation=Observation(f"the environment failed: {reason}"),
                          info={"environmentError": reason})
