"""The background worker of one run: `python -m strop.control.worker RUN_ID`.

It materialises what the run pinned (the dataset file and bundle folders, from the artifact store), builds the
loop's config from the descriptor, and runs GRPO in $STROP_HOME/runs/RUN_ID; a `RunMirror` copies each
metrics row and checkpoint from the run's files into the store. SIGTERM (from `strop runs cancel`) stops it
between steps' writes and marks the run cancelled; an exception marks it failed with the error; success
registers the tuned model.
"""

from __future__ import annotations

import shutil
import signal
import sys
import traceback
from pathlib import Path

from sqlalchemy import select as sql_select

from strop import model_info
from strop.control import evaluations, projects, registry
from strop.control.descriptor import to_sft_config, validate_descriptor
from strop.control.eval_worker import grader_ref
from strop.control.mirror import RunMirror
from strop.control.runs import run_dir
from strop.data import load_rows
from strop.engine.finite import check_adapter_file
from strop.evals import evaluate_sampler
from strop.rl import run_grpo
from strop.rl.checkpoints import sha256_file
from strop.sft import SFTConfig, run_sft
from strop.store import artifacts, open_store, session_scope
from strop.store.schema import Dataset, DatasetVersion, Evaluation, EvaluationItem, Model, Run, utcnow


class Cancelled(BaseException):
    """Raised by the SIGTERM handler; a BaseException so no `except Exception` in the loop swallows it."""


def _on_sigterm(signum, frame):
    raise Cancelled()


def _set(run_id: str, **fields) -> None:
    with session_scope(open_store()) as s:
        run = s.get(Run, run_id)
        for key, value in fields.items():
            setattr(run, key, value)


def build_config(run: Run, folder: Path):
    """The loop config of a run (GRPOConfig, or SFTConfig for method sft), its pinned inputs made local."""
    descriptor = validate_descriptor(run.descriptor)
    base = run.pinned["baseModel"]
    common = {"base_model": base["path"], "renderer": model_info.get_recommended_renderer_name(base["id"])}
    if "initModel" in base:  # continuing a tuned model: its adapter, unpacked from the artifact the run pinned
        adapter = folder / "init-adapter"
        if not adapter.exists() or artifacts.dir_sha256(adapter) != base["initModel"]["sha256"]:
            shutil.rmtree(adapter, ignore_errors=True)
            artifacts.extract_dir(base["initModel"]["sha256"], adapter)
        common["init_adapter"] = str(adapter)
    mix = (run.pinned.get("rl") or {}).get("sftMix")
    # the mix's transcripts as admitted, not the file as it is now (a run admitted before mixes were stored as
    # artifacts reads its file)
    if mix and mix.get("sha256") and (mix.get("dataset") or artifacts.exists(mix["sha256"])):
        common["sft_mix"] = str(_pinned_copy(folder / "sft-mix.jsonl", mix["sha256"],
                                             f"the SFT mix the run pinned ({mix.get('dataset') or mix['data']}"))
    if "environment" in run.pinned:
        return descriptor.to_grpo_config(None, [], **common)
    dataset = _dataset_file(run, folder)
    if descriptor.config.method == "sft":
        return to_sft_config(descriptor, str(dataset), **common)
    refs = []
    for term, spec in zip(run.pinned["terms"], descriptor.config.reward.terms if descriptor.config.reward else []):
        if "judge" in term:
            refs.append(None)  # reward_term_specs gives a judge term its rubric and judge, not a grader
        elif "builtin" in term:
            refs.append(term["builtin"])
        else:
            bundle, _ = registry.bundle_dir(term["bundle"])
            refs.append(spec.grader_ref(bundle))
    return descriptor.to_grpo_config(str(dataset), descriptor.reward_term_specs(refs), **common)


def _dataset_file(run: Run, folder: Path) -> Path:
    """The run's pinned dataset as a local file (checked against the sha256 the run pinned)."""
    # artifacts are named by sha256 alone; the loader reads a file by its suffix, so copy it in with one
    _, version = registry.dataset_file(run.pinned["dataset"]["ref"])
    suffix = Path(version["source"] or "rows.jsonl").suffix or ".jsonl"
    return _pinned_copy(folder / f"dataset{suffix}", run.pinned["dataset"]["sha256"],
                        f"the dataset version the run pinned ({run.pinned['dataset']['ref']}")


def _pinned_copy(dataset: Path, expected: str, pinned: str) -> Path:
    """The stored artifact `expected` copied to `dataset` (its name's suffix is what the loader reads by), once:
    a copy that no longer matches is made again, so a resumed run trains on what was admitted."""
    if dataset.exists() and sha256_file(dataset) != expected:
        print(f"warning: {dataset} no longer matches {pinned}, sha256 {expected[:12]}); copying it again from the "
              "store", file=sys.stderr)
        dataset.unlink()
    if not dataset.exists():
        dataset.parent.mkdir(parents=True, exist_ok=True)
        partial = dataset.with_name(f".{dataset.name}.partial")  # a kill mid-copy must not leave a short file
        shutil.copyfile(artifacts.path_of(expected), partial)
        partial.replace(dataset)
    return dataset


def evaluate_during(run: Run, folder: Path, max_tokens: int):
    """The on_eval hook: the project's evaluation of the weights as they are at a step, run in this process
    (training waits for it) and stored as a finished evaluation tied to the run and step."""
    settings = projects.get(run.pinned["project"])["evaluation"]
    path, version = registry.dataset_file(settings["dataset"])
    rows_path = folder / f"eval-dataset{Path(version['source'] or 'rows.jsonl').suffix or '.jsonl'}"
    shutil.copyfile(path, rows_path)
    rows, grader = load_rows(str(rows_path)), grader_ref(settings["grader"])

    def on_eval(step, training, renderer):
        started = utcnow()
        # sampled as every evaluation is (float32 on a CPU), though the run's rollouts may be bf16
        result = evaluate_sampler(training.evaluation_sampling_client(), renderer, rows, grader,
                                  max_tokens=max_tokens)
        with session_scope(open_store()) as s:
            version_id = s.scalar(sql_select(DatasetVersion.id).join(Dataset).where(
                Dataset.name == version["name"], DatasetVersion.version == version["version"]))
            evaluation = Evaluation(model_ref=f"{run.id}@step-{step}", dataset_version_id=version_id,
                                    grader_ref=settings["grader"], run_id=run.id, run_step=step, status="succeeded",
                                    summary={"dataset": version["ref"], "maxTokens": max_tokens, **result.summary},
                                    started_at=started, finished_at=utcnow())
            s.add(evaluation)
            s.flush()
            for item in result.items:
                s.add(EvaluationItem(evaluation_id=evaluation.id, item_index=item.index, sample=0,
                                     question=item.question, gold=item.gold, response=item.response,
                                     extracted=item.extracted, score=item.score, correct=item.correct,
                                     tokens=item.tokens, latency_s=item.latency_s))
        print(f"step {step}: evaluation accuracy {result.summary.get('accuracy', 0):.3f}", file=sys.stderr)
    return on_eval


def evaluate_at_end(run: Run, model_id: str, step: int, max_tokens: int) -> None:
    """Start the project's evaluation of the tuned model, when the project has one; a failure to start it is
    logged, not fatal: the run itself succeeded."""
    try:
        settings = projects.get(run.pinned["project"])["evaluation"]
        if settings["dataset"] and settings["grader"]:
            started = evaluations.start(model_id, settings["dataset"], settings["grader"], max_tokens=max_tokens,
                                        run_id=run.id, run_step=step)
            print(f"started the project's evaluation {started['evaluationId']}", file=sys.stderr)
    except Exception:  # noqa: BLE001
        traceback.print_exc()


def main(run_id: str) -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    with session_scope(open_store()) as s:
        run = s.get(Run, run_id)
        if run is None:
            print(f"no run {run_id}", file=sys.stderr)
            return 1
        run.status, run.started_at = "running", run.started_at or utcnow()
        s.flush()
        s.expunge(run)
    folder = run_dir(run_id)
    try:
        config = build_config(run, folder)
        max_tokens = getattr(config, "max_completion_length", 256)  # of the project's evaluations
        on_eval = evaluate_during(run, folder, max_tokens) if getattr(config, "eval_every", None) else None
        mirror = RunMirror(run_id, folder)
        try:
            with mirror.following(every=1.0):  # the store copies the run's files; the loop knows nothing of it
                if isinstance(config, SFTConfig):
                    result = run_sft(config, folder, progress=False)
                else:
                    result = run_grpo(config, folder, progress=False, on_eval=on_eval)
        finally:
            mirror.sync()  # every row and checkpoint written, whether the run finished, failed or was cancelled
        # the trainer saves no NaN weights; this holds whatever wrote the folder: no model of NaNs is registered
        check_adapter_file(result.final_adapter, f"register {result.final_adapter} as the run's model")
        sha = artifacts.put_dir(result.final_adapter)
        with session_scope(open_store()) as s:
            model = Model(run_id=run_id, base_model=run.base_model, adapter_path=str(result.final_adapter),
                          artifact_sha256=sha)
            s.add(model)
            s.flush()
            s.get(Run, run_id).model_id = model_id = model.id
        # started before the run shows succeeded: whoever waits for the run then finds its evaluation listed
        evaluate_at_end(run, model_id, result.steps, max_tokens)
        _set(run_id, status="succeeded", finished_at=utcnow())
        return 0
    except Cancelled:
        _set(run_id, status="cancelled", finished_at=utcnow())
        return 0
    except BaseException as exc:  # noqa: BLE001 - the run record must say why it stopped
        traceback.print_exc()
        _set(run_id, status="failed", finished_at=utcnow(), error=f"{type(exc).__name__}: {exc}"[:4000])
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
