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

import os
import stat
from typing import BinaryIO

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


__all__ = ["FileKindError", "kind_of", "check_regular", "open_regular"]
