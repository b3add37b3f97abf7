"""The trainer's fused vocabulary head: log p(target) and the entropy at N positions, and the gradient of log p,
as one autograd Function.

    lp_N, entropy_N = TargetLogprob.apply(hidden_N_H, head_weight_V_H, targets_N, keep)

`strop.engine.trainer._head_logprobs` runs it HEAD_CHUNK positions at a time and decides which chunks keep their
softmax for the backward.
"""

from __future__ import annotations

import torch


class TargetLogprob(torch.autograd.Function):
    """log p(target) and the entropy at N positions under a frozen vocabulary head, in as few passes over the
    N x V logits as the maths allows.

    Forward: one matmul, one max, one exp, one sum and one dot per row. With `keep`, the softmax is kept and
    the backward forms d lp / d logits = onehot - softmax in place over it; without, only the hidden states and
    the log-normaliser are kept and the backward recomputes the logits first. Then one matmul back to the
    hidden states. (Autograd over logsumexp and gather under activation
    checkpointing took twice the passes and allocated a zeroed N x V gradient for the gather.)
    The entropy carries no gradient."""

    @staticmethod
    def forward(ctx, hidden_N_H, weight_V_H, targets_N, keep: bool):
        logits_N_V = _at_least_fp32(hidden_N_H @ weight_V_H.t())
        max_N = logits_N_V.amax(-1)
        logits_N_V.sub_(max_N[:, None])  # shifted, in place
        exp_N_V = logits_N_V.exp()
        sum_N = exp_N_V.sum(-1)
        log_sum_N = sum_N.log()
        # H = log Z - E_p[logit]: shift-invariant, so the shifted logits serve
        entropy_N = log_sum_N - torch.linalg.vecdot(exp_N_V, logits_N_V) / sum_N
        lp_N = logits_N_V.gather(-1, targets_N[:, None])[:, 0] - log_sum_N
        del logits_N_V
        if keep:  # the softmax itself, for the backward: no second projection onto the vocabulary
            ctx.save_for_backward(hidden_N_H, weight_V_H, targets_N, exp_N_V.div_(sum_N[:, None]))
        else:
            ctx.save_for_backward(hidden_N_H, weight_V_H, targets_N, max_N + log_sum_N)
        ctx.keep = keep
        ctx.mark_non_differentiable(entropy_N)
        return lp_N, entropy_N

    @staticmethod
    def backward(ctx, grad_lp_N, _grad_entropy_N):
        hidden_N_H, weight_V_H, targets_N, kept = ctx.saved_tensors
        if ctx.keep:
            grad_N_V = kept.mul_(-grad_lp_N[:, None])  # -g * softmax, over the kept softmax (used once)
        else:
            grad_N_V = _at_least_fp32(hidden_N_H @ weight_V_H.t())
            grad_N_V.sub_(kept[:, None]).exp_().mul_(-grad_lp_N[:, None])  # -g * softmax
        grad_N_V[torch.arange(len(targets_N), device=targets_N.device), targets_N] += grad_lp_N  # + g * onehot(target)
        return (grad_N_V.to(hidden_N_H.dtype) @ weight_V_H), None, None, None


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()
