"""A tool-use turn's prefill: prompts that extend cached conversations by new tokens of different lengths (a
reply and a tool's answer), run as one forward padded to the longest, against strop's parts (`strop.engine.prefill`:
prompts by length of what they run, each part padded to its own longest), in one process, alternating.

    python benchmarks/prefill_parts.py                    # SmolLM2, 32 prompts after a finance-sql branch
    python benchmarks/prefill_parts.py --quick            # tiny-random smoke run

Each prompt is a conversation (--shared tokens common to all, then --branch tokens common to its group of 8, then
100-400 of its own) already in the prefix cache, extended by new tokens whose lengths are drawn from --rests (the
lengths measured at a finance-sql GRPO run's turns after its branch: mean 110-130, longest ~280). The cache is
restored before every run, so both sides prefill the same tokens. Each figure is the median of --repeats runs
after one warm-up of each side.

Last line: `prefill_parts speedup X.XX` (one forward's seconds over the parts').
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from _common import DEFAULT_MODEL, TINY_MODEL, count, load_line

FINANCE_RESTS = "30,60,90,110,130,180,220,277"


def lengths(text: str) -> list[int]:
    """Comma-separated whole numbers of at least 1."""
    return [count(part) for part in text.split(",")]


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--model", default=DEFAULT_MODEL)
    cli.add_argument("--prompts", type=count, default=32)
    cli.add_argument("--shared", type=count, default=600, help="conversation tokens every prompt starts with")
    cli.add_argument("--branch", type=count, default=800, help="conversation tokens a group of 8 prompts shares")
    cli.add_argument("--rests", type=lengths, default=lengths(FINANCE_RESTS),
                     help=f"new-token lengths drawn from (default: {FINANCE_RESTS})")
    cli.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    cli.add_argument("--repeats", type=count, default=2)
    cli.add_argument("--quick", action="store_true", help="tiny-random model, small sizes: a smoke run")
    args = cli.parse_args()
    if args.quick:
        args.model, args.prompts, args.shared, args.branch, args.repeats = TINY_MODEL, 8, 40, 40, 1

    import torch

    import strop.engine.prefill as prefill
    import strop.engine.sampler as sampler
    from strop.engine.precision import kernels
    from strop.models import load_tokenizer
    from strop.models.loading import resolve_model

    model_dir = resolve_model(args.model)
    engine = sampler.SamplerEngine(model_dir, load_tokenizer(str(model_dir)), dtype=getattr(torch, args.dtype))
    vocab = engine.model.config.vocab_size
    rng = random.Random(0)
    system = [rng.randrange(100, vocab) for _ in range(args.shared)]
    states = [system + [rng.randrange(100, vocab) for _ in range(args.branch)] for _ in range((args.prompts + 7) // 8)]
    conversations = [tuple(states[i // 8] + [rng.randrange(100, vocab) for _ in range(rng.randrange(100, 400))])
                     for i in range(args.prompts)]
    rests = [rng.choice(args.rests) for _ in conversations]
    prompts = [c + tuple(rng.randrange(100, vocab) for _ in range(r)) for c, r in zip(conversations, rests)]
    slack = prefill.PREFILL_SLACK

    cache = engine.prefix_cache
    with torch.inference_mode():
        for conversation in conversations:
            engine._prefill([conversation])
    kept = (cache._entries.copy(), cache.bytes)  # benchmark-only: each run starts from these conversations

    def run(parts: bool) -> float:
        prefill.PREFILL_SLACK = slack if parts else float("inf")
        cache._entries, cache.bytes = kept[0].copy(), kept[1]
        t = time.perf_counter()
        with torch.inference_mode():
            engine._prefill(prompts)
        return time.perf_counter() - t

    print(f"model {args.model}, {args.dtype}, {torch.get_num_threads()} torch threads, CPU kernels {kernels()}; "
          f"{load_line()}")
    print(f"{args.prompts} prompts: conversations of {args.shared} + {args.branch} + 100-400 tokens, cached; new "
          f"tokens {sum(rests)} in all, {args.prompts * max(rests)} padded to the longest; parts "
          f"{[len(p) for p in prefill.prefill_parts(rests)]}")
    run(False), run(True)
    results = {False: [], True: []}
    for _ in range(args.repeats):
        for parts in (False, True):
            results[parts].append(run(parts))
    prefill.PREFILL_SLACK = slack
    whole, split = (statistics.median(results[p]) for p in (False, True))
    print("| prefill | seconds |")
    print("|---|---|")
    print(f"| one forward, padded to the longest | {whole:.2f} |")
    print(f"| parts, each padded to its own longest | {split:.2f} |")
    print(f"prefill_parts speedup {whole / split:.2f}")


if __name__ == "__main__":
    main()
