"""The GRPO loop end to end on the tiny random model: files, metrics, learning signal, resume after kill -9."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from strop.errors import StropError
from strop.rl import GRPOConfig, run_grpo
from strop.rl import checkpoints
from strop.rl.metrics import read_jsonl

REQUIRED_METRICS = ["reward", "rewardStd", "zeroVarianceGroups", "rewardErrors", "klSampleTrain", "entropy",
                    "completionLength", "clippedFraction", "tokensPerSecond", "stepSeconds"]


def write_bundle(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reward.py").write_text(body)
    return folder


@pytest.fixture()
def varied_bundle(tmp_path):
    # a reward that differs between completions of a random model, so groups have variance to learn from
    return write_bundle(tmp_path / "lengthy", "def compute_score(data_source=None, solution_str=None, ground_truth=None, "
                                              "extra_info=None):\n    return (len(solution_str) % 7) / 7.0\n")


def tiny_config(model_dir, bundle, **kw):
    base = dict(base_model=str(model_dir), dataset="synthetic:add", group_size=4, batch_size=2, max_steps=3,
                max_completion_length=8, learning_rate=1e-2, lora_rank=4, save_every=2, keep_adapters=1,
                reward_terms=[{"name": "length", "weight": 1.0, "grader": str(bundle)},
                              {"name": "correct", "weight": 0.5, "grader": "builtin:gsm8k"}])
    base.update(kw)
    return GRPOConfig(**base)


def test_grpo_run_writes_everything_and_changes_the_adapter(tiny_model_dir, varied_bundle, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    result = run_grpo(tiny_config(tiny_model_dir, varied_bundle), tmp_path / "run", progress=False)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        for name in REQUIRED_METRICS + ["reward/length", "reward/correct"]:
            assert name in row, name
        # per-term contributions add up to the reward
        assert row["reward/length"] + row["reward/correct"] == pytest.approx(row["reward"])
        assert 0 <= row["zeroVarianceGroups"] <= 1 and row["completionLength"] <= 8
    assert rows[0]["datums"] > 0  # length rewards vary, so groups train

    rollouts = read_jsonl(tmp_path / "run" / "rollouts.jsonl")
    assert len(rollouts) == 3 * 2 * 4
    assert set(rollouts[0]["scores"]) == {"length", "correct"}
    assert rollouts[0]["prompt"].endswith("<|im_start|>assistant\n") and rollouts[0]["question"] in rollouts[0]["prompt"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "run" / "events"))
    events.Reload()
    assert {"reward", "zeroVarianceGroups", "reward/length"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("reward")] == [0, 1, 2]

    # keep_adapters=1: only the last checkpoint survives, and its manifest checks out
    ckpts = sorted((tmp_path / "run" / "checkpoints").iterdir())
    assert [p.name for p in ckpts] == ["step-000003"] and checkpoints.verify(ckpts[0]) == 3

    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)), str(result.final_adapter))
    lora_b = [p for n, p in tuned.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # LoRA B starts at zero: training moved it


def test_verl_rows_and_a_verl_grader_train_and_evaluate_as_they_are(tiny_model_dir, tmp_path):
    """A verl user's data and reward function, unchanged: rows in verl's form, and a grader that dispatches on
    data_source and reads extra_info as verl's reward manager passes them (before, data_source was always None)."""
    from strop.evals.runner import evaluate_local
    from strop.data import load_rows
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "system", "content": "Be terse."},
                                                       {"role": "user", "content": f"What is {i} + 1?"}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i in range(4)]
    data = tmp_path / "verl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bundle = write_bundle(tmp_path / "verl_reward", (
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if data_source != 'openai/gsm8k' or not isinstance(extra_info['index'], int):\n"
        "        raise NotImplementedError(f'reward for {data_source!r} is not implemented')\n"
        "    return (len(solution_str) % 5) / 5.0\n"))
    config = tiny_config(tiny_model_dir, bundle, dataset=str(data), max_steps=1, batch_size=2,
                         reward_terms=[{"name": "verl", "weight": 1.0, "grader": str(bundle)}])
    [row] = run_grpo(config, tmp_path / "run", progress=False).metrics
    assert row["rewardErrors"] == 0 and row["datums"] > 0
    rollout = read_jsonl(tmp_path / "run" / "rollouts.jsonl")[0]
    assert "Be terse." in rollout["prompt"] and rollout["question"] in rollout["prompt"]
    result = evaluate_local(str(tiny_model_dir), load_rows(str(data)), str(bundle), max_tokens=4, progress=False)
    assert not [i.error for i in result.items if i.error]


def test_zero_variance_groups_are_skipped(tiny_model_dir, tmp_path):
    constant = write_bundle(tmp_path / "constant", "def compute_score(**kw):\n    return 0.25\n")
    config = tiny_config(tiny_model_dir, constant, max_steps=2,
                         reward_terms=[{"name": "flat", "weight": 1.0, "grader": str(constant)}])
    result = run_grpo(config, tmp_path / "run", progress=False)
    assert all(r["zeroVarianceGroups"] == 1.0 and r["datums"] == 0 for r in result.metrics)
    assert all(r["reward"] == pytest.approx(0.25) for r in result.metrics)


def test_grader_errors_are_counted_not_fatal(tiny_model_dir, tmp_path, varied_bundle):
    broken = write_bundle(tmp_path / "broken", "def compute_score(**kw):\n    raise RuntimeError('boom')\n")
    config = tiny_config(tiny_model_dir, varied_bundle, max_steps=1, reward_terms=[
        {"name": "length", "weight": 1.0, "grader": str(varied_bundle)},
        {"name": "broken", "weight": 1.0, "grader": str(broken)}])
    [row] = run_grpo(config, tmp_path / "run", progress=False).metrics
    assert row["rewardErrors"] == 2 * 4 and row["reward/broken"] == 0.0


def test_kl_penalty_is_measured(tiny_model_dir, varied_bundle, tmp_path):
    config = tiny_config(tiny_model_dir, varied_bundle, max_steps=2, kl_beta=0.1)
    rows = run_grpo(config, tmp_path / "run", progress=False).metrics
    assert "klBase" in rows[1]
    assert rows[0]["klBase"] == pytest.approx(0.0, abs=1e-4)  # step 0: the adapter is still the identity
    assert rows[1]["klBase"] != pytest.approx(0.0, abs=1e-6)


def test_config_reports_every_problem_at_once():
    with pytest.raises(StropError) as err:
        GRPOConfig(group_size=1, max_completion_length=0, loss_fn="dpo", learning_rate=5)
    text = str(err.value)
    for field in ("group_size", "max_completion_length", "loss_fn", "learning_rate"):
        assert field in text
    assert "at least two samples" in text


def test_bad_input_leaves_no_run_folder(tiny_model_dir, varied_bundle, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(StropError, match="empty"):
        run_grpo(tiny_config(tiny_model_dir, varied_bundle, dataset=str(empty)), tmp_path / "run", progress=False)
    with pytest.raises(StropError, match="compute_score|reward"):
        bad = write_bundle(tmp_path / "nofn", "def score(x):\n    return 1\n")
        run_grpo(tiny_config(tiny_model_dir, bad), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_killed_run_resumes_with_complete_metrics(tiny_model_dir, tmp_path):
    """kill -9 mid-run, then the same command again: steps continue from the checkpoint, each metrics row
    appears once, and the resumed steps match an uninterrupted run's exactly."""
    slow = write_bundle(tmp_path / "slow", "import time\n\ndef compute_score(data_source=None, solution_str=None, "
                                           "ground_truth=None, extra_info=None):\n    time.sleep(0.05)\n"
                                           "    return (len(solution_str) % 5) / 5.0\n")

    def command(run_dir):
        return [sys.executable, "-m", "strop.cli.main", "train", "--base-model", str(tiny_model_dir),
                "--dataset", "synthetic:add", "--steps", "6", "--group-size", "4", "--batch-size", "2",
                "--max-tokens", "8", "--rank", "4", "--lr", "0.01", "--save-every", "2", "--reward", str(slow),
                "--run-dir", str(run_dir), "--quiet"]

    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(command(run_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(read_jsonl(metrics)) < 3:
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(read_jsonl(metrics))
    assert 3 <= killed_at < 6, "the run should have died mid-way"

    resumed = subprocess.run(command(run_dir), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    rows = read_jsonl(metrics)
    assert [r["step"] for r in rows] == list(range(6))

    straight = tmp_path / "straight"
    subprocess.run(command(straight), capture_output=True, text=True, timeout=300, check=True)
    expected = read_jsonl(straight / "metrics.jsonl")
    assert [r["reward"] for r in rows] == pytest.approx([r["reward"] for r in expected], abs=1e-6)


def test_prompts_too_long_for_max_seq_length_are_refused_up_front(tiny_model_dir, varied_bundle, tmp_path):
    config = tiny_config(tiny_model_dir, varied_bundle, max_seq_length=12, max_completion_length=8)
    with pytest.raises(StropError, match="max_seq_length"):
        run_grpo(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


# --- steps and passes (seed 003: "100 steps make four passes over a 200-row subset") ------------------------

def test_max_steps_is_the_number_of_steps_and_the_rows_are_passed_over_as_often_as_it_takes():
    from strop.rl.config import count_steps
    from strop.rl.grpo import StepBatches
    seed_003 = GRPOConfig(base_model="strop/tiny-random", dataset="synthetic:add", batch_size=8, epochs=1,
                          max_steps=100)
    assert count_steps(200, seed_003) == (100, 4)
    config = GRPOConfig(base_model="strop/tiny-random", dataset="synthetic:add", batch_size=8, max_steps=6)
    batches = StepBatches(16, config)
    assert (len(batches), batches.passes) == (6, 3)
    passes = [sorted(i for step in range(p * 2, p * 2 + 2) for i in batches[step]) for p in range(3)]
    assert passes == [list(range(16))] * 3  # each pass takes every row once
    assert batches[0] != batches[2]  # and is shuffled afresh
    assert [batches.pass_of(s) for s in range(6)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(IndexError):
        batches[6]


def test_without_max_steps_epochs_passes_are_made_and_a_short_last_batch_is_kept():
    from strop.rl.config import count_steps
    from strop.rl.grpo import StepBatches
    config = GRPOConfig(base_model="strop/tiny-random", dataset="synthetic:add", batch_size=4, epochs=2)
    assert count_steps(10, config) == (6, 2)
    batches = StepBatches(10, config)
    assert [len(batches[s]) for s in range(6)] == [4, 4, 2, 4, 4, 2]


def test_off_policy_steps_sample_ahead_under_older_weights(tiny_model_dir, varied_bundle, tmp_path):
    """maxOffPolicySteps k: step s trains on rollouts sampled before the last k updates, with the step's own seed;
    the sampler's logprobs then differ from the trainer's, and the importance weights see it."""
    on = run_grpo(tiny_config(tiny_model_dir, varied_bundle, max_steps=4, save_every=4), tmp_path / "on",
                  progress=False)
    one = run_grpo(tiny_config(tiny_model_dir, varied_bundle, max_steps=4, save_every=4, max_off_policy_steps=1),
                   tmp_path / "one", progress=False)
    two = run_grpo(tiny_config(tiny_model_dir, varied_bundle, max_steps=4, save_every=4, max_off_policy_steps=2),
                   tmp_path / "two", progress=False)
    assert [m["offPolicySteps"] for m in one.metrics] == [0, 1, 1, 1]
    assert [m["offPolicySteps"] for m in two.metrics] == [0, 1, 2, 2]
    assert all(m["overlapSeconds"] >= 0 for m in one.metrics) and "offPolicySteps" not in on.metrics[0]

    def completions(run, step):
        return [r["completion"] for r in map(json.loads, (run.run_dir / "rollouts.jsonl").read_text().splitlines())
                if r["step"] == step]
    assert completions(one, 0) == completions(on, 0)       # step 0: the same weights either way
    assert completions(one, 1) == completions(two, 1)      # step 1: both sampled under the initial weights ...
    assert completions(one, 1) != completions(on, 1)       # ... which the on-policy run had already updated
    assert all(abs(m["klSampleTrain"]) < 1e-6 for m in on.metrics)
    assert all(abs(m["klSampleTrain"]) > 1e-4 for m in one.metrics[1:] if m["datums"])
