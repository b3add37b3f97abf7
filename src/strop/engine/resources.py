"""Will a run fit in memory? An estimate of a GRPO run's peak resident memory, checked before it starts.

    need = estimate_grpo_memory(model_dir, batch_size=8, group_size=8, prompt_tokens=64, completion_tokens=256)
    check_fits(need)          # StropError with the estimate, what is available and what to change

The estimate adds up, for the float32 CPU path strop runs:
- weights: the sampler's copy and the trainer's copy of the base model (4 bytes per parameter each),
- the sampler's KV cache for a full batch of rows (at most the engine's 64 rows at once),
- training activations kept for the backward pass, for one micro-batch (the trainer packs at most 16,384
  tokens per micro-batch, fewer when that would not fit: `plan_grpo_memory`), per token and layer as measured
  on this code (see ACTIVATION_FLOATS),
- a chunk of vocabulary logits, the softmax the trainer keeps for the backward (at most HEAD_KEEP_BYTES),
- every completion of a step (batch_size x group_size of them), held from sampling until the update: its token
  ids, logprobs, text and rollout record, and its datum over the prompt and the completion (ROLLOUT_BYTES_PER_TOKEN,
  DATUM_BYTES_PER_TOKEN), with no cap: a group of 10^9 samples is refused here rather than by the OOM killer,
- and the Python/torch runtime.
Available memory is MemAvailable from /proc/meminfo plus what this process freed and keeps for reuse, or `$STROP_MEMORY_LIMIT_MB` when set (to keep a run
within a share of a machine, and for tests).

Weights count the bytes of the dtype each side computes in (bf16 2, fp32 4). With the vLLM sampler, its KV cache is
the budget strop gives it (`vllm_kv_budget`: what the run decodes at once, at least one sequence of the model's
full length, which vLLM needs to start), not a share of the machine.

On a CUDA device the parts split: weights, caches, activations, logits and each process's CUDA context live on
the GPU and are checked against its free memory (`torch.cuda.mem_get_info`, or `$STROP_GPU_MEMORY_LIMIT_MB`);
the completions held for the update and the runtime stay in host memory and are checked against it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from strop.engine.malloc import kept_free_bytes
from strop.errors import StropError

GIB = 1 << 30
RUNTIME_BYTES = int(0.3 * GIB)        # interpreter, torch, tokenizer, HTTP and store clients
MAX_SAMPLER_ROWS = 64                 # SamplerEngine's default max_batch
MAX_TOKENS_PER_MICRO_BATCH = 16384    # LoraTrainer's default max_tokens_per_batch
# The trainer's vocabulary head (strop.engine.trainer._head_logprobs). Positions per projection: 512 x 49152
# fp32 logits = 100 MB; in the training profile, MKL ran the 128-row product here at ~54 GFLOP/s.
HEAD_CHUNK = 512
# Softmax kept for the backward, per micro-batch: within it, the backward skips a second projection onto the
# vocabulary and its exp (2,048 trained positions of SmolLM2 keep 403 MB); past it, chunks recompute.
HEAD_KEEP_BYTES = 1 << 30
# float32 values kept per token and layer for the backward pass, as multiples of the hidden size (H) and the
# MLP width (I): calibrated against measured peaks (benchmarks/RESULTS.md, "memory estimate").
ACTIVATION_FLOATS = (24, 7)
# What the loop keeps per completion until the step's update (strop.rl.step.train_step), measured with
# tracemalloc on its own objects at 256 completions of 256 tokens: sampled ids and logprobs, the Completion's
# copies, its text and rollout record, 98 bytes per completion token; each datum's Python lists 108 bytes per
# prompt + completion token, plus 16 bytes of tensors (int64 targets, float32 logprobs and advantages).
ROLLOUT_BYTES_PER_TOKEN = 100
DATUM_BYTES_PER_TOKEN = 128
# A process's CUDA context, cuBLAS workspaces and the caching allocator's slack (the trainer's process, and the vLLM
# engine's where it samples): about what torch reports reserved beyond its tensors on a fresh device.
CUDA_CONTEXT_BYTES = int(0.75 * GIB)
ON_DEVICE = ("weights", "kvCache", "activations", "logitsChunk", "headSoftmax", "cudaContext")
# vLLM beyond its weights and KV cache: sampling buffers and the profile run's activations (eager mode, no graphs)
VLLM_WORKSPACE_BYTES = 1 * GIB


class MemoryRefused(StropError):
    """A run whose estimated peak memory is more than the machine has available."""


def model_shape(model_dir: str | Path) -> dict:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    text = config.get("text_config", config)
    hidden, layers = text["hidden_size"], text["num_hidden_layers"]
    heads = text.get("num_attention_heads", 1)
    kv_heads = text.get("num_key_value_heads", heads)
    head_dim = text.get("head_dim") or hidden // heads
    inter, vocab = text.get("intermediate_size", 4 * hidden), text["vocab_size"]
    per_layer = hidden * head_dim * (heads * 2 + kv_heads * 2) + 3 * hidden * inter
    embeddings = vocab * hidden * (1 if text.get("tie_word_embeddings", config.get("tie_word_embeddings", True)) else 2)
    return {"hidden": hidden, "layers": layers, "intermediate": inter, "vocab": vocab, "kvDim": kv_heads * head_dim,
            "parameters": layers * per_layer + embeddings}


def kv_bytes_per_token(shape: dict, dtype_bytes: int = 4) -> int:
    """Keys and values of one position, every layer."""
    return shape["layers"] * 2 * shape["kvDim"] * dtype_bytes


def max_positions(model_dir: str | Path) -> int | None:
    """The longest sequence the model's config allows (max_position_embeddings), or None where it names none."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    value = config.get("text_config", config).get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def vllm_kv_budget(model_dir: str | Path, *, rows: int, seq: int, dtype_bytes: int = 4,
                   max_model_len: int | None = None) -> int:
    """Bytes of KV cache to give vLLM for a run decoding `rows` sequences of up to `seq` positions at once: what
    they hold, and never less than one sequence of the longest length vLLM will serve (it refuses to start
    otherwise: Qwen3's 40,960 positions in bf16 need 4.4 GiB), plus a tenth for its block rounding; a multiple of
    64 MiB, at least 256 MiB."""
    shape = model_shape(model_dir)
    longest = max_model_len or max_positions(model_dir) or seq
    need = max(rows * seq, longest) * kv_bytes_per_token(shape, dtype_bytes) * 1.1
    step = 64 << 20
    return max(256 << 20, -(-int(need) // step) * step)


def vllm_share_bytes(model_dir: str | Path, kv_bytes: int, dtype_bytes: int, max_batch: int = MAX_SAMPLER_ROWS) -> int:
    """The GPU memory a vLLM engine takes with this KV budget: its weights, the cache, the logits of a full batch,
    its workspace and its CUDA context. vLLM is given this as its share of the device (gpu_memory_utilization), so
    beside strop's trainer it neither takes a fixed fraction nor refuses to start for want of it."""
    shape = model_shape(model_dir)
    return (shape["parameters"] * dtype_bytes + kv_bytes + max_batch * shape["vocab"] * 4 * 2 + VLLM_WORKSPACE_BYTES
            + CUDA_CONTEXT_BYTES)


def estimate_grpo_memory(model_dir: str | Path, *, batch_size: int, group_size: int, prompt_tokens: int,
                         completion_tokens: int, micro_batch_tokens: int = MAX_TOKENS_PER_MICRO_BATCH,
                         trainer_bytes: int = 4, sampler_bytes: int = 4, sampler_kv_bytes: int | None = None,
                         sampler: str = "strop", device: str = "cpu") -> dict:
    """Estimated peak bytes of a GRPO run, in parts, with `total`, and on a CUDA `device` the parts on it
    (`deviceTotal`) and in host memory (`hostTotal`). `sampler_kv_bytes`: the KV cache budget of a sampler that
    is given one (vLLM), instead of what strop's own decoder holds for its batch."""
    shape = model_shape(model_dir)
    seq = prompt_tokens + completion_tokens
    completions = batch_size * group_size
    rows = min(completions, MAX_SAMPLER_ROWS)  # the sampler decodes at most this many at once; the rest wait
    tokens = min(completions * seq, micro_batch_tokens)
    per_token_layer = (ACTIVATION_FLOATS[0] * shape["hidden"] + ACTIVATION_FLOATS[1] * shape["intermediate"]) * 4
    parts = {
        "weights": shape["parameters"] * (trainer_bytes + sampler_bytes),
        "kvCache": sampler_kv_bytes if sampler_kv_bytes is not None else
        rows * seq * kv_bytes_per_token(shape, sampler_bytes) + rows * shape["vocab"] * 4 * 3,
        "activations": tokens * shape["layers"] * per_token_layer,
        "logitsChunk": HEAD_CHUNK * shape["vocab"] * 4 * 2,
        "headSoftmax": min(HEAD_KEEP_BYTES, tokens * shape["vocab"] * 4),
        "rollouts": completions * (completion_tokens * ROLLOUT_BYTES_PER_TOKEN + seq * DATUM_BYTES_PER_TOKEN),
        "runtime": RUNTIME_BYTES,
    }
    on_gpu = device.startswith("cuda")
    if on_gpu:
        parts["cudaContext"] = CUDA_CONTEXT_BYTES * (2 if sampler == "vllm" else 1)
    on_device = sum(v for k, v in parts.items() if k in ON_DEVICE) if on_gpu else 0
    return {**parts, "total": sum(parts.values()), "deviceTotal": on_device, "hostTotal": sum(parts.values()) - on_device,
            "device": device, "tokensPerMicroBatch": tokens, "completions": completions}


def _limit_bytes(variable: str) -> int | None:
    """The budget an environment variable sets, in bytes (None when unset)."""
    limit = os.environ.get(variable)
    if not limit:
        return None
    try:
        value = int(float(limit) * (1 << 20))  # nan raises ValueError, inf OverflowError
    except (ValueError, OverflowError):
        value = -1
    if value < 0:
        raise StropError(f"{variable} must be a number of MiB (0 or more), got {limit[:40]!r}")
    return value


def available_bytes() -> int:
    limit = _limit_bytes("STROP_MEMORY_LIMIT_MB")
    if limit is not None:
        return limit
    # what this process freed and keeps (strop.engine.malloc) is available to it too: a supervised warm start
    # followed by GRPO in one process was refused 11.9 GiB with 10.0 "available" and 17 GiB free after it exited
    kept = kept_free_bytes()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 + kept
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") + kept


def resident_bytes() -> int | None:
    """This process's resident memory (its RSS), or None where /proc cannot tell."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def gpu_available_bytes(device: str = "cuda") -> int:
    """Free memory on a CUDA device, or `$STROP_GPU_MEMORY_LIMIT_MB` when set (a run's share of a shared GPU)."""
    limit = _limit_bytes("STROP_GPU_MEMORY_LIMIT_MB")
    if limit is not None:
        return limit
    import torch  # lazy: a CPU run never asks
    return int(torch.cuda.mem_get_info(torch.device(device))[0])


def _budgets(device: str) -> list[tuple[str, int]]:
    """(the estimate's total that must fit, the bytes it must fit in) for each memory a run on `device` uses."""
    if device.startswith("cuda"):
        return [("deviceTotal", gpu_available_bytes(device)), ("hostTotal", available_bytes())]
    return [("total", available_bytes())]


def plan_grpo_memory(model_dir: str | Path, *, batch_size: int, group_size: int, prompt_tokens: int,
                     completion_tokens: int, what: str = "this run", **where) -> dict:
    """The estimate at the largest micro-batch that fits (smaller micro-batches give the same gradients, only
    more slowly): `tokensPerMicroBatch` is what the trainer should use. Refused (MemoryRefused) when even one
    sequence per micro-batch would not fit. `where`: estimate_grpo_memory's dtype, sampler and device arguments;
    on a CUDA device the activations shrink to fit the GPU, and host memory is checked too."""
    sizes = dict(batch_size=batch_size, group_size=group_size, prompt_tokens=prompt_tokens,
                 completion_tokens=completion_tokens, **where)
    full = estimate_grpo_memory(model_dir, **sizes)
    budgets = _budgets(full["device"])
    if all(full[key] <= have for key, have in budgets):
        return full
    key, have = budgets[0]  # the activations are where the trainer computes
    per_token = full["activations"] / full["tokensPerMicroBatch"]
    fit = int((have - (full[key] - full["activations"])) / per_token)
    if fit >= prompt_tokens + completion_tokens:
        shrunk = estimate_grpo_memory(model_dir, **sizes, micro_batch_tokens=fit)
        if all(shrunk[k] <= h for k, h in budgets):
            return shrunk
    check_fits(estimate_grpo_memory(model_dir, **sizes, micro_batch_tokens=min(fit, full["tokensPerMicroBatch"])
                                    if fit >= prompt_tokens + completion_tokens else prompt_tokens + completion_tokens),
               what=what, budgets=budgets)
    return full  # not reached: check_fits refused


def check_fits(estimate: dict, *, what: str = "this run", budgets: list[tuple[str, int]] | None = None) -> None:
    for key, have in budgets or _budgets(estimate.get("device", "cpu")):
        if estimate[key] <= have:
            continue
        on_gpu = key == "deviceTotal"
        names = [k for k in estimate if k not in _NOT_PARTS and (k in ON_DEVICE) == on_gpu] \
            if key != "total" else [k for k in estimate if k not in _NOT_PARTS]
        parts = ", ".join(f"{k} {estimate[k] / GIB:.1f}" for k in names)
        memory = f"GPU memory on {estimate['device']}" if on_gpu else "memory"
        budget = "STROP_GPU_MEMORY_LIMIT_MB" if on_gpu else "STROP_MEMORY_LIMIT_MB"
        raise MemoryRefused(
            f"{what} would need about {estimate[key] / GIB:.1f} GiB of {memory} ({parts} GiB) but "
            f"{have / GIB:.1f} GiB is available. Lower batchSize x groupSize or maxCompletionLength (a step holds all "
            f"{estimate['completions']:,} completions until its update, and training activations grow with the "
            f"tokens of a step, up to {MAX_TOKENS_PER_MICRO_BATCH:,} per micro-batch), use a smaller base model, or "
            f"free {'GPU ' if on_gpu else ''}memory ({budget} sets the budget).")


_NOT_PARTS = ("total", "deviceTotal", "hostTotal", "device", "tokensPerMicroBatch", "completions")
