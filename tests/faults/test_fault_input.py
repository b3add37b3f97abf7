"""Fault injection: mistakes in files and flags. Each gets one clear error that says what to fix, and
nothing is half-written (no registry entry, no run folder, no evaluation)."""

import json

import pytest

from test_control import home, run  # noqa: F401 - the fixture and the CLI runner of the control-plane tests

GOOD = json.dumps({"question": "What is 1 + 1?", "answer": "#### 2"}) + "\n"

DATASETS = {
    "bad JSON": (GOOD + '{"question": "x", "answer": \n', "line 2: invalid JSON"),
    "missing field": (GOOD + json.dumps({"question": "no answer"}) + "\n", "line 2"),
    "not UTF-8": (GOOD.encode() + b'{"question": "caf\xe9", "answer": "1"}\n', "not UTF-8 text: byte 0xe9 at line 2"),
    "oversized line": (GOOD + json.dumps({"question": "x" * (1 << 20), "answer": "1"}) + "\n",
                       "characters, over the 1,048,576 a row may have"),
    "empty": ("", "is empty"),
}


@pytest.mark.parametrize("case", sorted(DATASETS))
def test_bad_dataset_files(home, tmp_path, capsys, case):  # noqa: F811
    content, expected = DATASETS[case]
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, _, err = run(capsys, "registry", "datasets", "register", "bad/rows", "-f", path)
    assert code == 1 and expected in err and err.startswith("strop: error:")
    assert json.loads(run(capsys, "registry", "datasets", "list", "-o", "json")[1]) == []


BUNDLES = {
    "missing function": ("def score(solution_str=None, ground_truth=None):\n    return 1.0\n", "compute_score"),
    "wrong signature": ("def compute_score(text):\n    return 1.0\n", "signature"),
    "import error": ("import numpy_but_misspelt\n", "numpy_but_misspelt"),
    "syntax error": ("def compute_score(:\n", "SyntaxError"),
    "async grader": ("async def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):"
                     "\n    return 1.0\n", "is an `async def`; graders are called synchronously"),
}


@pytest.mark.parametrize("case", sorted(BUNDLES))
def test_bad_bundles(home, tmp_path, capsys, case):  # noqa: F811
    source, expected = BUNDLES[case]
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "reward.py").write_text(source)
    code, _, err = run(capsys, "registry", "bundles", "register", "bad/scoring", "-f", folder)
    assert code == 1 and expected in err
    assert json.loads(run(capsys, "registry", "bundles", "list", "-o", "json")[1]) == []


FLAGS = {
    "unknown model": (["train", "--base-model", "no-such/model-xyz", "--steps", "1"], "no-such/model-xyz"),
    "malformed model id": (["train", "--base-model", "not a model!!", "--steps", "1"],
                           "'not a model!!' is not a model id: a Hub id is NAME or ORG/NAME"),
    "malformed model id to select": (["base-models", "select", "org/name with spaces"], "is not a model id"),
    "steps below one": (["train", "--base-model", "strop/tiny-random", "--steps", "0"], "steps"),
    "group of one": (["train", "--base-model", "strop/tiny-random", "--group-size", "1"],
                     "--group-size (group_size): must be an integer from 2 to 1,024 (got 1); GRPO needs at least two"),
    "bad reward weight": (["train", "--base-model", "strop/tiny-random", "--reward", "builtin:gsm8k=heavy"], "weight"),
    "endpoint without URL": (["evaluations", "start", "--model", "openai:big", "--dataset", "d"], "openai:NAME@URL"),
    "endpoint with ftp URL": (["evaluations", "start", "--model", "openai:big@ftp://x/v1", "--dataset", "d"],
                              "openai:NAME@URL"),
    "zero max tokens": (["evaluations", "start", "--model", "strop/tiny-random", "--dataset", "d", "--max-tokens", "0"],
                        "--max-tokens must be at least 1"),
    "zero limit": (["evaluations", "start", "--model", "strop/tiny-random", "--dataset", "d", "--limit", "0"],
                   "--limit must be at least 1"),
    "bad results URL": (["compare", "eval-a", "eval-b", "--results-url", "nosuchdb://x"], "no evaluation"),
    "quickstart eval-n": (["quickstart", "--eval-n", "0", "--out", "{tmp}/qs"], "--eval-n must be at least 1"),
}


@pytest.mark.parametrize("case", sorted(FLAGS))
def test_bad_flags(home, tmp_path, capsys, case):  # noqa: F811
    argv, expected = FLAGS[case]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "train":
        argv += ["--run-dir", tmp_path / "run"]
    try:
        code, _, err = run(capsys, *argv)
    except SystemExit as exc:  # refused by the argument parser itself, with its usage line: exit status 2
        code, err = exc.code, capsys.readouterr().err
    assert code in (1, 2) and expected in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "qs").exists()
    assert json.loads(run(capsys, "runs", "list", "-o", "json")[1]) == []


def test_a_relative_bundle_path_works_with_the_sandbox(home, tmp_path, capsys, monkeypatch):  # noqa: F811
    # the sandbox's workers run in a temporary folder; the path must mean the folder the user was in
    folder = tmp_path / "mybundle"
    folder.mkdir()
    (folder / "reward.py").write_text("def compute_score(data_source=None, solution_str=None, ground_truth=None, "
                                      "extra_info=None):\n    return 0.5\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "train", "--base-model", "strop/tiny-random", "--dataset", "synthetic:add",
                         "--steps", "1", "--group-size", "2", "--batch-size", "2", "--max-tokens", "4", "--quiet",
                         "--reward", "mybundle=2.0", "--run-dir", tmp_path / "run", "-o", "json")
    assert code == 0, err
    assert json.loads(out)["lastReward"] == 1.0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["reward_terms"][0]["grader"] == f"{folder}#reward:compute_score"
