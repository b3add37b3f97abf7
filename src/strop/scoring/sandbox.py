"""Untrusted scoring code, confined by the operating system: a hang, a crash, a memory bomb or a hostile grader
costs one score, never the run, and reaches nothing it should not.

    pool = SandboxPool(timeout=10.0, memory_mb=2048)
    grader = pool.grader("/path/to/bundle#reward:compute_score")   # the compute_score signature, as load_grader's
    grader(solution_str="... #### 42", ground_truth="42")            # a float; SandboxError when the call failed

Each bundle version gets workers of its own (`python -m strop.scoring.sandbox_worker`, see there): a grader never
shares a process with another bundle's code. The bundle's content is pinned (sha256) when the pool first sees
it, and each worker hashes it again before every import. A worker runs
- under bubblewrap (`confine.py`): read-only filesystem with strop's store, the home folder, the working
  directory and the run folder hidden, a private /tmp, no network, its own PID namespace, no capabilities, no
  keyrings or unix sockets (a seccomp filter);
- in a cgroup of its own where the machine allows (memory and process count of all its processes together),
  with an address-space limit on each process in any case;
- with an environment built from an allow-list (no API keys, tokens or passwords of the parent get through),
  its standard output taken for the protocol (a grader's prints go to its log, 64 kB of them per call).

Each call runs in a process forked for it, which is killed with everything it started when the call ends; a
call that does not answer within `timeout` seconds is killed the same way. Either failure raises
`SandboxError` with the reason; `score_terms` turns that into a 0 score recorded with the completion and
counted in `rewardErrors`. Where bubblewrap cannot run, a pool refuses to start unless the user allowed
unconfined graders (`confine.ALLOW_UNCONFINED_ENV`).

The process that starts a pool is made non-dumpable (Linux), so a grader running as the same user outside a
sandbox cannot read the parent's secrets through /proc/PPID/environ; the world-readable /proc files that
liveness checks read (stat, cmdline) stay readable.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from strop.errors import StropError
from strop.files import folder_sha256
from strop.scoring import confine, syscall_filter
from strop.scoring.grader_log import BoundedLog

# What a grader process may see of the parent's environment; everything else (keys, tokens) stays out.
ALLOWED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "VIRTUAL_ENV", "PYTHONPATH", "SYSTEMROOT")
DEFAULT_TIMEOUT = 10.0
DEFAULT_MEMORY_MB = 2048
DEFAULT_PROCESSES = 64  # processes and threads of one worker together (the worker itself and bubblewrap count)
IMPORT_TIMEOUT = 60.0   # importing a bundle's module may take longer than one call (it loads its libraries)
GRACE = 5.0             # beyond the worker's own deadline before the pool kills the whole worker


PR_SET_DUMPABLE, PR_CAPBSET_DROP = 4, 24
KEYCTL_JOIN_SESSION_KEYRING = 1


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        # lazy: optional, its absence is handled here
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if not hasattr(libc, "prctl"):
            return None
        if hasattr(libc, "syscall"):  # syscall(number, operation, argument): each a long, as the kernel reads them
            libc.syscall.argtypes, libc.syscall.restype = [ctypes.c_long] * 3, ctypes.c_long
        return libc
    except OSError:
        return None


# Loaded once here: a worker's pre-exec hook runs in a forked child, where loading a library is not safe.
_LIBC = _libc()


def make_undumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0) on this process: its /proc/PID/environ and mem need CAP_SYS_PTRACE to read, not
    just the same user. Best effort; False where it is not Linux or the call failed."""
    return _LIBC is not None and _LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0


def _drop_capabilities() -> None:
    """Empty the capability bounding set of a process about to exec, so a grader run unconfined as root holds no
    capabilities (CAP_SYS_PTRACE would read a non-dumpable parent's environ anyway). Best effort."""
    if _LIBC is not None:
        for cap in range(64):
            if _LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                break  # EINVAL past the last capability, EPERM without CAP_SETPCAP: nothing more to do


def _new_session_keyring() -> None:
    """keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL): the worker gets an empty session keyring of its own, so the keys of
    whoever started strop are not its to find (the seccomp filter refuses keyring calls anyway; this also keeps
    them out of /proc/keys). Best effort: a kernel without keyrings has nothing to leak."""
    number = syscall_filter.keyctl_number()
    if _LIBC is not None and number is not None and hasattr(_LIBC, "syscall"):
        _LIBC.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, 0)


def _readable_by_others(root: Path) -> bool:
    for folder, dirs, files in os.walk(root):
        if os.stat(folder).st_mode & 0o005 != 0o005:
            return False
        for name in files:
            if os.stat(os.path.join(folder, name)).st_mode & stat.S_IROTH == 0:
                return False
    return True


class SandboxError(StropError):
    """One sandboxed grader call failed: it raised, hung, crashed, or returned nothing usable. `kind` says how:
    "error" (it raised or returned a non-number), "timeout", "died" (its worker), "memory" (the group's limit)
    or "channel" (it wrote into strop's reply channel)."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind


class _Compromised(Exception):
    """The worker's reply channel held something the worker did not write as an answer."""


@dataclass
class _Bundle:
    folder: Path
    sha256: str
    mount: Path  # what the workers see: the folder, or a snapshot of it that their user can read
    idle: list = field(default_factory=list)


class _Worker:
    """One worker process (and its cgroup) for one bundle version."""

    def __init__(self, pool: "SandboxPool", bundle: _Bundle):
        conf = pool.confinement
        env = {k: os.environ[k] for k in ALLOWED_ENV if k in os.environ}
        private = "/tmp" if conf.confined else str(pool.log_dir)
        env.update({"HOME": private, "TMPDIR": private, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                    "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"})
        # the parent's own sys.path entries, so strop itself imports in the worker however it was installed
        env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), *sys.path] if p)
        argv = [sys.executable, "-m", "strop.scoring.sandbox_worker", str(bundle.mount), bundle.sha256,
                str(pool.processes if conf.confined else 0), str(conf.run_as if conf.confined else -1)]
        seccomp_fd = syscall_filter.filter_fd() if conf.confined and conf.seccomp else None
        if conf.confined:
            argv = conf.wrap(argv, bundle=bundle.mount, hide=pool.hide, tmp_mb=pool.tmp_mb, seccomp_fd=seccomp_fd)
        self.limit = confine.GroupLimit.create(memory_mb=pool.memory_mb, processes=pool.processes) \
            if conf.confined else None
        self.oom_before = 0
        # the grader's prints, at most grader_log.PER_REQUEST bytes of them per call
        self.log = BoundedLog(pool.log_dir / f"worker-{time.monotonic_ns()}.log")
        memory = pool.memory_mb * 1024 * 1024
        limit, confined = self.limit, conf.confined

        def prepare():  # in the child, before exec
            # lazy: resource is platform-specific
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            os.setsid()  # its own process group and session
            _new_session_keyring()
            if limit is not None:
                limit.join()
            if not confined:
                _drop_capabilities()

        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log.fd,
                                         env=env, cwd=private if not conf.confined else "/", preexec_fn=prepare,
                                         pass_fds=(seccomp_fd,) if seccomp_fd is not None else ())
        except BaseException:
            self.log.close()
            if self.limit is not None:
                self.limit.remove()
            raise
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        self.log.started()
        self.buffer = b""
        self.loaded: set[tuple[str, str]] = set()

    def call(self, request: dict, timeout: float) -> dict:
        if self.limit is not None:
            self.oom_before = self.limit.oom_kills()
        self.log.next_request()
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
                if len(self.buffer) > 1 << 20:
                    raise _Compromised
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            raise _Compromised from None
        if not isinstance(reply, dict) or reply.get("id") != request["id"] or self.buffer:
            raise _Compromised
        return reply

    def out_of_memory(self) -> bool:
        return self.limit is not None and self.limit.oom_kills() > self.oom_before

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.limit is not None:
            self.limit.kill_all()
        self.proc.wait()
        self._release()

    def death(self) -> str:
        code = self.proc.wait()
        self._release()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        tail = self.log.tail(400).decode(errors="replace").strip()
        return f"the grader's worker process died ({how})" + (f"; its last output: {tail}" if tail else "")

    def _release(self) -> None:
        self.log.close()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        if self.limit is not None:
            self.limit.remove()
            self.limit = None


class SandboxPool:
    """Confined worker processes for grader calls, per bundle version; thread-safe, so several calls may run at
    once (at most `workers`). `hide` names more folders the graders must not see (a run folder)."""

    def __init__(self, *, workers: int = 2, timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB,
                 processes: int = DEFAULT_PROCESSES, hide: list[str | Path] = (), import_timeout: float = IMPORT_TIMEOUT):
        if not (0 < timeout <= 3600) or not (64 <= memory_mb <= 1 << 20) or not (1 <= workers <= 64) \
                or not (8 <= processes <= 4096):
            raise StropError(f"sandbox settings: 0 < timeout <= 3600 s, 64 <= memory_mb <= 1048576, 1 <= workers <= 64 "
                             f"and 8 <= processes <= 4096; got {timeout}, {memory_mb}, {workers}, {processes}")
        self.confinement = confine.detect()
        self.confinement.require()
        self.timeout, self.memory_mb, self.processes, self.import_timeout = timeout, memory_mb, processes, import_timeout
        self.hide = [Path(p) for p in hide]
        self.tmp_mb = max(16, min(memory_mb // 4, 512))
        make_undumpable()  # before any worker exists: graders run as our user and could read our /proc files
        self.log_dir = Path(tempfile.mkdtemp(prefix="strop-sandbox-"))
        # removed by close(), or when the pool is collected or the process exits without closing it
        self._remove_log_dir = weakref.finalize(self, shutil.rmtree, str(self.log_dir), True)
        self._bundles: dict[Path, _Bundle] = {}
        self._slots = threading.Semaphore(workers)
        self._lock = threading.Lock()
        self.replaced = 0  # workers killed or found dead, for tests and logs

    def grader(self, ref: str):
        """A callable with the compute_score signature that runs `ref` in the sandbox."""
        target = self._target(ref)

        def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
            return self._run(target, {"data_source": data_source, "solution_str": solution_str,
                                      "ground_truth": ground_truth, "extra_info": extra_info})
        compute_score.sandboxed_ref = f"{target[0].folder}#{target[1]}:{target[2]}"
        compute_score.concurrent = True  # thread-safe: calls wait on the pool's worker processes, `workers` at once
        return compute_score

    def check(self, ref: str) -> None:
        """Load `ref` in a worker; StropError with the reason (import error, missing function) when it fails."""
        try:
            self._run(self._target(ref), None)
        except SandboxError as exc:
            raise SandboxError(f"grader {ref}: {exc}", exc.kind) from None

    def grader_modules(self, folder: str | Path, function: str = "compute_score") -> dict[str, bool]:
        """Each top-level module of a bundle folder -> whether it defines `function`; read in a worker (untrusted
        source is parsed there too), from the pinned content."""
        bundle, _, _ = self._target(f"{Path(folder).expanduser().resolve()}#__scan__:{function}", locate_module=False)
        reply = self._request(bundle, {"op": "scan", "module": "__scan__", "function": function}, loading=False)
        return {str(k): bool(v) for k, v in reply.get("modules", {}).items()}

    def call(self, ref: str, kwargs: dict | None) -> float:
        return self._run(self._target(ref), kwargs)

    def _target(self, ref: str, *, locate_module: bool = True) -> tuple[_Bundle, str, str]:
        # lazy: strop.scoring.bundles imports this module
        from strop.scoring.bundles import locate, locate_folder, split_ref
        ref = str(ref).strip()
        if ref.startswith("builtin:"):
            raise StropError(f"{ref} is a built-in grader; it runs in-process, not in a sandbox")
        directory, module, function = split_ref(ref.removeprefix("bundle:"))
        if locate_module:
            root, _ = locate(directory, module, function)  # the same checks and messages as load_grader, no import
        else:
            root = locate_folder(directory)
        with self._lock:
            bundle = self._bundles.get(root)
        if bundle is None:
            sha = folder_sha256(root)  # pinned now: a worker imports only this content
            bundle = _Bundle(root, sha, self._readable_copy(root, sha))
            with self._lock:
                bundle = self._bundles.setdefault(root, bundle)
        return bundle, module, function

    def _run(self, target: tuple[_Bundle, str, str], kwargs: dict | None) -> float:
        bundle, module, function = target
        request = {"op": "load" if kwargs is None else "call", "module": module, "function": function,
                   "kwargs": kwargs, "timeout": self.timeout}
        reply = self._request(bundle, request, loading=True)
        return float(reply["value"])  # a finite number, or "nan" / "inf" / "-inf" for score_terms to refuse

    def _request(self, bundle: _Bundle, request: dict, *, loading: bool) -> dict:
        """Send one request to a worker of the bundle (started if none is idle); its reply, or SandboxError."""
        request = {**request, "id": secrets.token_hex(16)}
        key, calling = (request["module"], request["function"]), request["op"] == "call"
        with self._slots:
            with self._lock:
                worker = bundle.idle.pop() if bundle.idle else None
            if worker is None:
                worker = _Worker(self, bundle)
            importing = loading and key not in worker.loaded
            budget = (self.import_timeout if importing else 0) + (self.timeout if calling else 0) + GRACE
            try:
                reply = worker.call(request, budget)
            except TimeoutError:
                worker.kill()
                self._replaced()
                what = f"importing {key[0]}" if importing and not calling else "the call"
                raise SandboxError(f"timed out after {budget - GRACE:g} s ({what}; the worker was killed and "
                                   f"replaced)", "timeout") from None
            except _Compromised:
                worker.kill()
                self._replaced()
                raise SandboxError("the bundle wrote into strop's reply channel (its worker was killed and the call "
                                   "failed); graders return their score, they do not write it", "channel") from None
            except (EOFError, BrokenPipeError, OSError):
                oom = worker.out_of_memory()
                reason = worker.death()
                self._replaced()
                if oom:
                    raise SandboxError(self._oom_reason(), "memory") from None
                raise SandboxError(reason, "died") from None
            if "error" not in reply and loading:
                worker.loaded.add(key)
            with self._lock:
                bundle.idle.append(worker)
        if "error" in reply:
            if reply.get("signal") == signal.SIGKILL and worker.out_of_memory():
                raise SandboxError(self._oom_reason(), "memory")
            raise SandboxError(reply["error"], reply.get("kind", "error"))
        return reply

    def _readable_copy(self, root: Path, sha: str) -> Path:
        """The folder itself, or, where the workers run as another user (root's sandboxes) and some of it is not
        readable by others, a snapshot that is (in this pool's private folder; the worker still checks its
        sha256 before every import)."""
        if self.confinement.run_as < 0 or _readable_by_others(root):
            return root
        snapshot = self.log_dir / "bundles" / sha[:16]
        if not snapshot.exists():
            shutil.copytree(root, snapshot, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            for folder, dirs, files in os.walk(snapshot):
                os.chmod(folder, 0o755)
                for name in files:
                    os.chmod(os.path.join(folder, name), 0o644)
        if folder_sha256(snapshot) != sha:
            raise SandboxError(f"the bundle {root} changed while it was being copied; try again", "error")
        return snapshot

    def _oom_reason(self) -> str:
        return (f"out of memory: the grader's processes together passed the {self.memory_mb} MB limit and the "
                f"kernel killed one")

    def _replaced(self) -> None:
        with self._lock:
            self.replaced += 1

    def close(self) -> None:
        with self._lock:
            workers = [w for b in self._bundles.values() for w in b.idle]
            for bundle in self._bundles.values():
                bundle.idle.clear()
        for worker in workers:
            worker.kill()
        self._remove_log_dir()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def grader_for(ref: str, *, sandbox: bool = True, timeout: float = DEFAULT_TIMEOUT, memory_mb: int = DEFAULT_MEMORY_MB):
    """A compute_score callable for `ref`: built-in graders in-process, bundles in a sandbox pool that is closed
    when the block ends. A bundle that does not load raises StropError here, before any call."""
    # lazy: strop.scoring.bundles imports this module
    from strop.scoring.bundles import load_grader
    if not sandbox or ref.strip().startswith("builtin:"):
        yield load_grader(ref)
        return
    with SandboxPool(timeout=timeout, memory_mb=memory_mb) as pool:
        pool.check(ref)
        yield pool.grader(ref)
