"""The seven-panel comparison dashboard: is the tuned model (b) really better than the baseline (a)?

    from strop.report.dashboard import render_dashboard
    dashboard = render_dashboard(comparison, "out/dashboard.png")
    dashboard.path, dashboard.panels    # Path('out/dashboard.png'), the seven panel titles as drawn

Panels, as the GSM8K walkthrough's judge dashboard has them:
  1. head-to-head donut: b wins / ties / a wins by combined judge score per item
  2. grouped bars: mean judge score per metric and combined, a beside b
  3. overlapping histograms of combined scores
  4. paired per-problem dots: a and b for each item, joined by a line
  5. confusion heatmap: counts of (a score, b score) pairs on the first judge metric, counts in the cells
  6. sorted horizontal bars of the per-problem delta (b - a combined)
  7. summary table: accuracy, delta with its 95% interval, McNemar, mean/perfect/zero scores, failures, kappa
When no judge was run, panels 1-6 draw exact match (1 right, 0 wrong) instead and their titles say
"(exact match; no judge)", so the dashboard always has all seven panels.

`Dashboard.panels` is read back from the figure's axes after drawing (one title per axes, in order), so a
panel that failed to draw shows up as a missing or empty title.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strop.report.figures import A_COLOR, B_COLOR, TIE_COLOR, new_figure, save_png
from strop.report.panels import confusion, score_name, sorted_deltas, titles
from strop.report.scores import EXACT, JUDGE, ScoreView, labels, score_view, summary_rows


@dataclass(frozen=True)
class Dashboard:
    path: Path
    panels: tuple[str, ...]   # the titles of the figure's axes, in drawing order


def render_dashboard(comparison: dict, path) -> Dashboard:
    """Draw the dashboard of `comparison` into a PNG at `path` (parents created)."""
    fig = dashboard_figure(comparison)
    return Dashboard(save_png(fig, path), tuple(ax.get_title() for ax in fig.axes))


def dashboard_figure(comparison: dict):
    """The dashboard as a matplotlib Figure (for callers that embed it, e.g. the HTML report)."""
    view = score_view(comparison)
    names = labels(comparison)
    title = titles(view, names, "\n")   # the app shows the same titles (strop.report.panels)
    fig = new_figure(18, 15)
    grid = fig.add_gridspec(3, 3)
    fig.suptitle(f"{names[1]} vs {names[0]}: {comparison.get('comparisonId', '')}  (n = {comparison['n']})",
                 fontsize=15)
    _donut(fig.add_subplot(grid[0, 0]), view, names, title)
    _mean_bars(fig.add_subplot(grid[0, 1]), view, names, title)
    _histograms(fig.add_subplot(grid[0, 2]), view, names, title)
    _paired_dots(fig.add_subplot(grid[1, :2]), view, names, title)
    _confusion(fig.add_subplot(grid[1, 2]), view, names, title)
    _deltas(fig.add_subplot(grid[2, 0]), view, names, title)
    _summary(fig.add_subplot(grid[2, 1:]), comparison, view, names)
    return fig


def _donut(ax, view: ScoreView, names, title: dict) -> None:
    ax.set_title(title["head-to-head"])
    counts = [view.wins["bWins"], view.wins["ties"], view.wins["aWins"]]
    if sum(counts) == 0:
        _nothing_scored(ax)
        return
    wedges = [(count, label, color) for count, label, color in
              zip(counts, [f"{names[1]} wins", "ties", f"{names[0]} wins"], [B_COLOR, TIE_COLOR, A_COLOR]) if count]
    ax.pie([w[0] for w in wedges], labels=[f"{w[1]} ({w[0]})" for w in wedges], colors=[w[2] for w in wedges],
           autopct="%.0f%%", pctdistance=0.8, startangle=90,
           counterclock=False, wedgeprops={"width": 0.4, "edgecolor": "white"})
    ax.text(0, 0, f"{sum(counts)}\nitems", ha="center", va="center", fontsize=13)
    ax.set_aspect("equal")


def _mean_bars(ax, view: ScoreView, names, title: dict) -> None:
    ax.set_title(title["means"])
    keys = [*view.metrics, "combined"] if view.source == JUDGE else [EXACT]
    x = np.arange(len(keys))
    for offset, side, name, color in ((-0.2, "a", names[0], A_COLOR), (0.2, "b", names[1], B_COLOR)):
        bars = ax.bar(x + offset, [view.means[side].get(k, np.nan) for k in keys], 0.4, label=name, color=color)
        ax.bar_label(bars, fmt="%.2f", fontsize=9)
    ax.set_xticks(x, [k.replace("_", " ") for k in keys])
    ax.set_ylabel("mean score")
    ax.legend()


def _histograms(ax, view: ScoreView, names, title: dict) -> None:
    ax.set_title(title["histogram"])
    lo, hi = view.ranges["combined"]
    if float(lo).is_integer() and float(hi).is_integer() and hi - lo <= 40:
        bins = np.arange(lo - 0.5, hi + 1.5)
    else:
        bins = np.linspace(lo, hi, 11)
    for side, name, color in (("a", names[0], A_COLOR), ("b", names[1], B_COLOR)):
        ax.hist(view.combined(side), bins=bins, alpha=0.55, color=color, label=name, edgecolor="white")
    if view.source != JUDGE:
        ax.set_xticks([0, 1], ["wrong", "right"])
    ax.set_xlabel(score_name(view))
    ax.set_ylabel("items")
    ax.legend()


def _paired_dots(ax, view: ScoreView, names, title: dict) -> None:
    ax.set_title(title["paired"])
    a, b = np.array(view.combined("a")), np.array(view.combined("b"))
    x = np.arange(len(a))
    colors = [B_COLOR if bb > aa else A_COLOR if aa > bb else TIE_COLOR for aa, bb in zip(a, b)]
    # a just left of b, so a tie shows two dots rather than one hiding the other
    crowd = max(1.0, len(x) / 60)   # thinner lines and smaller dots when there are hundreds of items
    lines = ax.plot(np.stack([x - 0.12, x + 0.12]), np.stack([a, b]), linewidth=2 / crowd, alpha=0.8) if len(x) else []
    for line, color in zip(lines, colors):
        line.set_color(color)
    ax.scatter(x - 0.12, a, s=36 / crowd, color=A_COLOR, label=names[0], zorder=3)
    ax.scatter(x + 0.12, b, s=36 / crowd, color=B_COLOR, label=names[1], zorder=3)
    if len(x) <= 40:
        ax.set_xticks(x, [str(item.index) for item in view.items], fontsize=8)
    ax.set_xlabel("problem (item index)")
    ax.set_ylabel(score_name(view))
    ax.legend()


def _confusion(ax, view: ScoreView, names, title: dict) -> None:
    ax.set_title(title["confusion"])
    levels, counts = confusion(view)
    ticks = [f"{v:g}" for v in levels] if view.source == JUDGE else ["incorrect", "correct"]
    counts = np.array(counts, dtype=int)
    ax.imshow(counts, cmap="Blues", origin="lower", aspect="auto")
    for (row, col), count in np.ndenumerate(counts):
        ax.text(col, row, str(count), ha="center", va="center", fontsize=10,
                color="white" if count > counts.max() / 2 else "black")
    ax.set_xticks(range(len(levels)), ticks)
    ax.set_yticks(range(len(levels)), ticks)
    ax.set_xlabel(f"{names[1]} score")
    ax.set_ylabel(f"{names[0]} score")


def _deltas(ax, view: ScoreView, names, title: dict) -> None:
    ax.set_title(title["deltas"])
    deltas = sorted_deltas(view)
    if not deltas:
        _nothing_scored(ax)
        return
    values = [d for d, _ in deltas]
    colors = [B_COLOR if d > 0 else A_COLOR if d < 0 else TIE_COLOR for d in values]
    y = np.arange(len(values))
    ax.barh(y, values, height=0.8 if len(values) <= 40 else 1.0, color=colors)
    ax.axvline(0, color="black", linewidth=0.8)
    if len(values) <= 40:
        ax.set_yticks(y, [f"#{index}" for _, index in deltas], fontsize=8)
    else:
        ax.set_yticks([])
    ax.set_xlabel(f"{score_name(view)} delta")


def _summary(ax, comparison: dict, view: ScoreView, names) -> None:
    ax.set_title("Summary")
    ax.axis("off")
    rows = summary_rows(comparison, view)
    header = ["", names[0], names[1], "B - A"]
    table = ax.table(cellText=[list(row) for row in rows], colLabels=header,
                     loc="center", cellLoc="center", colWidths=[0.4, 0.2, 0.2, 0.2])
    table.auto_set_font_size(False)
    table.set_fontsize(10)
    table.scale(1, 1.35)
    for (row, col), cell in table.get_celld().items():
        if row == 0:
            cell.set_text_props(weight="bold")
        if col == 0 and row > 0:
            cell.set_text_props(ha="left")


def _nothing_scored(ax) -> None:
    ax.text(0.5, 0.5, "no items scored on both sides", ha="center", va="center", transform=ax.transAxes)
    ax.axis("off")
