"""Untrusted scoring code in worker subprocesses: a hang, a crash or a memory bomb costs one score, not a run.

    pool = SandboxPool(timeout=10.0, memory_mb=2048)
    grader = pool.grader("/path/to/bundle#reward:compute_score")   # the compute_score signature, as load_grader's
    grader(solution_str="... #### 42", ground_truth="42")            # a float; SandboxError when the call failed

Each worker is a fresh `python -m strop.scoring.sandbox WORKER` process with:
- an environment built from an allow-list (no API keys, tokens or passwords of the parent get through),
- an address-space limit (`memory_mb`; an allocation past it raises MemoryError inside the grader),
- its standard output taken for the protocol (a grader's prints go to its log, not into the answers).

The process that starts a pool is made non-dumpable (Linux), so a grader running as the same user cannot read
the parent's secrets through /proc/PPID/environ or mem; the world-readable /proc files that liveness checks
read (stat, cmdline) stay readable. A worker started by root gives up its capabilities before it execs, since
CAP_SYS_PTRACE would read a non-dumpable process anyway.

A call that does not answer within `timeout` seconds gets its worker killed; a worker that dies (a segfault,
`os._exit`) is noticed at once. Either way the call raises `SandboxError` with the reason and the next call
starts a new worker. `score_terms` turns that into a 0 score recorded with the completion and counted in
`rewardErrors`. Calls are lines of JSON in both directions.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from strop.errors import StropError

# What a grader process may see of the parent's environment; everything else (keys, tokens) stays out.
ALLOWED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "VIRTUAL_ENV", "PYTHONPATH", "SYSTEMROOT")
DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 2048


PR_SET_DUMPABLE, PR_CAPBSET_DROP = 4, 24


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc if hasattr(libc, "prctl") else None
    except OSError:
        return None


# Loaded once here: a worker's pre-exec hook runs in a forked child, where loading a library is not safe.
_LIBC = _libc()


def make_undumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0) on this process: its /proc/PID/environ and mem need CAP_SYS_PTRACE to read, not
    just the same user. Best effort; False where it is not Linux or the call failed."""
    return _LIBC is not None and _LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def _drop_capabilities() -> None:
    """Empty the capability bounding set of a worker about to exec, so a grader run as root holds no
    capabilities (CAP_SYS_PTRACE would read a non-dumpable parent's environ anyway). Best effort."""
    if _LIBC is not None:
        for cap in range(64):
            if _LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                break  # EINVAL past the last capability, EPERM without CAP_SETPCAP: nothing more to do


class SandboxError(StropError):
    """One sandboxed grader call failed: it raised, hung, crashed its worker, or returned nothing usable."""


class _Worker:
    def __init__(self, memory_mb: int, log_dir: Path):
        env = {k: os.environ[k] for k in ALLOWED_ENV if k in os.environ}
        env.update({"HOME": str(log_dir), "TMPDIR": str(log_dir), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                    "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"})
        # the parent's own sys.path entries, so strop itself imports in the worker however it was installed
        env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), *sys.path] if p)
        self.log_path = log_dir / f"worker-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "wb")
        limit = memory_mb * 1024 * 1024

        def limits():  # in the child, before exec
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            os.setsid()  # its own process group: a grader's children die with it
            _drop_capabilities()

        self.proc = subprocess.Popen([sys.executable, "-m", "strop.scoring.sandbox"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env, cwd=str(log_dir),
                                     preexec_fn=limits)
        self.buffer = b""

    def call(self, request: dict, timeout: float) -> dict:
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise EOFError
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.log.close()

    def death(self) -> str:
        code = self.proc.wait()
        self.log.close()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        tail = self.log_path.read_bytes()[-400:].decode(errors="replace").strip()
        return f"the grader's worker process died ({how})" + (f"; its last output: {tail}" if tail else "")


class SandboxPool:
    """Worker processes for sandboxed grader calls; thread-safe, so several calls may run at once."""

    def __init__(self, *, workers: int = 2, timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB):
        if timeout <= 0 or memory_mb < 64 or workers < 1:
            raise StropError(f"sandbox settings: timeout > 0, memory_mb >= 64 and workers >= 1; got {timeout}, "
                             f"{memory_mb}, {workers}")
        self.timeout, self.memory_mb = timeout, memory_mb
        make_undumpable()  # before any worker exists: graders run as our user and could read our /proc files
        self._dir = Path(tempfile.mkdtemp(prefix="strop-sandbox-"))
        self._idle: list[_Worker] = []
        self._slots = threading.Semaphore(workers)
        self._lock = threading.Lock()
        self.replaced = 0  # workers killed or found dead, for tests and logs

    def grader(self, ref: str):
        """A callable with the compute_score signature that runs `ref` in the sandbox."""
        from strop.scoring.bundles import absolute_ref
        ref = absolute_ref(ref)  # the workers run in a temporary folder: a relative path would name nothing there

        def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
            return self.call(ref, {"data_source": data_source, "solution_str": solution_str,
                                   "ground_truth": ground_truth, "extra_info": extra_info})
        compute_score.sandboxed_ref = ref
        return compute_score

    def check(self, ref: str) -> None:
        """Load `ref` in a worker; StropError with the reason (import error, missing function) when it fails."""
        from strop.scoring.bundles import absolute_ref
        try:
            self.call(absolute_ref(ref), None)
        except SandboxError as exc:
            raise StropError(f"grader {ref}: {exc}") from None

    def call(self, ref: str, kwargs: dict | None) -> float:
        with self._slots:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _Worker(self.memory_mb, self._dir)
            try:
                reply = worker.call({"ref": ref, "kwargs": kwargs}, self.timeout)
            except TimeoutError:
                worker.kill()
                self.replaced += 1
                raise SandboxError(f"timed out after {self.timeout:g} s (the worker was killed and replaced)") from None
            except (EOFError, BrokenPipeError, ValueError):
                self.replaced += 1
                raise SandboxError(worker.death()) from None
            with self._lock:
                self._idle.append(worker)
        if "error" in reply:
            raise SandboxError(reply["error"])
        return float(reply["value"])  # a finite number, or "nan" / "inf" / "-inf" for score_terms to refuse

    def close(self) -> None:
        with self._lock:
            for worker in self._idle:
                worker.kill()
            self._idle.clear()
        import shutil
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def grader_for(ref: str, *, sandbox: bool = True, timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB):
    """A compute_score callable for `ref`: built-in graders in-process, bundles in a sandbox pool that is closed
    when the block ends. A bundle that does not load raises StropError here, before any call."""
    from strop.scoring.bundles import load_grader
    if not sandbox or ref.strip().startswith("builtin:"):
        yield load_grader(ref)
        return
    with SandboxPool(timeout=timeout, memory_mb=memory_mb) as pool:
        pool.check(ref)
        yield pool.grader(ref)


# ---- the worker side -------------------------------------------------------------------------------------

def _encode(raw) -> float | str:
    """A grader's result for the wire: a finite float as it is, NaN and infinities as text; anything else (a
    string, None, a list) raises, so the parent reports what came back."""
    from strop.scoring.terms import _as_score
    value, problem = _as_score(raw)
    if problem is None:
        return value
    if problem in ("nan", "inf", "-inf"):
        return problem
    raise TypeError(f"returned {problem}; a grader must return a finite number")


def _serve() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the grader's prints go to the log, never into the protocol
    graders = {}
    from strop.scoring.bundles import load_grader
    for line in sys.stdin:
        request = json.loads(line)
        try:
            ref = request["ref"]
            if ref not in graders:
                graders[ref] = load_grader(ref)
            if request["kwargs"] is None:  # a load check
                reply = {"value": 0.0}
            else:
                reply = {"value": _encode(graders[ref](**request["kwargs"]))}
        except BaseException as exc:  # noqa: BLE001 - MemoryError, SystemExit, anything: report it, stay alive
            reply = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    _serve()
