"""strop's LoRA linear Function against PEFT's own forward: same outputs and gradients, and PEFT's path kept for
everything the Function does not cover."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from strop.engine import lora_linear


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(6, 10, bias=True)
        self.down = torch.nn.Linear(10, 6, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def make(dtype=torch.float64, **lora):
    torch.manual_seed(0)
    model = get_peft_model(TwoLayers().to(dtype), LoraConfig(r=3, lora_alpha=7, target_modules=["up", "down"], **lora))
    with torch.no_grad():  # lora_B starts at zero: make it not, so every gradient is exercised
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, dtype=dtype))
    return model


def outputs_and_grads(model, x):
    x = x.clone().requires_grad_(True)
    y = model(x)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return y.detach(), x.grad, grads


def test_same_outputs_and_gradients_as_peft():
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    reference = outputs_and_grads(make(), x)
    model = make()
    assert lora_linear.install(model) == 2
    fast = outputs_and_grads(model, x)
    assert torch.allclose(fast[0], reference[0], atol=1e-12)
    assert torch.allclose(fast[1], reference[1], atol=1e-12)
    assert fast[2].keys() == reference[2].keys() and len(fast[2]) == 4
    for name in reference[2]:
        assert torch.allclose(fast[2][name], reference[2][name], atol=1e-12), name


def test_the_function_passes_gradcheck():
    torch.manual_seed(1)
    args = [torch.randn(4, 6, dtype=torch.float64, requires_grad=True), torch.randn(5, 6, dtype=torch.float64),
            torch.randn(5, dtype=torch.float64), torch.randn(2, 6, dtype=torch.float64, requires_grad=True),
            torch.randn(5, 2, dtype=torch.float64, requires_grad=True), 1.75]
    assert torch.autograd.gradcheck(lambda *a: lora_linear.LoraLinear.apply(*a), args)


def test_switched_off_adapters_and_dropout_take_peft_path():
    x = torch.randn(3, 6, dtype=torch.float64)
    model = make()
    lora_linear.install(model)
    with model.disable_adapter():
        plain = model(x)
    inner = model.get_base_model()
    assert torch.allclose(plain, inner.down.base_layer(torch.relu(inner.up.base_layer(x))))  # really off
    assert not torch.allclose(plain, model(x))
    calls = []
    original = lora_linear.LoraLinear.apply
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lora_linear.LoraLinear, "apply", lambda *a: calls.append(1) or original(*a))
        dropout = make(lora_dropout=0.5)
        lora_linear.install(dropout)
        dropout.eval()  # dropout is then the identity in value, but PEFT's module still takes its own path
        assert torch.allclose(dropout(x), make()(x))
        assert calls == []
        model(x)
        assert len(calls) == 2
