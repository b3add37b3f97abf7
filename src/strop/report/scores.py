"""The numbers a comparison report shows, read out of a comparison dict: per-item scores for the judge panels
and the rows of the summary table. Pure functions, no drawing, no I/O.

    from strop.report.scores import score_view, summary_rows
    view = score_view(comparison)        # judge scores per item; exact match (0/1) when no judge was run
    view.source, view.combined("b")      # "judge", [7.0, 3.0, ...]
    for statistic, a, b, delta in summary_rows(comparison, view): ...

A comparison dict pairs two models (`a`, usually the baseline, and `b`) on the same items: exact-match
accuracy with a bootstrap interval, McNemar's test on the discordant items, and optionally an LLM judge's
scores per metric. An item's "combined" score is the sum of its judge metric scores; an item where either
side's verdict failed is left out of every judge panel (it was not scored, so it cannot be compared).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from strop.errors import StropError

JUDGE = "judge"
NO_JUDGE = "exact match; no judge"
EXACT = "exact_match"
_REQUIRED = ("a", "b", "n", "accuracy", "mcnemar", "items")


@dataclass(frozen=True)
class ItemScores:
    """One item scored on both sides: metric name -> score, plus "combined"."""
    index: int
    a: dict[str, float]
    b: dict[str, float]


@dataclass(frozen=True)
class ScoreView:
    """What the judge panels draw. Without a judge the only metric is `exact_match` (0 or 1) and
    combined equals it; `source` says which (JUDGE or NO_JUDGE) so titles can tell the reader."""
    source: str
    metrics: tuple[str, ...]
    ranges: dict[str, tuple[float, float]]   # per metric and "combined" (the sum of the metric ranges)
    items: tuple[ItemScores, ...]            # only items scored on both sides
    means: dict[str, dict[str, float]]       # {"a": {metric: mean, "combined": ...}, "b": ..., "delta": ...}
    wins: dict[str, int]                     # {"bWins", "ties", "aWins"} by combined score per item

    def combined(self, side: str) -> list[float]:
        return [getattr(item, side)["combined"] for item in self.items]

    def scores(self, side: str, metric: str) -> list[float]:
        return [getattr(item, side)[metric] for item in self.items]


def check_comparison(comparison: dict) -> None:
    """Raise a StropError naming every top-level key a comparison dict lacks."""
    if not isinstance(comparison, dict):
        raise StropError(f"a comparison must be a dict (as the comparison step writes it), got "
                         f"{type(comparison).__name__}")
    missing = [key for key in _REQUIRED if key not in comparison]
    if missing:
        raise StropError(f"comparison {comparison.get('comparisonId', '(no comparisonId)')} lacks "
                         f"{', '.join(missing)}; it needs {', '.join(_REQUIRED)} (and 'judge', which may be None)")


def labels(comparison: dict) -> tuple[str, str]:
    return (str(comparison["a"].get("label") or "a"), str(comparison["b"].get("label") or "b"))


def score_view(comparison: dict) -> ScoreView:
    """Per-item scores for the judge panels, from the judge when one ran, else from exact match."""
    check_comparison(comparison)
    judge = comparison.get("judge")
    if judge is None:
        return _exact_view(comparison["items"])
    metrics = tuple(judge["metrics"])
    if not metrics:
        raise StropError(f"comparison {comparison.get('comparisonId')}: judge.metrics is empty; list the judge's "
                         "metric names, or set judge to None when no judge was run")
    items = []
    for item in comparison["items"]:
        if item["a"].get("judge") is None or item["b"].get("judge") is None:
            continue   # a failed verdict on either side: not scored, so not compared
        items.append(ItemScores(item["index"], _judge_scores(item, "a", metrics),
                                _judge_scores(item, "b", metrics)))
    ranges = {m: _range(judge.get("ranges", {}).get(m), items, m) for m in metrics}
    ranges["combined"] = (sum(ranges[m][0] for m in metrics), sum(ranges[m][1] for m in metrics))
    means = _means(items, metrics)   # from the items, where the dict's own means (authoritative) lack a value
    for side, given in (judge.get("means") or {}).items():
        means.setdefault(side, {}).update({k: v for k, v in (given or {}).items() if v is not None})
    wins = judge.get("winTieLoss") or _wins(items)
    return ScoreView(JUDGE, metrics, ranges, tuple(items), means, wins)


def _exact_view(raw_items: list[dict]) -> ScoreView:
    items = []
    for item in raw_items:
        a, b = float(bool(item["a"]["correct"])), float(bool(item["b"]["correct"]))
        items.append(ItemScores(item["index"], {EXACT: a, "combined": a}, {EXACT: b, "combined": b}))
    ranges = {EXACT: (0.0, 1.0), "combined": (0.0, 1.0)}
    return ScoreView(NO_JUDGE, (EXACT,), ranges, tuple(items), _means(items, (EXACT,)), _wins(items))


def _judge_scores(item: dict, side: str, metrics: tuple[str, ...]) -> dict[str, float]:
    verdict = item[side]["judge"]
    missing = [m for m in metrics if verdict.get(m) is None]
    if missing:
        raise StropError(f"comparison item {item['index']}: the judge verdict for '{side}' lacks "
                         f"{', '.join(missing)}; a verdict has a score for every metric, or is None when it failed")
    scores = {m: float(verdict[m]) for m in metrics}
    scores["combined"] = sum(scores.values())
    return scores


def _range(given, items: list[ItemScores], metric: str) -> tuple[float, float]:
    if given is not None:
        return float(given[0]), float(given[1])
    seen = [getattr(item, side)[metric] for item in items for side in ("a", "b")]
    return (min([0.0, *seen]), max([1.0, *seen]))


def _means(items: list[ItemScores], metrics: tuple[str, ...]) -> dict[str, dict[str, float]]:
    keys = [*metrics, "combined"]
    out = {side: {k: _mean([getattr(it, side)[k] for it in items]) for k in keys} for side in ("a", "b")}
    out["delta"] = {k: out["b"][k] - out["a"][k] for k in keys}
    return out


def _wins(items: list[ItemScores]) -> dict[str, int]:
    wins = {"bWins": 0, "ties": 0, "aWins": 0}
    for item in items:
        a, b = item.a["combined"], item.b["combined"]
        wins["bWins" if b > a else "aWins" if a > b else "ties"] += 1
    return wins


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


# --- the summary table -----------------------------------------------------------------------------------


def summary_rows(comparison: dict, view: ScoreView) -> list[tuple[str, str, str, str]]:
    """(statistic, a, b, b - a) rows for the dashboard's summary panel and the HTML report."""
    acc, mc = comparison["accuracy"], comparison["mcnemar"]
    ci = acc.get("ci95")
    rows = [
        ("exact-match accuracy", _pct(acc.get("a")), _pct(acc.get("b")), _pts(acc.get("delta"))),
        ("accuracy delta, 95% CI", "", "", f"[{_pts(ci[0], unit='')}, {_pts(ci[1])}]" if ci else "n/a"),
        ("McNemar exact p (right only here)", _int(mc.get("aOnly")), _int(mc.get("bOnly")),
         f"p = {mc['p']:.3g}" if mc.get('p') is not None else "p = n/a"),
        ("items compared", _int(comparison["n"]), _int(comparison["n"]), ""),
    ]
    keys = [*view.metrics, "combined"] if view.source == JUDGE else list(view.metrics)
    for key in keys:
        lo, hi = view.ranges[key]
        name = "exact match (0/1)" if key == EXACT else f"{key} ({lo:g}-{hi:g})"
        rows.append((f"mean {name}", _num(view.means["a"].get(key)), _num(view.means["b"].get(key)),
                     _signed(view.means["delta"].get(key))))
    w = view.wins
    rows.append((f"head-to-head by {'combined score' if view.source == JUDGE else 'exact match'}",
                 f"{w['aWins']} wins", f"{w['bWins']} wins", f"{w['ties']} ties"))
    lo, hi = view.ranges["combined"]
    for name, target in ((f"perfect scores (combined = {hi:g})", hi),
                         (f"{'zero' if lo == 0 else 'lowest'} scores (combined = {lo:g})", lo)):
        count_a = sum(s == target for s in view.combined("a"))
        count_b = sum(s == target for s in view.combined("b"))
        rows.append((name, str(count_a), str(count_b), f"{count_b - count_a:+d}"))
    judge = comparison.get("judge")
    if judge is None:
        rows.append(("judge", "not run", "not run", ""))
    else:
        failures, kappa = judge.get("failures") or {}, judge.get("kappa") or {}
        rows.append(("judge failures (not scored)", _int(failures.get("a")), _int(failures.get("b")), ""))
        rows.append(("judge kappa vs exact match", _num(kappa.get("a")), _num(kappa.get("b")), ""))
        models = judge.get("models") or {}
        if any(models.values()):
            rows.append(("judge model", str(models.get("a") or "n/a"), str(models.get("b") or "n/a"), ""))
    return rows


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _pct(value) -> str:
    return f"{100 * value:.1f}%" if _finite(value) else "n/a"


def _pts(value, unit: str = " pts") -> str:
    return f"{100 * value:+.1f}{unit}" if _finite(value) else "n/a"


def _num(value, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if _finite(value) else "n/a"


def _signed(value) -> str:
    return f"{value:+.2f}" if _finite(value) else "n/a"


def _int(value) -> str:
    return str(int(value)) if _finite(value) else "n/a"
