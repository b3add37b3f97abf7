"""Runs beyond one process: Ray places a run's sampler replicas and environment workers on a cluster.

    settings = RaySettings.from_spec({"address": "auto", "samplers": 2, "envWorkers": 2})
    service = strop.ServiceClient(ray=settings.to_spec())      # sampling spreads over 2 replicas on the cluster
    pool = EnvPool({"name": "finance-sql"}, 64, ray=settings)   # 64 environments on 2 workers

Only what scales out leaves the run's process: sampler replicas (`strop.cluster.samplers`, either engine, one
per actor, each step's adapter sent once through Ray's object store) and environment workers
(`strop.cluster.envs`, the environments of a step spread over them, their tool calls made concurrently). The
trainer stays in the run's own process, which is the Ray driver: the store, the run folder, checkpoints and
resume work exactly as without Ray, and a run that loses its cluster fails resumable.

Ray is an extra (`pip install -e ".[ray]"`; the dev install has it). Without `execution.ray` nothing here is
imported and strop runs in-process.
"""

from strop.cluster.settings import RaySettings

__all__ = ["RaySettings"]
