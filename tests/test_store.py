"""The state store (strop.store): schema round trips and constraints, SQLite setup, concurrent writers,
migrations, artifacts, and the errors a person sees.

Tests marked `postgres` repeat the round trip and concurrency checks on the server that
STROP_TEST_POSTGRES_URL names (a scratch database: its strop tables are dropped first), e.g.

    STROP_TEST_POSTGRES_URL=postgresql://strop:strop@localhost/strop_test pytest tests/test_store.py -m postgres
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import redirect_stdout
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.exc import IntegrityError

from strop.errors import StropError
from strop.store import (
    ArtifactError, Base, Bundle, BundleVersion, Checkpoint, Dataset, DatasetVersion, Evaluation, EvaluationItem,
    Model, Project, Run, RunStep, SelectedBaseModel, StoreError, artifacts, clear_engine_cache, current_revision,
    database_url, get_engine, new_id, open_store, session_scope, upgrade,
)
from strop.store import db

PG_ENV = "STROP_TEST_POSTGRES_URL"
HEAD = db._head_and_known()[0]


@pytest.fixture(autouse=True)
def store_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("STROP_HOME", str(tmp_path))
    monkeypatch.delenv(db.ENV_VAR, raising=False)
    clear_engine_cache()
    yield tmp_path
    clear_engine_cache()


def _postgres_url() -> str:
    url = os.environ.get(PG_ENV, "").strip()
    if not url:
        pytest.skip(f"{PG_ENV} is not set: these tests need a PostgreSQL server (CI starts one)")
    engine = get_engine(url)
    # A clean slate per test; the URL must name a scratch database.
    Base.metadata.drop_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {db.VERSION_TABLE}"))
    clear_engine_cache()
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request, tmp_path) -> str:
    if request.param == "postgres":
        return _postgres_url()
    return f"sqlite:///{tmp_path / 'strop.db'}"


def _everything(s) -> dict[str, object]:
    """One row in every table, linked together; returns the ones tests refer to, by table name."""
    when = datetime(2025, 3, 1, 12, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))
    dataset = Dataset(name="gsm8k", description="grade-school math")
    bundle = Bundle(name="math-reward")
    project = Project(name="demo", eval_dataset="gsm8k@1", eval_grader="bundle:math-reward#reward:compute_score")
    s.add_all([dataset, bundle, project, SelectedBaseModel(id="strop/tiny-random", info={"params": 1234})])
    s.flush()
    dv = DatasetVersion(dataset_id=dataset.id, version=1, sha256="a" * 64, row_count=3, source="train.jsonl",
                        info={"columns": ["question", "answer"]})
    bv = BundleVersion(bundle_id=bundle.id, version=1, sha256="b" * 64, info={"files": ["reward.py"]})
    run = Run(project_id=project.id, config_name="gsm8k-grpo", base_model="strop/tiny-random",
              descriptor={"maxSteps": 3, "rewards": [{"name": "format", "weight": 0.1}], "ünï": "cödé"},
              pinned={"dataset": {"name": "gsm8k", "version": 1}}, status="running", worker_pid=4242,
              current_step=2, started_at=when)
    s.add_all([dv, bv, run])
    s.flush()
    model = Model(run_id=run.id, base_model="strop/tiny-random", adapter_path="/x/adapter", artifact_sha256="c" * 64)
    s.add_all([RunStep(run_id=run.id, step=1, metrics={"reward/mean": 0.25, "loss": -0.5}),
               Checkpoint(run_id=run.id, step=1, path="/x/ckpt-1", manifest_sha256="d" * 64), model])
    s.flush()
    evaluation = Evaluation(model_ref=model.id, model_id=model.id, dataset_version_id=dv.id,
                            grader_ref="builtin:gsm8k", samples=2, summary={"accuracy": 0.5, "n": 2},
                            run_id=run.id, run_step=1, finished_at=when)
    s.add(evaluation)
    s.flush()
    item = EvaluationItem(evaluation_id=evaluation.id, item_index=0, sample=1, question="2+2?", gold="4",
                          response="#### 4", extracted="4", score=1.0, correct=True, tokens=5, latency_s=0.01)
    s.add(item)
    return {"datasets": dataset, "dataset_versions": dv, "bundles": bundle, "projects": project, "runs": run,
            "models": model, "evaluations": evaluation}


def test_every_table_round_trips(store_url):
    engine = open_store(store_url)
    with session_scope(engine) as s:
        made = _everything(s)
    run_id, model_id, eval_id = made["runs"].id, made["models"].id, made["evaluations"].id
    assert run_id.startswith("run-") and model_id.startswith("model-") and eval_id.startswith("eval-")

    clear_engine_cache()  # read through a fresh engine: nothing may come from the identity map
    with session_scope(open_store(store_url), read_only=True) as s:
        for table in Base.metadata.sorted_tables:  # a table added to schema.py needs a row in _everything
            assert s.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 1, table.name
        run = s.get(Run, run_id)
        assert run.descriptor["ünï"] == "cödé" and run.descriptor["rewards"][0]["weight"] == 0.1
        assert (run.status, run.worker_pid, run.current_step) == ("running", 4242, 2)
        assert run.pinned["dataset"]["version"] == 1 and run.config_name == "gsm8k-grpo"
        assert run.started_at == datetime(2025, 3, 1, 10, 30, 15, 123456, tzinfo=timezone.utc)
        assert run.started_at.tzinfo is not None and run.created_at.utcoffset() == timedelta(0)
        assert run.finished_at is None and run.error is None and run.model_id is None
        step = s.scalars(sa.select(RunStep).where(RunStep.run_id == run_id)).one()
        assert step.metrics == {"reward/mean": 0.25, "loss": -0.5}
        assert s.scalars(sa.select(Checkpoint.path)).one() == "/x/ckpt-1"
        assert s.get(Model, model_id).artifact_sha256 == "c" * 64
        evaluation = s.get(Evaluation, eval_id)
        assert (evaluation.status, evaluation.samples, evaluation.summary["accuracy"]) == ("pending", 2, 0.5)
        item = s.scalars(sa.select(EvaluationItem)).one()
        assert (item.correct, item.score, item.extracted, item.sample) == (True, 1.0, "4", 1)
        dv = s.scalars(sa.select(DatasetVersion)).one()
        assert (dv.version, dv.row_count, dv.info["columns"]) == (1, 3, ["question", "answer"])
        assert s.scalars(sa.select(BundleVersion.info)).one() == {"files": ["reward.py"]}
        assert s.scalars(sa.select(Project.eval_grader)).one().startswith("bundle:math-reward")
        assert s.get(SelectedBaseModel, "strop/tiny-random").info == {"params": 1234}
        assert s.scalars(sa.select(Dataset.description)).one() == "grade-school math"
        assert s.scalars(sa.select(Bundle.name)).one() == "math-reward"


def _refused(engine, *rows) -> None:
    with pytest.raises(IntegrityError):
        with session_scope(engine) as s:
            s.add_all(rows)


def test_constraints_hold():
    engine = open_store()
    with session_scope(engine) as s:
        made = _everything(s)
    dataset, bundle, run = made["datasets"], made["bundles"], made["runs"]

    _refused(engine, DatasetVersion(dataset_id=dataset.id, version=1, sha256="e" * 64))  # same version
    _refused(engine, DatasetVersion(dataset_id=dataset.id, version=2, sha256="a" * 64))  # same content
    _refused(engine, BundleVersion(bundle_id=bundle.id, version=1, sha256="f" * 64))
    _refused(engine, RunStep(run_id=run.id, step=1, metrics={}))
    _refused(engine, Checkpoint(run_id=run.id, step=1, path="/elsewhere"))
    _refused(engine, Dataset(name="gsm8k"))
    _refused(engine, Project(name="demo"))
    _refused(engine, Run(project_id=10_000, descriptor={}, base_model="x"))  # no such project
    _refused(engine, Run(project_id=made["projects"].id, descriptor={}, base_model="x", status="exploded"))
    with session_scope(engine) as s:  # a second version of other content is fine
        s.add(DatasetVersion(dataset_id=dataset.id, version=2, sha256="e" * 64))

    for table, key in [(Dataset, dataset.id), (Bundle, bundle.id), (Project, made["projects"].id),
                       (Run, run.id), (DatasetVersion, made["dataset_versions"].id)]:
        with pytest.raises(IntegrityError):  # each is still referenced: versions, runs, a model, an evaluation
            with session_scope(engine) as s:
                s.execute(sa.delete(table).where(table.__table__.c.id == key))

    # Deleting a model keeps its evaluations (model_id cleared); then the run can go, with its steps.
    with session_scope(engine) as s:
        s.execute(sa.delete(Model))
        assert s.get(Evaluation, made["evaluations"].id).model_id is None
        s.execute(sa.delete(Run).where(Run.id == run.id))
    with session_scope(engine, read_only=True) as s:
        assert s.scalars(sa.select(RunStep)).all() == [] and s.scalars(sa.select(Checkpoint)).all() == []
        assert s.get(Evaluation, made["evaluations"].id).run_id is None


def test_naive_timestamps_are_refused():
    with pytest.raises(sa.exc.StatementError, match="no time zone"):
        with session_scope(open_store()) as s:
            s.add(Dataset(name="d", created_at=datetime(2025, 1, 1)))


def test_session_scope_rolls_back_on_error_and_read_only_never_commits():
    engine = open_store()
    with pytest.raises(RuntimeError):
        with session_scope(engine) as s:
            s.add(Dataset(name="lost"))
            s.flush()
            raise RuntimeError("boom")
    with session_scope(engine, read_only=True) as s:
        s.add(Dataset(name="also-lost"))
        s.flush()
    with session_scope(engine, read_only=True) as s:
        assert s.scalars(sa.select(Dataset)).all() == []


def test_readers_are_not_blocked_by_a_writer():
    engine = open_store()
    with session_scope(engine) as s:
        s.add(Dataset(name="committed"))
    with session_scope(engine) as writer:  # holds the write lock until the block ends
        writer.add(Dataset(name="pending"))
        writer.flush()
        started = time.monotonic()
        with session_scope(engine, read_only=True) as reader:
            assert reader.scalars(sa.select(Dataset.name)).all() == ["committed"]
        assert time.monotonic() - started < 5


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_worker_uses_its_own_connections():
    engine = open_store()
    with session_scope(engine) as s:
        s.add(Dataset(name="before-fork"))

    pid = os.fork()
    if pid == 0:  # the child writes through the engine it inherited, as a background worker would
        code = 1
        try:
            with session_scope(open_store()) as s:
                s.add(Dataset(name="from-child"))
            code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    with session_scope(engine, read_only=True) as s:
        assert sorted(s.scalars(sa.select(Dataset.name))) == ["before-fork", "from-child"]


def test_sqlite_is_set_up_for_several_processes(store_home):
    engine = open_store()
    assert engine.url.database == str(store_home / "strop.db")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    assert get_engine() is engine and get_engine(str(engine.url)) is engine
    clear_engine_cache()
    assert get_engine() is not engine


# Each process imports strop, says it is ready, and waits for the others, so they really run at once.
PRELUDE = """
import sys, time
from pathlib import Path
def start_together():
    Path(sys.argv[1] + "-ready-" + sys.argv[2]).touch()
    while not Path(sys.argv[1] + "-go").exists():
        time.sleep(0.002)
"""


def _run_together(tmp_path, script: str, arg_lists: list[list[str]]) -> list[str]:
    """One process per argument list; sys.argv[3:] is that list. Returns their outputs; fails if one fails."""
    base = str(tmp_path / "sync")
    procs = [subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(script), base, str(i), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, args in enumerate(arg_lists)]
    deadline = time.time() + 60
    while not all(Path(f"{base}-ready-{i}").exists() for i in range(len(procs))) and time.time() < deadline:
        time.sleep(0.01)
    Path(base + "-go").touch()
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out.strip())
    return outputs


def test_two_processes_writing_steps_lose_nothing(store_url, tmp_path):
    engine = open_store(store_url)
    with session_scope(engine) as s:
        project = Project(name="p")
        s.add(project)
        s.flush()
        runs = [Run(project_id=project.id, descriptor={}, base_model="m") for _ in range(2)]
        s.add_all(runs)
    _run_together(tmp_path, """
        from strop.store import Run, RunStep, open_store, session_scope
        url, run_id = sys.argv[3:]
        engine = open_store(url)
        start_together()
        for step in range(50):
            with session_scope(engine) as s:  # one transaction per row: as many lock handovers as possible
                run = s.get(Run, run_id)      # read, then write: what needs BEGIN IMMEDIATE on SQLite
                run.current_step = step
                s.add(RunStep(run_id=run_id, step=step, metrics={"step": step, "writer": run_id}))
    """, [[store_url, run.id] for run in runs])

    with session_scope(engine, read_only=True) as s:
        for run in runs:
            steps = s.scalars(sa.select(RunStep.step).where(RunStep.run_id == run.id).order_by(RunStep.step)).all()
            assert steps == list(range(50))
            assert s.get(Run, run.id).current_step == 49


def test_concurrent_first_opens_all_succeed(store_url, tmp_path):
    outputs = _run_together(tmp_path, """
        from strop.store import current_revision, open_store
        start_together()
        print(current_revision(open_store(sys.argv[3])))
    """, [[store_url]] * 4)
    assert outputs == [HEAD] * 4


def _differences(engine) -> list:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": db.VERSION_TABLE, "compare_type": True})
        return compare_metadata(context, Base.metadata)


def test_store_at_0001_is_upgraded_to_head_and_matches_the_schema(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = get_engine(url)
    upgrade(engine, "0001")
    assert current_revision(engine) == "0001"
    with session_scope(engine) as s:  # data written by the old strop survives the upgrade
        s.add(Dataset(name="kept"))
    clear_engine_cache()

    engine = open_store(url)
    assert current_revision(engine) == HEAD
    assert _differences(engine) == []
    with session_scope(engine, read_only=True) as s:
        assert s.scalars(sa.select(Dataset.name)).all() == ["kept"]


def _shape(engine) -> dict:
    """Everything compare_metadata does not look at: constraint and index names, CHECK constraints."""
    inspector = sa.inspect(engine)
    shape = {}
    for table in inspector.get_table_names():
        if table == db.VERSION_TABLE:
            continue
        shape[table] = (
            inspector.get_pk_constraint(table)["constrained_columns"],
            sorted((u["name"], tuple(u["column_names"])) for u in inspector.get_unique_constraints(table)),
            sorted((f["name"], tuple(f["constrained_columns"]), f["referred_table"], f["options"].get("ondelete"))
                   for f in inspector.get_foreign_keys(table)),
            sorted((i["name"], tuple(i["column_names"]), bool(i["unique"])) for i in inspector.get_indexes(table)),
            sorted((c["name"], " ".join(c["sqltext"].split())) for c in inspector.get_check_constraints(table)),
        )
    return shape


def test_migrations_build_the_same_schema_as_schema_py(tmp_path):
    migrated = open_store(f"sqlite:///{tmp_path / 'migrated.db'}")
    created = get_engine(f"sqlite:///{tmp_path / 'created.db'}")
    Base.metadata.create_all(created)
    assert _shape(migrated) == _shape(created)
    assert set(_shape(migrated)) == set(Base.metadata.tables)


def test_migrations_render_for_postgresql():
    # Checks the migration's SQL for PostgreSQL without a server (offline mode).
    out = io.StringIO()
    with redirect_stdout(out):
        command.upgrade(db.alembic_config("postgresql://u:p@localhost/strop"), "head", sql=True)
    sql = out.getvalue()
    for table in Base.metadata.tables:
        assert f"CREATE TABLE {table} (" in sql
    assert "ON DELETE RESTRICT" in sql and "TIMESTAMP WITH TIME ZONE" in sql and "ck_runs_status CHECK" in sql


def test_a_store_from_a_newer_strop_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    with session_scope(open_store(url)) as s:
        s.execute(sa.text(f"UPDATE {db.VERSION_TABLE} SET version_num = '9999'"))
    clear_engine_cache()
    with pytest.raises(StoreError, match="newer strop"):
        open_store(url)


def test_database_url_default_and_override(store_home, monkeypatch):
    assert database_url() == f"sqlite:///{store_home / 'strop.db'}"
    monkeypatch.setenv(db.ENV_VAR, f"sqlite:///{store_home / 'elsewhere' / 'x.db'}")
    assert open_store().url.database == str(store_home / "elsewhere" / "x.db")


@pytest.mark.parametrize("url, expected", [
    ("not a url", "is not a SQLAlchemy URL"),
    ("nosuchdb://host/x", "unknown database kind 'nosuchdb'"),
])
def test_a_bad_url_names_the_variable_and_an_example(monkeypatch, url, expected):
    monkeypatch.setenv(db.ENV_VAR, url)
    with pytest.raises(StoreError, match=expected) as info:
        open_store()
    message = str(info.value)
    assert "STROP_DATABASE_URL" in message and "sqlite:///" in message and "postgresql://" in message
    assert isinstance(info.value, StropError)


def test_postgres_without_its_driver_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes `import psycopg` fail as if it were not installed
    monkeypatch.setenv(db.ENV_VAR, "postgresql://strop:secret@localhost/strop")
    with pytest.raises(StoreError, match=r"strop\[postgres\]") as info:
        open_store()
    assert "secret" not in str(info.value)


def test_new_ids_are_short_and_readable():
    ids = {new_id("run") for _ in range(100)}
    assert len(ids) == 100 and all(len(i) == 12 and i.startswith("run-") for i in ids)


# --- artifacts -----------------------------------------------------------------------------------------------


def _stored_files(home: Path) -> list[Path]:
    return sorted(p for p in (home / "artifacts").rglob("*") if p.is_file())


def test_artifacts_are_stored_once_by_sha256(store_home, tmp_path):
    data = b"question,answer\n2+2,4\n"
    source = tmp_path / "rows.csv"
    source.write_bytes(data)
    sha = artifacts.put_bytes(data)
    assert sha == hashlib.sha256(data).hexdigest()
    assert artifacts.put_file(source) == sha and artifacts.put_bytes(data) == sha
    assert _stored_files(store_home) == [store_home / "artifacts" / sha[:2] / sha]
    assert artifacts.path_of(sha).read_bytes() == data and artifacts.exists(sha)

    shas = []
    threads = [threading.Thread(target=lambda: shas.append(artifacts.put_bytes(b"x" * 100_000))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(shas)) == 1 and len(_stored_files(store_home)) == 2  # no temp files left behind


def test_tampering_is_detected_and_storing_again_repairs(store_home):
    sha = artifacts.put_bytes(b"the original")
    location = store_home / "artifacts" / sha[:2] / sha
    location.chmod(0o644)
    location.write_bytes(b"the original, edited")
    with pytest.raises(ArtifactError, match="changed on disk"):
        artifacts.path_of(sha)
    assert artifacts.put_bytes(b"the original") == sha
    assert artifacts.path_of(sha).read_bytes() == b"the original"


def test_artifact_errors_say_what_to_do(tmp_path):
    with pytest.raises(ArtifactError, match="64 lowercase hex"):
        artifacts.path_of("abc")
    with pytest.raises(ArtifactError, match="STROP_HOME"):
        artifacts.path_of("0" * 64)
    with pytest.raises(ArtifactError, match="missing"):
        artifacts.put_file(tmp_path / "nope.jsonl")
    with pytest.raises(ArtifactError, match="put_dir"):
        artifacts.put_file(tmp_path)
    with pytest.raises(ArtifactError, match="not one"):
        artifacts.put_dir(tmp_path / "nope")
    with pytest.raises(ArtifactError, match="not a directory snapshot"):
        artifacts.extract_dir(artifacts.put_bytes(b"plain bytes"), tmp_path / "out")


def _bundle(root: Path, reward: str = "def compute_score(**kw):\n    return 1.0\n") -> Path:
    (root / "lib").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "reward.py").write_text(reward)
    (root / "lib" / "helpers.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    return root


def test_directories_are_stored_deterministically(tmp_path):
    first = _bundle(tmp_path / "a")
    time.sleep(0.01)
    second = _bundle(tmp_path / "b")
    os.utime(second / "reward.py", (1e9, 1e9))
    (second / "lib" / "helpers.py").chmod(0o600)  # only "executable or not" is kept
    (second / "__pycache__").mkdir()
    (second / "__pycache__" / "reward.cpython-311.pyc").write_bytes(b"\0")
    sha = artifacts.put_dir(first)
    assert artifacts.put_dir(second) == sha
    assert artifacts.put_dir(_bundle(tmp_path / "c", reward="def compute_score(**kw):\n    return 0.0\n")) != sha

    out = artifacts.extract_dir(sha, tmp_path / "out")
    assert (out / "reward.py").read_text() == (first / "reward.py").read_text()
    assert (out / "lib" / "helpers.py").read_text() == "X = 1\n" and (out / "empty").is_dir()
    assert os.access(out / "run.sh", os.X_OK) and not os.access(out / "reward.py", os.X_OK)
    assert (out / "reward.py").stat().st_mtime > time.time() - 60  # fresh, not 1970
    with pytest.raises(ArtifactError, match="not an empty folder"):
        artifacts.extract_dir(sha, out)


def test_links_in_a_directory_are_refused(tmp_path):
    root = _bundle(tmp_path / "a")
    (root / "link.py").symlink_to(root / "reward.py")
    with pytest.raises(ArtifactError, match="symbolic link"):
        artifacts.put_dir(root)
