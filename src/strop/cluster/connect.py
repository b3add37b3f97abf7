"""Joining a Ray cluster as its driver, with an error a person can act on when the cluster is not there.

    connect("auto")             # the cluster `ray start --head` started on this machine
    connect("10.0.0.5:6379")    # a head node's GCS address
    cluster_facts()             # {"address", "rayVersion", "nodes": [...], "cpus", "gpus"}

Ray's own `ray.init` waits minutes (measured: over 2 minutes, no error) on an address where nothing answers or
something else listens; `connect` first checks that the address accepts a TCP connection and speaks gRPC, each
within seconds, and names what to do.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from strop.errors import StropError

INSTALL_HINT = 'install it with pip install -e ".[ray]" (or pip install "ray==2.60.0")'
PROBE_SECONDS = 5.0
PLACE_SECONDS = 60.0  # placing a run's actors takes well under a second on a cluster with room for them
NAMESPACE = "strop"
_lock = threading.Lock()


class ClusterError(StropError):
    """The Ray cluster could not be joined, or lost what a run placed on it."""


def import_ray():
    try:
        import ray  # lazy: Ray is an extra, and heavy
    except ImportError:
        raise ClusterError(f"execution.ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def connect(address: str = "auto"):
    """The `ray` module, this process joined to the cluster at `address` (once per process; `reachable` first)."""
    ray = import_ray()
    with _lock:
        if ray.is_initialized():
            current = ray.get_runtime_context().gcs_address
            if address != "auto" and not _same(current, address):
                raise ClusterError(f"this process already drives the Ray cluster at {current}; it cannot also join "
                                   f"{address}: run one cluster per process")
            return ray
        found = reachable(address)
        try:
            ray.init(address=found, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                     configure_logging=True)
        except ConnectionError as exc:
            raise ClusterError(f"could not join the Ray cluster at {address}: {exc}") from None
        except Exception as exc:  # a version mismatch, a refused job: Ray's own words
            raise ClusterError(f"could not join the Ray cluster at {address}: {type(exc).__name__}: {exc}") from None
    return ray


def reachable(address: str) -> str:
    """The HOST:PORT of the cluster `address` names ("auto": the one started on this machine), checked to answer
    (`probe`); ClusterError saying what to do otherwise. Takes seconds, not Ray's minutes."""
    import_ray()
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address_or_die  # how ray.init reads "auto"
        try:
            address = canonicalize_bootstrap_address_or_die("auto")
        except (ConnectionError, ValueError):
            raise ClusterError("no Ray cluster is running on this machine (address \"auto\"): start one with "
                               "`ray start --head`, or give the head node's HOST:PORT") from None
        try:
            probe(address)
        except ClusterError as exc:
            raise ClusterError(f"{exc} (the cluster this machine last started, found by \"auto\": it has stopped)") \
                from None
        return address
    probe(address)
    return address


def probe(address: str, seconds: float = PROBE_SECONDS) -> None:
    """ClusterError unless a gRPC server (a Ray head's GCS) answers at HOST:PORT within `seconds`."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    hint = ("start the head node with `ray start --head --port PORT` and give its HOST:PORT (`ray status` on the "
            "head prints it), or \"auto\" on the head node itself")
    try:
        with socket.create_connection((host, int(port)), timeout=seconds):
            pass
    except OSError as exc:
        reason = "nothing listens there" if isinstance(exc, ConnectionRefusedError) else str(exc) or type(exc).__name__
        raise ClusterError(f"no Ray cluster at {address}: {reason}; {hint}") from None
    import grpc  # Ray's own dependency

    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=seconds)
    except grpc.FutureTimeoutError:
        raise ClusterError(f"no Ray cluster at {address}: something listens there but does not speak Ray's protocol "
                           f"(gRPC) within {seconds:g} s; {hint}") from None
    finally:
        channel.close()


def _same(current: str, address: str) -> bool:
    def port(a: str) -> str:
        return a.rpartition(":")[2]
    return port(current) == port(address)


def cluster_facts() -> dict:
    """What a run records of the cluster it used: its address, Ray's version, its live nodes and resources."""
    ray = import_ray()
    nodes = [{"node": n["NodeID"][:12], "address": n.get("NodeManagerAddress"),
              "cpus": n.get("Resources", {}).get("CPU", 0), "gpus": n.get("Resources", {}).get("GPU", 0)}
             for n in ray.nodes() if n.get("Alive")]
    total = ray.cluster_resources()
    return {"address": ray.get_runtime_context().gcs_address, "rayVersion": ray.__version__, "nodes": nodes,
            "cpus": total.get("CPU", 0), "gpus": total.get("GPU", 0)}


def forwarded_env() -> dict:
    """The variables actors need to find what the driver finds: strop's home (models, caches), its choices, and
    the module path ('module:Class' environments)."""
    keys = [k for k in os.environ if k.startswith("STROP_") or k in ("HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                                                     "PYTHONPATH")]
    return {k: os.environ[k] for k in keys}


def actor_env(gpus: int | None = None) -> dict:
    """An actor's environment: `forwarded_env`, and STROP_DEVICE=cpu where the run's execution.gpus is 0, so that
    an actor placed on a node with GPUs computes on its CPU as the run asked (Ray hides no GPU from an actor that
    asked for none)."""
    return {**forwarded_env(), **({"STROP_DEVICE": "cpu"} if gpus == 0 else {})}


def check_resources(what: str, cpus: float, gpus: float = 0) -> None:
    """ClusterError when the cluster, as a whole, has fewer CPUs or GPUs than `what` asks for (Ray would otherwise
    leave the actors pending for ever)."""
    ray = import_ray()
    total = ray.cluster_resources()
    have_cpus, have_gpus = total.get("CPU", 0), total.get("GPU", 0)
    if cpus > have_cpus or gpus > have_gpus:
        raise ClusterError(f"{what} need {cpus:g} CPUs and {gpus:g} GPUs, and the Ray cluster has {have_cpus:g} CPUs "
                           f"and {have_gpus:g} GPUs in all: add nodes (`ray start --address HEAD:PORT` on another "
                           "machine) or ask for fewer (execution.ray.samplers, execution.ray.envWorkers)")


def place(what: str, bundles: list[dict], seconds: float = PLACE_SECONDS):
    """A placement group reserving `bundles` (one per actor, e.g. {"CPU": 1}), spread over the nodes, once the
    cluster has placed it; ClusterError within `seconds` when it cannot (Ray would leave the actors pending for
    ever), saying what was asked and what is free. `check_resources` first, for the cluster as a whole."""
    ray = import_ray()
    from ray.util.placement_group import placement_group, remove_placement_group  # Ray's own, with Ray

    cpus = sum(b.get("CPU", 0) for b in bundles)
    gpus = sum(b.get("GPU", 0) for b in bundles)
    check_resources(what, cpus, gpus)
    group = placement_group(bundles, strategy="SPREAD")
    try:
        ray.get(group.ready(), timeout=seconds)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        free = ray.available_resources()
        raise ClusterError(f"the Ray cluster could not place {what} ({cpus:g} CPUs, {gpus:g} GPUs, at most one "
                           f"node's share each) within {seconds:g} s; free now: {free.get('CPU', 0):g} CPUs, "
                           f"{free.get('GPU', 0):g} GPUs, over {len(ray.nodes())} nodes. Add nodes or ask for fewer "
                           "(execution.ray.samplers, execution.ray.envWorkers)") from None
    return group


def in_group(group, index: int) -> dict:
    """Actor options that put an actor in bundle `index` of a placement group."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # Ray's own, with Ray
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=group,
                                                                    placement_group_bundle_index=index)}


def release(group) -> None:
    """Free a placement group's reservation (its actors are gone or going)."""
    if group is None:
        return
    from ray.util.placement_group import remove_placement_group  # Ray's own, with Ray
    try:
        remove_placement_group(group)
    except Exception:  # noqa: BLE001 - the cluster may be gone already
        pass


def raised_there(exc) -> Exception | None:
    """The exception an actor's method raised (a StropError saying what was wrong, as in-process), from the
    RayTaskError that carries it; None when Ray could not keep it."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, Exception) else None


def first_line(exc: BaseException, limit: int = 300) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:limit]


def stop_actors(ray, actors: list, group, *, close_first: bool = False) -> None:
    """Kill `actors` (each asked to `close()` first, when they hold environments or sandboxes) and free their
    placement group. Actors already gone are skipped."""
    for actor in actors:
        if close_first:
            try:
                ray.get(actor.close.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead actor has nothing left to close
                pass
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
    release(group)
