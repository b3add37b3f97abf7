"""The issue-37 benchmark program (`benchmarks/learning_finance_sql.py`) runs every phase, keeps what it finished, and
goes on from it: at toy sizes (--smoke) on the tiny random model, as a user runs it (a real subprocess). What it
measures at full size is in benchmarks/RESULTS.md; here only that the program works."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = Path(__file__).resolve().parents[1] / "benchmarks" / "learning_finance_sql.py"


def _run(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-u", str(PROGRAM), *map(str, argv)], capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def smoke(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("lfs")
    argv = ["--smoke", "--model", tiny_model_dir, "--out", out, "--branch-at", "2", "--scout-temperature", "0"]
    done = _run(*argv)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, argv, done


def test_every_phase_runs_and_the_summary_compares_the_models(smoke):
    out, _, done = smoke
    summary = json.loads((out / "summary.json").read_text())
    # a GRPO variant is a model of its own, named by what differs from the defaults (branch turn, scout)
    model = "grpo-s0-branch2-scout0"
    for split in ("first-query", "eval-single", "eval-multi"):
        entry = summary["splits"][split]
        assert set(entry["passed"]) == {"sft", model}
        assert all(v.endswith("/6") for v in entry["passed"].values())  # --smoke evaluates 6 tasks
        assert f"sft vs {model}" in entry["mcnemar"]
    assert summary["notRun"] == []
    assert json.loads(done.stdout.strip().splitlines()[-1]) == summary


def test_full_episode_evaluations_keep_their_transcripts(smoke):
    out, _, _ = smoke
    for split in ("eval-single", "eval-multi"):
        for model in ("sft", "grpo-s0-branch2-scout0"):
            rows = [json.loads(line) for line in (out / "transcripts" / f"{split}-{model}.jsonl").open()]
            phase = json.loads((out / "phases" / f"{split}-{model}.json").read_text())["result"]
            assert [r["task"] for r in rows] == phase["tasks"]
            assert [r["passed"] for r in rows] == phase["passed"]
            assert all(r["transcript"][0]["role"] == "user" for r in rows)
            assert all(any(m["role"] == "assistant" for m in r["transcript"]) for r in rows)


def test_a_second_run_goes_on_from_the_finished_phases(smoke):
    out, argv, _ = smoke
    again = _run(*argv)
    assert again.returncode == 0, again.stderr[-3000:]
    phases = sorted(p.stem for p in (out / "phases").glob("*.json"))
    for name in phases:
        assert f"{name}: finished earlier" in again.stdout


def test_settings_that_differ_from_a_kept_phase_are_refused_not_mixed(smoke):
    out, argv, _ = smoke
    changed = _run(*argv, "--sft-lr", "1e-3")
    assert changed.returncode != 0
    assert "sft.json was made with other settings" in changed.stderr


def test_evaluate_names_only_models_of_the_run(smoke):
    out, argv, _ = smoke
    wrong = _run(*argv, "--evaluate", "grpo-s0")  # the default's name, not this variant's
    assert wrong.returncode != 0
    assert "no model grpo-s0 in this run; its models are sft, grpo-s0-branch2-scout0" in wrong.stderr


def test_a_reference_scout_run_is_a_model_of_its_own_branched_from_the_scripted_discovery(smoke):
    out, argv, _ = smoke
    base = [a for a in argv if a not in ("--branch-at", "2", "--scout-temperature", "0")]
    done = _run(*base, "--scout", "reference", "--reference-members", "1", "--evaluate", "sft")  # trains it only
    assert done.returncode == 0, done.stderr[-3000:]
    assert "grpo-s0-branch2-scout0: finished earlier" not in done.stdout   # another variant, not rerun
    rows = [json.loads(line) for line in (out / "grpo-s0-reference-guide1" / "rollouts.jsonl").open()]
    assert rows and all(r["untrainedTurns"] == 2 for r in rows)            # list_tables, describe_table: shared
    for r in rows:
        calls = [m["content"] for m in r["transcript"] if m["role"] == "assistant"][:2]
        assert '"name": "list_tables"' in calls[0] and '"name": "describe_table"' in calls[1], calls
    # one of each group of 2 is the scripted agent's, played to its right answer
    guides = [r for r in rows if r.get("reference")]
    assert len(guides) * 2 == len(rows) and all(r["reward"] == 1.1 for r in guides)


@pytest.mark.parametrize("argv, message", [
    (["--branch-at", "0"], "argument --branch-at: must be at least 1 and at most 1000, got 0"),
    (["--grpo-group", "-3"], "argument --grpo-group: must be at least 1, got -3"),
    (["--demos", "ten"], "argument --demos: 'ten' is not a whole number"),
    (["--kl", "nan"], "argument --kl: must be a number from 0 to 1e+06, got nan"),
    (["--scout", "oracle"], "argument --scout: invalid choice: 'oracle'"),
    (["--reference-members", "8"], "--reference-members 8: must be fewer than --grpo-group (8)"),
    (["--reference-members", "1", "--branch-at", "3"], "with --branch-at above 1, give --scout reference too"),
    (["--reference-when", "uninformative"], "--reference-when uninformative: chooses the groups the reference "
                                            "members play in; give --reference-members N too"),
    (["--reference-when", "sometimes"], "argument --reference-when: invalid choice: 'sometimes'"),
    (["--grpo-lr", "1e-4", "--evaluate", "grpo-s0"], "--evaluate: no model grpo-s0 in this run; its models are sft, "
                                                     "grpo-s0-lr0.0001, grpo-s1-lr0.0001"),
])
def test_bad_settings_are_refused_before_any_phase_runs(tmp_path, argv, message):
    done = _run("--out", tmp_path / "out", *argv)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "out").exists()  # nothing made, nothing to clean up
