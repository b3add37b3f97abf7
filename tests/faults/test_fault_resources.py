"""Fault injection: a run too big for the machine is refused at admission, with the estimate and what to
change, before anything is written."""

import json

import pytest

from strop.engine.resources import estimate_grpo_memory
from test_control import descriptor, home, run, workspace  # noqa: F401 - shared fixtures and helpers


def test_the_estimate_grows_with_what_a_step_holds(tiny_model_dir):
    small = estimate_grpo_memory(tiny_model_dir, batch_size=2, group_size=2, prompt_tokens=20, completion_tokens=8)
    wide = estimate_grpo_memory(tiny_model_dir, batch_size=8, group_size=8, prompt_tokens=20, completion_tokens=8)
    long = estimate_grpo_memory(tiny_model_dir, batch_size=2, group_size=2, prompt_tokens=20, completion_tokens=800)
    assert small["total"] < wide["total"] and small["total"] < long["total"]
    assert wide["activations"] > small["activations"] and long["kvCache"] > small["kvCache"]
    assert small["total"] == sum(v for k, v in small.items()
                                 if k not in ("total", "deviceTotal", "hostTotal", "device", "tokensPerMicroBatch",
                                              "completions"))


def test_a_run_that_would_not_fit_is_refused_at_admission(workspace, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "200")
    code, _, err = run(capsys, "runs", "start", "-f", descriptor(workspace))
    assert code == 1 and "$.config.rlHyperparams" in err and "GiB of memory" in err
    assert "Lower batchSize x groupSize or maxCompletionLength" in err
    assert json.loads(run(capsys, "runs", "list", "-o", "json")[1]) == []
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "64000")
    assert run(capsys, "runs", "start", "-f", descriptor(workspace), "--dry-run")[0] == 0


def test_strop_train_refuses_before_the_run_folder_exists(home, tmp_path, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "200")
    code, _, err = run(capsys, "train", "--base-model", "strop/tiny-random", "--steps", "1", "--run-dir", tmp_path / "run")
    assert code == 1 and "would need about" in err
    assert not (tmp_path / "run").exists()


def test_a_tight_budget_gets_smaller_micro_batches_not_a_refusal(tiny_model_dir, monkeypatch):
    from strop.engine.resources import plan_grpo_memory
    sizes = dict(batch_size=8, group_size=8, prompt_tokens=900, completion_tokens=100)
    roomy = plan_grpo_memory(tiny_model_dir, **sizes)
    # a budget that holds everything but half the activations of a full micro-batch
    budget = roomy["total"] - roomy["activations"] // 2
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", str(budget / (1 << 20)))
    tight = plan_grpo_memory(tiny_model_dir, **sizes)
    assert 1000 <= tight["tokensPerMicroBatch"] < roomy["tokensPerMicroBatch"] and tight["total"] <= budget


# ---- dtype, device and the vLLM engine's budget ----------------------------------------------------------------

def _qwen3_shaped(folder) -> str:
    """A config.json shaped like Qwen3-0.6B (no weights: the estimate reads the shape alone)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": True,
        "max_position_embeddings": 40960}))
    return str(folder)


def test_bf16_weights_count_half_and_a_gpu_run_splits_device_from_host(tiny_model_dir):
    sizes = dict(batch_size=4, group_size=4, prompt_tokens=30, completion_tokens=20)
    fp32 = estimate_grpo_memory(tiny_model_dir, **sizes)
    bf16 = estimate_grpo_memory(tiny_model_dir, **sizes, trainer_bytes=2, sampler_bytes=2)
    assert bf16["weights"] * 2 == fp32["weights"] and fp32["deviceTotal"] == 0 and fp32["hostTotal"] == fp32["total"]
    gpu = estimate_grpo_memory(tiny_model_dir, **sizes, device="cuda")
    host = gpu["rollouts"] + gpu["runtime"]
    assert gpu["hostTotal"] == host and gpu["deviceTotal"] == gpu["total"] - host
    assert gpu["deviceTotal"] - fp32["total"] + host == gpu["cudaContext"] > 0
    with_vllm = estimate_grpo_memory(tiny_model_dir, **sizes, device="cuda", sampler="vllm", sampler_kv_bytes=5 << 30)
    assert with_vllm["kvCache"] == 5 << 30 and with_vllm["cudaContext"] == 2 * gpu["cudaContext"]  # two processes


def test_a_gpu_run_is_planned_against_the_gpus_free_memory(tiny_model_dir, monkeypatch):
    from strop.engine.resources import MemoryRefused, plan_grpo_memory
    sizes = dict(batch_size=8, group_size=8, prompt_tokens=900, completion_tokens=100, device="cuda")
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "64000")
    monkeypatch.setenv("STROP_GPU_MEMORY_LIMIT_MB", "64000")
    roomy = plan_grpo_memory(tiny_model_dir, **sizes)
    # the GPU holds everything but half the activations: smaller micro-batches on the GPU, host memory untouched
    budget = roomy["deviceTotal"] - roomy["activations"] // 2
    monkeypatch.setenv("STROP_GPU_MEMORY_LIMIT_MB", str(budget / (1 << 20)))
    tight = plan_grpo_memory(tiny_model_dir, **sizes)
    assert 1000 <= tight["tokensPerMicroBatch"] < roomy["tokensPerMicroBatch"] and tight["deviceTotal"] <= budget
    monkeypatch.setenv("STROP_GPU_MEMORY_LIMIT_MB", "100")  # less than the CUDA context alone
    with pytest.raises(MemoryRefused, match=r"GiB of GPU memory on cuda \(weights .*cudaContext .*\) but 0\.1 GiB "
                                            r"is available.*free GPU memory \(STROP_GPU_MEMORY_LIMIT_MB"):
        plan_grpo_memory(tiny_model_dir, **sizes)
    # the completions a step holds are in host memory: a roomy GPU does not make a small host big enough
    monkeypatch.setenv("STROP_GPU_MEMORY_LIMIT_MB", "64000")
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "100")
    with pytest.raises(MemoryRefused, match=r"GiB of memory \(rollouts .*runtime .*\) but 0\.1 GiB is available"):
        plan_grpo_memory(tiny_model_dir, **sizes)


def test_the_vllm_kv_budget_is_what_the_run_decodes_and_at_least_one_full_sequence(tmp_path, tiny_model_dir):
    from strop.engine.resources import GIB, vllm_kv_budget, vllm_share_bytes
    qwen = _qwen3_shaped(tmp_path / "qwen3")
    # one 40,960-position sequence of 28 layers x 8 heads x 128 x (K, V) in bf16 is 4.375 GiB: vLLM will not start
    # with less (the old fixed 2 GiB), whatever the run decodes
    floor = vllm_kv_budget(qwen, rows=1, seq=100, dtype_bytes=2)
    assert 4.375 * 1.1 <= floor / GIB < 4.375 * 1.1 + 1 / 16 and floor % (64 << 20) == 0
    assert vllm_kv_budget(qwen, rows=1, seq=100, dtype_bytes=2, max_model_len=4096) == 512 << 20
    big = vllm_kv_budget(qwen, rows=64, seq=2048, dtype_bytes=2)  # 131,072 positions held at once
    assert 64 * 2048 * 114688 * 1.1 <= big < 64 * 2048 * 114688 * 1.1 + (64 << 20)
    assert vllm_kv_budget(tiny_model_dir, rows=2, seq=10) == 256 << 20  # the least it is given
    share = vllm_share_bytes(qwen, big, 2)
    assert share > big + 596_049_920 * 2  # its weights (596 M parameters in bf16) and the cache, and more


def test_a_vllm_run_gives_the_engine_the_kv_cache_its_plan_counts(tiny_model_dir, monkeypatch):
    import strop
    from strop.engine.resources import vllm_kv_budget
    monkeypatch.delenv("STROP_VLLM_KV_CACHE_GB", raising=False)
    monkeypatch.setenv("STROP_MEMORY_LIMIT_MB", "64000")
    service = strop.ServiceClient(sampler="vllm", dtype="float32")  # no engine starts until a sample is asked for
    sizes = dict(batch_size=8, group_size=16, prompt_tokens=6000, completion_tokens=2000)
    plan = service.plan_grpo_memory(str(tiny_model_dir), **sizes)
    budget = vllm_kv_budget(tiny_model_dir, rows=64, seq=8000)  # at most 64 rows decode at once
    assert plan["kvCache"] == budget > 256 << 20
    assert service.backend.sampler_options["kv_cache_gb"] * (1 << 30) == budget
    assert "gpu_memory_bytes" not in service.backend.sampler_options  # a share of a GPU only where it runs on one
    monkeypatch.setenv("STROP_VLLM_KV_CACHE_GB", "3")  # the user's budget wins, and is what the plan counts
    other = strop.ServiceClient(sampler="vllm", dtype="float32")
    assert other.plan_grpo_memory(str(tiny_model_dir), **sizes)["kvCache"] == 3 << 30
    assert "kv_cache_gb" not in other.backend.sampler_options
    own = strop.ServiceClient(sampler="strop", dtype="float32").plan_grpo_memory(str(tiny_model_dir), **sizes)
    assert own["kvCache"] != budget  # strop's own decoder: the cache of its batch
