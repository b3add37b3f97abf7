"""A LoRA adapter applied beside a linear layer's weight instead of merged into it: y = x W^T + (x A^T) (sB)^T.

The sampler merges adapters in float32; in bf16 it cannot (the merged weight is rounded to bf16, and an update
smaller than half a bf16 step of the base weight is lost), so there each adapted projection carries its factors
and adds their product. The factors are rank-r, so this costs r (in + out) / (in x out) more: ~10% for SmolLM2's
projections at rank 32.

    install(module, a_R_I, sb_O_R)     # module's forward now adds the adapter's term
    remove(module)                     # back to the plain layer
    delta(x_B_I, (a_R_I, sb_O_R))      # the term itself, for a caller that multiplies the weight on its own
"""

from __future__ import annotations

from types import MethodType

import torch
import torch.nn.functional as F


def delta(x_B_I: torch.Tensor, factors: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    a_R_I, sb_O_R = factors
    return (x_B_I @ a_R_I.t()) @ sb_O_R.t()


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, self.weight, self.bias) + delta(x, self.strop_lora)


def install(module: torch.nn.Linear, a_R_I: torch.Tensor, sb_O_R: torch.Tensor) -> None:
    module.strop_lora = (a_R_I, sb_O_R)
    module.forward = MethodType(_forward, module)


def remove(module: torch.nn.Linear) -> None:
    module.__dict__.pop("forward", None)
    module.__dict__.pop("strop_lora", None)
