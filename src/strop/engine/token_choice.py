"""Choosing each row's next token in strop's sampler: greedy, or drawn under the row's temperature, top-k and top-p
from its own seeded generator, with the model's own logprob of the token chosen.

    tokens_B, logprobs_B = pick(logits_B_V, rows, mask_to_grammar)

The draw is by inverse CDF, in two levels (`inverse_cdf`), one uniform per row: a seed draws the same tokens
whatever else is in the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from strop.engine.sample_types import Row
from strop.types import SamplingParams

CDF_BLOCK = 256  # vocabulary entries per block of the two-level draw


def truncate(scores_V: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature-scaled scores with everything outside top-k and the top-p nucleus set to -inf."""
    if p.top_k > 0 and p.top_k < scores_V.numel():
        kth = torch.topk(scores_V, p.top_k).values[-1]
        scores_V = scores_V.masked_fill(scores_V < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_V, idx_V = torch.sort(scores_V, descending=True)
        probs_V = torch.softmax(sorted_V, dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always survives)
        drop_V = (probs_V.cumsum(-1) - probs_V) >= p.top_p
        scores_V = scores_V.scatter(0, idx_V[drop_V], float("-inf"))
    return scores_V


def inverse_cdf(probs_S_V: torch.Tensor, u_S: torch.Tensor) -> torch.Tensor:
    """For each row, the first index whose cumulative probability exceeds u x the row's total (u in [0, 1)).

    In two levels, so that no S x V cumulative sum is formed: the block of CDF_BLOCK entries holding the target,
    from the blocks' float64 sums, then the entry within that block. A zero-probability entry is never chosen:
    it cannot be the first to exceed the target, and if rounding between the two levels leaves the target past
    the chosen block's last entry, the block's last non-zero entry is taken. (A float64 cumulative sum over
    SmolLM2's 49,152 entries, with its float64 copy of the probabilities, was 9% of a 32-row decode step.)"""
    S, V = probs_S_V.shape
    n_blocks = -(-V // CDF_BLOCK)
    padded_S_V = torch.nn.functional.pad(probs_S_V, (0, n_blocks * CDF_BLOCK - V)) if V % CDF_BLOCK else probs_S_V
    blocks_S_N_K = padded_S_V.view(S, n_blocks, CDF_BLOCK)
    cdf_S_N = blocks_S_N_K.sum(-1, dtype=torch.float64).cumsum(-1)
    target_S = u_S.to(torch.float64) * cdf_S_N[:, -1]
    block_S = torch.searchsorted(cdf_S_N, target_S[:, None], right=True)[:, 0].clamp_(max=n_blocks - 1)
    before_S = torch.where(block_S > 0, cdf_S_N.gather(1, (block_S - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    inner_S_K = blocks_S_N_K[torch.arange(S), block_S].double()
    within_S = torch.searchsorted(inner_S_K.cumsum(-1), (target_S - before_S)[:, None], right=True)[:, 0]
    last_nonzero_S = CDF_BLOCK - 1 - (inner_S_K > 0).flip(-1).int().argmax(-1)
    within_S = torch.where(within_S < CDF_BLOCK, within_S, last_nonzero_S)
    return (block_S * CDF_BLOCK + within_S).clamp_(max=V - 1)


def pick(logits_B_V: torch.Tensor, rows: list[Row],
         mask_to_grammar: Callable[[torch.Tensor, int, object], None]) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose each row's next token under its own sampling params; return tokens and model logprobs.

    Greedy rows take one batched argmax. Sampled rows are scaled by their temperature together, truncated
    one by one only when they ask for top-k/top-p, and drawn together by inverse CDF from one uniform per
    row out of that row's own generator (torch.multinomial, a call per row, took a fifth of decode time).
    `mask_to_grammar(logits_B_V, b, matcher)` masks row b, in place, to what its grammar allows next."""
    logprobs_B_V = torch.log_softmax(logits_B_V, dim=-1)  # the model's own, before any grammar mask
    for b, row in enumerate(rows):
        if row.matcher is not None:
            mask_to_grammar(logits_B_V, b, row.matcher)
    tokens = torch.empty(len(rows), dtype=torch.long)
    greedy = [b for b, row in enumerate(rows) if row.params.temperature == 0]
    sampled = [b for b, row in enumerate(rows) if row.params.temperature != 0]
    if greedy:
        tokens[greedy] = logits_B_V[greedy].argmax(-1)
    if sampled:
        temps = [rows[b].params.temperature for b in sampled]
        if len(sampled) < logits_B_V.shape[0]:
            scores_S_V = logits_B_V[sampled]
        else:  # every row samples: no copy of the logits (the logprobs above are already taken)
            scores_S_V = logits_B_V
        if any(t != 1.0 for t in temps):
            scores_S_V = scores_S_V / torch.tensor(temps, dtype=logits_B_V.dtype)[:, None]
        for s, b in enumerate(sampled):
            p = rows[b].params
            if p.top_k > 0 or p.top_p < 1.0:  # most rows ask for neither: no per-row copy for them
                scores_S_V[s] = truncate(scores_S_V[s], p)
        probs_S_V = torch.softmax(scores_S_V, dim=-1)
        u_S = torch.cat([torch.rand(1, generator=rows[b].generator, dtype=torch.float64) for b in sampled])
        tokens[sampled] = inverse_cdf(probs_S_V, u_S)
    return tokens, logprobs_B_V.gather(1, tokens[:, None])[:, 0]
