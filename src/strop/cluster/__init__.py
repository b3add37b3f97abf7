"""Runs beyond one process: Ray places a run's sampler replicas and environment workers on a cluster.

    settings = RaySettings.from_spec({"address": "auto", "samplers": 2, "envWorkers": 2})
    service = strop.ServiceClient(ray=settings.to_spec())      # sampling spreads over 2 replicas on the cluster
    pool = EnvPool({"name": "finance-sql"}, 64, ray=settings)   # 64 environments on 2 workers

On Ray the trainer (`strop.cluster.trainer`, an actor with a GPU or a node's CPUs), the sampler replicas
(`strop.cluster.samplers`, either engine, one per actor, each step's adapter sent once through Ray's object
store) and the environment workers (`strop.cluster.envs`, a step's environments spread over them, their tool
calls made concurrently; on a dataset, grader workers: `strop.cluster.graders`) run where the cluster places
them. The run's own process is the Ray driver: it plays the episodes and keeps the run folder, so the store,
checkpoints (sent back as files) and resume work exactly as without Ray, and a run that loses its cluster fails
resumable.

Ray is an extra (`pip install -e ".[ray]"`; the dev install has it). Without `execution.ray` nothing here is
imported and strop runs in-process.
"""

from strop.cluster.settings import RaySettings

__all__ = ["RaySettings"]
