"""cgroups for grader workers: where new ones go (a v1 or v2 hierarchy with the memory and pids controllers),
whether this process can make them, and `WorkerCgroup`, one worker's cgroup, which limits the memory and the
process count of all its processes together. `strop.scoring.confine` decides whether workers get one
(`detect().cgroups`, `GroupLimit`)."""

from __future__ import annotations

import itertools
import os
import signal
import sys
import time
from pathlib import Path

_names = itertools.count()


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, filesystem type, super options) of the cgroup mounts in /proc/self/mountinfo."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((fields[4], tail[0], set(tail[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """controller -> this process's cgroup path ('' for the v2 hierarchy), from /proc/self/cgroup."""
    own = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = path
    except (OSError, ValueError):
        pass
    return own


def _layout() -> tuple[str | None, dict[str, Path], str | None]:
    """("v1", {"memory": dir, "pids": dir}, None): the parent folders new worker cgroups go in; or (None, {}, why)."""
    mounts, own = _mounts(), _own_paths()
    v1 = {}
    for point, kind, options in mounts:
        for controller in ("memory", "pids"):
            if kind == "cgroup" and controller in options and controller in own:
                v1[controller] = Path(point) / own[controller].lstrip("/")
    if len(v1) == 2:
        return "v1", v1, None
    for point, kind, _ in mounts:
        if kind == "cgroup2":
            controllers = set((Path(point) / "cgroup.controllers").read_text().split()) \
                if (Path(point) / "cgroup.controllers").exists() else set()
            if {"memory", "pids"} <= controllers:
                # a folder of strop's own at the hierarchy's root: the root cgroup may hold processes and
                # hand controllers down at once, which a cgroup that holds this process may not
                return "v2", {"memory": Path(point) / "strop-graders", "pids": Path(point) / "strop-graders"}, None
    return None, {}, "no cgroup hierarchy with the memory and pids controllers is mounted"


def support() -> tuple[str | None, str | None]:
    """("v1" or "v2", None) where a worker cgroup can be made here, else (None, why not)."""
    if not sys.platform.startswith("linux"):
        return None, "cgroups are Linux's"
    kind, _, problem = _layout()
    if kind is None:
        return None, problem
    try:
        WorkerCgroup.create(memory_mb=64, processes=4).remove()
    except OSError as exc:
        return None, f"making a cgroup failed ({exc.strerror or exc}); group limits need root or a delegated cgroup"
    return kind, None


class WorkerCgroup:
    """A cgroup of one worker: the memory and process count of every process in it, together."""

    def __init__(self, kind: str, dirs: dict[str, Path], memory_bytes: int):
        self.kind, self.dirs, self.memory_bytes = kind, dirs, memory_bytes
        self._procs_files = sorted({d / "cgroup.procs" for d in dirs.values()})

    @classmethod
    def create(cls, *, memory_mb: int, processes: int) -> WorkerCgroup | None:
        """A new cgroup with these limits; None where no hierarchy has the memory and pids controllers; OSError
        where one cannot be made here (`support()` tries that once)."""
        kind, parents, _ = _layout()
        if kind is None:
            return None
        name = f"strop-{os.getpid()}-{next(_names)}-{time.monotonic_ns() % 10**6}"
        memory_bytes = memory_mb * 1024 * 1024
        if kind == "v2":
            base = parents["memory"]
            base.mkdir(exist_ok=True)
            _write(base.parent / "cgroup.subtree_control", "+memory +pids", best_effort=True)
            _write(base / "cgroup.subtree_control", "+memory +pids", best_effort=True)
            folder = base / name
            folder.mkdir()
            limit = cls(kind, {"memory": folder, "pids": folder}, memory_bytes)
            _write(folder / "memory.max", str(memory_bytes))
            if (folder / "memory.swap.max").exists():
                _write(folder / "memory.swap.max", "0")
            _write(folder / "pids.max", str(processes))
            return limit
        dirs = {c: parents[c] / name for c in ("memory", "pids")}
        for folder in dirs.values():
            folder.mkdir()
        limit = cls(kind, dirs, memory_bytes)
        try:
            _write(dirs["memory"] / "memory.limit_in_bytes", str(memory_bytes))
            if (dirs["memory"] / "memory.memsw.limit_in_bytes").exists():
                _write(dirs["memory"] / "memory.memsw.limit_in_bytes", str(memory_bytes))
            _write(dirs["pids"] / "pids.max", str(processes))
        except OSError:
            limit.remove()
            raise
        return limit

    def join(self) -> None:
        """Move the calling process into the cgroup (a worker's pre-exec hook calls this in the child)."""
        pid = str(os.getpid()).encode()
        for path in self._procs_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def oom_kills(self) -> int:
        """How many processes the kernel killed for passing the memory limit (v1 without the counter: the
        number of times the limit was hit)."""
        folder = self.dirs["memory"]
        try:
            if self.kind == "v2":
                text = (folder / "memory.events").read_text()
            else:
                text = (folder / "memory.oom_control").read_text()
                if "oom_kill " not in text:
                    return int((folder / "memory.failcnt").read_text())
        except (OSError, ValueError):
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def pids(self) -> list[int]:
        found = set()
        for path in self._procs_files:
            try:
                found.update(int(p) for p in path.read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(found)

    def kill_all(self, *, attempts: int = 50) -> None:
        """SIGKILL every process in the cgroup, again until none is left (a forking process may add one)."""
        kill_file = self.dirs["memory"] / "cgroup.kill"
        if self.kind == "v2" and kill_file.exists():
            try:
                _write(kill_file, "1")
            except OSError:
                pass
        for _ in range(attempts):
            left = self.pids()
            if not left:
                return
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def remove(self) -> None:
        self.kill_all()
        for folder in sorted(set(self.dirs.values())):
            for _ in range(100):  # a killed process leaves its cgroup a moment after it dies
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _write(path: Path, text: str, *, best_effort: bool = False) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(text)
    except OSError:
        if not best_effort:  # enabling controllers that are already on, or that a parent hands down anyway
            raise
