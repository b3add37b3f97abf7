"""`strop cleanup`: remove what one quickstart made, as its quickstart.json lists it, and nothing else.

    quickstart_cleanup.cleanup("quickstart-out")
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from strop.control.quickstart import MANIFEST
from strop.errors import StropError


def load_manifest(out: str | Path) -> dict:
    path = Path(out) / MANIFEST
    if not path.exists():
        raise StropError(f"{out}: no {MANIFEST} here; give the --out folder of a quickstart")
    return json.loads(path.read_text())


def cleanup(out: str | Path) -> dict:
    """Remove what the quickstart in `out` made: its result-table rows (and a table left empty), evaluations,
    tuned model and its adapter artifact, run, project, datasets, the files it wrote under `out`, and `out`
    itself when quickstart made it and nothing else is left in it. Nothing else is touched."""
    # lazy: sqlalchemy is heavy or optional, loaded only when this runs
    from sqlalchemy import select

    # lazy: strop.control.evaluations pulls in sqlalchemy, which importing this module does not need
    from strop.control import evaluations, registry, runs
    from strop.evals.sql_tables import delete_comparison
    from strop.store import open_store, session_scope
    from strop.store.schema import Evaluation, Model, Project, Run
    m = load_manifest(out)
    removed: dict[str, list] = {"tables": [], "evaluations": [], "models": [], "artifacts": [], "runs": [],
                                "projects": [], "datasets": [], "files": []}
    run_ids = [r for r in (m.get("run"), m.get("warmStartRun")) if r]  # the RL run first: it started from the other
    for run_id in run_ids:
        status = runs.get(run_id)["status"] if _exists(Run, run_id) else None
        if status in ("pending", "running"):
            raise StropError(f"run {run_id} is still {status}; `strop runs cancel {run_id}` first, then clean up")
    if m.get("results"):
        removed["tables"] = delete_comparison(m["results"]["comparisonId"],
                                              url=m["results"].get("resultsUrl") or open_store())
    shas = set()
    with session_scope(open_store()) as s:
        ids = list((m.get("evaluations") or {}).values())
        for run_id in run_ids:
            ids += s.scalars(select(Evaluation.id).where(Evaluation.run_id == run_id)).all()
        for evaluation_id in dict.fromkeys(ids):
            if s.get(Evaluation, evaluation_id) is not None:
                s.delete(s.get(Evaluation, evaluation_id))
                removed["evaluations"].append(evaluation_id)
        s.flush()
        for run_id in run_ids:
            for model in s.scalars(select(Model).where(Model.run_id == run_id)).all():
                removed["models"].append(model.id)
                shas.add(model.artifact_sha256)
                s.delete(model)
            s.flush()
            run = s.get(Run, run_id)
            if run is not None:
                s.delete(run)
                removed["runs"].append(run_id)
            s.flush()
        s.flush()
        if m.get("project"):
            project = s.scalar(select(Project).where(Project.name == m["project"]))
            if project is not None:
                s.delete(project)
                removed["projects"].append(m["project"])
    removed["artifacts"] = _remove_unreferenced(shas - {None})
    for name in m.get("datasets") or []:
        if any(d["name"] == name for d in registry.list_datasets()):
            registry.delete("dataset", name)
            removed["datasets"].append(name)
    for evaluation_id in removed["evaluations"]:
        shutil.rmtree(evaluations.eval_dir(evaluation_id), ignore_errors=True)
    for run_id in removed["runs"]:
        shutil.rmtree(runs.run_dir(run_id), ignore_errors=True)
    removed["files"] = _remove_files(Path(out), m)
    return removed


def _remove_unreferenced(shas: set[str]) -> list[str]:
    """Delete the adapter artifacts that no model, dataset or bundle version still refers to."""
    # lazy: sqlalchemy is heavy or optional, loaded only when this runs
    from sqlalchemy import select

    # lazy: strop.store.artifacts pulls in sqlalchemy, which importing this module does not need
    from strop.store import artifacts, open_store, session_scope
    from strop.store.schema import BundleVersion, DatasetVersion, Model
    gone = []
    with session_scope(open_store(), read_only=True) as s:
        for sha in sorted(shas):
            if any(s.scalar(select(column).where(column == sha).limit(1)) for column in
                   (Model.artifact_sha256, DatasetVersion.sha256, BundleVersion.sha256)):
                continue
            artifacts.remove(sha)
            gone.append(sha)
    return gone


def _remove_files(out: Path, m: dict) -> list[str]:
    """The files and folders the manifest lists, newest first (a folder only once empty), then the manifest,
    then `out` when quickstart made it and it is empty: a user's own files there stay."""
    gone = []
    for relative in reversed(m.get("created") or []):
        path = out / relative
        try:
            if path.is_dir():
                path.rmdir()  # refuses a folder with someone else's files in it
            elif path.exists():
                path.unlink()
            else:
                continue
        except OSError:
            continue
        gone.append(relative)
    for name in (MANIFEST, Path(MANIFEST).with_suffix(".tmp").name):
        if (out / name).exists():
            (out / name).unlink()
            gone.append(name)
    if m.get("createdOut") and out.is_dir() and not any(out.iterdir()):
        out.rmdir()
        gone.append(str(out))
    return gone


def _exists(table, key) -> bool:
    # lazy: strop.store pulls in sqlalchemy, which importing this module does not need
    from strop.store import open_store, session_scope
    with session_scope(open_store(), read_only=True) as s:
        return s.get(table, key) is not None
