"""What a step learns from: groups judged on a named reward term (varianceOn), DAPO's dynamic sampling filling
batchSize informative groups and counting the rest, and the learning-rate warm-up; hand-worked values first,
then the settings through GRPOConfig, the run descriptor and `strop train`, then one tiny run."""

import json

import pytest

from strop.errors import StropError
from strop.rl.config import GRPOConfig
from strop.rl.dynamic_sampling import TaskDraws, fill_groups, informative, kept_groups
from strop.rl.schedule import warmed_up_rate
from strop.rl.types import Rollout
from test_descriptor import problems, seed


def group(*rewards, correct=None) -> tuple:
    """A group of rollouts with these total rewards (and, for an environment, these correctness terms)."""
    if correct is None:
        return tuple(Rollout(reward=r, scores={"total": r}) for r in rewards)
    return tuple(Rollout(reward=r, info={"terms": {"correctness": c, "format": r - c}})
                 for r, c in zip(rewards, correct))


def test_dynamic_sampling_fills_the_batch_with_informative_groups_and_counts_the_rest():
    asked = []
    rounds = {1: [group(0, 0), group(1, 0)], 2: [group(1, 1), group(0, 1)]}

    def draw(round_, n):
        asked.append((round_, n))
        return rounds[round_][:n]

    # batch 2: the first batch has one informative group (the second); round 1 draws a batch of 2 more, of which
    # the second is informative: 4 tasks drawn, groups 1 and 3 kept, 2 dropped, and no round 2
    groups = fill_groups([group(1, 1), group(0, 1)], draw, batch_size=2, max_tasks=8)
    assert asked == [(1, 2)] and len(groups) == 4
    assert kept_groups(groups, limit=2) == [1, 3] and len(groups) - 2 == 2

    # nothing informative: rounds stop at the cap of 5 tasks (2 + 2 + 1), nothing kept, all 5 dropped
    asked.clear()
    flat = fill_groups([group(1, 1), group(0, 0)], lambda r, n: asked.append((r, n)) or [group(0, 0)] * n,
                       batch_size=2, max_tasks=5)
    assert asked == [(1, 2), (2, 1)] and len(flat) == 5 and kept_groups(flat, limit=2) == []

    # more informative groups than the batch: the first 2 are trained, the surplus is dropped with the flat ones
    surplus = fill_groups([group(0, 1), group(0, 0)], lambda r, n: [group(1, 0), group(0.5, 0)][:n],
                          batch_size=2, max_tasks=8)
    assert len(surplus) == 4 and kept_groups(surplus, limit=2) == [0, 2]

    # a full first batch draws nothing; a task list that runs out ends the rounds
    assert fill_groups([group(0, 1), group(1, 0)], lambda r, n: pytest.fail("drew"), batch_size=2, max_tasks=8)
    assert len(fill_groups([group(0, 0)], lambda r, n: [], batch_size=2, max_tasks=8)) == 1


def test_variance_is_judged_on_the_named_term():
    # finance-sql's episodes: 1.1 correct with a number, 0.1 wrong with a number, 0 no number
    no_correct = group(0.1, 0.0, 0.1, 0.0, correct=[0, 0, 0, 0])   # only the format differs
    mixed = group(1.1, 0.1, 0.1, 0.0, correct=[1, 0, 0, 0])
    ran_out = (Rollout(reward=0.0), *group(1.1, correct=[1]))      # no terms reported: scores 0 on each
    assert informative([no_correct, mixed, ran_out]) == [True, True, True]            # on the total
    assert informative([no_correct, mixed, ran_out], "correctness") == [False, True, True]
    with pytest.raises(StropError, match="'correct'.*report correctness, format"):
        informative([mixed], "correct")
    # a step in which no episode submitted (a weak model's first step) reports no term at all: no spread, no error
    nobody = (Rollout(reward=0.0), Rollout(reward=0.0))
    assert informative([nobody, nobody], "correctness") == [False, False]


def test_further_tasks_are_drawn_once_a_step_and_the_same_way_again():
    items = [object() for _ in range(10)]
    draws = TaskDraws(items, seed=3)
    first = draws(step=4, round_=1, n=3, taken=items[:2])
    assert len(first) == 3 and not set(map(id, first)) & set(map(id, items[:2]))
    assert [id(x) for x in draws(4, 1, 3, items[:2])] == [id(x) for x in first]       # seeded: a resume agrees
    assert [id(x) for x in draws(5, 1, 3, items[:2])] != [id(x) for x in first]
    rest = draws(4, 2, 99, items[:2] + first)
    assert len(rest) == 5 and {id(x) for x in first + rest + items[:2]} == set(map(id, items))
    assert draws(4, 3, 2, items) == []
    big = [object() for _ in range(100_000)]
    assert len({id(x) for x in TaskDraws(big, seed=0)(0, 1, 64, big[:8])}) == 64


def test_learning_rate_warm_up():
    assert [warmed_up_rate(1e-4, s, 4) for s in range(6)] == pytest.approx([2.5e-5, 5e-5, 7.5e-5, 1e-4, 1e-4, 1e-4])
    assert warmed_up_rate(1e-4, 0, 0) == 1e-4


def test_config_checks_the_settings_together():
    with pytest.raises(StropError) as err:
        GRPOConfig(kl_reference="adapter", max_tasks_per_step=4, warmup_steps=-1)
    text = str(err.value)
    assert "kl_reference: must be one of start, base" in text and "warmup_steps: must be an integer from 0" in text
    assert "max_tasks_per_step: caps dynamic sampling's draws" in text
    with pytest.raises(StropError, match=r"max_tasks_per_step: must be at least batch_size \(8\)"):
        GRPOConfig(dynamic_sampling=True, max_tasks_per_step=4)
    with pytest.raises(StropError, match=r"variance_on: 'gsm8k' is not one of the reward terms \(correct\)"):
        GRPOConfig(variance_on="gsm8k")
    config = GRPOConfig(variance_on="correct", dynamic_sampling=True)
    assert (config.kl_reference, config.max_tasks_per_step, config.warmup_steps) == ("start", None, 0)
    env = GRPOConfig(variance_on="correctness", environment={"name": "finance-sql"})  # the environment's own term
    assert env.variance_on == "correctness"


def test_descriptor_fields_map_to_the_config_and_are_checked_with_their_paths():
    data = seed()
    hp = data["config"]["rlHyperparams"]
    hp.update(klReference="base", varianceOn="scoring", dynamicSampling={"enabled": True, "maxTasksPerStep": 24})
    hp["optimizer"]["warmupSteps"] = 5
    run = validate_descriptor_ok(data)
    config = run.to_grpo_config("/pinned/train.jsonl", run.reward_term_specs(["/pinned/b#reward:compute_score"]))
    assert (config.kl_reference, config.variance_on, config.dynamic_sampling, config.max_tasks_per_step,
            config.warmup_steps) == ("base", "scoring", True, 24, 5)
    default = validate_descriptor_ok(seed()).to_dict()["config"]["rlHyperparams"]
    assert default["klReference"] == "start" and default["dynamicSampling"] == {"enabled": False,
                                                                                "maxTasksPerStep": None}

    hp.update(klReference="adapter", dynamicSampling={"enabled": "yes", "maxTasksPerStep": 4})
    hp["optimizer"]["warmupSteps"] = -1
    found = problems(data)
    assert any(p.startswith('$.config.rlHyperparams.klReference: must be "start"') for p in found), found
    assert any(p.startswith("$.config.rlHyperparams.dynamicSampling.enabled: must be true or false") for p in found)
    assert any(p.startswith("$.config.rlHyperparams.optimizer.warmupSteps: must be an integer") for p in found)
    hp.update(klReference="start", dynamicSampling={"enabled": True, "maxTasksPerStep": 4})
    hp["optimizer"]["warmupSteps"] = 0
    assert problems(data) == ["$.config.rlHyperparams.dynamicSampling.maxTasksPerStep: must be at least "
                              "$.config.rlHyperparams.batchSize (8): the step's own batch is drawn first (got 4)"]
    hp["dynamicSampling"] = {"maxTasksPerStep": 16}
    assert problems(data)[0].startswith("$.config.rlHyperparams.dynamicSampling.maxTasksPerStep: caps the draws")
    hp["dynamicSampling"] = {"enabled": True, "max_tasks_per_step": 16}
    assert "did you mean 'maxTasksPerStep'" in problems(data)[0]


def validate_descriptor_ok(data):
    from strop.control import validate_descriptor
    return validate_descriptor(data)


def test_strop_train_flags_name_themselves(capsys):
    from strop.cli.main import main
    assert main(["train", "--dynamic-sampling", "--max-tasks-per-step", "2", "--batch-size", "4",
                 "--warmup-steps", "-3", "--variance-on", "nope"]) == 1
    err = capsys.readouterr().err
    assert "--max-tasks-per-step (max_tasks_per_step): must be at least batch_size (4)" in err
    assert "--warmup-steps (warmup_steps): must be an integer from 0" in err
    assert "--variance-on (variance_on): 'nope' is not one of the reward terms (gsm8k)" in err
    assert main(["train", "--method", "sft", "--dataset", "x.jsonl", "--kl-reference", "base"]) == 1
    assert "--kl-reference: a GRPO setting" in capsys.readouterr().err


def test_a_run_with_dynamic_sampling_trains_on_a_full_batch(tiny_model_dir, tmp_path):
    """Rows with an even answer score a flat 0.25 (no signal); the others by length. Each step draws until 2
    groups have variance: tasks drawn = kept + dropped, every kept group trains, the learning rate warms up."""
    from strop.rl import run_grpo
    bundle = tmp_path / "half"
    bundle.mkdir()
    (bundle / "reward.py").write_text(
        "def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):\n"
        "    return 0.25 if int(ground_truth.split('####')[-1]) % 2 == 0 else (len(solution_str) % 7) / 7.0\n")
    config = GRPOConfig(base_model=str(tiny_model_dir), dataset="synthetic:add", dataset_limit=40, group_size=4,
                        batch_size=2, max_steps=2, max_completion_length=8, learning_rate=1e-2, lora_rank=4,
                        save_every=10, sandbox_graders=False, dynamic_sampling=True, max_tasks_per_step=8,
                        warmup_steps=2, reward_terms=[{"name": "half", "weight": 1.0, "grader": str(bundle)}])
    rows = run_grpo(config, tmp_path / "run", progress=False).metrics
    for row in rows:
        assert row["groupsKept"] == 2 and row["tasksDrawn"] == row["groupsKept"] + row["groupsDropped"]
        assert 2 <= row["tasksDrawn"] <= 8 and row["datums"] == 2 * 4            # one datum per kept rollout
        assert row["zeroVarianceGroups"] * row["tasksDrawn"] <= row["groupsDropped"]
    assert [r["learningRate"] for r in rows] == pytest.approx([5e-3, 1e-2])
    assert any(r["tasksDrawn"] > 2 for r in rows), rows        # some step had a flat group and drew more
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 4 * sum(r["tasksDrawn"] for r in rows)   # every drawn group is recorded
