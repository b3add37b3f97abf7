"""`strop envs` as a user runs it, and multi-turn GRPO in the finance-sql environment."""

import json
import subprocess
import sys
import time

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


@pytest.mark.parametrize("line", ["run_sql " + "'" * 100_001, "list_tables " + "a " * 100_000, "x=" * 100_000,
                                  "describe_table " + " " * 100_000 + "x"])
def test_a_long_line_typed_into_envs_try_is_read_or_refused_at_once(line):
    from strop.cli.envs import _parse_line
    started = time.perf_counter()
    try:
        _parse_line(line)
    except (ValueError, KeyError):              # what `strop envs try` answers with "could not read that call"
        pass
    assert time.perf_counter() - started < 0.5


def test_envs_eval_of_a_tuned_and_a_base_model(tiny_model_dir):
    done = strop("envs", "eval", "finance-sql", "--model", tiny_model_dir, "--baseline", tiny_model_dir, "--limit", "2",
                 "--max-tokens", "8", "-o", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report["splits"]) == {"eval-single", "eval-multi"}
    assert report["comparison"]["eval-multi"]["delta"] == 0.0 and report["comparison"]["eval-multi"]["mcnemarP"] == 1.0
    assert "sqlErrors" in report["splits"]["eval-single"]["rubrics"]
    from strop.control import env_evals           # kept for `strop ui`, per-episode lists left out
    kept = env_evals.get(report["envEvalId"])
    assert kept["env"] == "finance-sql" and kept["splits"]["eval-multi"]["rubrics"] == report["splits"]["eval-multi"]["rubrics"]
    assert "episodes" not in kept["splits"]["eval-multi"] and kept["comparison"] == report["comparison"]


def test_multi_turn_grpo_in_finance_sql(tiny_model_dir, tmp_path):
    config = GRPOConfig(base_model=str(tiny_model_dir), batch_size=2, group_size=2, max_steps=1, max_completion_length=12,
                        environment={"name": "finance-sql", "options": {"seed": 1, "max_turns": 2}})
    result = run_grpo(config, tmp_path / "run", progress=False)
    row = result.metrics[0]
    assert row["modelTurns"] >= 1 and 0.0 <= row["rubric/tablesListedFirst"] <= 1.0
    assert "reward/finance-sql" in row and row["zeroVarianceGroups"] in (0.0, 0.5, 1.0)
    # the run's adapter folder evaluates as it is, on the base its adapter_config.json names
    done = strop("envs", "eval", "finance-sql", "--model", tmp_path / "run" / "final", "--splits", "eval-single",
                 "--limit", "1", "--max-tokens", "4", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["splits"]["eval-single"]["n"] == 1
    (tmp_path / "run" / "final" / "adapter_config.json").write_text("{}")
    refused = strop("envs", "eval", "finance-sql", "--model", tmp_path / "run" / "final", "--limit", "1")
    assert refused.returncode == 1 and "adapter_config.json names no base model" in refused.stderr


@pytest.mark.slow
def test_a_few_smollm2_steps_in_finance_sql(smollm2_home, tmp_path):
    config = GRPOConfig(base_model=str(smollm2_home), batch_size=2, group_size=2, max_steps=2, max_completion_length=48,
                        environment={"name": "finance-sql", "options": {"seed": 0, "max_turns": 2}},
                        learning_rate=1e-4, save_every=1)
    result = run_grpo(config, tmp_path / "run", progress=False)
    assert [m["step"] for m in result.metrics] == [0, 1]
    assert all(m["modelTurns"] >= 1 for m in result.metrics)
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 2 * 2 and all(r["transcript"][0]["role"] == "user" for r in rollouts)
    assert (tmp_path / "run" / "final" / "adapter_model.safetensors").exists()


def test_training_drives_a_remote_openenv_environment(tiny_model_dir, tmp_path):
    from strop.envs.openenv_server import serve_env
    server = serve_env("finance-sql", port=0, options={"seed": 2, "max_turns": 2}, block=False)
    try:
        config = GRPOConfig(base_model=str(tiny_model_dir), batch_size=1, group_size=2, max_steps=1,
                            max_completion_length=8, environment={"name": server.url, "options": {}})
        result = run_grpo(config, tmp_path / "run", progress=False)
    finally:
        server.stop()
    row = result.metrics[0]
    assert row["modelTurns"] >= 1 and "rubric/sqlErrors" in row  # the remote env's counters came back over the wire


def test_envs_serve_as_a_user_starts_it(tmp_path):
    import os
    import socket
    import time
    import urllib.error
    import urllib.request
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "ENV_KEY": "sekret"}
    proc = subprocess.Popen([sys.executable, "-m", "strop.cli.main", "envs", "serve", "finance-sql", "--port", str(port),
                             "--api-key-env", "ENV_KEY"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
                    assert reply.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, proc.stderr.read1().decode() if proc.poll() else "no answer"
                time.sleep(0.3)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/schema", timeout=5)
        assert refused.value.code == 401
        from strop.envs.openenv_client import RemoteEnv
        remote = RemoteEnv(f"http://127.0.0.1:{port}", api_key="sekret")
        [task] = remote.tasks("eval-single", 1)
        first = remote.reset(task)
        assert "USD" in first.content or "%" in first.content or "ratio" in first.content.lower()
        assert [t["function"]["name"] for t in remote.tools()] == ["list_tables", "describe_table", "run_sql",
                                                                   "submit_answer"]
        remote.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
