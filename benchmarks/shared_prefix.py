"""Decoding rows whose prompts share a long prefix (a system prompt and tool schemas, as in finance-sql): strop's
decode state keeping that prefix once against keeping it in every row, in one process, alternating.

    python benchmarks/shared_prefix.py                     # SmolLM2, 64 rows, 400 shared + 600 own positions
    python benchmarks/shared_prefix.py --own 120 --rows 32 # an early turn
    python benchmarks/shared_prefix.py --quick             # tiny-random smoke run

Each prompt is --shared random tokens common to all, then --own (+0..6) tokens of its own; every row samples
exactly --tokens new tokens (EOS ignored) at temperature 1. The prompt cache is emptied before every run, so
both sides prefill the same tokens. "decode" is the time in the decode steps alone; "whole" adds the prefill.
The per-row side is the same engine with the shared prefix turned off (`decode.MIN_SHARED` out of reach). Each
figure is the median of --repeats runs after one warm-up of each side.

Last line: `shared_prefix decode speedup X.XX` (per-row decode seconds over shared).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import DEFAULT_MODEL, TINY_MODEL, load_line


def count(text: str) -> int:
    """A whole number of at least 1, for argparse: sizes of 0 or less measure nothing."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text[:40]!r}") from None
    if not 1 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"expected 1 to 100000, got {value}")
    return value


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--model", default=DEFAULT_MODEL)
    cli.add_argument("--rows", type=count, default=64, help="rows decoded at once, one prompt each")
    cli.add_argument("--shared", type=count, default=400, help="tokens every prompt starts with")
    cli.add_argument("--own", type=count, default=600, help="tokens of each prompt after the shared ones")
    cli.add_argument("--tokens", type=count, default=48, help="new tokens per row")
    cli.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    cli.add_argument("--repeats", type=count, default=3)
    cli.add_argument("--quick", action="store_true", help="tiny-random model, small sizes: a smoke run")
    args = cli.parse_args()
    if args.quick:
        args.model, args.rows, args.shared, args.own, args.tokens, args.repeats = TINY_MODEL, 8, 48, 16, 8, 1

    import torch

    import strop.engine.decode as decode
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
    prompts = [prefix + torch.randint(100, vocab, (args.own + i % 7,), generator=gen).tolist()
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
    min_shared = decode.MIN_SHARED

    def run(shared: bool) -> tuple[float, float]:
        decode.MIN_SHARED = min_shared if shared else 1 << 62
        if engine.prefix_cache is not None:
            engine.prefix_cache.clear()
        spent["decode"] = 0.0
        t = time.perf_counter()
        engine.generate(requests)
        return time.perf_counter() - t, spent["decode"]

    print(f"model {args.model}, {args.dtype}, {torch.get_num_threads()} torch threads, CPU kernels {kernels()}; "
          f"{load_line()}")
    print(f"{args.rows} rows x ({args.shared} shared + {args.own}-{args.own + 6} own) prompt tokens, "
          f"{args.tokens} new tokens a row")
    run(True), run(False)
    results = {True: [], False: []}
    for _ in range(args.repeats):
        for shared in (False, True):
            results[shared].append(run(shared))
    print("| keys and values of the prefix | whole (s) | decode (s) | new tokens/s |")
    print("|---|---|---|---|")
    for shared in (False, True):
        whole = statistics.median(w for w, _ in results[shared])
        steps = statistics.median(d for _, d in results[shared])
        print(f"| {'once' if shared else 'in every row'} | {whole:.2f} | {steps:.2f} | "
              f"{args.rows * args.tokens / whole:.0f} |")
    per_row = statistics.median(d for _, d in results[False])
    once = statistics.median(d for _, d in results[True])
    print(f"shared_prefix decode speedup {per_row / once:.2f}")


if __name__ == "__main__":
    main()
