"""Matplotlib figures drawn off-screen (Agg), saved as PNG files or bytes; the one place reports import it.

    from strop.report.figures import new_figure, save_png
    fig = new_figure(12, 8)
    fig.add_subplot().plot([0, 1], [1, 0])
    save_png(fig, "out/plot.png")

Figures are built with `matplotlib.figure.Figure` and an Agg canvas, never pyplot: nothing opens a window,
no global figure list grows, and it works on a machine without a display.
"""

from __future__ import annotations

import io
from pathlib import Path

from strop.errors import StropError

A_COLOR = "#dd8452"      # model a (usually the baseline)
B_COLOR = "#4c72b0"      # model b (usually the tuned model)
TIE_COLOR = "#bbbbbb"
DPI = 100


def new_figure(width_in: float, height_in: float):
    """A Figure with an Agg canvas; matplotlib is imported here so `import strop.report` stays fast."""
    try:
        # lazy: optional, its absence is handled here
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise StropError("reports draw with matplotlib, which is not installed: pip install 'matplotlib>=3.8'") \
            from exc
    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, facecolor="white")
    return buffer.getvalue()


def save_png(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png_bytes(fig))
    return path
