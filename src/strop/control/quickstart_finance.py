"""`strop quickstart --task finance-sql`: the tool-use story end to end. A small model learns to answer questions about
a company's financial statements by querying its database with tools, and the evidence says whether it did.

Steps: select the base model; write demonstrations from the scripted agent (train-split companies only) and
register them as a dataset of the quickstart's own project; evaluate the baseline (an `openai:NAME@URL` endpoint
with native tool calls, else the untuned base model) on the held-out single-table and multi-table splits; warm
start the base model with supervised fine-tuning on the demonstrations (a background run, `method: sft`) and
evaluate that warm start on the same episodes; continue from it with GRPO in the environment (a second run,
`baseModel: model-...`, so `strop runs get` shows the lineage base -> SFT -> RL), its groups branched at the first
query and judged on correctness (see `_descriptor`); evaluate the tuned model on the same episodes; compare the
baseline with the tuned model (pass@1 per split and over both, paired bootstrap interval, exact McNemar) and the
warm start with the tuned model (does RL add to SFT?), with the behaviour rubrics of each side; write the result
table strop_eval_comparison, the dashboard and the HTML report. `quickstart.json` lists all it made, for
`strop cleanup`.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from strop.control.progress import EpisodeBar, RunBar
from strop.engine.precision import cuda_count
from strop.errors import StropError

SPLITS = ("eval-single", "eval-multi")
MAX_TURNS = 6           # tool calls per episode: list, describe, query, a retry, submit, and one to spare
MISTAKES = 0.25         # demonstrations that make a mistake and recover
# GRPO after the warm start, as benchmarks/learning_finance_sql.py measures it: each group branches at turn 3 (the
# first query, after listing and describing a table), so its mean is a baseline for that decision; groups are
# judged on the correctness term (a group that differs only in the format term teaches nothing), and further tasks
# are drawn until the batch has groups with a spread; a KL anchor to the warm start; cooler sampling, since at 1.0
# the warm start's samples were rarely correct
RL_AFTER_WARM_START = {"branchAtTurn": 3, "varianceOn": "correctness", "klBeta": 0.02, "klReference": "start",
                       "temperature": 0.7}
RUBRICS = ("validToolCalls", "tablesListedFirst", "hallucinatedTables", "hallucinatedColumns", "sqlErrors",
           "recoveries", "submitted")


def env_options(o) -> dict:
    """The environment every phase uses: enough companies for the demonstrations and for eval_n per split."""
    # lazy: the environment's data module loads only for this task
    from strop.envs.finance_data import MAX_COMPANIES
    from strop.envs.finance_sql import FinanceSQLEnv
    probe = FinanceSQLEnv(seed=o.seed)
    try:
        per_company = {split: len(probe.tasks(split)) for split in ("train", *SPLITS)}
    finally:
        probe.close()
    companies = max(math.ceil(o.demos / per_company["train"]),
                    *(math.ceil(o.eval_n / per_company[s]) for s in SPLITS))
    return {"seed": o.seed, "companies": min(MAX_COMPANIES, companies), "max_turns": MAX_TURNS}


def problems(o) -> list[str]:
    """What is wrong with the options for this task (the shared ones are checked by quickstart itself)."""
    # lazy: strop.rl.limits is the run config's; checked here so a bad value stops before the baseline is evaluated
    from strop.rl.limits import LIMITS
    found = []
    if o.demos < 1:
        found.append(f"--demos must be at least 1, got {o.demos}")
    for flag, limit, value in (("--sft-steps", "max_steps", o.sft_steps),
                               ("--sft-batch-size", "batch_size", o.sft_batch_size),
                               ("--sft-learning-rate", "learning_rate", o.sft_learning_rate)):
        problem = LIMITS[limit].problem(value)
        if problem:
            found.append(f"{flag}: {problem}")
    if o.data_file is not None or o.dataset != "synthetic":
        found.append("--dataset and --data-file choose the data of --task gsm8k; finance-sql makes its own "
                     "(demonstrations from the train split's companies, evaluation on unseen ones)")
    if o.judge not in (None, "local"):  # "local" is QuickstartOptions' own default, not a choice made
        found.append("--judge applies to --task gsm8k; finance-sql episodes are graded by the environment and "
                     "described by its behaviour rubrics")
    return found


def _descriptor(o, project: str, *, base_model: str, sft_dataset: str | None, options: dict) -> dict:
    lora = {"rank": o.lora_rank}
    if sft_dataset is not None:
        config = {"dataset": sft_dataset, "method": "sft", "maxSeqLength": 4096,
                  "sftHyperparams": {"maxSteps": o.sft_steps, "batchSize": o.sft_batch_size, "evalFraction": 0.05,
                                     "lora": lora, "optimizer": {"learningRate": o.sft_learning_rate}}}
        steps = o.sft_steps
    else:
        config = {"environment": {"name": "finance-sql", "options": options, "split": "train"}, "method": "grpo",
                  "maxSeqLength": 4096,
                  "rlHyperparams": {"epochs": 100, "maxSteps": o.steps, "groupSize": o.group_size,
                                    **RL_AFTER_WARM_START, "maxCompletionLength": o.max_tokens,
                                    "batchSize": o.batch_size, "lora": lora,
                                    "dynamicSampling": {"enabled": True, "maxTasksPerStep": 2 * o.batch_size},
                                    "optimizer": {"learningRate": o.learning_rate}}}
        steps = o.steps
    return {"kind": "run", "project": project, "configName": "quickstart-" + ("sft" if sft_dataset else "grpo"),
            "baseModel": base_model, "config": config,
            "execution": {"gpus": min(1, cuda_count()), "saveEvery": max(1, steps // 2), "keepAdapters": 2}}


def _write_demos(path: Path, o, options: dict) -> int:
    # lazy: the scripted agent and its environment load only for this task
    from strop.envs.finance_demos import demonstrations
    from strop.envs.finance_sql import FinanceSQLEnv
    env = FinanceSQLEnv(**options)
    made = 0
    try:
        with path.open("w", encoding="utf-8") as f:
            for demo in demonstrations(env, n=o.demos, mistakes=MISTAKES, seed=o.seed):
                f.write(json.dumps({"messages": demo["messages"], "tools": demo["tools"]}) + "\n")
                made += 1
    finally:
        env.close()
    return made


def _evaluate(model_ref: str, o, options: dict, label: str, path: Path, say) -> dict:
    """Greedy episodes of both evaluation splits; the report is also written to `path`."""
    # lazy: strop.control.evaluations pulls in sqlalchemy, and strop.evals.envs torch
    from strop.control.evaluations import resolve_model
    from strop.evals.envs import evaluate_env
    target = resolve_model(model_ref)
    say(f"{label}: {model_ref} on {o.eval_n} episodes of each of {', '.join(SPLITS)} (greedy, at most "
        f"{MAX_TURNS} tool calls)")
    with EpisodeBar(label) as bar:
        report = evaluate_env(target.get("openai") or target["basePath"], "finance-sql", splits=list(SPLITS),
                              limit=o.eval_n, options=options, adapter=target.get("adapter"),
                              max_tokens=o.max_tokens, concurrency=o.concurrency, on_progress=bar.update)
    report["model"] = model_ref
    path.write_text(json.dumps(report, indent=1))
    errors = sum(1 for s in report["splits"].values() for e in s["episodes"] if e.get("error"))
    if errors:
        say(f"warning: {errors} episodes of {model_ref} ended on a failed request and count as wrong")
    return report


def comparison_items(report: dict) -> list[dict]:
    """Each episode as a comparison item: the task, the gold number, the submitted answer, right or wrong, and the
    transcript as the response."""
    items = []
    for split in SPLITS:
        for episode in report["splits"][split]["episodes"]:
            answer = (episode.get("state") or {}).get("answer")
            items.append({"index": len(items), "question": f"[{split}] {episode['task']}", "gold": episode["gold"],
                          "extracted": answer, "correct": bool(episode["passed"]),
                          "response": _transcript_text(episode.get("transcript") or [])})
    return items


def _transcript_text(messages: list[dict]) -> str:
    lines = []
    for m in messages[1:]:  # the first is the question, which the item already names
        calls = m.get("tool_calls") or []
        text = m.get("content") or ""
        if calls:
            text = " ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in calls)
        lines.append(f"{m['role']}: {text}")
    return "\n".join(lines)


def split_summary(baseline: dict, tuned: dict) -> dict:
    """Per split: each side's pass@1 and rubrics, and the exact McNemar test between them."""
    # lazy: strop.evals.stats pulls in numpy
    from strop.evals.stats import discordant, mcnemar_exact
    out = {}
    for split in SPLITS:
        a = [e["passed"] for e in baseline["splits"][split]["episodes"]]
        b = [e["passed"] for e in tuned["splits"][split]["episodes"]]
        a_only, b_only = discordant(a, b)
        out[split] = {"n": len(a), "baseline": baseline["splits"][split]["pass@1"],
                      "tuned": tuned["splits"][split]["pass@1"], "mcnemarP": mcnemar_exact(a_only, b_only),
                      "baselineOnly": a_only, "tunedOnly": b_only,
                      "rubrics": {"baseline": baseline["splits"][split]["rubrics"],
                                  "tuned": tuned["splits"][split]["rubrics"]}}
    return out


def summary_table(splits: dict, labels: tuple[str, str]) -> str:
    a, b = labels
    width = max(14, len(a), len(b))
    lines = [f"{'pass@1':<22} {a:>{width}} {b:>{width}} {'Delta':>8}  exact McNemar p"]
    for split, s in splits.items():
        title = f"{split} (n={s['n']})"
        lines.append(f"{title:<22} {s['baseline']:>{width}.1%} {s['tuned']:>{width}.1%} "
                     f"{s['tuned'] - s['baseline']:>+8.1%}  {s['mcnemarP']:.3g}")
    lines.append("")
    lines.append(f"{'rubric (mean per episode)':<28}" + "".join(f"{split + ' ' + side:>22}" for split in splits
                                                            for side in ("A", "B")))
    for rubric in RUBRICS:
        values = [splits[split]["rubrics"][side].get(rubric) for split in splits for side in ("baseline", "tuned")]
        lines.append(f"{rubric:<28}" + "".join(f"{v:>22.2f}" if v is not None else f"{'-':>22}" for v in values))
    lines.append(f"(A: {a}, B: {b})")
    return "\n".join(lines)


def run_steps(o, out: Path, manifest, say) -> None:
    """The finance-sql quickstart's steps, recorded in `manifest` as they go (see the module's docstring)."""
    # lazy: strop.control.runs pulls in sqlalchemy, which importing this module does not need
    from strop.control import projects, registry, runs
    from strop.control.reports import write_report
    from strop.evals.compare import compare, comparison_table
    from strop.evals.sql_tables import write_tables
    from strop.store import open_store
    started = time.monotonic()
    name = manifest.data["quickstartId"]
    options = env_options(o)
    for folder in ("data", "evaluations"):
        if not (out / folder).exists():
            manifest.made(out / folder).mkdir()
    demos_path = manifest.made(out / "data" / "demos.jsonl")
    made = _write_demos(demos_path, o, options)
    projects.create(name)
    manifest.set(project=name)
    demos = registry.register_dataset(f"{name}/demos", demos_path)
    manifest.set(datasets=[f"{name}/demos"])
    say(f"data: {made} demonstrations from {options['companies']} train-split compan"
        f"{'y' if options['companies'] == 1 else 'ies'} ({demos['ref']}); evaluation on unseen companies")

    baseline = _evaluate(o.baseline or o.base_model, o, options, "baseline",
                         manifest.made(out / "evaluations" / "baseline.json"), say)

    sft_path = manifest.made(out / "sft-run.json")
    sft_path.write_text(json.dumps(_descriptor(o, name, base_model=o.base_model, sft_dataset=demos["ref"],
                                               options=options), indent=1))
    sft = runs.start(sft_path)
    manifest.set(warmStartRun=sft["runId"])
    say(f"warm start: run {sft['runId']} ({o.sft_steps} supervised steps x {o.sft_batch_size} demonstrations)")
    with RunBar(sft["runId"], o.sft_steps, desc="warm start") as bar:
        finished = runs.wait(sft["runId"], on_poll=bar.update, interval=2.0)
    if finished["status"] != "succeeded":
        raise StropError(f"run {sft['runId']} {finished['status']}: {finished.get('error')}")
    manifest.set(warmStartModel=finished["modelId"])
    warm = _evaluate(finished["modelId"], o, options, "warm start",
                     manifest.made(out / "evaluations" / "warm-start.json"), say)

    rl_path = manifest.made(out / "run.json")
    rl_path.write_text(json.dumps(_descriptor(o, name, base_model=finished["modelId"], sft_dataset=None,
                                              options=options), indent=1))
    rl = runs.start(rl_path)
    manifest.set(run=rl["runId"])
    say(f"RL: run {rl['runId']} from {finished['modelId']} ({o.steps} GRPO steps x {o.batch_size} tasks x "
        f"{o.group_size} episodes)")
    with RunBar(rl["runId"], o.steps, desc="RL") as bar:
        done = runs.wait(rl["runId"], on_poll=bar.update, interval=2.0)
    if done["status"] != "succeeded":
        raise StropError(f"run {rl['runId']} {done['status']}: {done.get('error')}")
    manifest.set(model=done["modelId"])

    tuned = _evaluate(done["modelId"], o, options, "tuned", manifest.made(out / "evaluations" / "tuned.json"), say)

    short = o.base_model.rstrip("/").rsplit("/", 1)[-1]
    labels = (o.baseline[len("openai:"):].partition("@")[0] if o.baseline else f"{short} (base)",
              f"{short} (SFT+RL)")
    sides = [{"label": label, "model": ref, "evaluationId": f"{name}-{what}", "dataset": "finance-sql"}
             for label, ref, what in zip(labels, (o.baseline or o.base_model, done["modelId"]), ("baseline", "tuned"))]
    comparison = compare(comparison_items(baseline), comparison_items(tuned), a=sides[0], b=sides[1], seed=o.seed)
    splits = split_summary(baseline, tuned)
    added = split_summary(warm, tuned)  # what RL added to the warm start, on the same episodes
    comparison["splits"], comparison["warmStartSplits"] = splits, added
    manifest.set(results={"comparisonId": comparison["comparisonId"], "resultsUrl": o.results_url})
    results = write_tables(comparison, url=o.results_url or open_store(), mode="replace")
    manifest.set(results={**results, "comparisonId": comparison["comparisonId"], "resultsUrl": o.results_url})
    report = out / "report"
    if not report.exists():
        manifest.made(report)
    for own in ("report/report.html", "report/dashboard.png", "report/training.png", "report/comparison.json"):
        manifest.made(out / own)
    report_files = write_report(report, comparison=comparison, run_id=rl["runId"], extra={
        "warm start run": sft["runId"], "warm start model": finished["modelId"], "RL run": rl["runId"],
        "tuned model": done["modelId"], "tables": results["url"],
        **{f"{split} pass@1": f"{s['baseline']:.1%} -> {s['tuned']:.1%} (exact McNemar p = {s['mcnemarP']:.3g})"
           for split, s in splits.items()},
        **{f"{split} pass@1, warm start -> tuned": f"{s['baseline']:.1%} -> {s['tuned']:.1%} (exact McNemar p = "
           f"{s['mcnemarP']:.3g})" for split, s in added.items()}})
    table = (comparison_table(comparison) + "\n\n" + summary_table(splits, labels)
             + "\n\nDoes RL add to the warm start? The same episodes:\n"
             + summary_table(added, (f"{short} (SFT)", labels[1])))
    manifest.set(report=report_files, seconds=round(time.monotonic() - started, 1),
                 summary={k: v for k, v in comparison.items() if k != "items"}, table=table)
