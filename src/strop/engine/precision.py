"""Which floating-point type the sampler and the trainer compute in, chosen per machine.

    resolve_dtype("auto")      # "bfloat16" where the hardware multiplies bf16 natively, else "float32"
    kernels()                  # "AVX512; bf16: avx512_bf16, amx_bf16" (benchmarks print it)

The trainer takes bf16 under `auto` where it pays. A GRPO run's own rollouts sample in what its trainer computes in
(`sampler_dtype_for(..., rollouts=True)`, asked for with `sampler_dtype="trainer"`), corrected by truncated
importance sampling (the run's `rollout_correction` "auto"); every other sampler (evaluations, `strop serve`, a
`ServiceClient()` of the Tinker-style API) stays float32 on a CPU under `auto`: a bf16 forward scores a tuned model
lower than float32 does (`sampler_dtype_for`).

bf16 pays only where the hardware has bf16 units: measured on one of this project's CPU machines (AMD EPYC with
AVX-512 BF16 and AMX, torch 2.13), a 2048^2 matmul ran at 266 GFLOP/s in fp32 and 808 in bf16; on AVX2-only
machines bf16 matmul runs at 0-27 GFLOP/s, 5-100x slower than fp32. So `auto` takes bf16 on a CUDA device that
supports it and on a CPU whose flags name avx512_bf16 or amx_bf16, fp32 everywhere else. Either can be forced
(`--dtype float32|bfloat16`, `execution.dtype`, `STROP_DTYPE`): fp32 to reproduce an earlier run bit for bit,
bf16 to test the path on a machine where it is slow.

In bf16 the base model's weights and activations are bf16; the LoRA weights the optimizer updates stay fp32
(the trainer casts them to bf16 for each product and returns fp32 gradients), and the vocabulary's log-softmax,
every logprob, loss and KL are computed in fp32 from the bf16 logits.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

from strop.choices import DTYPE_CHOICES as CHOICES, DTYPE_NAMES as NAMES  # the one list, a leaf's
from strop.errors import StropError

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cpu_has_bf16() -> bool:
    return any(flag in cpu_flags() for flag in BF16_CPU_FLAGS)


def check_dtype(name: str, what: str = "dtype") -> str:
    if name not in CHOICES:
        raise StropError(f"{what} must be one of {', '.join(CHOICES)}, got {name!r}")
    return name


def resolve_dtype(name: str | None = "auto", device: str = "cpu") -> str:
    """"float32" or "bfloat16" for `name` ("auto" | "float32" | "bfloat16"; None or "auto" reads STROP_DTYPE,
    then decides by the hardware)."""
    name = check_dtype(name or "auto")
    if name == "auto":
        name = check_dtype(os.environ.get("STROP_DTYPE") or "auto", what="STROP_DTYPE")
    if name != "auto":
        return name
    if device.startswith("cuda"):
        import torch  # lazy: checking a config's dtype needs no torch
        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_has_bf16() else "float32"


SAMPLE_AS_TRAINER = "trainer"  # a sampler_dtype: sample in what the trainer computes in (a run's own rollouts)


def sampler_dtype_for(name: str | None = "auto", device: str = "cpu", rollouts: bool = False) -> str:
    """The sampler's dtype when the trainer's is `name`: an explicit choice (the argument, or STROP_DTYPE) for both;
    under `auto`, the trainer's for a training run's own `rollouts`, and otherwise float32 on a CPU whatever the
    trainer takes.

    Rollouts: on the arithmetic benchmark (2026-12-06, avx512_bf16, two seeds each), bf16 sampling corrected by
    truncated importance sampling reached 75.5% and 76.5% held out (scored in float32) against 63.0% and 84.5% for
    float32 sampling, with a step 1.12-1.21x faster; without the correction 56.5%. So a run samples its rollouts
    in bf16 where the trainer computes in it, with the correction on (strop.rl's rollout_correction "auto").
    Evaluations: the same adapter scored 67.0% through the bf16 sampler and 75.5% in float32.

    Before the correction (SmolLM2-135M with AMX, the same benchmark): one adapter scored 113/200 sampled in bf16
    with merged weights, 130/200 with the adapter beside them, 141/200 in float32: a bf16 forward rounds away the
    small differences an RL step makes, hence float32 evaluations."""
    name = check_dtype(name or "auto")
    if name == "auto":
        name = check_dtype(os.environ.get("STROP_DTYPE") or "auto", what="STROP_DTYPE")
    if name != "auto":
        return name
    return resolve_dtype("auto", device) if rollouts or device.startswith("cuda") else "float32"


def torch_dtype(name: str | None = "auto", device: str = "cpu"):
    import torch  # lazy: checking a config's dtype needs no torch
    return getattr(torch, resolve_dtype(name, device))


def train_device(name: str | None = None) -> str:
    """Where the trainer computes: `name`, else STROP_DEVICE, else "cuda" when torch sees a CUDA GPU (a Ray
    actor given one sees just it), else "cpu". "cuda:N" picks a GPU; asking for CUDA where there is none is
    refused, with the count found."""
    import torch  # lazy: checking a config's dtype needs no torch
    name = name or os.environ.get("STROP_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return name
    kind, _, index = name.partition(":")
    if kind != "cuda" or (index and not (index.isdigit() and len(index) <= 4)):
        raise StropError(f"STROP_DEVICE must be cpu, cuda or cuda:N, got {name[:40]!r}")
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(index or 0) >= found:
        raise StropError(f"device {name[:40]!r} asked for, and torch sees {found} CUDA GPU{'s' if found != 1 else ''} "
                         "here: unset STROP_DEVICE, or run where the GPU is")
    return name


def cuda_count() -> int:
    """The CUDA GPUs torch sees here (0 without CUDA); CUDA is not initialised to count them."""
    import torch  # lazy: checking a config's dtype needs no torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpus_value_problem(gpus) -> str | None:
    """Why `gpus` is not a count of GPUs (a whole number, 0 or more; None: not given), or None."""
    if gpus is None or (isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0):
        return None
    return (f"must be a whole number of GPUs, 0 or more (0 computes on the CPU, 1 on a GPU where there is one); "
            f"got {str(gpus)[:40]!r}")


def gpus_problem(gpus: int | None, found: int) -> str | None:
    """Why a run in one process cannot have `gpus` (execution.gpus) where torch sees `found` CUDA GPUs, or None.

    0 computes on the CPU, and 1 on the GPU (on the CPU where there is none: the seeds' descriptors ask for one GPU
    and run on CPU machines too). More than one is refused: a run in one process trains on one GPU, and more than
    this machine has is refused with the count found. On Ray, execution.gpus counts the cluster's GPUs instead
    (strop.cluster.trainer: a data-parallel trainer a GPU)."""
    if gpus is None:
        return None
    if problem := gpus_value_problem(gpus):
        return problem
    if gpus <= 1:
        return None
    if gpus > found:
        return (f"asks for {gpus} GPUs, and torch sees {found} CUDA GPU{'s' if found != 1 else ''} on this machine: "
                "lower execution.gpus (1 takes one GPU where there is one, 0 computes on the CPU), or run where the "
                "GPUs are")
    return (f"asks for {gpus} GPUs, and a run in one process trains on one: set it to 1, or add execution.ray "
            f"(with \"trainers\": {gpus}) to train {gpus} data-parallel trainers, a GPU each, on a Ray cluster")


def run_device(gpus: int | None = None) -> str:
    """Where a run in this process computes, given its execution.gpus: the CPU for 0; for 1, train_device() (a CUDA
    GPU where torch sees one, STROP_DEVICE honoured) and the CPU where there is none; None decides as 1 does.
    More GPUs than one process uses, or than the machine has, are refused (gpus_problem)."""
    if gpus == 0:
        return "cpu"
    found = cuda_count()
    problem = gpus_problem(gpus, found)
    if problem:
        raise StropError(f"execution.gpus {problem}")
    return train_device() if found or os.environ.get("STROP_DEVICE") else "cpu"


def kernels() -> str:
    """The CPU's vector kernels as torch dispatches them, and its bf16 units: a benchmark's figures depend on both."""
    import torch  # lazy: checking a config's dtype needs no torch
    bf16 = [flag for flag in BF16_CPU_FLAGS if flag in cpu_flags()]
    return f"{torch.backends.cpu.get_cpu_capability()}; bf16 units: {', '.join(bf16) or 'none'}"


def engine_facts(trainer_dtype, sampler_dtype) -> dict:
    """What a run computed in and on, for its folder (`engine.json`): a figure means little without them."""
    return {"trainerDtype": str(trainer_dtype).removeprefix("torch."),
            "samplerDtype": str(sampler_dtype).removeprefix("torch."),
            "kernels": kernels(), "processor": platform.processor() or platform.machine()}
