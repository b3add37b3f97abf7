"""`strop compare EVAL_A EVAL_B` and `strop report`: the statistics, the SQL tables, the dashboard."""

from __future__ import annotations

import argparse

from strop.cli.output import add_output_flags, emit, note
from strop.errors import StropError


def register(nouns) -> None:
    compare = nouns.add_parser(
        "compare", help="compare two evaluations of the same items: accuracy, CI, McNemar, judge, tables",
        description="Compare two finished evaluations on the same items (A: the baseline, B: the candidate): "
                    "accuracy of each, the delta with its paired-bootstrap 95% interval, the exact McNemar p-value "
                    "with the discordant counts, judge means and deltas, win/tie/loss by combined judge score. "
                    "Writes the tables strop_eval_comparison and strop_judge_scores (to the strop store unless "
                    "--results-url names another database).",
        epilog='example:\n  strop compare "$BASELINE_EVAL" "$TUNED_EVAL" --results-url sqlite:///results.db --report out/',
        formatter_class=argparse.RawDescriptionHelpFormatter)
    compare.add_argument("eval_a", metavar="EVAL_A", help="the baseline evaluation")
    compare.add_argument("eval_b", metavar="EVAL_B", help="the candidate evaluation")
    compare.add_argument("--labels", metavar="A,B", help="names for the two models in tables and charts")
    compare.add_argument("--results-url", help="SQLAlchemy URL for the result tables (default: the strop store)")
    compare.add_argument("--mode", choices=("overwrite", "append", "replace"), default="overwrite",
                         help="overwrite: replace the tables; append: add this comparison's rows; replace: swap "
                              "only this comparison's earlier rows for new ones (default: %(default)s)")
    compare.add_argument("--no-tables", action="store_true", help="print the comparison only; write no tables")
    compare.add_argument("--report", metavar="DIR", help="also write the dashboard PNG and the HTML report here")
    compare.add_argument("--run", help="the run that made B, for training curves in the report")
    add_output_flags(compare)
    compare.set_defaults(handler=_compare)

    report = nouns.add_parser(
        "report", help="write the dashboard PNG and a self-contained HTML report",
        description="Write a report folder: dashboard.png (seven panels comparing two evaluations), training.png "
                    "(a run's reward per term, zero-variance groups, KL, entropy, lengths) and report.html holding "
                    "both, self-contained.",
        epilog='examples:\n  strop report --compare "$BASELINE_EVAL" "$TUNED_EVAL" --run "$RUN" --out report/\n'
               '  strop report --run "$RUN" --out curves/',
        formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_argument("--compare", nargs=2, metavar=("EVAL_A", "EVAL_B"), help="two evaluations to compare")
    report.add_argument("--labels", metavar="A,B", help="names for the two models")
    report.add_argument("--run", help="a run whose training curves to include")
    report.add_argument("--out", required=True, metavar="DIR", help="folder to write into (made if missing)")
    add_output_flags(report)
    report.set_defaults(handler=_report)


def _labels(text: str | None) -> tuple[str, str] | None:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(parts):
        raise StropError(f"--labels takes two names separated by a comma, e.g. baseline,tuned; got {text!r}")
    return parts[0], parts[1]


def _compare(args) -> int:
    # lazy: strop.control.reports pulls in pydantic, which importing this module does not need
    from strop.control.reports import save_tables, write_report
    from strop.control.evaluations import compare_evaluations
    from strop.evals.compare import comparison_table
    comparison = compare_evaluations(args.eval_a, args.eval_b, labels=_labels(args.labels))
    result = {key: value for key, value in comparison.items() if key != "items"}
    errors = {comparison[side]["label"]: comparison[side].get("requestErrors") or 0 for side in ("a", "b")}
    if any(errors.values()):
        note("warning: failed requests, each counted as wrong: "
             + ", ".join(f"{label} {n} of {comparison['n']}" for label, n in errors.items()))
    if not args.no_tables:
        result["tables"] = save_tables(comparison, url=args.results_url, mode=args.mode)
        note(f"tables: {', '.join(result['tables']['tables'])} at {result['tables']['url']} ({args.mode})")
    if args.report:
        result["report"] = write_report(args.report, comparison=comparison, run_id=args.run)
        note(f"report: {result['report']['html']}")
    emit(args, result, lambda r: comparison_table(comparison))
    return 0


def _report(args) -> int:
    # lazy: strop.control.reports pulls in pydantic, which importing this module does not need
    from strop.control.reports import write_report
    from strop.errors import StropError
    if not args.compare and not args.run:
        raise StropError("strop report needs --compare EVAL_A EVAL_B, --run RUN, or both")
    comparison = None
    if args.compare:
        # lazy: strop.control.evaluations pulls in sqlalchemy, pydantic, which importing this module does not need
        from strop.control.evaluations import compare_evaluations
        comparison = compare_evaluations(*args.compare, labels=_labels(args.labels))
    files = write_report(args.out, comparison=comparison, run_id=args.run)
    emit(args, files, lambda f: "\n".join(f"{k}: {v}" for k, v in f.items()))
    return 0
