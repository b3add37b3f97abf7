"""A run's plain-file record: one JSON line per step in metrics.jsonl, the same scalars as TensorBoard events
(and any other tracker the run reports to: strop.trackers), and each sampled completion in rollouts.jsonl.

Resuming from a checkpoint at step k first cuts every file back to the steps before k, so a run that died at
any moment ends with exactly one row per step, numbered as if it had never stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from strop.trackers import DEFAULT, RunInfo, open_trackers


def _truncate_jsonl(path: Path, keep_before_step: int) -> None:
    if not path.exists():
        return
    kept = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line half-written when the process died
                continue
            if row.get("step", -1) < keep_before_step:
                kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


class RunLog:
    """`report_to` names the run's trackers (strop.trackers; checked before the run started), `config` is what
    they get as the run's parameters, and every `rollouts_every` steps a sample of the step's rollouts goes to
    those that have tables."""

    def __init__(self, run_dir: str | Path, start_step: int = 0, *, report_to=DEFAULT, config: dict | None = None,
                 rollouts_every: int | None = None):
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.rollouts_path = self.run_dir / "rollouts.jsonl"
        _truncate_jsonl(self.metrics_path, start_step)
        _truncate_jsonl(self.rollouts_path, start_step)
        self.trackers = open_trackers(report_to, RunInfo(name=self.run_dir.name, run_dir=self.run_dir,
                                                         config=config or {}),
                                      start_step=start_step, rollouts_every=rollouts_every)

    def write_step(self, row: dict) -> None:
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.trackers.log_row(row)

    def write_rollouts(self, rows: list[dict]) -> None:
        with open(self.rollouts_path, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        self.trackers.log_rollouts(rows)

    def close(self) -> None:
        self.trackers.close()
