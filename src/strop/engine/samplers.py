"""Which engine a SamplingClient's requests run on: strop's own decoder or vLLM.

    resolve_sampler("auto")   # "strop" or "vllm" for this machine
    make_engine("vllm", model_dir, tokenizer=tok, dtype=torch.float32)

`auto` (the default; STROP_SAMPLER sets another) takes the fastest engine installed for the device: vLLM on a
CUDA GPU when it is installed, strop's decoder on a CPU. On this project's CPU machines strop's float32 decoder
outruns vLLM-CPU's float32 engine (benchmarks/sampler.py prints both, and HF generate, side by side), and
sampling stays float32 on a CPU under `auto` (strop.engine.precision: bf16 sampling cost learning). Either can
be asked for: `execution.sampler`, `strop train --sampler`, `ServiceClient(sampler=...)`.
"""

from __future__ import annotations

import os
from pathlib import Path

from strop.errors import StropError

NAMES = ("strop", "vllm")
CHOICES = ("auto", *NAMES)


def check_sampler(name: str, what: str = "sampler") -> str:
    if name not in CHOICES:
        raise StropError(f"{what} must be one of {', '.join(CHOICES)}, got {name!r}")
    return name


def resolve_sampler(name: str | None = "auto") -> str:
    """"strop" or "vllm" for `name` (None or "auto" reads STROP_SAMPLER, then decides by the device)."""
    name = check_sampler(name or "auto")
    if name == "auto":
        name = check_sampler(os.environ.get("STROP_SAMPLER") or "auto", what="STROP_SAMPLER")
    if name != "auto":
        return name
    import torch  # lazy: checking a config's sampler needs no torch

    from strop.engine.vllm_engine import vllm_available
    return "vllm" if torch.cuda.is_available() and vllm_available() else "strop"


def make_engine(name: str, model_dir: str | Path, *, tokenizer, dtype, max_batch: int = 64, device: str = "cpu",
                **options):
    """A started engine of that name (VllmEngineError, naming the extra to install, when vLLM is missing); strop's
    own computes on `device` (vLLM picks its own)."""
    if name == "vllm":
        from strop.engine.vllm_engine import VllmEngine  # lazy: each engine's module loads only when chosen
        return VllmEngine(model_dir, tokenizer=tokenizer, dtype=dtype, max_batch=max_batch, **options)
    if name == "strop":
        from strop.engine.sampler import SamplerEngine  # lazy: each engine's module loads only when chosen
        return SamplerEngine(model_dir, tokenizer=tokenizer, dtype=dtype, max_batch=max_batch, device=device)
    raise StropError(f"unknown sampler {name!r}; use one of {', '.join(NAMES)}")
