"""The comparison dashboard's panels as data: what `strop ui` draws as interactive charts.

    from strop.report.panels import dashboard_panels
    dashboard_panels(comparison)   # {"source", "labels", "panels": [{"id", "title", "kind", ...}], "summary"}

Computed from the same ScoreView and summary rows (strop.report.scores) that the static dashboard PNG and the
HTML report draw from, so the app and the static report show the same numbers. Kinds:
  bars       {"categories": [...], "series": [{"name", "values": [...]}]}
  pairs      {"items": [item index, ...], "series": [{"name", "values": [...]}]}   (panel 4: per-problem dots)
  heatmap    {"levels": [...], "counts": [[n for b level] for a level]}
"""

from __future__ import annotations

from strop.report.scores import EXACT, JUDGE, labels, score_view, summary_rows


def dashboard_panels(comparison: dict) -> dict:
    view, names = score_view(comparison), labels(comparison)
    suffix = "" if view.source == JUDGE else f" ({view.source})"
    w = view.wins
    keys = [*view.metrics, "combined"] if view.source == JUDGE else list(view.metrics)
    combined = {side: view.combined(side) for side in ("a", "b")}
    levels = sorted({*combined["a"], *combined["b"]})
    first = view.metrics[0]
    first_levels = sorted({*view.scores("a", first), *view.scores("b", first)})
    counts = [[sum(1 for item in view.items if item.a[first] == la and item.b[first] == lb) for lb in first_levels]
              for la in first_levels]
    deltas = sorted(((cb - ca, item.index) for item, ca, cb in zip(view.items, combined["a"], combined["b"])),
                    reverse=True)
    panels = [
        {"id": "head-to-head", "title": f"Head-to-head: {names[1]} vs {names[0]}{suffix}", "kind": "bars",
         "categories": [f"{names[1]} wins", "ties", f"{names[0]} wins"],
         "series": [{"name": "items", "values": [w["bWins"], w["ties"], w["aWins"]]}]},
        {"id": "means", "title": f"Mean score per metric{suffix}", "kind": "bars",
         "categories": ["exact match" if k == EXACT else k.replace("_", " ") for k in keys],
         "series": [{"name": names[i], "values": [view.means[side].get(k) for k in keys]}
                    for i, side in enumerate(("a", "b"))]},
        {"id": "histogram", "title": f"Combined scores{suffix}", "kind": "bars",
         "categories": [f"{v:g}" for v in levels],
         "series": [{"name": names[i], "values": [combined[side].count(v) for v in levels]}
                    for i, side in enumerate(("a", "b"))]},
        {"id": "paired", "title": f"Per problem: {names[0]} and {names[1]}{suffix}", "kind": "pairs",
         "items": [item.index for item in view.items],
         "series": [{"name": names[i], "values": combined[side]} for i, side in enumerate(("a", "b"))]},
        {"id": "confusion", "title": f"{first} score pairs ({names[0]} rows, {names[1]} columns){suffix}",
         "kind": "heatmap", "levels": first_levels, "counts": counts},
        {"id": "deltas", "title": f"Per-problem delta ({names[1]} − {names[0]}){suffix}", "kind": "bars",
         "categories": [f"#{index}" for _, index in deltas],
         "series": [{"name": "delta", "values": [d for d, _ in deltas]}]},
    ]
    return {"source": view.source, "labels": list(names), "panels": panels,
            "summary": [list(row) for row in summary_rows(comparison, view)]}
