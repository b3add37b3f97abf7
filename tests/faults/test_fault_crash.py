"""Fault injection: run workers killed with SIGKILL, again and again, and a checkpoint damaged on disk.
Every resume continues from the last good checkpoint; no metrics row is lost or repeated."""

import json
import os
import signal
import time

from test_control import descriptor, home, run, workspace  # noqa: F401 - shared fixtures and helpers

# slow enough that a kill lands mid-run: a step's 4 grader calls run 2 at a time (the sandbox pool's workers)
SLOW = ("import time\n\ndef compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):\n"
        "    time.sleep(0.3)\n    return len(solution_str) % 3 / 3\n")


def _slow_run(workspace, capsys, steps: int) -> str:  # noqa: F811
    folder = workspace / "slow"
    folder.mkdir(exist_ok=True)
    (folder / "reward.py").write_text(SLOW)
    assert run(capsys, "registry", "bundles", "register", "arith/slow", "-f", folder)[0] == 0
    terms = [{"kind": "rule", "weight": 1.0, "bundle": "arith/slow", "module": "reward"}]
    path = descriptor(workspace, **{"config.rlHyperparams.maxSteps": steps, "config.reward.terms": terms,
                                    "config.rlHyperparams.epochs": 2,
                                    "execution.saveEvery": 1})
    return run(capsys, "runs", "start", "-f", path, "--jq", ".runId")[1].strip()


def _kill_at(capsys, run_id: str, step: int) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        info = json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])
        if info["step"] >= step and info["workerPid"]:
            os.kill(info["workerPid"], signal.SIGKILL)
            break
        time.sleep(0.05)
    time.sleep(0.3)
    info = json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])
    assert info["status"] == "failed" and "died" in info["error"]


def _metrics_steps(capsys, run_id: str) -> list[int]:
    return [r["step"] for r in json.loads(run(capsys, "runs", "metrics", run_id, "-o", "json")[1])]


def test_killed_three_times_then_finishes_with_every_row_once(workspace, capsys):  # noqa: F811
    run_id = _slow_run(workspace, capsys, 8)
    for step in (2, 4, 6):
        _kill_at(capsys, run_id, step)
        assert run(capsys, "runs", "resume", run_id)[0] == 0
    code, out, _ = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 0, out
    assert _metrics_steps(capsys, run_id) == list(range(8))
    run_folder = json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])["runDir"]
    lines = [json.loads(line)["step"] for line in open(os.path.join(run_folder, "metrics.jsonl"))]
    assert lines == list(range(8))  # the run's own file agrees with the store


def test_a_damaged_checkpoint_is_skipped_for_the_one_before(workspace, capsys):  # noqa: F811
    run_id = _slow_run(workspace, capsys, 6)
    _kill_at(capsys, run_id, 4)
    run_folder = json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])["runDir"]
    newest = sorted(os.listdir(os.path.join(run_folder, "checkpoints")))[-1]
    weights = os.path.join(run_folder, "checkpoints", newest, "adapter_model.safetensors")
    with open(weights, "r+b") as handle:  # flip bytes in the middle of the newest checkpoint's adapter
        handle.seek(os.path.getsize(weights) // 2)
        handle.write(b"\xff" * 64)
    assert run(capsys, "runs", "resume", run_id)[0] == 0
    code, out, _ = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 0, out
    assert _metrics_steps(capsys, run_id) == list(range(6))


def test_a_kill_while_a_checkpoint_is_written_resumes_from_the_one_before(workspace, capsys):  # noqa: F811
    # A kill mid-save leaves a torn manifest in the newest checkpoint and the next one's temporary folder behind.
    run_id = _slow_run(workspace, capsys, 6)
    _kill_at(capsys, run_id, 4)
    run_folder = json.loads(run(capsys, "runs", "get", run_id, "-o", "json")[1])["runDir"]
    checkpoints = os.path.join(run_folder, "checkpoints")
    newest = sorted(name for name in os.listdir(checkpoints) if name.startswith("step-"))[-1]
    manifest = os.path.join(checkpoints, newest, "manifest.json")
    with open(manifest, "r+b") as handle:
        handle.truncate(os.path.getsize(manifest) // 2)
    leftover = os.path.join(checkpoints, ".step-000099.tmp-crashed")
    os.makedirs(leftover)
    with open(os.path.join(leftover, "adapter_model.safetensors"), "wb") as handle:
        handle.write(b"\0" * 100)
    assert run(capsys, "runs", "resume", run_id)[0] == 0
    code, out, _ = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "300", "-o", "json")
    assert code == 0, out
    assert _metrics_steps(capsys, run_id) == list(range(6))
    lines = [json.loads(line)["step"] for line in open(os.path.join(run_folder, "metrics.jsonl"))]
    assert lines == list(range(6))
    log = open(os.path.join(run_folder, "worker.log")).read()
    assert "skipping checkpoint" in log and "manifest.json is unreadable or malformed" in log
    assert not os.path.exists(leftover)


def test_runs_list_shows_a_killed_run_as_failed(workspace, capsys):  # noqa: F811
    run_id = _slow_run(workspace, capsys, 6)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # read the pid from the store, not through `runs get` (which would judge it)
        info = json.loads(run(capsys, "runs", "list", "-o", "json")[1])[0]
        if info["step"] >= 1 and info["workerPid"]:
            break
        time.sleep(0.05)
    os.kill(info["workerPid"], signal.SIGKILL)
    time.sleep(0.3)
    [listed] = json.loads(run(capsys, "runs", "list", "-o", "json")[1])
    assert listed["runId"] == run_id and listed["status"] == "failed" and "died" in listed["error"]
    code, out, _ = run(capsys, "runs", "list")
    assert code == 0 and "failed" in out


def _stored_run(status: str, pid: int, host: str) -> str:
    from sqlalchemy import select

    from strop.store import open_store, session_scope
    from strop.store.schema import Project, Run
    with session_scope(open_store()) as s:
        project = s.scalar(select(Project).where(Project.name == "arith"))
        row = Run(project_id=project.id, descriptor={"config": {"rlHyperparams": {"maxSteps": 4}}}, status=status,
                  base_model="strop/tiny-random", worker_pid=pid, worker_host=host)
        s.add(row)
        s.flush()
        return row.id


def test_a_run_on_another_host_is_not_judged_here(workspace, capsys):  # noqa: F811
    # a store shared by two machines: this one cannot see the other's processes, so it must not call them dead
    import subprocess
    import sys

    from strop.control.processes import this_host
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that is no process here
    remote = _stored_run("running", gone.pid, "gpu-box-b")
    info = json.loads(run(capsys, "runs", "get", remote, "-o", "json")[1])
    assert info["status"] == "running" and info["workerHost"] == "gpu-box-b" and info["error"] is None
    assert json.loads(run(capsys, "runs", "list", "-o", "json")[1])[0]["status"] == "running"
    code, out, _ = run(capsys, "runs", "get", remote)
    assert code == 0 and "running on gpu-box-b" in out
    code, _, err = run(capsys, "runs", "cancel", remote)
    assert code == 1 and "on gpu-box-b" in err
    assert json.loads(run(capsys, "runs", "get", remote, "-o", "json")[1])["status"] == "running"
    # the same dead pid recorded by this machine is judged, and found dead
    local = _stored_run("running", gone.pid, this_host())
    info = json.loads(run(capsys, "runs", "get", local, "-o", "json")[1])
    assert info["status"] == "failed" and "died" in info["error"]


def test_an_evaluation_on_another_host_is_not_judged_here(workspace, capsys):  # noqa: F811
    import subprocess
    import sys

    from sqlalchemy import select

    from strop.control.processes import this_host
    from strop.store import open_store, session_scope
    from strop.store.schema import Dataset, DatasetVersion, Evaluation
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ids = {}
    with session_scope(open_store()) as s:
        version = s.scalar(select(DatasetVersion).join(Dataset).where(Dataset.name == "arith/train"))
        for host in ("gpu-box-b", this_host()):
            row = Evaluation(model_ref="strop/tiny-random", dataset_version_id=version.id, grader_ref="builtin:gsm8k",
                             status="running", worker_pid=gone.pid, worker_host=host)
            s.add(row)
            s.flush()
            ids[host] = row.id
    remote = json.loads(run(capsys, "evaluations", "get", ids["gpu-box-b"], "-o", "json")[1])
    assert remote["status"] == "running" and remote["error"] is None
    local = json.loads(run(capsys, "evaluations", "get", ids[this_host()], "-o", "json")[1])
    assert local["status"] == "failed" and "died" in local["error"]
