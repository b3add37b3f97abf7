"""Reports: the evidence of a comparison (tuned model vs baseline) and of a training run, as PNGs and one
self-contained HTML file.

    from strop.report import render_dashboard, render_training_curves, write_report, check_in_chromium
    render_dashboard(comparison, "out/dashboard.png").panels     # the seven panel titles
    render_training_curves(metrics_rows, "out/training.png")
    write_report("out/report.html", comparison, metrics_rows, "tuned vs baseline")
    check_in_chromium("out/report.html", "out/report.png")       # [] when the page logs no console message

Modules: scores (the numbers, pure), figures (matplotlib off-screen), dashboard (seven panels), training
(curves from metrics.jsonl rows), html (the report), browser (headless Chromium check).
Names load on first use, so `import strop.report` does not import matplotlib.
"""

import importlib

_EXPORTS = {
    "render_dashboard": "strop.report.dashboard",
    "Dashboard": "strop.report.dashboard",
    "render_training_curves": "strop.report.training",
    "write_report": "strop.report.html",
    "check_in_chromium": "strop.report.browser",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'strop.report' has no attribute {name!r}")
