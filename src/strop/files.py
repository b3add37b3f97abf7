"""Opening files a person named, without blocking on what is not a file.

Opening a FIFO (named pipe) for reading waits until something writes to it, which may be never; a character
device such as /dev/zero never ends. Anything strop reads because a person named it (a dataset, the files of a
scoring bundle) is checked first and opened only if it is a regular file:

    with open_regular(path) as f:        # FileKindError naming the kind ("a FIFO (named pipe)") otherwise
        data = f.read()

The kind is checked before opening (stat, or lstat when symbolic links are not followed) and again on the open
descriptor (opened non-blocking, so even a file swapped for a FIFO in between cannot block).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from strop.errors import StropError


class FileKindError(StropError):
    """A path that is not a regular file where one was needed; `kind` says what it is."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def kind_of(mode: int) -> str:
    """'a regular file', 'a FIFO (named pipe)', 'a directory', ... for a stat mode."""
    for test, kind in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def check_regular(path: str | os.PathLike, *, follow_symlinks: bool = True, what: str = "file") -> os.stat_result:
    """The stat of `path` if it is a regular file, else FileKindError ('<what> PATH is a FIFO (named pipe) ...')."""
    info = os.stat(path, follow_symlinks=follow_symlinks)
    if not stat.S_ISREG(info.st_mode):
        kind = kind_of(info.st_mode)
        raise FileKindError(f"{what} {path} is {kind}, not a regular file" + (
            "; reading it could block or never end" if kind not in ("a directory", "a symbolic link") else ""), kind)
    return info


def open_regular(path: str | os.PathLike, *, follow_symlinks: bool = True, what: str = "file") -> BinaryIO:
    """`path` opened for reading in binary, only if it is a regular file (checked before and after opening)."""
    check_regular(path, follow_symlinks=follow_symlinks, what=what)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_symlinks else getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = kind_of(info.st_mode)
            raise FileKindError(f"{what} {path} is {kind}, not a regular file (it changed while being opened)", kind)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


# ---- a folder as a deterministic tar, and its sha256 ------------------------------------------------------

SKIPPED_DIRS = frozenset({"__pycache__"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")


class FolderError(StropError):
    """A folder that cannot be snapshotted: it holds a link or a special file, or something in it is unreadable."""


def folder_entries(root: Path) -> Iterator[tuple[str, Path]]:
    """(posix relative path, full path) of every entry below root, sorted so the tar is deterministic;
    `__pycache__` folders and `.pyc` files left out (importing a bundle to check it writes them)."""
    def unreadable(error: OSError):
        raise FolderError(f"cannot read {error.filename!r} in {str(root)!r}: {error.strerror}; make the folder "
                          f"readable") from None
    for current, dirs, files in os.walk(root, onerror=unreadable):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        base = Path(current)
        names = sorted([*dirs, *(f for f in files if not f.endswith(SKIPPED_SUFFIXES))])
        for name in names:
            full = base / name
            yield full.relative_to(root).as_posix(), full


def write_folder_tar(root: Path, out) -> None:
    """The folder as a tar with sorted entries and normalised times, owners and permissions (only "executable or
    not" kept), so the same files give the same bytes on any machine. `out` needs write and tell."""
    # PAX: long and non-ASCII names are stored exactly, and with the fields in _tar_info it adds nothing variable.
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for relative, full in folder_entries(Path(root)):
            info = _tar_info(relative, full)
            if info.isfile():
                try:
                    src = open_regular(full, follow_symlinks=False)
                except FileKindError as exc:
                    raise FolderError(f"cannot store {str(full)!r}: it is {exc.kind}, not a regular file, and "
                                      f"reading it could block or never end. Move it out of the folder.") from None
                with src:
                    tar.addfile(info, src)
            else:
                tar.addfile(info)


def folder_sha256(root: Path) -> str:
    """The sha256 of `write_folder_tar`'s bytes, computed without writing them anywhere."""
    hashing = _Hashing()
    write_folder_tar(Path(root), hashing)
    return hashing.hasher.hexdigest()


def file_sha256(path: Path) -> str:
    """The sha256 of a regular file's bytes (a FIFO or a device is refused by open_regular, not read forever)."""
    hasher = hashlib.sha256()
    with open_regular(path) as src:
        while chunk := src.read(1 << 20):
            hasher.update(chunk)
    return hasher.hexdigest()


class _Hashing:
    """A write-only sink that keeps only the sha256 of what tarfile writes to it."""

    def __init__(self) -> None:
        self.hasher, self.size = hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.hasher.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size


def _tar_info(relative: str, full: Path) -> tarfile.TarInfo:
    mode = full.lstat().st_mode
    info = tarfile.TarInfo(relative)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISDIR(mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
    elif stat.S_ISREG(mode):
        info.type, info.size = tarfile.REGTYPE, full.stat().st_size
        info.mode = 0o755 if mode & 0o111 else 0o644
    elif stat.S_ISLNK(mode):
        raise FolderError(f"cannot store {str(full)!r}: it is a symbolic link. Replace it with a copy of the file "
                          f"it stands for, or move it out of the folder.")
    else:
        raise FolderError(f"cannot store {str(full)!r}: it is {kind_of(mode)}, not a regular file, and reading it "
                          f"could block or never end. Move it out of the folder.")
    return info


__all__ = ["FileKindError", "kind_of", "check_regular", "open_regular", "FolderError", "folder_entries",
           "write_folder_tar", "folder_sha256", "SKIPPED_DIRS", "SKIPPED_SUFFIXES"]


@contextlib.contextmanager
def atomic_folder(dest: str | os.PathLike, *, replace: bool = True) -> Iterator[Path]:
    """Write a folder all-or-nothing: the block fills a hidden sibling folder (same filesystem, so the last step
    is one atomic rename), which then takes `dest`'s place. Had the block raised, `dest` is untouched and the
    sibling gone; a crash leaves only a hidden `.NAME.partial-*` folder, never a half-written `dest`.

        with atomic_folder(run_dir / "final") as tmp:
            model.save_pretrained(tmp)

    An existing `dest` is set aside first and removed after (`replace=True`), or kept and the new copy dropped
    (`replace=False`, for content-addressed folders that another process may be reading). When another process
    renames its finished copy into place between the two, that copy is kept. Files get the usual permissions
    (umask; executables stay executable), not mkdtemp's owner-only ones."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    aside = tmp.with_name(tmp.name + "-old")
    try:
        yield tmp
        mask = _umask()
        os.chmod(tmp, 0o777 & ~mask)
        for path in tmp.rglob("*"):
            if path.is_symlink():
                continue
            executable = path.is_dir() or path.stat().st_mode & stat.S_IXUSR
            os.chmod(path, (0o777 if executable else 0o666) & ~mask)
        if dest.exists() and not replace:
            return
        if dest.exists():
            with contextlib.suppress(FileNotFoundError):  # another process may be moving it too
                os.rename(dest, aside)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():  # not another writer's finished copy: put back what was there, if anything
                with contextlib.suppress(OSError):
                    os.rename(aside, dest)
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(aside, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0o022)  # the only portable way to read the umask is to set it and put it back
    os.umask(mask)
    return mask
