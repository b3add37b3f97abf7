"""Environment workers on Ray: a step's environments live in worker actors, and each episode talks to its own
through `RemoteEnv`, which has the environment protocol (`strop.envs.base`), so the rollout loop does not know
where an environment runs.

    workers = EnvWorkers({"name": "finance-sql", "options": {"seed": 0}}, size=64, settings=RaySettings(envWorkers=4))
    env = workers.envs[5]          # lives in worker 5 % 4
    env.reset(task); env.step(call)

Environment i of a step lives in worker i mod N, so the episodes of one task spread over the workers. A
RemoteEnv is `concurrent`: the rollout loop makes one turn's tool calls at once (`strop.rl.rollouts.play`), so
N workers run N environments' calls in parallel. A tool that raises is an observation, as in-process
(`call_tool_safely` runs inside the worker); a worker that dies makes its episodes' calls fail, counted as
environment errors, and a step where most fail stops before its update.
"""

from __future__ import annotations

import os

from strop.cluster.connect import (ClusterError, connect, first_line, forwarded_env, in_group, place, raised_there,
                                   stop_actors)
from strop.cluster.settings import RaySettings
from strop.envs.base import call_tool_safely

WORKER_CPUS = 0.25  # an environment mostly waits (on SQL, on a remote server): a quarter CPU each
START_TIMEOUT_S = 300.0


class EnvWorker:
    """Some of a step's environments in one Ray actor (wrapped by ray.remote in `EnvWorkers`)."""

    def __init__(self, name: str, options: dict):
        from strop.envs import get_env  # lazy: the actor's process imports the environments
        self.make = lambda: get_env(name, **options)
        self.envs: dict[int, object] = {}

    def open(self, slots: list[int]) -> dict:
        for slot in slots:
            self.envs[slot] = self.make()
        first = self.envs[slots[0]]
        return {"pid": os.getpid(), "name": first.name, "max_turns": first.max_turns}

    def tools(self, slot: int) -> list:
        return self.envs[slot].tools()

    def reset(self, slot: int, task):
        return self.envs[slot].reset(task)

    def step(self, slot: int, call):
        return call_tool_safely(self.envs[slot], call)

    def state(self, slot: int) -> dict:
        return self.envs[slot].state()

    def close(self) -> None:
        for env in self.envs.values():
            env.close()
        self.envs.clear()


class RemoteEnv:
    """One environment in a worker, with the environment protocol (tasks come from the run's own copy)."""

    concurrent = True  # its calls wait on another process: the rollout loop makes a turn's calls at once

    def __init__(self, ray, worker, slot: int, name: str, max_turns: int):
        self._ray, self._worker, self.slot, self.name, self.max_turns = ray, worker, slot, name, max_turns

    def _get(self, ref):
        try:
            return self._ray.get(ref)
        except self._ray.exceptions.RayTaskError as exc:
            raise raised_there(exc) or RuntimeError(str(exc)) from None
        except self._ray.exceptions.RayActorError as exc:
            raise ClusterError(f"environment worker of slot {self.slot} died: {first_line(exc)}") from None

    def tools(self) -> list:
        return self._get(self._worker.tools.remote(self.slot))

    def reset(self, task):
        return self._get(self._worker.reset.remote(self.slot, task))

    def step(self, call):
        return self._get(self._worker.step.remote(self.slot, call))

    def state(self) -> dict:
        return self._get(self._worker.state.remote(self.slot))

    def close(self) -> None:
        pass  # the worker closes its environments together (EnvWorkers.close)


class EnvWorkers:
    """`size` environments spread over `settings.env_workers` actors."""

    def __init__(self, spec: dict, size: int, *, settings: RaySettings):
        self.ray = ray = connect(settings.address)
        n = min(settings.env_workers, size)
        self.group = place(f"{n} environment workers", [{"CPU": WORKER_CPUS}] * n)
        actor, common = ray.remote(EnvWorker), {"num_cpus": WORKER_CPUS, "max_restarts": 0,
                                                "runtime_env": {"env_vars": forwarded_env()}}
        self.workers = [actor.options(**common, **in_group(self.group, i)).remote(spec["name"],
                                                                                 dict(spec.get("options") or {}))
                        for i in range(n)]
        slots = [list(range(w, size, n)) for w in range(n)]
        try:
            opened = ray.get([w.open.remote(s) for w, s in zip(self.workers, slots)], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise ClusterError(f"environment workers did not start within {START_TIMEOUT_S:g} s; `ray status` shows "
                               "whether the cluster has room for them") from None
        except ray.exceptions.RayError as exc:
            self.close()
            raise ClusterError(f"environment workers could not start: {str(exc).strip().splitlines()[-1][:300]}") \
                from None
        self.facts = [{"pid": o["pid"], "environments": len(s)} for o, s in zip(opened, slots)]
        self.envs = [RemoteEnv(ray, self.workers[i % n], i, opened[0]["name"], opened[0]["max_turns"])
                     for i in range(size)]

    def close(self) -> None:
        stop_actors(self.ray, self.workers, self.group, close_first=True)
        self.workers = []
