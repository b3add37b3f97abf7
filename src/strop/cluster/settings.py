"""`execution.ray` of a run descriptor: which cluster, how many sampler replicas, environment workers and
data-parallel trainers.

    RaySettings.from_spec({"address": "10.0.0.5:6379", "samplers": 2, "envWorkers": 4, "trainers": 2})
    RaySettings.problems({"address": "nowhere"})   # ['address: must be "auto" or HOST:PORT ...']

Checking a spec imports nothing of Ray: a descriptor is validated before anything loads.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from strop.errors import StropError
from strop.rl.limits import LIMITS

KEYS = ("address", "samplers", "envWorkers", "trainers")
ENV = {"address": "STROP_RAY_ADDRESS", "samplers": "STROP_RAY_SAMPLERS", "envWorkers": "STROP_RAY_ENV_WORKERS",
       "trainers": "STROP_RAY_TRAINERS"}
ADDRESS_HELP = ('"auto" (the cluster `ray start --head` started on this machine) or HOST:PORT of a cluster\'s head '
                'node (its GCS port, 6379 unless `ray start --port` said otherwise), e.g. "10.0.0.5:6379"')
_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])"
_ADDRESS = re.compile(rf"{_HOST}:(?P<port>[0-9]{{1,5}})")


@dataclass(frozen=True)
class RaySettings:
    address: str = "auto"
    samplers: int = 1       # sampler replicas, one actor each
    env_workers: int = 0    # actors holding a step's environments; 0: environments stay in the run's process
    trainers: int = 1       # data-parallel trainer replicas (torch.distributed: NCCL on GPUs, gloo on CPUs)

    @classmethod
    def problems(cls, spec) -> list[str]:
        """'field: what is wrong' for each problem of a spec ({"address", "samplers", "envWorkers", "trainers"})."""
        if not isinstance(spec, dict):
            return [f'must be an object such as {{"address": "auto", "samplers": 2, "envWorkers": 2}}, got '
                    f"{repr(spec)[:80]}"]
        found = [f"{key}: unknown field; known fields: {', '.join(KEYS)}" for key in spec if key not in KEYS]
        address = spec.get("address", "auto")
        if not isinstance(address, str) or not address_ok(address):
            found.append(f"address: must be {ADDRESS_HELP} (got {repr(address)[:80]})")
        for key, limit in (("samplers", "ray_samplers"), ("envWorkers", "ray_env_workers"),
                           ("trainers", "ray_trainers")):
            problem = LIMITS[limit].problem(spec.get(key, getattr(cls, _ATTR[key])))
            if problem:
                found.append(f"{key}: {problem}")
        return found

    @classmethod
    def from_spec(cls, spec: dict | None) -> RaySettings | None:
        """The settings of a spec (None for None: no Ray), or StropError listing every problem."""
        if spec is None:
            return None
        if isinstance(spec, RaySettings):
            return spec
        found = cls.problems(spec)
        if found:
            raise StropError("execution.ray:\n  " + "\n  ".join(found))
        return cls(address=spec.get("address", "auto"), samplers=spec.get("samplers", 1),
                   env_workers=spec.get("envWorkers", 0), trainers=spec.get("trainers", 1))

    @classmethod
    def from_environment(cls) -> RaySettings | None:
        """The settings STROP_RAY_ADDRESS, STROP_RAY_SAMPLERS, STROP_RAY_ENV_WORKERS and STROP_RAY_TRAINERS give
        (what `--ray-address`, `--samplers`, `--env-workers` and `--trainers` set for the work a command starts), or
        None when no address is set."""
        address = os.environ.get(ENV["address"])
        if not address:
            return None
        spec: dict = {"address": address}
        for key in ("samplers", "envWorkers", "trainers"):
            text = os.environ.get(ENV[key])
            if text:
                try:
                    spec[key] = int(text)
                except ValueError:
                    raise StropError(f"{ENV[key]}={text[:40]!r}: must be a whole number") from None
        found = cls.problems(spec)
        if found:
            raise StropError("the Ray settings of this environment:\n  " + "\n  ".join(
                f"{ENV[line.split(':', 1)[0]]}: {line.split(': ', 1)[1]}" for line in found))
        return cls.from_spec(spec)

    def to_spec(self) -> dict:
        return {"address": self.address, "samplers": self.samplers, "envWorkers": self.env_workers,
                "trainers": self.trainers}


_ATTR = {"samplers": "samplers", "envWorkers": "env_workers", "trainers": "trainers"}


def address_ok(address: str) -> bool:
    if address == "auto":
        return True
    match = _ADDRESS.fullmatch(address)
    return bool(match) and 1 <= int(match["port"]) <= 65535
