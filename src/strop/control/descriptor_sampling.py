"""The run descriptor's checks between the settings of dynamic sampling and the batch they fill, and between
branchAtTurn and what is trained on, on raw data so they are reported alongside single-field errors
(`strop.control.descriptor.cross_field_problems` calls these).

    sampling_problems({"batchSize": 8, "dynamicSampling": {"enabled": True, "maxTasksPerStep": 4}})
    # ['$.config.rlHyperparams.dynamicSampling.maxTasksPerStep: must be at least $.config.rlHyperparams.batchSize ...']
"""

from __future__ import annotations

from typing import Any

from strop.rl.limits import LIMITS

_AT = "$.config.rlHyperparams.dynamicSampling"


def sampling_problems(hp: Any) -> list[str]:
    """Problems of `rlHyperparams.dynamicSampling` against the rest of rlHyperparams (a value out of its own range
    is reported once, by its field)."""
    spec = hp.get("dynamicSampling") if isinstance(hp, dict) else None
    if not isinstance(spec, dict):
        return []
    cap, enabled = spec.get("maxTasksPerStep"), spec.get("enabled", False)
    batch = hp.get("batchSize", 8)
    if not _is_count(cap, "max_tasks_per_step"):
        return []
    if enabled is False:
        return [f"{_AT}.maxTasksPerStep: caps the draws of dynamic sampling, which is off; set {_AT}.enabled to "
                "true, or remove maxTasksPerStep"]
    if _is_count(batch, "batch_size") and cap < batch:
        return [f"{_AT}.maxTasksPerStep: must be at least $.config.rlHyperparams.batchSize ({batch}): the step's own "
                f"batch is drawn first (got {cap})"]
    return []


def branching_problems(config: Any) -> list[str]:
    """branchAtTurn branches an environment's episodes: refused for a dataset's, which have one turn."""
    hp = config.get("rlHyperparams") if isinstance(config, dict) else None
    turn = hp.get("branchAtTurn") if isinstance(hp, dict) else None
    if turn is None or not _is_count(turn, "branch_at_turn") or config.get("environment") is not None:
        return []
    return ["$.config.rlHyperparams.branchAtTurn: branches the episodes of a tool-use environment "
            "($.config.environment); a dataset's episodes have one turn: remove branchAtTurn, or train in an "
            "environment"]


def _is_count(value: Any, limit: str) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and LIMITS[limit].problem(value) is None
