"""bf16 compute with fp32 LoRA weights and fp32 logprobs: chosen per machine, forced by flag, and close to fp32.

bf16 runs here whatever the CPU: where it has no bf16 units it is slow, not wrong, so these tests hold on every
machine; only speed is measured elsewhere (benchmarks/sampler.py, benchmarks/grpo_vs_trl.py)."""

import json

import pytest
import torch

from strop import types
from strop.cli.main import main
from strop.client import ServiceClient
from strop.control.descriptor import DescriptorError, validate_descriptor
from strop.engine import precision
from strop.engine.sampler import SampleRequest, SamplerEngine
from strop.engine.trainer import LoraTrainer
from strop.errors import StropError
from strop.models import load_tokenizer
from strop.rl import GRPOConfig
from strop.sft import SFTConfig
from test_descriptor import SEED_003


def test_auto_follows_the_hardware_and_can_be_forced(monkeypatch):
    monkeypatch.delenv("STROP_DTYPE", raising=False)
    expected = "bfloat16" if {"avx512_bf16", "amx_bf16"} & precision.cpu_flags() else "float32"
    assert precision.resolve_dtype("auto") == expected == precision.resolve_dtype(None)
    assert precision.resolve_dtype("float32") == "float32" and precision.resolve_dtype("bfloat16") == "bfloat16"
    monkeypatch.setenv("STROP_DTYPE", "float32")
    assert precision.resolve_dtype("auto") == "float32"
    assert precision.resolve_dtype("bfloat16") == "bfloat16"  # an explicit choice wins over the environment
    monkeypatch.setenv("STROP_DTYPE", "fp16")
    with pytest.raises(StropError, match="STROP_DTYPE must be one of auto, float32, bfloat16, got 'fp16'"):
        precision.resolve_dtype("auto")
    with pytest.raises(StropError, match="dtype must be one of"):
        precision.resolve_dtype("half")
    assert "bf16 units:" in precision.kernels()
    # the sampler: float32 on a CPU under auto, whatever was chosen when chosen
    monkeypatch.delenv("STROP_DTYPE")
    assert precision.sampler_dtype_for("auto") == "float32"
    assert precision.sampler_dtype_for("bfloat16") == "bfloat16"
    monkeypatch.setenv("STROP_DTYPE", "bfloat16")
    assert precision.sampler_dtype_for("auto") == "bfloat16" == precision.resolve_dtype("auto")
    monkeypatch.delenv("STROP_DTYPE")
    service = ServiceClient()
    assert service.backend.sampler_dtype == torch.float32 and service.dtype == expected
    # a run's own rollouts sample in what its trainer computes in; its evaluations in float32 on a CPU
    assert precision.sampler_dtype_for("auto", rollouts=True) == expected
    assert precision.sampler_dtype_for("float32", rollouts=True) == "float32"
    rollouts = ServiceClient(sampler_dtype="trainer").backend
    assert rollouts.sampler_dtype == getattr(torch, expected)
    evaluations = rollouts.for_evaluations()
    assert evaluations.sampler_dtype == torch.float32 and (evaluations is rollouts) == (expected == "float32")
    assert evaluations is rollouts.for_evaluations()  # made once
    with pytest.raises(StropError, match="sampler_dtype must be one of auto, float32, bfloat16, trainer, got 'half'"):
        ServiceClient(sampler_dtype="half")


def test_configs_and_descriptors_refuse_an_unknown_dtype():
    with pytest.raises(StropError, match="dtype: must be one of auto, float32, bfloat16"):
        GRPOConfig(dtype="float16")
    with pytest.raises(StropError, match="dtype: must be one of"):
        SFTConfig(dataset="x.jsonl", dtype="bf16")
    with pytest.raises(StropError, match="dtype must be one of"):
        ServiceClient(dtype="int8")
    descriptor = json.loads(SEED_003)
    descriptor["execution"]["dtype"] = "fp8"
    with pytest.raises(DescriptorError) as refused:
        validate_descriptor(descriptor)
    assert any("$.execution.dtype" in p and "bfloat16" in p for p in refused.value.problems), refused.value.problems
    descriptor["execution"]["dtype"] = "bfloat16"
    assert validate_descriptor(descriptor).execution.dtype == "bfloat16"


def datums(n: int = 3, length: int = 24) -> list[types.Datum]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(3, 200, (length + 1,), generator=g).tolist()
        weights = [0.0] * (length // 2) + [1.0] * (length - length // 2)
        out.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(torch.tensor(ids[1:])),
            "weights": types.TensorData.from_torch(torch.tensor(weights))}))
    return out


def test_bf16_trainer_keeps_fp32_lora_weights_and_matches_fp32(tiny_model_dir):
    fp32 = LoraTrainer(tiny_model_dir, rank=4, seed=1, compute_dtype=torch.float32)
    bf16 = LoraTrainer(tiny_model_dir, rank=4, seed=1, compute_dtype=torch.bfloat16)
    base = bf16.model.get_base_model()
    assert base.model.layers[0].mlp.down_proj.base_layer.weight.dtype == torch.bfloat16
    assert {p.dtype for p in bf16.trainable_parameters()} == {torch.float32}
    for trainer in (fp32, bf16):  # B starts at zero: move it so the adapter's gradient path is tested too
        with torch.no_grad():
            for p in trainer.trainable_parameters():
                if p.abs().sum() == 0:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    batch = datums()
    out32, out16 = fp32.forward_backward(batch), bf16.forward_backward(batch)
    loss32, loss16 = out32.metrics["loss:sum"], out16.metrics["loss:sum"]
    assert abs(loss16 - loss32) / loss32 < 0.02
    lp32 = out32.loss_fn_outputs[0]["logprobs"].to_torch()
    lp16 = out16.loss_fn_outputs[0]["logprobs"].to_torch()
    assert lp16.dtype == torch.float32 and (lp16 - lp32).abs().max() < 0.1
    grads32 = torch.cat([p.grad.flatten() for p in fp32.trainable_parameters()])
    grads16 = [p.grad for p in bf16.trainable_parameters()]
    assert all(g is not None and g.dtype == torch.float32 for g in grads16)
    grads16 = torch.cat([g.flatten() for g in grads16])
    assert torch.nn.functional.cosine_similarity(grads32, grads16, dim=0) > 0.98
    before = [p.detach().clone() for p in bf16.trainable_parameters()]
    bf16.optim_step(types.AdamParams(learning_rate=1e-3))
    assert any(not torch.equal(b, p) for b, p in zip(before, bf16.trainable_parameters()))


def test_bf16_sampler_logprobs_agree_with_the_bf16_trainer(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    engine = SamplerEngine(tiny_model_dir, tokenizer=tok, dtype=torch.bfloat16)
    trainer = LoraTrainer(tiny_model_dir, rank=4, compute_dtype=torch.bfloat16)
    prompt = tok.encode("What is 3 + 4? Answer with a number.")
    params = types.SamplingParams(max_tokens=10, temperature=1.0, seed=2, stop=[])
    [response] = engine.generate([SampleRequest(prompt, 3, params)])
    for seq in response.sequences:
        assert len(seq.tokens) == 10 and all(isinstance(lp, float) and lp <= 0 for lp in seq.logprobs)
        full = prompt + seq.tokens
        datum = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]), loss_fn_inputs={
            "target_tokens": types.TensorData.from_torch(torch.tensor(full[1:])),
            "weights": types.TensorData.from_torch(torch.ones(len(full) - 1))})
        trained = trainer.forward([datum]).loss_fn_outputs[0]["logprobs"].to_torch()[len(prompt) - 1:]
        assert (trained - torch.tensor(seq.logprobs)).abs().max() < 0.15  # bf16 rounding, two kernels


def test_bf16_rollouts_take_tis_and_evaluations_during_the_run_sample_in_float32(tiny_model_dir, tmp_path):
    from strop.rl.grpo import rollout_correction, run_grpo
    assert rollout_correction(GRPOConfig(), torch.bfloat16) == "tis"
    assert rollout_correction(GRPOConfig(), torch.float32) == "off"
    assert rollout_correction(GRPOConfig(rollout_correction="off"), torch.bfloat16) == "off"
    assert rollout_correction(GRPOConfig(rollout_correction="tis"), torch.float32) == "tis"
    scored = []

    def on_eval(step, training, renderer):  # what a project's evaluation during the run samples with
        sampler = training.evaluation_sampling_client()
        scored.append((step, sampler.backend.sampler_dtype, sampler.adapter is not None))

    config = GRPOConfig(base_model=str(tiny_model_dir), dataset="synthetic:add", dataset_limit=4, max_steps=2,
                        batch_size=2, group_size=2, max_completion_length=4, reward_terms=[
                            {"name": "correct", "weight": 1.0, "grader": "builtin:gsm8k"}],
                        dtype="bfloat16", eval_every=1, save_every=2)
    run_grpo(config, tmp_path / "run", progress=False, on_eval=on_eval)
    engine = json.loads((tmp_path / "run" / "engine.json").read_text())
    assert engine["trainerDtype"] == engine["samplerDtype"] == "bfloat16" and engine["rolloutCorrection"] == "tis"
    # the folder keeps the setting as declared, so a rerun or a resume with the same settings matches it
    assert json.loads((tmp_path / "run" / "config.json").read_text())["rollout_correction"] == "auto"
    # an explicit bfloat16 is every sampler's choice, evaluations' too (under auto they take float32)
    assert scored == [(1, torch.bfloat16, True)]


def test_strop_train_dtype_flag_is_recorded_with_the_run(tiny_model_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = main(["train", "--base-model", str(tiny_model_dir), "--dataset", "synthetic:add", "--limit", "4",
                 "--steps", "1", "--batch-size", "2", "--group-size", "2", "--max-tokens", "4", "--reward",
                 "builtin:gsm8k", "--dtype", "bfloat16", "--run-dir", str(run_dir), "--quiet"])
    assert code == 0, capsys.readouterr().err
    engine = json.loads((run_dir / "engine.json").read_text())
    assert engine["trainerDtype"] == engine["samplerDtype"] == "bfloat16" and "bf16 units" in engine["kernels"]
    assert json.loads((run_dir / "config.json").read_text())["dtype"] == "bfloat16"
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["train", "--dtype", "half"])
    err = capsys.readouterr().err
    assert "--dtype" in err and "bfloat16" in err


def small_adapter(tiny_model_dir, scale: float, targets: list[str] | None = None):
    """An adapter on every projection (or on `targets`) whose delta is `scale` times the size of a random rank-4
    product."""
    trainer = LoraTrainer(tiny_model_dir, rank=4, seed=3, compute_dtype=torch.float32, target_modules=targets)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in trainer.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return trainer.adapter_weights()


def test_bf16_sampling_adds_the_adapter_beside_untouched_weights(tiny_model_dir):
    # merged into bf16 weights, a small delta rounds away (W0 is on the bf16 grid); beside them it is kept
    adapter = small_adapter(tiny_model_dir, scale=0.01)
    name = "model.layers.0.mlp.gate_proj"
    engine = SamplerEngine(tiny_model_dir, dtype=torch.bfloat16, prefix_cache_bytes=0)
    layer = engine._modules[name]
    before = layer.weight.detach().clone()
    engine.activate(adapter)
    assert torch.equal(layer.weight, before)  # the weights are not touched
    x = torch.randn(64, layer.weight.shape[1], generator=torch.Generator().manual_seed(5)).bfloat16()
    exact = x.float() @ layer.weight.float().t()
    expected = x.float() @ adapter.delta(name).t()
    kept = layer(x).float() - exact
    assert torch.nn.functional.cosine_similarity(kept.flatten(), expected.flatten(), dim=0) > 0.9
    engine.activate(None)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, layer.weight))


@pytest.mark.parametrize("targets", [None, ["k_proj", "up_proj", "down_proj"]], ids=["every projection", "some"])
def test_bf16_decode_with_an_adapter_matches_hf_forward_and_switches_off(tiny_model_dir, targets):
    # the decode step adds the terms of projections sharing an input with one pair of products (q, k and v; gate
    # and up), zero where a projection has none: HF's forward adds each module's own
    adapter = small_adapter(tiny_model_dir, scale=0.3, targets=targets)
    prompt = list(range(5, 40))
    params = types.SamplingParams(max_tokens=12, temperature=0, stop=[])
    runs = {}
    for fast in (True, False):
        engine = SamplerEngine(tiny_model_dir, dtype=torch.bfloat16, fast_decode=fast, prefix_cache_bytes=0)
        [base_before] = engine.generate([SampleRequest(prompt, 1, params)])
        engine.activate(adapter)
        [tuned] = engine.generate([SampleRequest(prompt, 1, params)])
        engine.activate(None)
        [base_after] = engine.generate([SampleRequest(prompt, 1, params)])
        assert base_after.sequences[0].tokens == base_before.sequences[0].tokens
        assert tuned.sequences[0].tokens != base_before.sequences[0].tokens
        runs[fast] = tuned.sequences[0]
    assert runs[True].tokens == runs[False].tokens
    assert max(abs(a - b) for a, b in zip(runs[True].logprobs, runs[False].logprobs)) < 0.05
