"""A LoRA linear layer's forward and backward as one autograd Function: y = x W^T + b + s (x A^T) B^T.

PEFT computes the adapter's term as its own tensor, scales it and adds it to the base output: three extra passes
over the N x out output in the forward, and a scaling pass and a gradient sum in the backward, for each of the
seven adapted modules of every layer. Here the adapter's product is accumulated into the base output by the
matmul itself (addmm_ with alpha = s), and the backward forms the input's gradient the same way, so no N x out
or N x in tensor is touched outside a matmul. The parameters stay PEFT's own (lora_A, lora_B), so adapters save,
load and merge exactly as before.

    install(peft_model)        # every plain LoRA Linear runs through LoraLinear from now on

A bf16 base with fp32 LoRA weights (strop.engine.precision) multiplies in bf16, the LoRA weights cast for the
product, and hands fp32 gradients back to them. Anything else (adapters switched off or merged, dropout, DoRA
and other variants, several active adapters, autocast) goes through PEFT's own forward, unchanged.
"""

from __future__ import annotations

from types import MethodType

import torch


class LoraLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_N_I, weight_O_I, bias_O, a_R_I, b_O_R, scaling: float):
        # bf16 compute with fp32 LoRA weights: the products in the input's dtype, the gradients back in fp32
        ctx.adapter_dtype = a_R_I.dtype
        a_R_I, b_O_R = a_R_I.to(x_N_I.dtype), b_O_R.to(x_N_I.dtype)
        h_N_R = x_N_I @ a_R_I.t()
        y_N_O = x_N_I @ weight_O_I.t()
        if bias_O is not None:
            y_N_O += bias_O
        y_N_O.addmm_(h_N_R, b_O_R.t(), alpha=scaling)
        ctx.save_for_backward(x_N_I, h_N_R, weight_O_I, a_R_I, b_O_R)
        ctx.scaling = scaling
        return y_N_O

    @staticmethod
    def backward(ctx, grad_N_O):
        x_N_I, h_N_R, weight_O_I, a_R_I, b_O_R = ctx.saved_tensors
        s = ctx.scaling
        grad_h_N_R = grad_N_O @ b_O_R  # d y / d h, before the scaling
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_N_O @ weight_O_I
            grad_x.addmm_(grad_h_N_R, a_R_I, alpha=s)
        if ctx.needs_input_grad[3]:
            grad_a = (grad_h_N_R.t() @ x_N_I).to(ctx.adapter_dtype).mul_(s)
        if ctx.needs_input_grad[4]:
            grad_b = (grad_N_O.t() @ h_N_R).to(ctx.adapter_dtype).mul_(s)
        grad_weight = grad_N_O.t() @ x_N_I if ctx.needs_input_grad[1] else None
        grad_bias = grad_N_O.sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, grad_a, grad_b, None


def _forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    adapter = self.active_adapters[0] if len(self.active_adapters) == 1 else None
    plain = (not args and not kwargs and adapter is not None and not self.disable_adapters and not self.merged
             and adapter in self.lora_A and adapter not in getattr(self, "lora_variant", {})
             and isinstance(self.lora_dropout[adapter], torch.nn.Identity)
             and not torch.is_autocast_enabled("cpu") and x.dtype == self.base_layer.weight.dtype)
    if not plain:
        return type(self).forward(self, x, *args, **kwargs)
    base = self.base_layer
    flat = x.reshape(-1, x.shape[-1])
    y = LoraLinear.apply(flat, base.weight, base.bias, self.lora_A[adapter].weight, self.lora_B[adapter].weight,
                         float(self.scaling[adapter]))
    return y.reshape(*x.shape[:-1], y.shape[-1])


def install(model: torch.nn.Module) -> int:
    """Route every PEFT LoRA Linear of `model` through LoraLinear; returns how many were routed."""
    # lazy: peft is heavy or optional, loaded only when this runs
    from peft.tuners.lora.layer import Linear
    count = 0
    for module in model.modules():
        if type(module) is Linear and isinstance(module.base_layer, torch.nn.Linear):
            module.forward = MethodType(_forward, module)
            count += 1
    return count
