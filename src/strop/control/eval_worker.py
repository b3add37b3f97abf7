"""The background worker of one evaluation: `python -m strop.control.eval_worker EVAL_ID`."""

from __future__ import annotations

import shutil
import sys
import traceback
from pathlib import Path

from strop.store import artifacts, open_store, session_scope
from strop.store.schema import DatasetVersion, Evaluation, EvaluationItem, utcnow


def grader_ref(ref: str) -> str:
    """A stored grader reference as `load_grader` takes it (registry bundles materialised locally)."""
    from strop.control import registry
    from strop.control.projects import parse_grader
    parts = parse_grader(ref)
    if parts["kind"] == "builtin":
        return ref
    folder, _ = registry.bundle_dir(parts["bundle"])
    return f"{folder}#{parts['module']}:{parts['function']}"


def main(evaluation_id: str) -> int:
    from strop.control.evaluations import eval_dir, resolve_model
    from strop.data import load_rows
    from strop.evals import evaluate_local
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
        rows, grader, max_tokens = load_rows(str(rows_path)), grader_ref(ref), int(summary.get("maxTokens", 256))
        if model.get("openai"):
            from strop.evals.openai_client import evaluate_openai
            result = evaluate_openai(model["openai"], rows, grader, max_tokens=max_tokens)
        else:
            result = evaluate_local(model["basePath"], rows, grader, adapter=model["adapter"], samples=samples,
                                    max_tokens=max_tokens, progress=False)
        with session_scope(open_store()) as s:
            for item in result.items:
                s.add(EvaluationItem(evaluation_id=evaluation_id, item_index=item.index, sample=0, question=item.question,
                                     gold=item.gold, response=item.response, extracted=item.extracted, score=item.score,
                                     correct=item.correct, tokens=item.tokens, latency_s=item.latency_s))
            evaluation = s.get(Evaluation, evaluation_id)
            evaluation.summary = {**summary, **result.summary}
            evaluation.status, evaluation.finished_at = "succeeded", utcnow()
        return 0
    except BaseException as exc:  # noqa: BLE001 - the record must say why it stopped
        traceback.print_exc()
        with session_scope(open_store()) as s:
            evaluation = s.get(Evaluation, evaluation_id)
            evaluation.status, evaluation.finished_at = "failed", utcnow()
            evaluation.error = f"{type(exc).__name__}: {exc}"[:4000]
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
