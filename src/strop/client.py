"""The Tinker-style clients: ServiceClient -> TrainingClient / SamplingClient, with futures.

    service = strop.ServiceClient()                                     # local backend
    training = service.create_lora_training_client(base_model="strop/tiny-random", rank=8)
    sampler = training.save_weights_and_get_sampling_client(name="step-0")
    seqs = sampler.sample(prompt=mi, num_samples=4, sampling_params=params).result().sequences
    training.forward_backward(datums, loss_fn="importance_sampling").result()
    training.optim_step(types.AdamParams(learning_rate=1e-4)).result()

Sampling and training are separate objects that share only weights: a SamplingClient holds an adapter
snapshot, and the engine it runs on merges that snapshot in when it samples. `sample()` returns at once;
the first `.result()` generates every request queued on that engine in one batch, which is how a loop that
submits a hundred prompts before collecting any gets batched generation without threads.
"""

from __future__ import annotations

import difflib
import json
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from strop.engine.resources import GIB, plan_grpo_memory, vllm_kv_budget, vllm_share_bytes
from strop.engine.engine_choice import check_sampler, make_engine, resolve_sampler
from strop.engine.vllm_find import require_vllm  # noqa: F401  (the loop checks the sampler through the client)
from strop.engine.precision import (check_dtype, engine_facts, gpus_value_problem, resolve_dtype, run_device,
                                    sampler_dtype_for, torch_dtype, train_device)
from strop.cluster.settings import RaySettings
from strop.errors import StropError
from strop.files import check_regular
from strop.models import CATALOG, load_tokenizer, resolve_model
from strop.paths import strop_home
from strop.types import (AdamParams, Datum, ForwardBackwardOutput, ModelInput, OptimStepResponse, SampleResponse,
                         SamplingParams, SaveWeightsResponse)

if TYPE_CHECKING:
    import torch

    from strop.engine.sampler import AdapterWeights, SamplerEngine
    from strop.engine.trainer import LoraTrainer, SharedBase
# the engines (torch, transformers, peft: ~10 s to import on a slow CPU) are imported where one is made, so a command
# that only plans a run's memory (admission: `strop runs start`) or reads a model's files does not pay for them

MAX_TOPK = 128   # top-k logprobs per position: a teacher's distribution for distillation needs tens, not thousands


class APIFuture:
    """A result that is ready now or computed on first `.result()`; `result()` may be called many times."""

    def __init__(self, compute=None, value=None):
        self._compute, self._value, self._done = compute, value, compute is None

    @classmethod
    def of(cls, value) -> APIFuture:
        return cls(value=value)

    def result(self, timeout: float | None = None):
        if not self._done:
            self._value = self._compute()
            self._done, self._compute = True, None
        return self._value

    async def result_async(self):
        return self.result()

    def done(self) -> bool:
        return self._done


class _SampleQueue:
    """Requests waiting for an engine; flushed together when any of their futures is read."""

    def __init__(self, engine: SamplerEngine):  # or any engine of its interface (strop.engine.vllm_engine)
        self.engine = engine
        self.pending: list[tuple[AdapterWeights | None, SampleRequest, Future]] = []
        self.lock = threading.Lock()

    def submit(self, adapter, request: SampleRequest) -> APIFuture:
        future: Future = Future()
        with self.lock:
            self.pending.append((adapter, request, future))

        def wait():
            if not future.done():
                self.flush()
            return future.result()
        return APIFuture(wait)

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
        self.sampler_dtype = torch_dtype(sampler_dtype or sampler_dtype_for(dtype, self.device))
        self.sampler = resolve_sampler(sampler)  # which engine samples: "strop" or "vllm"
        self.sampler_options = dict(sampler_options or {})
        # on Ray, each replica decides `auto` (sampler and dtype) for the hardware it runs on
        self._choices = {"sampler": sampler or "auto", "dtype": sampler_dtype or dtype, "trainer_dtype": dtype}
        self.ray = RaySettings.from_spec(ray) if ray is not None else RaySettings.from_environment()
        self.gpus = gpus  # the run's execution.gpus: on Ray, 0 keeps the trainers and samplers off the GPUs
        self._trainers: list = []  # trainers on the Ray cluster, stopped with the backend
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
                                      dtype=self._choices["dtype"], max_batch=self.max_batch,
                                      options=self.sampler_options,
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

    def close(self) -> None:
        """Stop the sampler engines (a vLLM engine's process) and trainers on Ray; clients made from this backend
        start them again."""
        for queue in self._queues.values():
            queue.engine.close()
        self._queues.clear()
        for trainer in self._trainers:
            trainer.close()
        self._trainers.clear()


class SamplingClient:
    """Samples from fixed weights: a base model plus (optionally) one adapter snapshot."""

    def __init__(self, backend: LocalBackend, base_model: str, adapter: AdapterWeights | None = None,
                 model_path: str | None = None):
        self.backend, self.base_model, self.adapter, self.model_path = backend, base_model, adapter, model_path
        self._queue = backend.queue(base_model)

    def sample(self, prompt: ModelInput, num_samples: int = 1, sampling_params: SamplingParams | None = None,
               include_prompt_logprobs: bool = False, *, resumed: int = 0, generators: list | None = None) -> APIFuture:
        """`resumed` (a strop extension): the prompt's last `resumed` tokens are the sample's own output so far, a
        generation continued in chunks; a json_schema grammar takes them first (see `continues_grammar`).
        `generators` (a strop extension, where `continues_samples`): each sample's torch.Generator, to be carried to
        the sample's next chunk, so a generation served in chunks draws what it would have drawn whole."""
        if num_samples < 1:
            raise StropError(f"num_samples must be at least 1, got {num_samples}")
        if prompt.length == 0:
            raise StropError("cannot sample from an empty prompt; build one with renderer.build_generation_prompt(messages)")
        from strop.engine.sampler import SampleRequest  # lazy: transformers (see the top)
        if not 0 <= resumed <= prompt.length:
            raise StropError(f"resumed must be between 0 and the prompt's {prompt.length} tokens, got {resumed}")
        if generators is not None and not self.continues_samples:
            raise StropError("this sampling engine cannot continue a sample's random draws; sample without generators")
        request = SampleRequest(prompt_tokens=prompt.to_ints(), num_samples=num_samples,
                                params=sampling_params or SamplingParams(), resumed=resumed, generators=generators)
        return self._queue.submit(self.adapter, request)

    @property
    def continues_grammar(self) -> bool:
        """Whether this client's engine can continue a json_schema sample from its own output (`resumed`)."""
        return self._queue.engine.continues_grammar

    @property
    def continues_samples(self) -> bool:
        """Whether this client's engine takes each sample's random generator (`sample(generators=...)`); vLLM and
        Ray replicas, in other processes, do not."""
        return self._queue.engine.continues_samples

    def compute_logprobs(self, prompt: ModelInput) -> APIFuture:
        """Each token's logprob given those before it (None for the first), under this client's weights."""
        many = self.compute_logprobs_many([prompt])
        return APIFuture(lambda: many.result()[0])

    def compute_logprobs_many(self, prompts: list[ModelInput]) -> APIFuture:
        """`compute_logprobs` for several inputs in batched forward passes (a strop extension)."""
        engine = self._queue.engine

        def compute():
            with self._queue.lock:
                engine.activate(self.adapter)
                return engine.prompt_logprobs([p.to_ints() for p in prompts])
        return APIFuture(compute)

    def compute_topk_logprobs_many(self, sequences: list[ModelInput], k: int) -> APIFuture:
        """At each position of each input, the `k` likeliest tokens and their logprobs given what comes before
        (None at the first position), under this client's weights: a teacher's view of a student's text, what the
        tinker SDK's `topk_prompt_logprobs` and `topk_sample_logprobs` return (a strop extension)."""
        if not 1 <= k <= MAX_TOPK:
            raise StropError(f"top-k logprobs take k in 1..{MAX_TOPK}, got {k}")
        engine = self._queue.engine

        def compute():
            with self._queue.lock:
                engine.activate(self.adapter)
                return engine.prompt_topk([p.to_ints() for p in sequences], k)
        return APIFuture(compute)

    def get_tokenizer(self):
        return self.backend.tokenizer(self.base_model)


class TrainingClient:
    """A LoRA adapter being trained on a base model."""

    def __init__(self, backend: LocalBackend, base_model: str, trainer: LoraTrainer):
        self.backend, self.base_model, self.trainer = backend, base_model, trainer
        self._saves = 0

    def forward_backward(self, data: list[Datum], loss_fn: str = "cross_entropy",
                         loss_fn_config: dict | None = None) -> APIFuture:
        return APIFuture.of(self.trainer.forward_backward(list(data), loss_fn, loss_fn_config))

    def set_micro_batch_tokens(self, tokens: int) -> None:
        """Most tokens per micro-batch of forward_backward (a strop extension: smaller ones use less memory
        and give the same gradients, which add up across micro-batches)."""
        self.trainer.max_tokens_per_batch = max(1, int(tokens))

    def forward(self, data: list[Datum], loss_fn: str = "cross_entropy",
                loss_fn_config: dict | None = None) -> APIFuture:
        return APIFuture.of(self.trainer.forward(list(data), loss_fn, loss_fn_config))

    def optim_step(self, adam_params: AdamParams) -> APIFuture:
        return APIFuture.of(OptimStepResponse(metrics=self.trainer.optim_step(adam_params)))

    def _path(self, name: str | None, kind: str) -> Path:
        if name and (Path(name).is_absolute() or "/" in name or name.startswith(".")):
            return Path(name)
        self._saves += 1
        return strop_home() / kind / (name or f"{Path(self.trainer.model_dir).name}-{self._saves:04d}")

    def save_weights(self, name: str | None = None) -> APIFuture:
        """Write the adapter as a PEFT directory (a name goes under $STROP_HOME/weights; a path is used as is)."""
        path = self.trainer.save_weights(self._path(name, "weights"))
        return APIFuture.of(SaveWeightsResponse(path=str(path)))

    def save_state(self, name: str | None = None) -> APIFuture:
        path = self.trainer.save_state(self._path(name, "states"))
        return APIFuture.of(SaveWeightsResponse(path=str(path)))

    def load_state(self, path: str) -> APIFuture:
        self.trainer.load_state(path)
        return APIFuture.of(SaveWeightsResponse(path=str(path)))

    def save_weights_for_sampler(self, name: str | None = None) -> APIFuture:
        return self.save_weights(name)

    def save_weights_and_get_sampling_client(self, name: str | None = None) -> SamplingClient:
        """A sampling client on the current weights. With a name the adapter is also written to disk."""
        path = str(self.trainer.save_weights(self._path(name, "weights"))) if name else None
        return SamplingClient(self.backend, self.base_model, adapter=self.trainer.adapter_weights(), model_path=path)

    def get_tokenizer(self):
        return self.backend.tokenizer(self.base_model)

    def engine_facts(self) -> dict:
        """What this client trains and its sampling clients sample in, and on which CPU kernels (a strop
        extension: runs record it in engine.json)."""
        placed = {"trainer": self.trainer.facts} if self.trainer.facts else {}  # on Ray: where it ran
        if self.trainer.device is not None:
            placed["trainerDevice"] = str(self.trainer.device)
        return {**engine_facts(self.trainer.compute_dtype, self.backend.sampler_dtype), **self.backend.sampler_facts(),
                **placed}


# what tinker.ServiceClient(...) passes on to its HTTP client: accepted by strop's, where they mean nothing
TINKER_OPTIONS = frozenset({"api_key", "base_url", "user_metadata", "project_id", "timeout", "max_retries",
                            "default_headers", "default_query", "http_client", "_strict_response_validation"})
OWN_OPTIONS = ("backend", "dtype", "max_batch", "sampler_dtype", "sampler", "sampler_options", "ray", "device", "gpus")


def _refuse_unknown_options(options: dict) -> None:
    unknown = sorted(set(options) - TINKER_OPTIONS)
    if not unknown:
        return
    hints = []
    for name in unknown:
        near = difflib.get_close_matches(name, [*OWN_OPTIONS, *sorted(TINKER_OPTIONS)], n=1)
        hints.append(f"{name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    raise StropError(f"ServiceClient got unknown option(s) {', '.join(hints)}; it takes {', '.join(OWN_OPTIONS)}, "
                     "and tinker's own options (api_key, base_url, ...), which mean nothing in this process")


class ServiceClient:
    """Entry point. `backend="local"` trains and samples in this process on CPU (or CUDA when present)."""

    def __init__(self, backend: str = "local", dtype: str = "auto", max_batch: int = 64,
                 sampler_dtype: str | None = None, sampler: str = "auto", sampler_options: dict | None = None,
                 ray: dict | None = None, device: str | None = None, gpus: int | None = None, **tinker_options):
        """`dtype`: what training and sampling compute in: "auto" (training in bfloat16 where the hardware has
        bf16 units, float32 elsewhere; sampling in float32 on a CPU: strop.engine.precision), "float32" or
        "bfloat16" (both); `sampler_dtype` overrides it for the sampler alone. LoRA weights, logprobs and losses
        are float32 either way. `sampler`: which engine samples, "auto" (strop.engine.engine_choice), "strop" or
        "vllm" (`pip install -e ".[vllm]"`); `sampler_options` go to that engine (vLLM: sync="merged"|"lora").
        `ray`: {"address": "auto" | "HOST:PORT", "samplers": N} samples on N replicas on that Ray cluster
        (strop.cluster; `pip install -e ".[ray]"`), training staying in this process; None: STROP_RAY_ADDRESS
        and STROP_RAY_SAMPLERS when set (what `--ray-address` sets for a command's work), else in this process.
        `device`: where this process's trainers and strop's sampler compute, "cpu", "cuda" or "cuda:N"; None: a
        CUDA GPU where torch sees one, else the CPU (STROP_DEVICE overrides; strop.engine.precision.train_device).
        `gpus`: a run's execution.gpus, deciding the device when `device` is not given (0: the CPU; 1: the GPU
        where there is one; more is refused: strop.engine.precision.run_device). On Ray the cluster's GPUs are
        the replicas' (a GPU each where there are enough), except that 0 keeps every replica on its CPU.

        The options tinker's ServiceClient takes (`api_key`, `base_url`, `user_metadata`, `project_id`, `timeout`,
        ...) are accepted, so code written for Tinker runs unchanged, and mean nothing in this process; any other
        name is refused, with the nearest one this client takes."""
        _refuse_unknown_options(tinker_options)
        if backend != "local":
            raise StropError(f"unknown backend {backend!r}; strop has the 'local' backend")
        check_dtype(dtype)
        check_sampler(sampler)
        if sampler_dtype is not None:
            check_dtype(sampler_dtype, what="sampler_dtype")
        if problem := gpus_value_problem(gpus):  # on Ray too, where the count is the cluster's
            raise StropError(f"gpus {problem}")
        on_ray = ray is not None or RaySettings.from_environment() is not None
        if device is None and gpus is not None and (gpus == 0 or not on_ray):  # on Ray the cluster counts them
            device = run_device(gpus)
        self.backend = LocalBackend(dtype=dtype, max_batch=max_batch, sampler_dtype=sampler_dtype, sampler=sampler,
                                    sampler_options=sampler_options, ray=ray, device=device, gpus=gpus)

    @property
    def dtype(self) -> str:
        """"float32" or "bfloat16": what this client's trainers and samplers compute in."""
        return self.backend.dtype

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: int | None = None,
                                    alpha: float | None = None, target_modules: list[str] | None = None,
                                    dtype: str | None = None, **_tinker_only) -> TrainingClient:
        trainer = self.backend.trainer(base_model, dtype=dtype, rank=rank, alpha=alpha, target_modules=target_modules,
                                       seed=seed or 0)
        return TrainingClient(self.backend, base_model, trainer)

    def create_training_client_from_adapter(self, base_model: str, adapter: str | Path, seed: int | None = None,
                                            dtype: str | None = None) -> TrainingClient:
        """A LoRA training client that starts from a saved adapter's weights, with its rank, alpha and target
        modules (a strop extension: GRPO continuing from a supervised warm start). The optimizer starts fresh."""
        config_file = Path(adapter) / "adapter_config.json"
        try:
            for name in ("adapter_config.json", "adapter_model.safetensors"):
                check_regular(Path(adapter) / name, what=f"adapter file {name}")  # a FIFO would block the read
            settings = json.loads(config_file.read_text())
            rank, alpha, targets = int(settings["r"]), settings.get("lora_alpha"), settings.get("target_modules")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StropError(f"{adapter} is not a LoRA adapter folder (its adapter_config.json: {exc}); pass a "
                             "folder TrainingClient.save_weights wrote, such as a run's final/") from None
        client = self.create_lora_training_client(base_model=base_model, rank=rank, alpha=alpha, seed=seed,
                                                  target_modules=sorted(targets) if targets else None,
                                                  dtype=dtype)
        client.trainer.load_state(adapter, with_optimizer=False)
        return client

    def create_training_client_from_state(self, path: str, base_model: str, rank: int = 32) -> TrainingClient:
        client = self.create_lora_training_client(base_model=base_model, rank=rank)
        client.load_state(path)
        return client

    def create_sampling_client(self, base_model: str | None = None, model_path: str | None = None) -> SamplingClient:
        """Sample from a base model, or from a saved adapter directory on top of it."""
        if base_model is None:
            raise StropError("create_sampling_client needs base_model (the model the adapter was trained on)")
        from strop.engine.trainer import load_adapter_weights  # lazy: torch, transformers, peft (see the top)
        adapter = load_adapter_weights(model_path) if model_path else None
        return SamplingClient(self.backend, base_model, adapter=adapter, model_path=model_path)

    def start_sampler(self, base_model: str) -> dict:
        """Start the sampler engine for a base model now rather than at the first sample (a strop extension: a run
        learns at once that vLLM is missing or fails to start, before any step), and return `sampler_facts`."""
        self.backend.queue(base_model)
        return self.backend.sampler_facts()

    def close(self) -> None:
        """Stop this client's sampler engines (a vLLM engine's process)."""
        self.backend.close()

    def plan_grpo_memory(self, base_model: str, *, batch_size: int, group_size: int, prompt_tokens: int,
                         completion_tokens: int, what: str = "this run") -> dict:
        """The memory a GRPO run of these sizes would need on this backend, at the largest trainer micro-batch
        that fits (`tokensPerMicroBatch`); MemoryRefused when even one sequence per micro-batch would not fit
        (a strop extension: admission and the loop plan through it)."""
        model_dir = self.backend.model_dir(base_model)
        where = self.backend.memory_where(model_dir, rows=batch_size * group_size,
                                          seq=prompt_tokens + completion_tokens)
        return plan_grpo_memory(model_dir, batch_size=batch_size, group_size=group_size, prompt_tokens=prompt_tokens,
                                completion_tokens=completion_tokens, what=what, **where)

    def get_server_capabilities(self) -> dict:
        return {"supported_models": [{"model_name": entry.model_id} for entry in CATALOG]}
