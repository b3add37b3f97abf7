"""The registry: datasets and scoring bundles as named, immutable, numbered versions.

    from strop.control import registry
    registry.register_dataset("gsm8k/train", "data/train.jsonl")     # {'name': ..., 'version': 1, 'created': True}
    registry.register_dataset("gsm8k/train", "data/train.jsonl")     # same content: the same version, created False
    path, version = registry.dataset_file("gsm8k/train@1")            # the stored file, checked against its sha256

A reference is `NAME` (the latest version) or `NAME@VERSION`. Content is stored once under
$STROP_HOME/artifacts by sha256; the database keeps names, versions and sums. Registering content that an
existing version already holds returns that version, so a walkthrough can register on every pass.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from strop.data import load_rows
from strop.errors import StropError
from strop.files import atomic_folder
from strop.names import registry_name_problem, shown
from strop.paths import strop_home
from strop.scoring import check_bundle, check_bundle_folder
from strop.store import artifacts, open_store, session_scope
from strop.store.schema import Bundle, BundleVersion, Dataset, DatasetVersion, Evaluation, Project, Run


class RegistryError(StropError):
    """A registry name, reference or content was refused."""


def check_name(name: str, kind: str) -> str:
    """`name` if it is a good registry name (the rule in strop.names, which run descriptors use too)."""
    problem = registry_name_problem(name)
    if problem:
        raise RegistryError(f"{kind} name {shown(name)} is not allowed: {problem}")
    return name


def parse_ref(ref: str, kind: str) -> tuple[str, int | None]:
    """'NAME' -> (NAME, None); 'NAME@3' -> (NAME, 3)."""
    name, at, version = str(ref).partition("@")
    check_name(name, kind)
    if not at:
        return name, None
    if not version.isdigit() or int(version) < 1:
        raise RegistryError(f"{kind} reference {shown(ref)}: the part after '@' must be a version number >= 1, "
                            f"e.g. {name}@1")
    return name, int(version)


# ---- datasets ---------------------------------------------------------------------------------------------

def register_dataset(name: str, file: str | Path) -> dict:
    """Validate every row of `file` (errors name the line), then store it as a new version unless its content
    is already a version of `name`."""
    check_name(name, "dataset")
    # lazy: strop.sft.data pulls in torch (through the renderers), which the registry does not otherwise need
    from strop.sft.data import check_file, is_supervised_file
    if is_supervised_file(file):  # chat transcripts or prompt/completion pairs, for method sft
        count = check_file(file)  # raises DatasetError with line numbers; nothing is stored before this passes
        sha = artifacts.put_file(file)
        return _register(Dataset, DatasetVersion, "dataset_id", name, sha, source=str(Path(file).resolve()),
                         row_count=count, info={"kind": "supervised", "fields": ["messages"]})
    rows = load_rows(str(file))  # raises DatasetError with line numbers; nothing is stored before this passes
    sha = artifacts.put_file(file)
    return _register(Dataset, DatasetVersion, "dataset_id", name, sha, source=str(Path(file).resolve()),
                     row_count=len(rows), info={"fields": sorted({"question", "answer", *rows[0].extra})})


def dataset_kind(version: dict) -> str:
    """'supervised' (transcripts, prompt/completion pairs: method sft) or 'rows' (question/answer: GRPO)."""
    return (version.get("info") or {}).get("kind", "rows")


def list_datasets() -> list[dict]:
    return _list(Dataset, DatasetVersion, "dataset_id")


def get_dataset(ref: str) -> dict:
    return _get(Dataset, DatasetVersion, "dataset_id", ref, "dataset")


def dataset_file(ref: str) -> tuple[Path, dict]:
    """The stored file of a dataset version (its sha256 is checked) and the version's record."""
    version = get_dataset(ref)
    return artifacts.path_of(version["sha256"]), version


# ---- bundles ----------------------------------------------------------------------------------------------

def register_bundle(name: str, directory: str | Path, module: str | None = None,
                    function: str = "compute_score") -> dict:
    """Snapshot a bundle directory (a folder of Python modules) after checking it in the grader sandbox: every
    top-level module that defines `function` (at least one must), or only `module` when it is given."""
    check_name(name, "bundle")
    directory = Path(directory)
    if not directory.is_dir():
        raise RegistryError(f"bundle directory {directory} does not exist or is not a directory; pass the folder of "
                            f"Python modules, e.g. strop registry bundles register {name} -f scoring/")
    artifacts.dir_sha256(directory)  # special files and links are refused before any of it is imported
    if module is None:
        modules, problem = check_bundle_folder(directory, function)
    else:
        present = _top_modules(directory)
        if module not in present and not directory.joinpath(*module.split(".")).with_suffix(".py").is_file():
            raise RegistryError(f"bundle folder {directory} has no module {module!r} (its modules: "
                                f"{', '.join(present) or 'none'}): name one of them with --module, or leave --module "
                                f"out to check every module that defines {function}: "
                                f"strop registry bundles register {name} -f {directory}")
        modules, problem = [module], check_bundle(directory, module, function)
    if problem:
        raise RegistryError(f"bundle {name!r} from {directory} was not registered: {problem}")
    sha = artifacts.put_dir(directory)
    files = sorted(str(p.relative_to(directory)) for p in directory.rglob("*.py") if "__pycache__" not in p.parts)
    return _register(Bundle, BundleVersion, "bundle_id", name, sha, source=str(directory.resolve()),
                     info={"files": files, "modules": modules,
                           "checked": ", ".join(f"{m}:{function}" for m in modules)})


def _top_modules(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.py") if p.stem.isidentifier())


def bundle_modules(version: dict) -> list[str]:
    """The modules a registered bundle version holds (its .py files, as module names)."""
    files = (version.get("info") or {}).get("files", [])
    return sorted(f[:-3].replace("/", ".") for f in files if f.endswith(".py") and not f.endswith("__init__.py"))


def check_bundle_module(version: dict, module: str, function: str = "compute_score") -> None:
    """RegistryError, naming the modules it has, when the registered bundle version holds no such module."""
    modules = bundle_modules(version)
    if module in modules:
        return
    graders = (version.get("info") or {}).get("modules") or modules
    example = f"bundle:{version['name']}#{graders[0]}:{function}" if graders else None
    raise RegistryError(f"bundle {version['ref']} has no module {module!r}; its modules are "
                        f"{', '.join(modules) or 'none'}" + (f" (e.g. {example})" if example else "")
                        + f". Name one of them, or register a folder that has {module}.py: "
                        f"strop registry bundles register {version['name']} -f DIR")


def list_bundles() -> list[dict]:
    return _list(Bundle, BundleVersion, "bundle_id")


def get_bundle(ref: str) -> dict:
    return _get(Bundle, BundleVersion, "bundle_id", ref, "bundle")


def bundle_dir(ref: str) -> tuple[Path, dict]:
    """A folder holding the bundle version's files, extracted once per sha256 under $STROP_HOME/bundles.

    The folder is re-hashed on every use (as `put_dir` hashes): a copy edited since it was unpacked would grade
    with code nobody registered, so it is set aside and unpacked again from the checked artifact."""
    version = get_bundle(ref)
    dest = strop_home() / "bundles" / version["sha256"]
    if dest.exists() and artifacts.dir_sha256(dest) != version["sha256"]:
        print(f"warning: the unpacked bundle {version['ref']} in {dest} was changed after it was unpacked; "
              f"unpacking it again from the registered content", file=sys.stderr)
        aside = dest.with_name(f".{dest.name}.changed-{os.getpid()}")
        try:
            os.rename(dest, aside)
        except OSError:  # another process set it aside first
            pass
        shutil.rmtree(aside, ignore_errors=True)
    if not dest.exists():
        # two workers may unpack the same version at once: each unpacks into its own folder, and the one whose
        # rename comes second keeps the first one's identical copy (another worker may be grading from it)
        with atomic_folder(dest, replace=False) as mine:
            artifacts.extract_dir(version["sha256"], mine)
    return dest, version


def delete(kind: str, ref: str) -> dict:
    """Delete a version (NAME@VERSION) or every version of NAME; refused, with the users named, while a run,
    an evaluation or a project's evaluation settings refer to it. A stored file goes only when nothing else
    (another name or version with the same content) still points at it."""
    parent_cls, version_cls, fk = ((Dataset, DatasetVersion, "dataset_id") if kind == "dataset"
                                   else (Bundle, BundleVersion, "bundle_id"))
    name, number = parse_ref(ref, kind)
    _get(parent_cls, version_cls, fk, ref, kind)  # the same "no such ..." errors as get
    with session_scope(open_store()) as s:
        parent = s.scalar(select(parent_cls).where(parent_cls.name == name))
        query = select(version_cls).where(getattr(version_cls, fk) == parent.id)
        versions = s.scalars(query.where(version_cls.version == number) if number else query).all()
        refs = {f"{name}@{v.version}" for v in versions}
        users = []
        for run in s.scalars(select(Run)):
            pinned = run.pinned or {}
            used = {(pinned.get("dataset") or {}).get("ref"), ((pinned.get("rl") or {}).get("sftMix") or {}).get(
                "dataset")} if kind == "dataset" else {t.get("bundle") for t in pinned.get("terms") or []}
            if used & refs:
                users.append(f"run {run.id}")
        if kind == "dataset":
            ids = [v.id for v in versions]
            users += [f"evaluation {e}" for e in s.scalars(select(Evaluation.id).where(Evaluation.dataset_version_id.in_(ids)))]
        else:
            # an evaluation keeps its grader as typed ('bundle:NAME[@VERSION]#MODULE:FUNCTION'); NAME alone was
            # whichever version was latest then, so it counts as using every version
            for evaluation_id, grader in s.execute(select(Evaluation.id, Evaluation.grader_ref)
                                                   .where(Evaluation.grader_ref.like("bundle:%"))):
                if _bundle_target(grader) in refs | {name}:
                    users.append(f"evaluation {evaluation_id}")
        for project in s.scalars(select(Project)):
            target = (project.eval_dataset or "").partition("#")[0] if kind == "dataset" else \
                _bundle_target(project.eval_grader)
            if target in refs or target == name:  # NAME alone means its latest version: any deletion changes it
                users.append(f"project {project.name} (its evaluation settings)")
        if users:
            raise RegistryError(f"{kind} {ref} is in use by {', '.join(users[:5])}"
                                + (f" and {len(users) - 5} more" if len(users) > 5 else "")
                                + "; delete those first (or keep it: versions are immutable, so keeping costs nothing)")
        shas = {v.sha256 for v in versions}
        for v in versions:
            s.delete(v)
        s.flush()
        if not s.scalar(select(func.count()).select_from(version_cls).where(getattr(version_cls, fk) == parent.id)):
            s.delete(parent)
        still = set(s.scalars(select(DatasetVersion.sha256).where(DatasetVersion.sha256.in_(shas)))) | \
            set(s.scalars(select(BundleVersion.sha256).where(BundleVersion.sha256.in_(shas))))
    for sha in shas - still:
        artifacts.remove(sha)
    return {"deleted": sorted(refs), "filesRemoved": len(shas - still)}


def _bundle_target(grader: str | None) -> str:
    """'bundle:NAME@2#reward:compute_score' -> 'NAME@2'; '' for a builtin grader or none."""
    grader = (grader or "").strip()
    return grader[len("bundle:"):].partition("#")[0] if grader.startswith("bundle:") else ""


# ---- shared ----------------------------------------------------------------------------------------------

def _register(parent_cls, version_cls, fk: str, name: str, sha: str, **fields) -> dict:
    engine = open_store()
    for _ in range(5):  # two registrations racing for the same next version number: the loser retries
        try:
            with session_scope(engine) as s:
                parent = s.scalar(select(parent_cls).where(parent_cls.name == name))
                if parent is None:
                    parent = parent_cls(name=name)
                    s.add(parent)
                    s.flush()
                same = s.scalar(select(version_cls).where(getattr(version_cls, fk) == parent.id,
                                                          version_cls.sha256 == sha))
                if same is not None:
                    return {**_version_dict(name, same), "created": False}
                latest = s.scalar(select(func.max(version_cls.version)).where(getattr(version_cls, fk) == parent.id))
                version = version_cls(**{fk: parent.id}, version=(latest or 0) + 1, sha256=sha, **fields)
                s.add(version)
                s.flush()
                return {**_version_dict(name, version), "created": True}
        except IntegrityError:
            continue
    raise RegistryError(f"could not register {name!r}: other registrations kept taking its next version; try again")


def _version_dict(name: str, v) -> dict:
    out = {"name": name, "version": v.version, "ref": f"{name}@{v.version}", "sha256": v.sha256,
           "source": v.source, "info": v.info, "createdAt": v.created_at.isoformat()}
    if hasattr(v, "row_count"):
        out["rows"] = v.row_count
    return out


def _list(parent_cls, version_cls, fk: str) -> list[dict]:
    with session_scope(open_store(), read_only=True) as s:
        out = []
        for parent in s.scalars(select(parent_cls).order_by(parent_cls.name)):
            versions = s.scalars(select(version_cls).where(getattr(version_cls, fk) == parent.id)
                                 .order_by(version_cls.version)).all()
            latest = _version_dict(parent.name, versions[-1]) if versions else {}
            out.append({"name": parent.name, "latestVersion": latest.get("version"), "versions": len(versions),
                        **({"rows": latest["rows"]} if "rows" in latest else {}),
                        "createdAt": parent.created_at.isoformat()})
        return out


def _get(parent_cls, version_cls, fk: str, ref: str, kind: str) -> dict:
    name, number = parse_ref(ref, kind)
    with session_scope(open_store(), read_only=True) as s:
        parent = s.scalar(select(parent_cls).where(parent_cls.name == name))
        if parent is None:
            known = s.scalars(select(parent_cls.name).order_by(parent_cls.name)).all()
            raise RegistryError(f"no {kind} named {name!r} in the registry; register it with "
                                f"`strop registry {kind}s register {name} -f ...`"
                                + (f" (registered: {', '.join(known[:10])})" if known else ""))
        query = select(version_cls).where(getattr(version_cls, fk) == parent.id)
        query = query.where(version_cls.version == number) if number else query.order_by(version_cls.version.desc())
        version = s.scalars(query).first()
        if version is None:
            count = s.scalar(select(func.count()).select_from(version_cls).where(getattr(version_cls, fk) == parent.id))
            raise RegistryError(f"{kind} {name!r} has no version {number}; it has versions 1..{count}")
        return _version_dict(name, version)
