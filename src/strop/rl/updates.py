"""A step's update from its datums: the loss aggregated as configured, in `minibatches` optimizer steps a pass
and `updates_per_batch` passes over the sampled batch.

    result = apply_updates(training, datums, config, adam)
    result.first_pass        # forward_backward's summed metrics over the first pass (the sampler's logprobs)
    result.clipped_shares    # per optimizer step, the share of trained tokens the clip cut (ppo, cispo)

The first pass takes the ratio against the sampler's logprobs (with rollout correction's truncated weights
when it is on), as a single update always did. With more passes the batch is reused, so the policy moves away
from the one that sampled it and the clip starts to bind: every pass after the first takes the ratio against
the trainer's own logprobs before the first update (one forward pass, no gradient), the old policy of PPO,
and carries rollout correction's weights (trainer's / sampler's, capped) in the advantages. With an SFT mix
(strop.rl.sft_mix), each optimizer step adds its transcripts' cross-entropy to the policy loss's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from strop import types
from strop.rl.advantages import aggregation_scales
from strop.rl.loss_choices import loss_normalizer

if TYPE_CHECKING:
    from strop.rl.sft_mix import SFTMix


@dataclass(frozen=True)
class UpdateResult:
    first_pass: dict = field(default_factory=dict)   # forward_backward metrics, summed over the first pass
    optim: dict = field(default_factory=dict)        # the last optimizer step's metrics
    clipped_shares: list = field(default_factory=list)
    optimizer_steps: int = 0
    mix_loss: float | None = None                    # the SFT mix's cross-entropy per trained token, over the steps


def minibatch_indices(n: int, minibatches: int) -> list[list[int]]:
    """`n` datums in `minibatches` contiguous shares as even as they go (a group's datums stay together where
    the shares allow); never an empty share."""
    k = max(1, min(minibatches, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [list(range(bounds[i], bounds[i + 1])) for i in range(k)]


def trained_tokens(datum: types.Datum) -> int:
    """Positions a policy datum trains: those with an advantage (KL included) not 0, as the trainer counts."""
    return int((datum.loss_fn_inputs["advantages"].to_torch() != 0).sum())


def aggregated(datums: list[types.Datum], config) -> list[types.Datum]:
    """The datums with each one's advantages scaled so their summed losses aggregate as config.loss_aggregation
    says (`strop.rl.advantages.aggregation_scales`)."""
    if config.loss_aggregation == "token-sum":
        return list(datums)
    scales = aggregation_scales([trained_tokens(d) for d in datums], config.loss_aggregation,
                                loss_normalizer(config))
    return [with_inputs(d, advantages=d.loss_fn_inputs["advantages"].to_torch() * s) for d, s in zip(datums, scales)]


def against_old(datum: types.Datum, old_T: torch.Tensor, tis_cap: float | None) -> types.Datum:
    """The datum with the trainer's logprobs before the first update as its old logprobs where it has sampled
    tokens; with `tis_cap`, its advantages times min(p_old / p_sampler, cap) there (rollout correction)."""
    inputs = datum.loss_fn_inputs
    sampler_T, adv_T = inputs["logprobs"].to_torch().float(), inputs["advantages"].to_torch().float()
    sampled_T = (sampler_T != 0) | (adv_T != 0)
    old_T = old_T.float().reshape(-1)
    if tis_cap is not None:
        adv_T = torch.where(sampled_T, adv_T * (old_T - sampler_T).exp().clamp(max=tis_cap), adv_T)
    return with_inputs(datum, logprobs=torch.where(sampled_T, old_T, torch.zeros_like(old_T)), advantages=adv_T)


def with_inputs(datum: types.Datum, **tensors: torch.Tensor) -> types.Datum:
    inputs = dict(datum.loss_fn_inputs)
    inputs.update({k: types.TensorData.from_torch(v.float()) for k, v in tensors.items()})
    return types.Datum(model_input=datum.model_input, loss_fn_inputs=inputs)


def apply_updates(training, datums: list[types.Datum], config, adam: types.AdamParams,
                  loss_fn_config: dict, mix: SFTMix | None = None, step: int = 0) -> UpdateResult:
    """Train on `datums`: config.updates_per_batch passes of config.minibatches optimizer steps each; with `mix`,
    each optimizer step also trains on that step's share of the SFT mix (run step `step`)."""
    shares = minibatch_indices(len(datums), config.minibatches)
    old = None
    if config.updates_per_batch > 1:
        out = training.forward(datums, loss_fn=config.loss_fn, loss_fn_config=loss_fn_config).result()
        old = [o["logprobs"].to_torch() for o in out.loss_fn_outputs]
    later_config = {k: v for k, v in loss_fn_config.items() if k != "tis_cap"}
    first, optim, clipped = {}, {}, []
    mix_loss = mix_tokens = 0.0
    for n in range(config.updates_per_batch):
        for share in shares:
            if n == 0:
                batch, cfg = [datums[i] for i in share], loss_fn_config
            else:
                batch = [against_old(datums[i], old[i], loss_fn_config.get("tis_cap")) for i in share]
                cfg = later_config
            fb = training.forward_backward(aggregated(batch, config), loss_fn=config.loss_fn,
                                           loss_fn_config=cfg).result().metrics
            if mix is not None:  # its gradient accumulates with the policy loss's until the optimizer steps
                anchor = mix.batch(step, len(clipped))
                mix_loss += training.forward_backward(anchor, loss_fn="cross_entropy").result().metrics["loss:sum"]
                mix_tokens += mix.weighted_tokens(anchor)
            optim = training.optim_step(adam).result().metrics
            if n == 0:
                for key, value in fb.items():
                    first[key] = max(first.get(key, value), value) if key.endswith(":max") else \
                        first.get(key, 0.0) + value
            tokens = fb.get("tokens:sum", 0.0)
            clipped.append(fb.get("clipped:sum", 0.0) / tokens if tokens else 0.0)
    return UpdateResult(first_pass=first, optim=optim, clipped_shares=clipped, optimizer_steps=len(clipped),
                        mix_loss=mix_loss / mix_tokens if mix_tokens else None)
