"""`strop envs` as a user runs it, and multi-turn GRPO in the finance-sql environment."""

import json
import subprocess
import sys

import pytest

from strop.rl import GRPOConfig, run_grpo


def strop(*argv, stdin=""):
    return subprocess.run([sys.executable, "-m", "strop.cli.main", *map(str, argv)], input=stdin, capture_output=True,
                          text=True, timeout=300)


def test_envs_list_and_an_episode_played_by_hand():
    listed = json.loads(strop("envs", "list", "-o", "json").stdout)
    assert [e["name"] for e in listed] == ["finance-sql"]
    from strop.envs import get_env
    env = get_env("finance-sql", seed=0)
    task = env.tasks("eval-multi", 1)[0]
    env.close()
    played = strop("envs", "try", "finance-sql", "--split", "eval-multi", "--task", "0",
                   stdin="list_tables\ndescribe_table no_such_table\nrun_sql SELECT nope FROM income_statement\n"
                         "state\n" + f"submit_answer {task.answer}\n")
    assert played.returncode == 0, played.stderr
    out = played.stdout
    assert task.prompt in out and "income_statement" in out and "balance_sheet" in out
    assert '"hallucinated_tables": 1' in out and '"sql_errors": 1' in out
    assert "episode over: reward 1.1" in out
    bad = strop("envs", "try", "finance-sql", "--task", "9999")
    assert bad.returncode == 1 and "--task must be between 0 and" in bad.stderr


def test_envs_eval_of_a_tuned_and_a_base_model(tiny_model_dir):
    done = strop("envs", "eval", "finance-sql", "--model", tiny_model_dir, "--baseline", tiny_model_dir, "--limit", "2",
                 "--max-tokens", "8", "-o", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["splits"]) == {"eval-single", "eval-multi"}
    assert report["comparison"]["eval-multi"]["delta"] == 0.0 and report["comparison"]["eval-multi"]["mcnemarP"] == 1.0
    assert "sqlErrors" in report["splits"]["eval-single"]["rubrics"]


def test_multi_turn_grpo_in_finance_sql(tiny_model_dir, tmp_path):
    config = GRPOConfig(base_model=str(tiny_model_dir), batch_size=2, group_size=2, max_steps=1, max_completion_length=12,
                        environment={"name": "finance-sql", "options": {"seed": 1, "max_turns": 2}})
    result = run_grpo(config, tmp_path / "run", progress=False)
    row = result.metrics[0]
    assert row["modelTurns"] >= 1 and 0.0 <= row["rubric/tablesListedFirst"] <= 1.0
    assert "reward/finance-sql" in row and row["zeroVarianceGroups"] in (0.0, 0.5, 1.0)


@pytest.mark.slow
def test_a_few_smollm2_steps_in_finance_sql(smollm2_home, tmp_path):
    config = GRPOConfig(base_model=str(smollm2_home), batch_size=2, group_size=4, max_steps=2, max_completion_length=64,
                        environment={"name": "finance-sql", "options": {"seed": 0, "max_turns": 3}},
                        learning_rate=1e-4, save_every=1)
    result = run_grpo(config, tmp_path / "run", progress=False)
    assert [m["step"] for m in result.metrics] == [0, 1]
    assert all(m["modelTurns"] >= 1 for m in result.metrics)
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 2 * 4 and all(r["transcript"][0]["role"] == "user" for r in rollouts)
    assert (tmp_path / "run" / "final" / "adapter_model.safetensors").exists()
