"""Headroom before compute (`strop envs eval --samples K`): the figures by hand, then end to end with the tiny
model on the toy environment and on finance-sql through the CLI."""

import json

import pytest

from strop.cli.main import main
from strop.errors import StropError
from strop.evals.envs import evaluate_env
from strop.evals.headroom import TaskOutcome, figures, headroom, in_pool, pool_rows


def _o(split, index, kind, greedy, successes, samples=4):
    return TaskOutcome(split, index, f"{split}-{index}", kind, greedy, successes, samples)


def test_figures_worked_by_hand():
    # successes of 4: 0, 1, 3, 4; greedy right on the last two
    outcomes = [_o("e", 0, "a", False, 0), _o("e", 1, "a", False, 1), _o("e", 2, "b", True, 3), _o("e", 3, "b", True, 4)]
    f = figures(outcomes, 4)
    assert f["tasks"] == 4 and f["greedyPass@1"] == 0.5
    assert f["sampledPass@1"] == pytest.approx((0 + 1 + 3 + 4) / 16)   # 0.5
    assert f["pass@4"] == pytest.approx(3 / 4)                         # any sample right: three of four tasks
    assert f["rlPool"] == 2 and f["neverSolved"] == 1 and f["alwaysSolved"] == 1
    h = headroom(outcomes + [_o("m", 0, None, False, 2)], 4)
    assert h["splits"]["e"]["kinds"]["a"] == {"tasks": 2, "greedyPass@1": 0.0, "sampledPass@1": 0.125, "pass@4": 0.5,
                                              "rlPool": 1, "neverSolved": 1, "alwaysSolved": 0}
    assert h["splits"]["e"]["kinds"]["b"]["sampledPass@1"] == pytest.approx(7 / 8)
    assert h["splits"]["m"]["kinds"]["-"]["rlPool"] == 1                 # no kind given
    assert h["all"]["tasks"] == 5 and h["all"]["rlPool"] == 3
    assert h["all"]["sampledPass@1"] == pytest.approx((0 + 1 + 3 + 4 + 2) / 20)
    assert not in_pool(0, 4) and in_pool(1, 4) and in_pool(3, 4) and not in_pool(4, 4)
    rows = pool_rows(outcomes, "toy", {"seed": 0})
    assert [(r["index"], r["successes"]) for r in rows] == [(1, 1), (2, 3)]
    assert rows[0] == {"environment": "toy", "options": {"seed": 0}, "split": "e", "index": 1, "task": "e-1",
                       "kind": "a", "successes": 1, "samples": 4}
    with pytest.raises(ValueError, match="successes must be between 0 and samples=4"):
        _o("e", 0, "a", False, 5)
    # solved and missed at least twice each: of 0, 1, 3, 4 and 2 successes of 4, only the 2
    assert [r["index"] for r in pool_rows(outcomes + [_o("e", 4, "a", False, 2)], "toy", {}, least=2)] == [4]
    assert in_pool(2, 16, 2) and in_pool(14, 16, 2) and not in_pool(1, 16, 2) and not in_pool(15, 16, 2)


@pytest.mark.parametrize("samples, temperature, message", [(1, 1.0, "--samples must be an integer from 2"),
                                                           (10**6, 1.0, "--samples must be an integer from 2 to 1,024"),
                                                           (4, 0.0, "--temperature must be a number greater than 0"),
                                                           (None, float("nan"), "--temperature must be a number"),
                                                           (None, 0.5, "applies to the --samples K episodes")])
def test_bad_samples_or_temperature_are_refused_before_anything_loads(samples, temperature, message):
    with pytest.raises(StropError, match=message):
        evaluate_env("no/such-model", "toy_env:ToyEnv", samples=samples, temperature=temperature)


def _check_arithmetic(report, samples):
    h = report["headroom"]
    assert h["samples"] == samples and h["temperature"] == 1.0
    for split, s in report["splits"].items():
        assert len(s["samples"]) == s["n"] and all(len(g) == samples for g in s["samples"])
        mine = [t for t in h["tasks"] if t["split"] == split]
        assert [t["successes"] for t in mine] == [sum(e["passed"] for e in g) for g in s["samples"]]
        assert [t["greedy"] for t in mine] == [e["passed"] for e in s["episodes"]]
        n = len(mine)
        assert h["splits"][split]["all"]["tasks"] == n
        assert h["splits"][split]["all"]["greedyPass@1"] == pytest.approx(s["pass@1"])
        assert h["splits"][split]["all"]["sampledPass@1"] == pytest.approx(sum(t["successes"] for t in mine) /
                                                                           (n * samples))
        assert h["splits"][split]["all"][f"pass@{samples}"] == pytest.approx(sum(t["successes"] > 0 for t in mine) / n)
        assert sum(f["tasks"] for f in h["splits"][split]["kinds"].values()) == n


def test_a_local_model_on_the_toy_environment(tiny_model_dir):
    report = evaluate_env(str(tiny_model_dir), "toy_env:ToyEnv", limit=2, options={"max_turns": 1}, max_tokens=6,
                          samples=3)
    _check_arithmetic(report, 3)
    assert list(report["headroom"]["splits"]["eval"]["kinds"]) == ["-"]  # the toy's tasks have no kind


def test_envs_eval_samples_on_finance_sql_writes_the_table_json_and_pool(tiny_model_dir, tmp_path, capsys):
    pool = tmp_path / "pool.jsonl"
    argv = ["envs", "eval", "finance-sql", "--model", str(tiny_model_dir), "--splits", "eval-multi", "--limit", "3",
            "--max-tokens", "6", "--samples", "2", "--pool-out", str(pool)]
    assert main([*argv, "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    _check_arithmetic(report, 2)
    from strop.envs import get_env
    env = get_env("finance-sql", seed=0)
    kinds = {t.meta["kind"] for t in env.tasks("eval-multi", 3)}
    env.close()
    assert set(report["headroom"]["splits"]["eval-multi"]["kinds"]) == kinds
    lines = pool.read_text().splitlines()
    assert len(lines) == report["headroom"]["all"]["rlPool"] == report["poolOut"]["tasks"]
    assert main([*argv]) == 1  # the pool file exists now: refused, not written over
    assert "exists" in capsys.readouterr().err
    assert main([*argv[:-2]]) == 0
    out = capsys.readouterr().out
    assert "SAMPLED PASS@1" in out and "PASS@2" in out and "RL POOL (1..1 OF 2)" in out
    assert main(["envs", "eval", "finance-sql", "--model", str(tiny_model_dir), "--pool-out", str(tmp_path / "x")]) == 1
    assert "--pool-out needs --samples" in capsys.readouterr().err
    # --pool-min: at most half of K, and only with a pool to write; refused before anything is played
    assert main([*argv[:-2], "--pool-out", str(tmp_path / "y"), "--pool-min", "2"]) == 1
    assert "--pool-min must be from 1 to half of --samples (1)" in capsys.readouterr().err
    assert main([*argv[:-2], "--pool-min", "2"]) == 1
    assert "--pool-min applies to --pool-out" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()


# -- training on the pool ---------------------------------------------------------------------------------------

def test_pool_ids_read_the_file_pool_out_writes_in_order_once(tmp_path):
    from strop.rl import task_pool
    rows = pool_rows([_o("train", 0, "a", False, 1), _o("train", 1, "a", False, 0), _o("train", 2, "b", True, 3)],
                     "finance-sql", {"seed": 0})
    path = tmp_path / "pool.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + rows[:1]) + "\n")
    assert task_pool.pool_ids(str(path)) == ["train-0", "train-2"]  # the unsolved task is not in the pool
    assert task_pool.pool_ids(["b", "a", "b"]) == ["b", "a"]
    assert task_pool.tasks_problem(str(path)) is None and task_pool.tasks_problem(["a"]) is None
    assert "is not a file" in task_pool.tasks_problem(str(tmp_path / "nope.jsonl"))
    assert "non-empty list" in task_pool.tasks_problem([]) and "non-empty list" in task_pool.tasks_problem([3])
    for text, said in (("{not json\n", "line 1 is not JSON"), ('{"id": "x"}\n', 'line 1 has no "task" id'),
                       ("\n", "names no task")):
        path.write_text(text)
        with pytest.raises(StropError, match=said):
            task_pool.pool_ids(str(path))


def test_grpo_draws_only_the_pools_tasks_and_keeps_their_ids(tiny_model_dir, tmp_path):
    from strop.envs import get_env
    from strop.rl import GRPOConfig, run_grpo
    env = get_env("finance-sql", seed=1, max_turns=1)
    train = env.tasks("train")
    env.close()
    chosen = [train[5].id, train[2].id]
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"task": t}) + "\n" for t in chosen))
    config = GRPOConfig(base_model=str(tiny_model_dir), batch_size=2, group_size=2, max_steps=2,
                        max_completion_length=6, environment={"name": "finance-sql", "options": {"seed": 1,
                                                              "max_turns": 1}, "tasks": str(pool)})
    run_grpo(config, tmp_path / "run", progress=False)
    drawn = {json.loads(line)["task"] for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()}
    assert drawn == set(chosen)  # 2 steps x 2 groups from a pool of 2: both, and nothing else
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["environment"]["tasks"] == chosen  # the ids, not the file: a resume draws from the same tasks
    pool.write_text(json.dumps({"task": "finance-sql/s9/train/c0/q000"}) + "\n")
    with pytest.raises(StropError, match="1 of the pool's 1 task ids are not tasks of finance-sql's 'train' split"):
        run_grpo(config, tmp_path / "other", progress=False)
    assert not (tmp_path / "other").exists()  # refused before the run folder was made


def test_train_env_tasks_flag_is_checked_before_anything_loads(tmp_path, capsys):
    missing = tmp_path / "pool.jsonl"
    assert main(["train", "--environment", "finance-sql", "--env-tasks", str(missing), "--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert "--env-tasks" in err and "is not a file" in err
    assert main(["train", "--env-tasks", str(missing)]) == 1
    assert "--env-tasks chooses the tasks of --environment: give --environment too" in capsys.readouterr().err
