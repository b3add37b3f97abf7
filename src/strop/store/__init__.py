"""strop's state: a SQL store for the registry, projects, runs, models and evaluations, and content-addressed
artifact files beside it.

The database is SQLite at `$STROP_HOME/strop.db` unless `$STROP_DATABASE_URL` names another (PostgreSQL for a
shared store); `open_store()` creates or upgrades its schema with Alembic. Artifacts (dataset rows, bundle
snapshots, adapters) live under `$STROP_HOME/artifacts`, named by sha256.

    from sqlalchemy import select
    from strop.store import Dataset, DatasetVersion, artifacts, open_store, session_scope

    sha = artifacts.put_file("train.jsonl")
    with session_scope(open_store()) as s:
        ds = Dataset(name="gsm8k")
        s.add(ds)
        s.flush()                                   # assigns ds.id
        s.add(DatasetVersion(dataset_id=ds.id, version=1, sha256=sha, row_count=100))
    with session_scope(open_store(), read_only=True) as s:
        print(s.scalars(select(Dataset.name)).all())
"""

from strop.store import artifacts
from strop.store.artifacts import ArtifactError
from strop.store.db import (
    ENV_VAR,
    StoreError,
    clear_engine_cache,
    current_revision,
    database_url,
    get_engine,
    open_store,
    session_scope,
    upgrade,
)
from strop.store.schema import (
    EVALUATION_STATUSES,
    FINISHED_STATUSES,
    RUN_STATUSES,
    Base,
    Bundle,
    BundleVersion,
    Checkpoint,
    Dataset,
    DatasetVersion,
    Evaluation,
    EvaluationItem,
    Model,
    Project,
    Run,
    RunStep,
    SelectedBaseModel,
    new_id,
    utcnow,
)

__all__ = [
    "ENV_VAR", "EVALUATION_STATUSES", "FINISHED_STATUSES", "RUN_STATUSES",
    "ArtifactError", "StoreError",
    "Base", "Bundle", "BundleVersion", "Checkpoint", "Dataset", "DatasetVersion", "Evaluation", "EvaluationItem",
    "Model", "Project", "Run", "RunStep", "SelectedBaseModel",
    "artifacts", "clear_engine_cache", "current_revision", "database_url", "get_engine", "new_id",
    "open_store", "session_scope", "upgrade", "utcnow",
]
