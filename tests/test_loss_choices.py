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
from test_control import home, workspace  # noqa: F401 - fixtures of the control-plane tests
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


# --- the settings through every front end -----------------------------------------------------------------


def test_defaults_are_todays_behaviour_and_bad_values_are_named():
    config = GRPOConfig(base_model="x")
    assert (config.advantage_estimator, config.loss_aggregation, config.overlong, config.importance_ratio,
            config.clip_low, config.clip_high, config.updates_per_batch, config.minibatches) == \
        ("group-mean", "token-sum", "keep", "token", None, None, 1, 1)
    with pytest.raises(StropError) as err:
        GRPOConfig(base_model="x", advantage_estimator="grpo", loss_aggregation="mean", overlong="cut",
                   importance_ratio="seq", updates_per_batch=0, minibatches=10**6, clip_high=0.5, loss_fn="ppo")
    text = str(err.value)
    for line in ("advantage_estimator: must be one of group-mean, rloo, reinforce++, got 'grpo'",
                 "loss_aggregation: must be one of token-sum, token-mean, sequence-mean, constant, got 'mean'",
                 "overlong: must be one of keep, mask, soft-penalty, got 'cut'",
                 "importance_ratio: must be one of token, sequence, got 'seq'",
                 "updates_per_batch: must be an integer from 1 to 64 (got 0)",
                 "minibatches: must be an integer from 1 to 4,096", "clip_high: must be a number from 1 to 100"):
        assert line in text, text
    for settings, message in (
            ({"loss_fn": "dro", "loss_aggregation": "token-mean"}, "'dro' has a penalty that does not scale"),
            ({"loss_normalizer": 5.0}, "loss_normalizer: divides the loss with loss_aggregation constant"),
            ({"overlong_buffer": 4}, "set overlong to soft-penalty"),
            ({"overlong": "soft-penalty", "overlong_buffer": 300}, "must be at most max_completion_length (256)"),
            ({"loss_fn": "dro", "importance_ratio": "sequence"}, "'dro' has none"),
            ({"clip_high": 1.28}, "clip_high: clips the ratio of ppo and cispo; the loss is 'importance_sampling'"),
            ({"loss_fn": "ppo", "clip_low": 0.9, "loss_fn_config": {"clip_low_threshold": 0.7}}, "give it once"),
            ({"loss_fn": "cispo", "clip_low": 1.0, "clip_high": 1.0}, "clip_high: must be above clip_low (1)"),
            ({"advantage_estimator": "rloo", "scale_by_std": True}, "rloo is its own estimator")):
        with pytest.raises(StropError, match=message.replace("(", r"\(").replace(")", r"\)")):
            GRPOConfig(base_model="x", **settings)


def _descriptor(**hp):
    data = seed()
    data["config"]["rlHyperparams"].update(hp)
    return data


def test_descriptor_fields_map_to_the_config_with_json_paths_for_mistakes():
    from strop.control import validate_descriptor
    run = validate_descriptor(_descriptor(lossFn="ppo", advantageEstimator="rloo", lossAggregation="constant",
                                          lossNormalizer=512.0, overlong="soft-penalty", overlongBuffer=16,
                                          importanceRatio="sequence", clipLow=0.8, clipHigh=1.28,
                                          updatesPerBatch=2, minibatches=2))
    config = run.to_grpo_config("/pinned/train.jsonl", run.reward_term_specs(["/pinned/b#reward:compute_score"]))
    assert (config.loss_fn, config.advantage_estimator, config.loss_aggregation, config.loss_normalizer,
            config.overlong, config.overlong_buffer, config.importance_ratio, config.clip_low, config.clip_high,
            config.updates_per_batch, config.minibatches) == \
        ("ppo", "rloo", "constant", 512.0, "soft-penalty", 16, "sequence", 0.8, 1.28, 2, 2)
    default = validate_descriptor(seed()).to_dict()["config"]["rlHyperparams"]
    assert (default["lossFn"], default["advantageEstimator"], default["lossAggregation"], default["overlong"],
            default["importanceRatio"], default["updatesPerBatch"], default["minibatches"]) == \
        ("importance_sampling", "group-mean", "token-sum", "keep", "token", 1, 1)

    found = problems(_descriptor(advantageEstimator="grpo", updatesPerBatch="2", clipHigh=0.5, lossFn="ppo2"))
    at = "$.config.rlHyperparams."
    assert any(p.startswith(at + 'advantageEstimator: must be one of "group-mean", "rloo", "reinforce++"')
               for p in found), found
    assert any(p.startswith(at + "updatesPerBatch: must be an integer") for p in found), found
    assert any(p.startswith(at + "clipHigh: must be a number from 1 to 100") for p in found), found
    assert any(p.startswith(at + 'lossFn: must be one of "importance_sampling"') for p in found), found
    # settings that do not fit together, named by their paths and in the descriptor's words
    assert problems(_descriptor(overlongBuffer=8)) == [
        at + "overlongBuffer: is the length over which overlong soft-penalty's penalty grows: set overlong to "
             "soft-penalty, or leave overlongBuffer unset"]
    assert problems(_descriptor(clipHigh=1.28)) == [
        at + "clipHigh: clips the ratio of ppo and cispo; the loss is 'importance_sampling': set lossFn to one of "
             "them, or leave clipHigh unset"]
    assert "did you mean 'updatesPerBatch'" in problems(_descriptor(updates_per_batch=2))[0]


def test_strop_train_flags_set_the_choices_and_name_themselves(capsys):
    from strop.cli.main import main
    from strop.cli.train import config_values, register
    import argparse
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["train", "--loss", "cispo", "--advantage-estimator", "reinforce++",
                              "--loss-aggregation", "token-mean", "--overlong", "mask", "--importance-ratio",
                              "sequence", "--clip-low", "0.7", "--clip-high", "1.3", "--updates-per-batch", "3",
                              "--minibatches", "2"])
    config = GRPOConfig(**config_values(args, [{"grader": "builtin:gsm8k", "weight": 1.0}]))
    assert (config.advantage_estimator, config.loss_aggregation, config.overlong, config.importance_ratio,
            config.clip_low, config.clip_high, config.updates_per_batch, config.minibatches) == \
        ("reinforce++", "token-mean", "mask", "sequence", 0.7, 1.3, 3, 2)
    assert main(["train", "--updates-per-batch", "0", "--overlong-buffer", "4", "--loss-normalizer", "-1"]) == 1
    err = capsys.readouterr().err
    assert "--updates-per-batch (updates_per_batch): must be an integer from 1 to 64 (got 0)" in err
    assert "--overlong-buffer (overlong_buffer): is the length over which" in err
    assert "--loss-normalizer (loss_normalizer): must be a number greater than 0" in err
    assert main(["train", "--method", "sft", "--dataset", "x.jsonl", "--minibatches", "2"]) == 1
    assert "--minibatches: a GRPO setting" in capsys.readouterr().err


def test_a_run_pins_its_loss_choices(workspace, capsys):  # noqa: F811
    from test_control import descriptor, run
    path = descriptor(workspace, **{"config.rlHyperparams.lossFn": "ppo",
                                    "config.rlHyperparams.lossAggregation": "constant",
                                    "config.rlHyperparams.overlong": "soft-penalty",
                                    "config.rlHyperparams.clipHigh": 1.28,
                                    "config.rlHyperparams.updatesPerBatch": 2})
    code, out, err = run(capsys, "runs", "start", "-f", path, "--dry-run", "-o", "json")
    assert code == 0, err
    pinned = json.loads(out)["pinned"]["rl"]
    # defaults resolved: Dr. GRPO's constant is batch 2 x group 2 x 6 tokens, the buffer a quarter of 6
    assert {k: pinned[k] for k in ("lossFn", "advantageEstimator", "lossAggregation", "lossNormalizer", "overlong",
                                   "overlongBuffer", "importanceRatio", "clipLow", "clipHigh", "updatesPerBatch",
                                   "minibatches")} == \
        {"lossFn": "ppo", "advantageEstimator": "group-mean", "lossAggregation": "constant", "lossNormalizer": 24.0,
         "overlong": "soft-penalty", "overlongBuffer": 1, "importanceRatio": "token", "clipLow": 0.8,
         "clipHigh": 1.28, "updatesPerBatch": 2, "minibatches": 1}
    assert pinned["identicalTurns"] == "train"      # ppo: identical turns' gradients do not cancel


# --- one tiny run a family --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir, tmp_path_factory):
    """run(name, **settings): one step of GRPO on the tiny model (2 prompts x 4 samples x 8 tokens), rewarded by
    the length of the completion's text so groups have variance; returns its metrics rows."""
    from strop.rl import run_grpo
    bundle = tmp_path_factory.mktemp("bundle")
    (bundle / "reward.py").write_text(
        "def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):\n"
        "    return (len(solution_str) % 7) / 7.0\n")
    root = tmp_path_factory.mktemp("runs")

    def run(name: str, **settings) -> list[dict]:
        values = dict(base_model=str(tiny_model_dir), dataset="synthetic:add", dataset_limit=8, group_size=4,
                      batch_size=2, max_steps=1, max_completion_length=8, learning_rate=1e-2, lora_rank=4,
                      save_every=10, sandbox_graders=False, report_to=[],
                      reward_terms=[{"name": "len", "weight": 1.0, "grader": str(bundle)}])
        return run_grpo(GRPOConfig(**{**values, **settings}), root / name, progress=False).metrics
    run.root = root
    return run


@pytest.fixture(scope="module")
def baseline(tiny_run):
    """The same tiny run with every loss choice at its default: what each family is compared with."""
    return tiny_run("baseline")[0]


def test_each_estimator_runs_end_to_end(tiny_run, baseline):
    assert baseline["datums"] > 0
    for estimator in ("rloo", "reinforce++"):
        [row] = tiny_run(estimator, advantage_estimator=estimator)
        # the same samples (same seed, same weights), other advantages: another loss
        assert row["reward"] == baseline["reward"] and row["datums"] == baseline["datums"]
        assert row["loss"] != pytest.approx(baseline["loss"]), estimator


def test_each_aggregation_runs_end_to_end(tiny_run, baseline):
    for aggregation in ("token-mean", "sequence-mean", "constant"):
        [row] = tiny_run(aggregation, loss_aggregation=aggregation)
        assert row["trainedTokens"] == baseline["trainedTokens"] and math.isfinite(row["loss"])
        # every completion has 8 tokens: token-mean divides the summed loss by the tokens, sequence-mean too;
        # constant by 2 x 4 x 8 = 64 > the trained tokens
        if aggregation != "constant":
            assert row["loss"] == pytest.approx(baseline["loss"] / baseline["trainedTokens"], rel=1e-4, abs=1e-7)
        else:
            assert row["loss"] == pytest.approx(baseline["loss"] / 64, rel=1e-4, abs=1e-7)


def test_overlong_handling_runs_end_to_end(tiny_run):
    # the random tiny model never stops by itself: every completion is cut at 8 tokens
    [masked] = tiny_run("mask", overlong="mask")
    assert masked["clippedFraction"] == 1.0
    assert masked["overlongMasked"] == 4 * (2 - round(masked["zeroVarianceGroups"] * 2))
    assert masked["datums"] == 0 and masked["trainedTokens"] == 0
    [soft] = tiny_run("soft", overlong="soft-penalty", overlong_buffer=2)
    assert soft["overlongPenalty"] == -1.0
    records = [json.loads(line) for line in (tiny_run.root / "soft" / "rollouts.jsonl").read_text().splitlines()]
    assert all(r["overlongPenalty"] == -1.0 for r in records) and len(records) == 8


def test_sequence_ratio_and_clip_higher_run_end_to_end(tiny_run):
    [row] = tiny_run("gspo", loss_fn="ppo", importance_ratio="sequence", clip_low=0.9997, clip_high=1.0004)
    assert len(row["updateClippedFractions"]) == 1 and math.isfinite(row["loss"])
    config = json.loads((tiny_run.root / "gspo" / "config.json").read_text())
    assert (config["importance_ratio"], config["clip_high"]) == ("sequence", 1.0004)


def test_several_updates_a_batch_reuse_it_and_the_clip_binds(tiny_run):
    from safetensors.torch import load_file
    [row] = tiny_run("ppo", loss_fn="ppo", updates_per_batch=3, minibatches=2, learning_rate=5e-2)
    shares = row["updateClippedFractions"]
    assert row["optimizerSteps"] == 6 and len(shares) == 6
    # the first pass is on-policy (float32 sampler and trainer agree): nothing to clip; by the later passes the
    # policy has moved off the batch and the clip cuts some tokens
    assert shares[0] < 0.05 and max(shares[2:]) > shares[0], shares
    weights = load_file(str(tiny_run.root / "ppo" / "final" / "adapter_model.safetensors"))
    assert any(float(w.abs().sum()) > 0 for k, w in weights.items() if "lora_B" in k)
