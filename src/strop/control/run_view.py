"""What a person looking at runs reads (`strop ui`): the run records joined with what their folders say now.

The folders are the truth while a run trains (the worker appends to metrics.jsonl after each step and the store's
copy follows a moment later), so the latest step and reward come from the file's last line when it is ahead.
Every read here is bounded: a tail of a file, never the whole of one that grows without limit.

    from strop.control import run_view
    run_view.table(status="running")       # [{'runId', 'project', 'status', 'step', 'maxSteps', 'reward', ...}]
    run_view.detail("run-3f9a1c2e")        # the record, its descriptor, checkpoints and evaluations
    run_view.evaluations()                 # the newest evaluations' records
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from sqlalchemy import select

from strop.control import evaluations as eval_records
from strop.control import runs
from strop.store import open_store, session_scope
from strop.store.schema import RUN_STATUSES, Checkpoint, Evaluation, Run

STATUSES = RUN_STATUSES
TAIL_BYTES = 64 << 10
MAX_METRICS_BYTES = 64 << 20     # a metrics file past this is read from its store copy only
TABLE_KEYS = ("runId", "project", "configName", "status", "step", "maxSteps", "steps", "method", "baseModel",
              "modelId", "lineage", "createdAt", "startedAt", "finishedAt", "seconds", "error")


def tail(path: Path, size: int = TAIL_BYTES) -> str:
    """The last `size` bytes of a file as text ('' when there is none), cut at a line start."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(0, end - size))
            data = f.read(size)
    except OSError:
        return ""
    if end > size and b"\n" in data:
        data = data.split(b"\n", 1)[1]
    return data.decode("utf-8", "replace")


def last_metrics(folder: Path) -> dict | None:
    """The last complete row of a run folder's metrics.jsonl, or None."""
    for line in reversed(tail(folder / "metrics.jsonl", 16 << 10).splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue       # the line being written
        if isinstance(row, dict) and "step" in row:
            return row
    return None


def table(project: str | None = None, status: str | None = None) -> list[dict]:
    """Every run (newest first) with its latest step and reward, optionally of one project or status."""
    rows = []
    for info in runs.list_runs(project):
        if status and info["status"] != status:
            continue
        row = {key: info.get(key) for key in TABLE_KEYS}
        last = last_metrics(Path(info["runDir"]))
        if last is not None:
            # the loop numbers steps from 0; the record counts steps done
            row["step"] = max(row["step"] or 0, int(last["step"]) + 1)
            row["reward"] = last.get("reward")
        else:
            row["reward"] = None
        row["maxSteps"] = row["steps"] or row["maxSteps"]
        rows.append(row)
    return rows


def detail(run_id: str) -> dict:
    """A run's record with its descriptor, checkpoints, evaluations and latest metrics row."""
    info = runs.get(run_id)
    with session_scope(open_store(), read_only=True) as s:
        run = s.get(Run, run_id)
        info["descriptor"] = run.descriptor
        info["checkpoints"] = [{"step": c.step, "path": c.path, "manifestSha256": c.manifest_sha256,
                                "createdAt": c.created_at.isoformat()}
                               for c in s.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id)
                                                  .order_by(Checkpoint.step))]
        info["evaluationRows"] = [{"evaluationId": e.id, "status": e.status, "runStep": e.run_step,
                                   "summary": e.summary}
                                  for e in s.scalars(select(Evaluation).where(Evaluation.run_id == run_id)
                                                     .order_by(Evaluation.created_at))]
    last = last_metrics(Path(info["runDir"]))
    if last is not None:
        info["step"] = max(info["step"] or 0, int(last["step"]) + 1)
    info["last"] = last
    return info


def metrics(run_id: str) -> list[dict]:
    """Every metrics row of a run: from its folder's file (live), or the store's copy when the file is gone."""
    rows = metrics_file(runs.run_dir(run_id) / "metrics.jsonl")
    return runs.metrics(run_id) if rows is None else rows


def metrics_file(path: Path) -> list[dict] | None:
    """The rows of a metrics.jsonl, or None when there is none or it is past MAX_METRICS_BYTES."""
    try:
        size = path.stat().st_size
    except OSError:
        return None
    if size > MAX_METRICS_BYTES:
        return None
    rows = []
    with open(path, "rb") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
    return rows


def folder(run_id: str) -> Path:
    """The run's folder, once the run is known to the store (an unknown id is an error that says so)."""
    runs.get(run_id)
    return runs.run_dir(run_id)


def evaluations(limit: int = 500) -> list[dict]:
    """The newest evaluations' records (the dict `strop evaluations get` prints), newest first."""
    with session_scope(open_store(), read_only=True) as s:
        ids = s.scalars(select(Evaluation.id).order_by(Evaluation.created_at.desc()).limit(limit)).all()
    return [eval_records.get(i) for i in ids]
