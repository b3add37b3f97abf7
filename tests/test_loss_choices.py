"""Issue 40's loss choices: advantage estimators, loss aggregation, overlong handling, GSPO's sequence ratio,
clip-higher, and several updates a batch. Hand-worked numbers for every pure function first, then each setting
through GRPOConfig, the run descriptor (and its pinned record) and `strop train`, then one tiny run a family."""

import json
import math

import pytest
import torch

from strop import types
from strop.engine import losses
from strop.errors import StropError
from strop.rl.advantages import aggregation_scales, batch_advantages, overlong_penalty, rloo_advantages
from strop.rl.config import GRPOConfig
from strop.rl.updates import against_old, aggregated, minibatch_indices
from test_descriptor import problems, seed

T = torch.tensor


# --- 4. advantage estimators ------------------------------------------------------------------------------


def test_group_mean_is_todays_advantage():
    [adv] = batch_advantages([T([1.0, 0.0, 0.0, 1.0])])
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]
    [scaled] = batch_advantages([T([1.0, 0.0, 0.0, 1.0])], scale_by_std=True)
    assert scaled.tolist() == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)    # the group's std is 0.5


def test_rloo_compares_each_reward_with_the_others_mean():
    # one right of four: 1 - mean(0, 0, 0) = 1; each wrong one 0 - mean(1, 0, 0) = -1/3
    assert rloo_advantages(T([1.0, 0.0, 0.0, 0.0])).tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    # G / (G - 1) times the group-mean advantage: [3, 1] -> group mean [1, -1] -> rloo [2, -2]
    [adv] = batch_advantages([T([3.0, 1.0])], "rloo")
    assert adv.tolist() == [2.0, -2.0]


def test_reinforce_plus_plus_normalises_over_the_batch():
    # centred [1, -1] and [0.5, -0.5]; pooled variance (1 + 1 + 0.25 + 0.25) / 4 = 0.625, std 0.7906
    a, b = batch_advantages([T([2.0, 0.0]), T([1.0, 0.0])], "reinforce++")
    std = math.sqrt(0.625)
    assert a.tolist() == pytest.approx([1 / std, -1 / std], rel=1e-5)
    assert b.tolist() == pytest.approx([0.5 / std, -0.5 / std], rel=1e-5)
    # over the trained groups only: the second group's std 0.5 divides both
    a, b = batch_advantages([T([2.0, 0.0]), T([1.0, 0.0])], "reinforce++", normalise_over=[1])
    assert a.tolist() == pytest.approx([2.0, -2.0], rel=1e-5) and b.tolist() == pytest.approx([1.0, -1.0], rel=1e-5)
    # a flat batch has no spread: its advantages stay 0, not NaN
    [flat] = batch_advantages([T([0.3, 0.3])], "reinforce++")
    assert flat.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        batch_advantages([T([1.0, 0.0])], "ppo")


# --- 1. loss aggregation ----------------------------------------------------------------------------------


def test_aggregations_weigh_sequences_of_unequal_length_differently():
    """Sequence a: 3 tokens, advantage +1; sequence b: 1 token, advantage -1; on-policy importance sampling, so
    each token's loss is -A: a sums to -3, b to +1."""
    assert aggregation_scales([3, 1], "token-sum") == [1.0, 1.0]
    assert aggregation_scales([3, 1], "token-mean") == [0.25, 0.25]
    assert aggregation_scales([3, 1], "sequence-mean") == pytest.approx([1 / 6, 1 / 2])
    assert aggregation_scales([3, 1], "constant", normalizer=10) == [0.1, 0.1]
    lp_a, lp_b = torch.zeros(3), torch.zeros(1)

    def loss(aggregation: str, normalizer=None) -> float:
        s_a, s_b = aggregation_scales([3, 1], aggregation, normalizer)
        return float(losses.importance_sampling_loss(lp_a, lp_a.detach(), s_a * torch.ones(3))
                     + losses.importance_sampling_loss(lp_b, lp_b.detach(), s_b * -torch.ones(1)))
    # token-sum: -3 + 1; token-mean: (-3 + 1) / 4 tokens; sequence-mean: (-3/3 + 1/1) / 2 = 0 (each sequence
    # weighs alike, so the long one no longer wins); constant: (-3 + 1) / 10
    assert [loss("token-sum"), loss("token-mean"), loss("sequence-mean"), loss("constant", 10)] == \
        pytest.approx([-2.0, -0.5, 0.0, -0.2])
    with pytest.raises(ValueError, match="normalizer greater than 0"):
        aggregation_scales([3], "constant")


def _datum(advantages: list[float], logprobs: list[float]) -> types.Datum:
    n = len(advantages)
    return types.Datum(model_input=types.ModelInput.from_ints(list(range(1, n + 1))), loss_fn_inputs={
        "target_tokens": types.TensorData.from_torch(torch.arange(2, n + 2)),
        "logprobs": types.TensorData.from_torch(T(logprobs)),
        "advantages": types.TensorData.from_torch(T(advantages))})


def test_aggregation_scales_each_datums_advantages_by_its_trained_tokens():
    # datum 0: a prompt position and 3 trained ones; datum 1: one trained token
    datums = [_datum([0.0, 1.0, 1.0, 1.0], [0.0, -1.0, -1.0, -1.0]), _datum([-1.0], [-2.0])]
    config = GRPOConfig(base_model="x", loss_aggregation="sequence-mean")
    out = [d.loss_fn_inputs["advantages"].to_torch().tolist() for d in aggregated(datums, config)]
    assert out[0] == pytest.approx([0.0, 1 / 6, 1 / 6, 1 / 6]) and out[1] == pytest.approx([-0.5])
    # Dr. GRPO's constant, by default batch x group x max tokens = 2 x 2 x 5 = 20
    config = GRPOConfig(base_model="x", loss_aggregation="constant", batch_size=2, group_size=2,
                        max_completion_length=5)
    assert aggregated(datums, config)[1].loss_fn_inputs["advantages"].to_torch().tolist() == pytest.approx([-0.05])
    assert aggregated(datums, GRPOConfig(base_model="x"))[0] is datums[0]     # token-sum: untouched


# --- 5. overlong ------------------------------------------------------------------------------------------


def test_overlong_soft_penalty():
    # limit 100, buffer 20: free up to 80, then falling linearly to -1 at the limit
    assert [overlong_penalty(n, 100, 20) for n in (50, 80, 90, 95, 100)] == [0.0, 0.0, -0.5, -0.75, -1.0]
    assert overlong_penalty(8, 8, 1) == -1.0 and overlong_penalty(7, 8, 1) == 0.0


def test_overlong_judges_a_rollout_by_its_cut_turns():
    from strop.rl import overlong
    from strop.rl.types import Rollout, Turn
    prompt = types.ModelInput.from_ints([1])
    short = Rollout(turns=(Turn(prompt, tokens=(1, 2), logprobs=(0.0, 0.0), stop_reason="stop"),))
    cut = Rollout(turns=(Turn(prompt, tokens=(1, 2), logprobs=(0.0, 0.0), stop_reason="stop"),
                         Turn(prompt, tokens=(1,) * 8, logprobs=(0.0,) * 8, stop_reason="length")))
    mask = GRPOConfig(base_model="x", overlong="mask", max_completion_length=8)
    assert (overlong.masked(short, mask), overlong.masked(cut, mask)) == (False, True)
    soft = GRPOConfig(base_model="x", overlong="soft-penalty", max_completion_length=8, overlong_buffer=4)
    assert (overlong.penalty(short, soft), overlong.penalty(cut, soft)) == (0.0, -1.0)
    keep = GRPOConfig(base_model="x", max_completion_length=8)
    assert not overlong.masked(cut, keep) and overlong.penalty(cut, keep) == 0.0


# --- 2. GSPO's sequence ratio and clip-higher ------------------------------------------------------------


def test_sequence_ratio_is_the_geometric_mean_of_the_token_ratios():
    # log-ratios 0.5, 0, -1 on the trained positions (the first is a prompt position): mean -1/6
    lp = T([-0.7, -1.0, -2.0, -3.0], requires_grad=True)
    old, trained = T([0.0, -1.5, -2.0, -2.0]), T([False, True, True, True])
    s = math.exp(-1 / 6)
    seq = losses.sequence_logprobs(lp, old, trained)
    assert (seq - old)[1:].exp().tolist() == pytest.approx([s] * 3)
    # importance sampling, A = 2 on each trained token: -3 x 2 x s; each trained token's gradient is -A x s
    adv = T([0.0, 2.0, 2.0, 2.0])
    loss, _ = losses.sequence_loss("importance_sampling", lp, {"logprobs": old, "advantages": adv},
                                   sequence_ratio=True)
    assert float(loss) == pytest.approx(-6 * s)
    loss.backward()
    assert lp.grad.tolist() == pytest.approx([0.0, -2 * s, -2 * s, -2 * s])


def test_ppo_clips_the_whole_sequence_with_a_sequence_ratio():
    lp, old = T([-1.0, -2.0, -3.0]), T([-1.5, -2.0, -2.0])     # token ratios 1.65, 1, 0.37; sequence 0.846
    adv = -torch.ones(3)
    inputs = {"logprobs": old, "advantages": adv}
    # tokens, clip (0.9, 1.1), A = -1: min(rA, clip(r)A) per token: -1.65 (kept), -1, -0.9 (clipped)
    loss, clipped = losses.sequence_loss("ppo", lp, inputs, 0.9, 1.1)
    assert float(loss) == pytest.approx(math.exp(0.5) + 1 + 0.9) and clipped.tolist() == [False, False, True]
    # sequence: s = 0.846 < 0.9 with A < 0, so every token is clipped at 0.9: loss 3 x 0.9
    loss, clipped = losses.sequence_loss("ppo", lp, inputs, 0.9, 1.1, sequence_ratio=True)
    assert float(loss) == pytest.approx(2.7) and clipped.tolist() == [True, True, True]
    # clip-higher: an upper bound of 1.7 keeps the first token's ratio 1.65 with A > 0 unclipped, 1.1 clips it
    _, low = losses.sequence_loss("ppo", lp, {"logprobs": old, "advantages": torch.ones(3)}, 0.9, 1.1)
    _, high = losses.sequence_loss("ppo", lp, {"logprobs": old, "advantages": torch.ones(3)}, 0.9, 1.7)
    assert low.tolist() == [True, False, False] and high.tolist() == [False, False, False]
    with pytest.raises(ValueError, match="dro has no importance ratio"):
        losses.sequence_loss("dro", lp, inputs, sequence_ratio=True)


def test_the_clip_range_reaches_the_loss_options():
    from strop.rl.step import loss_config
    config = GRPOConfig(base_model="x", loss_fn="ppo", clip_high=1.28, importance_ratio="sequence")
    assert loss_config(config) == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28,
                                   "importance_ratio": "sequence"}
    assert loss_config(GRPOConfig(base_model="x")) == {}     # today's defaults: nothing added


# --- 3. several updates a batch ---------------------------------------------------------------------------


def test_minibatches_and_the_old_logprobs_of_later_passes():
    assert minibatch_indices(5, 2) == [[0, 1], [2, 3, 4]] and minibatch_indices(2, 5) == [[0], [1]]
    assert minibatch_indices(3, 1) == [[0, 1, 2]]
    # a prompt position (logprob 0, advantage 0) and two sampled tokens; the trainer's logprobs before the
    # first update are -0.3 (prompt), -1.5 and -2: they become the old logprobs where tokens were sampled
    datum = _datum([0.0, 1.0, 1.0], [0.0, -1.0, -2.0])
    out = against_old(datum, T([-0.3, -1.5, -2.0]), tis_cap=None).loss_fn_inputs
    assert out["logprobs"].to_torch().tolist() == [0.0, -1.5, -2.0]
    assert out["advantages"].to_torch().tolist() == [0.0, 1.0, 1.0]
    # with rollout correction, the advantages carry min(p_old / p_sampler, cap): exp(-0.5) and 1
    out = against_old(datum, T([-0.3, -1.5, -2.0]), tis_cap=2.0).loss_fn_inputs
    assert out["advantages"].to_torch().tolist() == pytest.approx([0.0, math.exp(-0.5), 1.0])
    assert against_old(datum, T([-0.3, 0.5, -2.0]), tis_cap=1.2).loss_fn_inputs["advantages"].to_torch()[1] == \
        pytest.approx(1.2)
