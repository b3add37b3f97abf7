"""Decoding rows whose prompts share long prefixes: the prompts of a batch a system prompt and tool schemas, the
rows of a GRPO group (finance-sql, branched at one state) that whole state. strop's decode state keeping each
group's prefix once, against keeping it in every row, in one process, alternating.

    python benchmarks/shared_prefix.py                     # SmolLM2, 64 rows, 400 shared + 600 own positions
    python benchmarks/shared_prefix.py --own 120 --rows 32 # an early turn
    python benchmarks/shared_prefix.py --groups 4 --branch 800 --own 200 --rows 32 --dtype bfloat16
                                                           # a GRPO step's later turn: 4 groups of 8 episodes
    python benchmarks/shared_prefix.py --quick             # tiny-random smoke run

Each prompt is --shared random tokens common to all, then --branch tokens common to its group (the rows are dealt
to --groups groups in turn), then --own (+0..6) tokens of its own; every row samples exactly --tokens new tokens
(EOS ignored) at temperature 1. The prompt cache is emptied before every run, so every side prefills the same
tokens. "decode" is the time in the decode steps alone; "whole" adds the prefill. Three sides:

- "before": every row keeps its whole prompt, and each layer's attention is torch's SDPA over the query heads
  with enable_gqa=True (strop's bf16 decode until this benchmark was written);
- "in every row": every row keeps its whole prompt; a key/value head's query heads attend as query positions;
- "once a group": each group's prefix kept once (`strop.engine.prefix_groups`).

Each figure is the median of --repeats runs after one warm-up of each side.
Last line: `shared_prefix decode speedup X.XX` (per-row decode seconds over shared, both with today's kernel).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import DEFAULT_MODEL, TINY_MODEL, count, load_line


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--model", default=DEFAULT_MODEL)
    cli.add_argument("--rows", type=count, default=64, help="rows decoded at once, one prompt each")
    cli.add_argument("--shared", type=count, default=400, help="tokens every prompt starts with")
    cli.add_argument("--groups", type=count, default=1, help="groups of rows, each sharing --branch more tokens")
    cli.add_argument("--branch", type=int, default=0, help="tokens a group's prompts share after --shared")
    cli.add_argument("--own", type=count, default=600, help="tokens of each prompt after the shared ones")
    cli.add_argument("--tokens", type=count, default=48, help="new tokens per row")
    cli.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    cli.add_argument("--repeats", type=count, default=3)
    cli.add_argument("--quick", action="store_true", help="tiny-random model, small sizes: a smoke run")
    args = cli.parse_args()
    if not 0 <= args.branch <= 100_000:
        cli.error(f"argument --branch: expected 0 to 100000, got {args.branch}")
    if args.quick:
        args.model, args.rows, args.shared, args.own, args.tokens, args.repeats = TINY_MODEL, 8, 48, 16, 8, 1

    import torch
    import torch.nn.functional as F

    import strop.engine.decode as decode
    import strop.engine.prefix_groups as groups
    from strop.engine.precision import kernels
    from strop.engine.sampler import SampleRequest, SamplerEngine
    from strop.models import load_tokenizer
    from strop.models.loading import resolve_model
    from strop.types import SamplingParams

    model_dir = resolve_model(args.model)
    engine = SamplerEngine(model_dir, load_tokenizer(str(model_dir)), dtype=getattr(torch, args.dtype))
    engine.eos_ids = frozenset()  # benchmark-only: every row runs to --tokens
    vocab = engine.model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(100, vocab, (args.shared,), generator=gen).tolist()
    states = [prefix + torch.randint(100, vocab, (args.branch,), generator=gen).tolist() for _ in range(args.groups)]
    prompts = [states[i % args.groups] + torch.randint(100, vocab, (args.own + i % 7,), generator=gen).tolist()
               for i in range(args.rows)]
    params = SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=1, stop=[])
    requests = [SampleRequest(prompt_tokens=p, num_samples=1, params=params) for p in prompts]

    spent = {"decode": 0.0}
    step = decode.DecodeState.step

    def timed_step(self, *a):
        t = time.perf_counter()
        out = step(self, *a)
        spent["decode"] += time.perf_counter() - t
        return out

    decode.DecodeState.step = timed_step
    min_shared, attend_rows = groups.MIN_SHARED, decode._attend_rows

    def attend_before(q_B_K_G_D, keys, values, bias, scale):
        B, kv, groups, hd = q_B_K_G_D.shape
        q_B_Q_1_D = q_B_K_G_D.reshape(B, kv * groups, 1, hd)
        return F.scaled_dot_product_attention(q_B_Q_1_D, keys, values, attn_mask=bias, scale=scale, enable_gqa=True)

    def run(side: str) -> tuple[float, float]:
        groups.MIN_SHARED = min_shared if side == "once a group" else 1 << 62
        decode._attend_rows = attend_before if side == "before" else attend_rows
        if engine.prefix_cache is not None:
            engine.prefix_cache.clear()
        spent["decode"] = 0.0
        t = time.perf_counter()
        engine.generate(requests)
        return time.perf_counter() - t, spent["decode"]

    print(f"model {args.model}, {args.dtype}, {torch.get_num_threads()} torch threads, CPU kernels {kernels()}; "
          f"{load_line()}")
    print(f"{args.rows} rows in {args.groups} group(s) x ({args.shared} shared + {args.branch} a group's + "
          f"{args.own}-{args.own + 6} own) prompt tokens, {args.tokens} new tokens a row")
    sides = ("before", "in every row", "once a group")
    for side in sides:
        run(side)
    results = {side: [] for side in sides}
    for _ in range(args.repeats):
        for side in sides:
            results[side].append(run(side))
    groups.MIN_SHARED, decode._attend_rows = min_shared, attend_rows
    print("| keys and values of the prefixes | whole (s) | decode (s) | new tokens/s | decode vs before |")
    print("|---|---|---|---|---|")
    medians = {side: statistics.median(d for _, d in results[side]) for side in sides}
    for side in sides:
        whole = statistics.median(w for w, _ in results[side])
        print(f"| {side} | {whole:.2f} | {medians[side]:.2f} | {args.rows * args.tokens / whole:.0f} | "
              f"{medians[side] / medians['before']:.2f}x |")
    print(f"shared_prefix decode speedup {medians['in every row'] / medians['once a group']:.2f}")


if __name__ == "__main__":
    main()
