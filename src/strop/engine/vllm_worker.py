"""The process that runs vLLM for strop's vLLM sampler (`strop.engine.vllm_engine` starts and talks to it).

It is run by path with a Python that has vLLM, which need not be strop's own: vLLM pins its own transformers,
so it often lives in a virtual environment of its own (STROP_VLLM_PYTHON). For that reason this file imports
nothing from strop, only the standard library, torch, safetensors and vllm.

Protocol: one JSON object a line, requests on the file descriptor named by STROP_VLLM_IN, replies on
STROP_VLLM_OUT (vLLM writes its logs to stdout and stderr, which the parent keeps in a log file). Each
request has an "op"; each reply is {"ok": true, ...} or {"ok": false, "error": "..."}.

    {"op": "init", "model": DIR, "dtype": "float32", "seed": 0, "max_batch": 64, "sync": "merged" | "lora",
     "max_lora_rank": 64, "max_model_len": N | null, "kv_cache_bytes": N | null, "prefix_caching": true,
     "gpu_memory_bytes": N | null}   (on a GPU: this engine's share of it, as gpu_memory_utilization)
    {"op": "weights", "file": "A.safetensors" | null, "scaling": s, "peft_dir": DIR | null}
    {"op": "generate", "requests": [{"prompt": [ids], "n": 4, "max_tokens": 32, "temperature": 1.0, "top_k": -1,
                                     "top_p": 1.0, "seed": 7, "stop_strings": [...], "stop_ids": [...],
                                     "json_schema": "..." | null}]}
    {"op": "prompt_logprobs", "sequences": [[ids], ...], "topk": k}    (k optional: also the k likeliest tokens)
    {"op": "reset_cache"}            (forget the prefix cache's keys and values)
    {"op": "close"}

Weights reach the engine without a restart, one of two ways:
- "merged": the file holds each adapted module's LoRA factors (NAME.lora_A, NAME.lora_B, under the base model's
  module names); the worker computes W0 + s * B @ A in float32 from the base weights it read from the model's
  own files, writes it into vLLM's layer (for a fused layer such as qkv_proj, into the rows of its q, k or v part)
  and, on a CPU, packs it again for vLLM's CPU matmul. Sampling then costs what the base model costs.
- "lora": the adapter is a PEFT folder given to vLLM as a LoRARequest (what users of vLLM on GPUs expect).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

# PyPI's torchvision, torchaudio and torchcodec builds do not load against a CPU build of torch, and a text model
# needs none of them: make them absent, here and (through the sitecustomize beside this file, which the parent
# puts on PYTHONPATH) in any process vLLM starts.
for _name in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules.setdefault(_name, None)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process, so it can be reached

import torch  # noqa: E402  (these after the guards above)
import vllm  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402


class Worker:
    def __init__(self, config: dict):
        self.model_dir = config["model"]
        self.dtype = getattr(torch, config.get("dtype", "float32"))
        self.sync = config.get("sync", "merged")
        kwargs = dict(model=self.model_dir, dtype=config.get("dtype", "float32"), seed=int(config.get("seed", 0)),
                      enable_prefix_caching=bool(config.get("prefix_caching", True)),
                      enforce_eager=bool(config.get("enforce_eager", True)),
                      max_num_seqs=int(config.get("max_batch", 64)))
        if config.get("max_model_len"):
            kwargs["max_model_len"] = int(config["max_model_len"])
        if config.get("kv_cache_bytes"):
            kwargs["kv_cache_memory_bytes"] = int(config["kv_cache_bytes"])
        self.gpu_memory_utilization = None
        if config.get("gpu_memory_bytes") and torch.cuda.is_available():
            # the share strop's memory plan gives this engine beside the trainer, not vLLM's fixed 0.9 of the device
            total = torch.cuda.mem_get_info()[1]
            self.gpu_memory_utilization = round(min(0.95, max(0.02, int(config["gpu_memory_bytes"]) / total)), 4)
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        if self.sync == "lora":
            kwargs.update(enable_lora=True, max_lora_rank=int(config.get("max_lora_rank", 64)), max_loras=1)
        self.llm = LLM(**kwargs)
        self.lora_request = None
        self.lora_ids = 0
        self.base: dict[str, torch.Tensor] = {}  # vLLM layer name -> its base weight (float32 on the CPU)
        self.merged: set[str] = set()  # layers that now hold base + delta
        self.vocab = self.llm.llm_engine.model_config.get_vocab_size()

    # ---- weights ------------------------------------------------------------------------------------------
    def set_weights(self, message: dict) -> dict:
        if self.sync == "lora":
            if message.get("peft_dir"):
                self.lora_ids += 1
                self.lora_request = LoRARequest(f"strop-{self.lora_ids}", self.lora_ids, message["peft_dir"])
            else:
                self.lora_request = None
            self.llm.reset_prefix_cache()
            return {}
        factors = {}
        if message.get("file"):
            tensors = load_file(message["file"])
            for key, value in tensors.items():
                name, _, part = key.rpartition(".")
                factors.setdefault(name, {})[part] = value
        scaling = float(message.get("scaling", 1.0))
        changed = self.llm.apply_model(lambda model: self._merge(model, factors, scaling))[0]
        self.llm.reset_prefix_cache()
        return {"layers": changed}

    def _merge(self, model, factors: dict, scaling: float) -> int:
        modules = dict(model.named_modules())
        packed = getattr(model, "packed_modules_mapping", {}) or {}
        # vLLM layer name -> the (row offset, delta) of each adapted module it holds (q, k, v share qkv_proj);
        # every delta is placed and checked before any layer changes, so a bad adapter leaves the weights as they were
        targets: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for name, parts in factors.items():
            layer_name, offset = self._locate(name, modules, packed)
            delta = (parts["lora_B"].float() @ parts["lora_A"].float()) * scaling
            base = self._base_weight(layer_name, modules[layer_name], packed)
            if delta.shape[1] != base.shape[1] or offset + delta.shape[0] > base.shape[0]:
                raise ValueError(f"adapter delta {tuple(delta.shape)} for {name} does not fit {layer_name} "
                                 f"{tuple(base.shape)} at row {offset}")
            targets.setdefault(layer_name, []).append((offset, delta))
        for layer_name in set(self.merged) | set(targets):
            weight = self._base_weight(layer_name, modules[layer_name], packed).clone()
            for offset, delta in targets.get(layer_name, ()):
                weight[offset:offset + delta.shape[0]] += delta
            self._install(modules[layer_name], weight.to(self.dtype))
        self.merged = set(targets)
        return len(targets)

    @staticmethod
    def _locate(name: str, modules: dict, packed: dict) -> tuple[str, int]:
        if name in modules:
            return name, 0
        prefix, _, leaf = name.rpartition(".")
        for fused, members in packed.items():
            if leaf in members:
                layer_name = f"{prefix}.{fused}"
                layer = modules.get(layer_name)
                if layer is None:
                    break
                sizes = list(getattr(layer, "output_sizes", None) or [])
                index = members.index(leaf)
                if len(sizes) != len(members):
                    raise ValueError(f"cannot place {name} inside {layer_name}: output sizes {sizes}")
                return layer_name, sum(sizes[:index])
        model = type(modules[""]).__name__
        raise KeyError(f"adapter targets module {name!r}, which vLLM's {model} does not have")

    def _base_weight(self, layer_name: str, layer, packed: dict) -> torch.Tensor:
        if layer_name not in self.base:
            prefix, _, leaf = layer_name.rpartition(".")
            members = packed.get(leaf, [leaf])
            parts = [self._checkpoint_tensor(f"{prefix}.{m}.weight") for m in members]
            self.base[layer_name] = torch.cat(parts, 0).float() if len(parts) > 1 else parts[0].float()
        return self.base[layer_name]

    def _checkpoint_tensor(self, key: str) -> torch.Tensor:
        index_file = os.path.join(self.model_dir, "model.safetensors.index.json")
        if os.path.exists(index_file):
            with open(index_file) as handle:
                files = [json.load(handle)["weight_map"][key]]
        else:
            files = [f for f in sorted(os.listdir(self.model_dir)) if f.endswith(".safetensors")]
        for file in files:
            with safe_open(os.path.join(self.model_dir, file), framework="pt") as reader:
                if key in reader.keys():
                    return reader.get_tensor(key)
        raise KeyError(f"the model's files hold no tensor {key!r}")

    @staticmethod
    def _install(layer, weight: torch.Tensor) -> None:
        if weight.device.type == "cpu" and hasattr(layer, "cpu_linear"):
            # vLLM's CPU path packs each linear weight for its matmul kernel and drops the plain one
            layer.weight = torch.nn.Parameter(weight.contiguous(), requires_grad=False)
            dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
        else:
            with torch.no_grad():
                layer.weight.copy_(weight.to(layer.weight.device))

    # ---- sampling -------------------------------------------------------------------------------------------
    def generate(self, message: dict) -> dict:
        prompts, params = [], []
        for request in message["requests"]:
            extra = {}
            if request.get("json_schema"):
                extra["structured_outputs"] = StructuredOutputsParams(json=json.loads(request["json_schema"]))
            greedy = float(request["temperature"]) == 0.0
            params.append(SamplingParams(
                # vLLM refuses n > 1 greedy: one sample, repeated below
                n=1 if greedy else int(request["n"]), max_tokens=int(request["max_tokens"]),
                temperature=float(request["temperature"]), top_k=int(request["top_k"]) if request["top_k"] > 0 else 0,
                top_p=float(request["top_p"]), seed=request.get("seed"),
                stop=list(request.get("stop_strings") or []) or None,
                stop_token_ids=list(request.get("stop_ids") or []) or None,
                include_stop_str_in_output=True, logprobs=0, ignore_eos=bool(request.get("ignore_eos")),
                detokenize=bool(request.get("stop_strings")),
                **extra))
            prompts.append(TokensPrompt(prompt_token_ids=list(request["prompt"])))
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.lora_request)
        responses = []
        for request, output in zip(message["requests"], outputs):
            sequences = []
            for completion in sorted(output.outputs, key=lambda c: c.index):
                if completion.finish_reason == "error":
                    # vLLM ends a request it could not run (a JSON schema its grammar backend cannot compile) with
                    # no tokens; passed on, that would read as an empty answer
                    raise RuntimeError(f"vLLM could not run request {len(responses)} of this batch"
                                       f"{' (its JSON schema did not compile to a grammar)' if request.get('json_schema') else ''}; "
                                       "vLLM's log has the cause")
                tokens = list(completion.token_ids)
                logprobs = [entry[token].logprob for entry, token in zip(completion.logprobs or [], tokens)]
                reason = "length" if completion.finish_reason == "length" else "stop"
                sequences.append({"tokens": tokens, "logprobs": logprobs, "stop_reason": reason})
            if len(sequences) == 1 and int(request["n"]) > 1:
                sequences = sequences * int(request["n"])
            responses.append(sequences)
        return {"responses": responses}

    def prompt_logprobs(self, message: dict) -> dict:
        """Each prompt token's logprob; with "topk": k, also the k likeliest tokens at each position (by vLLM's
        rank: vLLM returns the prompt's own token beside its top k)."""
        sequences, k = message["sequences"], int(message.get("topk") or 0)
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, detokenize=False)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], params,
                                    use_tqdm=False, lora_request=self.lora_request)
        results, topk = [], []
        for sequence, output in zip(sequences, outputs):
            row, best = [None], [None]
            for entry, token in zip((output.prompt_logprobs or [None])[1:], sequence[1:]):
                row.append(None if entry is None else entry[token].logprob)
                if k:
                    ranked = sorted((lp.rank, t, lp.logprob) for t, lp in (entry or {}).items() if lp.rank <= k)
                    best.append([[t, lp] for _, t, lp in ranked[:k]] or None)
            results.append(row)
            topk.append(best)
        return {"logprobs": results, "topk": topk}


def serve(reader, writer) -> None:
    worker = None
    for line in reader:
        message = json.loads(line)
        op = message.get("op")
        try:
            if op == "init":
                worker = Worker(message)
                reply = {"vllm": vllm.__version__, "vocab": worker.vocab,
                         "gpu_memory_utilization": worker.gpu_memory_utilization, "device": str(next(
                    iter(worker.llm.apply_model(lambda m: str(next(m.parameters()).device)))))}
            elif op == "close":
                writer.write(json.dumps({"ok": True}) + "\n")
                writer.flush()
                return
            elif worker is None:
                raise RuntimeError("the engine was not started (send init first)")
            elif op == "weights":
                reply = worker.set_weights(message)
            elif op == "generate":
                reply = worker.generate(message)
            elif op == "prompt_logprobs":
                reply = worker.prompt_logprobs(message)
            elif op == "reset_cache":
                reply = {"reset": bool(worker.llm.reset_prefix_cache())}
            else:
                raise ValueError(f"unknown op {op!r}")
            reply["ok"] = True
        except Exception as exc:  # the parent reports it; the engine stays up for the next request
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            if op == "init":
                reply["fatal"] = True
        writer.write(json.dumps(reply) + "\n")
        writer.flush()
        if op == "init" and not reply["ok"]:
            return


def main() -> None:
    reader = os.fdopen(int(os.environ["STROP_VLLM_IN"]), "r")
    writer = os.fdopen(int(os.environ["STROP_VLLM_OUT"]), "w")
    serve(reader, writer)


if __name__ == "__main__":
    main()
