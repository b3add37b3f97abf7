"""`strop evaluations start|wait|get|report`: a model on a registered dataset with a grader, in the background."""

from __future__ import annotations

import argparse

from strop.cli.output import add_output_flags, add_ray_flags, add_sampler_flag, emit, note


def register(nouns) -> None:
    parser = nouns.add_parser("evaluations", help="evaluate a tuned or base model on a registered dataset",
                              description="Evaluate MODEL (a modelId from a run, or a selected base model) on a "
                                          "registered dataset with a grader, in a background worker.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    start = verbs.add_parser("start", help="start an evaluation (prints its evaluationId)",
                             epilog="examples:\n  EVAL=$(strop evaluations start --model \"$MODEL\" --dataset gsm8k/eval "
                                    "--grader bundle:gsm8k/scoring#reward:compute_score -o json --jq .evaluationId)\n"
                                    "  strop evaluations start --model \"$MODEL\" --config eval.yaml --judge local",
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    start.add_argument("--model", help="a modelId (model-...), a selected base model id, or openai:NAME@URL")
    start.add_argument("--dataset", help="registered dataset: NAME or NAME@VERSION")
    start.add_argument("--grader", help="bundle:NAME[@VERSION]#MODULE:FUNCTION or builtin:gsm8k (default: builtin:gsm8k)")
    start.add_argument("--config", metavar="FILE", help="evaluation config (YAML: dataset, grader, judge, metrics; "
                                                         "see `strop.evals.config`); flags given here win over it")
    start.add_argument("--samples", type=int, help="samples per problem; > 1 reports pass@k (default: 1, greedy)")
    start.add_argument("--max-tokens", type=int, help="most tokens per response (default: 256)")
    start.add_argument("--limit", type=int, help="evaluate only the first N items")
    start.add_argument("--judge", help="also score each response with an LLM judge: openai:NAME@URL, local "
                                       "(the default local model) or a model id; the default rubric (answer correctness and reasoning quality) unless --config "
                                       "names metrics")
    start.add_argument("--api-key-env", help="environment variable holding the API key of openai:NAME@URL endpoints "
                                             "(model and judge; default: OPENAI_API_KEY)")
    start.add_argument("--judge-retries", type=int, help="ask again this many times after a bad verdict (default: 2)")
    start.add_argument("--concurrency", type=int, help="requests in flight at once to openai:NAME@URL endpoints "
                                                       "(model and judge; default: 4)")
    start.add_argument("--max-retries", type=int, help="retries, with exponential backoff, of a failed endpoint "
                                                       "request (default: 3)")
    start.add_argument("--timeout", type=float, metavar="SECONDS", dest="request_timeout",
                       help="seconds each endpoint request may take (default: 120)")
    add_sampler_flag(start)
    add_ray_flags(start)
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
        if s.get("requestErrors"):
            lines.append(f"request errors: {s['requestErrors']} of {s['n']} requests failed and count as wrong; "
                         "the first: " + (s.get("requestErrorExamples") or ["?"])[0])
        lines.extend(f"{k}: {v:.1%}" for k, v in s.items() if k.startswith("pass@"))
    judge = s.get("judge")
    if judge:
        means = "  ".join(f"{k} {v:.2f}" for k, v in (judge.get("means") or {}).items())
        kappa = judge.get("kappa")
        lines.append(f"judge {judge['model']}: {means}  failures: {judge['failures']}/{judge['judged'] + judge['failures']}"
                     + (f"  kappa vs exact: {kappa:.2f}" if kappa is not None else ""))
    if r.get("error"):
        lines.append(f"error: {r['error']}")
    return "\n".join(lines)


def _start(args) -> int:
    # lazy: strop.control.evaluations pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import evaluations
    from strop.evals.config import EvalConfig, load_eval_config
    config = load_eval_config(args.config) if args.config else EvalConfig()
    kwargs = config.start_kwargs()
    for key, value in (("dataset", args.dataset), ("grader", args.grader), ("samples", args.samples),
                       ("max_tokens", args.max_tokens), ("limit", args.limit), ("judge", args.judge),
                       ("judge_retries", args.judge_retries), ("api_key_env", args.api_key_env),
                       ("concurrency", args.concurrency), ("max_retries", args.max_retries),
                       ("request_timeout", args.request_timeout)):
        if value is not None:
            kwargs[key] = value
    model = args.model or config.model
    if not model:
        raise evaluations.EvaluationError("give --model (or model: in --config)")
    result = evaluations.start(model, **kwargs)
    emit(args, result, lambda r: r["evaluationId"])
    return 0


def _wait(args) -> int:
    # lazy: strop.control.evaluations pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import evaluations
    from strop.control.progress import EvalBar
    seen = set()
    with EvalBar() as bar:
        def show(info):
            if info["status"] not in seen:
                seen.add(info["status"])
                note(f"{info['evaluationId']}: {info['status']}")
            bar.update(info)
        info = evaluations.wait(args.evaluation, timeout=args.timeout, on_poll=show)
    emit(args, info, _show)
    return 0 if (info["status"] == "succeeded" or not args.exit_status) else 1


def _get(args) -> int:
    # lazy: strop.control.evaluations pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import evaluations
    emit(args, evaluations.get(args.evaluation), _show)
    return 0


def _report(args) -> int:
    # lazy: strop.control.evaluations pulls in sqlalchemy, pydantic, which importing this module does not need
    from strop.control import evaluations
    emit(args, evaluations.report(args.evaluation, items=args.output != "table" or bool(args.jq)), _show)
    return 0
