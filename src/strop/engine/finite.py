"""Non-finite numbers in training: which tensors hold NaN or infinity, and the refusal to keep such an adapter.

    bad = nonfinite_names(dict(model.named_parameters()))     # ['...lora_B.weight', ...] or []
    refuse_nonfinite(bad, "save the adapter to runs/x/final")  # StropError naming them, when there are any
    check_adapter_file("runs/x/final")                         # the same for a saved adapter folder

One NaN in a LoRA weight makes every logit of the layers after it NaN: the adapter samples garbage and every
later update is NaN too. So the trainer skips an update whose loss or gradient is not finite (`LoraTrainer`),
and no adapter with a non-finite weight is written, loaded or registered as a run's model.
"""

from __future__ import annotations

from pathlib import Path

import torch

from strop.errors import StropError


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """True when no tensor holds NaN or infinity (one device sync, however many tensors)."""
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def nonfinite_names(named: dict[str, torch.Tensor]) -> list[str]:
    """The names of the tensors that hold NaN or infinity (empty when all are finite)."""
    if all_finite(list(named.values())):
        return []
    return [name for name, t in named.items() if not bool(torch.isfinite(t).all())]


def refuse_nonfinite(names: list[str], what: str) -> None:
    """StropError when `names` (of non-finite tensors) is not empty: `what` (the action) is not done."""
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise StropError(f"cannot {what}: {len(names)} of the adapter's tensors hold NaN or infinity ({shown}); an "
                         "adapter like that samples garbage. Train again from the last good checkpoint, with a lower "
                         "learning rate or a grader whose scores stay in range")


def check_adapter_file(folder: str | Path, what: str | None = None) -> None:
    """StropError when the adapter in `folder` (adapter_model.safetensors) holds a non-finite weight."""
    from safetensors.torch import load_file  # lazy: a dependency of the trainer, not of whoever imports this
    weights = Path(folder) / "adapter_model.safetensors"
    refuse_nonfinite(nonfinite_names(load_file(str(weights))), what or f"use the adapter in {folder}")
