"""The run descriptor's checks between fields, on raw data (`cross_field_problems`): between the settings of
dynamic sampling and the batch they fill, between branchAtTurn and what is trained on, between the loss choices,
and between the method and what it takes; on raw data so they are reported alongside single-field errors
(`strop.control.descriptor.cross_field_problems` calls these).

    sampling_problems({"batchSize": 8, "dynamicSampling": {"enabled": True, "maxTasksPerStep": 4}})
    # ['$.config.rlHyperparams.dynamicSampling.maxTasksPerStep: must be at least $.config.rlHyperparams.batchSize ...']
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from strop.choices import POLICY_LOSSES
from strop.names import escape_hidden
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


def cross_field_problems(data: Any) -> list[str]:
    """Problems between fields, checked on raw data so they are reported alongside single-field errors."""
    problems = []
    def child(parent: Any, key: str, kind: type) -> Any:
        value = parent.get(key) if isinstance(parent, dict) else None
        return value if isinstance(value, kind) else kind()

    config = child(data, "config", dict)
    hp = child(config, "rlHyperparams", dict)
    problems += sampling_problems(hp) + branching_problems(config) + loss_choice_problems(hp)
    seq, completion = config.get("maxSeqLength"), hp.get("maxCompletionLength")
    in_range = all(_is_int(v, least=0) and LIMITS[name].problem(v) is None
                   for name, v in (("max_seq_length", seq), ("max_completion_length", completion)))
    if in_range and seq <= completion:  # a value out of its own range is reported once, by its field
        problems.append(f"$.config.maxSeqLength: must be greater than $.config.rlHyperparams.maxCompletionLength "
                        f"({completion}) to leave room for the prompt (got {seq})")
    execution = child(data, "execution", dict)
    gpus, trainers = execution.get("gpus"), child(execution, "ray", dict).get("trainers")
    if _is_int(gpus, least=2) and _is_int(trainers, least=1) and trainers != gpus:
        problems.append(f"$.execution.ray.trainers: {trainers} data-parallel trainers, but $.execution.gpus asks "
                        f"for {gpus} (a trainer a GPU); give one of them, or the same number in both")
    method = config.get("method")
    if method == "grpo" and isinstance(data, dict) and "config" in data and config.get("rlHyperparams") is None:
        problems.append("$.config.rlHyperparams: required with method grpo (groupSize, klBeta, temperature, "
                        "maxCompletionLength, lora, optimizer)")
    if method == "sft":
        given = [key for key in ("sftHyperparams", "rlHyperparams") if config.get(key) is not None]
        if not given:
            problems.append("$.config.sftHyperparams: required with method sft (epochs or maxSteps, batchSize, "
                            "lora, optimizer)")
        elif len(given) == 2:
            problems.append("$.config.rlHyperparams: give sftHyperparams or rlHyperparams with method sft, not both")
        for key, what in (("reward", "reward terms"), ("environment", "an environment"),
                          ("evalEvery", "evaluation during training")):
            if config.get(key) is not None:
                problems.append(f"$.config.{key}: method sft takes no {what}; remove it (or use method grpo)")
        if config.get("dataset") is None:
            problems.append("$.config.dataset: method sft needs a registered dataset of chat transcripts or "
                            "prompt/completion pairs")
        return problems
    if method != "grpo" and config.get("sftHyperparams") is not None:
        problems.append("$.config.sftHyperparams: only method sft takes it")
    has_dataset, has_env = config.get("dataset") is not None, config.get("environment") is not None
    if has_dataset == has_env and isinstance(data, dict) and "config" in data:
        problems.append("$.config: give exactly one of dataset (single-turn) and environment (multi-turn tool use)")
    if has_dataset and config.get("reward") is None:
        problems.append("$.config.reward: a run on a dataset needs reward terms, e.g. "
                        '{"terms": [{"kind": "rule", "weight": 1.0, "bundle": "builtin:gsm8k"}]}')
    terms = child(child(config, "reward", dict), "terms", list)
    first_use: dict[str, int] = {}
    for i, term in enumerate(terms):
        name = term.get("name") if isinstance(term, dict) else None
        if isinstance(name, str) and name.strip():
            if name in first_use:
                problems.append(f"$.config.reward.terms[{i}].name: must be unique among the reward terms; "
                                f"terms[{first_use[name]}] is already named {_show(name)}")
            first_use.setdefault(name, i)
    return problems


SHOWN_CHARS = 60  # of a given value in a message: enough to recognise it, short enough to stay one line


def _show(value: Any) -> str:
    """A given value as the person wrote it in JSON ("8" stays quoted, True is true), shortened."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    text = text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."
    return escape_hidden(text)  # a bidirectional override or an escape sequence is never printed raw


def _is_int(value: Any, *, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least
