"""Fault injection on the store: writers racing, content edited on disk, deleting what something still uses."""

import json
import subprocess
import sys

import pytest

from test_control import ROOT, descriptor, home, rows_file, run, workspace  # noqa: F401 - shared fixtures and helpers


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request, home, monkeypatch):  # noqa: F811
    """The store the test's processes share: SQLite under `home`, or the PostgreSQL server of test_store's
    postgres tests (skipped without STROP_TEST_POSTGRES_URL)."""
    if request.param == "postgres":
        from strop.store import clear_engine_cache
        from test_store import _postgres_url
        monkeypatch.setenv("STROP_DATABASE_URL", _postgres_url())
        clear_engine_cache()
    return request.param


def test_racing_registrations_lose_no_version(backend, tmp_path):
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


def _evaluation_row(project: str, dataset_ref: str, grader: str, model_id: str | None = None) -> str:
    """An evaluation record as `evaluations start` leaves it, written straight into the store (no model runs)."""
    from sqlalchemy import select

    from strop.control import registry
    from strop.store import open_store, session_scope
    from strop.store.schema import Dataset, DatasetVersion, Evaluation
    version = registry.get_dataset(dataset_ref)
    with session_scope(open_store()) as s:
        version_id = s.scalar(select(DatasetVersion.id).join(Dataset).where(
            Dataset.name == version["name"], DatasetVersion.version == version["version"]))
        evaluation = Evaluation(model_ref=model_id or "strop/tiny-random", model_id=model_id, grader_ref=grader,
                                dataset_version_id=version_id, status="succeeded")
        s.add(evaluation)
        s.flush()
        return evaluation.id


def test_a_bundle_an_evaluation_graded_with_is_not_deleted(workspace, capsys):  # noqa: F811
    bundle = ROOT / "examples" / "gsm8k" / "scoring"
    assert run(capsys, "registry", "bundles", "register", "eval/scoring", "-f", bundle)[0] == 0
    pinned = _evaluation_row("arith", "arith/train", "bundle:eval/scoring@1#reward:compute_score")
    code, _, err = run(capsys, "registry", "bundles", "delete", "eval/scoring@1")
    assert code == 1 and f"evaluation {pinned}" in err and err.startswith("strop: error:")
    # 'NAME' without a version was whichever version was latest then: every version counts as used
    assert run(capsys, "registry", "bundles", "register", "latest/scoring", "-f", bundle)[0] == 0
    latest = _evaluation_row("arith", "arith/train", "bundle:latest/scoring#reward:compute_score")
    code, _, err = run(capsys, "registry", "bundles", "delete", "latest/scoring")
    assert code == 1 and f"evaluation {latest}" in err
    assert json.loads(run(capsys, "registry", "bundles", "get", "latest/scoring", "-o", "json")[1])["version"] == 1
    # the project's evaluation settings protect a bundle too
    assert run(capsys, "registry", "bundles", "register", "project/scoring", "-f", bundle)[0] == 0
    assert run(capsys, "projects", "set-evaluation", "arith", "--dataset", "arith/train", "--grader",
               "bundle:project/scoring#reward:compute_score")[0] == 0
    code, _, err = run(capsys, "registry", "bundles", "delete", "project/scoring@1")
    assert code == 1 and "project arith (its evaluation settings)" in err
    # a builtin-graded evaluation protects no bundle
    _evaluation_row("arith", "arith/train", "builtin:gsm8k")
    assert run(capsys, "registry", "bundles", "register", "free/scoring", "-f", bundle)[0] == 0
    assert run(capsys, "registry", "bundles", "delete", "free/scoring")[0] == 0


def test_a_model_an_evaluation_used_is_not_deleted(workspace, capsys):  # noqa: F811
    from sqlalchemy import select

    from strop.store import open_store, session_scope
    from strop.store.schema import Model, Project, Run
    with session_scope(open_store()) as s:
        project = s.scalar(select(Project).where(Project.name == "arith"))
        row = Run(project_id=project.id, descriptor={"config": {"rlHyperparams": {}}}, base_model="strop/tiny-random",
                  status="succeeded")
        s.add(row)
        s.flush()
        model = Model(run_id=row.id, base_model="strop/tiny-random")
        s.add(model)
        s.flush()
        model_id = model.id
    evaluation = _evaluation_row("arith", "arith/train", "builtin:gsm8k", model_id=model_id)
    code, _, err = run(capsys, "models", "delete", model_id)
    assert code == 1 and evaluation in err and err.startswith("strop: error:")
    assert json.loads(run(capsys, "models", "get", model_id, "-o", "json")[1])["modelId"] == model_id


def test_an_unpacked_bundle_edited_on_disk_is_unpacked_again(workspace, capsys):  # noqa: F811
    from strop.control import registry
    from strop.store import artifacts
    folder, version = registry.bundle_dir("arith/scoring@1")
    original = (folder / "reward.py").read_text()
    (folder / "reward.py").write_text("def compute_score(**kw):\n    return 1.0  # every answer right\n")
    (folder / "extra.py").write_text("")
    again, _ = registry.bundle_dir("arith/scoring@1")
    assert again == folder and (folder / "reward.py").read_text() == original and not (folder / "extra.py").exists()
    assert artifacts.dir_sha256(folder) == version["sha256"]
    assert "was changed after it was unpacked" in capsys.readouterr().err


def test_a_run_folder_dataset_edited_before_resume_is_copied_again(workspace, capsys):  # noqa: F811
    from strop.control import runs
    from strop.control.descriptor import load_descriptor
    from strop.control.worker import build_config
    from strop.store.schema import Run
    path = descriptor(workspace)
    pinned = runs.admit(load_descriptor(path))
    run_row = Run(id="run-resumed", descriptor=load_descriptor(path).to_dict(), pinned=pinned,
                  base_model="strop/tiny-random")
    folder = workspace / "run-folder"
    config = build_config(run_row, folder)
    dataset = folder / "dataset.jsonl"
    assert config.dataset == str(dataset)
    original = dataset.read_bytes()
    dataset.write_bytes(original.replace(b"#### 1", b"#### 7"))  # someone "fixed" the answers in place
    build_config(run_row, folder)
    assert dataset.read_bytes() == original
    assert "no longer matches the dataset version the run pinned" in capsys.readouterr().err
