"""The worker side of the grader sandbox: one process per bundle version, one forked child per call.

    python -m strop.scoring.sandbox_worker BUNDLE_DIR SHA256 PROCESSES RUN_AS

Started by `SandboxPool` (inside bubblewrap where the machine allows). It reads requests, one JSON line each,
on stdin and answers each on its own reply channel (the stdout it started with; the grader's prints go to
stderr, the pool's log):

    {"id": "...", "op": "load", "module": "reward", "function": "compute_score"}
    {"id": "...", "op": "call", "module": "reward", "function": "compute_score", "kwargs": {...}, "timeout": 10}
    -> {"id": "...", "value": 1.0} | {"id": "...", "error": "ValueError: ..."}

Before every import the bundle folder is hashed again and compared with SHA256, the version the pool pinned:
a copy changed since (by anyone) is refused, never imported.

A module is imported here once; each call runs in a child forked from this process, which closes the reply
channel before the grader runs and hands back one result through a pipe of its own. So a grader cannot write
a forged reply, cannot change what a later call sees (its changes die with its child), and whatever it starts
is killed when the call ends: as PID 1 of the sandbox's PID namespace this process kills every other process
in it (setsid children included); outside a sandbox it kills the child's process group.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time
from pathlib import Path

from strop.errors import BundleError, StropError
from strop.files import folder_sha256
from strop.scoring.bundles import load_bundle
# bound when this module loads, before any bundle does: a grader patching strop.scoring.terms changes nothing here
from strop.scoring.terms import _as_score

RESULT_LIMIT = 1 << 20  # bytes a call's result may take; a grader returns one number
MODULE_BYTES = 4 << 20  # a module larger than this is not read for its names
REAP_SECONDS = 5.0


def _digest(folder: str) -> str:
    """The bundle folder's sha256 as the registry computes it (strop.files, which the store uses too)."""
    return folder_sha256(Path(folder))


class Worker:
    def __init__(self, bundle: str, sha256: str, reply):
        self.bundle, self.sha256, self.reply = bundle, sha256, reply
        self.graders: dict[tuple[str, str], object] = {}
        self.pid1 = os.getpid() == 1  # in a PID namespace of our own: kill(-1) reaches exactly the sandbox

    def handle(self, request: dict) -> dict:
        op = request.get("op")
        key = (str(request.get("module")), str(request.get("function")))
        try:
            if op == "load":
                self._load(*key)
                return {"value": 0.0}
            if op == "scan":
                self._verify()
                return {"value": 0.0, "modules": grader_modules(self.bundle, key[1])}
            if op == "call":
                if key not in self.graders:
                    self._load(*key)
                return self._call(self.graders[key], request.get("kwargs") or {}, float(request["timeout"]))
            return {"error": f"unknown request {op!r}"}
        except BaseException as exc:  # noqa: BLE001 - an import's SystemExit or MemoryError: report it, stay alive
            return {"error": describe(exc)}
        finally:
            self._sweep()  # an import or a call may have left processes behind

    def _load(self, module: str, function: str) -> None:
        if (module, function) in self.graders:
            return
        self._verify()
        try:
            self.graders[(module, function)] = load_bundle(self.bundle, module, function)
        except PermissionError as exc:
            raise PermissionError(f"{exc}. Graders run as an unprivileged user (uid {os.getuid()}): make the bundle's "
                                  f"files readable by others (chmod -R o+rX on its folder)") from None

    def _verify(self) -> None:
        for folder, _, files in os.walk(self.bundle, onerror=_raise):  # the digest would skip what it cannot read
            for name in files:
                if not os.access(os.path.join(folder, name), os.R_OK):
                    raise BundleError(f"{os.path.join(folder, name)} cannot be read by the grader's user (uid "
                                      f"{os.getuid()}): make the bundle's files readable (chmod -R o+rX on its folder)")
        actual = _digest(self.bundle)
        if actual != self.sha256:
            raise BundleError(f"the bundle's files changed after it was pinned (sha256 {self.sha256[:12]}, now "
                              f"{actual[:12]}); refusing to import code nobody checked. Register or pass it again.")

    def _call(self, grader, kwargs: dict, timeout: float) -> dict:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _child(grader, kwargs, write_end, self.reply)
        os.close(write_end)
        deadline = time.monotonic() + timeout
        data, status, timed_out, overflow, eof = b"", None, False, False, False
        exited = _pidfd(pid)  # readable once the child has exited, so waiting for it costs no polling
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                watch = ([] if eof else [read_end]) + ([exited] if exited is not None else [])
                tick = left if exited is not None else min(left, 0.005)
                ready, _, _ = select.select(watch, [], [], tick)
                if read_end in ready:
                    chunk = os.read(read_end, 1 << 16)
                    eof = not chunk
                    data += chunk
                    if len(data) > RESULT_LIMIT:
                        overflow = True
                        break
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = code
                    break
            self._sweep(pid, reaped=status is not None)  # the child and all it started are gone before the rest is read
            data += _drain(read_end)
        finally:
            os.close(read_end)
            if exited is not None:
                os.close(exited)
        if overflow:
            return {"error": f"the grader wrote more than {RESULT_LIMIT} bytes into strop's result channel; a grader "
                             f"returns one number", "kind": "channel"}
        if timed_out:
            return {"error": f"timed out after {timeout:g} s", "kind": "timeout"}
        if os.WIFSIGNALED(status) and not data:
            name = signal.Signals(os.WTERMSIG(status)).name
            return {"error": f"the grader's process died (signal {name})", "signal": os.WTERMSIG(status)}
        lines = data.splitlines()
        if len(lines) != 1:
            what = "nothing" if not lines else f"{len(lines)} results"
            how = f"exit status {os.WEXITSTATUS(status)}" if os.WIFEXITED(status) else "a signal"
            return {"error": f"the grader's process ended ({how}) and left {what} in strop's result channel; a "
                             f"grader must return its score, not write it or exit", "kind": "channel"}
        try:
            return json.loads(lines[0])
        except ValueError:
            return {"error": "the grader's result could not be read (something wrote into strop's result channel)",
                    "kind": "channel"}

    def _sweep(self, child: int | None = None, *, reaped: bool = True) -> None:
        """Kill and reap every process but this one: as PID 1, every other process in the namespace (setsid ones
        too); outside a sandbox, the child's process group."""
        if not self.pid1:
            if child is not None:
                try:
                    os.killpg(child, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                if not reaped:
                    os.waitpid(child, 0)
            return
        end = time.monotonic() + REAP_SECONDS
        while True:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                done, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return  # nothing left
            if done == 0:
                if time.monotonic() > end:
                    raise RuntimeError("processes the grader started could not be reaped")
                time.sleep(0.002)


def _raise(error: OSError) -> None:
    raise error


def grader_modules(folder: str, function: str) -> dict[str, bool]:
    """Each top-level module of the folder -> whether it defines `function` at module level (a def, an assignment
    or an import of that name), read from its syntax tree without running it."""
    found = {}
    for file in sorted(Path(folder).glob("*.py")):
        if not file.stem.isidentifier() or file.stat().st_size > MODULE_BYTES:
            found[file.stem] = False
            continue
        try:
            tree = ast.parse(file.read_bytes(), filename=file.name)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            found[file.stem] = True  # importing it will say what is wrong, with the line
            continue
        names = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        found[file.stem] = function in names
    return found


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Python or a kernel without pidfds (Linux < 5.3): poll instead
        return None


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    try:
        while len(data) <= RESULT_LIMIT:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
    except BlockingIOError:  # a writer outlived the sweep (unconfined mode): take what is there
        pass
    return data


def _child(grader, kwargs: dict, result_fd: int, reply) -> None:
    """Run one call and write its result; never returns."""
    code = 0
    try:
        reply.close()  # the reply channel is gone from this process before any grader code runs
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(number, signal.SIG_DFL)
        os.setpgid(0, 0)
        try:
            message = {"value": encode_score(grader(**kwargs))}
        except BaseException as exc:  # noqa: BLE001 - MemoryError, SystemExit, anything: it is the call's result
            message = {"error": describe(exc)}
        os.write(result_fd, (json.dumps(message) + "\n").encode())
    except BaseException:  # noqa: BLE001
        code = 70
    finally:
        os._exit(code)


def describe(exc: BaseException) -> str:
    """An error for the pool: strop's own errors (a bundle that does not load) as their message, which says what to
    fix; anything else with its type."""
    text = str(exc) if isinstance(exc, StropError) else f"{type(exc).__name__}: {exc}"
    return text[:4000]


def encode_score(raw) -> float | str:
    """A grader's result for the wire: a finite float as it is, NaN and infinities as text; anything else (a
    string, None, a list) raises, so the pool reports what came back."""
    value, problem = _as_score(raw)
    if problem is None:
        return value
    if problem in ("nan", "inf", "-inf"):
        return problem
    raise TypeError(f"returned {problem}; a grader must return a finite number")


def _undumpable() -> None:
    """Other processes of the same user (a grader's own) may not open this one's /proc files or ptrace it, so a
    call cannot reach the reply channel through /proc/1/fd."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> None:
    bundle, sha256, processes, run_as = argv[0], argv[1], int(argv[2]), int(argv[3])
    if run_as >= 0 and os.getuid() == 0:
        # a root sandbox: become an unprivileged user before anything of the bundle's is read, so root's own files
        # are closed to the grader; the capabilities go with the uid
        os.setgroups([])
        os.setgid(run_as)
        os.setuid(run_as)
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the grader's prints go to the log, never into the protocol
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)  # stray signals from a grader's processes; the pool uses SIGKILL
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _undumpable()
    if processes > 0:
        # counted per user namespace, so set here, inside the sandbox: this limits the sandbox's own processes
        # (not enforced for root, whose group limit is the cgroup's)
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    worker = Worker(bundle, sha256, reply)
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        answer = worker.handle(request)
        answer["id"] = request.get("id")
        reply.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
