"""Two evaluations of the same items, side by side: is B better than A, by how much, and is it real?

    comparison = compare(items_a, items_b, a=side_a, b=side_b)       # A: the baseline, B: the candidate
    # two stored evaluations: strop.control.evaluations.compare_evaluations("eval-1a2b", "eval-3c4d")
    comparison["accuracy"]   # {"a": .30, "b": .44, "delta": .14, "ci95": [.02, .26]}
    comparison["mcnemar"]    # {"p": .031, "aOnly": 3, "bOnly": 10}
    print(comparison_table(comparison))                                 # the walkthrough's table, with the statistics

`compare(items_a, items_b, ...)` does the same on item dicts (as `evaluations.report(..., items=True)` gives
them), so it needs no store. The judge part appears when both evaluations were judged on the same metrics:
means per metric and combined, deltas, failures (never scored), agreement with exact grading (kappa), and
win/tie/loss of B against A by combined score over the items both verdicts exist for.
"""

from __future__ import annotations

import hashlib

from strop.errors import StropError
from strop.evals.stats import discordant, mcnemar_exact, paired_bootstrap_ci, win_tie_loss


class ComparisonError(StropError):
    """Two evaluations that cannot be compared (different items, unfinished)."""


def default_label(model_ref: str) -> str:
    if model_ref.startswith("openai:"):
        return model_ref[len("openai:"):].partition("@")[0]
    return model_ref.rstrip("/").rsplit("/", 1)[-1]


def compare(items_a: list[dict], items_b: list[dict], *, a: dict, b: dict, judge_a: dict | None = None,
            judge_b: dict | None = None, seed: int = 0) -> dict:
    """The comparison of two item lists on the same questions; `a`/`b` describe each side (label, model, ...)."""
    if len(items_a) != len(items_b) or any(x["question"] != y["question"] for x, y in zip(items_a, items_b)):
        raise ComparisonError(f"{a.get('evaluationId', 'A')} and {b.get('evaluationId', 'B')} are not on the same items "
                              f"({len(items_a)} and {len(items_b)} items); evaluate both on one dataset and limit")
    if not items_a:
        raise ComparisonError("no items to compare")
    correct_a = [bool(i["correct"]) for i in items_a]
    correct_b = [bool(i["correct"]) for i in items_b]
    n = len(items_a)
    acc_a, acc_b = sum(correct_a) / n, sum(correct_b) / n
    a_only, b_only = discordant(correct_a, correct_b)
    low, high = paired_bootstrap_ci([float(x) for x in correct_a], [float(x) for x in correct_b], seed=seed)
    items = [{"index": x["index"], "question": x["question"], "gold": x["gold"],
              "a": {"answer": x["extracted"], "correct": x["correct"], "response": x["response"],
                    "judge": _scores(x.get("judge"))},
              "b": {"answer": y["extracted"], "correct": y["correct"], "response": y["response"],
                    "judge": _scores(y.get("judge"))}}
             for x, y in zip(items_a, items_b)]
    comparison_id = "cmp-" + hashlib.sha256(f"{a.get('evaluationId')}|{b.get('evaluationId')}".encode()).hexdigest()[:8]
    return {"comparisonId": comparison_id, "a": a, "b": b, "n": n,
            "accuracy": {"a": acc_a, "b": acc_b, "delta": acc_b - acc_a, "ci95": [low, high]},
            "mcnemar": {"p": mcnemar_exact(a_only, b_only), "aOnly": a_only, "bOnly": b_only},
            "judge": _judge_part(items, judge_a, judge_b), "items": items}


def _scores(verdict: dict | None) -> dict | None:
    return (verdict or {}).get("scores")


def _judge_part(items: list[dict], judge_a: dict | None, judge_b: dict | None) -> dict | None:
    if not judge_a or not judge_b:
        return None
    if judge_a.get("metrics") != judge_b.get("metrics"):
        return None  # judged on different rubrics: their scores do not compare
    metrics = judge_a["metrics"]
    means = {}
    for side, summary in (("a", judge_a), ("b", judge_b)):
        means[side] = dict(summary.get("means") or {})
    means["delta"] = {k: means["b"][k] - means["a"][k] for k in means["a"] if k in means["b"]}
    both = [(sum(i["a"]["judge"].values()), sum(i["b"]["judge"].values())) for i in items
            if i["a"]["judge"] is not None and i["b"]["judge"] is not None]
    wtl = win_tie_loss([x for x, _ in both], [y for _, y in both]) if both else {"win": 0, "tie": 0, "loss": 0}
    return {"metrics": metrics, "ranges": judge_a.get("ranges", {}), "means": means,
            "failures": {"a": judge_a.get("failures", 0), "b": judge_b.get("failures", 0)},
            "kappa": {"a": judge_a.get("kappa"), "b": judge_b.get("kappa")},
            "models": {"a": judge_a.get("model"), "b": judge_b.get("model")},
            "winTieLoss": {"bWins": wtl["win"], "ties": wtl["tie"], "aWins": wtl["loss"]}}


def comparison_table(c: dict) -> str:
    """Seed 000's comparison table, with the statistics that say whether the difference is real."""
    a, b = c["a"]["label"], c["b"]["label"]
    width = max(12, len(a), len(b))
    lines = [f"{'Metric':<25} {a:>{width}} {b:>{width}} {'Delta':>8}"]
    judge = c.get("judge")
    if judge:
        for metric in judge["metrics"]:
            high = judge["ranges"].get(metric, [0, 5])[1]
            ma, mb = judge["means"]["a"].get(metric), judge["means"]["b"].get(metric)
            if ma is not None and mb is not None:
                lines.append(f"{_title(metric) + f' /{high}':<25} {ma:>{width}.2f} {mb:>{width}.2f} {mb - ma:>+8.2f}")
    acc = c["accuracy"]
    lines.append(f"{'Exact Match Accuracy':<25} {acc['a']:>{width}.1%} {acc['b']:>{width}.1%} {acc['delta']:>+8.1%}")
    lines.append("")
    lines.append(f"n = {c['n']} paired items; delta 95% CI (paired bootstrap): [{acc['ci95'][0]:+.1%}, {acc['ci95'][1]:+.1%}]")
    m = c["mcnemar"]
    lines.append(f"exact McNemar p = {m['p']:.3g} (right only under {a}: {m['aOnly']}, only under {b}: {m['bOnly']})"
                 + ("  -> significant at 0.05" if m["p"] < 0.05 else "  -> not significant at 0.05"))
    errors = {side: c[side].get("requestErrors") or 0 for side in ("a", "b")}
    if any(errors.values()):
        lines.append(f"warning: request errors: {a} {errors['a']}, {b} {errors['b']} of {c['n']}; failed requests "
                     "count as wrong, so the difference may be the endpoint's failures, not the model's")
    if judge:
        w = judge["winTieLoss"]
        lines.append(f"judge head-to-head by combined score: {b} wins {w['bWins']}, ties {w['ties']}, {a} wins {w['aWins']}")
        failures, kappa = judge["failures"], judge["kappa"]
        lines.append(f"judge failures (not scored): {a} {failures['a']}, {b} {failures['b']}; kappa vs exact: "
                     f"{a} {_fmt(kappa['a'])}, {b} {_fmt(kappa['b'])}")
    return "\n".join(lines)


def _title(metric: str) -> str:
    return metric.replace("_", " ").title()


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"
