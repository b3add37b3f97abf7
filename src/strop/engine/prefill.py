"""A prefill in parts: prompts that each run a different number of new tokens (after what the prefix cache holds
of them) run in separate forwards, each padded only to its own longest, and the parts' caches are joined.

    parts = prefill_parts([len(rest) for rest in rests])   # [[indices], ...], shortest rests first
    logits, cache, mask = joined(parts, [run(part) for part in parts])
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache

# a prefill part's rows are padded to its longest rest: at most this many times the tokens they run
PREFILL_SLACK = 1.25


def prefill_parts(rests: list[int]) -> list[list[int]]:
    """The prompts (indices) run in one prefill forward each: by length of what each runs, shortest first, a part
    closed where padding it to its next row would run more than PREFILL_SLACK times its tokens. A part lists its
    indices in ascending order, so that a single part is the prompts in their own order (its run needs no join)."""
    order = sorted(range(len(rests)), key=lambda i: rests[i])
    parts, part, tokens = [], [], 0
    for i in order:
        if part and (len(part) + 1) * rests[i] > PREFILL_SLACK * (tokens + rests[i]):
            parts.append(sorted(part))
            part, tokens = [], 0
        part.append(i)
        tokens += rests[i]
    return parts + [sorted(part)] if part else parts


def joined(parts: list[list[int]], runs: list[tuple[torch.Tensor, DynamicCache, torch.Tensor]]
            ) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
    """One (logits, cache, mask) from each part's, rows back in the order of the indices in `parts`, every part's
    slots right-aligned (left padding masked); each part's cache is emptied a layer at a time as it is copied."""
    rows = sum(len(p) for p in parts)
    width = max(mask.shape[1] for _, _, mask in runs)
    first_logits, first_cache, first_mask = runs[0]
    logits = first_logits.new_empty((rows, first_logits.shape[1]))
    mask = first_mask.new_zeros((rows, width))
    at = [torch.tensor(part, dtype=torch.long, device=first_mask.device) for part in parts]
    for index, (part_logits, _, part_mask) in zip(at, runs):
        logits[index] = part_logits
        mask[index, width - part_mask.shape[1]:] = part_mask
    cache = DynamicCache()
    for layer in range(len(first_cache.layers)):
        k0 = first_cache.layers[layer].keys
        keys = k0.new_zeros((rows, k0.shape[1], width, k0.shape[3]))
        values = torch.zeros_like(keys)
        for index, (_, part_cache, _) in zip(at, runs):
            part = part_cache.layers[layer]
            keys[index, :, width - part.keys.shape[2]:] = part.keys
            values[index, :, width - part.values.shape[2]:] = part.values
            part.keys = part.values = None
        cache.update(keys, values, layer)
    return logits, cache, mask
