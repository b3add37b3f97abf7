"""One self-contained HTML report of a comparison and/or a run's training curves.

    from strop.report.html import write_report
    write_report("out/report.html", comparison, metrics_rows, "SmolLM2 tuned vs baseline",
                 extra={"run": "run-1a2b", "metrics": "~/.strop/runs/run-1a2b/metrics.jsonl"})

The file needs nothing else: images are base64 `data:` URIs, styles are inline, there is no script, and a
Content-Security-Policy forbids loading anything from elsewhere, so it can be mailed, archived or opened
offline as is. Every piece of text from the inputs (questions, answers, labels) goes through html.escape.
Either input may be None: a report of only a comparison, or only a run's curves.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from strop.errors import StropError
from strop.report.figures import png_bytes
from strop.report.scores import labels, score_view, summary_rows
from strop.report.training import training_figure

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1800px; padding: 0 1em; color: #222; }
h1 { margin-bottom: 0.2em; } .sub { color: #555; margin-top: 0; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.q { max-width: 40em; white-space: pre-wrap; } .yes { color: #1a7f37; } .no { color: #b42318; }
img { max-width: 100%; border: 1px solid #ddd; }
"""
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def write_report(path, comparison: dict | None, metrics_rows: list[dict] | None, title: str,
                 extra: dict | None = None) -> Path:
    """Write the report to `path` (parents created) and return it."""
    if comparison is None and metrics_rows is None:
        raise StropError("a report needs a comparison, training metrics rows, or both; both were None")
    parts = [f"<h1>{_e(title)}</h1>"]
    if comparison is not None:
        parts += _comparison_parts(comparison)
    if extra:
        parts += ["<h2>Where things went</h2>", _table(["what", "where"], [[k, v] for k, v in extra.items()])]
    if metrics_rows is not None:
        parts += ["<h2>Training curves</h2>", _img(training_figure(metrics_rows), "training curves")]
    if comparison is not None:
        parts += _items_parts(comparison)
    page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n" + "\n".join(parts)
            + "\n</body></html>\n")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def _comparison_parts(comparison: dict) -> list[str]:
    # lazy: strop.report.dashboard pulls in numpy, which importing this module does not need
    from strop.report.dashboard import dashboard_figure

    view = score_view(comparison)
    name_a, name_b = labels(comparison)
    sides = [[name, comparison[side].get("model", ""), comparison[side].get("evaluationId", "")]
             for side, name in (("a", name_a), ("b", name_b))]
    parts = [f'<p class="sub">comparison {_e(comparison.get("comparisonId", ""))}: {_e(name_b)} vs {_e(name_a)}, '
             f'{_e(comparison["n"])} items; judge panels from {_e(view.source)}</p>',
             _table(["model", "served as", "evaluation"], sides),
             "<h2>Summary</h2>",
             _table(["statistic", name_a, name_b, f"{name_b} - {name_a}"], summary_rows(comparison, view))]
    parts += ["<h2>Dashboard</h2>", _img(dashboard_figure(comparison), "seven-panel comparison dashboard")]
    return parts


def _items_parts(comparison: dict) -> list[str]:
    name_a, name_b = labels(comparison)
    has_judge = comparison.get("judge") is not None
    header = ["#", "question", "gold"]
    for name in (name_a, name_b):
        header += [f"{name} answer", f"{name} correct"] + ([f"{name} judge"] if has_judge else [])
    rows = []
    for item in comparison["items"]:
        row = [item.get("index", ""), item.get("question", ""), item.get("gold", "")]
        for side in ("a", "b"):
            result = item[side]
            row += [result.get("answer", ""), bool(result.get("correct"))]
            if has_judge:
                verdict = result.get("judge")
                row.append("verdict failed" if verdict is None else
                           ", ".join(f"{k} {_num(v, 'g')}" for k, v in verdict.items()))
        rows.append(row)
    return [f"<h2>Items ({len(rows)})</h2>", _table(header, rows, question_column=1)]


def _table(header: list, rows: list, question_column: int | None = None) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for col, value in enumerate(row):
            if isinstance(value, bool):   # a correct flag: a coloured yes / no
                cells.append(f'<td class="{"yes" if value else "no"}">{"yes" if value else "no"}</td>')
            else:
                number = isinstance(value, (int, float))
                css = ' class="q"' if col == question_column else ' class="num"' if number else ""
                cells.append(f"<td{css}>{_e(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>"


def _img(fig, alt: str) -> str:
    data = base64.b64encode(png_bytes(fig)).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _num(value, spec: str = ".2f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "n/a"


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)
