"""The local backend behind strop.client's clients: base models loaded once per process, one sampler engine per
base model (in this process, a vLLM process, or replicas on Ray), the trainers, and the queue that batches the
sample requests waiting for an engine until one of their results is read."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from strop.cluster.settings import RaySettings
from strop.engine.engine_choice import make_engine, resolve_sampler
from strop.engine.precision import SAMPLE_AS_TRAINER, resolve_dtype, sampler_dtype_for, torch_dtype, train_device
from strop.engine.resources import GIB, vllm_kv_budget, vllm_share_bytes
from strop.errors import StropError
from strop.models import load_tokenizer, resolve_model
from strop.types import SampleResponse

if TYPE_CHECKING:
    import torch

    from strop.engine.sampler import AdapterWeights, SampleRequest, SamplerEngine
    from strop.engine.trainer import SharedBase
# the engines (torch, transformers, peft: ~10 s to import on a slow CPU) are imported where one is made, so a command
# that only plans a run's memory (admission: `strop runs start`) or reads a model's files does not pay for them


class _SampleQueue:
    """Requests waiting for an engine; flushed together when any of their futures is read."""

    def __init__(self, engine: SamplerEngine):  # or any engine of its interface (strop.engine.vllm_engine)
        self.engine = engine
        self.pending: list[tuple[AdapterWeights | None, SampleRequest, Future]] = []
        self.lock = threading.Lock()

    def submit(self, adapter, request: SampleRequest) -> Callable[[], SampleResponse]:
        """Queue a request; what it returns gives its response, generating every queued request first if needed."""
        future: Future = Future()
        with self.lock:
            self.pending.append((adapter, request, future))

        def wait():
            if not future.done():
                self.flush()
            return future.result()
        return wait

    def flush(self) -> None:
        with self.lock:
            pending, self.pending = self.pending, []
            # one batch per adapter, in order of first appearance
            by_adapter: dict[int, list] = {}
            for item in pending:
                by_adapter.setdefault(id(item[0]), []).append(item)
            for items in by_adapter.values():
                try:
                    self.engine.activate(items[0][0])
                    responses = self.engine.generate([req for _, req, _ in items])
                except BaseException as exc:  # every waiter learns why, not only the first
                    for _, _, fut in items:
                        fut.set_exception(exc)
                    continue
                for (_, _, fut), response in zip(items, responses):
                    fut.set_result(response)


class LocalBackend:
    """Loads base models once per process and keeps one sampler engine per base model."""

    def __init__(self, dtype: str = "auto", max_batch: int = 64, sampler_dtype: str | None = None,
                 sampler: str | None = "auto", sampler_options: dict | None = None, ray: dict | None = None,
                 device: str | None = None, gpus: int | None = None):
        self.device = train_device(device)  # where the trainers compute: a CUDA GPU when torch sees one
        self.dtype = resolve_dtype(dtype, self.device)  # what they compute in, named once for the whole process
        # "trainer": a run's own rollouts, sampled in what its trainer computes in
        rollouts = sampler_dtype == SAMPLE_AS_TRAINER
        self.sampler_dtype = torch_dtype(sampler_dtype_for(dtype, self.device, rollouts=True) if rollouts
                                         else sampler_dtype or sampler_dtype_for(dtype, self.device))
        self.sampler = resolve_sampler(sampler)  # which engine samples: "strop" or "vllm"
        self.sampler_options = dict(sampler_options or {})
        # on Ray, each replica decides `auto` (sampler and dtype) for the hardware it runs on
        self._choices = {"sampler": sampler or "auto", "dtype": dtype if rollouts else sampler_dtype or dtype,
                         "rollouts": rollouts, "trainer_dtype": dtype}
        self.ray = RaySettings.from_spec(ray) if ray is not None else RaySettings.from_environment()
        self.gpus = gpus  # the run's execution.gpus: on Ray, 0 keeps the trainers and samplers off the GPUs
        self._trainers: list = []  # trainers on the Ray cluster, stopped with the backend
        self._evaluations: LocalBackend | None = None  # where a run's evaluations sample (for_evaluations)
        self.max_batch = max_batch
        self._queues: dict[str, _SampleQueue] = {}
        self._bases: dict[tuple[str, torch.dtype], SharedBase] = {}
        self._bases_lock = threading.Lock()

    def shared_base(self, base_model: str, dtype: torch.dtype) -> SharedBase:
        """The base model's frozen weights for trainers, loaded once per process and dtype: every training
        client on this backend shares them (each with its own adapter and optimizer)."""
        key = (str(self.model_dir(base_model)), dtype)
        with self._bases_lock:
            if key not in self._bases:
                from strop.engine.trainer import SharedBase  # lazy: torch, transformers, peft (see the top)
                self._bases[key] = SharedBase(key[0], dtype, self.device)
            return self._bases[key]

    def model_dir(self, base_model: str) -> Path:
        return resolve_model(base_model)

    def tokenizer(self, base_model: str):
        return load_tokenizer(base_model)

    def queue(self, base_model: str) -> _SampleQueue:
        path = str(self.model_dir(base_model))
        queue = self._queues.get(path)
        if queue is not None and not queue.engine.alive:
            # a vLLM engine whose process died: its step failed with the cause; the next request starts another
            self._queues.pop(path).engine.close()
            queue = None
        if queue is None and self.ray is not None:
            from strop.cluster.samplers import RaySamplerEngine  # lazy: Ray is an extra
            engine = RaySamplerEngine(base_model, path, settings=self.ray, sampler=self._choices["sampler"],
                                      dtype=self._choices["dtype"], rollouts=self._choices["rollouts"],
                                      max_batch=self.max_batch, options=self.sampler_options,
                                      reserved_gpus=sum(t.gpus for t in self._trainers), run_gpus=self.gpus)
            queue = self._queues[path] = _SampleQueue(engine)
        if queue is None:
            options = self.sampler_options if self.sampler == "vllm" else {}  # the vLLM engine's settings
            engine = make_engine(self.sampler, path, tokenizer=self.tokenizer(base_model), dtype=self.sampler_dtype,
                                 max_batch=self.max_batch, device=self.device, **options)
            queue = self._queues[path] = _SampleQueue(engine)
        return queue

    def memory_where(self, model_dir: Path, *, rows: int, seq: int) -> dict:
        """The memory plan's view of this backend (strop.engine.resources.estimate_grpo_memory's arguments): the
        bytes a weight takes in the trainer and the sampler, which sampler, where the trainers compute. A vLLM
        engine not yet started is given the KV cache this plan counts (`vllm_kv_budget`, unless kv_cache_gb or
        STROP_VLLM_KV_CACHE_GB says), and on a GPU the share of it that budget makes, so beside the trainer it
        takes what the run needs rather than a fixed fraction of the device. On Ray the replicas' machines plan
        for themselves: the float32 CPU estimate stands."""
        if self.ray is not None:
            return {}
        sampler_bytes = self.sampler_dtype.itemsize
        where = {"trainer_bytes": torch_dtype(self.dtype).itemsize, "sampler_bytes": sampler_bytes,
                 "sampler": self.sampler, "device": self.device}
        if self.sampler != "vllm":
            return where
        given = self.sampler_options.get("kv_cache_gb") or os.environ.get("STROP_VLLM_KV_CACHE_GB")
        try:
            budget = int(float(given) * GIB) if given else None
        except (ValueError, OverflowError, TypeError):  # nan, inf, not a number
            budget = -1
        if budget is not None and not 0 < budget < 1024 * GIB:
            raise StropError(f"the vLLM KV cache (STROP_VLLM_KV_CACHE_GB, kv_cache_gb) must be a number of GiB "
                             f"between 0 and 1024, such as 2; got {str(given)[:40]!r}")
        if budget is None:
            budget = vllm_kv_budget(model_dir, rows=min(rows, self.max_batch), seq=seq, dtype_bytes=sampler_bytes,
                                    max_model_len=self.sampler_options.get("max_model_len"))
            if str(model_dir) not in self._queues:  # an engine already running keeps what it was given
                self.sampler_options["kv_cache_gb"] = budget / GIB
        if self.device.startswith("cuda") and str(model_dir) not in self._queues:
            self.sampler_options.setdefault("gpu_memory_bytes", vllm_share_bytes(model_dir, budget, sampler_bytes,
                                                                                 self.max_batch))
        return {**where, "sampler_kv_bytes": budget}

    def sampler_facts(self) -> dict:
        """Which engine samples, and (for vLLM, once started) its version, device and how adapters reach it."""
        facts = {"sampler": self.sampler}
        for queue in self._queues.values():
            facts.update(queue.engine.facts)
        return facts

    def trainer(self, base_model: str, *, dtype: str | None, **options):
        """A LoRA trainer for `base_model`: in this process, or, on Ray, on an actor the cluster places
        (strop.cluster.trainer) that computes in `dtype` as that machine resolves it."""
        if self.ray is not None:
            from strop.cluster.trainer import RemoteTrainer  # lazy: Ray is an extra
            trainer = RemoteTrainer(base_model, self.model_dir(base_model), settings=self.ray,
                                    dtype=dtype or self._choices["trainer_dtype"] or "auto", run_gpus=self.gpus,
                                    **options)
            self._trainers.append(trainer)
            return trainer
        from strop.engine.trainer import LoraTrainer  # lazy: torch, transformers, peft (see the top)
        compute = torch_dtype(dtype or self.dtype)
        return LoraTrainer(self.model_dir(base_model), compute_dtype=compute,
                           shared_base=self.shared_base(base_model, compute), **options)

    def for_evaluations(self) -> LocalBackend:
        """The backend an evaluation of this backend's weights samples on: this one, unless it samples a run's
        rollouts in another dtype than evaluations do (bf16 rollouts, float32 evaluations on a CPU under auto);
        then another, made once, whose sampler loads the base model in the evaluations' dtype."""
        wanted = torch_dtype(sampler_dtype_for(self._choices["trainer_dtype"], self.device))
        if wanted == self.sampler_dtype:
            return self
        if self._evaluations is None:
            self._evaluations = LocalBackend(dtype=self._choices["trainer_dtype"], max_batch=self.max_batch,
                                             sampler=self._choices["sampler"], sampler_options=self.sampler_options,
                                             device=self.device, gpus=self.gpus)
        return self._evaluations

    def close(self) -> None:
        """Stop the sampler engines (a vLLM engine's process) and trainers on Ray; clients made from this backend
        start them again."""
        if self._evaluations is not None:
            self._evaluations.close()
        for queue in self._queues.values():
            queue.engine.close()
        self._queues.clear()
        for trainer in self._trainers:
            trainer.close()
        self._trainers.clear()
