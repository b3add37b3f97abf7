"""Rollout correction: the sampler/trainer mismatch measured every step (mean, largest, share outside [0.5, 2])
and truncated importance sampling, each token's advantage times min(p_train / p_sampler, cap)."""

import json
import math

import pytest
import torch

from strop.control.descriptor import DescriptorError, validate_descriptor
from strop.engine import losses
from strop.errors import StropError
from strop.rl import GRPOConfig, run_grpo
from strop.rl.step import loss_config
from test_descriptor import SEED_003


def test_tis_weights_and_gradient_worked_by_hand():
    # p_train / p_sampler = 3, 1, 0.25 for three tokens; cap 2
    old = torch.tensor([math.log(0.1), math.log(0.5), math.log(0.8)])
    lp = torch.tensor([math.log(0.3), math.log(0.5), math.log(0.2)], requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 4.0])
    assert losses.tis_weights(lp, old, 2.0).tolist() == pytest.approx([2.0, 1.0, 0.25])
    loss, _ = losses.sequence_loss("importance_sampling", lp, {"logprobs": old, "advantages": adv}, tis_cap=2.0)
    # the loss's ratio is against the trainer's own logprobs (1 in value): -sum(w * A) = -(2 - 2 + 1)
    assert float(loss.detach()) == pytest.approx(-1.0)
    loss.backward()
    # d/d lp of -(w * A * exp(lp - sg(lp))) = -w * A
    assert lp.grad.tolist() == pytest.approx([-2.0, 2.0, -1.0])


def test_tis_under_ppo_and_cispo_weighs_the_advantage():
    old = torch.tensor([math.log(0.1), math.log(0.5)])
    lp = torch.tensor([math.log(0.4), math.log(0.5)], requires_grad=True)  # ratios 4 and 1; cap 3
    adv = torch.tensor([1.0, 1.0])
    for name in ("ppo", "cispo"):
        lp.grad = None
        loss, _ = losses.sequence_loss(name, lp, {"logprobs": old, "advantages": adv}, 0.8, 1.2, tis_cap=3.0)
        loss.backward()
        assert lp.grad.tolist() == pytest.approx([-3.0, -1.0]), name  # the clip never binds at ratio 1


def test_ratio_stats_count_the_tail():
    old = torch.log(torch.tensor([0.1, 0.5, 0.5, 0.9]))
    lp = torch.log(torch.tensor([0.3, 0.5, 0.2, 0.9]))  # ratios 3, 1, 0.4, 1
    largest, outside = losses.ratio_stats(lp, old)
    assert largest == pytest.approx(math.log(3)) and outside == 2
    assert losses.ratio_stats(lp[:0], old[:0]) == (0.0, 0.0)


def test_config_and_descriptor_name_the_correction():
    config = GRPOConfig(rollout_correction="tis", rollout_correction_cap=3.0, loss_fn_config={"clip_low_threshold": 0.7})
    assert loss_config(config) == {"clip_low_threshold": 0.7, "tis_cap": 3.0}
    assert loss_config(GRPOConfig()) == {}
    with pytest.raises(StropError, match="rollout_correction: must be one of auto, off, tis, got .yes."):
        GRPOConfig(rollout_correction="yes")
    with pytest.raises(StropError, match="rollout_correction_cap"):
        GRPOConfig(rollout_correction="tis", rollout_correction_cap=0.5)
    data = json.loads(SEED_003)
    data["config"]["rolloutCorrection"] = {"mode": "tis", "cap": 1000}
    with pytest.raises(DescriptorError) as refused:
        validate_descriptor(data)
    assert any(p.startswith("$.config.rolloutCorrection.cap") for p in refused.value.problems)
    data["config"]["rolloutCorrection"] = {"mode": "tis", "cap": 4.0}
    descriptor = validate_descriptor(data)
    config = descriptor.to_grpo_config("data.jsonl", [])
    assert (config.rollout_correction, config.rollout_correction_cap) == ("tis", 4.0)


def test_a_run_with_tis_logs_the_mismatch_and_learns_from_weighted_tokens(tiny_model_dir, tmp_path):
    # bf16 sampling and float32 training: a real mismatch between the two, which the metrics must show
    bundle = tmp_path / "lengthy"
    bundle.mkdir()
    (bundle / "reward.py").write_text("def compute_score(data_source=None, solution_str=None, ground_truth=None, "
                                      "extra_info=None):\n    return (len(solution_str) % 7) / 7.0\n")
    config = GRPOConfig(base_model=str(tiny_model_dir), dataset="synthetic:add", dataset_limit=8, max_steps=2,
                        reward_terms=[{"name": "length", "weight": 1.0, "grader": f"{bundle}#reward:compute_score"}],
                        sandbox_graders=False,
                        batch_size=2, group_size=4, max_completion_length=6, rollout_correction="tis",
                        rollout_correction_cap=2.0, save_every=2, keep_adapters=1)
    from strop.client import ServiceClient
    result = run_grpo(config, tmp_path / "run", service=ServiceClient(dtype="float32", sampler_dtype="bfloat16"),
                      progress=False)
    trained = [m for m in result.metrics if m["datums"] > 0]
    assert trained, "no step trained: the tiny model's rewards never varied"
    for row in trained:
        assert row["klSampleTrainMax"] > 0 and row["klSampleTrainMax"] >= abs(row["klSampleTrain"])
        assert 0.0 <= row["samplerRatioOutside"] <= 1.0
