"""From datums to the trainer's loss, a micro-batch at a time: whether the datums carry what the loss function
needs (`check_datums`), which of them train together (`micro_batches`), their padded tensors (`padded_batch`), and
each datum's loss, outputs and statistics under the loss function asked for (`datum_losses`).

    for batch in micro_batches(datums, max_tokens_per_batch):
        part = [datums[i] for i in batch]
        input_ids, mask, targets, active, inputs = padded_batch(part, loss_fn, device)
        lp_B_T, entropy_B_T = ...             # the trainer's log p(target) and entropy at every position
        total, outputs, stats = datum_losses(part, loss_fn, config, lp_B_T, entropy_B_T, active, inputs, device)

The losses are sums, so gradients add up across micro-batches exactly as one big batch would give.
"""

from __future__ import annotations

import math

import torch

from strop.engine.losses import DRO_BETA, LOSSES, ratio_stats, sequence_loss
from strop.errors import StropError
from strop.types import Datum, TensorData

REQUIRED_INPUTS = {name: loss.inputs for name, loss in LOSSES.items()}


def check_datums(datums: list[Datum], loss_fn: str) -> None:
    """StropError when `loss_fn` is unknown or a datum lacks an input it needs or has one of the wrong length."""
    if loss_fn not in REQUIRED_INPUTS:
        raise StropError(f"unknown loss_fn {loss_fn!r}; choose one of {', '.join(REQUIRED_INPUTS)}")
    for i, datum in enumerate(datums):
        missing = [k for k in REQUIRED_INPUTS[loss_fn] if k not in datum.loss_fn_inputs]
        if missing:
            raise StropError(f"datum {i}: loss_fn {loss_fn!r} needs loss_fn_inputs {list(REQUIRED_INPUTS[loss_fn])}; "
                             f"missing {missing}")
        n = datum.model_input.length
        for key in REQUIRED_INPUTS[loss_fn]:
            got = len(datum.loss_fn_inputs[key].data)
            if got != n:
                raise StropError(f"datum {i}: loss_fn_inputs[{key!r}] has {got} values but the model input has {n} "
                                 "tokens; each loss input needs one value per input position")


def micro_batches(datums: list[Datum], max_tokens_per_batch: int) -> list[list[int]]:
    """Indices into `datums`, shortest first, in runs whose padded size (rows x the longest) fits
    `max_tokens_per_batch` (at least one datum a run)."""
    batches, current, width = [], [], 0
    for i in sorted(range(len(datums)), key=lambda i: datums[i].model_input.length):
        n = datums[i].model_input.length
        if current and max(width, n) * (len(current) + 1) > max_tokens_per_batch:
            batches.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, n)
    if current:
        batches.append(current)
    return batches


def padded_batch(datums: list[Datum], loss_fn: str, device):
    """The datums right-padded to the longest, on `device`: input ids, mask, target tokens and the positions whose
    loss counts [B, T] (active: a nonzero weight or advantage; for dro also every sampled token), and each datum's
    other loss inputs as float tensors."""
    width = max(d.model_input.length for d in datums)
    B = len(datums)
    input_ids = torch.zeros((B, width), dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.bool)
    targets = torch.zeros((B, width), dtype=torch.long)
    active = torch.zeros((B, width), dtype=torch.bool)
    inputs = []
    for b, d in enumerate(datums):
        n = d.model_input.length
        input_ids[b, :n] = torch.tensor(d.model_input.to_ints(), dtype=torch.long)
        mask[b, :n] = True
        targets[b, :n] = d.loss_fn_inputs["target_tokens"].to_torch().reshape(-1)
        row = {k: v.to_torch().reshape(-1).float() for k, v in d.loss_fn_inputs.items() if k != "target_tokens"}
        active[b, :n] = (row["weights"] if loss_fn == "cross_entropy" else row["advantages"]) != 0
        if loss_fn == "dro":   # its penalty holds on every sampled token, advantage or not (prompt positions: q = 0)
            active[b, :n] |= row["logprobs"] != 0
        inputs.append({k: v.to(device) for k, v in row.items()})
    input_ids, mask, targets, active = (t.to(device) for t in (input_ids, mask, targets, active))
    return input_ids, mask, targets, active, inputs


def datum_losses(datums: list[Datum], loss_fn: str, config: dict, lp_B_T, entropy_B_T, active, inputs, device):
    """The micro-batch's summed loss (a datum whose loss is not finite left out, and counted), each datum's
    logprobs and entropy, and the statistics summed (or, for :max, maximised) over its datums."""
    total = torch.zeros((), device=device)
    outputs, stats = [], {"tokens:sum": 0.0, "entropy:sum": 0.0, "kl_sample_train:sum": 0.0, "clipped:sum": 0.0,
                          "kl_sample_train:max": 0.0, "ratio_outside:sum": 0.0, "nonfinite_loss:sum": 0.0}
    low, high = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
    tis_cap = config.get("tis_cap")
    beta = config.get("beta", DRO_BETA)
    per_sequence = config.get("importance_ratio", "token") == "sequence"   # GSPO
    for b, d in enumerate(datums):
        n = d.model_input.length
        lp_T, active_T, row = lp_B_T[b, :n], active[b, :n], inputs[b]
        loss, clipped_T = sequence_loss(loss_fn, lp_T, row, low, high, tis_cap, beta, per_sequence, active_T)
        if clipped_T is not None:
            stats["clipped:sum"] += float(clipped_T[active_T].sum())
        if LOSSES[loss_fn].policy:
            stats["kl_sample_train:sum"] += float((row["logprobs"] - lp_T.detach())[active_T].sum())
            largest, outside = ratio_stats(lp_T[active_T], row["logprobs"][active_T])
            stats["kl_sample_train:max"] = max(stats["kl_sample_train:max"], largest)
            stats["ratio_outside:sum"] += outside
        if math.isfinite(float(loss.detach())):
            total = total + loss
        else:  # left out of the loss and its gradient, and counted: the optim_step that follows is skipped
            stats["nonfinite_loss:sum"] += 1
        stats["tokens:sum"] += float(active_T.sum())
        stats["entropy:sum"] += float(entropy_B_T[b, :n][active_T].sum())
        outputs.append({"logprobs": TensorData.from_torch(lp_T.detach().cpu()),
                        "entropy": TensorData.from_torch(entropy_B_T[b, :n].cpu())})
    return total, outputs, stats
