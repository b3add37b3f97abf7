"""Background worker processes of the control plane: start one detached, and tell whether it still runs.

    pid = spawn("strop.control.worker", "run-3f9a1c2e", log=Path("worker.log"))
    alive(pid, "strop.control.worker", "run-3f9a1c2e")

A pid means something only on the machine that started it: record `this_host()` with it, and where a store is
shared by several machines, judge liveness only on that host.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path


def this_host() -> str:
    """This machine's name, as stored next to the pids of the workers it starts."""
    return socket.gethostname()


def spawn(module: str, arg: str, log: Path) -> int:
    """`python -m MODULE ARG` in its own session (it outlives the command that started it), output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", module, arg], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, env=os.environ.copy())
    return proc.pid


def alive(pid: int | None, module: str, arg: str) -> bool:
    """True while `pid` is that worker (a zombie, or a pid the system reused for something else, does not count)."""
    if not pid:
        return False
    proc = Path(f"/proc/{pid}")
    if proc.exists():
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        return state not in ("Z", "X") and module in cmdline and arg in cmdline
    if sys.platform.startswith("linux"):
        return False
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def poll_until_finished(read, *, timeout: float | None, on_poll=None, interval: float = 1.0, on_timeout=None) -> dict:
    """Call `read()` every `interval` s until its `status` is finished; `on_timeout(info)` raises past `timeout`."""
    # lazy: strop.store.schema pulls in sqlalchemy, which importing this module does not need
    from strop.store.schema import FINISHED_STATUSES
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        info = read()
        if on_poll is not None:
            on_poll(info)
        if info["status"] in FINISHED_STATUSES:
            return info
        if deadline is not None and time.monotonic() > deadline:
            on_timeout(info)
        time.sleep(interval)
