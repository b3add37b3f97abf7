"""The background worker of one evaluation: `python -m strop.control.eval_worker EVAL_ID`."""

from __future__ import annotations

import json
import shutil
import sys
import traceback
from pathlib import Path

from strop.control import registry
from strop.control.evaluations import eval_dir, resolve_judge, resolve_model
from strop.control.projects import parse_grader
from strop.data import load_rows
from strop.errors import StropError
from strop.store import artifacts, open_store, session_scope
from strop.store.schema import DatasetVersion, Evaluation, EvaluationItem, utcnow


def grader_ref(ref: str) -> str:
    """A stored grader reference as `load_grader` takes it (registry bundles materialised locally)."""
    parts = parse_grader(ref)
    if parts["kind"] == "builtin":
        return ref
    folder, _ = registry.bundle_dir(parts["bundle"])
    return f"{folder}#{parts['module']}:{parts['function']}"


def progress_writer(path: Path):
    """`report(phase, done, total, **more)` writes {phase, done, total, ...} to `path` atomically."""
    def report(phase: str, done: int, total: int, **more) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"phase": phase, "done": done, "total": total, **more}))
        tmp.replace(path)
    return report


def judge_items(settings: dict | None, items, api_key_env: str | None = None, on_progress=None,
                endpoint: dict | None = None, service=None, generated_on: str | None = None) -> tuple[list, dict | None]:
    """The judge's verdict on each item (None each when no judge was asked for) and their summary. A local judge
    samples through `service` when given: the one that generated on base model `generated_on`, whose engine it
    reuses when it judges with the same base model."""
    if not settings:
        return [None] * len(items), None
    # lazy: strop.evals.judge pulls in torch, numpy, which importing this module does not need
    from strop.evals.judge import JudgeInput, Judge, summarize_verdicts
    target = resolve_judge(settings["model"])
    if service is not None and target.get("basePath") != generated_on:
        service.close()  # the generator's engine (another model) is not kept in memory beside the judge's
    judge = Judge(target.get("openai") or target["basePath"], settings.get("metrics") or None,
                  retries=settings.get("retries", 2), adapter=target.get("adapter"),
                  api_key_env=api_key_env or "OPENAI_API_KEY", service=service, **_client_settings(endpoint))
    verdicts = judge.judge_many([JudgeInput(i.question, i.gold, i.response) for i in items], on_progress=on_progress)
    summary = summarize_verdicts(verdicts, judge.metrics, exact=[i.correct for i in items])
    return verdicts, {**summary, "model": settings["model"], "schemaEnforced": judge.schema_enforced}


def _client_settings(endpoint: dict | None) -> dict:
    """The stored endpoint settings as keyword arguments (older evaluations stored none: the defaults)."""
    endpoint = endpoint or {}
    names = {"concurrency": "concurrency", "maxRetries": "max_retries", "timeout": "timeout"}
    return {name: endpoint[key] for key, name in names.items() if endpoint.get(key) is not None}


def all_requests_failed(model_ref: str, items) -> StropError | None:
    """An endpoint that answered nothing is a failed evaluation, not one scoring 0%."""
    failed = [i.error for i in items if i.error and i.error.startswith("request failed")]
    if not items or len(failed) < len(items):
        return None
    first = failed[0].rstrip(".")
    return StropError(f"every request to {model_ref} failed ({len(failed)} of {len(items)}); the first: {first}. "
                      "Check that the endpoint is up and the URL, model name and API key are right")


def main(evaluation_id: str) -> int:
    # lazy: strop.evals pulls in torch, numpy, which importing this module does not need
    import strop
    from strop.evals import evaluate_local
    service = None  # a local model's: generation and a local judge share its sampler engine (one vLLM start, not two)
    with session_scope(open_store()) as s:
        evaluation = s.get(Evaluation, evaluation_id)
        evaluation.status, evaluation.started_at = "running", utcnow()
        version = s.get(DatasetVersion, evaluation.dataset_version_id)
        sha, source = version.sha256, version.source
        model_ref, ref, samples, summary = evaluation.model_ref, evaluation.grader_ref, evaluation.samples, dict(evaluation.summary or {})
    try:
        folder = eval_dir(evaluation_id)
        rows_path = folder / f"dataset{Path(source or 'rows.jsonl').suffix or '.jsonl'}"
        shutil.copyfile(artifacts.path_of(sha), rows_path)
        model = resolve_model(model_ref)
        rows = load_rows(str(rows_path), limit=summary.get("limit"), fields=summary.get("fields"))
        grader, max_tokens = grader_ref(ref), int(summary.get("maxTokens", 256))
        report = progress_writer(folder / "progress.json")
        generated = lambda done, total, correct: report("generate", done, total, correct=correct)  # noqa: E731
        if model.get("openai"):
            # lazy: strop.evals.openai_client pulls in torch, numpy, which importing this module does not need
            from strop.evals.openai_client import evaluate_openai
            result = evaluate_openai(model["openai"], rows, grader, max_tokens=max_tokens, on_progress=generated,
                                     api_key_env=summary.get("apiKeyEnv") or "OPENAI_API_KEY",
                                     **_client_settings(summary.get("endpoint")))
            failure = all_requests_failed(model_ref, result.items)
            if failure is not None:
                raise failure
        else:
            service = strop.ServiceClient()
            result = evaluate_local(model["basePath"], rows, grader, adapter=model["adapter"], samples=samples,
                                    max_tokens=max_tokens, progress=False, on_progress=generated, service=service)
        verdicts, judged = judge_items(summary.get("judgeSettings"), result.items, summary.get("apiKeyEnv"),
                                       on_progress=lambda done, total: report("judge", done, total),
                                       endpoint=summary.get("endpoint"), service=service,
                                       generated_on=model.get("basePath"))
        with session_scope(open_store()) as s:
            for item, verdict in zip(result.items, verdicts):
                s.add(EvaluationItem(evaluation_id=evaluation_id, item_index=item.index, sample=0, question=item.question,
                                     gold=item.gold, response=item.response, extracted=item.extracted, score=item.score,
                                     correct=item.correct, tokens=item.tokens, latency_s=item.latency_s,
                                     judge=verdict and verdict.to_dict()))
            evaluation = s.get(Evaluation, evaluation_id)
            evaluation.summary = {**summary, **result.summary, **({"judge": judged} if judged else {})}
            evaluation.status, evaluation.finished_at = "succeeded", utcnow()
        return 0
    except BaseException as exc:  # noqa: BLE001 - the record must say why it stopped
        traceback.print_exc()
        with session_scope(open_store()) as s:
            evaluation = s.get(Evaluation, evaluation_id)
            evaluation.status, evaluation.finished_at = "failed", utcnow()
            reason = str(exc) if isinstance(exc, StropError) else f"{type(exc).__name__}: {exc}"
            evaluation.error = reason[:4000]
        return 1
    finally:
        if service is not None:
            service.close()  # a vLLM engine's process ends with the evaluation


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
