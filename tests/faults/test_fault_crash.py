"""Fault injection: run workers killed with SIGKILL, again and again, and a checkpoint damaged on disk.
Every resume continues from the last good checkpoint; no metrics row is lost or repeated."""

import json
import os
import signal
import time

from test_control import descriptor, home, run, workspace  # noqa: F401 - shared fixtures and helpers

SLOW = ("import time\n\ndef compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):\n"
        "    time.sleep(0.1)\n    return len(solution_str) % 3 / 3\n")


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
