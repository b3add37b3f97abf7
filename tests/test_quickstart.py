"""`strop quickstart` at a tiny size, as a user runs it (a real subprocess), then `strop cleanup`."""

import json
import os
import shutil
import subprocess
import sys

import sqlalchemy as sa


def strop(*argv, home, timeout=900):
    env = {**os.environ, "STROP_HOME": str(home)}
    env.pop("STROP_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "strop.cli.main", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_bad_flags_are_all_named_and_nothing_is_made(tmp_path):
    home, out = tmp_path / "home", tmp_path / "qs"
    done = strop("quickstart", "--steps", "0", "--baseline", "openai:big", "--dataset", "mnist", "--out", out, home=home)
    assert done.returncode == 1
    for part in ("--steps must be at least 1", "--baseline", "openai:NAME@URL", "--dataset must be synthetic"):
        assert part in done.stderr
    assert not out.exists()


def test_quickstart_end_to_end_then_cleanup(tmp_path):
    home, out = tmp_path / "home", tmp_path / "qs"
    assert strop("registry", "datasets", "register", "mine/keep", "-f", _rows(tmp_path), home=home).returncode == 0
    done = strop("quickstart", "--base-model", "strop/tiny-random", "--steps", "2", "--eval-n", "8",
                 "--judge", "strop/tiny-random", "--out", out, home=home)
    assert done.returncode == 0, done.stderr[-3000:]
    # seed 000's table, the statistics, and where everything went
    for part in ("Exact Match Accuracy", "Answer Correctness /5", "McNemar p", "95% CI", "report:", "strop cleanup"):
        assert part in done.stdout
    manifest = json.loads((out / "quickstart.json").read_text())
    assert manifest["run"].startswith("run-") and manifest["model"].startswith("model-")
    assert set(manifest["evaluations"]) == {"baseline", "tuned"}
    for name in ("report.html", "dashboard.png", "training.png", "comparison.json"):
        assert (out / "report" / name).stat().st_size > 1000
    summary = manifest["summary"]
    assert summary["n"] == 8 and summary["judge"]["failures"] == {"a": 0, "b": 0}  # grammar-held verdicts
    metrics = json.loads(strop("runs", "metrics", manifest["run"], "-o", "json", home=home).stdout)
    assert [row["step"] for row in metrics] == [0, 1]

    url = f"sqlite:///{home / 'strop.db'}"
    with sa.create_engine(url).connect() as conn:
        assert conn.scalar(sa.text("SELECT count(*) FROM strop_eval_comparison")) == 8
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
    assert len(removed["evaluations"]) == 2 and len(removed["datasets"]) == 2
    assert not out.exists()
    assert json.loads(strop("runs", "list", "-o", "json", home=home).stdout) == []
    names = [d["name"] for d in json.loads(strop("registry", "datasets", "list", "-o", "json", home=home).stdout)]
    assert names == ["mine/keep"]  # what the quickstart did not make stays
    with sa.create_engine(url).connect() as conn:
        assert not sa.inspect(conn).has_table("strop_eval_comparison")
    again = strop("cleanup", "--out", out, home=home)
    assert again.returncode == 1 and "quickstart.json" in again.stderr


def _rows(tmp_path):
    path = tmp_path / "keep.jsonl"
    path.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"}) + "\n")
    return path


def test_quickstart_help_teaches_the_main_flags():
    done = subprocess.run([sys.executable, "-m", "strop.cli.main", "quickstart", "--help"], capture_output=True, text=True)
    for flag in ("--base-model", "--dataset", "--data-file", "--steps", "--eval-n", "--baseline", "--judge", "--out",
                 "about 15 minutes"):
        assert flag in done.stdout
