"""Runs: a descriptor admitted against the store, then trained by a background worker process.

    from strop.control import runs
    plan = runs.start("run.json", dry_run=True)       # validation + admission only: what would be pinned
    run = runs.start("run.json")                      # {'runId': 'run-3f9a1c2e', 'status': 'pending', ...}
    runs.wait(run["runId"])                           # polls until succeeded, failed or cancelled

Admission (strop.control.admission) pins exact versions (dataset, each bundle, the base model's folder) in the run
record, so registering new versions later never changes accepted work. The worker (`python -m strop.control.worker
RUN`) writes plain files in $STROP_HOME/runs/RUN and mirrors each metrics row and checkpoint into the store. A
worker that dies without saying so is noticed the next time anyone reads the run: it is marked failed.
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

from sqlalchemy import select

from strop.cluster.settings import ADDRESS_HELP, address_ok
from strop.control import admission, processes
from strop.control.descriptor import RaySpec, RunDescriptor, load_descriptor
from strop.errors import StropError
from strop.files import open_regular
from strop.paths import runs_dir
from strop.store import open_store, session_scope
from strop.store.schema import FINISHED_STATUSES, Evaluation, Project, Run, RunStep, utcnow


class RunError(StropError):
    """A run could not be admitted, found or controlled."""


def run_dir(run_id: str) -> Path:
    return runs_dir() / run_id


def admit(descriptor: RunDescriptor, *, dry_run: bool = False) -> dict:
    """Check everything the run needs exists, and pin it: the returned dict goes into the run record.

    With `dry_run`, no code from a module the descriptor names is imported or run: a 'module:Class' environment
    is only found on the Python path, and `pinned["notChecked"]` says what starting the run will check."""
    problems, pinned = admission.check(descriptor, dry_run=dry_run)
    if problems:
        raise RunError("run not admitted:\n  " + "\n  ".join(problems))
    return pinned


def lineage(pinned: dict, model_id: str | None) -> list[dict]:
    """Base model -> the tuned model a run started from (if any) -> the model it made (once it has)."""
    base = pinned.get("baseModel") or {}
    steps = [{"baseModel": base.get("id")}] if base else []
    if "initModel" in base:
        steps.append({"modelId": base["initModel"]["modelId"], "runId": base["initModel"]["runId"]})
    if model_id:
        steps.append({"modelId": model_id})
    return steps


def start(descriptor_path: str | Path, *, dry_run: bool = False, ray_address: str | None = None) -> dict:
    """Validate, admit and start a run. `ray_address` places it on that Ray cluster (execution.ray.address, the
    descriptor's samplers and envWorkers kept)."""
    descriptor = load_descriptor(descriptor_path)
    if ray_address is not None:
        descriptor = with_ray_address(descriptor, ray_address)
    pinned = admit(descriptor, dry_run=dry_run)
    if dry_run:
        not_checked = pinned.pop("notChecked", [])
        return {"valid": True, "dryRun": True, "project": descriptor.project, "configName": descriptor.config_name,
                "pinned": pinned, "notChecked": not_checked}
    with session_scope(open_store()) as s:
        project = s.scalar(select(Project).where(Project.name == descriptor.project))
        run = Run(project_id=project.id, config_name=descriptor.config_name, descriptor=descriptor.to_dict(),
                  status="pending", pinned=pinned, base_model=pinned["baseModel"]["id"])
        s.add(run)
        s.flush()
        run_id = run.id
    spawn_worker(run_id)
    return get(run_id)


def with_ray_address(descriptor: RunDescriptor, address: str) -> RunDescriptor:
    if not address_ok(address):
        raise RunError(f"--ray-address must be {ADDRESS_HELP} (got {address[:80]!r})")
    execution = descriptor.execution
    ray = (execution.ray or RaySpec()).model_copy(update={"address": address})
    return descriptor.model_copy(update={"execution": execution.model_copy(update={"ray": ray})})


WORKER = "strop.control.worker"


def spawn_worker(run_id: str) -> int:
    try:
        pid = processes.spawn(WORKER, run_id, run_dir(run_id) / "worker.log")
    except OSError as exc:
        with session_scope(open_store()) as s:
            run = s.get(Run, run_id)
            run.status, run.finished_at, run.error = "failed", utcnow(), f"could not start the worker: {exc}"
        raise RunError(f"run {run_id}: could not start its worker process: {exc}") from None
    with session_scope(open_store()) as s:
        run = s.get(Run, run_id)
        run.worker_pid, run.worker_host = pid, processes.this_host()
    return pid


def worker_alive(pid: int | None, run_id: str) -> bool:
    return processes.alive(pid, WORKER, run_id)


def elsewhere(run: Run) -> str | None:
    """The other machine whose worker this run's pid is (None when it is this one, or unknown): that
    machine's /proc, not ours, says whether it still runs."""
    return run.worker_host if run.worker_host and run.worker_host != processes.this_host() else None


def _as_dict(run: Run, project: str, evaluations: list[str] | None = None) -> dict:
    seconds = None
    if run.started_at:
        seconds = round(((run.finished_at or utcnow()) - run.started_at).total_seconds(), 1)
    plan = (run.pinned or {}).get("plan") or {}
    per_pass = math.ceil(plan["rows"] / plan["batchSize"]) if plan else None
    return {"runId": run.id, "project": project, "configName": run.config_name, "status": run.status,
            "step": run.current_step, "method": run.descriptor["config"].get("method", "grpo"),
            "maxSteps": (run.descriptor["config"].get("rlHyperparams")
                         or run.descriptor["config"].get("sftHyperparams") or {}).get("maxSteps"),
            "steps": plan.get("steps"), "passes": plan.get("passes"),
            "passesMade": math.ceil((run.current_step or 0) / per_pass) if per_pass else None,
            "baseModel": run.base_model, "modelId": run.model_id, "pinned": run.pinned,
            "lineage": lineage(run.pinned or {}, run.model_id),
            "workerPid": run.worker_pid if run.status in ("pending", "running") else None,
            "workerHost": run.worker_host if run.status in ("pending", "running") else None,
            "createdAt": run.created_at.isoformat(), "startedAt": run.started_at and run.started_at.isoformat(),
            "finishedAt": run.finished_at and run.finished_at.isoformat(), "seconds": seconds, "error": run.error,
            "evaluations": evaluations or [],
            "runDir": str(run_dir(run.id))}


def _load(s, run_id: str) -> Run:
    run = s.get(Run, run_id)
    if run is None:
        raise RunError(f"no run {run_id!r}; `strop runs list` shows the runs")
    # a worker that died without recording it (kill -9, out of memory) leaves the run looking alive;
    # a pending run with no pid yet is being spawned (spawn_worker records the pid as soon as the process exists)
    # (only this machine's workers can be checked: one on another host sharing the store is left as it is)
    if run.status in ("pending", "running") and run.worker_pid and not elsewhere(run) \
            and not worker_alive(run.worker_pid, run.id):
        run.status, run.finished_at = "failed", utcnow()
        run.error = (f"the worker process {run.worker_pid} died without finishing; see "
                     f"{run_dir(run.id) / 'worker.log'}; `strop runs resume {run.id}` continues from the last checkpoint")
    return run


def get(run_id: str) -> dict:
    with session_scope(open_store()) as s:
        run = _load(s, run_id)
        evaluations = s.scalars(select(Evaluation.id).where(Evaluation.run_id == run_id)
                                .order_by(Evaluation.created_at)).all()
        info = _as_dict(run, s.get(Project, run.project_id).name, list(evaluations))
    info["cluster"] = cluster_used(run_id)
    return info


CLUSTER_KEYS = ("rayCluster", "trainer", "samplerReplicas", "envWorkers", "graderWorkers")


def cluster_used(run_id: str) -> dict | None:
    """What a run placed on Ray and the cluster it found (from its engine.json), or None for an in-process run."""
    try:
        with open_regular(run_dir(run_id) / "engine.json") as f:
            facts = json.loads(f.read(1 << 20))
    except (OSError, ValueError, StropError):
        return None
    found = {k: facts[k] for k in CLUSTER_KEYS if isinstance(facts, dict) and k in facts}
    return found or None


def list_runs(project: str | None = None) -> list[dict]:
    with session_scope(open_store()) as s:
        query = select(Run).order_by(Run.created_at.desc())
        if project:
            query = query.join(Project).where(Project.name == project)
        names = {p.id: p.name for p in s.scalars(select(Project))}
        return [_as_dict(_load(s, run.id), names[run.project_id]) for run in s.scalars(query).all()]


def wait(run_id: str, *, timeout: float | None = None, on_poll=None, interval: float = 1.0) -> dict:
    def too_long(info):
        raise RunError(f"run {run_id} is still {info['status']} after {timeout:g} s (step {info['step']})")
    return processes.poll_until_finished(lambda: get(run_id), timeout=timeout, on_poll=on_poll, interval=interval,
                                         on_timeout=too_long)


def cancel(run_id: str) -> dict:
    with session_scope(open_store()) as s:
        run = _load(s, run_id)
        if run.status in FINISHED_STATUSES:
            raise RunError(f"run {run_id} already {run.status}; nothing to cancel")
        if elsewhere(run):
            raise RunError(f"run {run_id} is {run.status} on {run.worker_host} (worker {run.worker_pid}); its "
                           f"worker can only be stopped there: run `strop runs cancel {run_id}` on {run.worker_host}")
        pid = run.worker_pid
        if not worker_alive(pid, run_id):
            run.status, run.finished_at = "cancelled", utcnow()
    if worker_alive(pid, run_id):
        os.kill(pid, signal.SIGTERM)  # the worker records 'cancelled' itself, after writing what it has
        deadline = time.monotonic() + 60
        while worker_alive(pid, run_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        if worker_alive(pid, run_id):
            os.kill(pid, signal.SIGKILL)
        with session_scope(open_store()) as s:
            run = s.get(Run, run_id)
            if run.status not in FINISHED_STATUSES:
                run.status, run.finished_at = "cancelled", utcnow()
    return get(run_id)


def resume(run_id: str) -> dict:
    with session_scope(open_store()) as s:
        run = _load(s, run_id)
        if run.status in ("pending", "running"):
            where = f" on {run.worker_host}" if elsewhere(run) else ""
            raise RunError(f"run {run_id} is {run.status}{where} (worker {run.worker_pid}); wait for it or cancel "
                           f"it first")
        if run.status == "succeeded":
            raise RunError(f"run {run_id} already succeeded; start a new run to train further")
        run.status, run.error, run.finished_at, run.worker_pid, run.worker_host = "pending", None, None, None, None
    spawn_worker(run_id)
    return get(run_id)


def metrics(run_id: str) -> list[dict]:
    with session_scope(open_store(), read_only=True) as s:
        if s.get(Run, run_id) is None:
            raise RunError(f"no run {run_id!r}; `strop runs list` shows the runs")
        rows = s.scalars(select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step)).all()
        return [{"step": r.step, **r.metrics} for r in rows]
