"""The control plane through the `strop` command: registry, projects, base models, runs in the background."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from strop.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def home(tmp_path, monkeypatch):
    """A fresh STROP_HOME (and so a fresh SQLite store) per test."""
    from strop.store import clear_engine_cache
    monkeypatch.setenv("STROP_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("STROP_DATABASE_URL", raising=False)
    clear_engine_cache()
    yield tmp_path / "home"
    clear_engine_cache()


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def rows_file(path: Path, n: int, start: int = 0) -> Path:
    path.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}) + "\n"
                            for i in range(start, start + n)))
    return path


@pytest.fixture()
def workspace(home, tmp_path, capsys):
    """A project with a registered dataset, the example scoring bundle and the tiny model selected."""
    assert run(capsys, "registry", "datasets", "register", "arith/train", "-f", rows_file(tmp_path / "train.jsonl", 12))[0] == 0
    assert run(capsys, "registry", "bundles", "register", "arith/scoring", "-f", ROOT / "examples" / "gsm8k" / "scoring")[0] == 0
    assert run(capsys, "projects", "create", "arith")[0] == 0
    assert run(capsys, "base-models", "select", "strop/tiny-random", "--wait")[0] == 0
    return tmp_path


def descriptor(tmp_path: Path, **changes) -> Path:
    data = {"kind": "run", "project": "arith", "configName": "tiny", "baseModel": "strop/tiny-random",
            "config": {"dataset": "arith/train", "method": "grpo",
                       "rlHyperparams": {"epochs": 1, "maxSteps": 4, "groupSize": 2, "klBeta": 0.0, "temperature": 1.0,
                                         "maxCompletionLength": 6, "batchSize": 2, "lora": {"rank": 4},
                                         "optimizer": {"learningRate": 1e-3}},
                       "reward": {"terms": [{"kind": "rule", "weight": 1.0, "bundle": "arith/scoring", "module": "reward"}]},
                       "maxSeqLength": 512},
            "execution": {"gpus": 0, "saveEvery": 2, "keepAdapters": 2}}
    for path, value in changes.items():
        node = data
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    out = tmp_path / f"run-{len(list(tmp_path.glob('run-*.json')))}.json"
    out.write_text(json.dumps(data))
    return out


def tensorboard_tags(run_id: str) -> str:
    """Start `strop runs tensorboard RUN` as a person would, and read its scalar tags over HTTP."""
    import socket
    import subprocess
    import sys
    import urllib.request
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "strop.cli.main", "runs", "tensorboard", run_id, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as reply:
                    return reply.read().decode()
            except OSError:
                time.sleep(0.5)
        raise AssertionError("TensorBoard did not answer within 90 s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        with pytest.raises(OSError):  # stopping the command stopped TensorBoard: nothing is left serving
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)


# ---- registry -------------------------------------------------------------------------------------------

def test_dataset_versions_are_immutable_and_deduplicated(home, tmp_path, capsys):
    first = rows_file(tmp_path / "a.jsonl", 3)
    code, out, _ = run(capsys, "registry", "datasets", "register", "d/train", "-f", first, "-o", "json")
    assert code == 0 and json.loads(out)["version"] == 1 and json.loads(out)["created"]
    code, out, _ = run(capsys, "registry", "datasets", "register", "d/train", "-f", first, "-o", "json")
    assert json.loads(out)["version"] == 1 and not json.loads(out)["created"]
    code, out, _ = run(capsys, "registry", "datasets", "register", "d/train", "-f", rows_file(tmp_path / "b.jsonl", 5),
                       "--jq", ".ref")
    assert out.strip() == "d/train@2"
    first.write_text("changed")  # the registered copy is the one stored, not the file
    code, out, _ = run(capsys, "registry", "datasets", "get", "d/train@1", "-o", "json")
    assert json.loads(out)["rows"] == 3
    code, out, _ = run(capsys, "registry", "datasets", "list", "-o", "json")
    assert json.loads(out) == [{**json.loads(out)[0], "name": "d/train", "latestVersion": 2, "versions": 2, "rows": 5}]


def test_bad_datasets_and_refs_are_refused_with_the_line(home, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q2"}\n')
    code, _, err = run(capsys, "registry", "datasets", "register", "d", "-f", bad)
    assert code == 1 and "line 2" in err and "answer" in err
    code, _, err = run(capsys, "registry", "datasets", "get", "d")
    assert code == 1 and "no dataset named 'd'" in err  # nothing half-registered
    code, _, err = run(capsys, "registry", "datasets", "register", "bad name!", "-f", rows_file(tmp_path / "ok.jsonl", 1))
    assert code == 1 and "not allowed" in err
    code, _, err = run(capsys, "registry", "datasets", "get", "d@zero")
    assert code == 1 and "version number" in err


def test_bundles_are_checked_in_a_subprocess(home, tmp_path, capsys):
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / "reward.py").write_text("def compute_score(solution_str):\n    return 1.0\n")
    code, _, err = run(capsys, "registry", "bundles", "register", "b", "-f", folder)
    assert code == 1 and "signature" in err
    (folder / "reward.py").write_text("import no_such_module\n")
    code, _, err = run(capsys, "registry", "bundles", "register", "b", "-f", folder)
    assert code == 1 and "no_such_module" in err
    code, _, err = run(capsys, "registry", "bundles", "register", "b", "-f", tmp_path / "missing")
    assert code == 1 and "does not exist" in err
    code, out, _ = run(capsys, "registry", "bundles", "register", "b", "-f", ROOT / "examples" / "gsm8k" / "scoring",
                       "-o", "json")
    assert code == 0 and json.loads(out)["info"]["files"] == ["reward.py"]


# ---- projects and base models ----------------------------------------------------------------------------

def test_projects(home, tmp_path, capsys):
    assert run(capsys, "projects", "create", "p")[0] == 0
    code, _, err = run(capsys, "projects", "create", "p")
    assert code == 1 and "already exists" in err
    code, _, err = run(capsys, "projects", "set-evaluation", "p", "--dataset", "nope", "--grader", "builtin:gsm8k")
    assert code == 1 and "no dataset named 'nope'" in err
    run(capsys, "registry", "datasets", "register", "p/eval", "-f", rows_file(tmp_path / "e.jsonl", 2))
    assert run(capsys, "projects", "set-evaluation", "p", "--dataset", "p/eval", "--grader", "builtin:gsm8k")[0] == 0
    code, _, err = run(capsys, "projects", "set-evaluation", "p", "--dataset", "p/eval", "--grader", "bundle:none#r:f")
    assert code == 1 and "no bundle named 'none'" in err
    code, out, _ = run(capsys, "projects", "get", "p", "-o", "json")
    assert json.loads(out)["evaluation"] == {"dataset": "p/eval", "grader": "builtin:gsm8k"}
    code, out, _ = run(capsys, "projects", "list", "--jq", ".[].name")
    assert out.split() == ["p"]


# ---- runs ------------------------------------------------------------------------------------------------

def test_dry_run_names_every_mistake(workspace, capsys):
    bad = descriptor(workspace, **{"config.rlHyperparams.groupSize": 1, "config.rlHyperparams.temperature": "hot",
                                   "execution.savEvery": 3})
    code, out, err = run(capsys, "runs", "start", "-f", bad, "--dry-run")
    assert code == 1 and out == ""
    for path in ("$.config.rlHyperparams.groupSize", "$.config.rlHyperparams.temperature", "$.execution.savEvery"):
        assert path in err


def test_admission_names_what_is_missing(workspace, capsys):
    bad = descriptor(workspace, project="nope", baseModel="HuggingFaceTB/SmolLM2-135M-Instruct",
                     **{"config.dataset": "arith/train@7"})
    code, _, err = run(capsys, "runs", "start", "-f", bad)
    assert code == 1
    assert "$.project" in err and "strop projects create nope" in err
    assert "$.baseModel" in err and "strop base-models select" in err
    assert "$.config.dataset" in err and "no version 7" in err
    code, out, _ = run(capsys, "runs", "list", "-o", "json")
    assert json.loads(out) == []


def test_admission_refuses_a_tracker_whose_package_is_missing(workspace, capsys, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a package that cannot be imported
    code, out, err = run(capsys, "runs", "start", "-f",
                         descriptor(workspace, **{"execution.reportTo": ["tensorboard", "wandb"]}), "--dry-run")
    assert code == 1 and out == ""
    assert "$.execution.reportTo: the wandb tracker needs the 'wandb' package" in err and '".[wandb]"' in err
    code, out, _ = run(capsys, "runs", "start", "-f", descriptor(workspace, **{"execution.reportTo": []}),
                       "--dry-run", "-o", "json")
    assert code == 0 and json.loads(out)["valid"]


def test_execution_gpus_is_honoured_and_more_than_found_is_refused(workspace, capsys):
    from strop.engine.precision import cuda_count
    found = cuda_count()
    code, out, err = run(capsys, "runs", "start", "-f", descriptor(workspace, **{"execution.gpus": found + 3}),
                         "--dry-run")
    assert code == 1 and out == ""
    assert "$.execution.gpus" in err and f"asks for {found + 3} GPUs" in err and f"torch sees {found} CUDA GPU" in err
    code, out, _ = run(capsys, "runs", "start", "-f", descriptor(workspace, **{"execution.gpus": 0}), "--dry-run",
                       "-o", "json")
    assert code == 0 and json.loads(out)["pinned"]["device"] == "cpu"  # 0 computes on the CPU, GPU or not
    # one GPU: on it where there is one; the seeds' descriptors ask for one and run on CPU machines too
    code, out, _ = run(capsys, "runs", "start", "-f", descriptor(workspace, **{"execution.gpus": 1}), "--dry-run",
                       "-o", "json")
    assert code == 0 and json.loads(out)["pinned"]["device"] == ("cuda" if found else "cpu")
    code, out, err = run(capsys, "runs", "list", "-o", "json")
    assert json.loads(out) == []


def test_run_in_background_to_a_model(workspace, capsys):
    code, out, _ = run(capsys, "runs", "start", "-f", descriptor(workspace), "--dry-run", "-o", "json")
    assert code == 0 and json.loads(out)["pinned"]["dataset"]["ref"] == "arith/train@1"
    code, out, _ = run(capsys, "runs", "start", "-f", descriptor(workspace), "-o", "json", "--jq", ".runId")
    run_id = out.strip()
    assert code == 0 and run_id.startswith("run-")
    # a new bundle version registered now must not change the admitted run
    run(capsys, "registry", "bundles", "register", "arith/scoring", "-f", ROOT / "examples" / "gsm8k" / "scoring",
        "--module", "reward")
    code, out, err = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300", "-o", "json")
    info = json.loads(out)
    assert code == 0, info
    assert info["status"] == "succeeded" and info["step"] == 4 and info["modelId"].startswith("model-")
    assert info["pinned"]["terms"][0]["bundle"] == "arith/scoring@1" and "step 4/4" in err
    code, out, _ = run(capsys, "runs", "metrics", run_id, "-o", "json")
    steps = json.loads(out)
    assert [r["step"] for r in steps] == [0, 1, 2, 3] and all("zeroVarianceGroups" in r for r in steps)
    code, out, _ = run(capsys, "runs", "metrics", run_id)
    assert out.splitlines()[0].split()[:3] == ["STEP", "ZERO-VAR", "REWARD"]
    code, out, _ = run(capsys, "runs", "tensorboard", run_id, "--print-logdir")
    assert Path(out.strip()).is_dir() and list(Path(out.strip()).glob("events.out.tfevents.*"))
    assert "reward" in tensorboard_tags(run_id)
    code, _, err = run(capsys, "runs", "resume", run_id)
    assert code == 1 and "already succeeded" in err


def test_two_runs_at_once_both_finish_with_all_rows(workspace, capsys):
    ids = [run(capsys, "runs", "start", "-f", descriptor(workspace), "--jq", ".runId")[1].strip() for _ in range(2)]
    for run_id in ids:
        code, out, _ = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "400", "-o", "json")
        assert code == 0, out
        code, out, _ = run(capsys, "runs", "metrics", run_id, "-o", "json")
        assert [r["step"] for r in json.loads(out)] == [0, 1, 2, 3]


def test_killed_worker_shows_failed_then_resumes(workspace, capsys):
    folder = workspace / "slow"
    folder.mkdir()
    (folder / "reward.py").write_text("import time\n\ndef compute_score(data_source=None, solution_str=None, "
                                      "ground_truth=None, extra_info=None):\n    time.sleep(0.25)\n"
                                      "    return len(solution_str) % 3 / 3\n")
    assert run(capsys, "registry", "bundles", "register", "arith/slow", "-f", folder)[0] == 0
    terms = [{"kind": "rule", "weight": 1.0, "bundle": "arith/slow", "module": "reward"}]
    slow = descriptor(workspace, **{"config.rlHyperparams.maxSteps": 6, "config.reward.terms": terms})
    run_id = run(capsys, "runs", "start", "-f", slow, "--jq", ".runId")[1].strip()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        info = json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])
        if info["step"] >= 3:
            break
        time.sleep(0.05)
    os.kill(info["workerPid"], signal.SIGKILL)
    time.sleep(0.5)
    code, out, _ = run(capsys, "runs", "get", run_id, "-o", "json")
    info = json.loads(out)
    assert info["status"] == "failed" and "died" in info["error"] and info["step"] < 6
    code, out, _ = run(capsys, "runs", "list", "-o", "json")
    assert json.loads(out)[0]["status"] == "failed"
    assert run(capsys, "runs", "resume", run_id)[0] == 0
    code, out, _ = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 0, out
    code, out, _ = run(capsys, "runs", "metrics", run_id, "-o", "json")
    assert [r["step"] for r in json.loads(out)] == list(range(6))


def test_cancel_stops_the_worker(workspace, capsys):
    # long enough that it cannot finish between being seen running and the cancel (200 steps once did, in a busy suite)
    long = descriptor(workspace, **{"config.rlHyperparams.maxSteps": 5000, "config.rlHyperparams.epochs": 1000})
    run_id = run(capsys, "runs", "start", "-f", long, "--jq", ".runId")[1].strip()
    deadline = time.monotonic() + 120
    while json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    code, out, _ = run(capsys, "runs", "cancel", run_id, "-o", "json")
    assert code == 0 and json.loads(out)["status"] == "cancelled" and json.loads(out)["workerPid"] is None
    code, _, err = run(capsys, "runs", "cancel", run_id)
    assert code == 1 and "nothing to cancel" in err
    code, _, err = run(capsys, "runs", "get", "run-nope")
    assert code == 1 and "no run 'run-nope'" in err


# ---- models and evaluations ------------------------------------------------------------------------------

def test_evaluate_a_tuned_model_and_keep_it_while_used(workspace, capsys):
    run_id = run(capsys, "runs", "start", "-f", descriptor(workspace, **{"config.rlHyperparams.maxSteps": 1}),
                 "--jq", ".runId")[1].strip()
    assert run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300")[0] == 0
    model = run(capsys, "runs", "get", run_id, "--jq", ".modelId")[1].strip()
    code, out, _ = run(capsys, "models", "list", "-o", "json")
    assert [m["modelId"] for m in json.loads(out)] == [model]
    assert Path(json.loads(run(capsys, "models", "get", model, "-o", "json")[1])["adapterPath"]).is_dir()

    run(capsys, "registry", "datasets", "register", "arith/eval", "-f", rows_file(workspace / "eval.jsonl", 3, start=50))
    code, out, _ = run(capsys, "evaluations", "start", "--model", model, "--dataset", "arith/eval", "--grader",
                       "bundle:arith/scoring#reward:compute_score", "--max-tokens", "6", "--jq", ".evaluationId")
    evaluation = out.strip()
    assert code == 0 and evaluation.startswith("eval-")
    code, out, _ = run(capsys, "evaluations", "wait", evaluation, "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 0, out
    code, out, _ = run(capsys, "evaluations", "report", evaluation, "-o", "json")
    report = json.loads(out)
    assert report["summary"]["n"] == 3 and len(report["items"]) == 3
    assert report["items"][0]["question"] == "What is 50 + 1?" and report["items"][0]["gold"] == "51"
    assert report["summary"]["accuracy"] == sum(i["correct"] for i in report["items"]) / 3
    code, out, _ = run(capsys, "evaluations", "report", evaluation)
    assert "accuracy" in out and "parse failures" in out

    code, _, err = run(capsys, "models", "delete", model)
    assert code == 1 and evaluation in err  # the evaluation that uses it is named
    code, _, err = run(capsys, "evaluations", "start", "--model", "model-nope", "--dataset", "arith/eval",
                       "--grader", "builtin:gsm8k")
    assert code == 1 and "no such model" in err
    code, _, err = run(capsys, "evaluations", "start", "--model", "strop/tiny-random", "--dataset", "arith/eval",
                       "--grader", "builtin:nope")
    assert code == 1 and "builtin:gsm8k" in err


def test_base_model_evaluation_and_model_delete(workspace, capsys):
    run(capsys, "registry", "datasets", "register", "arith/eval", "-f", rows_file(workspace / "eval.jsonl", 2))
    evaluation = run(capsys, "evaluations", "start", "--model", "strop/tiny-random", "--dataset", "arith/eval",
                     "--grader", "builtin:gsm8k", "--max-tokens", "4", "--samples", "3", "--jq", ".evaluationId")[1].strip()
    code, out, _ = run(capsys, "evaluations", "wait", evaluation, "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 0 and "pass@3" in json.loads(out)["summary"]
    run_id = run(capsys, "runs", "start", "-f", descriptor(workspace, **{"config.rlHyperparams.maxSteps": 1}),
                 "--jq", ".runId")[1].strip()
    run(capsys, "runs", "wait", run_id, "--timeout", "300")
    model = run(capsys, "runs", "get", run_id, "--jq", ".modelId")[1].strip()
    assert run(capsys, "models", "delete", model)[0] == 0
    code, _, err = run(capsys, "models", "get", model)
    assert code == 1 and "no model" in err


@pytest.mark.postgres
def test_same_commands_on_postgresql(tmp_path, monkeypatch, capsys):
    """The whole flow, registry to a finished run, with the state in a PostgreSQL server (CI starts one)."""
    url = os.environ.get("STROP_TEST_POSTGRES_URL", "").strip()
    if not url:
        pytest.skip("STROP_TEST_POSTGRES_URL is not set: this test needs a PostgreSQL server (CI starts one)")
    import sqlalchemy as sa

    from strop.store import clear_engine_cache, get_engine
    from strop.store.db import VERSION_TABLE
    from strop.store.schema import Base
    engine = get_engine(url)
    Base.metadata.drop_all(engine)  # a clean slate: the URL names a scratch database
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {VERSION_TABLE}"))
    clear_engine_cache()
    monkeypatch.setenv("STROP_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("STROP_DATABASE_URL", url)
    try:
        assert run(capsys, "registry", "datasets", "register", "arith/train", "-f", rows_file(tmp_path / "t.jsonl", 4))[0] == 0
        assert run(capsys, "registry", "bundles", "register", "arith/scoring", "-f", ROOT / "examples" / "gsm8k" / "scoring")[0] == 0
        assert run(capsys, "projects", "create", "arith")[0] == 0
        assert run(capsys, "projects", "create", "arith")[0] == 1
        assert run(capsys, "base-models", "select", "strop/tiny-random")[0] == 0
        run_id = run(capsys, "runs", "start", "-f", descriptor(tmp_path, **{"config.rlHyperparams.maxSteps": 2}),
                     "--jq", ".runId")[1].strip()
        code, out, _ = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300", "-o", "json")
        assert code == 0, out
        code, out, _ = run(capsys, "runs", "metrics", run_id, "-o", "json")
        assert [r["step"] for r in json.loads(out)] == [0, 1]
        assert not (tmp_path / "home" / "strop.db").exists()  # nothing went to SQLite
    finally:
        clear_engine_cache()


def test_the_projects_evaluation_runs_when_a_run_ends(workspace, capsys):
    run(capsys, "registry", "datasets", "register", "arith/eval", "-f", rows_file(workspace / "eval.jsonl", 2, start=70))
    assert run(capsys, "projects", "set-evaluation", "arith", "--dataset", "arith/eval", "--grader",
               "bundle:arith/scoring#reward:compute_score")[0] == 0
    run_id = run(capsys, "runs", "start", "-f", descriptor(workspace, **{"config.rlHyperparams.maxSteps": 1}),
                 "--jq", ".runId")[1].strip()
    assert run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300")[0] == 0
    info = json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])
    [evaluation] = info["evaluations"]
    code, out, _ = run(capsys, "evaluations", "wait", evaluation, "--exit-status", "--timeout", "300", "-o", "json")
    result = json.loads(out)
    assert code == 0 and result["modelId"] == info["modelId"] and result["dataset"] == "arith/eval@1"
    assert result["summary"]["n"] == 2


def test_eval_every_evaluates_during_training(workspace, capsys):
    every = descriptor(workspace, **{"config.rlHyperparams.maxSteps": 4, "config.evalEvery": 2})
    code, _, err = run(capsys, "runs", "start", "-f", every, "--dry-run")
    assert code == 1 and "$.config.evalEvery" in err and "set-evaluation" in err  # no evaluation settings yet
    run(capsys, "registry", "datasets", "register", "arith/eval", "-f", rows_file(workspace / "eval.jsonl", 2, start=80))
    run(capsys, "projects", "set-evaluation", "arith", "--dataset", "arith/eval", "--grader", "builtin:gsm8k")
    run_id = run(capsys, "runs", "start", "-f", every, "--jq", ".runId")[1].strip()
    assert run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300")[0] == 0
    evaluations = json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])["evaluations"]
    assert len(evaluations) == 2  # after step 2 in the worker, and the final model's at the end
    during = json.loads(run(capsys, "evaluations", "report", evaluations[0], "-o", "json")[1])
    assert during["status"] == "succeeded" and during["model"] == f"{run_id}@step-2" and len(during["items"]) == 2
    final = json.loads(run(capsys, "evaluations", "wait", evaluations[1], "--timeout", "300", "-o", "json")[1])
    assert final["status"] == "succeeded" and final["modelId"].startswith("model-")


def test_evaluate_an_openai_compatible_endpoint(workspace, capsys, tiny_model_dir):
    import threading

    from strop.serve import make_server
    server = make_server(str(tiny_model_dir), port=0, name="tiny")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        run(capsys, "registry", "datasets", "register", "arith/eval", "-f", rows_file(workspace / "eval.jsonl", 3))
        endpoint = f"openai:tiny@http://127.0.0.1:{server.server_port}/v1"
        code, out, err = run(capsys, "evaluations", "start", "--model", endpoint, "--dataset", "arith/eval",
                             "--grader", "builtin:gsm8k", "--max-tokens", "4", "--jq", ".evaluationId")
        assert code == 0, err
        code, out, _ = run(capsys, "evaluations", "wait", out.strip(), "--exit-status", "--timeout", "300", "-o", "json")
        summary = json.loads(out)["summary"]
        assert code == 0 and summary["n"] == 3 and summary["requestErrors"] == 0
        code, _, err = run(capsys, "evaluations", "start", "--model", endpoint, "--dataset", "arith/eval",
                           "--grader", "builtin:gsm8k", "--samples", "4")
        assert code == 1 and "pass@k" in err
    finally:
        server.shutdown()
        server.server_close()


def test_bundle_unpacked_by_many_processes_at_once(workspace, capsys):
    """Workers of runs started together unpack the same bundle version concurrently; none may fail."""
    import subprocess
    import sys
    # each process imports first, then all unpack at the same wall-clock moment
    code = ("import sys, time; from strop.control import registry; registry.get_bundle('arith/scoring'); "
            "time.sleep(max(0.0, float(sys.argv[1]) - time.time())); print(registry.bundle_dir('arith/scoring')[0])")
    start_at = str(time.time() + 15)
    procs = [subprocess.Popen([sys.executable, "-c", code, start_at], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    folders = {out.strip() for out, _ in results}
    assert len(folders) == 1 and (Path(folders.pop()) / "reward.py").is_file()
