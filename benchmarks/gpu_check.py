"""The device check: strop's trainer and sampler on a CUDA GPU, correct first, then how fast.

Prepared for a machine that has only torch, transformers, peft and safetensors (no vLLM, no downloads): every
model is built here from a config with random weights, so nothing travels but this repository.

1. Correctness (strop/tiny-random and a small random Qwen3): the trainer on CUDA against the trainer on the CPU
   (loss, gradient norm and the adapter after 3 AdamW steps), strop's sampler on CUDA against the CPU's (seeded
   tokens, logprobs, prompt logprobs), float32.
2. Sampling speed, a Qwen3-0.6B-shaped random model in bf16: strop's sampler against HF `generate`, greedy, at
   batch 1, 32 and 256 (64-token prompts, --new-tokens new tokens each), tokens/s.
3. A GRPO step of that model: 8 prompts x 4 samples x --completion tokens sampled by strop's sampler, then
   forward_backward (importance_sampling) and optim_step on a rank-32 LoRA; seconds for each part, and the
   trainer's model FLOP utilisation: 4 x parameters x tokens (the forward, and the backward to the activations;
   LoRA takes no gradient for the base weights) per second, against the GPU's bf16 dense peak.

    python benchmarks/gpu_check.py                      # on the GPU machine (about 5 minutes on one H200)
    python benchmarks/gpu_check.py --device cpu --small # the same code on a CPU, tiny sizes: a smoke test

Each part runs on its own; a part that fails prints its traceback and the others still run. The last line is a
JSON summary (also written to $OUT/gpu_check.json when OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout, installed or not

# bf16 dense peak, TFLOP/s, of the GPUs this check is likely to meet (the vendors' datasheets, without sparsity)
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0,
                    "RTX 4090": 165.0}


def facts(device: str) -> dict:
    import torch
    import transformers

    from strop.engine.precision import kernels
    out = {"torch": torch.__version__, "transformers": transformers.__version__, "device": device,
           "cpuKernels": kernels()}
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(0)
        out.update(gpu=name, cuda=torch.version.cuda, bf16=torch.cuda.is_bf16_supported(),
                   memoryGiB=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
                   peakBf16Tflops=next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None))
    return out


def _sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _random_model(folder: Path, config, dtype, device: str) -> Path:
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = config.vocab_size - 1  # an id random weights hardly ever pick
    model.save_pretrained(folder)
    del model
    return folder


def _qwen3_config(small: bool):
    from transformers import Qwen3Config
    if small:
        return Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                           tie_word_embeddings=True)
    # Qwen3-0.6B's shape (its config.json): 28 layers, 1024 wide, 16 query and 8 key/value heads of 128
    return Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def _datums(n: int, prompt: int, completion: int, vocab: int, seed: int = 0) -> list:
    import torch

    from strop import types
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = prompt + completion - 1
        ids = torch.randint(3, vocab - 1, (length + 1,), generator=g)
        advantages = torch.zeros(length)
        advantages[prompt - 1:] = 1.0 if i % 2 else -1.0
        logprobs = torch.zeros(length)
        logprobs[prompt - 1:] = -torch.rand(length - prompt + 1, generator=g) * 3
        out.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1].tolist()), loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(ids[1:]), "logprobs": types.TensorData.from_torch(logprobs),
            "advantages": types.TensorData.from_torch(advantages)}))
    return out


def correctness(device: str, work: Path, small: bool) -> dict:
    """CUDA against CPU, float32, on strop/tiny-random and a small random Qwen3."""
    import torch

    from strop import types
    from strop.engine.sampler import SampleRequest, SamplerEngine
    from strop.engine.trainer import LoraTrainer
    from strop.models.tiny import build_tiny_random
    from strop.types import SamplingParams

    models = {"tiny-random": build_tiny_random(work / "tiny-random"),
              "qwen3-small": _random_model(work / "qwen3-small", _qwen3_config(True), torch.float32, "cpu")}
    out = {}
    for name, folder in models.items():
        row = {}
        cpu = LoraTrainer(folder, rank=4, seed=1, compute_dtype=torch.float32, device="cpu")
        dev = LoraTrainer(folder, rank=4, seed=1, compute_dtype=torch.float32, device=device)
        vocab = cpu.model.config.vocab_size
        losses = []
        for step in range(3):
            batch = _datums(4, 8, 12 + 4 * step, vocab, seed=step)
            a = cpu.forward_backward(batch, "importance_sampling").metrics["loss:sum"]
            b = dev.forward_backward(batch, "importance_sampling").metrics["loss:sum"]
            losses.append(abs(a - b) / max(abs(a), 1e-6))
            norms = (cpu.optim_step(types.AdamParams(learning_rate=1e-2))["grad_norm"],
                     dev.optim_step(types.AdamParams(learning_rate=1e-2))["grad_norm"])
        here, there = cpu.lora_state_dict(), dev.lora_state_dict()
        row["trainerLossRelDiff"] = max(losses)
        row["trainerGradNorms"] = norms
        row["trainerAdapterMaxDiff"] = max((here[k] - there[k]).abs().max().item() for k in here)
        del cpu, dev
        engines = [SamplerEngine(folder, device="cpu"), SamplerEngine(folder, device=device)]
        requests = [SampleRequest(prompt_tokens=[5, 9, 13, 2, 7], num_samples=3,
                                  params=SamplingParams(max_tokens=16, seed=4, stop=[])),
                    SampleRequest(prompt_tokens=[8, 8, 1], num_samples=2,
                                  params=SamplingParams(max_tokens=12, temperature=0, stop=[]))]
        a, b = (e.generate(requests) for e in engines)
        pairs = [(sa, sb) for ra, rb in zip(a, b) for sa, sb in zip(ra.sequences, rb.sequences)]
        row["samplerSameTokens"] = sum(sa.tokens == sb.tokens for sa, sb in pairs) / len(pairs)
        row["samplerLogprobMaxDiff"] = max(abs(x - y) for sa, sb in pairs for x, y in zip(sa.logprobs, sb.logprobs))
        want, got = (e.prompt_logprobs([[5, 9, 13, 2, 7, 11, 3]])[0] for e in engines)
        row["promptLogprobMaxDiff"] = max(abs(x - y) for x, y in zip(want[1:], got[1:]))
        row["ok"] = (row["trainerLossRelDiff"] < 1e-3 and row["trainerAdapterMaxDiff"] < 1e-3
                     and row["samplerLogprobMaxDiff"] < 1e-2 and row["promptLogprobMaxDiff"] < 1e-2)
        out[name] = row
        print(f"correctness {name}: {json.dumps(row)}", flush=True)
    return out


def sampling_speed(device: str, folder: Path, batches: list[int], new_tokens: int) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    from strop.engine.sampler import SampleRequest, SamplerEngine
    from strop.types import SamplingParams

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    engine = SamplerEngine(folder, dtype=dtype, device=device, max_batch=max(batches), prefix_cache_bytes=0)
    print(f"strop's sampler: {'fast decode step' if engine._decoder is not None else 'HF forward'}", flush=True)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device).eval()
    vocab = hf.config.vocab_size
    rows = []
    for batch in batches:
        prompts = [[(7 * b + 13 * i) % (vocab - 2) + 1 for i in range(64)] for b in range(batch)]
        requests = [SampleRequest(prompt_tokens=p, num_samples=1,
                                  params=SamplingParams(max_tokens=new_tokens, temperature=0, stop=[]))
                    for p in prompts]
        engine.generate(requests[:1])  # warm-up: kernels, allocator
        _sync(device)
        t0 = time.perf_counter()
        made = sum(len(s.tokens) for r in engine.generate(requests) for s in r.sequences)
        _sync(device)
        strop_s = time.perf_counter() - t0
        ids = torch.tensor(prompts, device=device)
        with torch.inference_mode():
            hf.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), max_new_tokens=4, do_sample=False)
            _sync(device)
            t0 = time.perf_counter()
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False)
            _sync(device)
        hf_s = time.perf_counter() - t0
        hf_made = (out.shape[1] - ids.shape[1]) * batch
        row = {"batch": batch, "stropTokensPerSecond": made / strop_s, "hfTokensPerSecond": hf_made / hf_s}
        row["ratio"] = row["stropTokensPerSecond"] / row["hfTokensPerSecond"]
        rows.append(row)
        print(f"batch {batch:>4}: strop {row['stropTokensPerSecond']:10.1f} tok/s   HF generate "
              f"{row['hfTokensPerSecond']:10.1f} tok/s   {row['ratio']:.2f}x", flush=True)
    del engine, hf
    return rows


def grpo_step(device: str, folder: Path, completion: int, peak_tflops: float | None) -> dict:
    import torch

    from strop import types
    from strop.engine.sampler import AdapterWeights, SampleRequest, SamplerEngine
    from strop.engine.trainer import LoraTrainer
    from strop.types import SamplingParams

    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    trainer = LoraTrainer(folder, rank=32, seed=0, compute_dtype=dtype, device=device)
    params = sum(p.numel() for p in trainer.model.get_base_model().parameters())
    engine = SamplerEngine(folder, dtype=dtype, device=device, max_batch=32, prefix_cache_bytes=0)
    vocab = trainer.model.config.vocab_size
    prompts = [[(11 * b + 5 * i) % (vocab - 2) + 1 for i in range(128)] for b in range(8)]
    results = []
    for step in range(2):  # the first warms the kernels; the second is reported
        adapter: AdapterWeights = trainer.adapter_weights()
        engine.activate(adapter)
        _sync(device)
        t0 = time.perf_counter()
        responses = engine.generate([SampleRequest(prompt_tokens=p, num_samples=4, params=SamplingParams(
            max_tokens=completion, seed=step, stop=[])) for p in prompts])
        _sync(device)
        t1 = time.perf_counter()
        datums = []
        for p, response in zip(prompts, responses):
            for i, seq in enumerate(response.sequences):
                n = len(p) - 1
                datums.append(types.Datum(
                    model_input=types.ModelInput.from_ints(p + seq.tokens[:-1]), loss_fn_inputs={
                        "target_tokens": types.TensorData.from_torch(torch.tensor(p[1:] + seq.tokens)),
                        "logprobs": types.TensorData.from_torch(torch.tensor([0.0] * n + seq.logprobs)),
                        "advantages": types.TensorData.from_torch(
                            torch.tensor([0.0] * n + [1.0 if i % 2 else -1.0] * len(seq.tokens)))}))
        tokens = sum(d.model_input.length for d in datums)
        trainer.forward_backward(datums, "importance_sampling")
        _sync(device)
        t2 = time.perf_counter()
        trainer.optim_step(types.AdamParams(learning_rate=1e-5))
        _sync(device)
        t3 = time.perf_counter()
        results.append({"sampleSeconds": t1 - t0, "forwardBackwardSeconds": t2 - t1, "optimStepSeconds": t3 - t2,
                        "stepSeconds": t3 - t0, "sampledTokens": sum(len(s.tokens) for r in responses
                                                                     for s in r.sequences),
                        "trainedTokens": tokens, "parameters": params})
    row = results[-1]
    row["trainerTflops"] = 4 * params * row["trainedTokens"] / row["forwardBackwardSeconds"] / 1e12
    row["mfu"] = row["trainerTflops"] / peak_tflops if peak_tflops else None
    if device.startswith("cuda"):
        row["peakMemoryGiB"] = torch.cuda.max_memory_allocated() / 2**30
    print(f"GRPO step: {json.dumps(row)}", flush=True)
    return row


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke test of this script)")
    cli.add_argument("--small", action="store_true", help="tiny sizes everywhere (for --device cpu)")
    cli.add_argument("--new-tokens", type=int, default=128, help="greedy tokens a row in part 2 (default: 128)")
    cli.add_argument("--completion", type=int, default=512, help="sampled tokens a completion in part 3")
    cli.add_argument("--batches", default="1,32,256", help="part 2's batch sizes (default: 1,32,256)")
    cli.add_argument("--parts", default="1,2,3", help="which parts to run (default: all)")
    args = cli.parse_args()
    if args.small:
        args.new_tokens, args.completion, args.batches = 8, 16, "1,4"
    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run this on the GPU machine, or with --device cpu --small for a smoke test")
        return 2
    summary: dict = {"facts": facts(args.device)}
    print(json.dumps(summary["facts"]), flush=True)
    work = Path(tempfile.mkdtemp(prefix="strop-gpu-check-"))
    parts = {p.strip() for p in args.parts.split(",")}
    started = time.perf_counter()
    big = None
    for part, name in (("1", "correctness"), ("2", "sampling"), ("3", "grpoStep")):
        if part not in parts:
            continue
        t0 = time.perf_counter()
        try:
            if part == "1":
                summary[name] = correctness(args.device, work, args.small)
            else:
                if big is None:
                    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
                    big = _random_model(work / "qwen3-0.6b-shape", _qwen3_config(args.small), dtype, args.device)
                if part == "2":
                    summary[name] = sampling_speed(args.device, big, [int(b) for b in args.batches.split(",")],
                                                   args.new_tokens)
                else:
                    summary[name] = grpo_step(args.device, big, args.completion,
                                              summary["facts"].get("peakBf16Tflops"))
        except Exception:  # noqa: BLE001 - a failing part is reported whole; the others still run
            traceback.print_exc()
            summary[name] = {"error": traceback.format_exc(limit=3)[-2000:]}
        print(f"part {part} ({name}): {time.perf_counter() - t0:.1f} s", flush=True)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    summary["seconds"] = time.perf_counter() - started
    text = json.dumps(summary)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(text)
    print(text)
    return 0 if all("error" not in str(summary.get(k, "")) for k in ("correctness", "sampling", "grpoStep")) else 1


if __name__ == "__main__":
    sys.exit(main())
