"""Write a model folder all-or-nothing: build in a hidden sibling folder, rename it into place at the end.

A model folder is "finished" when it has `config.json`; readers trust that. Building in place would let a
crash (or Ctrl-C halfway through a 270 MB write) leave a folder with config.json but truncated weights.

    with staging_dir(dest) as tmp:
        model.save_pretrained(tmp)
    # dest now holds the files; had the block raised, dest would be untouched and tmp gone
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def staging_dir(dest: Path) -> Iterator[Path]:
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Same parent means same filesystem, so the final rename is atomic.
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    aside = tmp.with_name(tmp.name + "-old")
    try:
        yield tmp
        # mkdtemp (and some savers) make things owner-only; a model cache should get the usual permissions.
        mask = _umask()
        os.chmod(tmp, 0o777 & ~mask)
        for path in tmp.rglob("*"):
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
        if dest.exists():
            # An older or incomplete copy is replaced; another process may be moving it too, hence suppress.
            with contextlib.suppress(FileNotFoundError):
                os.rename(dest, aside)
        try:
            os.rename(tmp, dest)
        except OSError:
            # Another process put its finished copy there in the meantime; it is as good as ours.
            if not (dest / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(aside, ignore_errors=True)


def _umask() -> int:
    # The only portable way to read the umask is to set it and put it back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
