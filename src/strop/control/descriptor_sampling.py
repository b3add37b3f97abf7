"""The run descriptor's checks between the settings of dynamic sampling and the batch they fill, on raw data so
they are reported alongside single-field errors (`strop.control.descriptor.cross_field_problems` calls this).

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


def _is_count(value: Any, limit: str) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and LIMITS[limit].problem(value) is None
