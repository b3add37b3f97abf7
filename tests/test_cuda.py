"""The trainer and strop's sampler on a CUDA GPU give what they give on the CPU. The tests marked `gpu` run where
torch sees a CUDA device (benchmarks/gpu_check.py runs the same comparisons and the speed figures there); the
device choice itself is checked everywhere."""

from __future__ import annotations

import json

import pytest
import torch

import strop
from strop import types
from strop.engine.precision import cuda_count, gpus_problem, run_device, train_device
from strop.engine.sampler import SampleRequest, SamplerEngine
from strop.engine.trainer import LoraTrainer
from strop.errors import StropError
from strop.types import SamplingParams

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none here)")


def test_the_device_is_chosen_and_a_missing_gpu_is_named(monkeypatch):
    monkeypatch.delenv("STROP_DEVICE", raising=False)
    assert train_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    assert train_device("cpu") == "cpu"
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(StropError, match=f"torch sees {found} CUDA GPU"):
        train_device(f"cuda:{found}")
    for wrong in ("gpu", "cuda:x", "cuda:-1", "tpu:0", "cuda:" + "9" * 100_000, "cuda\x1b[31m"):
        monkeypatch.setenv("STROP_DEVICE", wrong)
        with pytest.raises(StropError, match="STROP_DEVICE must be cpu, cuda or cuda:N"):
            train_device()
    monkeypatch.setenv("STROP_DEVICE", "cpu")
    assert train_device() == "cpu"


def test_execution_gpus_decides_the_device(monkeypatch):
    monkeypatch.delenv("STROP_DEVICE", raising=False)
    found = cuda_count()
    assert run_device(0) == "cpu"
    assert run_device(1) == run_device(None) == ("cuda" if found else "cpu")
    asked = max(2, found + 1)  # one GPU asked for where there is none runs on the CPU (the seeds' descriptors)
    with pytest.raises(StropError, match=f"asks for {asked} GPUs, and torch sees {found} CUDA GPU"):
        run_device(asked)
    assert gpus_problem(2, 0).startswith("asks for 2 GPUs, and torch sees 0 CUDA GPUs")
    assert "execution.ray" in gpus_problem(2, 8) and "trains on one" in gpus_problem(2, 8)  # one process, one GPU
    assert gpus_problem(0, 0) is None and gpus_problem(1, 0) is None and gpus_problem(None, 0) is None
    for bad in (-1, 1.5, "2", True, float("nan")):  # the Python API's ServiceClient(gpus=...) is refused the same
        assert gpus_problem(bad, 8).startswith("must be a whole number of GPUs"), bad
        with pytest.raises(StropError, match="gpus must be a whole number of GPUs"):
            strop.ServiceClient(gpus=bad)
        with pytest.raises(StropError, match="gpus must be a whole number of GPUs"):
            strop.ServiceClient(gpus=bad, ray={"address": "127.0.0.1:1"})  # before any cluster is reached
    monkeypatch.setenv("STROP_DEVICE", "cpu")
    assert run_device(1) == "cpu"
    monkeypatch.setenv("STROP_DEVICE", f"cuda:{found}")  # a GPU that is not there is refused, not ignored
    with pytest.raises(StropError, match=f"torch sees {found} CUDA GPU"):
        run_device(1)


def _datums(n: int, seed: int) -> list[types.Datum]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 12 + 5 * i
        ids = torch.randint(3, 200, (length + 1,), generator=g)
        advantages = torch.zeros(length)
        advantages[length // 2:] = float(torch.randn((), generator=g))
        logprobs = torch.zeros(length)
        logprobs[length // 2:] = -torch.rand(length - length // 2, generator=g) * 3
        out.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1].tolist()), loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(ids[1:]), "logprobs": types.TensorData.from_torch(logprobs),
            "advantages": types.TensorData.from_torch(advantages)}))
    return out


@pytest.mark.gpu
@needs_cuda
def test_the_trainer_on_cuda_takes_the_cpu_trainers_steps(tiny_model_dir, tmp_path):
    cpu = LoraTrainer(tiny_model_dir, rank=4, seed=2, compute_dtype=torch.float32, device="cpu")
    gpu = LoraTrainer(tiny_model_dir, rank=4, seed=2, compute_dtype=torch.float32, device="cuda")
    assert next(gpu.model.parameters()).is_cuda
    adam = types.AdamParams(learning_rate=1e-2)
    for step in range(3):
        batch = _datums(4, seed=step)
        a, b = cpu.forward_backward(batch, "importance_sampling"), gpu.forward_backward(batch, "importance_sampling")
        assert b.metrics["loss:sum"] == pytest.approx(a.metrics["loss:sum"], rel=1e-4, abs=1e-4)
        assert not b.loss_fn_outputs[0]["logprobs"].to_torch().is_cuda  # outputs come back to the CPU
        assert cpu.optim_step(adam)["grad_norm"] == pytest.approx(gpu.optim_step(adam)["grad_norm"], rel=1e-3)
    here, there = cpu.lora_state_dict(), gpu.lora_state_dict()
    assert max((here[k] - there[k]).abs().max().item() for k in here) < 1e-3
    gpu.save_state(tmp_path / "state")
    again = LoraTrainer(tiny_model_dir, rank=4, seed=9, compute_dtype=torch.float32, device="cuda")
    again.load_state(tmp_path / "state")
    assert all(torch.equal(again.lora_state_dict()[k], there[k]) for k in there)
    assert json.loads((tmp_path / "state" / "trainer.json").read_text())["steps"] == 3


@pytest.mark.gpu
@needs_cuda
def test_the_sampler_on_cuda_draws_the_cpu_samplers_tokens(tiny_model_dir):
    cpu = SamplerEngine(tiny_model_dir, device="cpu")
    gpu = SamplerEngine(tiny_model_dir, device="cuda")
    requests = [SampleRequest(prompt_tokens=[5, 9, 13, 2, 7], num_samples=3,
                              params=SamplingParams(max_tokens=16, seed=4, stop=[])),
                SampleRequest(prompt_tokens=[8, 8, 1], num_samples=2,
                              params=SamplingParams(max_tokens=12, temperature=0))]
    a, b = cpu.generate(requests), gpu.generate(requests)
    for ra, rb in zip(a, b):
        for sa, sb in zip(ra.sequences, rb.sequences):
            assert sa.tokens == sb.tokens  # seeded draws on the CPU side from the same logits, up to float order
            assert max(abs(x - y) for x, y in zip(sa.logprobs, sb.logprobs)) < 1e-3
    sequences = [[5, 9, 13, 2, 7, 11, 3]]
    want, got = cpu.prompt_logprobs(sequences)[0], gpu.prompt_logprobs(sequences)[0]
    assert got[0] is None and max(abs(x - y) for x, y in zip(want[1:], got[1:])) < 1e-3
