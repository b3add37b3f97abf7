"""Checkpoints of a run: `checkpoints/step-000010/` holds the adapter (PEFT format), the optimizer state and
a manifest of sha256 sums. A checkpoint is written under a temporary name and renamed into place, its manifest
is written the same way (temporary file, fsync, rename), and the manifest is checked before the checkpoint is
trusted. So a crash mid-write leaves the previous checkpoint in charge: a folder with no manifest, a torn or
malformed manifest, or a file that does not match its sum is skipped with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
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
    files = {p.name: sha256_file(p) for p in sorted(folder.iterdir())
             if p.is_file() and p.name != MANIFEST and not p.name.startswith(".")}
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", dir=folder)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps({"step": step, "files": files}, indent=1))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, folder / MANIFEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def verify(folder: Path) -> int:
    """The step a checkpoint holds; raises when a file is missing or its sum does not match."""
    manifest_path = folder / MANIFEST
    if not manifest_path.exists():
        raise StropError(f"checkpoint {folder} has no {MANIFEST}; it was not finished")
    try:
        manifest = json.loads(manifest_path.read_text())
        files, step = dict(manifest["files"]), int(manifest["step"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:  # torn by a crash, or edited
        raise StropError(f"checkpoint {folder}: its {MANIFEST} is unreadable or malformed "
                         f"({type(exc).__name__}: {exc}); it was not finished") from None
    for name, digest in files.items():
        path = folder / name
        if not path.is_file() or sha256_file(path) != digest:
            raise StropError(f"checkpoint {folder}: {name} is missing or does not match its sha256 in the manifest")
    return step


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
    # a run has one worker, so temporary folders left here are from a crashed save (see atomic_dir in the trainer)
    for stale in folder.glob(".step-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for path in sorted(folder.glob("step-*"), reverse=True):
        try:
            return verify(path), path
        except StropError as exc:
            print(f"warning: skipping {exc}")
    return None


def resume(training_client, run_dir: Path) -> int:
    """Make the run folder and load its newest good checkpoint into the client; the step to start from (0: none)."""
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    found = latest(run_dir)
    if not found:
        return 0
    step, path = found
    training_client.load_state(str(path)).result()
    return step


def prune(run_dir: Path, keep: int) -> None:
    paths = sorted((Path(run_dir) / "checkpoints").glob("step-*"))
    for path in paths[: max(0, len(paths) - keep)]:
        shutil.rmtree(path, ignore_errors=True)
