"""The range of every size, count and number a run can be described with, and why each stops where it does.

One table, read by the three places a run is described: the run descriptor (`strop.control.descriptor`),
`GRPOConfig.validate()` and `strop train`'s flags. A number past its limit is a mistake or an attack (a group
of 10^9 samples is not a run, it is the out-of-memory killer), so it is refused before anything loads, with
the range and the reason:

    >>> from strop.rl.limits import LIMITS
    >>> LIMITS["group_size"].problem(10**9)
    'must be an integer from 2 to 1,024 (got 1000000000); a step holds every completion ...'

Keys are GRPOConfig field names; `reward_weight` and `gpus` are the descriptor's alone, `ray_samplers`,
`ray_env_workers` and `ray_trainers` the numbers of `execution.ray`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_STEPS = 1_000_000


@dataclass(frozen=True)
class Limit:
    least: int | float
    most: int | float
    integer: bool
    why: str                    # why the upper limit is where it is: shown when a value is past it
    least_open: bool = False    # the lower bound itself is refused (temperature > 0)
    most_open: bool = False
    optional: bool = False      # None means "not set" (max_steps: no limit)
    why_least: str = ""         # why the lower limit is where it is, when that is not obvious

    def accepts(self, unit: str = "") -> str:
        """'an integer from 2 to 1,024', 'a number greater than 0, up to 10' (without the reason)."""
        kind = "an integer" if self.integer else "a number"
        unit = f" {unit}" if unit else ""
        low, high = _number(self.least), _number(self.most)
        if self.least_open and self.most_open:
            text = f"{kind}{unit} between {low} and {high} (exclusive)"
        elif self.least_open:
            text = f"{kind}{unit} greater than {low}, up to {high}"
        elif self.most_open:
            text = f"{kind}{unit} from {low} to below {high}"
        else:
            text = f"{kind}{unit} from {low} to {high}"
        return text + (", or null" if self.optional else "")

    def problem(self, value, unit: str = "") -> str | None:
        """None when `value` is in range; else 'must be <range> (got <value>)', with the reason when too large."""
        if value is None and self.optional:
            return None
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not is_number or (self.integer and not isinstance(value, int)) or \
                (isinstance(value, float) and not math.isfinite(value)):
            return f"must be {self.accepts(unit)} (got {_shown(value)})"
        if value < self.least or (self.least_open and value == self.least):
            reason = f"; {self.why_least}" if self.why_least else ""
            return f"must be {self.accepts(unit)} (got {_shown(value)}){reason}"
        if value > self.most or (self.most_open and value == self.most):
            return f"must be {self.accepts(unit)} (got {_shown(value)}); {self.why}"
        return None


def _number(value: int | float) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:g}"
    return f"{int(value):,}"


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_STEPS_WHY = (f"{MAX_STEPS:,} steps is years of training on one machine; a larger count is a mistake and every "
              "step is planned before the first")

LIMITS: dict[str, Limit] = {
    "group_size": Limit(2, 1024, True, "a step holds every completion (batchSize x groupSize) in memory until its "
                                       "update, and GRPO's comparison gains little past a few dozen samples a prompt",
                        why_least="GRPO needs at least two samples of a prompt to compare"),
    "batch_size": Limit(1, 4096, True, "a step holds every completion (batchSize x groupSize) in memory until its "
                                       "update"),
    "epochs": Limit(1, 1000, True, "more passes than that over one dataset is a mistake, not a plan; set maxSteps "
                                   "for a run measured in steps"),
    "max_steps": Limit(1, MAX_STEPS, True, _STEPS_WHY, optional=True),
    "save_every": Limit(1, MAX_STEPS, True, _STEPS_WHY),
    "eval_every": Limit(1, MAX_STEPS, True, _STEPS_WHY, optional=True),
    "report_rollouts_every": Limit(1, MAX_STEPS, True, _STEPS_WHY, optional=True),
    "keep_adapters": Limit(1, 1000, True, "each kept checkpoint is a full adapter and optimizer state on disk"),
    "dataset_limit": Limit(1, 100_000_000, True, "rows are read into memory before the first step", optional=True),
    "lora_rank": Limit(1, 1024, True, "the adapter's weights and optimizer state grow with the rank, and a rank past "
                                      "the model's hidden size adds nothing (SmolLM2's is 576)"),
    "lora_alpha": Limit(0, 16384, False, "alpha / rank multiplies every adapter output; past 16,384 the first update "
                                         "swamps the base model", least_open=True, optional=True),
    "learning_rate": Limit(0, 1, False, "AdamW steps of a whole unit per weight destroy the model",
                           least_open=True, most_open=True),
    "weight_decay": Limit(0, 1, False, "AdamW shrinks each weight by learningRate x weightDecay a step; usual "
                                       "values are 0 to 0.1"),
    "grad_clip_norm": Limit(0, 1_000_000, False, "a norm that large clips nothing; use 0 for no clipping"),
    "rollout_correction_cap": Limit(1, 100, False, "a weight past 100 lets one token the sampler thought unlikely "
                                                   "outweigh a hundred others: the variance tis is there to bound"),
    "sft_mix_weight": Limit(0, 100, False, "past 100 the supervised loss drowns the reward, so the run is "
                                           "supervised fine-tuning", least_open=True),
    "sft_mix_examples": Limit(1, 256, True, "every transcript is a forward and backward pass each optimizer step, "
                                            "held in memory with the step's rollouts"),
    "kl_beta": Limit(0, 100, False, "past 100 the KL penalty drowns the reward, so nothing is learned"),
    "temperature": Limit(0, 10, False, "past 10 sampling is close to uniform over the vocabulary: noise, not the "
                                       "policy", least_open=True),
    "top_p": Limit(0, 1, False, "a probability mass", least_open=True),
    "max_completion_length": Limit(1, 32768, True, "the sampler's KV cache and the trainer's activations grow with "
                                                   "it, and it is past the context of the models strop supports"),
    "max_seq_length": Limit(2, 131072, True, "past the context length of any model strop supports", optional=True),
    "grader_timeout": Limit(0, 3600, False, "a step waits for its slowest grader call, so an hour a call already "
                                            "stalls a run for hours", least_open=True),
    "grader_memory_mb": Limit(64, 1_048_576, True, "it is a grader process's address-space limit, and 1 TiB is more "
                                                   "memory than any machine strop runs on"),
    "max_reward_error_fraction": Limit(0, 1, False, "a fraction of the step's grader calls"),
    "seed": Limit(0, 2**32 - 1, True, "seeds are 32-bit (the sampler derives per-step seeds from it)"),
    "reward_weight": Limit(-1000, 1000, False, "advantages are centred per group, so scaling every weight changes "
                                               "nothing, and larger weights overflow float32 rewards"),
    "gpus": Limit(0, 1024, True, "it is the number of accelerators one run asks for; a larger count is a "
                                 "mistake", optional=True),  # optional in GRPOConfig; the descriptor requires it
    "warmup_steps": Limit(0, MAX_STEPS, True, _STEPS_WHY),
    "max_tasks_per_step": Limit(1, 65536, True, "every drawn task's group of rollouts is held in memory until the "
                                                "step's update", optional=True),
    "branch_at_turn": Limit(1, 1000, True, "an episode of more turns than that outgrows any model's context long "
                                           "before the branch", optional=True),
    "reference_members": Limit(0, 1023, True, "at least one of a group's episodes (groupSize is at most 1024) "
                                              "is sampled"),
    "scout_temperature": Limit(0, 10, False, "0 is greedy; past 10 sampling is close to uniform over the "
                                             "vocabulary", optional=True),
    "max_off_policy_steps": Limit(0, 16, True, "rollouts more than 16 updates old describe a policy the trainer has "
                                               "left far behind, and each step sampled ahead is held in memory"),
    "loss_normalizer": Limit(0, 10**12, False, "the loss is divided by it; past 10^12 every update is below "
                                             "float32's resolution of the weights", least_open=True, optional=True),
    "overlong_buffer": Limit(1, 32768, True, "it is a length within maxCompletionLength", optional=True),
    "clip_low": Limit(0, 1, False, "the ratio's lower clip is at most 1 (no change)", least_open=True,
                      optional=True),
    "clip_high": Limit(1, 100, False, "a clip past 100 clips nothing a sampled token's ratio reaches",
                       optional=True),
    "updates_per_batch": Limit(1, 64, True, "past 64 passes the batch is memorised, not learnt from, and each pass "
                                            "costs a full update"),
    "minibatches": Limit(1, 4096, True, "a minibatch holds at least one datum, and a step has at most batchSize x "
                                        "groupSize of them"),
    "ray_samplers": Limit(1, 256, True, "each replica is a process holding the whole model; 256 is past any "
                                        "cluster one run should ask for"),
    "ray_env_workers": Limit(0, 1024, True, "each worker is a process; a step has at most batchSize x groupSize "
                                            "episodes to spread over them"),
    "ray_trainers": Limit(1, 256, True, "each trainer is a process holding the whole model and one shard of a "
                                        "step's datums; 256 is past any cluster one run should ask for"),
}


def problems(values: dict) -> list[str]:
    """'name: must be ...' for each value in `values` (keyed like LIMITS) that is out of its range."""
    found = []
    for name, value in values.items():
        problem = LIMITS[name].problem(value)
        if problem:
            found.append(f"{name}: {problem}")
    return found
