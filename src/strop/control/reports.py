"""Evidence on disk: a comparison's dashboard, a run's training curves, and one HTML report holding both.

    files = write_report("out/", comparison=compare_evaluations(a, b), run_id="run-3f9a1c2e")
    files["html"], files["dashboard"], files["training"]
"""

from __future__ import annotations

import json
from pathlib import Path

from strop.errors import StropError


def write_report(out: str | Path, *, comparison: dict | None = None, run_id: str | None = None,
                 title: str | None = None, extra: dict | None = None) -> dict:
    """Write dashboard.png (with a comparison), training.png (with a run), report.html and comparison.json."""
    # lazy: strop.report's figures pull in numpy and matplotlib, which importing this module does not need
    from strop.report import render_dashboard, render_training_curves
    from strop.report import write_report as write_html
    if comparison is None and run_id is None:
        raise StropError("a report needs a comparison (two evaluations) or a run, or both")
    metrics_rows = None
    if run_id is not None:  # read before the folder is made, so an unknown run leaves nothing behind
        # lazy: strop.control.runs pulls in sqlalchemy, which importing this module does not need
        from strop.control import runs
        metrics_rows = runs.metrics(run_id) or None
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise StropError(f"--out {out} is a file; give a folder to write the report into")
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    if metrics_rows:
        files["training"] = str(render_training_curves(metrics_rows, out / "training.png"))
    if comparison is not None:
        files["dashboard"] = str(_path_of(render_dashboard(comparison, out / "dashboard.png")))
        (out / "comparison.json").write_text(json.dumps(comparison, indent=1, default=str))
        files["comparison"] = str(out / "comparison.json")
    if title is None:
        title = (f"{comparison['b']['label']} vs {comparison['a']['label']}" if comparison else f"run {run_id}")
    files["html"] = str(write_html(out / "report.html", comparison, metrics_rows, title, extra))
    return files


def save_tables(comparison: dict, *, url: str | None, mode: str) -> dict:
    """Write the result tables, with each side's stored verdicts (reasoning, errors) alongside the scores."""
    # lazy: strop.control.evaluations pulls in sqlalchemy, which importing this module does not need
    from strop.control import evaluations
    from strop.evals.sql_tables import write_tables
    verdicts = {}
    for side in ("a", "b"):
        items = evaluations.report(comparison[side]["evaluationId"], items=True)["items"]
        verdicts[side] = [item.get("judge") for item in items]
    # lazy: strop.store pulls in sqlalchemy, which importing this module does not need
    from strop.store import open_store
    return write_tables(comparison, url=url or open_store(), mode=mode, verdicts=verdicts)


def _path_of(result) -> Path:
    return Path(getattr(result, "path", result))
