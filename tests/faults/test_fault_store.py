"""Fault injection on the store: writers racing, content edited on disk, deleting what something still uses."""

import json
import subprocess
import sys

import pytest

from test_control import descriptor, home, rows_file, run, workspace  # noqa: F401 - shared fixtures and helpers


def test_racing_registrations_lose_no_version(home, tmp_path):  # noqa: F811
    files = []
    for writer in range(4):
        for i in range(5):
            path = tmp_path / f"w{writer}-{i}.jsonl"
            path.write_text(json.dumps({"question": f"q {writer} {i}", "answer": f"#### {writer * 10 + i}"}) + "\n")
            files.append(path)
    script = ("import sys\nfrom strop.control import registry\n"
              "for f in sys.argv[1:]:\n    registry.register_dataset('race/data', f)\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, *map(str, files[w * 5:(w + 1) * 5])],
                              stderr=subprocess.PIPE, text=True) for w in range(4)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    from strop.control import registry
    versions = [registry.get_dataset(f"race/data@{v}") for v in range(1, 21)]
    assert sorted(v["sha256"] for v in versions) == sorted({v["sha256"] for v in versions})  # 20 distinct
    with pytest.raises(Exception, match="no version 21"):
        registry.get_dataset("race/data@21")


def test_content_edited_on_disk_is_caught_on_read(home, tmp_path, capsys):  # noqa: F811
    from strop.control import registry
    from strop.store import artifacts
    version = registry.register_dataset("edit/me", rows_file(tmp_path / "rows.jsonl", 3))
    stored = artifacts.path_of(version["sha256"])
    stored.chmod(0o644)
    stored.write_text(stored.read_text().replace("1", "9"))
    with pytest.raises(artifacts.ArtifactError, match="was changed on disk"):
        registry.dataset_file("edit/me@1")


def test_deleting_what_is_in_use_is_refused_with_the_user_named(workspace, capsys):  # noqa: F811
    run_id = run(capsys, "runs", "start", "-f", descriptor(workspace, **{"config.rlHyperparams.maxSteps": 1}),
                 "--jq", ".runId")[1].strip()
    run(capsys, "runs", "wait", run_id, "--timeout", "300")
    code, _, err = run(capsys, "registry", "datasets", "delete", "arith/train")
    assert code == 1 and f"run {run_id}" in err
    code, _, err = run(capsys, "registry", "bundles", "delete", "arith/scoring@1")
    assert code == 1 and f"run {run_id}" in err
    run(capsys, "registry", "datasets", "register", "arith/eval", "-f", rows_file(workspace / "eval.jsonl", 2))
    assert run(capsys, "projects", "set-evaluation", "arith", "--dataset", "arith/eval", "--grader", "builtin:gsm8k")[0] == 0
    code, _, err = run(capsys, "registry", "datasets", "delete", "arith/eval")
    assert code == 1 and "project arith" in err
    # a version nobody uses goes, with its stored file
    run(capsys, "registry", "datasets", "register", "spare/rows", "-f", rows_file(workspace / "spare.jsonl", 2, start=50))
    code, out, _ = run(capsys, "registry", "datasets", "delete", "spare/rows", "-o", "json")
    assert code == 0 and json.loads(out) == {"deleted": ["spare/rows@1"], "filesRemoved": 1}
    code, _, err = run(capsys, "registry", "datasets", "get", "spare/rows")
    assert code == 1 and "no dataset named 'spare/rows'" in err
