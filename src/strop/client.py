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
from pathlib import Path
from typing import TYPE_CHECKING

from strop.choices import DTYPE_CHOICES
from strop.cluster.settings import RaySettings
from strop.engine.engine_choice import check_sampler
from strop.engine.precision import (SAMPLE_AS_TRAINER, check_dtype, engine_facts, gpus_value_problem,
                                    run_device)
from strop.engine.malloc import kept_free_bytes, release_freed_memory  # noqa: F401  (the loop's, through the client)
from strop.engine.resources import plan_grpo_memory, resident_bytes
from strop.engine.vllm_find import require_vllm  # noqa: F401  (the loop checks the sampler through the client)
from strop.errors import StropError
from strop.files import check_regular
from strop.local_backend import LocalBackend
from strop.models import CATALOG
from strop.paths import strop_home
from strop.types import (AdamParams, Datum, ModelInput, OptimStepResponse, SamplingParams,
                         SaveWeightsResponse)

if TYPE_CHECKING:
    from strop.engine.sampler import AdapterWeights
    from strop.engine.trainer import LoraTrainer
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
        return APIFuture(self._queue.submit(self.adapter, request))

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

    def evaluation_sampling_client(self) -> SamplingClient:
        """A sampling client on the current weights that samples as evaluations do (a strop extension): float32 on
        a CPU under auto, even where this client's own samplers draw a run's rollouts in bf16 (strop.engine.
        precision.sampler_dtype_for). A run's evaluations during training score through it."""
        return SamplingClient(self.backend.for_evaluations(), self.base_model, adapter=self.trainer.adapter_weights())

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
        "bfloat16" (both); `sampler_dtype` overrides it for the sampler alone ("trainer": what the trainer computes
        in, as a GRPO run samples its own rollouts). LoRA weights, logprobs and losses are float32 either way. `sampler`: which engine samples, "auto" (strop.engine.engine_choice), "strop" or
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
        if sampler_dtype is not None and sampler_dtype not in (*DTYPE_CHOICES, SAMPLE_AS_TRAINER):
            raise StropError(f"sampler_dtype must be one of {', '.join((*DTYPE_CHOICES, SAMPLE_AS_TRAINER))}, got "
                             f"{str(sampler_dtype)[:40]!r}")
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


def process_memory() -> dict:
    """This process's memory in MiB (a strop extension, for a run's metrics): `residentMiB`, and `heapFreeMiB`,
    what of it the allocator keeps freed for reuse (strop.engine.malloc). None for both where /proc cannot tell."""
    resident = resident_bytes()
    if resident is None:
        return {"residentMiB": None, "heapFreeMiB": None}
    return {"residentMiB": round(resident / 2**20, 1), "heapFreeMiB": round(kept_free_bytes() / 2**20, 1)}
