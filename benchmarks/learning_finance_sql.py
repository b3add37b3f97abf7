"""Does tool use learn? SmolLM2-135M-Instruct in finance-sql: the base model, a supervised warm start on scripted
demonstrations (SFT), and GRPO continued from that warm start (SFT+GRPO), each evaluated greedily on companies
no training saw: pass@1 on the single-table and multi-table evaluation splits, an exact McNemar test between
each pair of models on the same episodes, the behaviour rubrics, and the wall time of every phase.

    python benchmarks/learning_finance_sql.py                     # the default sizes (see --help)
    python benchmarks/learning_finance_sql.py --eval-n 20 --sft-steps 4 --grpo-steps 1   # a smoke run

Every figure comes from one run; the last line is a JSON summary (also written to OUT/summary.json). The
evaluation splits, their size and the greedy decoding are fixed before any result is seen: they are not tuned
to the outcome.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import time
from pathlib import Path

from strop.engine.precision import kernels, resolve_dtype, sampler_dtype_for
from strop.envs.finance_demos import demonstrations
from strop.envs.finance_sql import FinanceSQLEnv
from strop.evals.envs import evaluate_env
from strop.evals.stats import mcnemar_exact
from strop.models import DEFAULT_MODEL
from strop.rl import GRPOConfig, run_grpo
from strop.sft import SFTConfig, run_sft

SPLITS = ("eval-single", "eval-multi")
RUBRICS = ("validToolCalls", "tablesListedFirst", "hallucinatedTables", "hallucinatedColumns", "recoveries",
           "submitted", "turns")


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--model", default=DEFAULT_MODEL)
    cli.add_argument("--demos", type=int, default=240, help="train-split demonstrations written (default: %(default)s)")
    cli.add_argument("--mistakes", type=float, default=0.25, help="share of demonstrations that recover from a mistake")
    cli.add_argument("--companies", type=int, default=4, help="companies per split (train demos and evaluation)")
    cli.add_argument("--sft-steps", type=int, default=24)
    cli.add_argument("--sft-batch", type=int, default=4)
    cli.add_argument("--sft-lr", type=float, default=5e-4)
    cli.add_argument("--grpo-steps", type=int, default=8, help="0: no GRPO phase (base vs SFT only)")
    cli.add_argument("--grpo-batch", type=int, default=4, help="tasks per GRPO step")
    cli.add_argument("--grpo-group", type=int, default=8, help="episodes per task")
    cli.add_argument("--grpo-lr", type=float, default=1e-4)
    cli.add_argument("--rank", type=int, default=32)
    cli.add_argument("--max-tokens", type=int, default=160, help="most tokens per model turn")
    cli.add_argument("--max-turns", type=int, default=6, help="most tool calls per episode")
    cli.add_argument("--eval-n", type=int, default=100, help="episodes per evaluation split (default: %(default)s)")
    cli.add_argument("--sft-run", type=Path,
                     help="reuse this earlier SFT run folder of the same sizes (its final/ adapter and metrics) instead "
                          "of training again; its time is read from its metrics")
    cli.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                     help="what every phase computes in (default: %(default)s, bfloat16 where the CPU has bf16 units)")
    cli.add_argument("--out", type=Path, default=Path("benchmarks/out/learning_finance_sql"))
    args = cli.parse_args()
    if args.dtype != "auto":
        os.environ["STROP_DTYPE"] = args.dtype  # the evaluations' samplers too
    args.computed = {"trainer": resolve_dtype(args.dtype), "sampler": sampler_dtype_for(args.dtype)}
    print(f"{args.model}, trainer {args.computed['trainer']}, sampler {args.computed['sampler']}; CPU kernels "
          f"{kernels()}", flush=True)

    if args.out.exists():
        shutil.rmtree(args.out)  # a benchmark starts fresh: a resumed run would not measure its phases
    args.out.mkdir(parents=True)
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    env_spec = {"companies": args.companies, "max_turns": args.max_turns}

    t0 = time.perf_counter()
    demos_file = args.out / "demos.jsonl"
    env = FinanceSQLEnv(seed=0, **env_spec)
    try:
        with demos_file.open("w") as f:
            made = 0
            for demo in demonstrations(env, n=args.demos, mistakes=args.mistakes, seed=0):
                f.write(json.dumps({"messages": demo["messages"], "tools": demo["tools"]}) + "\n")
                made += 1
    finally:
        env.close()
    seconds["demos"] = time.perf_counter() - t0
    print(f"demos: {made} train-split transcripts ({seconds['demos']:.0f} s)", flush=True)

    if args.sft_run is not None:
        sft = _reused_sft(args, seconds)
    else:
        sft = _sft(args, demos_file, seconds)

    models = {"base": None, "sft": str(sft.final_adapter)}
    if args.grpo_steps > 0:  # 0: the warm start alone, base vs SFT
        models["sft+grpo"] = str(_grpo(args, env_spec, sft, seconds).final_adapter)
    evaluate(args, models, env_spec, seconds, started)
    return 0


def _reused_sft(args, seconds: dict):
    from types import SimpleNamespace
    metrics = [json.loads(line) for line in (args.sft_run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    seconds["sft (reused run)"] = sum(m.get("stepSeconds", 0.0) for m in metrics)
    print(f"sft: reusing {args.sft_run} ({len([m for m in metrics if m['step'] >= 0])} steps, "
          f"{seconds['sft (reused run)']:.0f} s of steps); held-out loss "
          f"{[round(m['evalLoss'], 3) for m in metrics if m.get('evalLoss') is not None]}", flush=True)
    return SimpleNamespace(final_adapter=args.sft_run / "final", metrics=metrics)


def _sft(args, demos_file: Path, seconds: dict):
    t0 = time.perf_counter()
    sft = run_sft(SFTConfig(base_model=args.model, dataset=str(demos_file), max_steps=args.sft_steps,
                            batch_size=args.sft_batch, learning_rate=args.sft_lr, lora_rank=args.rank,
                            eval_fraction=0.05, eval_every=max(1, args.sft_steps // 3), save_every=args.sft_steps,
                            keep_adapters=1, max_seq_length=4096, dtype=args.dtype), args.out / "sft", progress=False)
    seconds["sft"] = time.perf_counter() - t0
    losses = [(m["step"], m.get("loss"), m.get("evalLoss")) for m in sft.metrics]
    print(f"sft: {args.sft_steps} steps in {seconds['sft']:.0f} s; held-out loss "
          f"{[round(e, 3) for _, _, e in losses if e is not None]}", flush=True)
    return sft


def _grpo(args, env_spec: dict, sft, seconds: dict):
    t0 = time.perf_counter()
    grpo = run_grpo(GRPOConfig(base_model=args.model, init_adapter=str(sft.final_adapter),
                               environment={"name": "finance-sql", "options": env_spec, "split": "train"},
                               max_steps=args.grpo_steps, batch_size=args.grpo_batch, group_size=args.grpo_group,
                               max_completion_length=args.max_tokens, learning_rate=args.grpo_lr, lora_rank=args.rank,
                               temperature=1.0, kl_beta=0.0, save_every=args.grpo_steps, keep_adapters=1, seed=0,
                               dtype=args.dtype),
                    args.out / "grpo", progress=False)
    seconds["grpo"] = time.perf_counter() - t0
    for row in grpo.metrics:
        print(f"grpo step {row['step']}: reward {row['reward']:.3f}  zeroVarianceGroups {row['zeroVarianceGroups']:.2f}  "
              f"datums {row['datums']}  {row['stepSeconds']:.0f} s (sample {row['sampleSeconds']:.0f}, "
              f"train {row['trainSeconds']:.0f})", flush=True)
    return grpo


def evaluate(args, models: dict, env_spec: dict, seconds: dict, started: float) -> None:
    reports = {}
    for name, adapter in models.items():
        t0 = time.perf_counter()
        reports[name] = evaluate_env(args.model, "finance-sql", splits=list(SPLITS), limit=args.eval_n,
                                     options=env_spec, adapter=adapter, max_tokens=args.max_tokens,
                                     max_turns=args.max_turns)
        seconds[f"eval {name}"] = time.perf_counter() - t0
        print(f"eval {name}: " + "  ".join(f"{s} {reports[name]['splits'][s]['pass@1']:.1%}" for s in SPLITS)
              + f" ({seconds[f'eval {name}']:.0f} s)", flush=True)
        (args.out / f"eval-{name.replace('+', '-')}.json").write_text(json.dumps(reports[name], indent=1))

    summary = {"model": args.model, "dtype": args.computed, "kernels": kernels(), "eval_n": args.eval_n,
               "seconds": {k: round(v) for k, v in seconds.items()},
               "minutes_total": round((time.perf_counter() - started) / 60, 1), "splits": {}}
    print(f"\n{'split':12s} {'model':9s} {'pass@1':>7s}  " + "  ".join(f"{r:>19s}" for r in RUBRICS))
    for split in SPLITS:
        outcomes = {name: [e["passed"] for e in reports[name]["splits"][split]["episodes"]] for name in models}
        entry = {"pass@1": {}, "rubrics": {}, "mcnemar": {}}
        for name in models:
            s = reports[name]["splits"][split]
            entry["pass@1"][name] = s["pass@1"]
            entry["rubrics"][name] = {r: s["rubrics"].get(r) for r in RUBRICS}
            print(f"{split:12s} {name:9s} {s['pass@1']:7.1%}  "
                  + "  ".join(f"{s['rubrics'].get(r, float('nan')):19.2f}" for r in RUBRICS))
        for a, b in itertools.combinations(models, 2):
            lost = sum(x and not y for x, y in zip(outcomes[a], outcomes[b]))
            gained = sum(y and not x for x, y in zip(outcomes[a], outcomes[b]))
            p = mcnemar_exact(lost, gained)
            entry["mcnemar"][f"{a} vs {b}"] = {"right_then_wrong": lost, "wrong_then_right": gained, "p": p}
            print(f"{split:12s} {a} -> {b}: {gained} gained, {lost} lost, exact McNemar p = {p:.3g}")
        entry["byKind"] = by_kind(env_spec, split, args.eval_n, {name: reports[name]["splits"][split]["episodes"]
                                                                for name in models})
        for kind, passed in entry["byKind"].items():
            print(f"{split:12s} {kind:18s} " + "  ".join(f"{name} {p}/{passed['n']}" for name, p in passed.items()
                                                         if name != "n"))
        summary["splits"][split] = entry
    print("\nwall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
          + f"; total {summary['minutes_total']} min")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


def by_kind(env_spec: dict, split: str, limit: int, episodes: dict[str, list[dict]]) -> dict[str, dict]:
    """Episodes passed per kind of question (value, growth, margin...) and model: a total can hide a model that
    moved from one kind to another (the 8 GRPO steps of benchmarks/RESULTS.md did). Kinds from the tasks' metadata."""
    env = FinanceSQLEnv(**env_spec)
    try:
        kinds = {task.id: task.meta["kind"] for task in env.tasks(split, limit)}
    finally:
        env.close()
    table: dict[str, dict] = {}
    for name, eps in episodes.items():
        for e in eps:
            row = table.setdefault(kinds[e["task"]], {"n": 0, **{m: 0 for m in episodes}})
            row[name] += bool(e["passed"])
    for e in next(iter(episodes.values())):
        table[kinds[e["task"]]]["n"] += 1
    return dict(sorted(table.items()))


if __name__ == "__main__":
    sys.exit(main())
