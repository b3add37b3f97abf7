"""Experiment trackers: each step's metrics row, the run's config and a sample of its rollouts, sent to the
trackers a run names beside the plain files it writes (metrics.jsonl stays the record).

    strop train --report-to tensorboard,trackio,mlflow,wandb
    GRPOConfig(..., report_to=["tensorboard", "mlflow"])      # SFTConfig too
    "execution": {"reportTo": ["tensorboard", "wandb"], "reportRolloutsEvery": 10}

Every tracker gets the same metric names and step numbers as metrics.jsonl (the finite numbers of each row),
the run's config as parameters, and, where it has tables (trackio, mlflow, wandb), a table of the first
rollouts of every `report_rollouts_every`-th step. tensorboard, the default, writes the run folder's events/
as it always has. The others are optional extras (`pip install -e ".[trackers]"`, or `.[trackio]`,
`.[mlflow]`, `.[wandb]`), checked before the run starts, and each talks to its backend from a thread of its own
behind a bounded queue (strop.trackers.background): a tracker that fails or hangs is reported once, on stderr
and in the run folder's trackers.json, and never stops or slows training.

Where each one writes (its own settings, read from the environment):
    trackio  TRACKIO_DIR (default ~/.cache/huggingface/trackio), project TRACKIO_PROJECT (default strop);
             `trackio show --project strop` opens it
    mlflow   MLFLOW_TRACKING_URI (default sqlite:///$STROP_HOME/mlflow/mlflow.db, artifacts beside it),
             experiment MLFLOW_EXPERIMENT_NAME (default strop)
    wandb    its own login and settings: WANDB_MODE=offline and WANDB_DIR for files only, WANDB_PROJECT
             (default strop)
"""

from __future__ import annotations

import importlib.util

from strop.trackers.base import RunInfo, Tracker
from strop.trackers.fanout import Trackers, open_trackers

# tracker name -> (the module it needs, the extra that installs it); tensorboard is a dependency of strop's own
TRACKERS: dict[str, tuple[str, str] | None] = {
    "tensorboard": None, "trackio": ("trackio", "trackio"), "mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}
CHOICES = tuple(TRACKERS)
DEFAULT = ("tensorboard",)


def report_to_problems(value) -> list[str]:
    """What is wrong with a `report_to` value: each problem says what would be accepted ([] when it is fine).
    An installed backend is part of it: a run that names a tracker it cannot load is refused before it starts,
    not at its first step."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        return [f"must be a list of tracker names from {', '.join(CHOICES)} (got {str(value)[:80]!r}); [] reports "
                "to none"]
    problems = [f"{name[:40]!r} is not a tracker; choose from {', '.join(CHOICES)}" for name in value
                if name not in TRACKERS]
    repeated = sorted({name for name in value if value.count(name) > 1})
    if repeated:
        problems.append(f"names {', '.join(repeated)} more than once; name each tracker once")
    return problems + missing_extras([name for name in value if name in TRACKERS])


def missing_extras(names) -> list[str]:
    """One line per named tracker whose package is not installed, with the command that installs it."""
    problems = []
    for name in dict.fromkeys(names):
        needs = TRACKERS.get(name)
        if needs is not None and importlib.util.find_spec(needs[0]) is None:
            problems.append(f"the {name} tracker needs the {needs[0]!r} package, which is not installed: "
                            f"pip install -e \".[{needs[1]}]\" (or \".[trackers]\" for all of them)")
    return problems


def parse_report_to(text: str) -> list[str]:
    """`--report-to tensorboard,mlflow` -> ["tensorboard", "mlflow"]; "none" -> [] (names are checked by
    report_to_problems)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    return [] if names == ["none"] else names


__all__ = ["CHOICES", "DEFAULT", "TRACKERS", "RunInfo", "Tracker", "Trackers", "missing_extras", "open_trackers",
           "parse_report_to", "report_to_problems"]
