"""Checkpoints of a run: `checkpoints/step-000010/` holds the adapter (PEFT format), the optimizer state and
a manifest of sha256 sums. A checkpoint is written under a temporary name and renamed into place, and its
manifest is checked before it is trusted, so a crash mid-write leaves the previous checkpoint in charge.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from strop.errors import StropError

MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path, step: int) -> None:
    files = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=1))


def verify(folder: Path) -> int:
    """The step a checkpoint holds; raises when a file is missing or its sum does not match."""
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        raise StropError(f"checkpoint {folder} has no {MANIFEST}; it was not finished")
    manifest = json.loads(manifest_path.read_text())
    for name, digest in manifest["files"].items():
        path = folder / name
        if not path.exists() or sha256_file(path) != digest:
            raise StropError(f"checkpoint {folder}: {name} is missing or does not match its sha256 in the manifest")
    return int(manifest["step"])


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step:06d}"


def save(training_client, run_dir: Path, step: int, keep: int) -> Path:
    """Save state after `step` steps; keep the newest `keep` checkpoints."""
    final = checkpoint_dir(run_dir, step)
    path = Path(training_client.save_state(str(final)).result().path)
    write_manifest(path, step)
    prune(run_dir, keep)
    return path


def latest(run_dir: Path) -> tuple[int, Path] | None:
    """The newest checkpoint whose manifest checks out (a broken newer one is skipped, with a warning)."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.exists():
        return None
    for path in sorted(folder.glob("step-*"), reverse=True):
        try:
            return verify(path), path
        except StropError as exc:
            print(f"warning: skipping {exc}")
    return None


def prune(run_dir: Path, keep: int) -> None:
    paths = sorted((Path(run_dir) / "checkpoints").glob("step-*"))
    for path in paths[: max(0, len(paths) - keep)]:
        shutil.rmtree(path, ignore_errors=True)
