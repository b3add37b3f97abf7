"""Seed 003's walkthrough as written, with a stranger's bundle and descriptor: a scoring bundle whose modules are
not called `reward` (format 0.1 + correctness 1.0, each its own module), and a descriptor whose maxSteps is more
than one pass over the data. Every step goes through the `strop` command as a user types it."""

import json
from pathlib import Path

from test_control import home, rows_file, run  # noqa: F401 - fixture

ROOT = Path(__file__).resolve().parents[1]

CORRECT = '''
from parsing import final_number

def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
    return 1.0 if final_number(solution_str) == final_number(ground_truth) else 0.0
'''
FORMAT = '''
def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None):
    return 1.0 if "####" in (solution_str or "") else 0.0
'''
PARSING = '''
import re

def final_number(text):
    found = re.findall(r"-?\\d+", (text or "")[-200:])
    return found[-1] if found else None
'''


def stranger_bundle(folder: Path) -> Path:
    folder.mkdir()
    for name, body in (("correctness.py", CORRECT), ("format_check.py", FORMAT), ("parsing.py", PARSING)):
        (folder / name).write_text(body)
    return folder


def seed_descriptor(tmp_path: Path, name: str, **hyper) -> Path:
    """examples/gsm8k/run.json (seed 003's descriptor) with the stranger's terms and the tiny model's sizes."""
    data = json.loads((ROOT / "examples" / "gsm8k" / "run.json").read_text())
    data["baseModel"] = "strop/tiny-random"
    data["config"]["rlHyperparams"].update(hyper)
    data["config"]["reward"]["terms"] = [
        {"kind": "rule", "weight": 0.1, "bundle": "gsm8k/scoring", "module": "format_check"},
        {"kind": "rule", "weight": 1.0, "bundle": "gsm8k/scoring", "module": "correctness"}]
    data["execution"] = {"gpus": 0, "saveEvery": 2, "keepAdapters": 2}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_seed_003_walkthrough_with_a_strangers_bundle_and_more_steps_than_one_pass(home, tmp_path, capsys):
    bundle = stranger_bundle(tmp_path / "scoring")
    code, out, err = run(capsys, "registry", "bundles", "register", "gsm8k/scoring", "-f", bundle, "-o", "json")
    assert code == 0, err
    registered = json.loads(out)
    assert registered["info"]["modules"] == ["correctness", "format_check"]  # parsing.py defines no grader
    assert run(capsys, "registry", "datasets", "register", "gsm8k/train", "-f",
               rows_file(tmp_path / "train.jsonl", 200))[0] == 0
    assert run(capsys, "registry", "datasets", "register", "gsm8k/small", "-f",
               rows_file(tmp_path / "small.jsonl", 6))[0] == 0
    assert run(capsys, "projects", "create", "gsm8k")[0] == 0
    assert run(capsys, "base-models", "select", "strop/tiny-random", "--wait")[0] == 0

    # a module the registered version does not have is refused at once, with the modules it has
    code, _, err = run(capsys, "projects", "set-evaluation", "gsm8k", "--dataset", "gsm8k/small",
                       "--grader", "bundle:gsm8k/scoring#reward:compute_score")
    assert code == 1 and "no module 'reward'" in err and "correctness, format_check, parsing" in err
    assert run(capsys, "projects", "set-evaluation", "gsm8k", "--dataset", "gsm8k/small",
               "--grader", "bundle:gsm8k/scoring#correctness:compute_score")[0] == 0
    wrong = seed_descriptor(tmp_path, "wrong")
    data = json.loads(wrong.read_text())
    data["config"]["reward"]["terms"][1]["module"] = "reward"
    wrong.write_text(json.dumps(data))
    code, _, err = run(capsys, "runs", "start", "-f", wrong, "--dry-run")
    assert code == 1 and "$.config.reward.terms[1].module" in err and "no module 'reward'" in err

    # seed 003's own sizes on 200 rows: "100 steps make four passes over a 200-row subset"
    code, out, err = run(capsys, "runs", "start", "-f", seed_descriptor(tmp_path, "seed"), "--dry-run")
    assert code == 0, err
    assert "100 steps of 8 prompts: 4 passes over 200 rows" in out

    # the real run: 5 steps of 4 prompts over 6 rows are 3 passes, and all 5 are made
    small = seed_descriptor(tmp_path, "small", maxSteps=5, batchSize=4, groupSize=2, maxCompletionLength=6)
    data = json.loads(small.read_text())
    data["config"]["dataset"] = "gsm8k/small"
    small.write_text(json.dumps(data))
    code, out, err = run(capsys, "runs", "start", "-f", small, "-o", "json", "--jq", ".runId")
    assert code == 0, err
    run_id = out.strip()
    code, out, err = run(capsys, "runs", "wait", run_id, "--exit-status", "--timeout", "600", "-o", "json")
    assert code == 0, err
    info = json.loads(out)
    assert info["status"] == "succeeded" and info["step"] == 5
    assert (info["steps"], info["passes"], info["passesMade"]) == (5, 3, 3)
    code, out, _ = run(capsys, "runs", "get", run_id)
    assert "step: 5 of 5" in out and "passes over the rows: 3 of 3" in out
    rows = json.loads(run(capsys, "runs", "metrics", run_id, "-o", "json")[1])
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert {"reward/format_check", "reward/correctness"} <= set(rows[0])
