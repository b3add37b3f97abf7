"""The run descriptor's checks between the settings of dynamic sampling and the batch they fill, between
branchAtTurn and what is trained on, and between the loss choices, on raw data so they are reported alongside single-field errors
(`strop.control.descriptor.cross_field_problems` calls these).

    sampling_problems({"batchSize": 8, "dynamicSampling": {"enabled": True, "maxTasksPerStep": 4}})
    # ['$.config.rlHyperparams.dynamicSampling.maxTasksPerStep: must be at least $.config.rlHyperparams.batchSize ...']
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from strop.choices import POLICY_LOSSES
from strop.rl.config import GRPOConfig
from strop.rl.limits import LIMITS
from strop.rl.loss_choices import choice_problems, combination_problems

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


# the settings the combination checks read; the descriptor requires the last two (no default there)
_CHECKED = ("loss_fn", "advantage_estimator", "loss_aggregation", "loss_normalizer", "overlong", "overlong_buffer",
            "importance_ratio", "clip_low", "clip_high", "updates_per_batch", "minibatches", "batch_size",
            "max_completion_length", "group_size")
_REQUIRED = ("max_completion_length", "group_size")


def _descriptor_keys() -> dict[str, tuple[str, object]]:
    """field -> (its rlHyperparams key, its default there), from the settings' declarations."""
    paths = GRPOConfig.descriptor_paths()
    return {name: (paths[name].rsplit(".", 1)[1], None if name in _REQUIRED else GRPOConfig.default_of(name))
            for name in _CHECKED}


def loss_choice_problems(hp) -> list[str]:
    """strop.rl.loss_choices.combination_problems on a descriptor's raw rlHyperparams, each named by its JSON path; nothing when a
    value is itself wrong (its field reports it once)."""
    if not isinstance(hp, dict):
        return []
    keys = _descriptor_keys()
    values = {name: hp.get(key, default) for name, (key, default) in keys.items()}
    config = SimpleNamespace(**values, scale_by_std=False, loss_fn_config={})
    if values["loss_fn"] not in POLICY_LOSSES or choice_problems(config) or any(
            LIMITS[name].problem(values[name]) for name in values if name in LIMITS and values[name] is not None):
        return []
    return [f"$.config.rlHyperparams.{keys[name][0]}: {_camel(problem, keys)}"
            for name, problem in combination_problems(config)]


def _camel(text: str, keys: dict[str, tuple[str, object]]) -> str:
    """A message's field names as the descriptor spells them."""
    for name in sorted(keys, key=len, reverse=True):
        text = text.replace(name, keys[name][0])
    return text
