"""`strop ui` in real headless Chromium (Debian's package), driven over the DevTools protocol: the runs page
follows a run that is still training, a run's page draws its curves, the rollout browser shows a multi-turn
finance-sql episode as a conversation, hostile model text stays text, and no page logs a console error.
Screenshots go to $STROP_TEST_ARTIFACTS when it is set. One browser and one server for the module."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ui_runs import HOSTILE, env_eval_report, finance_episode, make_evaluation, make_run, single_turn_rollouts, ui_server, write_metrics

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None,
                                reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")


@pytest.fixture(scope="module")
def browser():
    from chromium_cdp import Chromium
    with Chromium() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def base_url():
    with ui_server() as server:
        yield f"http://127.0.0.1:{server.server_port}"


def _shot(page, name: str, tmp_path: Path) -> None:
    target = Path(os.environ.get("STROP_TEST_ARTIFACTS") or tmp_path)
    page.screenshot(target / f"ui-{name}.png")


def test_runs_page_follows_a_training_run_without_a_reload(browser, base_url, tmp_path):
    run_id = make_run("live-project", steps=3, max_steps=10)
    page = browser.page(base_url + "/")
    cell = f"document.querySelector('tr[data-run=\"{run_id}\"] td.step')"
    assert page.wait_for(f"{cell} && {cell}.textContent === '3 / 10'")
    page.evaluate("window.__sameDocument = true")
    write_metrics(run_id, 3)           # the worker finishes another step while the page is open
    assert page.wait_for(f"{cell}.textContent === '4 / 10'")
    assert page.evaluate("window.__sameDocument") is True      # updated in place, not reloaded
    row = page.evaluate(f"document.querySelector('tr[data-run=\"{run_id}\"]').textContent")
    assert "live-project" in row and "running" in row and "grpo" in row and "0.3" in row   # reward of step 3
    _shot(page, "runs", tmp_path)
    assert page.problems() == []


def test_run_page_draws_curves_with_hover_and_an_overlay(browser, base_url, tmp_path):
    run_id, other = make_run("curves", steps=5), make_run("curves", steps=4, status="succeeded")
    page = browser.page(f"{base_url}/#/run/{run_id}?with={other}")
    page.wait_for("document.querySelectorAll('.chart path.series').length >= 10")
    titles = page.evaluate("[...document.querySelectorAll('.chart')].map(c => c.dataset.title)")
    for wanted in ("reward", "zero-variance groups (share)", "KL and sampler/trainer mismatch", "entropy",
                   "completion length (tokens)", "clipped share", "step time (s)", "learning rate"):
        assert wanted in titles
    # the reward chart: total and two terms, for both runs; the overlaid run's lines dashed
    reward = "document.querySelector('.chart[data-title=\"reward\"]')"
    assert page.evaluate(f"{reward}.querySelectorAll('path.series').length") == 6
    assert page.evaluate(f"[...{reward}.querySelectorAll('path.series')].filter(p => "
                         "p.getAttribute('stroke-dasharray') !== 'none').length") == 3
    box = page.evaluate(f"(() => {{ const r = {reward}.querySelector('svg').getBoundingClientRect(); "
                        "return [r.left, r.top, r.width, r.height]; })()")
    page.mouse_move(box[0] + box[2] * 0.99, box[1] + box[3] / 2)   # the right edge: the last step, 4
    tip = page.wait_for(f"{reward}.querySelector('.tip').style.display === 'block' && "
                        f"{reward}.querySelector('.tip').textContent")
    assert tip.startswith("step 4") and f"{run_id} reward: 0.4" in tip and f"{other} reward: –" in tip
    assert "worker started" in page.wait_for("document.getElementById('log').textContent")
    assert page.evaluate("document.querySelector('[data-fact=\"step\"]').textContent") == "5 / 10"
    assert "synthetic:add" in page.evaluate("document.getElementById('descriptor').textContent")
    _shot(page, "run", tmp_path)
    page.evaluate("document.getElementById('cancel').click()")       # armed, not sent
    assert page.evaluate("document.getElementById('cancel').textContent") == "click again to cancel"
    page.evaluate("document.getElementById('cancel').click()")       # the control plane's cancel
    page.wait_for("document.querySelector('h1 .badge').textContent === 'cancelled'")
    assert page.problems() == []


def test_rollout_browser_shows_a_finance_sql_episode_as_a_conversation(browser, base_url, tmp_path):
    run_id = make_run("finance", steps=1)
    from strop.control.runs import run_dir
    with open(run_dir(run_id) / "rollouts.jsonl", "w") as f:
        f.writelines(json.dumps(finance_episode(0, 0, r)) + "\n" for r in (1.1, 0.0))
    page = browser.page(f"{base_url}/#/run/{run_id}/rollouts")
    page.wait_for("document.querySelectorAll('.sample').length === 2")
    first = "document.querySelector('.sample')"
    roles = page.evaluate(f"[...{first}.querySelectorAll('.msg > .role')].map(r => r.textContent)")
    assert roles == ["user", "assistant", "tool result", "assistant", "tool result", "assistant"]
    calls = page.evaluate(f"[...{first}.querySelectorAll('.toolcall pre')].map(p => p.textContent)")
    assert [json.loads(c)["name"] for c in calls] == ["list_tables", "run_sql", "submit_answer"]
    assert "2022 | 1224.9" in page.evaluate(f"{first}.querySelectorAll('.msg.tool')[1].textContent")
    assert "reward 1.1" in page.evaluate(f"{first}.textContent")
    _shot(page, "rollouts-finance", tmp_path)
    assert page.problems() == []


def test_hostile_completion_shows_as_text_and_runs_nothing(browser, base_url, tmp_path):
    run_id = make_run("hostile", steps=1)
    single_turn_rollouts(run_id)
    page = browser.page(f"{base_url}/#/run/{run_id}/rollouts?step=0")
    shown = page.wait_for("[...document.querySelectorAll('pre.completion')].map(p => p.textContent)"
                          ".find(t => t.includes('onerror'))")
    assert shown == HOSTILE
    assert page.evaluate("document.querySelectorAll('#main img, #main script').length") == 0
    assert page.evaluate("window.__pwned === undefined") is True
    assert "grader error: grader timed out after 5 s" in page.evaluate("document.getElementById('rollouts').textContent")
    _shot(page, "rollouts-hostile", tmp_path)
    assert page.problems() == []


def test_two_evaluations_side_by_side(browser, base_url, tmp_path):
    a = make_evaluation("strop/tiny-random", [True, False], response=HOSTILE)
    b = make_evaluation("model-12345678", [True, True])
    page = browser.page(f"{base_url}/#/evaluations")
    page.wait_for(f"document.querySelectorAll('tr[data-eval=\"{a}\"], tr[data-eval=\"{b}\"]').length === 2")
    page.evaluate(f"document.querySelector('input.pick-eval[value=\"{a}\"]').click();"
                  f"document.querySelector('input.pick-eval[value=\"{b}\"]').click();"
                  "document.getElementById('compare-evals').click()")
    page.wait_for("document.querySelectorAll('#compare-items tbody tr').length === 2")
    stats = page.evaluate("document.getElementById('compare-stats').textContent")
    assert "accuracy A0.5" in stats and "accuracy B1" in stats and "B only 1" in stats
    cells = page.evaluate("[...document.querySelectorAll('#compare-items tbody tr')[1].children].map(c => c.textContent)")
    assert cells[3].startswith("answer 5 ✗") and HOSTILE in cells[3] and cells[4].startswith("answer 3 ✓")
    assert "clarity 4" in cells[4]
    assert page.evaluate("document.querySelectorAll('#main img, #main script').length") == 0
    _shot(page, "compare", tmp_path)
    assert page.problems() == []


def test_comparison_dashboard_panels_are_interactive_charts(browser, base_url, tmp_path):
    hostile_model = '<img src=x onerror="window.__pwned=3">'      # a model name lands in titles, legends, tips
    a = make_evaluation(hostile_model, [True, False, False, True])
    b = make_evaluation("model-12345678", [True, True, True, True])
    page = browser.page(f"{base_url}/#/compare/{a}/{b}")
    page.wait_for("document.querySelectorAll('#dashboard .chart').length === 6")
    panels = page.evaluate("[...document.querySelectorAll('#dashboard .chart')].map(c => c.dataset.panel)")
    assert panels == ["head-to-head", "means", "histogram", "paired", "confusion", "deltas"]
    h2h = "document.querySelector('.chart[data-panel=\"head-to-head\"]')"
    assert page.evaluate(f"{h2h}.querySelectorAll('rect.bar').length") == 2     # B wins 2, ties 2, A wins 0
    box = page.evaluate(f"(() => {{ const r = {h2h}.querySelector('svg').getBoundingClientRect(); "
                        "return [r.left, r.top, r.width, r.height]; })()")
    page.mouse_move(box[0] + box[2] * 0.2, box[1] + box[3] / 2)     # over the first group: B's wins
    tip = page.wait_for(f"{h2h}.querySelector('.tip').style.display === 'block' && "
                        f"{h2h}.querySelector('.tip').textContent")
    assert tip == "model-12345678 wins\nitems: 2"
    cells = page.evaluate("[...document.querySelectorAll('.chart[data-panel=\"confusion\"] text')].map(t => t.textContent)")
    assert cells[:4] == ["0", "2", "0", "2"]
    summary = page.evaluate("document.querySelector('#dashboard-summary tbody tr').textContent")
    assert summary == "exact-match accuracy50.0%100.0%+50.0 pts"
    assert hostile_model in page.evaluate("document.getElementById('dashboard').textContent")
    assert page.evaluate("document.querySelectorAll('#main img, #main script').length") == 0
    assert page.evaluate("window.__pwned === undefined") is True
    _shot(page, "compare-dashboard", tmp_path)
    assert page.problems() == []


def test_env_eval_report_shows_pass_at_1_and_rubrics_as_charts(browser, base_url, tmp_path):
    from strop.control import env_evals
    report = env_eval_report()
    report["model"] = HOSTILE.replace("/", "")        # a model name is untrusted text too
    kept = env_evals.save(report)
    page = browser.page(f"{base_url}/#/evaluations")
    page.wait_for(f"document.querySelector('tr[data-env-eval=\"{kept}\"]') !== null")
    page.evaluate(f"document.querySelector('tr[data-env-eval=\"{kept}\"]').click()")
    page.wait_for("document.querySelectorAll('#env-charts .chart').length === 2")
    rubrics = "document.querySelector('.chart[data-panel=\"rubrics-eval-single\"]')"
    assert page.evaluate(f"{rubrics}.querySelectorAll('rect.bar').length") == 3   # model 2 rubrics, baseline 1
    box = page.evaluate(f"(() => {{ const r = {rubrics}.querySelector('svg').getBoundingClientRect(); "
                        "return [r.left, r.top, r.width, r.height]; })()")
    page.mouse_move(box[0] + box[2] * 0.3, box[1] + box[3] / 2)     # over the first rubric, sqlErrors
    tip = page.wait_for(f"{rubrics}.querySelector('.tip').style.display === 'block' && "
                        f"{rubrics}.querySelector('.tip').textContent")
    assert tip == f"sqlErrors\n{report['model']}: 0.25\nstrop/tiny-random: 1"
    rows = page.evaluate("[...document.querySelectorAll('#env-splits tbody tr')].map(r => r.textContent)")
    assert rows == [f"{report['model']}eval-single20.50.5sqlErrors 0.25 · validToolCalls 0.75",
                    "strop/tiny-randomeval-single200sqlErrors 1"]
    assert "0.5" in page.evaluate("document.getElementById('env-comparison').textContent")
    assert "null" not in page.evaluate("document.getElementById('main').textContent")
    assert page.evaluate("document.querySelectorAll('#main img, #main script').length") == 0
    assert page.evaluate("window.__pwned === undefined") is True
    _shot(page, "env-eval", tmp_path)
    assert page.problems() == []


def test_models_page_samples_a_model_by_hand(browser, base_url, tmp_path, tiny_model_dir):
    from strop.store import open_store, session_scope
    from strop.store.schema import SelectedBaseModel
    with session_scope(open_store()) as s:
        if s.get(SelectedBaseModel, "strop/tiny-random") is None:
            s.add(SelectedBaseModel(id="strop/tiny-random", path=str(tiny_model_dir)))
    page = browser.page(f"{base_url}/#/models")
    page.wait_for("document.getElementById('sample-go') !== null")
    page.evaluate("document.getElementById('sample-model').value = 'strop/tiny-random';"
                  "document.getElementById('sample-prompt').value = 'What is 2 + 2?';"
                  "document.getElementById('sample-tokens').value = '6';"
                  "document.getElementById('sample-go').click()")
    said = page.wait_for("document.querySelector('#main p.muted') && document.querySelector('#main p.muted').textContent",
                         timeout_s=60)
    assert "tokens, stopped by" in said
    _shot(page, "models", tmp_path)
    assert page.problems() == []
