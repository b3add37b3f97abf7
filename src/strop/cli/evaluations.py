"""`strop evaluations start|wait|get|report`: a model on a registered dataset with a grader, in the background."""

from __future__ import annotations

import argparse

from strop.cli.output import add_output_flags, emit, note


def register(nouns) -> None:
    parser = nouns.add_parser("evaluations", help="evaluate a tuned or base model on a registered dataset",
                              description="Evaluate MODEL (a modelId from a run, or a selected base model) on a "
                                          "registered dataset with a grader, in a background worker.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    start = verbs.add_parser("start", help="start an evaluation (prints its evaluationId)",
                             epilog="example:\n  EVAL=$(strop evaluations start --model \"$MODEL\" --dataset gsm8k/eval "
                                    "--grader bundle:gsm8k/scoring#reward:compute_score -o json --jq .evaluationId)",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    start.add_argument("--model", required=True, help="a modelId (model-...) or a selected base model id")
    start.add_argument("--dataset", required=True, help="registered dataset: NAME or NAME@VERSION")
    start.add_argument("--grader", required=True, help="bundle:NAME[@VERSION]#MODULE:FUNCTION or builtin:gsm8k")
    start.add_argument("--samples", type=int, default=1, help="samples per problem; > 1 reports pass@k (default: 1, greedy)")
    start.add_argument("--max-tokens", type=int, default=256, help="most tokens per response (default: %(default)s)")
    add_output_flags(start)
    start.set_defaults(handler=_start)

    wait = verbs.add_parser("wait", help="wait until the evaluation finishes",
                            epilog='example:\n  strop evaluations wait "$EVAL" --exit-status',
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    wait.add_argument("evaluation", metavar="EVAL")
    wait.add_argument("--exit-status", action="store_true", help="exit 0 only if it succeeded")
    wait.add_argument("--timeout", type=float, help="give up after this many seconds")
    add_output_flags(wait)
    wait.set_defaults(handler=_wait)

    get = verbs.add_parser("get", help="show an evaluation's status", epilog='example:\n  strop evaluations get "$EVAL" --jq .status',
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    get.add_argument("evaluation", metavar="EVAL")
    add_output_flags(get)
    get.set_defaults(handler=_get)

    report = verbs.add_parser("report", help="mean score, n, accuracy, parse failures (-o json adds per-item rows)",
                              epilog='example:\n  strop evaluations report "$EVAL" -o json --jq \'.items[] | select(.correct | not)\'',
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_argument("evaluation", metavar="EVAL")
    add_output_flags(report)
    report.set_defaults(handler=_report)


def _show(r: dict) -> str:
    s = r.get("summary") or {}
    lines = [f"evaluation: {r['evaluationId']}  status: {r['status']}", f"model: {r['model']}",
             f"dataset: {r['dataset']}  grader: {r['grader']}"]
    if "n" in s:
        lines.append(f"n: {s['n']}  mean score: {s['meanScore']:.4f}  accuracy: {s['accuracy']:.1%}  "
                     f"parse failures: {s['parseFailures']}  grader errors: {s['graderErrors']}")
        lines.extend(f"{k}: {v:.1%}" for k, v in s.items() if k.startswith("pass@"))
    if r.get("error"):
        lines.append(f"error: {r['error']}")
    return "\n".join(lines)


def _start(args) -> int:
    from strop.control import evaluations
    result = evaluations.start(args.model, args.dataset, args.grader, samples=args.samples, max_tokens=args.max_tokens)
    emit(args, result, lambda r: r["evaluationId"])
    return 0


def _wait(args) -> int:
    from strop.control import evaluations
    seen = set()

    def show(info):
        if info["status"] not in seen:
            seen.add(info["status"])
            note(f"{info['evaluationId']}: {info['status']}")
    info = evaluations.wait(args.evaluation, timeout=args.timeout, on_poll=show)
    emit(args, info, _show)
    return 0 if (info["status"] == "succeeded" or not args.exit_status) else 1


def _get(args) -> int:
    from strop.control import evaluations
    emit(args, evaluations.get(args.evaluation), _show)
    return 0


def _report(args) -> int:
    from strop.control import evaluations
    emit(args, evaluations.report(args.evaluation, items=args.output != "table" or bool(args.jq)), _show)
    return 0
