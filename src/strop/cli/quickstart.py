"""`strop quickstart` (seed 000 end to end) and `strop cleanup` (remove what a quickstart made)."""

from __future__ import annotations

import argparse

from strop.cli.output import add_output_flags, emit


def register(nouns) -> None:
    # lazy: strop.control.quickstart pulls in pydantic, which importing this module does not need
    from strop.control.quickstart import QuickstartOptions
    d = QuickstartOptions()
    parser = nouns.add_parser(
        "quickstart", help="baseline, GRPO fine-tune, evaluation, judge, statistics, tables, dashboard: one command",
        description="Can targeted RL close the gap between a small model and a big one? This answers it end to "
                    "end: evaluate the baseline (an OpenAI-compatible endpoint, else the untuned base model), "
                    "fine-tune the base model with GRPO + LoRA, evaluate it on the same items, judge both with an "
                    "LLM, compare them (accuracy, paired bootstrap 95% interval, exact McNemar, judge scores, "
                    "win/tie/loss), write the SQL tables strop_eval_comparison and strop_judge_scores, and a "
                    "dashboard and HTML report. The defaults took 11-12 minutes on 2 CPU cores (benchmarks/quickstart.py).",
        epilog="examples:\n  strop quickstart\n"
               "  strop quickstart --baseline openai:llama3.3-70b@http://127.0.0.1:8000/v1 --judge "
               "openai:mistral-large@http://127.0.0.1:8001/v1\n"
               "  strop quickstart --dataset gsm8k --base-model Qwen/Qwen3-0.6B --steps 50   # on a GPU\n"
               "  strop quickstart --base-model strop/tiny-random --steps 2 --eval-n 8        # a smoke test\n"
               "  strop cleanup --out quickstart-out",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-model", default=d.base_model, help="the small model to fine-tune (default: %(default)s)")
    parser.add_argument("--dataset", default=d.dataset,
                        help="synthetic (bare addition, learnable on a CPU), synthetic:LEVEL, or gsm8k from the hub "
                             "(default: %(default)s)")
    parser.add_argument("--data-file", help="a local GSM8K-style .jsonl/.parquet (the last --eval-n rows are held "
                                            "out), or a folder with train.jsonl and test.jsonl")
    parser.add_argument("--steps", type=int, default=d.steps, help="GRPO steps (default: %(default)s)")
    parser.add_argument("--eval-n", type=int, default=d.eval_n, help="evaluation items (default: %(default)s)")
    parser.add_argument("--baseline", help="openai:NAME@URL of the big model to beat (default: the untuned base model)")
    parser.add_argument("--judge", default=d.judge,
                        help="openai:NAME@URL, local (the --base-model itself, untuned, grammar-constrained), a "
                             "model id, or none (default: %(default)s)")
    parser.add_argument("--out", default=d.out, help="folder for the report, data and quickstart.json (default: %(default)s)")
    parser.add_argument("--results-url", help="SQLAlchemy URL for the result tables (default: the strop store)")
    parser.add_argument("--group-size", type=int, default=d.group_size, help="samples per prompt (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="prompts per step (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens,
                        help="most tokens per completion, in training and evaluation (default: %(default)s)")
    parser.add_argument("--learning-rate", type=float, default=d.learning_rate, help="(default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=d.concurrency,
                        help="requests in flight at once to --baseline/--judge endpoints (default: %(default)s)")
    parser.add_argument("--max-retries", type=int, default=d.max_retries,
                        help="retries, with exponential backoff, of a failed endpoint request (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=d.request_timeout, metavar="SECONDS", dest="request_timeout",
                        help="seconds each endpoint request may take (default: %(default)s)")
    add_output_flags(parser)
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
    options = QuickstartOptions(
        base_model=args.base_model, dataset=args.dataset, data_file=args.data_file, steps=args.steps,
        eval_n=args.eval_n, baseline=args.baseline, judge=None if args.judge == "none" else args.judge, out=args.out,
        results_url=args.results_url, group_size=args.group_size, batch_size=args.batch_size,
        max_tokens=args.max_tokens, learning_rate=args.learning_rate, concurrency=args.concurrency,
        max_retries=args.max_retries, request_timeout=args.request_timeout)
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
             f"  evaluations: baseline {m['evaluations']['baseline']}, tuned {m['evaluations']['tuned']}",
             f"  remove it all: strop cleanup --out {m['out']}"]
    errors = {side: m["summary"][side].get("requestErrors") or 0 for side in ("a", "b")}
    if any(errors.values()):
        lines.insert(1, f"warning: {errors['a']} baseline and {errors['b']} tuned requests failed; failed requests "
                        "count as wrong, so the comparison understates the side that failed")
    return "\n".join(lines)


def _cleanup(args) -> int:
    # lazy: strop.control.quickstart pulls in pydantic, which importing this module does not need
    from strop.control.quickstart import cleanup
    removed = cleanup(args.out)
    emit(args, removed, lambda r: "\n".join(f"{k}: {', '.join(map(str, v)) or '-'}" for k, v in r.items()))
    return 0
