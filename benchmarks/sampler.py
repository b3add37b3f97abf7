"""strop's sampler against HF `model.generate` and vLLM: new tokens per second at several batch sizes, and the
share of this machine's matmul roofline each reaches.

    python benchmarks/sampler.py             # SmolLM2, batches 1, 8, 32 and the GRPO shape 8 x 4, 64 tokens
    python benchmarks/sampler.py --quick     # tiny-random smoke run

Runs in the project's venv (no trl needed). vLLM is the third column where it is installed (`pip install -e
".[vllm]"`, or STROP_VLLM_PYTHON naming a Python that has it; --no-vllm leaves it out): strop's VllmEngine, vLLM in
a worker process, in the same dtype, EOS ignored; its prefix cache is emptied before every timed run (as strop's is
off), so a prompt's keys and values are computed once per run and shared by its samples, as strop does. After the tables, the two ways an
adapter reaches vLLM are measured at the largest batch: merged into the weights, and as a LoRA request (a rank-32
adapter with non-zero weights): the seconds to hand it over and the tokens/s with it. Both sides run in this process on the same prompts (distinct
chat-formatted "What is a + b?" questions), in each of --dtypes (fp32 and bf16 by default: one table each, the
CPU's kernels and bf16 units named at the top), and produce exactly --tokens new tokens per row: HF with
min_new_tokens = max_new_tokens, strop with the EOS set of its engine emptied (benchmark-only; see
_grpo_worker.force_fixed_length). Rows are greedy (or, with --sample, sampled at temperature 1, no top-k/top-p,
on both sides). The last table row is the GRPO shape: --prompts distinct prompts x --group-size samples each at
temperature 1 (HF: num_return_sequences; strop shares each prompt's prefill across its samples).

What differs, and cannot be made equal: strop also returns each token's logprob (HF generate returns none
unless asked); HF never samples EOS (min_new_tokens masks it), strop may sample it and carry on. Importing strop's
sampler sets glibc to keep freed memory (strop.engine.malloc) for the whole process, so HF runs with it too.

tokens/s counts new tokens only; the time includes the prefill. Roofline: model FLOPs per new token (2 x the
parameters that take part in matmuls, plus attention: 4 x layers x attention width x the mean context length)
x tokens/s, over the matmul rate of the table's dtype measured in this run (a torch matmul of --matmul-size squares). Prefill is
not counted, so the share is a lower bound. Each figure is the median of --steps runs after one warm-up.

Last line: `batch32 speedup X.XX roofline Y%` (the largest batch in the first dtype: strop's tokens/s over HF's,
and strop's share); the lines above it give the same for every dtype.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _common import DEFAULT_MODEL, TINY_MODEL, chat_prompts, load_line, questions


def matmul_gflops(n: int, dtype, repeats: int) -> float:
    """GFLOP/s of an n x n by n x n torch matmul: the best of three timings of up to `repeats` products, after a
    warm-up. A dtype without fast kernels here (bf16 without AVX-512 BF16 takes seconds a product) is timed once."""
    import torch
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    t = time.perf_counter()
    a @ b
    best = time.perf_counter() - t
    count = max(1, min(repeats, int(0.5 / best)))  # about half a second a timing
    for _ in range(3 if best < 1.0 else 0):
        t = time.perf_counter()
        for _ in range(count):
            a @ b
        best = min(best, (time.perf_counter() - t) / count)
    return 2 * n ** 3 / best / 1e9


def flops_per_token(model, mean_context: float) -> tuple[float, float]:
    """(2 x matmul parameters, attention FLOPs) per generated token.

    The input embedding is a lookup, not a matmul: left out, unless it is tied to the output head, which is one."""
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is emb
    dense = 2 * (params if tied else params - emb.numel())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    width = cfg.num_attention_heads * head_dim
    attention = 4 * cfg.num_hidden_layers * width * mean_context  # q.k scores and the weighted sum of v
    return dense, attention


def hf_generate(model, tokenizer, prompts: list[list[int]], tokens: int, sample: bool, per_prompt: int = 1):
    import torch
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")  # left padding (strop's tokenizer setting)
    kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens, num_return_sequences=per_prompt,
                             pad_token_id=tokenizer.pad_token_id, **kwargs)
    new = out[:, batch["input_ids"].shape[1]:]
    assert new.shape[1] == tokens, f"HF generated {new.shape[1]} tokens, not {tokens}"
    return new.tolist()


def strop_generate(engine, prompts: list[list[int]], tokens: int, sample: bool, per_prompt: int = 1):
    from strop.engine.sampler import SampleRequest
    from strop.types import SamplingParams
    params = [SamplingParams(max_tokens=tokens, temperature=1.0 if sample else 0.0, stop=[], seed=i)
              for i in range(len(prompts))]
    responses = engine.generate([SampleRequest(prompt_tokens=p, num_samples=per_prompt, params=sp)
                                 for p, sp in zip(prompts, params)])
    rows = [list(s.tokens) for r in responses for s in r.sequences]
    assert all(len(r) == tokens for r in rows), "strop stopped a row early"
    return rows


def timed(fn) -> tuple[float, list]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--model", help=f"base model (default {DEFAULT_MODEL}; --quick: {TINY_MODEL})")
    cli.add_argument("--steps", type=int, help="timed runs per batch size and side; medians (default 3; --quick: 1)")
    cli.add_argument("--batches", help="comma-separated batch sizes of distinct prompts (default 1,8,32; --quick: 1,4)")
    cli.add_argument("--prompts", type=int, help="GRPO-shape row: distinct prompts (default 8; --quick: 2)")
    cli.add_argument("--group-size", type=int, help="GRPO-shape row: samples per prompt (default 4; --quick: 2)")
    cli.add_argument("--tokens", type=int, help="new tokens per row, forced on both sides (default 64; --quick: 8)")
    cli.add_argument("--sample", action="store_true", help="sample at temperature 1 instead of greedy decoding")
    cli.add_argument("--matmul-size", type=int, help="side of the matmul micro-benchmark (default 2048; --quick: 256)")
    cli.add_argument("--dtypes", default="float32,bfloat16",
                     help="compute dtypes, each a table of both engines (default: %(default)s; bf16 on a CPU without "
                          "bf16 units is slow, not wrong)")
    cli.add_argument("--no-vllm", action="store_true", help="leave vLLM out even where it is installed")
    cli.add_argument("--quick", action="store_true", help="a smoke configuration (any flag given still wins)")
    args = cli.parse_args()
    defaults = ({"model": TINY_MODEL, "steps": 1, "batches": "1,4", "prompts": 2, "group_size": 2, "tokens": 8,
                 "matmul_size": 256} if args.quick else
                {"model": DEFAULT_MODEL, "steps": 3, "batches": "1,8,32", "prompts": 8, "group_size": 4, "tokens": 64,
                 "matmul_size": 2048})
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    batches = sorted({int(b) for b in args.batches.split(",")})
    if min(batches) < 1 or args.steps < 1 or args.tokens < 1 or args.prompts < 1 or args.group_size < 1:
        raise SystemExit("--batches, --steps, --tokens, --prompts and --group-size must all be at least 1")

    import torch
    from transformers import AutoModelForCausalLM

    from strop.engine.sampler import SamplerEngine
    from strop.models import load_tokenizer, resolve_model

    from strop.engine.precision import kernels, resolve_dtype

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes or any(d not in ("float32", "bfloat16") for d in dtypes):
        raise SystemExit(f"--dtypes takes float32 and/or bfloat16, got {args.dtypes!r}")
    model_dir = resolve_model(args.model)
    tokenizer = load_tokenizer(args.model)
    shapes = [(b, 1, args.sample) for b in batches] + [(args.prompts, args.group_size, True)]
    ids, _ = chat_prompts(args.model, questions(max(batches + [args.prompts]), seed=0))

    gflops = {name: matmul_gflops(args.matmul_size, dtype, repeats=5 if args.quick else 10)
              for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))}
    print(f"model {args.model}, {torch.get_num_threads()} torch threads, CPU kernels {kernels()} (strop's default "
          f"dtype here: {resolve_dtype('auto')}); {args.tokens} new tokens per row, "
          f"{'sampled' if args.sample else 'greedy'}; matmul {args.matmul_size}^2: fp32 {gflops['float32']:.0f} "
          f"GFLOP/s, bf16 {gflops['bfloat16']:.0f} GFLOP/s; {load_line()}", flush=True)
    from strop.engine.vllm_engine import vllm_available
    use_vllm = not args.no_vllm and vllm_available()
    if not use_vllm:
        print("vLLM: " + ("left out (--no-vllm)" if args.no_vllm else "not installed here (pip install -e \".[vllm]\" or "
                                                                         "STROP_VLLM_PYTHON)"), flush=True)
    results = []
    for dtype in dtypes:
        results += run_dtype(args, dtype, getattr(torch, dtype), model_dir, tokenizer, shapes, ids, gflops[dtype],
                             use_vllm)
    if use_vllm:
        adapter_sync(args, model_dir, tokenizer, ids[:max(batches)], getattr(torch, dtypes[0]))
    print(f"after the runs: {load_line()}")
    top = max(b for b in batches)
    for dtype, _, _, speedup, share, tps in [r for r in results if r[1] == top and r[2] == 1]:
        print(f"{dtype}: batch{top} strop {tps:.0f} tok/s, speedup over HF {speedup:.2f}, roofline {share * 100:.1f}%")
    _, _, _, speedup, share, _ = next(r for r in results if r[1] == top and r[2] == 1)
    print(f"batch{top} speedup {speedup:.2f} roofline {share * 100:.1f}%")
    return 0


def run_dtype(args, dtype_name, dtype, model_dir, tokenizer, shapes, ids, gflops, use_vllm) -> list[tuple]:
    """One table: HF generate against strop's sampler (and vLLM), all in `dtype`, every shape."""
    from transformers import AutoModelForCausalLM

    from strop.engine.sampler import SamplerEngine

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    engine = SamplerEngine(model_dir, tokenizer=tokenizer, dtype=dtype, max_batch=max(p * g for p, g, _ in shapes),
                           prefix_cache_bytes=0)  # the same prompts again and again: a cache would skip the prefill
    engine.eos_ids = frozenset()  # benchmark-only: no early stop, every row runs to --tokens
    vllm = None
    if use_vllm:
        from strop.engine.vllm_engine import VllmEngine
        vllm = VllmEngine(model_dir, tokenizer=tokenizer, dtype=dtype, max_batch=max(p * g for p, g, _ in shapes))
        vllm.eos_ids = frozenset()  # likewise (the engine then asks vLLM to ignore EOS)
        strop_generate(vllm, ids[:1], args.tokens, args.sample)
    print(f"\n{dtype_name}" + (f" (vLLM {vllm.facts['vllmVersion']} on {vllm.facts['vllmDevice']}, started in "
                                f"{vllm.facts['vllmStartSeconds']:.0f} s)" if vllm else ""), flush=True)

    batches = sorted({b for b, per, _ in shapes[:-1]})
    # one warm-up per side: first calls pay for lazy initialisation and allocator growth
    hf_generate(hf, tokenizer, ids[:1], args.tokens, args.sample)
    strop_generate(engine, ids[:1], args.tokens, args.sample)
    print(f"{'rows':>10} {'HF tok/s':>9} {'strop tok/s':>11} {'vLLM tok/s':>10} {'speedup':>7} {'vLLM/HF':>7} "
          f"{'HF roof':>7} {'strop roof':>10} {'vLLM roof':>9}  greedy rows equal to HF (strop, vLLM)")
    results = []
    for n_prompts, per_prompt, sample in shapes:
        prompts = ids[:n_prompts]
        new_tokens = n_prompts * per_prompt * args.tokens
        hf_s, strop_s, vllm_s, vllm_rows = [], [], [], []
        for _ in range(args.steps):  # alternate, so a change in machine load falls on every side
            s, hf_rows = timed(lambda: hf_generate(hf, tokenizer, prompts, args.tokens, sample, per_prompt))
            hf_s.append(s)
            s, strop_rows = timed(lambda: strop_generate(engine, prompts, args.tokens, sample, per_prompt))
            strop_s.append(s)
            if vllm is not None:
                vllm.reset_cache()
                s, vllm_rows = timed(lambda: strop_generate(vllm, prompts, args.tokens, sample, per_prompt))
                vllm_s.append(s)
        hf_tps, strop_tps = new_tokens / statistics.median(hf_s), new_tokens / statistics.median(strop_s)
        vllm_tps = new_tokens / statistics.median(vllm_s) if vllm_s else float("nan")
        mean_context = statistics.fmean(len(p) for p in prompts) + (args.tokens - 1) / 2
        dense, attention = flops_per_token(hf, mean_context)
        share = {name: (dense + attention) * tps / (gflops * 1e9) for name, tps in
                 (("hf", hf_tps), ("strop", strop_tps), ("vllm", vllm_tps))}
        equal = "-" if sample else (f"{sum(a == b for a, b in zip(hf_rows, strop_rows))}/{len(hf_rows)}, "
                                    f"{sum(a == b for a, b in zip(hf_rows, vllm_rows))}/{len(hf_rows) if vllm_rows else 0}")
        label = f"{n_prompts}x{per_prompt}" if per_prompt > 1 else str(n_prompts)
        print(f"{label:>10} {hf_tps:9.1f} {strop_tps:11.1f} {vllm_tps:10.1f} {strop_tps / hf_tps:7.2f} "
              f"{vllm_tps / hf_tps:7.2f} {share['hf']:7.2%} {share['strop']:10.2%} {share['vllm']:9.2%}  {equal}",
              flush=True)
        results.append((dtype_name, n_prompts * per_prompt, per_prompt, strop_tps / hf_tps, share["strop"], strop_tps))
    print(f"FLOPs per new token: {dense / 1e6:.1f} M (2 x matmul parameters) + {attention / 1e6:.2f} M attention "
          f"(at the last row's mean context {mean_context:.0f}); shares are of {dtype_name} matmul's {gflops:.0f} GFLOP/s")
    if vllm is not None:
        vllm.close()
    return results


def adapter_sync(args, model_dir, tokenizer, prompts, dtype) -> None:
    """vLLM with an adapter, both ways: seconds to hand a new adapter over, and greedy tokens/s with it."""
    import torch

    from strop.engine.trainer import LoraTrainer
    from strop.engine.vllm_engine import VllmEngine

    trainer = LoraTrainer(model_dir, rank=32, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in trainer.model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=gen) * 0.01)
    adapters = [trainer.adapter_weights()]
    with torch.no_grad():
        for param in trainer.model.parameters():
            if param.requires_grad:
                param.mul_(1.01)
    adapters.append(trainer.adapter_weights())
    print(f"\nvLLM with a rank-32 adapter ({str(dtype).removeprefix('torch.')}, {len(prompts)} greedy rows, "
          f"{args.tokens} tokens)")
    print(f"{'sync':>8} {'hand-over s':>11} {'tok/s':>8}")
    for sync in ("merged", "lora"):
        engine = VllmEngine(model_dir, tokenizer=tokenizer, dtype=dtype, max_batch=len(prompts), sync=sync,
                            prefix_caching=False)
        engine.eos_ids = frozenset()
        engine.activate(adapters[0])
        strop_generate(engine, prompts[:1], args.tokens, False)  # warm-up with an adapter in place
        handover, seconds = [], []
        for step in range(args.steps):
            s, _ = timed(lambda: engine.activate(adapters[(step + 1) % 2]))
            handover.append(s)
            s, _ = timed(lambda: strop_generate(engine, prompts, args.tokens, False))
            seconds.append(s)
        engine.close()
        print(f"{sync:>8} {statistics.median(handover):11.2f} "
              f"{len(prompts) * args.tokens / statistics.median(seconds):8.1f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
