"""`strop ui`'s JSON endpoints and guards, through a real HTTP server on loopback, and the rollout index that
pages rollouts.jsonl without reading it whole."""

from __future__ import annotations

import http.client
import json
import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from strop.control.runs import run_dir
from strop.errors import StropError
from strop.ui.rollouts import RolloutIndex, RolloutQuery
from ui_runs import HOSTILE, env_eval_report, make_evaluation, make_run, single_turn_rollouts, ui_server, write_metrics


def _get(server, path: str, headers: dict | None = None, method: str = "GET", body: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=10)
    conn.request(method, path, body=body, headers={"Host": f"127.0.0.1:{server.server_port}", **(headers or {})})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    kind = response.getheader("Content-Type") or ""
    return response.status, (json.loads(data) if kind.startswith("application/json") else data), response


@pytest.fixture(scope="module")
def server():
    with ui_server() as running:
        yield running


def test_runs_table_takes_the_latest_step_from_the_folder_and_filters(server):
    live = make_run("table-a", steps=3, max_steps=10)
    done = make_run("table-b", steps=2, status="succeeded")
    status, body, _ = _get(server, "/api/runs?project=table-a")
    assert status == 200 and [r["runId"] for r in body["runs"]] == [live]
    row = body["runs"][0]
    # metrics rows 0, 1, 2 written, the store still says 0: three steps done, reward of step 2
    assert (row["step"], row["maxSteps"], row["reward"], row["status"], row["method"]) == (3, 10, 0.2, "running", "grpo")
    assert row["lineage"] == [{"baseModel": "strop/tiny-random"}]
    write_metrics(live, 3)
    assert _get(server, "/api/runs?project=table-a")[1]["runs"][0]["step"] == 4
    ids = [r["runId"] for r in _get(server, "/api/runs?status=succeeded")[1]["runs"]]
    assert done in ids and live not in ids
    status, body, _ = _get(server, "/api/runs?status=exploded")
    assert status == 400 and "status must be one of cancelled, failed, pending, running, stopped" in body["error"]


def test_run_detail_metrics_log_and_unknown_runs(server):
    run_id = make_run("detail", steps=2)
    status, info, response = _get(server, f"/api/runs/{run_id}")
    assert status == 200 and info["descriptor"]["config"]["rlHyperparams"]["maxSteps"] == 10
    assert [c["step"] for c in info["checkpoints"]] == [1] and info["last"]["step"] == 1
    assert "script-src 'self'" in response.getheader("Content-Security-Policy")
    rows = _get(server, f"/api/runs/{run_id}/metrics")[1]["rows"]
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["reward/correct"] == 0.08
    assert _get(server, f"/api/runs/{run_id}/log")[1]["text"].startswith("worker started")
    status, body, _ = _get(server, "/api/runs/run-00000000")
    assert status == 404 and "strop runs list" in body["error"]
    status, body, _ = _get(server, "/api/runs/..%2f..%2fetc")
    assert status == 400 and "is not a run id" in body["error"]


def test_rollouts_page_by_step_group_reward_text_term_and_errors(server):
    run_id = make_run("pages", steps=1)
    single_turn_rollouts(run_id)      # 2 steps x 2 groups x 2 samples, rewards 0 and 1
    assert _get(server, f"/api/runs/{run_id}/steps")[1] == {
        "steps": [{"step": 0, "rollouts": 4, "groups": 2}, {"step": 1, "rollouts": 4, "groups": 2}], "rollouts": 8}
    page = lambda q: _get(server, f"/api/runs/{run_id}/rollouts?{q}")[1]
    body = page("step=1&group=1")
    assert body["matched"] == 2 and [r["completion"] for r in body["rows"]] == ["the answer is 2", "the answer is 3"]
    assert page("minReward=1")["matched"] == 4 and page("maxReward=0.5&step=0")["matched"] == 2
    assert [r["line"] for r in page("limit=3&offset=6")["rows"]] == [6, 7]
    found = page("q=ONERROR")
    assert [r["completion"] for r in found["rows"]] == [HOSTILE] and found["complete"] is True
    assert len(page("term=correct&termMin=1")["rows"]) == 4
    assert {r["group"] for r in page("errors=1")["rows"]} == {1}
    status, body, _ = _get(server, f"/api/runs/{run_id}/rollouts?limit=5000")
    assert status == 400 and "limit must be between 1 and 200" in body["error"]
    status, body, _ = _get(server, f"/api/runs/{run_id}/rollouts?minReward=nan")
    assert status == 400 and "finite" in body["error"]


def test_index_grows_with_the_file_and_starts_over_when_it_is_cut_back(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    line = lambda step, reward: json.dumps({"step": step, "group": 0, "reward": reward, "completion": "x"}) + "\n"
    path.write_text(line(0, 1.0) + line(1, 0.0) + '{"step": 2, "gro')      # the last line still being written
    index = RolloutIndex(path)
    assert index.page(RolloutQuery())["matched"] == 2
    with open(path, "a") as f:
        f.write('up": 0, "reward": 0.5}\n' + "not json\n" + json.dumps({"group": 1, "step": 3, "reward": 2}) + "\n")
    body = index.page(RolloutQuery())
    assert [r["step"] for r in body["rows"]] == [0, 1, 2, 3]     # key order other than the loop's: parsed whole
    path.write_text(line(0, 0.25))                                # a resumed run cut the file back
    assert [r["reward"] for r in index.page(RolloutQuery())["rows"]] == [0.25]


def test_a_large_index_is_kept_on_disk_and_read_back_by_the_next_server(tmp_path, monkeypatch):
    import strop.ui.rollouts as rollouts
    monkeypatch.setattr(rollouts, "SAVE_AFTER", 3)
    path, cache = tmp_path / "rollouts.jsonl", tmp_path / "cache" / "run.rollouts-index"
    line = lambda step, reward: json.dumps({"step": step, "group": 0, "reward": reward}) + "\n"
    path.write_text("".join(line(s, s / 10) for s in range(4)))
    RolloutIndex(path, cache).refresh()
    again = RolloutIndex(path, cache)             # a restarted server: read back, nothing parsed yet
    assert (again.indexed_to, list(again.steps), list(again.rewards)) == (path.stat().st_size, [0, 1, 2, 3],
                                                                          [0.0, 0.1, 0.2, 0.3])
    with open(path, "a") as f:
        f.write(line(4, 0.4))
    assert again.page(RolloutQuery(step=4))["rows"][0]["reward"] == 0.4   # only the new line indexed
    path.write_text(line(7, 1.0))                                         # cut back: the cache does not fit
    assert list(RolloutIndex(path, cache).steps) == [] and RolloutIndex(path, cache).page(RolloutQuery())["matched"] == 1
    cache.write_bytes(b"garbage")
    assert RolloutIndex(path, cache).page(RolloutQuery())["matched"] == 1


def test_a_huge_line_is_a_note_not_a_parse(tmp_path, monkeypatch):
    import strop.ui.rollouts as rollouts
    monkeypatch.setattr(rollouts, "MAX_LINE", 1000)
    path = tmp_path / "rollouts.jsonl"
    huge = json.dumps({"step": 0, "group": 0, "reward": 1.0, "completion": "y" * 3_000_000}) + "\n"
    path.write_text(huge + json.dumps({"step": 1, "group": 0, "reward": 0.0}) + "\n" + "z" * 2_500_000)
    index = RolloutIndex(path)
    rows = index.page(RolloutQuery())["rows"]
    assert "over the 1,000 shown" in rows[0]["tooLarge"] and len(rows[0]["head"]) <= 4096
    assert rows[0]["tooLarge"].startswith(f"this rollout's line is {len(huge):,} bytes")
    assert rows[1]["step"] == 1 and len(rows) == 2      # the unfinished huge line at the end waits for its end
    assert index.indexed_to == len(huge) + len(json.dumps({"step": 1, "group": 0, "reward": 0.0})) + 1


def test_host_header_of_another_name_is_refused_on_loopback(server):
    status, body, _ = _get(server, "/api/runs", headers={"Host": "evil.example:8765"})
    assert status == 403 and "DNS-rebinding" in body["error"]
    assert _get(server, "/", headers={"Host": "localhost"})[0] == 200


def test_posts_need_json_and_a_page_of_this_server_and_cancel_and_resume_reach_the_control_plane(server):
    run_id = make_run("control", steps=1)
    port = server.server_port
    post = lambda what, headers: _get(server, f"/api/runs/{run_id}/{what}", headers=headers, method="POST", body=b"{}")
    status, body, _ = post("cancel", {"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in body["error"]
    status, body, _ = post("cancel", {"Content-Type": "application/json", "Origin": "http://evil.example"})
    assert status == 403 and "refused" in body["error"]
    status, body, _ = post("cancel", {"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port}"})
    assert status == 200 and body["status"] == "cancelled"
    status, body, _ = post("cancel", {"Content-Type": "application/json"})
    assert status == 409 and "already cancelled" in body["error"]
    done = make_run("control", steps=1, status="succeeded")
    status, body, _ = _get(server, f"/api/runs/{done}/resume", headers={"Content-Type": "application/json"},
                           method="POST", body=b"{}")
    assert status == 409 and "already succeeded" in body["error"]


def test_a_token_is_needed_on_every_request_and_a_wide_bind_refuses_to_start_without_one():
    with pytest.raises(StropError, match="give it a token"):
        from strop.ui.server import make_server
        make_server("0.0.0.0", 0, None)
    with ui_server(token="s3cret") as guarded:
        status, body, _ = _get(guarded, "/api/runs")
        assert status == 401 and "/?token=TOKEN" in body["error"]
        assert _get(guarded, "/", )[0] == 401
        assert _get(guarded, "/api/runs", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert _get(guarded, "/api/runs", headers={"Authorization": "Bearer s3cret"})[0] == 200
        status, _, response = _get(guarded, "/?token=s3cret")
        cookie = response.getheader("Set-Cookie")
        assert status == 303 and response.getheader("Location") == "/" and "HttpOnly" in cookie
        assert _get(guarded, "/api/runs", headers={"Cookie": cookie.split(";")[0]})[0] == 200


def test_cli_refuses_a_wide_bind_without_a_token(capsys, monkeypatch):
    from strop.cli.main import main
    monkeypatch.delenv("STROP_UI_TOKEN", raising=False)
    assert main(["ui", "--host", "0.0.0.0", "--port", "0"]) == 1
    assert "STROP_UI_TOKEN" in capsys.readouterr().err


def test_every_page_asset_is_served_and_ships_in_the_wheel(server):
    from strop.ui.server import STATIC
    static = Path(__file__).resolve().parents[1] / "src" / "strop" / "ui" / "static"
    assert sorted(p.name for p in static.iterdir()) == sorted(STATIC)
    patterns = tomllib.loads((static.parents[3] / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["strop.ui"]
    for name in STATIC:
        assert any(fnmatch(f"static/{name}", p) for p in patterns), name
    html = _get(server, "/")[1].decode()
    for src in re.findall(r'(?:src|href)="(/static/[^"]+)"', html):
        status, body, response = _get(server, src)
        assert status == 200 and body and response.getheader("X-Content-Type-Options") == "nosniff"
    assert "http" not in "".join(re.findall(r'(?:src|href)="([^"]+)"', html))    # nothing from elsewhere


def test_evaluations_list_one_with_its_items_and_two_compared(server):
    a = make_evaluation("strop/tiny-random", [True, False, False, True])
    b = make_evaluation("model-12345678", [True, True, True, True])
    listed = [e["evaluationId"] for e in _get(server, "/api/evaluations")[1]["evaluations"]]
    assert listed[:2] == [b, a]
    one = _get(server, f"/api/evaluations/{a}")[1]
    assert one["summary"]["accuracy"] == 0.5 and one["itemsShown"] == 4 and one["items"][1]["extracted"] == "5"
    compared = _get(server, f"/api/compare?a={a}&b={b}")[1]
    assert compared["accuracy"]["delta"] == 0.5 and compared["mcnemar"] == {"p": 0.5, "aOnly": 0, "bOnly": 2}
    assert compared["items"][1]["a"]["correct"] is False and compared["items"][1]["b"]["correct"] is True
    # the dashboard's panels as data, worked by hand: A right on items 0 and 3, B right on all four, no judge
    panels = {p["id"]: p for p in compared["dashboard"]["panels"]}
    assert compared["dashboard"]["source"] == "exact match; no judge"
    assert panels["head-to-head"]["series"][0]["values"] == [2, 2, 0]          # B wins, ties, A wins
    assert [s["values"] for s in panels["means"]["series"]] == [[0.5], [1.0]]
    assert panels["histogram"]["categories"] == ["0", "1"]
    assert [s["values"] for s in panels["histogram"]["series"]] == [[2, 2], [0, 4]]
    assert panels["paired"]["items"] == [0, 1, 2, 3]
    assert [s["values"] for s in panels["paired"]["series"]] == [[1, 0, 0, 1], [1, 1, 1, 1]]
    assert panels["confusion"]["counts"] == [[0, 2], [0, 2]]                  # rows A 0/1, columns B 0/1
    assert panels["deltas"]["categories"] == ["#2", "#1", "#3", "#0"]
    assert panels["deltas"]["series"][0]["values"] == [1, 1, 0, 0]
    assert ["exact-match accuracy", "50.0%", "100.0%"] == compared["dashboard"]["summary"][0][:3]
    from strop.report.dashboard import dashboard_figure      # the static dashboard: the same panels, same titles
    drawn = [ax.get_title().replace("\n", " ") for ax in dashboard_figure(compared).axes][:6]
    assert drawn == [p["title"] for p in compared["dashboard"]["panels"]]
    assert drawn[5] == "Per-problem delta (model-12345678 - tiny-random) (exact match; no judge)"
    status, body, _ = _get(server, "/api/compare?a=eval-1&b=x")
    assert status == 400 and "is not an evaluation id" in body["error"]
    status, body, _ = _get(server, "/api/evaluations/eval-00000000")
    assert status == 404 and "no evaluation" in body["error"]


def test_env_eval_reports_with_their_rubrics(server):
    from strop.control import env_evals
    kept = env_evals.save(env_eval_report())
    listed = _get(server, "/api/env-evals")[1]["envEvals"]
    assert listed[0]["envEvalId"] == kept and listed[0]["splits"]["eval-single"]["rubrics"]["sqlErrors"] == 0.25
    one = _get(server, f"/api/env-evals/{kept}")[1]
    assert one["baseline"] == {"model": "strop/tiny-random", "splits": {"eval-single": {
        "n": 2, "pass@1": 0.0, "meanReward": 0.0, "rubrics": {"sqlErrors": 1.0}}}}     # episodes left out
    assert one["comparison"]["eval-single"]["modelOnly"] == 1 and HOSTILE not in json.dumps(one)
    status, body, _ = _get(server, "/api/env-evals/../../etc")
    assert status in (400, 404)
    status, body, _ = _get(server, "/api/env-evals/envEval-x")
    assert status == 400 and "is not an env-eval id" in body["error"]
    status, body, _ = _get(server, "/api/env-evals/envEval-00000000")
    assert status == 404 and "no env-eval report" in body["error"]


def test_strop_train_folders_are_runs_too(server):
    from strop.paths import runs_dir
    folder = runs_dir() / "20261203-120000-strop--tiny-random"
    (folder / "checkpoints" / "step-000002").mkdir(parents=True)
    (folder / "checkpoints" / "step-000002" / "manifest.json").write_text('{"step": 2}')
    (folder / "config.json").write_text(json.dumps({"base_model": "strop/tiny-random", "max_steps": 6,
                                                     "reward_terms": [{"grader": "builtin:gsm8k", "weight": 1.0}]}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward": s / 4}) + "\n" for s in range(3)))
    (folder / "rollouts.jsonl").write_text(json.dumps({"step": 0, "group": 0, "reward": 1.0, "completion": "4"}) + "\n")
    name = folder.name
    rows = _get(server, "/api/runs?project=(strop%20train)")[1]["runs"]
    assert [(r["runId"], r["status"], r["step"], r["maxSteps"], r["reward"], r["method"]) for r in rows] == [
        (name, "running", 3, 6, 0.5, "grpo")]                       # metrics written just now
    assert name in [r["runId"] for r in _get(server, "/api/runs")[1]["runs"]]
    assert _get(server, "/api/runs?status=stopped")[1]["runs"] == []
    info = _get(server, f"/api/runs/{name}")[1]
    assert info["descriptor"]["max_steps"] == 6 and [c["step"] for c in info["checkpoints"]] == [2]
    assert [r["step"] for r in _get(server, f"/api/runs/{name}/metrics")[1]["rows"]] == [0, 1, 2]
    assert _get(server, f"/api/runs/{name}/rollouts")[1]["rows"][0]["completion"] == "4"
    status, body, _ = _get(server, f"/api/runs/{name}/cancel", headers={"Content-Type": "application/json"},
                           method="POST", body=b"{}")
    assert status == 409 and "Ctrl-C" in body["error"]
    (folder / "final").mkdir()
    assert _get(server, f"/api/runs/{name}")[1]["status"] == "succeeded"
    status, body, _ = _get(server, "/api/runs/not-a-folder")
    assert status == 404 and "neither in the store" in body["error"]


def test_a_fault_is_a_500_that_says_so_and_the_server_keeps_answering(server):
    run_id = make_run("fault", steps=0)
    (run_dir(run_id) / "metrics.jsonl").mkdir()          # not a file: reading it fails
    status, body, _ = _get(server, f"/api/runs/{run_id}/metrics")
    assert status == 500 and "IsADirectoryError" in body["error"] and "stderr" in body["error"]
    assert _get(server, "/api/projects")[0] == 200


def test_the_sample_box_answers_from_a_selected_base_model(server, tiny_model_dir):
    from strop.store import open_store, session_scope
    from strop.store.schema import SelectedBaseModel
    with session_scope(open_store()) as s:
        if s.get(SelectedBaseModel, "strop/tiny-random") is None:
            s.add(SelectedBaseModel(id="strop/tiny-random", path=str(tiny_model_dir)))
    post = lambda body: _get(server, "/api/sample", headers={"Content-Type": "application/json"}, method="POST",
                             body=json.dumps(body).encode())
    status, body, _ = post({"model": "strop/tiny-random", "prompt": "What is 2 + 2?", "maxTokens": 5})
    assert status == 200 and 1 <= body["tokens"] <= 5 and isinstance(body["text"], str), body
    status, again, _ = post({"model": "strop/tiny-random", "prompt": "What is 2 + 2?", "maxTokens": 5})
    assert again["text"] == body["text"]                       # greedy: the same reply
    status, body, _ = post({"model": "strop/tiny-random", "prompt": "x", "maxTokens": 100000})
    assert status == 409 and "maxTokens must be a whole number from 1 to 512" in body["error"]
    status, body, _ = post({"model": "nobody/none", "prompt": "x"})
    assert status == 409 and "strop base-models select" in body["error"]
    status, body, _ = _get(server, "/api/sample", headers={"Content-Type": "application/json"}, method="POST",
                           body=b"x" * (65 << 10))
    assert status == 413
