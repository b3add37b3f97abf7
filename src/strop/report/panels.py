"""The comparison dashboard's panels as data: what `strop ui` draws as interactive charts.

    from strop.report.panels import dashboard_panels
    dashboard_panels(comparison)   # {"source", "labels", "panels": [{"id", "title", "kind", ...}], "summary"}

The static dashboard PNG (strop.report.dashboard) takes its titles, confusion counts and sorted deltas from
here, and both read the same ScoreView and summary rows (strop.report.scores), so the app and the static report
show the same numbers under the same titles. Kinds:
  bars       {"categories": [...], "series": [{"name", "values": [...]}]}
  pairs      {"items": [item index, ...], "series": [{"name", "values": [...]}]}   (panel 4: per-problem dots)
  heatmap    {"levels": [...], "counts": [[n for b level] for a level]}
"""

from __future__ import annotations

from strop.report.scores import EXACT, JUDGE, ScoreView, labels, score_view, summary_rows


def titles(view: ScoreView, names, sep: str = " ") -> dict[str, str]:
    """Each panel's title, as both the PNG (sep a newline) and the app show it."""
    suffix = "" if view.source == JUDGE else f"{sep}({view.source})"
    score = score_name(view)
    metric = view.metrics[0]
    return {"head-to-head": f"Head-to-head: {names[1]} vs {names[0]}{suffix}",
            "means": f"Mean {'judge score' if view.source == JUDGE else 'score'} per metric{suffix}",
            "histogram": f"Distribution of {score}s{suffix}",
            "paired": f"Per-problem {score}{suffix}",
            "confusion": (f"Confusion: {metric.replace('_', ' ')}{suffix}" if view.source == JUDGE
                          else f"Confusion: correct / incorrect{suffix}"),
            "deltas": f"Per-problem delta ({names[1]} - {names[0]}){suffix}"}


def score_name(view: ScoreView) -> str:
    return "combined score" if view.source == JUDGE else "exact-match score"


def confusion(view: ScoreView) -> tuple[list[float], list[list[int]]]:
    """The levels of the first metric and counts[a level][b level] of items scored so."""
    metric = view.metrics[0]
    a, b = view.scores("a", metric), view.scores("b", metric)
    if view.source == JUDGE:
        lo, hi = view.ranges[metric]
        if float(lo).is_integer() and float(hi).is_integer() and hi - lo <= 20:
            levels = [float(v) for v in range(int(lo), int(hi) + 1)]
        else:
            levels = sorted(set(a) | set(b))
    else:
        levels = [0.0, 1.0]
    where = {v: i for i, v in enumerate(levels)}
    counts = [[0] * len(levels) for _ in levels]
    for sa, sb in zip(a, b):
        counts[where[sa]][where[sb]] += 1
    return levels, counts


def sorted_deltas(view: ScoreView) -> list[tuple[float, int]]:
    """(b - a combined score, item index) per item, smallest first."""
    return sorted((item.b["combined"] - item.a["combined"], item.index) for item in view.items)


def dashboard_panels(comparison: dict) -> dict:
    view, names = score_view(comparison), labels(comparison)
    title = titles(view, names)
    w = view.wins
    keys = [*view.metrics, "combined"] if view.source == JUDGE else list(view.metrics)
    combined = {side: view.combined(side) for side in ("a", "b")}
    levels = sorted({*combined["a"], *combined["b"]})
    first_levels, counts = confusion(view)
    deltas = sorted_deltas(view)[::-1]   # biggest first, left to right
    panels = [
        {"id": "head-to-head", "title": title["head-to-head"], "kind": "bars",
         "categories": [f"{names[1]} wins", "ties", f"{names[0]} wins"],
         "series": [{"name": "items", "values": [w["bWins"], w["ties"], w["aWins"]]}]},
        {"id": "means", "title": title["means"], "kind": "bars",
         "categories": ["exact match" if k == EXACT else k.replace("_", " ") for k in keys],
         "series": [{"name": names[i], "values": [view.means[side].get(k) for k in keys]}
                    for i, side in enumerate(("a", "b"))]},
        {"id": "histogram", "title": title["histogram"], "kind": "bars",
         "categories": [f"{v:g}" for v in levels],
         "series": [{"name": names[i], "values": [combined[side].count(v) for v in levels]}
                    for i, side in enumerate(("a", "b"))]},
        {"id": "paired", "title": title["paired"], "kind": "pairs",
         "items": [item.index for item in view.items],
         "series": [{"name": names[i], "values": combined[side]} for i, side in enumerate(("a", "b"))]},
        {"id": "confusion", "title": title["confusion"], "kind": "heatmap", "levels": first_levels, "counts": counts},
        {"id": "deltas", "title": title["deltas"], "kind": "bars",
         "categories": [f"#{index}" for _, index in deltas],
         "series": [{"name": "delta", "values": [d for d, _ in deltas]}]},
    ]
    return {"source": view.source, "labels": list(names), "panels": panels,
            "summary": [list(row) for row in summary_rows(comparison, view)]}
