"""The names a run's settings choose from, in one leaf module that both the engine (which implements them) and the
loop's configuration (which checks them, without loading torch) import: compute dtypes, sampler engines and losses.

    >>> from strop.choices import DTYPE_CHOICES, SAMPLER_CHOICES, POLICY_LOSSES
    >>> POLICY_LOSSES
    ('importance_sampling', 'ppo', 'cispo', 'dro')
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_NAMES = ("float32", "bfloat16")          # what training and sampling compute in (strop.engine.precision)
DTYPE_CHOICES = ("auto", *DTYPE_NAMES)
SAMPLER_NAMES = ("strop", "vllm")              # which engine samples (strop.engine.engine_choice)
SAMPLER_CHOICES = ("auto", *SAMPLER_NAMES)


@dataclass(frozen=True)
class Loss:
    inputs: tuple[str, ...]  # the loss_fn_inputs each datum carries, each as long as its model input
    policy: bool             # a policy-gradient loss (sampler logprobs and advantages), not a supervised one
    summary: str


LOSSES: dict[str, Loss] = {
    "cross_entropy": Loss(("target_tokens", "weights"), False, "supervised: -sum(weights * log p)"),
    "importance_sampling": Loss(("target_tokens", "logprobs", "advantages"), True,
                                "REINFORCE with the sampler's importance weight: -sum(p/q * A)"),
    "ppo": Loss(("target_tokens", "logprobs", "advantages"), True,
                "PPO's clipped surrogate: -sum(min(r * A, clip(r) * A))"),
    "cispo": Loss(("target_tokens", "logprobs", "advantages"), True,
                  "CISPO: the clipped importance weight, gradient stopped, times A * log p"),
    "dro": Loss(("target_tokens", "logprobs", "advantages"), True,
                "DRO: -sum(A * log p - beta/2 * (log p - log q)^2), off-policy with a quadratic penalty"),
}
POLICY_LOSSES = tuple(name for name, loss in LOSSES.items() if loss.policy)
