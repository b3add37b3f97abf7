"""Does tool use learn, and does RL add to a supervised warm start? SmolLM2-135M-Instruct in finance-sql: a
supervised warm start on scripted demonstrations (SFT), then GRPO continued from it (SFT+GRPO, one run per
--grpo-seeds seed) on its RL pool (the train tasks, none of them a demonstration's, whose first query the warm start
got right at least twice and missed at least twice in 16 samples: the groups that have something to learn), each
evaluated greedily on companies no training saw:

- first query: from each held-out eval-single task's discovery state (the tables listed and described by the
  scripted agent), is the model's next turn a query whose first value is the answer? One turn a task: the
  decision GRPO branches its groups at (branchAtTurn), measured without the noise of the turns around it;
- eval-single: every single-table episode of the held-out companies (208 at 4 companies), full multi-turn pass@1;
- eval-multi: multi-table episodes, the generalisation check (more tokens a turn: its queries are longer);

with an exact McNemar test between each pair of models on the same tasks, pass@1 per kind of question, the
behaviour rubrics, and the minutes of every phase.

    python benchmarks/learning_finance_sql.py                        # the default sizes (see --help)
    python benchmarks/learning_finance_sql.py --smoke --out /tmp/lfs  # every phase at toy sizes: the program runs

Phases are kept in OUT/phases/NAME.json as they finish (each full-episode evaluation's transcripts in
OUT/transcripts/SPLIT-MODEL.jsonl), and running again with the same --out and settings goes
on from the first unfinished one (a killed SFT or GRPO phase resumes from its checkpoint); --stop-after M starts no
phase past M minutes of this invocation, so a 2-core budget holds and the next invocation finishes the rest.
The evaluation splits, their size and the greedy decoding are fixed before any result is seen: they are not
tuned to the outcome. The last line is a JSON summary (also OUT/summary.json) of every phase finished so far.
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

from strop import model_info
from strop.client import ServiceClient
from strop.engine.precision import kernels, resolve_dtype, sampler_dtype_for
from strop.envs.finance_demos import _copied, demonstrations
from strop.envs.finance_sql import FinanceSQLEnv, is_correct, parse_answer
from strop.evals.envs import evaluate_env
from strop.evals.stats import mcnemar_exact
from strop.models import DEFAULT_MODEL
from strop.renderers import get_renderer
from strop.renderers.tools import hermes_turn, parse_tool_calls
from strop.rl import GRPOConfig, run_grpo
from strop.rl.episodes import ToolEpisode
from strop.rl.rollouts import play
from strop.sft import SFTConfig, run_sft
from strop.tokenizer_utils import get_tokenizer

RUBRICS = ("validToolCalls", "tablesListedFirst", "hallucinatedTables", "hallucinatedColumns", "recoveries",
           "submitted", "turns")
BRANCH_AT = 3  # the turn GRPO's groups branch at by default: the first query after listing and describing a table
GRPO_LR = 5e-5
FIRST_QUERY_AT_ONCE = 64  # discovery states played at a time (each holds a SQLite database)


def main() -> int:
    cli = _cli()
    args = cli.parse_args()
    if args.smoke:
        args.demos, args.sft_steps, args.grpo_steps, args.grpo_batch, args.grpo_group = 12, 2, 1, 2, 2
        args.max_tasks, args.eval_limit, args.grpo_seeds = 4, 6, "0"
        args.pool_tasks, args.pool_samples, args.pool_resample = 3, 2, 2
    # the settings GRPO would refuse, refused before the demonstrations, SFT and the pool spend their minutes
    if args.reference_members >= args.grpo_group:
        cli.error(f"--reference-members {args.reference_members}: must be fewer than --grpo-group "
                  f"({args.grpo_group}), so that a group has a sampled episode")
    if args.reference_members and args.branch_at > 1 and args.scout != "reference":
        cli.error("--reference-members: the reference members go on from the scout's state with the scripted "
                  "agent's later calls; with --branch-at above 1, give --scout reference too")
    if args.reference_when != "always" and not args.reference_members:
        cli.error(f"--reference-when {args.reference_when}: chooses the groups the reference members play in; "
                  "give --reference-members N too")
    if args.dtype != "auto":
        os.environ["STROP_DTYPE"] = args.dtype  # the evaluations' samplers too
    seeds = [int(s) for s in args.grpo_seeds.split(",") if s.strip()]
    # a GRPO variant's runs are models of their own (grpo-s0-scout0), beside the default's in the same OUT
    variant = ("" if args.branch_at == BRANCH_AT else f"-branch{args.branch_at}") + \
        ("" if args.scout_temperature is None else f"-scout{args.scout_temperature:g}") + \
        ("" if args.scout == "policy" else "-reference") + \
        (f"-guide{args.reference_members}" if args.reference_members else "") + \
        ("" if args.reference_when == "always" else "-uninformative") + \
        (f"-mix{args.sft_mix:g}" if args.sft_mix else "") + \
        ("" if args.grpo_lr == GRPO_LR else f"-lr{args.grpo_lr:g}")
    names = ["sft", *(f"grpo-s{seed}{variant}" for seed in seeds)]
    known = {"", *names, *(["base"] if args.base else [])}
    unknown = sorted(set((args.evaluate or "").split(",")) - known) if args.evaluate is not None else []
    if unknown:
        cli.error(f"--evaluate: no model {', '.join(unknown)} in this run; its models are {', '.join(names)}"
                 + (", base" if args.base else "") + " (--grpo-seeds, --branch-at, --sft-mix, --scout-temperature, "
                 "--scout, --reference-members, --reference-when and --grpo-lr name them; --base adds base)")
    print(f"{args.model}, trainer {resolve_dtype(args.dtype)}, sampler {sampler_dtype_for(args.dtype)}; CPU kernels "
          f"{kernels()}", flush=True)
    if args.fresh and args.out.exists():
        shutil.rmtree(args.out)
    (args.out / "phases").mkdir(parents=True, exist_ok=True)
    bench = Bench(args, time.perf_counter())
    env_spec = {"companies": args.companies, "max_turns": args.max_turns}

    demos = bench.phase("demos", {"n": args.demos, "mistakes": args.mistakes, **env_spec},
                        lambda: _demos(args, env_spec))
    sft = bench.phase("sft", {"demos": demos, "steps": args.sft_steps, "batch": args.sft_batch, "lr": args.sft_lr,
                              "rank": args.rank}, lambda: _sft(args, demos["file"]))
    models = {"sft": sft and sft["adapter"]}
    pool = None
    if sft is not None and args.pool_tasks:
        pool = bench.phase("pool", {"sft": sft, "demos": demos, "tasks": args.pool_tasks,
                                    "samples": args.pool_samples, "temperature": args.temperature},
                           lambda: _pool(args, env_spec, sft["adapter"], demos))
        if pool is not None and args.pool_resample:
            pool = bench.phase("pool-resample", {"pool": pool, "samples": args.pool_resample},
                               lambda: _pool_resample(args, env_spec, sft["adapter"], pool))
    trained = pool and (pool["ids"] if args.keep_zero_answers else _without_zero_answers(env_spec, pool["ids"]))
    grpo_settings = {"sft": sft, "pool": trained, "steps": args.grpo_steps, "batch": args.grpo_batch,
                     "group": args.grpo_group,
                     "lr": args.grpo_lr, "kl": args.kl, "temperature": args.temperature,
                     "branchAtTurn": args.branch_at, "maxTasks": args.max_tasks, "maxTokens": args.max_tokens,
                     **({} if args.scout_temperature is None else {"scoutTemperature": args.scout_temperature}),
                     **({} if args.scout == "policy" else {"scout": args.scout}),
                     **({"referenceMembers": args.reference_members} if args.reference_members else {}),
                     **({} if args.reference_when == "always" else {"referenceWhen": args.reference_when}),
                     **({"sftMix": args.sft_mix, "sftMixExamples": args.sft_mix_examples} if args.sft_mix else {})}
    evals = {"first-query": lambda adapter, name: _first_query(args, env_spec, adapter),
             "eval-single": lambda adapter, name: _episodes(args, env_spec, "eval-single", name, adapter,
                                                            args.max_tokens),
             "eval-multi": lambda adapter, name: _episodes(args, env_spec, "eval-multi", name, adapter,
                                                           args.multi_max_tokens)}
    # the cheap measures first and the warm start's once, so that a --stop-after budget keeps the comparisons that
    # matter most: each seed's first-query measure, then full episodes, then the generalisation split
    order = [("first-query", "sft")]
    for seed, name in zip(seeds, names[1:]):
        order += [("train", name), ("first-query", name)]
    order += [(split, name) for split in ("eval-single", "eval-multi") for name in names]
    if args.base:
        models["base"] = None
        order += [(split, "base") for split in evals]
    results: dict[str, dict] = {}
    for split, name in order:
        if split == "train":
            if sft is not None:
                seed = int(name.removeprefix("grpo-s").split("-")[0])
                if args.pool_tasks and pool is None:
                    continue  # the pool phase did not run yet
                done = bench.phase(name, {**grpo_settings, "seed": seed},
                                   lambda seed=seed, name=name: _grpo(args, env_spec, sft["adapter"], seed,
                                                                      trained, name, demos["file"]))
                models[name] = done and done["adapter"]
            continue
        if name not in models or (name != "base" and models[name] is None):
            continue  # its training phase did not run yet
        if args.evaluate is not None and name not in args.evaluate.split(","):
            continue
        settings = {"model": name, "adapter": models[name], "limit": args.eval_limit, "maxTurns": args.max_turns,
                    "maxTokens": args.multi_max_tokens if split == "eval-multi" else args.max_tokens,
                    **({} if args.dtype == "auto" else {"dtype": args.dtype})}
        done = bench.phase(f"{split}-{name}", settings,
                           lambda split=split, name=name: evals[split](models[name], name))
        if done is not None:
            results.setdefault(split, {})[name] = done
    summarize(args, bench, results)
    return 0


def _at_least(least: int, most: int | None = None):
    """An argparse type: a whole number from `least` to `most`, refused before any phase runs."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"must be at least {least}" + (f" and at most {most}" if most else "")
                                             + f", got {value}")
        return value
    return parse


def _number(least: float, most: float):
    """An argparse type: a finite number from `least` to `most` (nan and inf are refused)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not least <= value <= most:  # false for nan too
            raise argparse.ArgumentTypeError(f"must be a number from {least:g} to {most:g}, got {text}")
        return value
    return parse


def _cli() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = cli.add_argument
    add("--model", default=DEFAULT_MODEL)
    add("--demos", type=_at_least(1), default=240, help="train-split demonstrations written (default: %(default)s)")
    add("--mistakes", type=_number(0, 1), default=0.25, help="share of demonstrations that recover from a mistake (its "
        "wrong query carries weight 0)")
    add("--companies", type=_at_least(1), default=4, help="companies per split (default: %(default)s)")
    add("--sft-steps", type=_at_least(1), default=24)
    add("--sft-batch", type=_at_least(1), default=4)
    add("--sft-lr", type=_number(0, 1), default=5e-4)
    add("--pool-tasks", type=_at_least(0), default=96, help="train tasks after the demonstrations' probed for the RL pool: "
        "from each one's discovery state the warm start writes --pool-samples first queries, and GRPO draws only "
        "the tasks it solved sometimes but not always (default: %(default)s; 0: GRPO draws from the whole train "
        "split)")
    add("--pool-samples", type=_at_least(1), default=8, help="first queries sampled per probed task (default: %(default)s)")
    add("--pool-resample", type=_at_least(0), default=8, help="further first queries sampled for each probed task solved at "
        "least once: the pool keeps the tasks then solved at least twice, and at least twice not, of all the "
        "samples (a task seen right once in 8 is mostly rarer than that: a group of 8 at a true 1 in 20 has "
        "variance a third of the time). 0: keep the first probe's 1..K-1 (default: %(default)s)")
    add("--grpo-seeds", default="0,1", help="one GRPO run from the warm start per seed (default: %(default)s)")
    add("--grpo-steps", type=_at_least(1), default=5)
    add("--grpo-batch", type=_at_least(1), default=4, help="groups with reward variance wanted a step (default: %(default)s)")
    add("--grpo-group", type=_at_least(1), default=8, help="episodes per task (default: %(default)s)")
    add("--max-tasks", type=_at_least(1), default=12, help="most tasks dynamic sampling draws a step (default: %(default)s)")
    add("--branch-at", type=_at_least(1, 1000), default=BRANCH_AT, help="turn each group branches at: 3 is the first query after "
        "listing and describing a table; 2 also samples which table to describe, the decision a full episode "
        "needs right first (1: whole-episode groups). Another turn's runs are the models grpo-sSEED-branchN "
        "(default: %(default)s)")
    add("--scout-temperature", type=_number(0, 10), default=None, help="the temperature each group's scout plays the turns "
        "before the branch at (0: greedy, the discovery the model's own evaluation makes); its runs are the models "
        "grpo-sSEED-scoutT beside the default's (default: GRPO's temperature)")
    add("--scout", choices=("policy", "reference"), default="policy", help="who plays the turns before each "
        "group's branch: policy (the model being trained, at --scout-temperature) or reference (finance-sql's "
        "scripted agent: the tables listed and the needed ones described, the state the pool was probed from and "
        "the first-query measure starts from); reference runs are the models grpo-sSEED-reference "
        "(default: %(default)s)")
    add("--reference-members", type=_at_least(0), default=0, metavar="N", help="of each GRPO group's --grpo-group "
        "episodes, N play finance-sql's scripted agent to the end instead of sampling (off-policy guidance, as in "
        "LUFFY): a group the model fails whole still has a right episode to learn from. With --branch-at above 1 "
        "it needs --scout reference; its runs are the models grpo-sSEED-...-guideN (default: %(default)s)")
    add("--reference-when", choices=("always", "uninformative"), default="always", help="which groups the "
        "--reference-members play the scripted agent in: always, or uninformative (only a group whose sampled "
        "episodes are all wrong or all right: one that would teach nothing; the others sample those episodes too); "
        "its runs are the models grpo-sSEED-...-guideN-uninformative (default: %(default)s)")
    add("--sft-mix", type=_number(0, 1e6), default=None, metavar="W", help="train every GRPO step on --sft-mix-examples of "
        "the warm start's demonstrations too, their cross-entropy times W (the run's sft_mix: PPO-ptx), so the kinds "
        "of question a step's few groups miss stay where SFT put them; its runs are the models grpo-sSEED-mixW "
        "beside the default's (default: none)")
    add("--sft-mix-examples", type=_at_least(1), default=4, metavar="N", help="demonstrations an optimizer step adds with "
        "--sft-mix (default: %(default)s)")
    add("--keep-zero-answers", action="store_true", help="let GRPO draw pool tasks whose answer is 0 too, as runs "
        "before this option did (a wrong query that finds a zero answers them right)")
    add("--grpo-lr", type=_number(0, 1), default=GRPO_LR, help="GRPO's learning rate; another rate's runs are the "
        "models grpo-sSEED-...-lrX (default: %(default)s)")
    add("--kl", type=_number(0, 1e6), default=0.02, help="KL penalty to the warm start (default: %(default)s)")
    add("--temperature", type=_number(0, 10), default=0.7, help="GRPO sampling temperature (default: %(default)s)")
    add("--rank", type=_at_least(1), default=32)
    add("--max-tokens", type=_at_least(1), default=160, help="most tokens per model turn (default: %(default)s)")
    add("--multi-max-tokens", type=_at_least(1), default=200, help="tokens a turn on eval-multi, whose longest demonstrated "
        "query needs more (default: %(default)s)")
    add("--max-turns", type=_at_least(1), default=6, help="most tool calls per episode")
    add("--eval-limit", type=_at_least(1), default=None, help="episodes per evaluation (default: every task of the split)")
    add("--base", action="store_true", help="evaluate the base model too (it scored 0 on both splits before)")
    add("--evaluate", default=None, metavar="NAMES", help="measure only these models (comma-separated: sft, "
        "grpo-s0, grpo-s0-mix0.1, base), e.g. to run each model's evaluations in a process of its own "
        "(default: every model)")
    add("--stop-after", type=_number(0, 1e7), default=100.0, help="start no phase past this many minutes (default: %(default)s)")
    add("--smoke", action="store_true", help="toy sizes: checks the program runs, measures nothing")
    add("--fresh", action="store_true", help="remove OUT first instead of going on from its finished phases")
    add("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    add("--out", type=Path, default=Path("benchmarks/out/learning_finance_sql"))
    return cli


class Bench:
    """Phases that are run once: a finished phase's result and seconds are kept in OUT/phases/NAME.json."""

    def __init__(self, args, started: float):
        self.args, self.started = args, started
        self.seconds: dict[str, float] = {}
        self.skipped: list[str] = []

    def phase(self, name: str, settings: dict, run):
        path = self.args.out / "phases" / f"{name}.json"
        if path.exists():
            kept = json.loads(path.read_text())
            if kept["settings"] != json.loads(json.dumps(settings)):
                sys.exit(f"{path} was made with other settings ({kept['settings']}); run with --fresh, or another "
                         "--out, to measure these")
            self.seconds[name] = kept["seconds"]
            print(f"{name}: finished earlier ({kept['seconds']:.0f} s)", flush=True)
            return kept["result"]
        if (time.perf_counter() - self.started) / 60 > self.args.stop_after:
            self.skipped.append(name)
            return None
        t0 = time.perf_counter()
        result = run()
        self.seconds[name] = time.perf_counter() - t0
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"settings": settings, "seconds": self.seconds[name], "result": result}))
        tmp.replace(path)
        print(f"{name}: {self.seconds[name]:.0f} s", flush=True)
        return result


def _demos(args, env_spec: dict) -> dict:
    demos_file = args.out / "demos.jsonl"
    env = FinanceSQLEnv(seed=0, **env_spec)
    made = mistaken = 0
    try:
        with demos_file.open("w") as f:
            for demo in demonstrations(env, n=args.demos, mistakes=args.mistakes, seed=0):
                f.write(json.dumps({"messages": demo["messages"], "tools": demo["tools"]}) + "\n")
                made, mistaken = made + 1, mistaken + demo["mistake"]
    finally:
        env.close()
    print(f"demos: {made} train-split transcripts, {mistaken} recovering from a mistake", flush=True)
    return {"file": str(demos_file), "made": made, "mistaken": mistaken}


def _sft(args, demos_file: str) -> dict:
    sft = run_sft(SFTConfig(base_model=args.model, dataset=demos_file, max_steps=args.sft_steps,
                            batch_size=args.sft_batch, learning_rate=args.sft_lr, lora_rank=args.rank,
                            eval_fraction=0.05, eval_every=max(1, args.sft_steps // 3), save_every=4,
                            keep_adapters=1, max_seq_length=4096, dtype=args.dtype), args.out / "sft", progress=False)
    held_out = [round(m["evalLoss"], 3) for m in sft.metrics if m.get("evalLoss") is not None]
    print(f"sft: held-out loss per trained token {held_out}", flush=True)
    return {"adapter": str(sft.final_adapter), "heldOutLoss": held_out}


def _grpo(args, env_spec: dict, adapter: str, seed: int, pool: list[str] | None, name: str, demos: str) -> dict:
    environment = {"name": "finance-sql", "options": env_spec, "split": "train", **({"tasks": pool} if pool else {})}
    grpo = run_grpo(GRPOConfig(
        base_model=args.model, init_adapter=adapter, environment=environment,
        max_steps=args.grpo_steps, batch_size=args.grpo_batch, group_size=args.grpo_group,
        max_completion_length=args.max_tokens, learning_rate=args.grpo_lr, lora_rank=args.rank,
        temperature=args.temperature, kl_beta=args.kl, kl_reference="start", variance_on="correctness",
        dynamic_sampling=True, max_tasks_per_step=args.max_tasks, branch_at_turn=args.branch_at,
        scout_temperature=args.scout_temperature, scout=args.scout, reference_members=args.reference_members,
        reference_when=args.reference_when,
        save_every=1, keep_adapters=1, seed=seed, dtype=args.dtype,
        **({"sft_mix": demos, "sft_mix_weight": args.sft_mix, "sft_mix_examples": args.sft_mix_examples}
           if args.sft_mix else {})),
        args.out / name, progress=False)
    keys = ("reward", "zeroVarianceGroups", "tasksDrawn", "groupsKept", "datums", "trainedTokens", "klBase", "entropy",
            "sftMixLoss", "stepSeconds", "sampleSeconds", "trainSeconds")
    steps = [{k: row.get(k) for k in ("step", *keys)} for row in grpo.metrics if row.get("step", -1) >= 0]
    for row in steps:
        print(f"{name} " + "  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in row.items()), flush=True)
    return {"adapter": str(grpo.final_adapter), "steps": steps}


def _episodes(args, env_spec: dict, split: str, name: str, adapter: str | None, max_tokens: int) -> dict:
    started = time.perf_counter()

    def progress(_split, finished, total):  # a line a turn: a long evaluation shows that it moves
        print(f"  {split}: {finished}/{total} episodes finished, {time.perf_counter() - started:.0f} s", flush=True)
    report = evaluate_env(args.model, "finance-sql", splits=[split], limit=args.eval_limit, options=env_spec,
                          adapter=adapter, max_tokens=max_tokens, max_turns=args.max_turns, on_progress=progress)
    s = report["splits"][split]
    kept = args.out / "transcripts" / f"{split}-{name}.jsonl"  # where an episode failed, for whoever reads the result
    kept.parent.mkdir(exist_ok=True)
    with kept.open("w") as f:
        for e in s["episodes"]:
            f.write(json.dumps({k: e[k] for k in ("task", "gold", "reward", "passed", "transcript")}, default=str)
                    + "\n")
    return {"pass@1": s["pass@1"], "rubrics": {r: s["rubrics"].get(r) for r in RUBRICS},
            "tasks": [e["task"] for e in s["episodes"]], "passed": [bool(e["passed"]) for e in s["episodes"]]}


def _first_query(args, env_spec: dict, adapter: str | None) -> dict:
    """The model's turn from each eval-single task's discovery state, greedy: passed when it is a run_sql whose
    result's first value, copied as the scripted agent copies it, is the answer."""
    probe = FinanceSQLEnv(seed=0, **env_spec)
    tasks = probe.tasks("eval-single", args.eval_limit)
    probe.close()
    outcomes = _first_queries(args, env_spec, adapter, tasks, samples=1, temperature=0.0)
    passed = [bool(right) for right, _ in outcomes]
    return {"pass@1": sum(passed) / max(1, len(passed)), "queried": sum(q for _, q in outcomes) / max(1, len(passed)),
            "tasks": [t.id for t in tasks], "passed": passed}


def _pool(args, env_spec: dict, adapter: str, demos: dict) -> dict:
    """The RL pool: of the --pool-tasks train tasks after those the demonstrations used, the ones the warm start's
    sampled first queries (at GRPO's temperature) solved sometimes but not always, where a group has variance."""
    probe = FinanceSQLEnv(seed=0, **env_spec)
    try:  # the demonstrations again (scripted, seconds): which tasks they used
        used = {d["task"] for d in demonstrations(probe, n=args.demos, mistakes=args.mistakes, seed=0)}
        tasks = [t for t in probe.tasks("train") if t.id not in used][:args.pool_tasks]
    finally:
        probe.close()
    assert demos["made"] == len(used), "the demonstrations are not the ones the demos phase wrote"
    outcomes = _first_queries(args, env_spec, adapter, tasks, samples=args.pool_samples, temperature=args.temperature)
    solved = [right for right, _ in outcomes]
    ids = [t.id for t, k in zip(tasks, solved) if 0 < k < args.pool_samples]
    print(f"pool: {len(ids)} of {len(tasks)} probed train tasks solved 1..{args.pool_samples - 1} times of "
          f"{args.pool_samples} ({sum(k == 0 for k in solved)} never, {sum(k == args.pool_samples for k in solved)} "
          "always)", flush=True)
    if not ids and args.smoke:  # toy sizes measure nothing: the phases after it still run
        ids = [t.id for t in tasks]
    if not ids:
        sys.exit("the RL pool is empty: no probed task was solved sometimes; probe more (--pool-tasks) or run with "
                 "--pool-tasks 0 to draw from the whole train split")
    return {"ids": ids, "probed": len(tasks), "solved": solved,
            "kinds": {k: sum(t.meta["kind"] == k for t in tasks if t.id in ids)
                      for k in sorted({t.meta["kind"] for t in tasks})}}


def _without_zero_answers(env_spec: dict, ids: list[str]) -> list[str]:
    """The pool less its tasks whose answer is 0 (a figure the company never reported): a wrong query that finds
    a zero, such as one year's value for an average of dividends never paid, answers them right, so their groups
    reward the wrong query."""
    probe = FinanceSQLEnv(seed=0, **env_spec)
    try:
        answers = {t.id: t.answer for t in probe.tasks("train")}
    finally:
        probe.close()

    def zero(answer: str) -> bool:
        try:
            return float(answer) == 0
        except ValueError:
            return False
    kept = [i for i in ids if not zero(answers[i])]
    if len(kept) < len(ids):
        print(f"pool: {len(ids) - len(kept)} task(s) whose answer is 0 left out of GRPO's draws "
              "(--keep-zero-answers keeps them)", flush=True)
    return kept or ids


def _pool_resample(args, env_spec: dict, adapter: str, pool: dict) -> dict:
    """The pool again, on more samples: every probed task the first probe solved at least once is sampled
    --pool-resample more times (other seeds), and the pool keeps those solved at least 2 times and missed at least
    2 times of all their samples. A task never solved in the first probe stays out (its rate is under 1/K)."""
    probe = FinanceSQLEnv(seed=0, **env_spec)
    try:
        by_id = {t.id: t for t in probe.tasks("train")}
        used = {d["task"] for d in demonstrations(probe, n=args.demos, mistakes=args.mistakes, seed=0)}
    finally:
        probe.close()
    probed = [t for t in by_id.values() if t.id not in used][:pool["probed"]]
    again = [(t, k) for t, k in zip(probed, pool["solved"]) if k > 0]
    outcomes = _first_queries(args, env_spec, adapter, [t for t, _ in again], samples=args.pool_resample,
                              temperature=args.temperature, seed_offset=1_000_003)
    total = args.pool_samples + args.pool_resample
    solved = {t.id: k + right for (t, k), (right, _) in zip(again, outcomes)}
    ids = [i for i, k in solved.items() if 2 <= k <= total - 2]
    print(f"pool, resampled: {len(ids)} of the {len(again)} tasks solved at least once are solved 2..{total - 2} "
          f"times of {total}", flush=True)
    if not ids and args.smoke:
        ids = list(solved) or pool["ids"]
    if not ids:
        sys.exit("the resampled RL pool is empty; run with --pool-resample 0 to keep the first probe's")
    return {"ids": ids, "solved": solved, "samples": total,
            "kinds": {k: sum(by_id[i].meta["kind"] == k for i in ids)
                      for k in sorted({by_id[i].meta["kind"] for i in solved})}}


def _first_queries(args, env_spec: dict, adapter: str | None, tasks: list, *, samples: int,
                   temperature: float, seed_offset: int = 0) -> list[tuple[int, int]]:
    """Per task, of `samples` next turns from its discovery state: how many were right (a run_sql whose result's
    first value is the answer) and how many were a query at all."""
    sampler = ServiceClient().create_sampling_client(base_model=args.model, model_path=adapter)
    renderer = get_renderer(model_info.get_recommended_renderer_name(args.model), get_tokenizer(args.model))
    out = []
    at_once = max(1, FIRST_QUERY_AT_ONCE // samples)
    for start in range(0, len(tasks), at_once):
        chunk = tasks[start:start + at_once]
        envs = [[FinanceSQLEnv(seed=0, **env_spec) for _ in range(samples)] for _ in chunk]
        try:
            groups = [[ToolEpisode(env, task, max_turns=args.max_turns, tools=env.tools()) for env in group]
                      for group, task in zip(envs, chunk)]
            started = [[(_discovered(e), []) for e in group] for group in groups]
            rolled = play(sampler, renderer, groups, max_tokens=args.max_tokens, temperature=temperature,
                          max_turns=1, started=started, seed=seed_offset + start)
        finally:
            for group in envs:
                for env in group:
                    env.close()
        for task, group in zip(chunk, rolled):
            checked = [_first_query_right(rollout, task) for rollout in group]
            out.append((sum(right for right, _ in checked), sum(query for _, query in checked)))
    return out


def _first_query_right(rollout, task) -> tuple[bool, bool]:
    calls, _ = parse_tool_calls(rollout.turns[0].text) if rollout.turns else ([], [])
    if not (calls and calls[0].name == "run_sql" and rollout.messages[-1]["role"] == "tool"):
        return False, False
    try:
        answer = _copied(rollout.messages[-1]["content"], task.meta["unit"])
    except IndexError:  # an error or an empty result: no value under a header
        answer = ""
    return bool(is_correct(parse_answer(answer), float(task.answer), task.meta["unit"])), True


def _discovered(episode: ToolEpisode) -> list[dict]:
    """The episode's messages after the scripted agent's discovery: list_tables, then describe_table for each
    table the question needs, written as the model writes a call and acted on by the environment."""
    messages = episode.start()
    tables = sorted({t["table"] for t in episode.task.meta["terms"]})
    calls = [("list_tables", {})] + [("describe_table", {"table": t}) for t in tables]
    for i, (name, arguments) in enumerate(calls):
        text = hermes_turn({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}
        )["content"]
        messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": episode.act(text)}]
    return messages


def summarize(args, bench: Bench, results: dict[str, dict]) -> None:
    summary = {"model": args.model, "kernels": kernels(), "seconds": {k: round(v) for k, v in bench.seconds.items()},
               "minutes": round(sum(bench.seconds.values()) / 60, 1), "notRun": bench.skipped, "splits": {}}
    kinds = _kinds(args)
    print(f"\n{'measure':12s} {'model':10s} {'pass@1':>9s}  " + "  ".join(f"{r:>19s}" for r in RUBRICS))
    for split, by_model in results.items():
        entry = summary["splits"][split] = {"passed": {}, "rubrics": {}, "mcnemar": {}, "byKind": {}}
        for name, r in by_model.items():
            entry["passed"][name] = f"{sum(r['passed'])}/{len(r['passed'])}"
            entry["rubrics"][name] = r.get("rubrics")
            print(f"{split:12s} {name:10s} {entry['passed'][name]:>9s}  "
                  + "  ".join(f"{(r.get('rubrics') or {}).get(k) or float('nan'):19.2f}" for k in RUBRICS))
        for a, b in itertools.combinations(by_model, 2):
            x, y = by_model[a], by_model[b]
            if x["tasks"] != y["tasks"]:
                continue
            lost = sum(p and not q for p, q in zip(x["passed"], y["passed"]))
            gained = sum(q and not p for p, q in zip(x["passed"], y["passed"]))
            p = mcnemar_exact(lost, gained)
            entry["mcnemar"][f"{a} vs {b}"] = {"right_then_wrong": lost, "wrong_then_right": gained, "p": p}
            print(f"{split:12s} {a} -> {b}: {gained} gained, {lost} lost, exact McNemar p = {p:.3g}")
        entry["byKind"] = _by_kind(by_model, kinds)
        for kind, row in sorted(entry["byKind"].items()):
            print(f"{split:12s} {kind:12s} " + "  ".join(f"{m} {v}/{row['n']}" for m, v in row.items()
                                                          if m not in ("n", "vs"))
                  + "".join(f"  [{m}: {t['gained']}+ {t['lost']}- p {t['p']:.2g}{' WORSE' if t['worse'] else ''}]"
                            for m, t in row.get("vs", {}).items()))
    print("\nwall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in bench.seconds.items())
          + f"; {summary['minutes']} min in all" + (f"; not run yet: {', '.join(bench.skipped)}" if bench.skipped
                                                   else ""))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


def _by_kind(by_model: dict[str, dict], kinds: dict[str, str]) -> dict[str, dict]:
    """Per kind of question: each model's passes, and each later model against the first (the warm start) on
    the same tasks: gained, lost, exact McNemar p, and whether the kind got significantly worse (p < 0.05, more
    lost than gained), the issue's "no kind significantly worse"."""
    table: dict[str, dict] = {}
    first = next(iter(by_model))
    for name, r in by_model.items():
        for task, ok in zip(r["tasks"], r["passed"]):
            row = table.setdefault(kinds.get(task, "?"), {})
            row[name] = row.get(name, 0) + ok
            row["n"] = row.get("n", 0) + (name == first)
    for name, r in list(by_model.items())[1:]:
        if r["tasks"] != by_model[first]["tasks"]:
            continue
        pairs: dict[str, list[int]] = {}
        for task, before, after in zip(r["tasks"], by_model[first]["passed"], r["passed"]):
            counts = pairs.setdefault(kinds.get(task, "?"), [0, 0])
            counts[0] += bool(after and not before)
            counts[1] += bool(before and not after)
        for kind, (gained, lost) in pairs.items():
            p = mcnemar_exact(lost, gained)
            table[kind].setdefault("vs", {})[name] = {"gained": gained, "lost": lost, "p": p,
                                                      "worse": p < 0.05 and lost > gained}
    return table


def _kinds(args) -> dict[str, str]:
    """Each evaluation task's kind of question (value, growth, margin...): a total can hide a model that moved
    from one kind to another."""
    env = FinanceSQLEnv(seed=0, companies=args.companies, max_turns=args.max_turns)
    try:
        return {t.id: t.meta["kind"] for split in ("eval-single", "eval-multi") for t in env.tasks(split)}
    finally:
        env.close()


if __name__ == "__main__":
    sys.exit(main())
