"""Training curves of a run, drawn from the rows of its metrics.jsonl (one dict per step).

    import json
    from strop.report.training import render_training_curves
    rows = [json.loads(line) for line in open("run/metrics.jsonl")]
    render_training_curves(rows, "out/training.png")

One panel per signal that the rows carry, against `step`: reward (the total and each `reward/<term>`),
zeroVarianceGroups (groups whose samples all scored the same, so they teach nothing), KL (klSampleTrain
and klBase), entropy and completionLength. A key missing from every row is simply not drawn. The step axis
is ticked at whole steps only.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.ticker import MaxNLocator

from strop.errors import StropError
from strop.report.figures import new_figure, save_png

# panel title -> the keys it draws; reward terms are added to the reward panel as the rows name them
PANELS = {
    "reward": ["reward"],
    "zero-variance groups": ["zeroVarianceGroups"],
    "KL divergence": ["klSampleTrain", "klSampleTrainMax", "klBase"],
    "entropy": ["entropy"],
    "completion length (tokens)": ["completionLength"],
}


def render_training_curves(metrics_rows: list[dict], path) -> Path:
    """Draw the curves of `metrics_rows` into a PNG at `path` (parents created)."""
    return save_png(training_figure(metrics_rows), path)


def training_figure(metrics_rows: list[dict]):
    """The curves as a matplotlib Figure, one axes per panel that has data (its title names the panel)."""
    if not metrics_rows:
        raise StropError("no training metrics to draw: the metrics rows are empty (has the run written any "
                         "step to metrics.jsonl yet? `strop runs metrics RUN` shows them)")
    terms = sorted({key for row in metrics_rows for key in row if key.startswith("reward/")})
    panels = {title: keys + terms if title == "reward" else keys for title, keys in PANELS.items()}
    series = {}
    for title, keys in panels.items():
        curves = {key: _series(metrics_rows, key) for key in keys}
        curves = {key: points for key, points in curves.items() if points[0]}
        if curves:
            series[title] = curves
    if not series:
        found = sorted({key for row in metrics_rows for key in row})
        wanted = [key for keys in PANELS.values() for key in keys]
        raise StropError(f"the metrics rows carry none of {', '.join(wanted)} (or reward/<term>); they have "
                         f"{', '.join(found) or 'no keys'}")
    columns = 2 if len(series) > 1 else 1
    rows = math.ceil(len(series) / columns)
    fig = new_figure(7 * columns, 3.4 * rows)
    fig.suptitle(f"Training curves ({len(metrics_rows)} steps)", fontsize=14)
    for position, (title, curves) in enumerate(series.items(), start=1):
        ax = fig.add_subplot(rows, columns, position)
        ax.set_title(title)
        for key, (steps, values) in curves.items():
            ax.plot(steps, values, marker="o" if len(steps) <= 30 else None, markersize=3,
                    linewidth=2.2 if key == "reward" else 1.4, label=key)
        ax.set_xlabel("step")
        # steps are whole numbers: a 3-step run must not be labelled 0.25, 0.5, ... (at most ~8 ticks, any run)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True))
        ax.grid(alpha=0.3)
        if len(curves) > 1:
            ax.legend(fontsize=8)
    return fig


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) where the key holds a finite number; a row without `step` counts by position."""
    steps, values = [], []
    for position, row in enumerate(rows):
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        steps.append(row.get("step", position))
        values.append(float(value))
    return steps, values
