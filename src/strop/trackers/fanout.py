"""The trackers of one run, fed by its RunLog: every metrics row to each, a sample table every N steps.

tensorboard writes in the loop's own thread, as it always has (local files, flushed each step, cut back on
resume); every other tracker runs behind strop.trackers.background. At the end, trackers.json in the run
folder says what each one sent, dropped, and why it stopped if it did.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from strop.trackers.background import Background, print_to_stderr
from strop.trackers.base import RunInfo, rollout_table, scalars
from strop.trackers.tensorboard import TensorBoardTracker


def _remote(name: str):
    # each module is imported only when a run names its tracker (it imports the backend when the run starts)
    if name == "trackio":
        from strop.trackers.trackio import TrackioTracker  # lazy: a named tracker only
        return TrackioTracker()
    if name == "mlflow":
        from strop.trackers.mlflow import MlflowTracker  # lazy: a named tracker only
        return MlflowTracker()
    if name == "wandb":
        from strop.trackers.wandb import WandbTracker  # lazy: a named tracker only
        return WandbTracker()
    raise ValueError(f"no tracker {name!r}")


class Trackers:
    def __init__(self, events: TensorBoardTracker | None, remote: list[Background], run_dir: Path,
                 rollouts_every: int | None):
        self.events, self.remote, self.run_dir, self.rollouts_every = events, remote, run_dir, rollouts_every

    def log_row(self, row: dict) -> None:
        numbers = scalars(row)
        if self.events is not None:
            self.events.log_metrics(row["step"], numbers)
        for tracker in self.remote:
            tracker.submit("log_metrics", row["step"], numbers)

    def log_rollouts(self, records: list[dict]) -> None:
        """A step's rollouts (all of one step): a sample table to each tracker that has tables, every
        `rollouts_every` steps (steps 0, N, 2N, ...)."""
        if not records or not self.remote or not self.rollouts_every:
            return
        step = records[0]["step"]
        if step % self.rollouts_every == 0:
            table = rollout_table(step, records)
            for tracker in self.remote:
                tracker.submit("log_rollouts", table)

    def close(self) -> dict:
        if self.events is not None:
            self.events.finish()
        status = {tracker.name: tracker.close() for tracker in self.remote}
        if status:
            path = self.run_dir / "trackers.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(status, indent=2))
            os.replace(tmp, path)
        return status


def open_trackers(names, run: RunInfo, *, start_step: int = 0, rollouts_every: int | None = None,
                  report=print_to_stderr) -> Trackers:
    """The named trackers of a run (names already checked: strop.trackers.report_to_problems); a resumed run
    (`start_step` > 0) cuts TensorBoard's events back to it and is a new run in the other trackers, named
    `<run>-from-<step>` (they keep the steps they had)."""
    events = TensorBoardTracker(run.run_dir / "events", start_step) if "tensorboard" in names else None
    if start_step:
        run = RunInfo(name=f"{run.name}-from-{start_step}", run_dir=run.run_dir, config=run.config,
                      project=run.project)
    remote = [Background(_remote(name), run, report=report) for name in names if name != "tensorboard"]
    return Trackers(events, remote, run.run_dir, rollouts_every)
