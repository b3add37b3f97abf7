"""Peak resident memory of GRPO steps, strop against TRL, each in a fresh process, same configuration as
grpo_vs_trl.py (see _common.py).

    /work/bench-venv/bin/python benchmarks/memory.py                      # SmolLM2, 8 prompts x 4 samples x 64 tokens
    /work/bench-venv/bin/python benchmarks/memory.py --quick

One side at a time (never both at once, so neither's figures include the other's pressure): start its worker,
run the warm-up step and --steps more, read its memory, stop it. Per side it prints
- setup: resident memory (VmRSS) once the trainer is built, and the peak (VmHWM) until then;
- steps: the peak while stepping (VmHWM, restarted after setup by writing 5 to /proc/self/clear_refs);
- process: the whole process's peak, max(setup peak, steps peak, ru_maxrss): what the machine must hold.
strop's process holds two copies of the base model, the trainer's and the sampler's (its sampler is a separate
client, so it can live elsewhere); TRL generates with the model it trains. strop sets glibc to keep freed memory
(strop.engine.malloc), which counts in its RSS; TRL runs with glibc's defaults unless --trl-keep-freed-memory.

GB are 10^9 bytes. Last line: `memory strop X.X GB trl Y.Y GB ratio Z.ZZ`, the process peaks and strop / TRL.
"""

from __future__ import annotations

import argparse
import sys

from _common import Worker, add_size_flags, add_training_flags, bench_config, gb, require_trl, resolve_sizes


def measure(side: str, config: dict, steps: int, verbose: bool) -> dict:
    with Worker(side, config, verbose) as worker:
        for _ in range(steps + 1):
            last = worker.step()
        end = worker.stats()
    setup = worker.ready["setup_memory"]
    steps_peak = end["hwm_kb"] if worker.ready["peak_reset"] else None
    process = max(v for v in (setup["hwm_kb"], end["hwm_kb"], end["maxrss_kb"]) if v is not None)
    return {"setup_rss": setup["rss_kb"], "setup_peak": setup["hwm_kb"], "steps_peak": steps_peak,
            "process_peak": process, "last_step_seconds": last["seconds"]}


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_size_flags(cli, "steps per side after the warm-up step", steps=2)
    add_training_flags(cli)
    args = resolve_sizes(cli.parse_args())
    require_trl()
    config = bench_config(args)
    print(f"model {args.model}: {args.prompts} prompts x {args.group_size} samples x {args.tokens} tokens (forced), "
          f"LoRA r{args.rank}, fp32; 1 warm-up + {args.steps} steps per side, each side in a fresh process", flush=True)
    results = {}
    for side in ("strop", "trl"):
        r = results[side] = measure(side, config, args.steps, args.verbose)
        steps_peak = "n/a (clear_refs refused)" if r["steps_peak"] is None else f"{gb(r['steps_peak']):.2f} GB"
        print(f"{side:5s}  setup RSS {gb(r['setup_rss']):.2f} GB (peak {gb(r['setup_peak']):.2f})  "
              f"steps peak {steps_peak}  process peak {gb(r['process_peak']):.2f} GB  "
              f"(last step {r['last_step_seconds']:.1f} s)", flush=True)
    strop_gb, trl_gb = gb(results["strop"]["process_peak"]), gb(results["trl"]["process_peak"])
    print(f"memory strop {strop_gb:.1f} GB trl {trl_gb:.1f} GB ratio {strop_gb / trl_gb:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
