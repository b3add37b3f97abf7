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


def estimate_grpo_memory(model_dir: str | Path, *, batch_size: int, group_size: int, prompt_tokens: int,
                         completion_tokens: int, micro_batch_tokens: int = MAX_TOKENS_PER_MICRO_BATCH) -> dict:
    """Estimated peak bytes of a GRPO run, in parts, with `total`."""
    shape = model_shape(model_dir)
    seq = prompt_tokens + completion_tokens
    completions = batch_size * group_size
    rows = min(completions, MAX_SAMPLER_ROWS)  # the sampler decodes at most this many at once; the rest wait
    tokens = min(completions * seq, micro_batch_tokens)
    per_token_layer = (ACTIVATION_FLOATS[0] * shape["hidden"] + ACTIVATION_FLOATS[1] * shape["intermediate"]) * 4
    parts = {
        "weights": 2 * shape["parameters"] * 4,
        "kvCache": rows * seq * shape["layers"] * 2 * shape["kvDim"] * 4 + rows * shape["vocab"] * 4 * 3,
        "activations": tokens * shape["layers"] * per_token_layer,
        "logitsChunk": HEAD_CHUNK * shape["vocab"] * 4 * 2,
        "headSoftmax": min(HEAD_KEEP_BYTES, tokens * shape["vocab"] * 4),
        "rollouts": completions * (completion_tokens * ROLLOUT_BYTES_PER_TOKEN + seq * DATUM_BYTES_PER_TOKEN),
        "runtime": RUNTIME_BYTES,
    }
    return {**parts, "total": sum(parts.values()), "tokensPerMicroBatch": tokens, "completions": completions}


def available_bytes() -> int:
    limit = os.environ.get("STROP_MEMORY_LIMIT_MB")
    if limit:
        try:
            return int(float(limit) * (1 << 20))
        except ValueError:
            raise StropError(f"STROP_MEMORY_LIMIT_MB must be a number of MiB, got {limit!r}") from None
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


def plan_grpo_memory(model_dir: str | Path, *, batch_size: int, group_size: int, prompt_tokens: int,
                     completion_tokens: int, what: str = "this run") -> dict:
    """The estimate at the largest micro-batch that fits (smaller micro-batches give the same gradients, only
    more slowly): `tokensPerMicroBatch` is what the trainer should use. Refused (MemoryRefused) when even one
    sequence per micro-batch would not fit."""
    sizes = dict(batch_size=batch_size, group_size=group_size, prompt_tokens=prompt_tokens,
                 completion_tokens=completion_tokens)
    full = estimate_grpo_memory(model_dir, **sizes)
    have = available_bytes()
    if full["total"] <= have:
        return full
    per_token = full["activations"] / full["tokensPerMicroBatch"]
    fit = int((have - (full["total"] - full["activations"])) / per_token)
    if fit >= prompt_tokens + completion_tokens:
        return estimate_grpo_memory(model_dir, **sizes, micro_batch_tokens=fit)
    check_fits(estimate_grpo_memory(model_dir, **sizes, micro_batch_tokens=prompt_tokens + completion_tokens), what=what)
    return full  # not reached: check_fits refused


def check_fits(estimate: dict, *, what: str = "this run") -> None:
    have = available_bytes()
    if estimate["total"] <= have:
        return
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in estimate.items() if k not in _NOT_PARTS)
    raise MemoryRefused(
        f"{what} would need about {estimate['total'] / GIB:.1f} GiB of memory ({parts} GiB) but "
        f"{have / GIB:.1f} GiB is available. Lower batchSize x groupSize or maxCompletionLength (a step holds all "
        f"{estimate['completions']:,} completions until its update, and training activations grow with the tokens "
        f"of a step, up to {MAX_TOKENS_PER_MICRO_BATCH:,} per micro-batch), use a smaller base model, or free "
        "memory (STROP_MEMORY_LIMIT_MB sets the budget).")


_NOT_PARTS = ("total", "tokensPerMicroBatch", "completions")
