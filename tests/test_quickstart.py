"""`strop quickstart` at a tiny size, as a user runs it (a real subprocess), then `strop cleanup`."""

import json
import os
import shutil
import subprocess
import sys
import threading

import sqlalchemy as sa

from test_evals import closed_port

TINY = ("--base-model", "strop/tiny-random", "--eval-n", "8")


def strop(*argv, home, timeout=900, env=None):
    env = {**os.environ, "STROP_HOME": str(home), **(env or {})}
    env.pop("STROP_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "strop.cli.main", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def listed(*argv, home):
    done = strop(*argv, "-o", "json", home=home)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def artifacts(home):
    return sorted(p.name for p in (home / "artifacts").rglob("*") if p.is_file())


def test_bad_flags_are_all_named_and_nothing_is_made(tmp_path):
    home, out = tmp_path / "home", tmp_path / "qs"
    done = strop("quickstart", "--steps", "0", "--baseline", "openai:big", "--dataset", "mnist", "--judge",
                 "openai:x@http://localhost:99999/v1", "--out", out, home=home)
    assert done.returncode == 1
    for part in ("--steps must be at least 1", "--baseline", "openai:NAME@URL", "--dataset must be synthetic",
                 "--judge: model 'openai:x@http://localhost:99999/v1': the URL", "bad port"):
        assert part in done.stderr
    assert not out.exists()
    # a bad --judge alone is refused before any project, dataset or folder is made
    done = strop("quickstart", *TINY, "--judge", "openai:foo", "--out", out, home=home)
    assert done.returncode == 1 and "--judge: model 'openai:foo'" in done.stderr and "openai:NAME@URL" in done.stderr
    assert not out.exists()
    done = strop("quickstart", *TINY, "--judge", tmp_path / "no-such-judge", "--out", out, home=home)
    assert done.returncode == 1 and f"--judge {tmp_path / 'no-such-judge'}:" in done.stderr and not out.exists()
    assert listed("projects", "list", home=home) == [] and listed("registry", "datasets", "list", home=home) == []


def test_quickstart_end_to_end_then_cleanup_keeps_what_it_did_not_make(tmp_path):
    from strop.evals.compare import compare
    from strop.evals.sql_tables import write_tables
    home, out = tmp_path / "home", tmp_path / "qs"
    assert strop("registry", "datasets", "register", "mine/keep", "-f", _rows(tmp_path), home=home).returncode == 0
    assert strop("base-models", "select", "strop/tiny-random", "--wait", home=home).returncode == 0
    url = f"sqlite:///{home / 'strop.db'}"
    side = {"label": "x", "model": "m"}
    prior = compare([_item(True)], [_item(False)], a={**side, "evaluationId": "e-a"}, b={**side, "evaluationId": "e-b"})
    write_tables(prior, url=url, mode="append")  # another comparison's rows in the default store
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # a user's own file in --out
    before = artifacts(home)

    done = strop("quickstart", *TINY, "--steps", "2", "--out", out, home=home)  # the default judge: local
    assert done.returncode == 0, done.stderr[-3000:]
    # seed 000's table, the statistics, and where everything went
    for part in ("Exact Match Accuracy", "Answer Correctness /5", "McNemar p", "95% CI", "report:", "strop cleanup"):
        assert part in done.stdout
    manifest = json.loads((out / "quickstart.json").read_text())
    assert manifest["status"] == "succeeded" and not manifest["createdOut"]
    assert manifest["run"].startswith("run-") and manifest["model"].startswith("model-")
    assert set(manifest["evaluations"]) == {"baseline", "tuned"}
    for name in ("report.html", "dashboard.png", "training.png", "comparison.json"):
        assert (out / "report" / name).stat().st_size > 1000
    summary = manifest["summary"]
    assert summary["n"] == 8 and summary["judge"]["failures"] == {"a": 0, "b": 0}  # grammar-held verdicts
    # `local` is the quickstart's own base model: the default SmolLM2 is never selected or loaded
    for evaluation in manifest["evaluations"].values():
        assert listed("evaluations", "get", evaluation, home=home)["judge"] == "strop/tiny-random"
    [smollm2] = [m for m in listed("base-models", "list", home=home) if "SmolLM2" in m["model_id"]]
    assert not smollm2["selected"] and not smollm2["cached"]
    metrics = listed("runs", "metrics", manifest["run"], home=home)
    assert [row["step"] for row in metrics] == [0, 1]
    sha = listed("models", "get", manifest["model"], home=home)["sha256"]
    assert sha in artifacts(home)

    with sa.create_engine(url).connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM strop_eval_comparison")) == 8 + 1
        assert conn.scalar(sa.text("SELECT count(*) FROM strop_judge_scores")) == 8 * 2 * 2

    if shutil.which("chromium"):
        from strop.report.browser import check_in_chromium
        shot = tmp_path / "quickstart-report.png"
        assert check_in_chromium(out / "report" / "report.html", shot) == []
        assert shot.stat().st_size > 10_000
        if os.environ.get("STROP_TEST_ARTIFACTS"):
            shutil.copy(shot, os.environ["STROP_TEST_ARTIFACTS"])

    cleaned = strop("cleanup", "--out", out, "-o", "json", home=home)
    assert cleaned.returncode == 0, cleaned.stderr
    removed = json.loads(cleaned.stdout)
    assert removed["runs"] == [manifest["run"]] and removed["models"] == [manifest["model"]]
    assert len(removed["evaluations"]) == 2 and len(removed["datasets"]) == 2 and removed["artifacts"] == [sha]
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    assert artifacts(home) == before  # the adapter is gone; nothing else of the store was touched
    assert listed("runs", "list", home=home) == []
    assert [d["name"] for d in listed("registry", "datasets", "list", home=home)] == ["mine/keep"]
    with sa.create_engine(url).connect() as conn:  # the other comparison's rows survived both
        assert conn.execute(sa.text("SELECT comparison_id FROM strop_eval_comparison")).scalars().all() == \
            [prior["comparisonId"]]
    again = strop("cleanup", "--out", out, home=home)
    assert again.returncode == 1 and "quickstart.json" in again.stderr


def test_a_failed_baseline_stops_quickstart_and_cleanup_clears_the_way(tmp_path):
    home, out = tmp_path / "home", tmp_path / "qs"
    dead = f"openai:big@http://127.0.0.1:{closed_port()}/v1"
    done = strop("quickstart", *TINY, "--baseline", dead, "--judge", "none", "--max-retries", "0", "--out", out,
                 home=home)
    assert done.returncode == 1
    assert "the baseline evaluation" in done.stderr and f"every request to {dead} failed (8 of 8)" in done.stderr
    assert f"strop cleanup --out {out}" in done.stderr and "Traceback" not in done.stderr
    manifest = json.loads((out / "quickstart.json").read_text())
    assert manifest["status"] == "failed" and manifest["run"] is None
    again = strop("quickstart", *TINY, "--judge", "none", "--out", out, home=home)
    assert again.returncode == 1
    assert f"holds an earlier quickstart (failed): run `strop cleanup --out {out}` first" in again.stderr
    cleaned = strop("cleanup", "--out", out, "-o", "json", home=home)
    assert cleaned.returncode == 0, cleaned.stderr
    removed = json.loads(cleaned.stdout)
    assert removed["evaluations"] == [manifest["evaluations"]["baseline"]] and len(removed["datasets"]) == 2
    assert not out.exists() and listed("projects", "list", home=home) == []


def test_quickstart_against_a_served_baseline_with_a_data_file(tmp_path, tiny_model_dir):
    from strop.serve import make_server
    home, out = tmp_path / "home", tmp_path / "qs"
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {a} + 1?", "answer": f"#### {a + 1}"}) + "\n"
                            for a in range(12)))
    server = make_server(str(tiny_model_dir), port=0, name="big")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = strop("quickstart", "--base-model", "strop/tiny-random", "--eval-n", "4", "--steps", "1",
                     "--batch-size", "2", "--group-size", "2", "--max-tokens", "8", "--data-file", data,
                     "--baseline", f"openai:big@http://127.0.0.1:{server.server_port}/v1", "--judge", "none",
                     "--concurrency", "2", "--out", out, home=home)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "big" in done.stdout.splitlines()[0] and "tiny-random (RL-tuned)" in done.stdout
    manifest = json.loads((out / "quickstart.json").read_text())
    baseline = listed("evaluations", "get", manifest["evaluations"]["baseline"], home=home)
    assert baseline["model"].startswith("openai:big@") and baseline["summary"]["requestErrors"] == 0
    assert baseline["endpoint"]["concurrency"] == 2 and baseline["summary"]["n"] == 4
    held_out = [json.loads(line)["question"] for line in (out / "data" / "eval.jsonl").read_text().splitlines()]
    assert held_out == [f"What is {a} + 1?" for a in range(8, 12)]  # the last --eval-n rows of --data-file
    assert strop("cleanup", "--out", out, home=home).returncode == 0 and not out.exists()


def test_offline_gsm8k_points_at_data_file(tmp_path):
    home, out = tmp_path / "home", tmp_path / "qs"
    done = strop("quickstart", *TINY, "--dataset", "gsm8k", "--out", out, home=home,
                 env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert done.returncode == 1 and "--dataset gsm8k:" in done.stderr and "--data-file path/to/gsm8k.jsonl" in done.stderr
    assert "--dataset path/to" not in done.stderr and not out.exists()


def _rows(tmp_path):
    path = tmp_path / "keep.jsonl"
    path.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"}) + "\n")
    return path


def _item(correct):
    return {"index": 0, "question": "q", "gold": "1", "extracted": "1", "correct": correct, "response": "...",
            "judge": None}


def test_quickstart_help_teaches_the_main_flags():
    done = subprocess.run([sys.executable, "-m", "strop.cli.main", "quickstart", "--help"], capture_output=True, text=True)
    for flag in ("--base-model", "--dataset", "--data-file", "--steps", "--eval-n", "--baseline", "--judge", "--out",
                 "--concurrency", "--max-retries", "--timeout", "11-12 minutes", "the --base-model itself", "--task",
                 "finance-sql", "--demos", "--sft-steps", "--sft-batch-size", "with --task finance-sql"):
        assert flag in " ".join(done.stdout.split())


FINANCE_TINY = ("--task", "finance-sql", "--base-model", "strop/tiny-random", "--eval-n", "3", "--demos", "6",
                "--sft-steps", "2", "--steps", "1", "--batch-size", "1", "--group-size", "2", "--max-tokens", "12")


def test_finance_sql_quickstart_warm_starts_then_rl_and_cleans_up(tmp_path):
    """Seed 004's story at a tiny size: demonstrations, a baseline on both unseen splits, SFT, GRPO from the SFT
    model (lineage kept), the tuned evaluation, statistics per split, the table and the report; then cleanup."""
    home, out = tmp_path / "home", tmp_path / "qs"
    done = strop("quickstart", *FINANCE_TINY, "--out", out, home=home)
    assert done.returncode == 0, done.stderr[-3000:]
    for part in ("Exact Match Accuracy", "McNemar p", "eval-single (n=3)", "eval-multi (n=3)", "validToolCalls",
                 "recoveries", "warm start:", "strop cleanup", "Does RL add to the warm start?"):
        assert part in done.stdout, part
    manifest = json.loads((out / "quickstart.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["options"]["task"] == "finance-sql"
    assert manifest["summary"]["n"] == 6 and set(manifest["summary"]["splits"]) == {"eval-single", "eval-multi"}
    demos = [json.loads(line) for line in (out / "data" / "demos.jsonl").read_text().splitlines()]
    assert len(demos) == 6 and all(d["messages"][-1]["role"] == "tool" for d in demos)
    sft_metrics = listed("runs", "metrics", manifest["warmStartRun"], home=home)
    assert [r["step"] for r in sft_metrics if r["step"] >= 0] == [0, 1] and "loss" in sft_metrics[-1]
    rl = listed("runs", "get", manifest["run"], home=home)
    assert rl["method"] == "grpo" and rl["lineage"][1]["modelId"] == manifest["warmStartModel"]
    assert listed("runs", "get", manifest["warmStartRun"], home=home)["method"] == "sft"
    rl_config = json.loads((out / "run.json").read_text())["config"]["rlHyperparams"]
    assert rl_config["branchAtTurn"] == 3 and rl_config["varianceOn"] == "correctness"
    assert rl_config["dynamicSampling"]["enabled"] is True
    warm = json.loads((out / "evaluations" / "warm-start.json").read_text())
    assert warm["model"] == manifest["warmStartModel"]
    added = json.loads((out / "report" / "comparison.json").read_text())["warmStartSplits"]
    for split, s in added.items():  # the warm start's pass@1 against the tuned model's, on the same episodes
        assert s["n"] == 3 and s["baseline"] == warm["splits"][split]["pass@1"] and 0.0 <= s["mcnemarP"] <= 1.0
    for side in ("baseline", "warm-start", "tuned"):
        report = json.loads((out / "evaluations" / f"{side}.json").read_text())
        assert [s["n"] for s in report["splits"].values()] == [3, 3]
        assert all(0.0 <= s["rubrics"]["validToolCalls"] <= 1.0 for s in report["splits"].values())
    with sa.create_engine(f"sqlite:///{home / 'strop.db'}").connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM strop_eval_comparison")) == 6
    assert (out / "report" / "report.html").stat().st_size > 1000

    cleaned = strop("cleanup", "--out", out, "-o", "json", home=home)
    assert cleaned.returncode == 0, cleaned.stderr
    removed = json.loads(cleaned.stdout)
    assert removed["runs"] == [manifest["run"], manifest["warmStartRun"]]
    assert sorted(removed["models"]) == sorted([manifest["model"], manifest["warmStartModel"]])
    assert removed["datasets"] == [f"{manifest['quickstartId']}/demos"] and not out.exists()
    assert listed("runs", "list", home=home) == [] and listed("models", "list", home=home) == []


def test_finance_sql_quickstart_refuses_the_flags_of_the_other_task(tmp_path):
    home, out = tmp_path / "home", tmp_path / "qs"
    done = strop("quickstart", "--task", "finance-sql", "--judge", "openai:j@http://127.0.0.1:9/v1", "--dataset",
                 "gsm8k", "--sft-steps", "0", "--sft-batch-size", "-3", "--out", out, home=home)
    assert done.returncode == 1
    for part in ("--judge applies to --task gsm8k", "--dataset and --data-file choose the data of --task gsm8k",
                 "--sft-steps: must be an integer from 1", "--sft-batch-size: must be an integer from 1"):
        assert part in done.stderr, part
    assert not out.exists()
