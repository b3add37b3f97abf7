"""Which engine a SamplingClient's requests run on: strop's own decoder or vLLM.

    resolve_sampler("auto")   # "strop" or "vllm" for this machine
    make_engine("vllm", model_dir, tokenizer=tok, dtype=torch.float32)

`auto` (the default; STROP_SAMPLER sets another) takes vLLM on a CUDA GPU when it is installed, strop's decoder
on a CPU. On this project's CPU machines (benchmarks/sampler.py prints all three engines side by side; figures in
benchmarks/RESULTS.md) strop's float32 decoder samples the GRPO shape, a prompt's samples sharing its prefill,
1.13-1.35x faster than vLLM-CPU in float32, and vLLM leads batches of 8-32 distinct greedy prompts by 4-26%: less than
its start (12-36 s, once a process) repays on an evaluation of a few minutes. Sampling stays float32 on a CPU under
`auto` (strop.engine.precision: bf16 sampling cost learning). Either can be asked for: `execution.sampler`,
`strop train --sampler`, `--sampler` on evaluations, `ServiceClient(sampler=...)`.
"""

from __future__ import annotations

import os
from pathlib import Path

from strop.choices import SAMPLER_CHOICES as CHOICES, SAMPLER_NAMES as NAMES  # the one list, a leaf's
from strop.errors import StropError



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
