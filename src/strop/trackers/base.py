"""What a tracker is given, and the shapes every tracker shares: a step's scalars, the run's parameters and a
table of sample rollouts, each made once here so that every tracker shows the same numbers.

    class Tracker(Protocol): start(run), log_metrics(step, scalars), log_rollouts(step, table), finish()
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

TABLE_ROWS = 32          # rollouts in a step's sample table: the first groups of the step, whole
CELL_CHARS = 4000        # a completion or transcript past this is cut: a table is for reading, rollouts.jsonl keeps all
PARAM_CHARS = 6000       # MLflow's limit on a parameter's value; a longer config value (a long prompt) is cut


@dataclass(frozen=True)
class RunInfo:
    name: str            # the tracker's run name: the run folder's name (a resumed run adds where it resumed)
    run_dir: Path
    config: dict         # the run's config as config.json holds it, sent as the run's parameters
    project: str = "strop"


@dataclass(frozen=True)
class RolloutTable:
    step: int
    columns: tuple[str, ...]
    rows: tuple[tuple, ...]


class Tracker(Protocol):
    """One backend. Each call may raise or hang: the caller (strop.trackers.background) bounds both."""

    name: str

    def start(self, run: RunInfo) -> None: ...

    def log_metrics(self, step: int, scalars: dict[str, float]) -> None: ...

    def log_rollouts(self, table: RolloutTable) -> None: ...

    def finish(self) -> None: ...


def scalars(row: dict) -> dict[str, float]:
    """The numbers of a metrics.jsonl row that a tracker plots: every finite int or float but the step (None,
    NaN and text are left out, as TensorBoard's events always left them out)."""
    return {key: value for key, value in row.items()
            if key != "step" and isinstance(value, (int, float)) and math.isfinite(value)}


COLUMNS = ("step", "group", "reward", "advantage", "question", "completion", "errors")


def rollout_table(step: int, records: list[dict]) -> RolloutTable:
    """The first TABLE_ROWS rollouts of a step (records as rollouts.jsonl has them), one row each; a multi-turn
    episode's transcript is its completion, written out turn by turn."""
    rows = []
    for record in records[:TABLE_ROWS]:
        text = record.get("completion")
        if text is None:
            text = _transcript(record.get("transcript") or [])
        rows.append((step, record.get("group"), record.get("reward"), record.get("advantage"),
                     _cut(str(record.get("question") or "")), _cut(str(text)),
                     _cut("; ".join(str(e) for e in record.get("errors") or []))))
    return RolloutTable(step=step, columns=COLUMNS, rows=tuple(rows))


def params(config: dict) -> dict[str, str]:
    """The config as flat parameters: nested settings `a.b`, each value a JSON string of at most PARAM_CHARS."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[prefix] = text[:PARAM_CHARS]

    walk("", config)
    return flat


def _transcript(messages: list) -> str:
    lines = []
    for message in messages:
        if isinstance(message, dict):
            content = message.get("content")
            calls = message.get("tool_calls")
            lines.append(f"{message.get('role', '?')}: {content if content is not None else ''}"
                         + (f" {json.dumps(calls)}" if calls else ""))
        else:
            lines.append(str(message))
    return "\n".join(lines)


def _cut(text: str) -> str:
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + f"... ({len(text) - CELL_CHARS} more characters)"
