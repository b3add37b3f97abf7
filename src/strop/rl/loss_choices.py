"""The settings that choose how a GRPO step turns rewards into an update, checked together, and what they mean
once a config is known; no torch, so checking a config loads nothing. Each is off, or at strop's behaviour before it existed, by default:

    advantage_estimator  group-mean | rloo | reinforce++        (strop.rl.advantages.batch_advantages)
    loss_aggregation     token-sum | token-mean | sequence-mean | constant (+ loss_normalizer)
    overlong             keep | mask | soft-penalty (+ overlong_buffer): completions cut at max tokens
    importance_ratio     token | sequence (GSPO), for the losses with a ratio
    clip_low, clip_high  the ratio's clip range (clip-higher: clip_high above 1 + (1 - clip_low))
    updates_per_batch, minibatches   several updates on one sampled batch (strop.rl.updates)

    problems = combination_problems(config)      # [(field, what is wrong and what to change)]
    settings = pinned_settings(config)           # what a run records in pinned.rl, defaults resolved
"""

from __future__ import annotations


from strop.rl.limits import LIMITS

ADVANTAGE_ESTIMATORS = ("group-mean", "rloo", "reinforce++")
LOSS_AGGREGATIONS = ("token-sum", "token-mean", "sequence-mean", "constant")
OVERLONG = ("keep", "mask", "soft-penalty")
IMPORTANCE_RATIOS = ("token", "sequence")
# losses whose value scales with the advantage (so aggregation can scale the advantages) and that have a ratio
SCALED_LOSSES = ("importance_sampling", "ppo", "cispo")
CLIPPED_LOSSES = ("ppo", "cispo")
CLIP_DEFAULTS = (0.8, 1.2)   # the engine's own (strop.engine.losses.sequence_loss)

# the choices a descriptor's combination check reads before the config is made (GRPOConfig declares them too)
CHOICES = {"advantage_estimator": ADVANTAGE_ESTIMATORS, "loss_aggregation": LOSS_AGGREGATIONS,
           "overlong": OVERLONG, "importance_ratio": IMPORTANCE_RATIOS}


def choice_problems(config) -> list[tuple[str, str]]:
    """Each named choice among its accepted values."""
    return [(name, f"must be one of {', '.join(choices)}, got {repr(getattr(config, name))[:80]}")
            for name, choices in CHOICES.items() if getattr(config, name) not in choices]


def combination_problems(config) -> list[tuple[str, str]]:
    """(field, problem) for settings that do not fit together; a value of the wrong kind is left to its own
    check (the config's table of limits and choices, or the descriptor's fields)."""
    p = []
    loss = config.loss_fn
    if config.loss_aggregation != "token-sum" and loss not in SCALED_LOSSES:
        p.append(("loss_aggregation", f"{config.loss_aggregation} scales each sequence's advantages, which "
                                      f"scales the loss of {', '.join(SCALED_LOSSES)}; {loss!r} has a penalty "
                                      "that does not scale with them: use token-sum, or another loss"))
    if config.loss_normalizer is not None and config.loss_aggregation != "constant":
        p.append(("loss_normalizer", "divides the loss with loss_aggregation constant: set that, or leave "
                                     "loss_normalizer unset"))
    if config.overlong_buffer is not None:
        if config.overlong != "soft-penalty":
            p.append(("overlong_buffer", "is the length over which overlong soft-penalty's penalty grows: set "
                                         "overlong to soft-penalty, or leave overlong_buffer unset"))
        elif _is_int(config.overlong_buffer) and _is_int(config.max_completion_length) \
                and config.overlong_buffer > config.max_completion_length:
            p.append(("overlong_buffer", f"must be at most max_completion_length ({config.max_completion_length}) "
                                         f"(got {config.overlong_buffer})"))
    if config.importance_ratio == "sequence" and loss not in SCALED_LOSSES:
        p.append(("importance_ratio", f"sequence replaces the per-token ratio of {', '.join(SCALED_LOSSES)}; "
                                      f"{loss!r} has none"))
    for name in ("clip_low", "clip_high"):
        if getattr(config, name) is not None:
            if loss not in CLIPPED_LOSSES:
                p.append((name, f"clips the ratio of {' and '.join(CLIPPED_LOSSES)}; the loss is {loss!r}: set "
                                f"loss_fn to one of them, or leave {name} unset"))
            elif isinstance(config.loss_fn_config, dict) and f"{name}_threshold" in config.loss_fn_config:
                p.append((name, f"is also given as loss_fn_config's {name}_threshold: give it once"))
    low, high = clip_range(config)
    in_range = all(LIMITS[n].problem(getattr(config, n)) is None for n in ("clip_low", "clip_high"))
    if in_range and _is_number(low) and _is_number(high) and low >= high:
        p.append(("clip_high", f"must be above clip_low ({low:g}) (got {high:g})"))
    if config.advantage_estimator != "group-mean" and config.scale_by_std is True:
        p.append(("scale_by_std", f"divides group-mean advantages by the group's std; {config.advantage_estimator} "
                                  "is its own estimator: leave scale_by_std off"))
    return p


def clip_range(config) -> tuple:
    """(low, high) thresholds of the ratio as the loss will use them."""
    extra = config.loss_fn_config if isinstance(config.loss_fn_config, dict) else {}
    low = config.clip_low if config.clip_low is not None else extra.get("clip_low_threshold", CLIP_DEFAULTS[0])
    high = config.clip_high if config.clip_high is not None else extra.get("clip_high_threshold", CLIP_DEFAULTS[1])
    return low, high


def loss_normalizer(config) -> float:
    """The constant loss_aggregation divides by: loss_normalizer, else batch_size x group_size x
    max_completion_length (Dr. GRPO's choice: the most tokens a full step can train)."""
    if config.loss_normalizer is not None:
        return float(config.loss_normalizer)
    return float(config.batch_size * config.group_size * config.max_completion_length)


def overlong_buffer(config) -> int:
    """The tokens before max_completion_length over which the soft penalty falls from 0 to -1 (default: a
    quarter of max_completion_length, at least 1)."""
    if config.overlong_buffer is not None:
        return int(config.overlong_buffer)
    return max(1, config.max_completion_length // 4)


def pinned_settings(config) -> dict:
    """The loss-choice settings as a run uses them (camelCase, as in the descriptor), defaults resolved."""
    low, high = clip_range(config)
    return {"lossFn": config.loss_fn, "advantageEstimator": config.advantage_estimator,
            "lossAggregation": config.loss_aggregation,
            "lossNormalizer": loss_normalizer(config) if config.loss_aggregation == "constant" else None,
            "overlong": config.overlong,
            "overlongBuffer": overlong_buffer(config) if config.overlong == "soft-penalty" else None,
            "importanceRatio": config.importance_ratio,
            "clipLow": low if config.loss_fn in CLIPPED_LOSSES else None,
            "clipHigh": high if config.loss_fn in CLIPPED_LOSSES else None,
            "updatesPerBatch": config.updates_per_batch, "minibatches": config.minibatches}


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
