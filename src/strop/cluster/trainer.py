"""The trainer on Ray actors: `RemoteTrainer` has what `strop.client.TrainingClient` asks of a trainer
(forward_backward, forward, optim_step, adapter_weights, save_weights, save_state, load_state), so a run on Ray
trains in processes the cluster places (a GPU each where the cluster has them) while the run's own process, the
driver, plays the episodes and keeps the run folder.

    trainer = RemoteTrainer("strop/tiny-random", model_dir, settings=settings, rank=8, seed=0, dtype="auto")
    client = TrainingClient(backend, "strop/tiny-random", trainer)     # as with a LoraTrainer

With `settings.trainers` = N > 1 the trainer is data-parallel: N replicas start from the same seed (so the same
adapter), each forward_backward's datums are cut into N shares of about equal tokens, one a replica, and
optim_step sums the replicas' gradients with torch.distributed (NCCL where the weights are on CUDA, else gloo)
before each replica
takes the same AdamW step. The losses are sums over tokens, so the update is the one trainer's update on the
whole batch, up to the order of float sums; the replicas' adapters stay identical and the first one's is the
one saved and sampled.

Checkpoints and adapters come back to the driver's run folder as files (packed, sent, unpacked whole), and a
checkpoint to resume from goes the other way (to every replica): the trainers' nodes need no share of the
driver's disk. A trainer that dies fails the step with ClusterError (the others are stopped); the run resumes
from its last checkpoint with the same command.
"""

from __future__ import annotations

import os
import socket
import tempfile
from datetime import timedelta
from pathlib import Path

from strop.cluster.connect import (ClusterError, actor_env, connect, first_line, in_group, place, raised_there,
                                   stop_actors)
from strop.cluster.folders import pack, unpack
from strop.cluster.settings import RaySettings
from strop.errors import StropError
from strop.files import check_regular

START_TIMEOUT_S = 900.0
JOIN_TIMEOUT_S = 300.0       # the replicas joining one process group; a collective that waits longer has lost one
MAX_STATE_BYTES = 8 << 30  # an adapter with its optimizer state: ~100 MiB for SmolLM2 at rank 32


class TrainerReplica:
    """A LoraTrainer in a Ray actor (wrapped by ray.remote in `RemoteTrainer`); one of `world` data-parallel
    replicas once `join` has put it in their process group."""

    def __init__(self, base_model: str, model_dir: str, options: dict, dtype: str):
        # lazy: the actor's process loads the trainer, the driver need not
        import torch

        from strop.engine.precision import resolve_dtype, torch_dtype, train_device
        from strop.engine.trainer import LoraTrainer
        from strop.models import resolve_model

        torch.set_num_threads(os.cpu_count() or 1)  # Ray sets one thread; the trainer is the node's main work
        path = model_dir if Path(model_dir).is_dir() else str(resolve_model(base_model))
        device = train_device()  # the GPU Ray gave this actor, where it has one
        self.trainer = LoraTrainer(path, compute_dtype=torch_dtype(resolve_dtype(dtype, device)), device=device,
                                   **options)
        self.scratch = Path(tempfile.mkdtemp(prefix="strop-trainer-"))
        self.world = 1

    def where(self) -> dict:
        import ray  # the actor's process has Ray (this class runs only there)
        from strop.engine.precision import kernels
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()[:12],
                "dtype": str(self.trainer.compute_dtype).removeprefix("torch."), "kernels": kernels(),
                "device": str(self.trainer.trainable_parameters()[0].device), "modelDir": self.trainer.model_dir}

    def share_cores(self, replicas_here: int) -> int:
        """Use this node's cores with the other replicas on it: each its share of the threads."""
        import torch  # the actor's process has torch (this class runs only there)
        threads = max(1, (os.cpu_count() or 1) // replicas_here)
        torch.set_num_threads(threads)
        return threads

    def endpoint(self) -> tuple[str, int]:
        """An address the other replicas can reach this one at, for the process group's rendezvous."""
        import ray  # the actor's process has Ray (this class runs only there)
        with socket.socket() as probe:  # a port free now; the rendezvous binds it moments later
            probe.bind(("", 0))
            return ray.util.get_node_ip_address(), probe.getsockname()[1]

    def join(self, host: str, port: int, rank: int, world: int, backend: str) -> None:
        import torch.distributed as dist  # the actor's process has torch (this class runs only there)
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=JOIN_TIMEOUT_S))
        self.world = world

    def call(self, method: str, *args):
        return getattr(self.trainer, method)(*args)

    def optim_step(self, adam):
        if self.world > 1:
            self._sum_gradients()
        return self.trainer.optim_step(adam)

    def _sum_gradients(self) -> None:
        """Every replica's gradient becomes the sum over replicas (one all-reduce of all of them); a parameter
        no replica has a gradient for keeps none, as on one trainer."""
        import torch  # the actor's process has torch (this class runs only there)
        import torch.distributed as dist
        params = self.trainer.trainable_parameters()
        has = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        # a replica whose share had a non-finite loss skips the step: so must every other, or they drift apart
        nonfinite = torch.tensor([float(self.trainer.pending_nonfinite)], device=params[0].device)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        dist.all_reduce(nonfinite)
        dist.all_reduce(flat)
        self.trainer.pending_nonfinite = int(nonfinite.item())
        offset = 0
        for p, present in zip(params, has.tolist()):
            p.grad = flat[offset:offset + p.numel()].view_as(p) if present else None
            offset += p.numel()

    def set_micro_batch_tokens(self, tokens: int) -> None:
        self.trainer.max_tokens_per_batch = tokens

    def save(self, kind: str) -> bytes:
        folder = self.scratch / kind
        getattr(self.trainer, f"save_{kind}")(folder)
        return pack(folder, MAX_STATE_BYTES, f"the trainer's {kind}")

    def load(self, data: bytes, with_optimizer: bool) -> None:
        folder = unpack(data, self.scratch / "loaded")
        self.trainer.load_state(folder, with_optimizer=with_optimizer)


class RemoteTrainer:
    """A LoRA trainer on the cluster at `settings.address`: `settings.trainers` data-parallel replicas, a GPU
    each where the cluster has enough of them, unless the run's execution.gpus (`run_gpus`) is 0: then every replica
    takes a CPU and computes on it, whatever GPUs its node has."""

    def __init__(self, base_model: str, model_dir: str | Path, *, settings: RaySettings, dtype: str = "auto",
                 rank: int = 32, alpha: float | None = None, target_modules: list[str] | None = None, seed: int = 0,
                 run_gpus: int | None = None):
        self.ray = ray = connect(settings.address)
        n = settings.trainers
        have = ray.cluster_resources().get("GPU", 0) if run_gpus != 0 else 0
        if 0 < have < n:
            raise ClusterError(f"{n} data-parallel trainers take a GPU each, and the Ray cluster has {have:g}: ask "
                               f"for at most {int(have)} (execution.ray.trainers, execution.gpus) or add GPU nodes")
        gpus = 1 if have >= n else 0
        what = "the trainer" if n == 1 else f"{n} data-parallel trainers"
        self.group = place(what, [{"GPU": 1} if gpus else {"CPU": 1}] * n)
        actor = ray.remote(TrainerReplica)
        options = {"rank": rank, "alpha": alpha, "target_modules": target_modules, "seed": seed}
        self.actors = [actor.options(num_cpus=0 if gpus else 1, num_gpus=gpus, max_restarts=0,
                                     runtime_env={"env_vars": actor_env(run_gpus)}, **in_group(self.group, i)
                                     ).remote(base_model, str(model_dir), options, dtype) for i in range(n)]
        try:
            placed = self._all([a.where.remote() for a in self.actors], START_TIMEOUT_S)
            self.facts = placed[0]
            if n > 1:
                on_gpus = all(p["device"].startswith("cuda") for p in placed)  # NCCL sums CUDA tensors only
                self.facts = {**placed[0], "dataParallel": n, "backend": "nccl" if on_gpus else "gloo",
                              "replicas": placed}
                on_node = [sum(p["node"] == q["node"] for q in placed) for p in placed]
                threads = self._all([a.share_cores.remote(k) for a, k in zip(self.actors, on_node)])
                for facts, count in zip(placed, threads):
                    facts["threads"] = count
                host, port = self._get(self.actors[0].endpoint.remote())
                self._all([a.join.remote(host, port, i, n, self.facts["backend"]) for i, a in enumerate(self.actors)],
                          JOIN_TIMEOUT_S + 30)
        except BaseException:
            self.close()
            raise
        self.model_dir = str(model_dir)
        self.gpus = gpus * n
        self._micro_batch_tokens = None

    @property
    def compute_dtype(self):
        import torch  # the driver has torch: it renders and samples
        return getattr(torch, self.facts["dtype"])

    @property
    def max_tokens_per_batch(self):
        return self._micro_batch_tokens

    @max_tokens_per_batch.setter
    def max_tokens_per_batch(self, tokens: int) -> None:
        self._all([a.set_micro_batch_tokens.remote(int(tokens)) for a in self.actors])
        self._micro_batch_tokens = int(tokens)

    def _get(self, ref, timeout: float | None = None):
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(ref, timeout=timeout)
        except exceptions.GetTimeoutError:
            raise ClusterError(f"the trainer did not start within {timeout:g} s (or its data-parallel replicas did "
                               "not reach each other); `ray status` shows whether the cluster has room for "
                               "it") from None
        except exceptions.RayTaskError as exc:  # the trainer refused or failed: its own error, as in-process
            raise raised_there(exc) or ClusterError(f"the trainer failed: {exc}") from None
        except exceptions.RayActorError as exc:
            if len(self.actors) > 1:  # the others would wait in the next all-reduce for one that is gone
                self.close()
            raise ClusterError(f"the trainer's process on the Ray cluster died ({first_line(exc)}); run the same "
                               "command again to resume from the last checkpoint") from None

    def _all(self, refs: list, timeout: float | None = None) -> list:
        """Every replica's answer, or the first failure as soon as it happens (not after the others finish)."""
        pending = list(refs)
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1, timeout=timeout)
            if not ready:
                self._get(pending[0], timeout=0)  # raises the timeout's ClusterError
            self._get(ready[0])
        return [self._get(ref) for ref in refs]

    def _shares(self, datums: list) -> list[list[int]]:
        """The datums cut into one run of neighbours per replica, of about equal tokens (a GRPO group's datums
        are neighbours and share their prompt, which a replica computes once)."""
        n = len(self.actors)
        sizes = [d.model_input.length for d in datums]
        total, shares, done = sum(sizes), [[] for _ in range(n)], 0
        for i, size in enumerate(sizes):
            k = min(n - 1, int(n * (done + size / 2) / max(total, 1)))
            shares[k].append(i)
            done += size
        return shares

    def _sharded(self, method: str, datums, loss_fn, loss_fn_config):
        from strop.engine.trainer import check_datums  # the driver has torch: it renders and samples
        from strop.types import ForwardBackwardOutput
        if len(self.actors) == 1:
            return self._get(self.actors[0].call.remote(method, datums, loss_fn, loss_fn_config))
        check_datums(datums, loss_fn)  # refused here, before any replica accumulates a gradient
        shares = [share for share in self._shares(datums) if share]
        results = self._all([a.call.remote(method, [datums[i] for i in share], loss_fn, loss_fn_config)
                             for a, share in zip(self.actors, shares)])
        outputs: list = [None] * len(datums)
        metrics: dict[str, float] = {}
        for share, result in zip(shares, results):
            for i, out in zip(share, result.loss_fn_outputs):
                outputs[i] = out
            for key, value in result.metrics.items():
                metrics[key] = (max(metrics.get(key, value), value) if key.endswith(":max") else
                                metrics.get(key, 0.0) + value)
        return ForwardBackwardOutput(loss_fn_output_type=loss_fn, loss_fn_outputs=outputs, metrics=metrics)

    def forward_backward(self, datums, loss_fn="cross_entropy", loss_fn_config=None):
        return self._sharded("forward_backward", datums, loss_fn, loss_fn_config)

    def forward(self, datums, loss_fn="cross_entropy", loss_fn_config=None):
        return self._sharded("forward", datums, loss_fn, loss_fn_config)

    def optim_step(self, adam):
        return self._all([a.optim_step.remote(adam) for a in self.actors])[0]  # the same step on every replica

    def adapter_weights(self):
        return self._get(self.actors[0].call.remote("adapter_weights"))

    def replica_weights(self) -> list:
        """Each replica's LoRA tensors (they stay identical; for checks)."""
        return self._all([a.call.remote("lora_state_dict") for a in self.actors])

    def save_weights(self, path: str | Path) -> Path:
        return unpack(self._get(self.actors[0].save.remote("weights")), Path(path))

    def save_state(self, path: str | Path) -> Path:
        return unpack(self._get(self.actors[0].save.remote("state")), Path(path))

    def load_state(self, path: str | Path, with_optimizer: bool = True) -> None:
        weights = Path(path) / "adapter_model.safetensors"
        if not weights.exists():
            raise StropError(f"{path} holds no adapter_model.safetensors; pass a folder written by save_state or "
                             "save_weights")
        check_regular(weights, what="adapter weights")
        data = self.ray.put(pack(Path(path), MAX_STATE_BYTES, "checkpoint"))
        self._all([a.load.remote(data, with_optimizer) for a in self.actors])

    @property
    def device(self):
        """None: it computes on the cluster's actors (`facts` says where)."""
        return None

    def close(self) -> None:
        stop_actors(self.ray, self.actors, self.group)
