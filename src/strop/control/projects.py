"""Training projects: a name and its evaluation settings (dataset + grader), which runs and evaluations use.

    from strop.control import projects
    projects.create("gsm8k")
    projects.set_evaluation("gsm8k", dataset="gsm8k/eval", grader="bundle:gsm8k/scoring#reward:compute_score")

A grader reference is `builtin:gsm8k` (or another builtin) or `bundle:NAME[@VERSION][#MODULE[:FUNCTION]]`.
"""

from __future__ import annotations

import re

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from strop.control.registry import RegistryError, check_bundle_module, check_name, get_bundle, get_dataset
from strop.errors import StropError
from strop.names import shown
from strop.scoring.bundles import BUILTINS
from strop.store import open_store, session_scope
from strop.store.schema import Project, utcnow

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


class ProjectError(StropError):
    """A project could not be created, found or configured."""


def _dict(p: Project) -> dict:
    return {"name": p.name, "evaluation": {"dataset": p.eval_dataset, "grader": p.eval_grader},
            "createdAt": p.created_at.isoformat(), "updatedAt": p.updated_at.isoformat()}


def create(name: str) -> dict:
    check_name(name, "project")
    try:
        with session_scope(open_store()) as s:
            project = Project(name=name)
            s.add(project)
            s.flush()
            return _dict(project)
    except IntegrityError:
        raise ProjectError(f"project {name!r} already exists; use `strop projects get {name}` to see it") from None


def get(name: str) -> dict:
    check_name(name, "project")
    with session_scope(open_store(), read_only=True) as s:
        project = s.scalar(select(Project).where(Project.name == name))
        if project is None:
            known = s.scalars(select(Project.name).order_by(Project.name)).all()
            raise ProjectError(f"no project named {name!r}; create it with `strop projects create {name}`"
                               + (f" (projects: {', '.join(known[:10])})" if known else ""))
        return _dict(project)


def list_all() -> list[dict]:
    with session_scope(open_store(), read_only=True) as s:
        return [_dict(p) for p in s.scalars(select(Project).order_by(Project.name))]


def parse_grader(ref: str) -> dict:
    """Split and check a grader reference; returns its parts. The bundle must be registered."""
    if ref.startswith("builtin:"):
        if ref[len("builtin:"):] not in BUILTINS:
            raise ProjectError(f"unknown grader {shown(ref)}; builtin graders: "
                               + ", ".join(f"builtin:{name}" for name in sorted(BUILTINS)))
        return {"kind": "builtin", "ref": ref}
    if not ref.startswith("bundle:"):
        raise ProjectError(f"grader {shown(ref)} must be builtin:NAME or bundle:NAME[@VERSION]#MODULE:FUNCTION, "
                           "e.g. bundle:gsm8k/scoring#reward:compute_score")
    body = ref[len("bundle:"):]
    bundle, _, entry = body.partition("#")
    module, _, function = entry.partition(":")
    if module and not _MODULE.fullmatch(module) or function and not _IDENTIFIER.fullmatch(function):
        raise ProjectError(f"grader {shown(ref)}: after '#' comes a Python module and function, e.g. "
                           "bundle:gsm8k/scoring#reward:compute_score")
    module, function = module or "reward", function or "compute_score"
    try:
        check_bundle_module(get_bundle(bundle), module, function)
    except RegistryError as exc:
        raise ProjectError(f"grader {shown(ref)}: {exc}") from None
    return {"kind": "bundle", "bundle": bundle, "module": module, "function": function}


def set_evaluation(name: str, dataset: str, grader: str) -> dict:
    """Set (overwrite) the project's evaluation dataset and grader, after checking both exist."""
    check_name(name, "project")
    try:
        get_dataset(dataset)
    except RegistryError as exc:
        raise ProjectError(f"--dataset {shown(dataset)}: {exc}") from None
    parse_grader(grader)
    with session_scope(open_store()) as s:
        project = s.scalar(select(Project).where(Project.name == name))
        if project is None:
            raise ProjectError(f"no project named {name!r}; create it with `strop projects create {name}`")
        project.eval_dataset, project.eval_grader, project.updated_at = dataset, grader, utcnow()
        s.flush()
        return _dict(project)
