"""Fault injection: what a confined grader could still reach past its namespaces (kernel keyrings, path unix
sockets, a store named by STROP_DATABASE_URL, the host's disk through its stderr). Each attack here worked against
the sandbox before these fixes; each test asserts that it fails now."""

import ctypes
import os
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest

from strop.scoring import confine, syscall_filter
from strop.scoring.grader_log import BoundedLog
from strop.scoring.sandbox import SandboxPool
from test_control import home  # noqa: F401 - fixture
from test_fault_confinement import make_bundle, score

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="namespaces and seccomp are Linux's")
CONF = confine.detect()
needs_filter = pytest.mark.skipif(not CONF.seccomp, reason=f"no seccomp filter here: {CONF.note or CONF.problem}")

ATTACKS = '''
import ctypes, errno, os, socket, sys

KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}[os.uname().machine]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def call(number, *args):
    """(result, errno) of a raw system call with long or bytes arguments."""
    ctypes.set_errno(0)
    result = libc.syscall(ctypes.c_long(number), *[a if isinstance(a, bytes) else ctypes.c_long(a) for a in args])
    return result, ctypes.get_errno()

def keyctl_errno(**kw):
    """The errno of keyctl(KEYCTL_GET_KEYRING_ID, session keyring): 0.0 if the call worked."""
    return float(call(KEYCTL[2], 0, -3, 0)[1])

def keyrings(extra_info=None, **kw):
    """1 point for each way it found the host's secret or left a key for a later grader."""
    hits = 0
    add_key, request_key, keyctl = KEYCTL
    buffer = ctypes.create_string_buffer(256)
    size, _ = call(keyctl, 11, extra_info["key"], ctypes.addressof(buffer), 256)  # KEYCTL_READ the host's key
    hits += size > 0 and extra_info["secret"].encode() in buffer.raw
    found, _ = call(request_key, b"user\\0", extra_info["description"].encode() + b"\\0", 0, 0)
    hits += found > 0
    for where in (-3, -4):  # session and user keyrings: a channel to the next bundle's graders
        planted, _ = call(add_key, b"user\\0", b"strop-planted\\0", b"stolen", 6, where)
        hits += planted > 0
    with open("/proc/keys") as handle:
        hits += extra_info["description"] in handle.read()
    import asyncio
    asyncio.run(asyncio.sleep(0))  # what Python needs (a socketpair for its event loop) still works
    return float(hits)

def unix_sockets(extra_info=None, **kw):
    hits = 0
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(extra_info["path"])
            s.sendall(b"exfiltrated")
            hits += 1
    except OSError:
        pass
    try:  # a datagram pair may send to any path: refused too
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        a.sendto(b"exfiltrated", extra_info["dgram"])
        hits += 1
    except OSError:
        pass
    a, b = socket.socketpair()  # a connected stream pair still works
    a.sendall(b"x")
    return float(hits) + (0.5 if b.recv(1) == b"x" else 0.0)

def read_file(extra_info=None, **kw):
    try:
        with open(extra_info["path"], "rb") as handle:
            return float(len(handle.read()) > 0)
    except OSError:
        return 0.0

def mount_names(extra_info=None, **kw):
    """1 point for each hidden folder /proc/self/mountinfo names, 1 if the folder can be listed."""
    with open("/proc/self/mountinfo") as handle:
        table = handle.read()
    hits = sum(name in table for name in extra_info["names"])
    return float(hits + os.path.exists(extra_info["run"]))

def shout(extra_info=None, **kw):
    chunk = b"x" * 65536
    for _ in range(extra_info["mb"] * 16):
        os.write(2, chunk)
    os.write(2, b"end-of-" + extra_info["tag"].encode() + b"\\n")
    return 0.0
'''


@pytest.fixture()
def attacks(tmp_path):
    return make_bundle(tmp_path / "reach", ATTACKS)


@pytest.fixture()
def visible_folder():
    """A folder the sandbox shows (not under the home, the working directory or a temporary folder), which the
    grader's user may enter: where a shared store or a service's socket would be."""
    for base in ("/var/lib", "/srv", "/opt", "/mnt"):
        if os.access(base, os.W_OK) and not any(Path(base).is_relative_to(p) for p in confine.hidden_paths()):
            folder = Path(tempfile.mkdtemp(prefix="strop-test-", dir=base))
            folder.chmod(0o755)
            yield folder
            for entry in folder.iterdir():
                entry.unlink()
            folder.rmdir()
            return
    pytest.skip("no writable folder outside the sandbox's hidden ones (needs root)")


# ---- kernel keyrings ----------------------------------------------------------------------------------------

@pytest.fixture()
def planted_key():
    """A secret in this process's session keyring, as a credential helper would leave one; removed afterwards."""
    if syscall_filter.machine() is None:
        pytest.skip("no keyring call numbers for this machine")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    add_key, _, keyctl = syscall_filter.machine()["keyrings"]
    secret, description = f"hunter2-{os.getpid()}", f"strop-test-{os.getpid()}"
    key = libc.syscall(ctypes.c_long(add_key), b"user\0", description.encode() + b"\0", secret.encode(),
                       ctypes.c_long(len(secret)), ctypes.c_long(-3))
    if key < 0:
        pytest.skip(f"this kernel gives no keyrings (errno {ctypes.get_errno()})")
    yield {"key": key, "secret": secret, "description": description}
    libc.syscall(ctypes.c_long(keyctl), ctypes.c_long(21), ctypes.c_long(key))  # KEYCTL_INVALIDATE


@needs_filter
def test_keyring_calls_fail_with_eperm_in_a_grader(attacks):
    with SandboxPool(timeout=10.0) as pool:
        assert score(pool, attacks, "keyctl_errno") == float(1)  # EPERM


@needs_filter
def test_a_grader_cannot_read_the_hosts_keys_or_leave_one_for_the_next(attacks, planted_key):
    with SandboxPool(timeout=10.0) as pool:
        assert score(pool, attacks, "keyrings", **planted_key) == 0.0


def run_filter(code, *, arch: int, nr: int, args=(0, 0)) -> int:
    """What the kernel would do with the filter: classic BPF over struct seccomp_data, the ops the filter uses."""
    f = syscall_filter
    data = {f.ARCH: arch, f.NR: nr, f.ARG0: args[0], f.ARG1: args[1]}
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == syscall_filter.RET_K:
            return k
        if op == syscall_filter.LD_W_ABS:
            acc = data[k]
        elif op == syscall_filter.AND_K:
            acc &= k
        elif op in (syscall_filter.JEQ_K, syscall_filter.JGE_K):
            taken = acc == k if op == syscall_filter.JEQ_K else acc >= k
            pc += jt if taken else jf
        pc += 1


def test_the_filter_denies_keyrings_io_uring_unix_sockets_and_foreign_abis():
    x86 = syscall_filter.ARCHES["x86_64"]
    code = syscall_filter.program(x86)
    allow, eperm, audit = syscall_filter.RET_ALLOW, syscall_filter.RET_EPERM, x86["audit"]
    cases = {  # (arch, nr, args) -> verdict, worked out from the x86_64 syscall table
        (audit, 0, (0, 0)): allow,                              # read
        (audit, 248, (0, 0)): eperm,                            # add_key
        (audit, 249, (0, 0)): eperm,                            # request_key
        (audit, 250, (0, 0)): eperm,                            # keyctl
        (audit, 425, (0, 0)): eperm,                            # io_uring_setup
        (audit, 41, (2, 1)): allow,                             # socket(AF_INET, SOCK_STREAM)
        (audit, 41, (1, 1)): eperm,                             # socket(AF_UNIX, SOCK_STREAM)
        (audit, 53, (1, 1 | 0o2000000)): allow,                 # socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC)
        (audit, 53, (1, 2)): eperm,                             # socketpair(AF_UNIX, SOCK_DGRAM)
        (audit, 0x40000000 + 250, (0, 0)): eperm,               # keyctl through the x32 ABI
        (0x40000003, 0, (0, 0)): eperm,                         # anything through the 32-bit ABI (i386)
    }
    for (arch, nr, args), verdict in cases.items():
        assert run_filter(code, arch=arch, nr=nr, args=args) == verdict, (arch, nr, args)
    arm = syscall_filter.ARCHES["aarch64"]
    assert run_filter(syscall_filter.program(arm), arch=arm["audit"], nr=219) == eperm  # keyctl there
    assert run_filter(syscall_filter.program(arm), arch=arm["audit"], nr=63) == allow  # read there
    assert len(syscall_filter.encode(code)) == 8 * len(code)


# ---- path unix sockets ----------------------------------------------------------------------------------------

@needs_filter
def test_a_grader_cannot_connect_to_a_unix_socket_the_view_shows(attacks, visible_folder):
    path, dgram_path = visible_folder / "service.sock", visible_folder / "dgram.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    server.settimeout(0.5)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dgram.bind(str(dgram_path))
    dgram.settimeout(0.5)
    for sock in (path, dgram_path):
        sock.chmod(0o777)  # anyone may connect, as to many a service's socket
    try:
        with SandboxPool(timeout=10.0) as pool:
            assert score(pool, attacks, "unix_sockets", path=str(path), dgram=str(dgram_path)) == 0.5
        with pytest.raises(socket.timeout):
            server.accept()
        with pytest.raises(socket.timeout):
            dgram.recv(100)
    finally:
        server.close()
        dgram.close()


# ---- a store named by STROP_DATABASE_URL -------------------------------------------------------------------------

def test_a_new_sqlite_store_is_readable_by_its_owner_only(tmp_path, monkeypatch):
    from strop.store import clear_engine_cache, open_store
    monkeypatch.setenv("STROP_DATABASE_URL", f"sqlite:///{tmp_path / 'shared' / 'strop.db'}")
    clear_engine_cache()
    try:
        open_store()
    finally:
        clear_engine_cache()
    files = [tmp_path / "shared" / name for name in ("strop.db", "strop.db-wal", "strop.db-shm")]
    assert files[0].exists()
    for file in files:  # the database and its write-ahead log (the lock file beside them holds nothing)
        if file.exists():
            assert stat.S_IMODE(file.stat().st_mode) & 0o077 == 0, file


def test_the_folder_of_a_store_named_by_url_is_hidden(tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    for url in (f"sqlite:///{folder}/strop.db", f"sqlite:///{folder}/strop.db?timeout=5"):
        monkeypatch.setenv("STROP_DATABASE_URL", url)
        assert folder in confine.hidden_paths()
    monkeypatch.setenv("STROP_DATABASE_URL", "postgresql://strop@localhost/strop")
    assert confine.store_folder() is None


@pytest.mark.skipif(not CONF.confined, reason=f"no confinement here: {CONF.problem}")
def test_a_grader_cannot_read_a_store_named_by_url(attacks, visible_folder, monkeypatch):
    from strop.store import clear_engine_cache, open_store
    database = visible_folder / "strop.db"
    monkeypatch.setenv("STROP_DATABASE_URL", f"sqlite:///{database}")
    clear_engine_cache()
    try:
        open_store()
    finally:
        clear_engine_cache()
    with SandboxPool(timeout=10.0) as pool:
        assert score(pool, attacks, "read_file", path=str(database)) == 0.0


# ---- /proc/self/mountinfo --------------------------------------------------------------------------------------

@pytest.mark.skipif(not CONF.confined, reason=f"no confinement here: {CONF.problem}")
def test_mountinfo_does_not_name_the_hidden_folders(attacks, visible_folder, home):
    run_dir = visible_folder / "run-secret-name"
    run_dir.mkdir()
    (home / "state-secret").mkdir(parents=True)
    try:
        with SandboxPool(timeout=10.0, hide=[run_dir]) as pool:
            names = ["run-secret-name", str(home)] + ([os.getcwd()] if Path.cwd() not in shown() else [])
            assert score(pool, attacks, "mount_names", names=names, run=str(run_dir)) == 0.0
    finally:
        run_dir.rmdir()


def shown() -> list[Path]:
    """Folders the worker needs and that hold the folders shown again: mountinfo names them as paths leading there."""
    return [p for shown_path in sum(confine.shown_paths(), []) for p in [shown_path, *shown_path.parents]]


# ---- a grader's stderr ------------------------------------------------------------------------------------------

def test_a_graders_output_is_bounded_per_call(attacks):
    with SandboxPool(timeout=20.0, workers=1) as pool:
        score(pool, attacks, "shout", mb=8, tag="first")
        score(pool, attacks, "shout", mb=0, tag="second")
        (log,) = pool.log_dir.glob("worker-*.log")
        for _ in range(200):  # the pool's reader takes what the worker wrote a moment after the reply
            text = log.read_bytes()
            if b"end-of-second" in text:
                break
            time.sleep(0.01)
    assert len(text) < 3 * 64 * 1024, len(text)  # about 8 MB written
    assert b"bytes of the grader's output were dropped" in text
    assert b"end-of-second" in text  # the next call's output is kept


def test_a_log_never_grows_past_its_total(tmp_path):
    log = BoundedLog(tmp_path / "w.log", per_request=1000, total=5000)
    writer = log.fd
    for index in range(20):
        log.next_request()
        os.write(writer, f"call {index} ".encode() * 200)
        time.sleep(0.01)  # let the reader take it under this request
    log.started()
    tail = log.tail(200)
    log.close()
    assert (tmp_path / "w.log").stat().st_size <= 5000
    assert b"call 19" in tail
