"""Comparing two evaluations: the statistics, evaluation config files with judge metrics, the result tables
(through SQLAlchemy to any URL), and the report, through the `strop` command as a user runs it."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import sqlalchemy as sa

from strop.evals.compare import ComparisonError, compare, comparison_table
from strop.evals.config import EvalConfigError, load_eval_config
from strop.evals.sql_tables import ResultsError, write_tables
from loopback import chat_completion, send_json
from test_control import home, run, rows_file  # noqa: F401 - the fixture and helpers of the control-plane tests


def items(correct, judge=None):
    return [{"index": i, "question": f"q{i}", "gold": str(i), "extracted": str(i if c else -1), "correct": c,
             "response": "...", "judge": None if judge is None or judge[i] is None else {"scores": judge[i]}}
            for i, c in enumerate(correct)]


JUDGE_SUMMARY = {"metrics": ["answer_correctness", "reasoning_quality"],
                 "ranges": {"answer_correctness": [0, 5], "reasoning_quality": [0, 5]}}


def test_statistics_of_a_comparison_worked_by_hand():
    a = items([True, False, False, True, False, False])
    b = items([True, True, True, True, True, False],
              judge=[{"answer_correctness": 5, "reasoning_quality": 4}] * 5 + [None])
    a_judge = items([0] * 6, judge=[{"answer_correctness": 0, "reasoning_quality": 4}] * 6)
    for x, y in zip(a, a_judge):
        x["judge"] = y["judge"]
    c = compare(a, b, a={"label": "base", "model": "m0", "evaluationId": "e1"},
                b={"label": "tuned", "model": "m1", "evaluationId": "e2"},
                judge_a={**JUDGE_SUMMARY, "means": {"answer_correctness": 0.0, "reasoning_quality": 4.0, "combined": 4.0},
                         "failures": 0, "kappa": 0.0},
                judge_b={**JUDGE_SUMMARY, "means": {"answer_correctness": 5.0, "reasoning_quality": 4.0, "combined": 9.0},
                         "failures": 1, "kappa": 1.0})
    assert c["accuracy"]["a"] == pytest.approx(2 / 6) and c["accuracy"]["b"] == pytest.approx(5 / 6)
    assert c["accuracy"]["delta"] == pytest.approx(0.5)
    low, high = c["accuracy"]["ci95"]
    assert 0 < low <= 0.5 <= high <= 1  # three wins, no losses: the interval stays above 0
    assert c["mcnemar"] == {"p": pytest.approx(0.25), "aOnly": 0, "bOnly": 3}  # 2 * (1/2)^3
    judge = c["judge"]
    assert judge["means"]["delta"] == {"answer_correctness": 5.0, "reasoning_quality": 0.0, "combined": 5.0}
    # item 5 has no verdict for B: it is left out of the head-to-head, not counted as a loss
    assert judge["winTieLoss"] == {"bWins": 5, "ties": 0, "aWins": 0}
    assert judge["failures"] == {"a": 0, "b": 1}
    table = comparison_table(c)
    assert "Answer Correctness /5" in table and "Exact Match Accuracy" in table and "+50.0%" in table
    assert "McNemar p = 0.25" in table and "not significant" in table
    with pytest.raises(ComparisonError, match="not on the same items"):
        compare(a, b[:5], a={}, b={})


def test_result_tables_overwrite_and_append(tmp_path):
    c = compare(items([True, False]), items([True, True]), a={"label": "a", "model": "m0", "evaluationId": "e1"},
                b={"label": "b", "model": "m1", "evaluationId": "e2"})
    url = f"sqlite:///{tmp_path / 'results.db'}"
    assert write_tables(c, url=url)["tables"] == {"strop_eval_comparison": 2, "strop_judge_scores": 0}
    write_tables(c, url=url, mode="append")
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM strop_eval_comparison")) == 4
        write_tables(c, url=url, mode="overwrite")
        rows = conn.execute(sa.text("SELECT question, correct_a, correct_b, answer_b FROM strop_eval_comparison "
                                    "ORDER BY item_index")).all()
    assert [tuple(r) for r in rows] == [("q0", 1, 1, "0"), ("q1", 0, 1, "1")]
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE strop_eval_comparison"))
        conn.execute(sa.text("CREATE TABLE strop_eval_comparison (something TEXT)"))
    for mode in ("append", "replace"):
        with pytest.raises(ResultsError, match="append and replace need strop's layout"):
            write_tables(c, url=url, mode=mode)
    with pytest.raises(ResultsError, match="--mode"):
        write_tables(c, url=url, mode="replace")
    with pytest.raises(ResultsError, match="could not write results"):
        write_tables(c, url=f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")


def test_eval_config_files(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("""
version: "1.0"
agent:
  name: "model-1234"
  type: "cortex agent"
dataset:
  table: "math/eval"
  input_column: "INPUT_QUERY"
  ground_truth_column: "GROUND_TRUTH"
metrics:
  - name: "answer_correctness"
    type: "builtin"
  - name: "math_reasoning"
    type: "custom"
    prompt: |
      Evaluate the mathematical reasoning in the agent response.
    score_range: [1, 5]
""")
    config = load_eval_config(path)  # seed 000's file, as written
    assert (config.model, config.dataset, config.judge) == ("model-1234", "math/eval", "local")
    assert config.fields == {"question": "INPUT_QUERY", "answer": "GROUND_TRUTH"}
    assert [m["name"] for m in config.metrics] == ["answer_correctness", "math_reasoning"]
    path.write_text("dataset: 3\nlimit: 0\nmetrics:\n  - name: nope\n    type: builtin\nextra: 1\n")
    with pytest.raises(EvalConfigError) as err:
        load_eval_config(path)
    for part in ("unknown keys ['extra']", "dataset:", "limit:", "not built in"):  # every mistake at once
        assert part in str(err.value)
    path.write_text("dataset: [unclosed")
    with pytest.raises(EvalConfigError, match="not valid YAML"):
        load_eval_config(path)


def test_judged_evaluations_compared_into_tables_and_a_report(home, tmp_path, capsys, tiny_model_dir,  # noqa: F811
                                                              monkeypatch):
    from strop.serve import make_server
    server = make_server(str(tiny_model_dir), port=0, name="judge", api_key="sekret")
    monkeypatch.setenv("JUDGE_KEY", "sekret")  # the workers read the key from the variable named
    threading.Thread(target=server.serve_forever, daemon=True).start()
    judge = f"openai:judge@http://127.0.0.1:{server.server_port}/v1"
    try:
        assert run(capsys, "base-models", "select", "strop/tiny-random", "--wait")[0] == 0
        run(capsys, "registry", "datasets", "register", "arith/eval", "-f", rows_file(tmp_path / "eval.jsonl", 5))
        config = tmp_path / "eval.yaml"
        config.write_text(f"dataset: arith/eval\nmaxTokens: 6\nlimit: 4\njudge:\n  model: {judge}\n  retries: 1\n"
                          "metrics:\n  - answer_correctness\n  - name: brevity\n    prompt: Is it short?\n"
                          "    score_range: [1, 3]\n")
        evals = []
        for model in ("strop/tiny-random", f"openai:judge@http://127.0.0.1:{server.server_port}/v1"):
            code, out, err = run(capsys, "evaluations", "start", "--model", model, "--config", config,
                                 "--api-key-env", "JUDGE_KEY", "--jq", ".evaluationId")
            assert code == 0, err
            evals.append(out.strip())
        for evaluation in evals:
            code, out, _ = run(capsys, "evaluations", "wait", evaluation, "--exit-status", "--timeout", "300", "-o", "json")
            info = json.loads(out)
            assert code == 0 and info["summary"]["n"] == 4 and info["judge"] == judge
            assert info["summary"]["judge"]["failures"] == 0 and info["summary"]["judge"]["schemaEnforced"]
        report = json.loads(run(capsys, "evaluations", "report", evals[0], "-o", "json")[1])
        assert all(set(i["judge"]["scores"]) == {"answer_correctness", "brevity"} for i in report["items"])
        assert "judge openai:judge@" in run(capsys, "evaluations", "report", evals[0])[1]

        url = f"sqlite:///{tmp_path / 'results.db'}"
        code, out, err = run(capsys, "compare", *evals, "--labels", "base,served", "--results-url", url,
                             "--report", tmp_path / "report")
        assert code == 0, err
        assert "Exact Match Accuracy" in out and "Brevity /3" in out and "McNemar" in out
        assert (tmp_path / "report" / "report.html").exists() and (tmp_path / "report" / "dashboard.png").exists()
        with sa.create_engine(url).connect() as conn:
            assert conn.scalar(sa.text("SELECT count(*) FROM strop_eval_comparison")) == 4
            scores = conn.execute(sa.text("SELECT side, metric, score FROM strop_judge_scores")).all()
        assert len(scores) == 4 * 2 * 2 and all(1 <= s for _, m, s in scores if m == "brevity")
        code, out, _ = run(capsys, "compare", *evals, "--no-tables", "-o", "json")
        assert code == 0 and json.loads(out)["judge"]["metrics"] == ["answer_correctness", "brevity"]

        code, _, err = run(capsys, "evaluations", "start", "--model", "strop/tiny-random", "--dataset", "arith/eval",
                           "--judge", "openai:no-url")
        assert code == 1 and "openai:NAME@URL" in err
        code, _, err = run(capsys, "compare", evals[0], "eval-nope")
        assert code == 1 and "no evaluation" in err
    finally:
        server.shutdown()
        server.server_close()


def test_replace_swaps_only_this_comparisons_rows(tmp_path):
    side = {"label": "a", "model": "m0"}
    first = compare(items([True, False]), items([True, True]), a={**side, "evaluationId": "e1"},
                    b={**side, "evaluationId": "e2"})
    second = compare(items([False, False, True]), items([True, True, True]), a={**side, "evaluationId": "e3"},
                     b={**side, "evaluationId": "e4"})
    url = f"sqlite:///{tmp_path / 'results.db'}"
    write_tables(first, url=url, mode="append")
    write_tables(second, url=url, mode="replace")
    write_tables(second, url=url, mode="replace")  # run again: its rows are swapped, not doubled
    with sa.create_engine(url).connect() as conn:
        counts = dict(conn.execute(sa.text("SELECT comparison_id, count(*) FROM strop_eval_comparison "
                                           "GROUP BY comparison_id")).all())
    assert counts == {first["comparisonId"]: 2, second["comparisonId"]: 3}


class _Endpoint(BaseHTTPRequestHandler):
    """Answers every question right, except that model `flaky` gets a 400 for the first question."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        question = body["messages"][-1]["content"]
        if body["model"] == "flaky" and question.startswith("What is 0 "):
            status, payload = 400, {"error": {"message": "this one is refused", "type": "invalid_request_error"}}
        else:
            answer = int(question.split()[2]) + 1
            status, payload = 200, chat_completion(body["model"], {"content": f"#### {answer}"}, completion_tokens=3)
        send_json(self, status, payload)

    def log_message(self, *args):
        pass


def test_failed_requests_fail_or_flag_an_evaluation_and_strop_report_writes_files(home, tmp_path, capsys):  # noqa: F811
    from loopback import closed_port
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        run(capsys, "registry", "datasets", "register", "arith/eval", "-f", rows_file(tmp_path / "eval.jsonl", 4))
        # nothing listens: the evaluation fails with the first error, instead of "succeeding" at 0%
        code, out, err = run(capsys, "evaluations", "start", "--model", f"openai:big@http://127.0.0.1:{closed_port()}/v1",
                             "--dataset", "arith/eval", "--max-retries", "0", "--timeout", "5", "--concurrency", "2",
                             "--jq", ".evaluationId")
        assert code == 0, err
        dead = out.strip()
        code, out, _ = run(capsys, "evaluations", "wait", dead, "--exit-status", "--timeout", "120")
        assert code == 1 and "every request to openai:big@" in out and "(4 of 4)" in out and "Connect" in out
        info = json.loads(run(capsys, "evaluations", "get", dead, "-o", "json")[1])
        assert info["endpoint"] == {"concurrency": 2, "maxRetries": 0, "timeout": 5.0}  # stored with it

        evals = []
        for model in ("flaky", "steady"):
            code, out, err = run(capsys, "evaluations", "start", "--model", f"openai:{model}@{url}", "--dataset",
                                 "arith/eval", "--max-retries", "0", "--jq", ".evaluationId")
            assert code == 0, err
            evals.append(out.strip())
            assert run(capsys, "evaluations", "wait", evals[-1], "--exit-status", "--timeout", "120")[0] == 0
        code, out, _ = run(capsys, "evaluations", "get", evals[0])
        assert "request errors: 1 of 4 requests failed and count as wrong" in out and "this one is refused" in out
        assert "request errors" not in run(capsys, "evaluations", "report", evals[1])[1]
        code, out, err = run(capsys, "compare", *evals, "--no-tables")
        assert code == 0 and "warning: request errors: flaky 1, steady 0 of 4; failed requests count as wrong" in out
        assert "warning: failed requests, each counted as wrong: flaky 1 of 4, steady 0 of 4" in err

        # strop report as a user runs it: a bad run leaves no folder; a comparison gives the files
        code, _, err = run(capsys, "report", "--run", "run-nope", "--out", tmp_path / "nope")
        assert code == 1 and "no run 'run-nope'" in err and not (tmp_path / "nope").exists()
        code, out, err = run(capsys, "report", "--compare", *evals, "--labels", "flaky,steady", "--out",
                             tmp_path / "report", "-o", "json")
        assert code == 0, err
        files = json.loads(out)
        assert set(files) == {"dashboard", "comparison", "html"} and "training" not in files
        assert all((tmp_path / "report" / name).stat().st_size > 1000 for name in ("report.html", "dashboard.png"))
        code, _, err = run(capsys, "report", "--out", tmp_path / "report")
        assert code == 1 and "--compare EVAL_A EVAL_B, --run RUN" in err
    finally:
        server.shutdown()
        server.server_close()
