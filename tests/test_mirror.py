"""The store's copy of a run comes from the run's files: rows appended, a resume's cut followed, checkpoints
listed once finished, a half-written line left for later."""

import json
import os

from sqlalchemy import select

from strop.control.mirror import RunMirror
from strop.rl.checkpoints import MANIFEST, checkpoint_dir, write_manifest
from strop.store import open_store, session_scope
from strop.store.schema import Checkpoint, Project, Run, RunStep
from test_control import home  # noqa: F401 - a fresh STROP_HOME and store


def _run() -> str:
    with session_scope(open_store()) as s:
        project = Project(name="p")
        s.add(project)
        s.flush()
        run = Run(project_id=project.id, descriptor={}, base_model="m", status="running")
        s.add(run)
        s.flush()
        return run.id


def _stored(run_id):
    with session_scope(open_store()) as s:
        steps = list(s.scalars(select(RunStep.step).where(RunStep.run_id == run_id).order_by(RunStep.step)))
        checkpoints = list(s.scalars(select(Checkpoint.step).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step)))
        return steps, checkpoints, s.get(Run, run_id).current_step


def _checkpoint(folder, step):
    path = checkpoint_dir(folder, step)
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"w")
    write_manifest(path, step)


def test_the_store_follows_the_files_through_a_resume(home, tmp_path):  # noqa: F811
    run_id, folder = _run(), tmp_path / "run"
    folder.mkdir()
    metrics = folder / "metrics.jsonl"
    mirror = RunMirror(run_id, folder)
    mirror.sync()
    assert _stored(run_id) == ([], [], 0)

    metrics.write_text("".join(json.dumps({"step": i, "reward": i / 10}) + "\n" for i in range(4)) + '{"step": 4, "rew')
    _checkpoint(folder, 2)
    _checkpoint(folder, 5)                  # after 5 steps: not listed while row 4 is half-written
    (checkpoint_dir(folder, 6)).mkdir()     # no manifest: still being written
    mirror.sync()
    assert _stored(run_id) == ([0, 1, 2, 3], [2], 4)
    with session_scope(open_store()) as s:
        row = s.scalar(select(RunStep).where(RunStep.run_id == run_id, RunStep.step == 3))
        assert row.metrics == {"reward": 0.3}

    with open(metrics, "a") as f:           # the line is finished: read from where the last sync stopped
        f.write('ard": 0.4}\n')
    mirror.sync()
    assert _stored(run_id) == ([0, 1, 2, 3, 4], [2, 5], 5)

    # a resume from step 2 rewrites metrics.jsonl (a new file) with the rows before it, then goes on
    fresh = folder / "metrics.tmp"
    fresh.write_text("".join(json.dumps({"step": i, "reward": 0.0}) + "\n" for i in range(2)))
    os.replace(fresh, metrics)
    mirror.sync()
    assert _stored(run_id) == ([0, 1], [2], 2)
    with open(metrics, "a") as f:
        f.write(json.dumps({"step": 2, "reward": 0.9}) + "\n")
    mirror.sync()
    steps, _, current = _stored(run_id)
    assert steps == [0, 1, 2] and current == 3
    with session_scope(open_store()) as s:
        assert s.scalar(select(RunStep).where(RunStep.run_id == run_id, RunStep.step == 2)).metrics == {"reward": 0.9}
        [checkpoint] = s.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id))
        assert checkpoint.path == str(checkpoint_dir(folder, 2)) and len(checkpoint.manifest_sha256) == 64
    assert (checkpoint_dir(folder, 2) / MANIFEST).exists()


def test_following_syncs_in_the_background(home, tmp_path):  # noqa: F811
    import time
    run_id, folder = _run(), tmp_path / "run"
    folder.mkdir()
    mirror = RunMirror(run_id, folder)
    with mirror.following(every=0.05):
        (folder / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward": 1.0}) + "\n")
        deadline = time.time() + 10
        while _stored(run_id)[0] != [0] and time.time() < deadline:
            time.sleep(0.05)
    assert _stored(run_id) == ([0], [], 1)
