"""Experiment trackers (strop.trackers) against their real local backends: a tiny GRPO run reports to
TensorBoard, trackio (its SQLite store), MLflow (a SQLite store, read back through MlflowClient) and W&B
(offline, read back from its run files), and each holds metrics.jsonl's keys and steps, the run's config and
the sample rollout tables. A tracker whose server hangs or fails neither stops nor slows training, and a
tracker whose package is missing is one error naming its extra, before anything runs."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from strop.errors import StropError
from strop.rl import GRPOConfig, run_grpo
from strop.rl.metrics import read_jsonl
from strop.trackers import background, parse_report_to, report_to_problems
from strop.trackers.base import TABLE_ROWS, RunInfo, scalars

from wandb_files import history, read_records, run_config, summary

STEPS, EVERY = 3, 2          # tables at steps 0 and 2


def tiny(model_dir, **kw) -> GRPOConfig:
    base = dict(base_model=str(model_dir), dataset="synthetic:add", group_size=4, batch_size=2, max_steps=STEPS,
                max_completion_length=6, learning_rate=1e-2, lora_rank=4, save_every=STEPS, keep_adapters=1,
                reward_terms=[{"name": "correct", "weight": 1.0, "grader": "builtin:gsm8k"}])
    return GRPOConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def tracked(tiny_model_dir, tmp_path_factory):
    """One tiny run reporting to all four trackers, each into a store of its own under a fresh folder."""
    root = tmp_path_factory.mktemp("trackers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACKIO_DIR", str(root / "trackio"))
        mp.setenv("TRACKIO_PROJECT", "strop-tracker-test")
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        mp.setenv("MLFLOW_EXPERIMENT_NAME", "strop-tracker-test")
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_DIR", str(root / "wandb"))
        (root / "wandb").mkdir()
        config = tiny(tiny_model_dir, report_to=["tensorboard", "trackio", "mlflow", "wandb"],
                      report_rollouts_every=EVERY)
        run_dir = root / "tracked-run"
        run_grpo(config, run_dir, progress=False)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS))
    return {"root": root, "run_dir": run_dir, "rows": rows, "config": config.to_dict(),
            "rollouts": read_jsonl(run_dir / "rollouts.jsonl")}


def assert_same_numbers(by_step: dict[int, dict], rows: list[dict]) -> None:
    """Every finite number of every metrics.jsonl row, at its step, and nothing else."""
    assert sorted(by_step) == [r["step"] for r in rows]
    for row in rows:
        want = scalars(row)
        assert len(want) > 10 and {"reward", "reward/correct", "klSampleTrain", "stepSeconds"} <= set(want)
        got = by_step[row["step"]]
        assert set(got) == set(want), (row["step"], set(got) ^ set(want))
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (row["step"], key)


def first_completions(tracked, step: int) -> list[str]:
    return [r["completion"] for r in tracked["rollouts"] if r["step"] == step][:TABLE_ROWS]


# --- each tracker, read back from its own store ------------------------------------------------------------


def test_trackio_store_holds_the_metrics_config_and_rollout_tables(tracked):
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs("strop-tracker-test", "tracked-run")
    numbers, tables = {}, {}
    for entry in logs:
        step = entry["step"]
        if "rollouts" in entry:
            tables[step] = entry["rollouts"]
        values = {k: v for k, v in entry.items() if k not in ("step", "timestamp", "rollouts")}
        if values:
            numbers.setdefault(step, {}).update(values)
    assert_same_numbers(numbers, tracked["rows"])
    assert sorted(tables) == [0, 2]
    for step, table in tables.items():
        assert table["_type"] == "trackio.table"
        assert [row["completion"] for row in table["_value"]] == first_completions(tracked, step)
        assert {row["step"] for row in table["_value"]} == {step}
    config = SQLiteStorage.get_run_config("strop-tracker-test", "tracked-run")
    assert config["group_size"] == 4 and config["report_to"] == ["tensorboard", "trackio", "mlflow", "wandb"]
    assert config["reward_terms"] == tracked["config"]["reward_terms"]


def test_mlflow_store_read_back_through_its_client_holds_the_same(tracked, tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tracked['root'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("strop-tracker-test")
    [run] = client.search_runs([experiment.experiment_id], "attributes.run_name = 'tracked-run'")
    assert run.info.status == "FINISHED" and run.data.tags["strop.runDir"] == str(tracked["run_dir"])
    assert run.info.artifact_uri.startswith(tracked["root"].resolve().as_uri())  # beside the store, not ./mlruns
    numbers: dict[int, dict] = {}
    for key in run.data.metrics:
        for metric in client.get_metric_history(run.info.run_id, key):
            numbers.setdefault(metric.step, {})[key] = metric.value
    assert_same_numbers(numbers, tracked["rows"])
    params = run.data.params
    assert params["group_size"] == "4" and params["loss_fn"] == "importance_sampling"
    assert json.loads(params["reward_terms"]) == tracked["config"]["reward_terms"]
    assert params["loss_fn_config"] == "{}" and json.loads(params["max_steps"]) == STEPS
    files = sorted(a.path for a in client.list_artifacts(run.info.run_id, "rollouts"))
    assert files == ["rollouts/step-000000.json", "rollouts/step-000002.json"]
    for step, name in zip((0, 2), files):
        table = json.loads(Path(client.download_artifacts(run.info.run_id, name, str(tmp_path))).read_text())
        column = table["columns"].index("completion")
        assert [row[column] for row in table["data"]] == first_completions(tracked, step)


def test_wandb_offline_run_files_hold_the_same(tracked):
    [folder] = (tracked["root"] / "wandb" / "wandb").glob("offline-run-*")
    records = read_records(next(folder.glob("run-*.wandb")))
    numbers: dict[int, dict] = {}
    tables = {}
    for entry in history(records):
        step = entry.pop("_step")
        if entry.get("rollouts/_type") == "table-file":
            tables[step] = entry["rollouts/path"]
        numbers.setdefault(step, {}).update({k: v for k, v in entry.items()
                                             if not k.startswith(("_", "rollouts/"))})
    assert_same_numbers(numbers, tracked["rows"])
    assert sorted(tables) == [0, 2]
    for step, path in tables.items():
        table = json.loads((folder / "files" / path).read_text())
        column = table["columns"].index("completion")
        assert [row[column] for row in table["data"]] == first_completions(tracked, step)
    config = run_config(records)
    assert config["group_size"] == 4 and config["reward_terms"] == tracked["config"]["reward_terms"]
    assert summary(records)["reward"] == pytest.approx(tracked["rows"][-1]["reward"])


def test_tensorboard_events_and_the_trackers_report(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tracked["run_dir"] / "events"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(scalars(tracked["rows"][0]))
    assert [e.step for e in events.Scalars("reward")] == list(range(STEPS))
    status = json.loads((tracked["run_dir"] / "trackers.json").read_text())
    # per tracker: its start, 3 metrics rows and 2 tables, then its finish; nothing dropped, no error
    assert status == {name: {"sent": STEPS + 2, "dropped": 0, "error": None, "finished": True}
                      for name in ("trackio", "mlflow", "wandb")}


# --- a tracker that fails or hangs -------------------------------------------------------------------------


@pytest.fixture()
def silent_server():
    """A loopback port that takes connections and never answers: a tracking server that hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)  # connections complete in the kernel's backlog; nothing ever reads or answers them
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def test_a_tracker_whose_server_hangs_neither_stops_nor_slows_the_run(tiny_model_dir, tmp_path, monkeypatch,
                                                                       capfd, silent_server):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", silent_server)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")  # each request would hang a minute
    monkeypatch.setattr(background, "FINISH_SECONDS", 2.0)
    started = time.monotonic()
    result = run_grpo(tiny(tiny_model_dir, report_to=["tensorboard", "mlflow"], report_rollouts_every=1),
                      tmp_path / "hung-run", progress=False)
    seconds = time.monotonic() - started
    # the loop never waited on the hung request (60 s): the run ended, every step written
    assert seconds < 55 and [r["step"] for r in result.metrics] == list(range(STEPS))
    assert (tmp_path / "hung-run" / "final" / "adapter_config.json").exists()
    status = json.loads((tmp_path / "hung-run" / "trackers.json").read_text())["mlflow"]
    assert status["sent"] == 0 and status["finished"] is False
    assert status["error"].startswith("did not finish within 2 s") and status["dropped"] == 2 * STEPS
    reports = [line for line in capfd.readouterr().err.splitlines() if "the mlflow tracker" in line]
    assert len(reports) == 1 and "training goes on without it" in reports[0]


def test_a_tracker_that_raises_is_reported_once_and_gets_nothing_more(tmp_path, monkeypatch):
    from strop.trackers.mlflow import MlflowTracker

    with socket.socket() as closed:  # a port nothing listens on: the server is gone
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    reports = []
    tracker = background.Background(MlflowTracker(), RunInfo("gone", tmp_path, {"seed": 0}), report=reports.append)
    for step in range(5):
        tracker.submit("log_metrics", step, {"reward": 0.5})
    status = tracker.close(timeout=60)
    assert status["sent"] == 0 and status["dropped"] == 5 and status["finished"] is False
    assert status["error"].startswith("failed in start: ") and len(reports) == 1
    assert reports[0].startswith("strop: the mlflow tracker failed in start: ")


class _Stuck:
    """A backend that takes its first update and never returns from it (what a hung socket looks like)."""
    name = "stuck"

    def __init__(self):
        self.release = threading.Event()

    def start(self, run):
        pass

    def log_metrics(self, step, numbers):
        self.release.wait(30)

    def finish(self):
        pass


def test_a_full_queue_drops_and_counts_and_submit_never_waits(tmp_path):
    stuck = _Stuck()
    tracker = background.Background(stuck, RunInfo("stuck", tmp_path, {}), report=lambda line: None, capacity=3)
    started = time.monotonic()
    for step in range(50):
        tracker.submit("log_metrics", step, {"reward": 1.0})
    assert time.monotonic() - started < 1.0  # 50 submits to a hung backend: no wait
    stuck.release.set()
    status = tracker.close(timeout=30)
    # at most one update in the backend's hands and 3 queued; the rest dropped, every one accounted for
    assert status["sent"] + status["dropped"] == 50 and status["dropped"] >= 46 and status["finished"]


# --- naming trackers: one validator, every front end -------------------------------------------------------


def test_report_to_is_checked_in_each_front_ends_words(capsys):
    assert report_to_problems(["tensorboard"]) == [] and report_to_problems([]) == []
    assert parse_report_to("tensorboard, mlflow") == ["tensorboard", "mlflow"] and parse_report_to("none") == []
    with pytest.raises(StropError, match=r"report_to: 'tensorbord' is not a tracker; choose from tensorboard, "
                                         r"trackio, mlflow, wandb"):
        GRPOConfig(report_to=["tensorbord"])
    with pytest.raises(StropError, match="names mlflow more than once"):
        GRPOConfig(report_to=["mlflow", "mlflow"])
    with pytest.raises(StropError, match="report_rollouts_every: must be an integer from 1"):
        GRPOConfig(report_rollouts_every=0)
    from strop.cli.main import main
    assert main(["train", "--base-model", "strop/tiny-random", "--report-to", "tensorbord"]) == 1
    assert "--report-to (report_to): 'tensorbord' is not a tracker" in capsys.readouterr().err


def test_the_descriptor_names_its_trackers_and_the_loop_gets_them():
    from strop.control.descriptor import DescriptorError, to_sft_config, validate_descriptor

    data = json.loads((Path(__file__).resolve().parents[1] / "examples" / "gsm8k" / "run.json").read_text())
    run = validate_descriptor(data)
    assert run.execution.report_to == ["tensorboard"] and run.execution.report_rollouts_every == 10
    data["execution"].update(reportTo=["tensorboard", "mlflow"], reportRolloutsEvery=5)
    config = validate_descriptor(data).to_grpo_config("x.jsonl", [{"name": "c", "weight": 1.0,
                                                                   "grader": "builtin:gsm8k"}])
    assert config.report_to == ["tensorboard", "mlflow"] and config.report_rollouts_every == 5
    data["config"]["method"] = "sft"
    del data["config"]["reward"]
    assert to_sft_config(validate_descriptor(data), "demos.jsonl").report_to == ["tensorboard", "mlflow"]
    data["execution"]["reportTo"] = ["wandb", "comet", "wandb"]
    with pytest.raises(DescriptorError) as caught:
        validate_descriptor(data)
    assert any(p.startswith("$.execution.reportTo[1]: must be one of 'tensorboard', 'trackio', 'mlflow', 'wandb'")
               for p in caught.value.problems), caught.value.problems


def test_a_missing_tracker_package_is_one_error_naming_its_extra_before_anything_runs(monkeypatch, tmp_path, capsys):
    from strop.sft import SFTConfig

    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a package that cannot be imported
    extra = r"the wandb tracker needs the 'wandb' package, which is not installed: pip install -e \"\.\[wandb\]\""
    with pytest.raises(StropError, match="report_to: " + extra):
        GRPOConfig(report_to=["tensorboard", "wandb"])
    with pytest.raises(StropError, match="report_to: " + extra):
        SFTConfig(dataset="demos.jsonl", report_to=["wandb"])
    from strop.cli.main import main
    assert main(["train", "--base-model", "strop/tiny-random", "--report-to", "wandb", "--run-dir",
                 str(tmp_path / "never")]) == 1
    err = capsys.readouterr().err
    assert re.search(r"--report-to \(report_to\): " + extra, err), err
    assert len(err.strip().splitlines()) <= 2 and not (tmp_path / "never").exists()
