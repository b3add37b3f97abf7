"""Grader sandboxes on Ray: on a dataset run, `envWorkers` are the workers of its one-turn environment, the
reward graders. Each worker holds a sandbox pool of its own (`strop.scoring.sandbox`: bubblewrap, no network,
time and memory limits, on that worker's node), and a scoring bundle travels to it as its pinned content (the
files whose sha256 the run pinned), so a node needs no copy of the run's store.

    graders = GraderWorkers(settings, timeout=10.0, memory_mb=2048)
    terms = terms_from_spec(spec, sandbox=graders)     # what SandboxPool offers: grader(ref), check(ref)

A grader callable from here is `concurrent`: the rollout loop scores a step's completions at once, spread over
the workers (`strop.rl.rollouts.play`). A grader that raises, hangs or crashes fails that call, as in-process.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
from pathlib import Path

from strop.cluster.connect import (ClusterError, connect, first_line, forwarded_env, in_group, place, raised_there,
                                   stop_actors)
from strop.cluster.folders import pack, unpack
from strop.cluster.settings import RaySettings
from strop.errors import StropError
from strop.files import folder_sha256

WORKER_CPUS = 0.5
MAX_BUNDLE_BYTES = 64 << 20  # a scoring bundle is code and a few data files: its packed content, at most


class GraderWorker:
    """A sandbox pool in a Ray actor (wrapped by ray.remote in `GraderWorkers`)."""

    def __init__(self, timeout: float, memory_mb: int, hide: list[str]):
        from strop.scoring.sandbox import SandboxPool  # lazy: the actor's process confines its own graders
        self.pool = SandboxPool(timeout=timeout, memory_mb=memory_mb, hide=hide)
        self.root = Path(tempfile.mkdtemp(prefix="strop-bundles-"))
        self.graders: dict[str, object] = {}

    def _grader(self, sha: str, packed: list, module: str, function: str):
        key = f"{sha}#{module}:{function}"
        if key not in self.graders:
            folder = self.root / sha
            if not folder.is_dir():
                import ray  # the actor's process has Ray (this class runs only there)
                unpack(ray.get(packed[0]), folder)
            self.graders[key] = self.pool.grader(f"{folder}#{module}:{function}")
        return self.graders[key]

    def pid(self) -> int:
        return os.getpid()

    def check(self, sha: str, packed: list, module: str, function: str) -> None:
        self._grader(sha, packed, module, function)
        self.pool.check(f"{self.root / sha}#{module}:{function}")

    def score(self, sha: str, packed: list, module: str, function: str, kwargs: dict):
        return self._grader(sha, packed, module, function)(**kwargs)

    def close(self) -> None:
        self.pool.close()


class GraderWorkers:
    """`settings.env_workers` grader workers; `grader(ref)` and `check(ref)` as a SandboxPool has them."""

    def __init__(self, settings: RaySettings, *, timeout: float, memory_mb: int, hide: list = ()):
        self.ray = ray = connect(settings.address)
        n = settings.env_workers
        self.group = place(f"{n} grader workers", [{"CPU": WORKER_CPUS}] * n)
        actor, common = ray.remote(GraderWorker), {"num_cpus": WORKER_CPUS, "max_restarts": 0,
                                                   "runtime_env": {"env_vars": forwarded_env()}}
        self.workers = [actor.options(**common, **in_group(self.group, i)).remote(timeout, memory_mb,
                                                                                 [str(p) for p in hide])
                        for i in range(n)]
        try:
            pids = ray.get([w.pid.remote() for w in self.workers], timeout=300)
        except ray.exceptions.RayError as exc:
            self.close()
            raise ClusterError(f"grader workers could not start: {str(exc).strip().splitlines()[-1][:300]}") from None
        self.facts = {"graderWorkers": [{"pid": pid} for pid in pids]}
        self._bundles: dict[Path, tuple[str, list]] = {}
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def _target(self, ref: str) -> tuple[str, list, str, str]:
        # lazy: strop.scoring.bundles imports the sandbox, which this module's driver side does not need otherwise
        from strop.scoring.bundles import locate, split_ref

        directory, module, function = split_ref(ref.strip().removeprefix("bundle:"))
        root, _ = locate(directory, module, function)
        with self._lock:
            if root not in self._bundles:
                packed = pack(Path(root), MAX_BUNDLE_BYTES, "scoring bundle")
                self._bundles[root] = (folder_sha256(root), [self.ray.put(packed)])  # sent once per bundle
            sha, packed = self._bundles[root]
        return sha, packed, module, function

    def _get(self, ref):
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:
            raise raised_there(exc) or StropError(str(exc)) from None
        except self.ray.exceptions.RayActorError as exc:
            raise ClusterError(f"a grader worker died: {first_line(exc)}") from None

    def check(self, ref: str) -> None:
        target = self._target(ref)
        for worker in self.workers:
            self._get(worker.check.remote(*target))

    def grader(self, ref: str):
        target = self._target(ref)

        def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
            worker = self.workers[next(self._turn) % len(self.workers)]
            return self._get(worker.score.remote(*target, {
                "data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
                "extra_info": extra_info}))
        compute_score.sandboxed_ref = ref
        compute_score.concurrent = True  # a call waits on another process: score a step's completions at once
        return compute_score

    def close(self) -> None:
        stop_actors(self.ray, self.workers, self.group, close_first=True)
        self.workers = []
