"""Content-addressed files: each stored once, named by its sha256, under `$STROP_HOME/artifacts`.

    $STROP_HOME/artifacts/<sha256[:2]>/<sha256>

A dataset version, a bundle snapshot or an adapter is stored here and the store's tables keep only its sha256.
Storing the same bytes twice keeps one file; every read re-hashes the file, so an artifact edited on disk is
caught (ArtifactError) instead of silently training or grading on something else.

    from strop.store import artifacts
    sha = artifacts.put_file("train.jsonl")            # -> 'e3b0c442...'
    rows = artifacts.path_of(sha).read_text()          # verified against sha first
    bundle = artifacts.put_dir("scoring/")             # a deterministic tar of the directory
    artifacts.extract_dir(bundle, "/tmp/scoring-v1")

A directory is stored as a tar with its entries sorted, times, owners and permissions normalised (only
"executable or not" is kept), so the same files give the same sha256 on any machine. `__pycache__`
folders and `.pyc` files are left out: importing a bundle to check it writes them, and they must not
change its hash.

Only regular files are read: a FIFO, socket or device given as a file or found in a directory is refused by
its kind, before anything opens it (opening a FIFO blocks until someone writes to it), and files are opened
non-blocking and checked again on the open descriptor (strop.files).

Writes go to a temporary file in the destination folder and are renamed into place, so a crash never
leaves a half-written artifact under its final name, and two processes storing the same content at once
both succeed. Stored files are made read-only as a hint that they must not be edited.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Iterator

from strop.errors import StropError
from strop.files import FileKindError, FolderError, atomic_folder, folder_sha256, open_regular, write_folder_tar
from strop.paths import strop_home

CHUNK = 1 << 20
_SHA_RE = re.compile(r"[0-9a-f]{64}")


class ArtifactError(StropError):
    """An artifact is missing, malformed, or no longer matches its sha256."""


def artifacts_dir() -> Path:
    path = strop_home() / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


def put_bytes(data: bytes) -> str:
    """Store `data`; returns its sha256 (hex)."""
    with _staged() as staging:
        staging.write(data)
    return _commit(staging)


def put_file(path: str | os.PathLike) -> str:
    """Store a copy of the file at `path`; returns its sha256. Read once: hashed while it is copied."""
    source = Path(path).expanduser()
    if not source.exists():
        raise ArtifactError(f"cannot store {str(source)!r}: it is missing. Pass the path of a file.")
    if source.is_dir():
        raise ArtifactError(f"cannot store {str(source)!r}: it is a directory (use put_dir). Pass the path of a file.")
    with _staged() as staging, _open_file(source, follow_symlinks=True) as src:
        while chunk := src.read(CHUNK):
            staging.write(chunk)
    return _commit(staging)


def put_dir(path: str | os.PathLike) -> str:
    """Store the directory at `path` as a deterministic tar; returns the tar's sha256."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ArtifactError(f"cannot store {str(root)!r} as a directory: it is not one. Pass a folder's path.")
    try:
        with _staged() as staging:
            write_folder_tar(root, staging)
    except FolderError as exc:
        raise ArtifactError(str(exc)) from None
    return _commit(staging)


def dir_sha256(path: str | os.PathLike) -> str:
    """The sha256 that `put_dir` would give the directory at `path`, without storing anything: compare it with a
    version's sha256 to tell whether an unpacked copy still holds exactly that version."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ArtifactError(f"cannot hash {str(root)!r} as a directory: it is not one. Pass a folder's path.")
    try:
        return folder_sha256(root)
    except FolderError as exc:
        raise ArtifactError(str(exc)) from None


def exists(sha256: str) -> bool:
    """Whether an artifact with this sha256 is stored (not verified; `path_of` verifies)."""
    return _location(sha256).is_file()


def path_of(sha256: str) -> Path:
    """The stored file for `sha256`, after checking that its content still hashes to `sha256`."""
    location = _location(sha256)
    if not location.is_file():
        raise ArtifactError(
            f"artifact {sha256} is not in {artifacts_dir()}: it was deleted, or the store was made under another "
            f"STROP_HOME. Set STROP_HOME to the folder the store was created in, or register the data again."
        )
    actual = _hash_file(location)
    if actual != sha256:
        raise ArtifactError(
            f"artifact {location} was changed on disk: its content now hashes to {actual}, not {sha256}. "
            f"Delete that file and register the original data again (artifacts are read-only; do not edit them)."
        )
    return location


def remove(sha256: str) -> None:
    """Delete a stored file (the caller made sure nothing refers to it any more); no error if it is gone."""
    path = _location(sha256)
    with contextlib.suppress(FileNotFoundError):
        path.chmod(0o600)
        path.unlink()


def extract_dir(sha256: str, dest: str | os.PathLike) -> Path:
    """Unpack a directory artifact (from `put_dir`) into `dest`, which must not exist or be empty.

    Files get the current time as their mtime (the tar holds zero), so Python does not mistake a
    bundle's stale bytecode for fresh.
    """
    source = path_of(sha256)
    target = Path(dest).expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ArtifactError(f"cannot extract artifact {sha256[:12]} into {str(target)!r}: it exists and is not an "
                            f"empty folder. Pass a new folder's path.")
    with atomic_folder(target) as staging:
        try:
            with tarfile.open(source, mode="r:") as tar:
                # "data" refuses absolute paths, '..', links out of the folder and device files (3.11.4+).
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(staging, **safe)
        except tarfile.TarError as exc:
            raise ArtifactError(f"artifact {sha256[:12]} is not a directory snapshot ({exc}): it was stored with "
                                f"put_file or put_bytes; read it with path_of instead.") from None
        now = time.time()
        for item in staging.rglob("*"):
            os.utime(item, (now, now), follow_symlinks=False)
    return target


# --- internals ------------------------------------------------------------------------------------------


def _location(sha256: str) -> Path:
    if not isinstance(sha256, str) or not _SHA_RE.fullmatch(sha256):
        raise ArtifactError(f"{sha256!r} is not an artifact id: expected 64 lowercase hex digits (a sha256).")
    return artifacts_dir() / sha256[:2] / sha256


def _hash_file(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


class _Staging:
    """A temporary file inside artifacts/ (same filesystem, so the final rename is atomic) that hashes what is
    written to it; tarfile can write to it directly (it needs only write and tell)."""

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix=".incoming-", dir=artifacts_dir())
        self.path = Path(name)
        self.handle = os.fdopen(fd, "wb")
        self.hasher = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.hasher.update(data)
        self.size += len(data)
        return self.handle.write(data)

    def tell(self) -> int:
        return self.size


@contextlib.contextmanager
def _staged() -> Iterator[_Staging]:
    staging = _Staging()
    try:
        yield staging
        staging.handle.flush()
        os.fsync(staging.handle.fileno())
    except BaseException:
        staging.handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging.path)
        raise
    finally:
        staging.handle.close()


def _commit(staging: _Staging) -> str:
    """Move the staged file to its content address, or drop it when a good copy is already there."""
    sha256 = staging.hasher.hexdigest()
    final = artifacts_dir() / sha256[:2] / sha256
    try:
        # Re-hash an existing copy rather than trust it: a tampered one is replaced instead of kept.
        if final.is_file() and _hash_file(final) == sha256:
            return sha256
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(staging.path, 0o444)
        if final.exists():
            os.chmod(final, 0o644)  # Windows refuses to replace a read-only file
        os.replace(staging.path, final)
        return sha256
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging.path)


def _open_file(path: Path, *, follow_symlinks: bool):
    try:
        return open_regular(path, follow_symlinks=follow_symlinks)
    except FileKindError as exc:
        raise ArtifactError(f"cannot store {str(path)!r}: it is {exc.kind}, not a regular file, and reading it "
                            f"could block or never end. Pass a regular file (or move it out of the folder).") from None
