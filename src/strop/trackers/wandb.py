"""Weights & Biases (pip install -e ".[wandb]"): wandb's own login and settings decide where a run goes
(WANDB_API_KEY or `wandb login`; WANDB_MODE=offline writes only the files under WANDB_DIR, for `wandb sync`
later), project WANDB_PROJECT (default strop). A step's sample rollouts are a wandb.Table named `rollouts`."""

from __future__ import annotations

import os

from strop.trackers.base import RolloutTable, RunInfo


class WandbTracker:
    name = "wandb"

    def start(self, run: RunInfo) -> None:
        import wandb  # the extra: checked installed before the run started
        self._wandb = wandb
        # no console capture and no system sampling: the loop's output and time stay its own
        settings = wandb.Settings(console="off", x_disable_stats=True, silent=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or run.project, name=run.name,
                              config=run.config, settings=settings, reinit="create_new")

    def log_metrics(self, step: int, scalars: dict[str, float]) -> None:
        if step < 0:  # a supervised run's held-out loss before its first step: wandb's steps start at 0
            self.run.summary.update({f"{key}/beforeTraining": value for key, value in scalars.items()})
            return
        self.run.log(scalars, step=step)

    def log_rollouts(self, table: RolloutTable) -> None:
        self.run.log({"rollouts": self._wandb.Table(columns=list(table.columns), data=[list(r) for r in table.rows])},
                     step=table.step)

    def finish(self) -> None:
        self.run.finish()
