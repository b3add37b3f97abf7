"""Evaluations: a model (a tuned modelId or a base model) on a registered dataset with a grader, run by a
background worker; per-item rows and a summary land in the store.

    from strop.control import evaluations
    e = evaluations.start(model="model-2d69fb15", dataset="gsm8k/eval", grader="bundle:gsm8k/scoring#reward:compute_score")
    evaluations.wait(e["evaluationId"]); evaluations.report(e["evaluationId"])
"""

from __future__ import annotations

import json

from sqlalchemy import select

from strop.control import base_models, processes, registry
from strop.control.projects import parse_grader
from strop.errors import StropError
from strop.models.catalog import DEFAULT_MODEL
from strop.paths import strop_home
from strop.scoring.confine import detect
from strop.store import open_store, session_scope
from strop.store.schema import Dataset, DatasetVersion, Evaluation, EvaluationItem, Model, utcnow

WORKER = "strop.control.eval_worker"


class EvaluationError(StropError):
    """An evaluation could not be started, found or read."""


def eval_dir(evaluation_id: str):
    return strop_home() / "evaluations" / evaluation_id


def resolve_model(ref: str) -> dict:
    """A modelId (tuned) or a selected base model id, as {base path, adapter path or None}."""
    if ref.startswith("openai:"):
        # lazy: strop.evals.openai_client pulls in torch, numpy, which importing this module does not need
        from strop.evals.openai_client import parse_openai_ref
        endpoint = parse_openai_ref(ref)
        return {"modelId": None, "baseModel": endpoint.model, "basePath": None, "adapter": None, "openai": ref}
    if ref.startswith("model-"):
        with session_scope(open_store(), read_only=True) as s:
            model = s.get(Model, ref)
            if model is None:
                raise EvaluationError(f"--model {ref!r}: no such model; `strop models list` shows the tuned models")
            return {"modelId": model.id, "baseModel": model.base_model, "basePath": base_models.require_selected(model.base_model),
                    "adapter": model.adapter_path}
    return {"modelId": None, "baseModel": ref, "basePath": base_models.require_selected(ref), "adapter": None}


def resolve_judge(ref: str) -> dict:
    """A judge as the worker runs it: an endpoint, or a local base path with an optional adapter."""
    if ref.startswith("openai:"):
        return resolve_model(ref)
    return resolve_model(DEFAULT_MODEL if ref == "local" else ref)


def start(model: str, dataset: str, grader: str = "builtin:gsm8k", *, samples: int = 1, max_tokens: int = 256,
          limit: int | None = None, fields: dict | None = None, judge: str | None = None, judge_metrics=None,
          judge_retries: int = 2, api_key_env: str = "OPENAI_API_KEY", concurrency: int = 4, max_retries: int = 3,
          request_timeout: float = 120.0, run_id: str | None = None, run_step: int | None = None) -> dict:
    """Admit and start an evaluation; `run_id`/`run_step` tie it to the run that asked for it.

    `limit` evaluates the first N items; `fields` maps question/answer to the dataset's columns; `judge`
    ('openai:NAME@URL', 'local' or a model id) scores each response on `judge_metrics` (default: the GSM8K walkthrough's
    rubric) after exact grading. Endpoints read their API key from the variable `api_key_env` (only its name
    is stored), send `concurrency` requests at a time, retry a failed request `max_retries` times with
    backoff, and give each request `request_timeout` seconds.
    """
    if not api_key_env or not api_key_env.replace("_", "").isalnum():
        raise EvaluationError(f"--api-key-env must name an environment variable, e.g. OPENAI_API_KEY; got {api_key_env!r}")
    if samples < 1:
        raise EvaluationError(f"--samples must be at least 1, got {samples}")
    if max_tokens < 1:
        raise EvaluationError(f"--max-tokens must be at least 1, got {max_tokens}")
    if limit is not None and limit < 1:
        raise EvaluationError(f"--limit must be at least 1, got {limit}")
    if concurrency < 1:
        raise EvaluationError(f"--concurrency must be at least 1, got {concurrency}")
    if max_retries < 0:
        raise EvaluationError(f"--max-retries must be 0 or more, got {max_retries}")
    if not request_timeout > 0:
        raise EvaluationError(f"--timeout must be more than 0 seconds, got {request_timeout}")
    if samples > 1 and model.startswith("openai:"):
        raise EvaluationError("--samples > 1 (pass@k) is for local models; an endpoint is evaluated greedily once")
    if not dataset:
        raise EvaluationError("an evaluation needs a dataset: --dataset NAME, or dataset: in --config")
    resolved = resolve_model(model)
    parse_grader(grader)
    if not grader.strip().startswith("builtin:"):
        detect().require()  # refused here, with the reason, rather than in the background worker
    judge_settings = None
    if judge is not None or judge_metrics:
        # lazy: strop.evals.judge pulls in torch, numpy, which importing this module does not need
        from strop.evals.judge import metrics_from
        metrics_from(judge_metrics)  # refuses a bad metric now, not in the worker
        judge = judge or "local"
        resolve_judge(judge)
        judge_settings = {"model": judge, "metrics": list(judge_metrics or []), "retries": judge_retries}
    version = registry.get_dataset(dataset)
    with session_scope(open_store()) as s:
        version_row = s.scalar(select(DatasetVersion).join(Dataset).where(
            Dataset.name == version["name"], DatasetVersion.version == version["version"]))
        evaluation = Evaluation(model_ref=model, model_id=resolved["modelId"], dataset_version_id=version_row.id,
                                grader_ref=grader, samples=samples, status="pending", run_id=run_id, run_step=run_step,
                                summary={"maxTokens": max_tokens, "dataset": version["ref"], "limit": limit,
                                         "fields": fields, "judgeSettings": judge_settings,
                                         "apiKeyEnv": api_key_env,
                                         "endpoint": {"concurrency": concurrency, "maxRetries": max_retries,
                                                      "timeout": request_timeout}})
        s.add(evaluation)
        s.flush()
        evaluation_id = evaluation.id
    pid = processes.spawn(WORKER, evaluation_id, eval_dir(evaluation_id) / "worker.log")
    with session_scope(open_store()) as s:
        evaluation = s.get(Evaluation, evaluation_id)
        evaluation.worker_pid, evaluation.worker_host = pid, processes.this_host()
    return get(evaluation_id)


def _load(s, evaluation_id: str) -> Evaluation:
    evaluation = s.get(Evaluation, evaluation_id)
    if evaluation is None:
        raise EvaluationError(f"no evaluation {evaluation_id!r}")
    here = not evaluation.worker_host or evaluation.worker_host == processes.this_host()  # else its /proc knows
    if evaluation.status in ("pending", "running") and evaluation.worker_pid and here \
            and not processes.alive(evaluation.worker_pid, WORKER, evaluation_id):
        evaluation.status, evaluation.finished_at = "failed", utcnow()
        evaluation.error = f"the worker died without finishing; see {eval_dir(evaluation_id) / 'worker.log'}"
    return evaluation


def _dict(e: Evaluation) -> dict:
    summary = dict(e.summary or {})
    settings = {key: summary.pop(key, None) for key in ("limit", "fields", "judgeSettings", "apiKeyEnv", "endpoint")}
    return {"evaluationId": e.id, "model": e.model_ref, "modelId": e.model_id, "dataset": summary.pop("dataset", None),
            "grader": e.grader_ref, "samples": e.samples, "status": e.status, "limit": settings["limit"],
            "judge": (settings["judgeSettings"] or {}).get("model"), "runId": e.run_id, "runStep": e.run_step,
            "endpoint": settings["endpoint"],
            "summary": summary, "error": e.error,
            "createdAt": e.created_at.isoformat(), "finishedAt": e.finished_at and e.finished_at.isoformat()}


def get(evaluation_id: str) -> dict:
    """An evaluation's record; while it runs, `progress` says how far it is ({phase, done, total, correct})."""
    with session_scope(open_store()) as s:
        info = _dict(_load(s, evaluation_id))
    if info["status"] == "running":
        try:
            info["progress"] = json.loads((eval_dir(evaluation_id) / "progress.json").read_text())
        except (OSError, ValueError):  # not written yet, or being replaced this instant
            info["progress"] = None
    return info


def wait(evaluation_id: str, *, timeout: float | None = None, interval: float = 1.0, on_poll=None) -> dict:
    def too_long(info):
        raise EvaluationError(f"evaluation {evaluation_id} is still {info['status']} after {timeout:g} s")
    return processes.poll_until_finished(lambda: get(evaluation_id), timeout=timeout, on_poll=on_poll,
                                         interval=interval, on_timeout=too_long)


def report(evaluation_id: str, *, items: bool = False) -> dict:
    info = get(evaluation_id)
    if items:
        with session_scope(open_store(), read_only=True) as s:
            rows = s.scalars(select(EvaluationItem).where(EvaluationItem.evaluation_id == evaluation_id)
                             .order_by(EvaluationItem.item_index, EvaluationItem.sample)).all()
            info["items"] = [{"index": r.item_index, "question": r.question, "gold": r.gold, "response": r.response,
                              "extracted": r.extracted, "score": r.score, "correct": r.correct, "tokens": r.tokens,
                              "latencySeconds": r.latency_s, "judge": r.judge} for r in rows]
    return info


def compare_evaluations(eval_a: str, eval_b: str, *, labels: tuple[str, str] | None = None, seed: int = 0) -> dict:
    """Compare two finished evaluations from the store (strop.evals.compare does the statistics)."""
    # lazy: strop.evals.compare pulls in torch, numpy, which importing this module does not need
    from strop.evals.compare import ComparisonError, compare, default_label
    reports = []
    for evaluation_id in (eval_a, eval_b):
        stored = report(evaluation_id, items=True)
        if stored["status"] != "succeeded":
            raise ComparisonError(f"evaluation {evaluation_id} is {stored['status']}; compare finished evaluations "
                                  f"(`strop evaluations wait {evaluation_id}`)")
        reports.append(stored)
    sides = []
    for i, stored in enumerate(reports):
        sides.append({"label": labels[i] if labels else default_label(stored["model"]), "model": stored["model"],
                      "evaluationId": stored["evaluationId"], "dataset": stored["dataset"],
                      "requestErrors": stored["summary"].get("requestErrors", 0)})
    if labels is None and sides[0]["label"] == sides[1]["label"]:
        sides[0]["label"], sides[1]["label"] = f"A: {sides[0]['label']}", f"B: {sides[1]['label']}"
    return compare(reports[0]["items"], reports[1]["items"], a=sides[0], b=sides[1],
                   judge_a=reports[0]["summary"].get("judge"), judge_b=reports[1]["summary"].get("judge"), seed=seed)
