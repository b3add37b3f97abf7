"""Admission: a run descriptor checked against the store, this machine and its cluster before the run is made,
and what the run will use pinned: exact versions of its dataset and of each bundle, the base model's folder, where
it computes, its GRPO settings and its plan of steps. `strop.control.runs.admit` refuses a run with the problems
found here, each named by where it is in the descriptor."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

from strop import model_info
from strop.cluster.connect import reachable
from strop.control import base_models, projects, registry
from strop.control.descriptor import SAMPLING_ONLY, RunDescriptor
from strop.data import load_rows
from strop.engine.precision import cuda_count, gpus_problem, run_device
from strop.engine.resources import MemoryRefused
from strop.engine.vllm_find import require_vllm
from strop.envs import env_kind, find_env_module, get_env
from strop.errors import DatasetError, StropError
from strop.files import file_sha256
from strop.names import shown
from strop.rl.branching import skips_identical
from strop.rl.config import plan_steps
from strop.rl.loss_choices import pinned_settings
from strop.scoring import confine
from strop.store import artifacts, open_store, session_scope
from strop.store.schema import Model
from strop.tokenizer_utils import get_tokenizer
from strop.trackers import missing_extras


def check(descriptor: RunDescriptor, *, dry_run: bool = False) -> tuple[list[str], dict]:
    """(the problems found, what is pinned), as `strop.control.runs.admit` describes."""
    problems, pinned = _project_problems(descriptor), {"project": descriptor.project}
    try:
        pinned["baseModel"] = pin_base_model(descriptor.base_model)
    except StropError as exc:
        problems.append(f"$.baseModel: {exc}")
    problems += _execution_problems(descriptor, pinned)
    if descriptor.config.environment is not None:
        problems += _environment_problems(descriptor.config.environment, pinned, dry_run)
    else:
        problems += _dataset_problems(descriptor, pinned)
    problems += _pin_terms(descriptor, pinned)
    hp = descriptor.config.rl_hyperparams
    if descriptor.config.method == "grpo" and hp is not None:
        pinned["rl"] = rl_settings(descriptor, pinned)
        problems += _mix_problems(descriptor, pinned, dry_run)
        names = descriptor.term_names()
        if hp.variance_on is not None and descriptor.config.environment is None and hp.variance_on not in names:
            problems.append(f"$.config.rlHyperparams.varianceOn: {hp.variance_on!r} is not one of the reward terms "
                            f"({', '.join(names)}); name one of them, or null for the total reward")
    if any(not term.is_builtin for term in _terms(descriptor)):
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
    return problems, pinned


def _project_problems(descriptor: RunDescriptor) -> list[str]:
    problems = []
    try:
        settings = projects.get(descriptor.project)["evaluation"]
        if descriptor.config.eval_every and not (settings["dataset"] and settings["grader"]):
            problems.append(f"$.config.evalEvery: project {descriptor.project!r} has no evaluation settings; run "
                            f"`strop projects set-evaluation {descriptor.project} --dataset DS --grader G` first")
    except StropError as exc:
        problems.append(f"$.project: {exc}")
    return problems


def _execution_problems(descriptor: RunDescriptor, pinned: dict) -> list[str]:
    """Where the run computes (pinned: its device, or its Ray trainers), its sampler and its trackers."""
    problems = []
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
    return problems + [f"$.execution.reportTo: {problem}" for problem in missing_extras(descriptor.execution.report_to)]


def _environment_problems(env, pinned: dict, dry_run: bool) -> list[str]:
    pinned["environment"] = {"name": env.name, "options": dict(env.options), "split": env.split}
    try:
        if dry_run and env_kind(env.name) == "class":
            where = find_env_module(env.name)  # on the path, found without running any of it
            pinned["notChecked"] = [f"$.config.environment.name: {env.name} is a 'module:Class' name, not "
                                    f"imported by --dry-run (its module is {where}); starting the run imports "
                                    f"it and checks that it names an environment class with split {env.split!r}"]
            return []
        return _probe_environment(env, get_env)
    except StropError as exc:
        return [f"$.config.environment: {exc}"]


def _dataset_problems(descriptor: RunDescriptor, pinned: dict) -> list[str]:
    try:
        version = registry.get_dataset(descriptor.config.dataset)
        pinned["dataset"] = {"ref": version["ref"], "sha256": version["sha256"], "rows": version.get("rows")}
        kind, method = registry.dataset_kind(version), descriptor.config.method
        if (kind == "supervised") != (method == "sft"):
            return [f"$.config.dataset: {version['ref']} is a "
                    + ("dataset of transcripts or prompt/completion pairs, for method sft"
                       if kind == "supervised" else "question/answer dataset, for method grpo")
                    + f"; method {method} needs "
                    + ("transcripts or prompt/completion pairs" if method == "sft" else
                       "question/answer rows")]
    except StropError as exc:
        return [f"$.config.dataset: {exc}"]
    return []


def _terms(descriptor: RunDescriptor) -> list:
    return descriptor.config.reward.terms if descriptor.config.reward else []


def _pin_terms(descriptor: RunDescriptor, pinned: dict) -> list[str]:
    """Each reward term pinned: a judge, a builtin grader, or a bundle's exact version (and its module checked)."""
    problems, pinned["terms"] = [], []
    for i, (name, term) in enumerate(zip(descriptor.term_names(), _terms(descriptor))):
        entry = {"name": name, "weight": term.weight, "module": term.module, "function": term.function}
        if term.kind == "judge":
            entry.update(judge=term.judge, mode=term.mode)
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
    return problems


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
            "scoutTemperature": hp.scout_temperature, "scout": hp.scout,
            "referenceMembers": hp.reference_members, "referenceWhen": hp.reference_when,
            "identicalTurns": "skip" if skipped else "train", "sftMix": _pinned_mix(hp.sft_mix),
            # how rewards become the update: estimator, aggregation, overlong handling, ratio, clip, passes
            **pinned_settings(SimpleNamespace(**hp.model_dump(), loss_fn_config={}))}


def _pinned_mix(mix) -> dict | None:
    """The SFT mix as the descriptor names it, with its weights; `_mix_problems` adds what it resolved to."""
    if mix.data is None:
        return None
    return {"data": mix.data, "sha256": None, "weight": mix.weight, "examplesPerStep": mix.examples_per_step}


def _mix_problems(descriptor: RunDescriptor, pinned: dict, dry_run: bool) -> list[str]:
    """The SFT mix's transcripts pinned by content: `sftMix.data` names a registered supervised dataset (NAME or
    NAME@VERSION, looked up first) or a file on this machine, which is checked line by line and stored as an
    artifact, so the run (and its resume) trains on what was admitted, however the file changes after."""
    mix = (pinned.get("rl") or {}).get("sftMix")
    if not mix:
        return []
    where, data = "$.config.rlHyperparams.sftMix.data", mix["data"]
    # lazy: strop.sft.data pulls in torch (through the renderers)
    from strop.sft.data import check_file
    try:
        version = registry.get_dataset(data)
    except StropError:
        version = None
    if version is not None:
        if registry.dataset_kind(version) != "supervised":
            return [f"{where}: {version['ref']} is a question/answer dataset; the mix trains on transcripts "
                    "(chat messages or prompt/completion pairs), e.g. what `strop envs demos` writes"]
        mix.update(dataset=version["ref"], sha256=version["sha256"])
        return []
    path = Path(data).expanduser()
    try:
        is_file = path.is_file()
    except (OSError, ValueError):  # a name too long to look up, a NUL
        is_file = False
    if not is_file:
        return [f"{where}: {shown(data)} is neither a registered dataset (`strop registry datasets list`) nor a "
                "file on this machine; register the transcripts (`strop registry datasets register NAME -f "
                "demos.jsonl`) or give the file's path"]
    try:
        check_file(str(path))
    except DatasetError as exc:
        return [f"{where}: {exc}"]
    mix["sha256"] = file_sha256(path) if dry_run else artifacts.put_file(path)
    return []


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
                                       base_model=model_dir, sft_mix=None)  # the mix's file: _mix_problems
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
