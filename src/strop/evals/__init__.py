"""Evaluation: run a model over rows with a grader, per-item records, a summary (accuracy, pass@k).

    from strop.evals import evaluate_local
    result = evaluate_local("strop/tiny-random", rows, "builtin:gsm8k", max_tokens=16)
"""

from strop.evals.runner import EvalItem, EvalResult, evaluate_local, evaluate_sampler, pass_at_k, summarize

__all__ = ["EvalItem", "EvalResult", "evaluate_local", "evaluate_sampler", "pass_at_k", "summarize"]
