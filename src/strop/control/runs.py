"""Runs: a descriptor admitted against the store, then trained by a background worker process.

    from strop.control import runs
    plan = runs.start("run.json", dry_run=True)       # validation + admission only: what would be pinned
    run = runs.start("run.json")                      # {'runId': 'run-3f9a1c2e', 'status': 'pending', ...}
    runs.wait(run["runId"])                           # polls until succeeded, failed or cancelled

Admission pins exact versions (dataset, each bundle, the base model's folder) in the run record, so
registering new versions later never changes accepted work. The worker (`python -m strop.control.worker RUN`)
writes plain files in $STROP_HOME/runs/RUN and mirrors each metrics row and checkpoint into the store. A worker
that dies without saying so is noticed the next time anyone reads the run: it is marked failed.
"""

from __future__ import annotations

import json
import math
import os
import signal
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from sqlalchemy import select

from strop import model_info
from strop.cluster.connect import reachable
from strop.cluster.settings import ADDRESS_HELP, address_ok
from strop.control import base_models, processes, projects, registry
from strop.control.descriptor import SAMPLING_ONLY, RaySpec, RunDescriptor, load_descriptor
from strop.data import load_rows
from strop.engine.precision import cuda_count, gpus_problem, run_device
from strop.engine.resources import MemoryRefused
from strop.engine.vllm_find import require_vllm
from strop.envs import env_kind, find_env_module, get_env
from strop.errors import StropError
from strop.files import open_regular
from strop.paths import runs_dir
from strop.rl.branching import skips_identical
from strop.rl.config import plan_steps
from strop.rl.loss_choices import pinned_settings
from strop.scoring import confine
from strop.store import open_store, session_scope
from strop.store.schema import FINISHED_STATUSES, Evaluation, Model, Project, Run, RunStep, utcnow
from strop.tokenizer_utils import get_tokenizer
from strop.trackers import missing_extras


class RunError(StropError):
    """A run could not be admitted, found or controlled."""


def run_dir(run_id: str) -> Path:
    return runs_dir() / run_id


def admit(descriptor: RunDescriptor, *, dry_run: bool = False) -> dict:
    """Check everything the run needs exists, and pin it: the returned dict goes into the run record.

    With `dry_run`, no code from a module the descriptor names is imported or run: a 'module:Class' environment
    is only found on the Python path, and `pinned["notChecked"]` says what starting the run will check."""
    problems, pinned = [], {"project": descriptor.project}
    try:
        settings = projects.get(descriptor.project)["evaluation"]
        if descriptor.config.eval_every and not (settings["dataset"] and settings["grader"]):
            problems.append(f"$.config.evalEvery: project {descriptor.project!r} has no evaluation settings; run "
                            f"`strop projects set-evaluation {descriptor.project} --dataset DS --grader G` first")
    except StropError as exc:
        problems.append(f"$.project: {exc}")
    try:
        pinned["baseModel"] = pin_base_model(descriptor.base_model)
    except StropError as exc:
        problems.append(f"$.baseModel: {exc}")
    if descriptor.execution.ray is None:  # on Ray, the cluster's GPUs are counted when it places the trainers
        problem = gpus_problem(descriptor.execution.gpus, cuda_count())
        try:
            if problem:
                raise StropError(problem)
            pinned["device"] = run_device(descriptor.execution.gpus)  # where the run will compute
        except StropError as exc:
            problems.append(f"$.execution.gpus: {exc}")
    else:
        pinned["ray"] = descriptor.trainer_ray()
        try:
            reachable(descriptor.execution.ray.address)  # seconds, where joining a wrong address would hang
        except StropError as exc:
            problems.append(f"$.execution.ray.address: {exc}")
    try:  # as the address is: a run asking for vLLM where there is none failed seconds after it started
        require_vllm(descriptor.execution.sampler, descriptor.execution.ray)
    except StropError as exc:
        problems.append(f"$.execution.sampler: {exc}")
    problems += [f"$.execution.reportTo: {problem}" for problem in missing_extras(descriptor.execution.report_to)]
    if descriptor.config.environment is not None:
        env = descriptor.config.environment
        pinned["environment"] = {"name": env.name, "options": dict(env.options), "split": env.split}
        try:
            if dry_run and env_kind(env.name) == "class":
                where = find_env_module(env.name)  # on the path, found without running any of it
                pinned["notChecked"] = [f"$.config.environment.name: {env.name} is a 'module:Class' name, not "
                                        f"imported by --dry-run (its module is {where}); starting the run imports "
                                        f"it and checks that it names an environment class with split {env.split!r}"]
            else:
                problems += _probe_environment(env, get_env)
        except StropError as exc:
            problems.append(f"$.config.environment: {exc}")
    else:
        try:
            version = registry.get_dataset(descriptor.config.dataset)
            pinned["dataset"] = {"ref": version["ref"], "sha256": version["sha256"], "rows": version.get("rows")}
            kind, method = registry.dataset_kind(version), descriptor.config.method
            if (kind == "supervised") != (method == "sft"):
                problems.append(f"$.config.dataset: {version['ref']} is a "
                                + ("dataset of transcripts or prompt/completion pairs, for method sft"
                                   if kind == "supervised" else "question/answer dataset, for method grpo")
                                + f"; method {method} needs "
                                + ("transcripts or prompt/completion pairs" if method == "sft" else
                                   "question/answer rows"))
        except StropError as exc:
            problems.append(f"$.config.dataset: {exc}")
    pinned["terms"] = []
    terms = descriptor.config.reward.terms if descriptor.config.reward else []
    for i, (name, term) in enumerate(zip(descriptor.term_names(), terms)):
        entry = {"name": name, "weight": term.weight, "module": term.module, "function": term.function}
        if term.kind == "judge":
            entry["judge"] = term.judge
        elif term.is_builtin:
            entry["builtin"] = term.bundle
        else:
            try:
                version = registry.get_bundle(term.bundle)
                entry.update(bundle=version["ref"], sha256=version["sha256"])
            except StropError as exc:
                problems.append(f"$.config.reward.terms[{i}].bundle: {exc}")
            else:
                try:
                    registry.check_bundle_module(version, term.module, term.function)
                except StropError as exc:
                    problems.append(f"$.config.reward.terms[{i}].module: {exc}")
        pinned["terms"].append(entry)
    hp = descriptor.config.rl_hyperparams
    if descriptor.config.method == "grpo" and hp is not None:
        pinned["rl"] = rl_settings(descriptor, pinned)
        names = descriptor.term_names()
        if hp.variance_on is not None and descriptor.config.environment is None and hp.variance_on not in names:
            problems.append(f"$.config.rlHyperparams.varianceOn: {hp.variance_on!r} is not one of the reward terms "
                            f"({', '.join(names)}); name one of them, or null for the total reward")
    if any(not term.is_builtin for term in terms):
        try:
            confine.detect().require()  # refused here, with the reason, not in the background worker
        except StropError as exc:
            problems.append(f"$.config.reward.terms: {exc}")
    if "dataset" in pinned and pinned["dataset"].get("rows"):
        hp = descriptor.config.rl_hyperparams or descriptor.config.sft_hyperparams
        steps, passes = plan_steps(pinned["dataset"]["rows"], hp.batch_size, hp.max_steps, hp.epochs)
        pinned["plan"] = {"rows": pinned["dataset"]["rows"], "batchSize": hp.batch_size, "steps": steps,
                          "passes": passes}
    if descriptor.config.method == "sft" and descriptor.config.rl_hyperparams is not None:
        pinned["notUsed"] = [f"$.config.rlHyperparams.{key}: supervised fine-tuning samples nothing"
                             for key in SAMPLING_ONLY]
    # an environment's run is checked by the loop, from its tool prompts; a supervised run by its loop, which
    # refuses an example over maxSeqLength before training
    if not problems and "dataset" in pinned and descriptor.config.method == "grpo":
        problems += memory_problems(descriptor, pinned)
    if problems:
        raise RunError("run not admitted:\n  " + "\n  ".join(problems))
    return pinned


def rl_settings(descriptor: RunDescriptor, pinned: dict) -> dict:
    """The GRPO settings that decide what a step learns from, as the run will use them: the KL reference by name
    (the tuned model the run starts from, or the base model), which term judges a group informative, dynamic
    sampling, the learning-rate warm-up, the turn groups branch at, whether identical turns are trained, and the
    loss choices (strop.rl.loss_choices.pinned_settings)."""
    hp, base = descriptor.config.rl_hyperparams, pinned.get("baseModel") or {}
    # identical turns as the run treats them, with the run's loss
    skipped = skips_identical(SimpleNamespace(identical_turns=hp.identical_turns, kl_beta=hp.kl_beta,
                                              loss_fn=hp.loss_fn))
    start = (base.get("initModel") or {}).get("modelId") or base.get("id", descriptor.base_model)
    sampling = hp.dynamic_sampling
    return {"klReference": hp.kl_reference, "klReferenceModel": start if hp.kl_reference == "start" else
            base.get("id", descriptor.base_model), "varianceOn": hp.variance_on,
            "dynamicSampling": {"enabled": sampling.enabled, "maxTasksPerStep": sampling.max_tasks_per_step
                                or (4 * hp.batch_size if sampling.enabled else None)},
            "warmupSteps": hp.optimizer.warmup_steps, "branchAtTurn": hp.branch_at_turn,
            "identicalTurns": "skip" if skipped else "train",
            # how rewards become the update: estimator, aggregation, overlong handling, ratio, clip, passes
            **pinned_settings(SimpleNamespace(**hp.model_dump(), loss_fn_config={}))}


def _probe_environment(env, get_env) -> list[str]:
    """Make the environment once (an unknown name, a class that is not an environment, a bad option or split
    fails here, not in the worker); its own errors are reported, never a traceback."""
    try:
        probe = get_env(env.name, **env.options)
    except StropError:
        raise
    except Exception as exc:  # the environment's constructor raised on these options
        return [f"$.config.environment.options: {env.name} could not be made with these options: "
                f"{type(exc).__name__}: {str(exc)[:300]}"]
    try:
        splits = probe.splits()
        if env.split not in splits:
            return [f"$.config.environment.split: {env.name} has splits {splits}, not {env.split!r}"]
        return []
    except Exception as exc:
        return [f"$.config.environment: {env.name}'s splits() raised {type(exc).__name__}: {str(exc)[:300]}"]
    finally:
        try:
            probe.close()
        except Exception:  # noqa: BLE001 - a probe that cannot close is not a reason to refuse the run
            pass


def pin_base_model(ref: str) -> dict:
    """What a run starts from: a selected base model {id, path}, or a tuned model (`model-...`), which pins its
    base model and its adapter's artifact, so the run continues from that adapter (a warm start, then GRPO)."""
    if not ref.startswith("model-"):
        return {"id": ref, "path": base_models.require_selected(ref)}
    with session_scope(open_store(), read_only=True) as s:
        model = s.get(Model, ref)
        if model is None:
            raise StropError(f"no tuned model {ref!r}; `strop models list` shows them")
        if not model.artifact_sha256:
            raise StropError(f"tuned model {ref} has no stored adapter to start from")
        return {"id": model.base_model, "path": base_models.require_selected(model.base_model),
                "initModel": {"modelId": model.id, "sha256": model.artifact_sha256, "runId": model.run_id}}


def lineage(pinned: dict, model_id: str | None) -> list[dict]:
    """Base model -> the tuned model a run started from (if any) -> the model it made (once it has)."""
    base = pinned.get("baseModel") or {}
    steps = [{"baseModel": base.get("id")}] if base else []
    if "initModel" in base:
        steps.append({"modelId": base["initModel"]["modelId"], "runId": base["initModel"]["runId"]})
    if model_id:
        steps.append({"modelId": model_id})
    return steps


def memory_problems(descriptor: RunDescriptor, pinned: dict) -> list[str]:
    """The run's estimated peak memory against what is available, from its real prompts (as the loop builds
    them) and sizes; one problem line when it would not fit."""
    # lazy: strop.renderers pulls in torch, numpy, which importing this module does not need
    from strop.renderers import get_renderer
    from strop.client import ServiceClient
    from strop.rl.grpo import plan
    path, version = registry.dataset_file(pinned["dataset"]["ref"])
    with tempfile.TemporaryDirectory() as folder:  # the stored file has no suffix; the loader reads by suffix
        named = Path(folder) / f"rows{Path(version.get('source') or 'rows.jsonl').suffix or '.jsonl'}"
        named.symlink_to(path)
        rows = load_rows(str(named), limit=2000)
    model_dir = pinned["baseModel"]["path"]
    renderer = get_renderer(model_info.get_recommended_renderer_name(pinned["baseModel"]["id"]), get_tokenizer(model_dir))
    config = descriptor.to_grpo_config(str(path), [{"name": "x", "weight": 1.0, "grader": "builtin:gsm8k"}],
                                       base_model=model_dir)
    # planned as the run will be: its dtype, its sampler (vLLM's KV budget) and its device (a GPU's free memory)
    service = None if descriptor.execution.ray else ServiceClient(dtype=config.dtype, sampler=config.sampler,
                                                                  device=pinned.get("device"))
    try:
        plan(config, renderer, rows, service=service)
    except MemoryRefused as exc:
        return [f"$.config.rlHyperparams: {exc}"]
    finally:
        if service is not None:
            service.close()
    return []


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
