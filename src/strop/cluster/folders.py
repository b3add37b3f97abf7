"""Folders sent between the driver and its actors through Ray: a scoring bundle to a grader worker, a trainer's
checkpoints back to the run folder (another node shares no file system with the driver).

    data = pack(Path("run/checkpoints/step-10"), limit=4 << 30)
    unpack(data, Path("/tmp/x/step-10"))          # created whole or not at all
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from strop.errors import StropError


def pack(folder: Path, limit: int, what: str = "folder") -> bytes:
    """A folder's regular files as a tar archive (links and special files left out, as a pinned copy leaves them);
    StropError past `limit` bytes."""
    files = [p for p in sorted(Path(folder).rglob("*"))
             if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts]
    if sum(p.stat().st_size for p in files) > limit:  # before reading any of it into memory
        raise StropError(f"{what} {folder} is over {limit >> 20} MiB: too large to send through the Ray cluster")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return buffer.getvalue()


def unpack(data: bytes, folder: Path) -> Path:
    """`data` (from `pack`) as `folder`, replacing what was there only once it is complete."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(staging, filter="data")  # no absolute paths, no '..', no links out
    if folder.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{folder.name}-old-", dir=folder.parent))
        os.replace(folder, old / "x")
        os.replace(staging, folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, folder)
    return folder
