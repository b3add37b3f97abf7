"""A Ray cluster of several nodes on this machine's loopback, for trying Ray runs and testing them: a head node
and worker nodes started with Ray's own `ray start`, as on real machines, each node a raylet of its own.

    with LocalCluster(nodes=2, cpus_per_node=2) as cluster:   # gpus_per_node=1: a logical GPU a node (see below)
        print(cluster.address)          # "127.0.0.1:PORT": give it as execution.ray.address / --ray-address
        cluster.pids()                  # every process of the cluster

`gpus_per_node` declares GPUs to Ray (`ray start --num-gpus`) without checking that the node has them: actors that
ask for one are placed as on a GPU machine, and compute wherever torch finds CUDA (on the CPU here). It tries the
placement decisions of a GPU cluster on a machine without one.

Stopping kills only this cluster's processes (found by its own temporary folder), not other Ray clusters on
the machine, as `ray stop` would.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from strop.cluster.connect import ClusterError, import_ray

OBJECT_STORE_BYTES = 100 * 1024 * 1024  # what a run moves through it is an adapter a step: 100 MiB per node is plenty


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    def __init__(self, nodes: int = 2, cpus_per_node: int = 2, env: dict | None = None, gpus_per_node: int = 0):
        self.nodes, self.cpus, self.gpus = nodes, cpus_per_node, gpus_per_node
        self.env = {**os.environ, **(env or {})}
        self.temp = None
        self.address = None
        self.port = None

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _ray(self, *args: str) -> None:
        import_ray()
        ray_cli = Path(sys.executable).with_name("ray")
        command = [str(ray_cli) if ray_cli.exists() else "ray", "start", *args, f"--num-cpus={self.cpus}",
                   f"--num-gpus={self.gpus}", f"--object-store-memory={OBJECT_STORE_BYTES}",
                   "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            self.stop()
            raise ClusterError(f"`{' '.join(command)}` failed:\n{(done.stderr or done.stdout)[-2000:]}")

    def start(self) -> None:
        # a short folder: Ray's unix sockets live in it, and their paths have a ~107-character limit
        self.temp = tempfile.mkdtemp(prefix="strop-ray-", dir="/tmp")
        self.port = port = free_port()
        self._ray("--head", f"--port={port}", f"--temp-dir={self.temp}", "--include-dashboard=false",
                  f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}")
        self.address = f"127.0.0.1:{port}"
        for _ in range(self.nodes - 1):
            self._ray(f"--address={self.address}", f"--dashboard-agent-listen-port={free_port()}")

    def pids(self) -> list[int]:
        """This cluster's processes: those whose command line names its folder or its address, and their children."""
        if not self.temp:
            return []
        import psutil  # Ray's own dependency

        found = set()
        for process in psutil.process_iter(["pid", "cmdline"]):
            try:
                if any(self.temp in part or part.endswith(f":{self.port}") for part in process.info["cmdline"] or ()):
                    found.add(process.pid)
                    found.update(child.pid for child in process.children(recursive=True))
            except psutil.Error:
                continue
        return sorted(found)

    def stop(self) -> None:
        pids = self.pids()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
                time.sleep(0.1)
        if self.temp:
            shutil.rmtree(self.temp, ignore_errors=True)
            self.temp = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False
