"""strop's GRPO step against TRL's GRPOTrainer on the same configuration: median seconds per step.

    /work/bench-venv/bin/python benchmarks/grpo_vs_trl.py                 # SmolLM2, 8 prompts x 4 samples x 64 tokens
    /work/bench-venv/bin/python benchmarks/grpo_vs_trl.py --quick         # tiny-random smoke run

Needs trl, which the project's venv does not have: make a separate venv (see _common.VENV_HINT).

Each side runs in its own fresh process (see _common.py for everything the two share). After one warm-up step
each, the steps alternate, strop first in even rounds and TRL first in odd ones, so a change in machine load
falls on both; the medians are compared. strop's step is `strop.rl.step.train_step`, the step `run_grpo` runs;
TRL's is one optimizer step of `GRPOTrainer.train()` (generation, reward, loss, backward, AdamW, logging).

Loss: strop's `importance_sampling` is -sum_t exp(lp - q) * A over completion tokens. TRL's `dapo` is the PPO
clipped surrogate averaged over the batch's completion tokens. With one update per batch (num_iterations 1) the
ratio is exactly 1 in TRL (old logprobs are the current ones, detached), so the clip never binds and both
gradients are sum_t A * grad lp, TRL's divided by the token count: a constant scale, which Adam divides out
(up to eps). dapo is also what DESIGN.md's TRL reference (51.9 s a step) used; with forced equal lengths
`dr_grpo` would give the same gradient again.

Last line: `speedup X.XX`, TRL's median step seconds over strop's.
"""

from __future__ import annotations

import argparse
import sys

from strop.engine.precision import kernels

from _common import (Worker, add_size_flags, add_training_flags, bench_config, load_line, median, require_trl,
                     resolve_sizes)


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_flags(cli, "timed steps per side, after one warm-up step each")
    add_training_flags(cli)
    args = resolve_sizes(cli.parse_args())
    require_trl()
    config = bench_config(args)
    print(f"model {args.model}: {args.prompts} prompts x {args.group_size} samples x {args.tokens} tokens (forced), "
          f"LoRA r{args.rank} on {', '.join(config['targets'])}, lr {args.lr:g}, beta 0, {args.dtype}; "
          f"{args.steps} timed steps + 1 warm-up per side; {load_line()}; CPU kernels {kernels()}", flush=True)

    with Worker("strop", config, args.verbose) as strop_w, Worker("trl", config, args.verbose) as trl_w:
        print(f"setup: strop {strop_w.ready['setup_seconds']:.1f} s (micro-batch "
              f"{strop_w.ready['micro_batch_tokens']} tokens), TRL {trl_w.ready['trl_version']} "
              f"{trl_w.ready['setup_seconds']:.1f} s; torch threads {strop_w.ready['torch_threads']} / "
              f"{trl_w.ready['torch_threads']}; prompts identical token for token: "
              f"{'yes' if trl_w.ready['prompts_identical'] else 'NO'}", flush=True)
        runs = {"strop": [], "trl": []}
        for round_ in range(args.steps + 1):
            order = [("strop", strop_w), ("trl", trl_w)] if round_ % 2 == 0 else [("trl", trl_w), ("strop", strop_w)]
            for side, worker in order:
                runs[side].append(worker.step())
            s, t = runs["strop"][-1], runs["trl"][-1]
            label = "warm-up" if round_ == 0 else f"step {round_:3d}"
            print(f"{label}  strop {s['seconds']:7.2f} s (sample {s['sample_seconds']:.2f}, train "
                  f"{s['train_seconds']:.2f}, len {s['mean_length']:.1f})   TRL {t['seconds']:7.2f} s (generate "
                  f"{t['generate_seconds']:.2f}, len {t['mean_length']:.1f})", flush=True)

    print(f"after the runs: {load_line()}")
    timed = {side: steps[1:] for side, steps in runs.items()}
    full = all(r["all_full_length"] for steps in timed.values() for r in steps)
    trained = {r["trained"] for r in timed["strop"]}
    strop_s = median([r["seconds"] for r in timed["strop"]])
    trl_s = median([r["seconds"] for r in timed["trl"]])
    print(f"every completion exactly {args.tokens} tokens on both sides: {'yes' if full else 'NO'}; strop trained "
          f"{sorted(trained)} of {args.prompts * args.group_size} completions per step")
    print(f"median step: strop {strop_s:.2f} s (sample {median([r['sample_seconds'] for r in timed['strop']]):.2f}, "
          f"train {median([r['train_seconds'] for r in timed['strop']]):.2f}), TRL {trl_s:.2f} s (generate "
          f"{median([r['generate_seconds'] for r in timed['trl']]):.2f})")
    print(f"speedup {trl_s / strop_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
