"""Reports: the seven-panel dashboard, training curves, the self-contained HTML report, and the headless
Chromium check (which must find console errors when a page has them, and none in a report)."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys

import pytest

from strop.errors import StropError
from strop.report import render_dashboard, render_training_curves, write_report
from strop.report.dashboard import dashboard_figure
from strop.report.scores import NO_JUDGE, score_view, summary_rows
from strop.report.training import PANELS, training_figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METRICS = ["answer_correctness", "reasoning_quality"]
A_RIGHT = {0, 3, 7, 9}                       # 4 of 12
B_RIGHT = {0, 1, 2, 3, 5, 8, 10, 11}         # 8 of 12; only a: {7, 9}, only b: {1, 2, 5, 8, 10, 11}
needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None,
                                    reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")


def _verdict(right: bool, i: int, bonus: int) -> dict:
    return {"answer_correctness": 5 if right else (i + bonus) % 3, "reasoning_quality": min(5, (2 * i) % 6 + bonus)}


def make_comparison(judge: bool = True) -> dict:
    """12 items by hand; with a judge, item 4's verdict for a failed and item 11 is 0/0 for a, 5/5 for b."""
    items = []
    for i in range(12):
        question = "What is <script>alert(1)</script> + 2?" if i == 2 else f"Sam has {i} apples and buys 3. How many?"
        item = {"index": i, "question": question, "gold": str(i + 3)}
        for side, right_set, bonus in (("a", A_RIGHT, 0), ("b", B_RIGHT, 1)):
            right = i in right_set
            item[side] = {"answer": str(i + 3) if right else str(i), "correct": right,
                          "judge": _verdict(right, i, bonus) if judge else None}
        items.append(item)
    comparison = {
        "comparisonId": "cmp-1a2b3c4d",
        "a": {"label": "baseline", "model": "openai:llama@http://localhost:8080/v1", "evaluationId": "eval-a"},
        "b": {"label": "tuned", "model": "model-1234", "evaluationId": "eval-b"},
        "n": 12,
        "accuracy": {"a": 4 / 12, "b": 8 / 12, "delta": 4 / 12, "ci95": [0.0, 0.67]},
        "mcnemar": {"p": 0.289, "aOnly": 2, "bOnly": 6},
        "judge": None,
        "items": items,
    }
    if judge:
        items[4]["a"]["judge"] = None
        items[11]["a"]["judge"] = {"answer_correctness": 0, "reasoning_quality": 0}
        items[11]["b"]["judge"] = {"answer_correctness": 5, "reasoning_quality": 5}
        scored = [it for it in items if it["a"]["judge"] and it["b"]["judge"]]
        means = {side: {m: sum(it[side]["judge"][m] for it in scored) / len(scored) for m in METRICS}
                 for side in ("a", "b")}
        for side in ("a", "b"):
            means[side]["combined"] = sum(means[side][m] for m in METRICS)
        means["delta"] = {k: means["b"][k] - means["a"][k] for k in means["a"]}
        deltas = [sum(it["b"]["judge"].values()) - sum(it["a"]["judge"].values()) for it in scored]
        wins = {"bWins": sum(d > 0 for d in deltas), "ties": deltas.count(0), "aWins": sum(d < 0 for d in deltas)}
        comparison["judge"] = {"metrics": METRICS, "ranges": {m: [0, 5] for m in METRICS}, "means": means,
                               "failures": {"a": 1, "b": 0}, "kappa": {"a": 0.71, "b": None},
                               "winTieLoss": wins}
    return comparison


def metrics_rows(steps: int = 6) -> list[dict]:
    return [{"step": s, "reward": 0.3 + 0.05 * s, "reward/correct": 0.3 + 0.04 * s, "reward/format": 0.01 * s,
             "zeroVarianceGroups": max(0, 4 - s), "klSampleTrain": 0.001 * s, "klBase": 0.002 * s,
             "entropy": 1.2 - 0.05 * s, "completionLength": 33.5 + s} for s in range(steps)]


def assert_png(path, min_width: int, min_height: int):
    """A decodable PNG of at least this size that is not blank; returns its pixels."""
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    pixels = matplotlib.image.imread(path)
    height, width = pixels.shape[:2]
    assert width >= min_width and height >= min_height, (width, height)
    inked = (pixels[..., :3] < 0.9).any(axis=-1).mean()
    assert inked > 0.01, f"{path} is almost blank ({inked:.1%} of pixels drawn)"
    return pixels


# --- the numbers -----------------------------------------------------------------------------------------


def test_score_view_skips_failed_verdicts_and_counts_perfect_and_zero_scores():
    comparison = {"a": {"label": "base"}, "b": {"label": "tuned"}, "n": 3,
                  "accuracy": {"a": 1 / 3, "b": 2 / 3, "delta": 1 / 3, "ci95": [-0.2, 0.8]},
                  "mcnemar": {"p": 1.0, "aOnly": 0, "bOnly": 1},
                  "judge": {"metrics": METRICS, "ranges": {m: [0, 5] for m in METRICS}, "failures": {"a": 1, "b": 0},
                            "kappa": {"a": None, "b": 0.5}},
                  "items": [
                      {"index": 0, "a": {"judge": {"answer_correctness": 5, "reasoning_quality": 5}},
                       "b": {"judge": {"answer_correctness": 5, "reasoning_quality": 4}}},
                      {"index": 1, "a": {"judge": {"answer_correctness": 0, "reasoning_quality": 0}},
                       "b": {"judge": {"answer_correctness": 3, "reasoning_quality": 5}}},
                      {"index": 2, "a": {"judge": None},
                       "b": {"judge": {"answer_correctness": 5, "reasoning_quality": 5}}},
                  ]}
    view = score_view(comparison)
    assert [item.index for item in view.items] == [0, 1]          # item 2: a's verdict failed
    assert view.combined("a") == [10.0, 0.0] and view.combined("b") == [9.0, 8.0]
    assert view.ranges["combined"] == (0.0, 10.0)
    assert view.wins == {"bWins": 1, "ties": 0, "aWins": 1}       # computed, as the dict gave none
    assert view.means["delta"]["combined"] == pytest.approx(8.5 - 5.0)
    rows = {row[0]: row[1:] for row in summary_rows(comparison, view)}
    assert rows["perfect scores (combined = 10)"] == ("1", "0", "-1")
    assert rows["zero scores (combined = 0)"] == ("1", "0", "-1")
    assert rows["exact-match accuracy"] == ("33.3%", "66.7%", "+33.3 pts")
    assert rows["accuracy delta, 95% CI"][2] == "[-20.0, +80.0 pts]"
    assert rows["judge kappa vs exact match"] == ("n/a", "0.50", "")


def test_a_verdict_missing_a_metric_is_an_error_naming_the_item():
    comparison = make_comparison()
    del comparison["items"][5]["b"]["judge"]["reasoning_quality"]
    with pytest.raises(StropError, match="item 5.*'b' lacks reasoning_quality"):
        score_view(comparison)


# --- the dashboard ---------------------------------------------------------------------------------------


def test_dashboard_with_a_judge_draws_seven_panels(tmp_path):
    dashboard = render_dashboard(make_comparison(), tmp_path / "out" / "dashboard.png")
    assert dashboard.path == tmp_path / "out" / "dashboard.png"
    assert_png(dashboard.path, 1200, 1000)
    assert len(dashboard.panels) == 7 and all(dashboard.panels)
    assert dashboard.panels[0].startswith("Head-to-head") and dashboard.panels[-1] == "Summary"
    assert "Confusion: answer correctness" in dashboard.panels[4]
    assert not any(NO_JUDGE in title for title in dashboard.panels)


def test_dashboard_confusion_cells_hold_the_score_pair_counts():
    fig = dashboard_figure(make_comparison())
    confusion = fig.axes[4]
    counts = [int(text.get_text()) for text in confusion.texts]
    assert len(counts) == 6 * 6 and sum(counts) == 11                # 0..5 each side; item 4 not scored
    a_score, b_score = 5, 5                                         # items 0 and 3 were right on both sides
    assert counts[a_score * 6 + b_score] == 2


def test_dashboard_without_a_judge_draws_exact_match_and_says_so(tmp_path):
    dashboard = render_dashboard(make_comparison(judge=False), tmp_path / "dashboard.png")
    assert_png(dashboard.path, 1200, 1000)
    assert len(dashboard.panels) == 7
    assert all(NO_JUDGE in title for title in dashboard.panels[:6]), dashboard.panels
    # 2x2 of (a, b): rows a incorrect/correct, columns b incorrect/correct
    confusion = dashboard_figure(make_comparison(judge=False)).axes[4]
    assert [int(text.get_text()) for text in confusion.texts] == [2, 6, 2, 2]


# --- training curves -------------------------------------------------------------------------------------


def test_training_curves_draw_every_panel_the_rows_carry(tmp_path):
    path = render_training_curves(metrics_rows(), tmp_path / "training.png")
    assert_png(path, 1000, 600)
    fig = training_figure(metrics_rows())
    assert [ax.get_title() for ax in fig.axes] == list(PANELS)
    assert [line.get_label() for line in fig.axes[0].lines] == ["reward", "reward/correct", "reward/format"]
    assert [line.get_label() for line in fig.axes[2].lines] == ["klSampleTrain", "klBase"]


def test_training_curves_leave_out_what_the_rows_lack():
    rows = [{"step": s, "reward": 0.1 * s, "entropy": 1.0} for s in range(3)]
    assert [ax.get_title() for ax in training_figure(rows).axes] == ["reward", "entropy"]


@pytest.mark.parametrize("steps", [2, 3, 7, 1000])
def test_training_curves_tick_the_step_axis_at_whole_steps(steps):
    # matplotlib's default locator puts a 3-step run's ticks at 0, 0.25, 0.5, ...: no step is a fraction
    fig = training_figure(metrics_rows(steps))
    fig.canvas.draw()
    for ax in fig.axes:
        low, high = ax.get_xlim()
        shown = [t for t in ax.get_xticks() if low <= t <= high]
        assert len(shown) >= 2 and all(float(t).is_integer() for t in shown), (steps, ax.get_title(), shown)
        labels = [label.get_text().replace("\u2212", "-") for label in ax.get_xticklabels() if label.get_text()]
        assert labels and all(re.fullmatch(r"-?\d+", text) for text in labels), (steps, labels)


def test_training_curves_of_no_rows_is_a_clear_error(tmp_path):
    with pytest.raises(StropError, match="metrics rows are empty"):
        render_training_curves([], tmp_path / "training.png")
    with pytest.raises(StropError, match="carry none of reward"):
        render_training_curves([{"step": 0, "loss": 1.0}], tmp_path / "training.png")
    assert not (tmp_path / "training.png").exists()


# --- the HTML report -------------------------------------------------------------------------------------


def test_html_report_is_self_contained_and_escaped(tmp_path):
    path = write_report(tmp_path / "report.html", make_comparison(), metrics_rows(), "tuned <vs> baseline",
                        extra={"run": "run-1", "metrics": "/runs/run-1/metrics.jsonl"})
    page = path.read_text(encoding="utf-8")
    links = re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]+)""", page)
    assert links and all(link.startswith("data:") for link in links), links
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 2                                            # dashboard and training curves
    assert all(base64.b64decode(data)[:8] == PNG_SIGNATURE for data in images)
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<title>tuned &lt;vs&gt; baseline</title>" in page
    assert "/runs/run-1/metrics.jsonl" in page and "McNemar" in page and "verdict failed" in page


def test_html_report_of_only_curves_or_only_a_comparison(tmp_path):
    curves = write_report(tmp_path / "curves.html", None, metrics_rows(), "run-1").read_text()
    assert curves.count("<img ") == 1 and "Training curves" in curves and "McNemar" not in curves
    only = write_report(tmp_path / "cmp.html", make_comparison(judge=False), None, "cmp").read_text()
    assert only.count("<img ") == 1 and "Training curves" not in only and "not run" in only
    with pytest.raises(StropError, match="both were None"):
        write_report(tmp_path / "none.html", None, None, "nothing")


def test_import_strop_report_does_not_import_matplotlib():
    code = "import sys, strop.report; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- headless Chromium -----------------------------------------------------------------------------------


@needs_chromium
def test_report_loads_in_chromium_without_console_errors(tmp_path):
    from strop.report.browser import check_in_chromium

    html = write_report(tmp_path / "report.html", make_comparison(), metrics_rows(), "tuned vs baseline")
    screenshot = tmp_path / "report.png"
    assert check_in_chromium(html, screenshot) == []
    pixels = assert_png(screenshot, 1400, 3000)
    assert pixels.shape[:2] == (3000, 1400)
    if os.environ.get("STROP_TEST_ARTIFACTS"):
        target = os.environ["STROP_TEST_ARTIFACTS"]
        os.makedirs(target, exist_ok=True)
        shutil.copy(screenshot, os.path.join(target, "report-chromium.png"))
        shutil.copy(html, os.path.join(target, "report.html"))


@needs_chromium
def test_chromium_check_reports_console_errors_and_uncaught_exceptions(tmp_path):
    from strop.report.browser import check_in_chromium

    page = tmp_path / "bad.html"
    page.write_text('<!doctype html><html><body><p>negative control</p>\n'
                    '<script>console.error("strop-negative-control");</script>\n'
                    '<script>throw new Error("strop-thrown");</script>\n</body></html>\n')
    messages = check_in_chromium(page, tmp_path / "bad.png")
    assert len(messages) == 2, messages
    assert messages[0].startswith("strop-negative-control (file://") and messages[0].endswith("bad.html:2)")
    assert messages[1].startswith("Uncaught Error: strop-thrown (")
    assert (tmp_path / "bad.png").read_bytes()[:8] == PNG_SIGNATURE


@needs_chromium
def test_chromium_check_catches_a_report_that_loads_from_elsewhere(tmp_path):
    from strop.report.browser import check_in_chromium

    html = write_report(tmp_path / "report.html", None, metrics_rows(3), "run")
    page = html.read_text().replace("</body>", '<img src="https://example.invalid/x.png"></body>')
    html.write_text(page)
    messages = check_in_chromium(html, tmp_path / "report.png")
    assert any("example.invalid" in m and "Content Security Policy" in m for m in messages), messages


def test_no_chromium_on_path_says_how_to_install_it(tmp_path, monkeypatch):
    from strop.report.browser import find_chromium

    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(StropError, match="apt-get install chromium"):
        find_chromium()
