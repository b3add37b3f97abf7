"""The trainer on a Ray actor: `RemoteTrainer` has what `strop.client.TrainingClient` asks of a trainer
(forward_backward, forward, optim_step, adapter_weights, save_weights, save_state, load_state), so a run on Ray
trains in a process the cluster places (a GPU of its own where the cluster has one) while the run's own process,
the driver, plays the episodes and keeps the run folder.

    trainer = RemoteTrainer("strop/tiny-random", model_dir, settings=settings, rank=8, seed=0, dtype="auto")
    client = TrainingClient(backend, "strop/tiny-random", trainer)     # as with a LoraTrainer

Checkpoints and adapters come back to the driver's run folder as files (packed, sent, unpacked whole), and a
checkpoint to resume from goes the other way: the trainer's node needs no share of the driver's disk. A trainer
that dies fails the step with ClusterError; the run resumes from its last checkpoint with the same command.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from strop.cluster.connect import (ClusterError, connect, first_line, forwarded_env, in_group, place, raised_there,
                                   stop_actors)
from strop.cluster.folders import pack, unpack
from strop.cluster.settings import RaySettings
from strop.errors import StropError
from strop.files import check_regular

START_TIMEOUT_S = 900.0
MAX_STATE_BYTES = 8 << 30  # an adapter with its optimizer state: ~100 MiB for SmolLM2 at rank 32


class TrainerReplica:
    """A LoraTrainer in a Ray actor (wrapped by ray.remote in `RemoteTrainer`)."""

    def __init__(self, base_model: str, model_dir: str, options: dict, dtype: str):
        # lazy: the actor's process loads the trainer, the driver need not
        import torch

        from strop.engine.precision import resolve_dtype, torch_dtype
        from strop.engine.trainer import LoraTrainer
        from strop.models import resolve_model

        torch.set_num_threads(os.cpu_count() or 1)  # Ray sets one thread; the trainer is the node's main work
        path = model_dir if Path(model_dir).is_dir() else str(resolve_model(base_model))
        self.trainer = LoraTrainer(path, compute_dtype=torch_dtype(resolve_dtype(dtype)), **options)
        self.scratch = Path(tempfile.mkdtemp(prefix="strop-trainer-"))

    def where(self) -> dict:
        import ray  # the actor's process has Ray (this class runs only there)
        from strop.engine.precision import kernels
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()[:12],
                "dtype": str(self.trainer.compute_dtype).removeprefix("torch."), "kernels": kernels(),
                "modelDir": self.trainer.model_dir}

    def call(self, method: str, *args):
        return getattr(self.trainer, method)(*args)

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
    """A LoRA trainer on the cluster at `settings.address`, a GPU its own where the cluster has one."""

    def __init__(self, base_model: str, model_dir: str | Path, *, settings: RaySettings, dtype: str = "auto",
                 rank: int = 32, alpha: float | None = None, target_modules: list[str] | None = None, seed: int = 0):
        self.ray = ray = connect(settings.address)
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        self.group = place("the trainer", [{"GPU": 1} if gpus else {"CPU": 1}])
        actor = ray.remote(TrainerReplica).options(num_cpus=0 if gpus else 1, num_gpus=gpus, max_restarts=0,
                                                   runtime_env={"env_vars": forwarded_env()}, **in_group(self.group, 0))
        options = {"rank": rank, "alpha": alpha, "target_modules": target_modules, "seed": seed}
        self.actor = actor.remote(base_model, str(model_dir), options, dtype)
        try:
            self.facts = self._get(self.actor.where.remote(), START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        self.model_dir = str(model_dir)
        self.gpus = gpus
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
        self._get(self.actor.set_micro_batch_tokens.remote(int(tokens)))
        self._micro_batch_tokens = int(tokens)

    def _get(self, ref, timeout: float | None = None):
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(ref, timeout=timeout)
        except exceptions.GetTimeoutError:
            raise ClusterError(f"the trainer did not start within {timeout:g} s; `ray status` shows whether the "
                               "cluster has room for it") from None
        except exceptions.RayTaskError as exc:  # the trainer refused or failed: its own error, as in-process
            raise raised_there(exc) or ClusterError(f"the trainer failed: {exc}") from None
        except exceptions.RayActorError as exc:
            raise ClusterError(f"the trainer's process on the Ray cluster died ({first_line(exc)}); run the same "
                               "command again to resume from the last checkpoint") from None

    def forward_backward(self, datums, loss_fn="cross_entropy", loss_fn_config=None):
        return self._get(self.actor.call.remote("forward_backward", datums, loss_fn, loss_fn_config))

    def forward(self, datums, loss_fn="cross_entropy", loss_fn_config=None):
        return self._get(self.actor.call.remote("forward", datums, loss_fn, loss_fn_config))

    def optim_step(self, adam):
        return self._get(self.actor.call.remote("optim_step", adam))

    def adapter_weights(self):
        return self._get(self.actor.call.remote("adapter_weights"))

    def save_weights(self, path: str | Path) -> Path:
        return unpack(self._get(self.actor.save.remote("weights")), Path(path))

    def save_state(self, path: str | Path) -> Path:
        return unpack(self._get(self.actor.save.remote("state")), Path(path))

    def load_state(self, path: str | Path, with_optimizer: bool = True) -> None:
        weights = Path(path) / "adapter_model.safetensors"
        if not weights.exists():
            raise StropError(f"{path} holds no adapter_model.safetensors; pass a folder written by save_state or "
                             "save_weights")
        check_regular(weights, what="adapter weights")
        self._get(self.actor.load.remote(pack(Path(path), MAX_STATE_BYTES, "checkpoint"), with_optimizer))

    def close(self) -> None:
        stop_actors(self.ray, [self.actor], self.group)
