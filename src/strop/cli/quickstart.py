"""`strop quickstart` (the GSM8K story end to end) and `strop cleanup` (remove what a quickstart made)."""

from __future__ import annotations

import argparse
import dataclasses

from strop.cli.output import add_output_flags, add_sampler_flag, emit


def register(nouns) -> None:
    # lazy: strop.control.quickstart pulls in pydantic, which importing this module does not need
    from strop.control.quickstart import TASK_DEFAULTS, TASKS, TRAINING, QuickstartOptions
    from strop.rl.config import GRPOConfig
    setting_help = GRPOConfig.help()
    d = QuickstartOptions()
    parser = nouns.add_parser(
        "quickstart", help="baseline, fine-tune, evaluation, statistics, tables, dashboard: one command",
        description="Can targeted RL close the gap between a small model and a big one? This answers it end to "
                    "end, for one of two tasks.\n\n"
                    "--task gsm8k: evaluate the baseline (an OpenAI-compatible endpoint, else the untuned "
                    "base model), fine-tune the base model with GRPO + LoRA, evaluate it on the same items, judge "
                    "both with an LLM, compare them (accuracy, paired bootstrap 95% interval, exact McNemar, judge "
                    "scores, win/tie/loss), write the SQL tables strop_eval_comparison and strop_judge_scores, and a "
                    "dashboard and HTML report. The defaults took 11-12 minutes on 2 CPU cores.\n\n"
                    "--task finance-sql: a model answers questions about a company's financial statements "
                    "by querying its SQLite database with tools (list_tables, describe_table, run_sql, "
                    "submit_answer). Evaluate the baseline on unseen companies (single-table and multi-table "
                    "questions; an endpoint gets native tool calls), warm-start the base model with supervised "
                    "fine-tuning on scripted demonstrations and evaluate it, continue with GRPO in the environment "
                    "(groups branched at the first query, judged on correctness), evaluate the tuned model on the "
                    "same episodes, compare baseline and warm start each with the tuned model (pass@1 per split, "
                    "exact McNemar) with the behaviour rubrics (valid tool calls, tables listed first, invented "
                    "names, recoveries), write the table strop_eval_comparison and the report. Its episodes are "
                    "long (~1,500 tokens): the defaults are sized to about half an hour on 2 CPU cores; a GPU is "
                    "where this task is meant to run at scale.",
        epilog="examples:\n  strop quickstart\n"
               "  strop quickstart --baseline openai:llama3.3-70b@http://127.0.0.1:8000/v1 --judge "
               "openai:mistral-large@http://127.0.0.1:8001/v1\n"
               "  strop quickstart --dataset gsm8k --base-model Qwen/Qwen3-0.6B --steps 50   # on a GPU\n"
               "  strop quickstart --task finance-sql\n"
               "  strop quickstart --task finance-sql --baseline openai:gpt-4o@https://api.openai.com/v1\n"
               "  strop quickstart --base-model strop/tiny-random --steps 2 --eval-n 8        # a smoke test\n"
               "  strop cleanup --out quickstart-out",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    finance = TASK_DEFAULTS["finance-sql"]

    def both(option: str) -> str:
        return f"(default: {getattr(d, option)}; with --task finance-sql {finance.get(option, getattr(d, option))})"

    def training(option: str) -> str:
        """A training option's help: its setting's (strop.rl.settings), and quickstart's own defaults."""
        return f"{setting_help[TRAINING[option]]} {both(option)}"

    parser.add_argument("--task", choices=TASKS, default="gsm8k",
                        help="gsm8k: math word problems, graded exactly and by a judge; finance-sql: "
                             "tool use over a company's SQL database, a supervised warm start then GRPO "
                             "(default: %(default)s)")
    parser.add_argument("--base-model", default=d.base_model, help=f"{setting_help['base_model']} (default: "
                                                                   "%(default)s)")
    parser.add_argument("--dataset", default=d.dataset,
                        help="gsm8k task: synthetic (bare addition, learnable on a CPU), synthetic:LEVEL, or gsm8k "
                             "from the hub (default: %(default)s)")
    parser.add_argument("--data-file", help="gsm8k task: a local GSM8K-style .jsonl/.parquet (the last --eval-n rows "
                                            "are held out), or a folder with train.jsonl and test.jsonl")
    parser.add_argument("--steps", type=int, help=f"GRPO steps {both('steps')}")
    parser.add_argument("--eval-n", type=int, help=f"evaluation items; with finance-sql, episodes per split "
                                                   f"{both('eval_n')}")
    parser.add_argument("--baseline", help="openai:NAME@URL of the big model to beat (default: the untuned base model)")
    parser.add_argument("--judge", help="gsm8k task: openai:NAME@URL, local (the --base-model itself, untuned, "
                                        "grammar-constrained), a model id, or none (default: local)")
    parser.add_argument("--demos", type=int, help=f"finance-sql: demonstrations for the warm start (default: {d.demos})")
    parser.add_argument("--sft-steps", type=int,
                        help=f"finance-sql: supervised steps of --sft-batch-size demonstrations (default: "
                             f"{finance.get('sft_steps', d.sft_steps)})")
    parser.add_argument("--sft-batch-size", type=int,
                        help=f"finance-sql: demonstrations per supervised step (default: {d.sft_batch_size})")
    parser.add_argument("--sft-learning-rate", type=float,
                        help=f"finance-sql: the warm start's learning rate (default: {d.sft_learning_rate})")
    parser.add_argument("--out", default=d.out, help="folder for the report, data and quickstart.json (default: %(default)s)")
    parser.add_argument("--results-url", help="SQLAlchemy URL for the result tables (default: the strop store)")
    parser.add_argument("--group-size", type=int, help=training("group_size"))
    parser.add_argument("--batch-size", type=int, help=training("batch_size"))
    parser.add_argument("--max-tokens", type=int, help=training("max_tokens") + "; per turn with finance-sql, and "
                                                                                "in the evaluations too")
    parser.add_argument("--learning-rate", type=float, help=training("learning_rate"))
    parser.add_argument("--concurrency", type=int, default=d.concurrency,
                        help="requests in flight at once to --baseline/--judge endpoints (default: %(default)s)")
    parser.add_argument("--max-retries", type=int, default=d.max_retries,
                        help="retries, with exponential backoff, of a failed endpoint request (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=d.request_timeout, metavar="SECONDS", dest="request_timeout",
                        help="seconds each endpoint request may take (default: %(default)s)")
    add_output_flags(parser)
    add_sampler_flag(parser)
    parser.set_defaults(handler=_quickstart)

    clean = nouns.add_parser(
        "cleanup", help="remove what a quickstart made (tables, run, model, evaluations, datasets, its files)",
        description="Remove exactly what the quickstart in --out made, as its quickstart.json lists it: its rows of "
                    "the result tables (a table is dropped only when nothing else is left in it), its evaluations, "
                    "tuned model and its adapter, run, project, datasets, and the files it wrote under --out; the "
                    "--out folder goes only if quickstart made it and nothing else is left in it. Nothing else is "
                    "touched. Also the way to clear a quickstart that failed part-way before running it again.",
        epilog="example:\n  strop cleanup --out quickstart-out", formatter_class=argparse.RawDescriptionHelpFormatter)
    clean.add_argument("--out", default=d.out, help="the quickstart's folder (default: %(default)s)")
    add_output_flags(clean)
    clean.set_defaults(handler=_cleanup)


def _quickstart(args) -> int:
    # lazy: strop.control.quickstart pulls in pydantic, which importing this module does not need
    from strop.control.quickstart import QuickstartOptions, run_quickstart
    options = QuickstartOptions.for_task(
        args.task, base_model=args.base_model, dataset=args.dataset, data_file=args.data_file, steps=args.steps,
        eval_n=args.eval_n, baseline=args.baseline, out=args.out, results_url=args.results_url,
        group_size=args.group_size, batch_size=args.batch_size, max_tokens=args.max_tokens,
        learning_rate=args.learning_rate, concurrency=args.concurrency, max_retries=args.max_retries,
        request_timeout=args.request_timeout, demos=args.demos, sft_steps=args.sft_steps,
        sft_batch_size=args.sft_batch_size, sft_learning_rate=args.sft_learning_rate)
    if args.judge is not None:  # `none` turns the judge off, which None in for_task cannot say
        options = dataclasses.replace(options, judge=None if args.judge == "none" else args.judge)
    manifest = run_quickstart(options)
    emit(args, manifest, _show)
    return 0


def _show(m: dict) -> str:
    lines = [m["table"], "", f"finished in {m['seconds']:.0f} s. Where everything went:",
             f"  report:      {m['report']['html']}", f"  dashboard:   {m['report'].get('dashboard')}",
             f"  curves:      {m['report'].get('training')}",
             f"  tables:      {', '.join(m['results']['tables'])} at {m['results']['url']}",
             f"  run:         {m['run']}  (strop runs metrics {m['run']}; strop runs tensorboard {m['run']})",
             f"  model:       {m['model']}  (strop serve {m['model']})",
             (f"  evaluations: baseline {m['evaluations']['baseline']}, tuned {m['evaluations']['tuned']}"
              if m["evaluations"] else f"  evaluations: {m['out']}/evaluations/baseline.json and tuned.json"),
             f"  remove it all: strop cleanup --out {m['out']}"]
    if m.get("warmStartRun"):
        lines.insert(lines.index("") + 5, f"  warm start:  run {m['warmStartRun']} -> model {m.get('warmStartModel')}  "
                                          f"(strop runs get {m['run']} shows the lineage)")
    errors = {side: m["summary"][side].get("requestErrors") or 0 for side in ("a", "b")}
    if any(errors.values()):
        lines.insert(1, f"warning: {errors['a']} baseline and {errors['b']} tuned requests failed; failed requests "
                        "count as wrong, so the comparison understates the side that failed")
    return "\n".join(lines)


def _cleanup(args) -> int:
    # lazy: strop.control.quickstart pulls in pydantic, which importing this module does not need
    from strop.control.quickstart_cleanup import cleanup
    removed = cleanup(args.out)
    emit(args, removed, lambda r: "\n".join(f"{k}: {', '.join(map(str, v)) or '-'}" for k, v in r.items()))
    return 0
