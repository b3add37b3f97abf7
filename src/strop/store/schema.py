"""The tables of the strop store, as SQLAlchemy declarative models.

What is kept (a "version" is immutable once written; fix data by registering a new version):

    datasets / dataset_versions     named datasets, each version a content-addressed artifact (sha256)
    bundles / bundle_versions       scoring bundles (directories of Python files), same scheme
    projects                        a name plus evaluation settings (dataset ref + grader ref)
    base_models                     the base models a person selected; runs may use only these
    runs / run_steps / checkpoints  one training run, its metrics per step, its saved checkpoints
    models                          tuned models produced by runs
    evaluations / evaluation_items  one evaluation of a model on a dataset version, and its per-item rows

Foreign keys use ON DELETE RESTRICT wherever deleting the parent would silently lose something a person
relies on (a dataset's versions, a project's runs, the run that made a model, the dataset version an
evaluation read); rows that only make sense inside their parent (metrics, checkpoints, evaluation items)
go with it (CASCADE).

Ids of runs, models and evaluations are short readable strings made in Python (`run-3f9a1c2e`), so a
person can type them; other tables use integer keys. Timestamps are timezone-aware UTC on every backend.

    from strop.store import Run, open_store, session_scope
    with session_scope(open_store()) as s:
        run = Run(project_id=1, descriptor={"maxSteps": 10}, base_model="strop/tiny-random")
        s.add(run)
    print(run.id)        # 'run-3f9a1c2e'

A change here needs a new migration in `strop/store/migrations/versions/` (see `migrations/env.py`);
the store tests fail while the two disagree.
"""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

RUN_STATUSES = ("pending", "running", "succeeded", "failed", "cancelled")
EVALUATION_STATUSES = RUN_STATUSES
FINISHED_STATUSES = ("succeeded", "failed", "cancelled")

SHA256_LEN = 64
ID_LEN = 40
NAME_LEN = 200
REF_LEN = 1000
HOST_LEN = 255

# Fixed constraint names make migrations reproducible and let PostgreSQL and SQLite agree on them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_id(prefix: str) -> str:
    """A short id a person can type: `new_id("run")` -> 'run-3f9a1c2e' (32 random bits)."""
    return f"{prefix}-{secrets.token_hex(4)}"


class UTCDateTime(TypeDecorator):
    """A datetime stored as UTC and always read back timezone-aware.

    SQLite keeps no zone and returns naive values; without this, code comparing a stored time with
    `utcnow()` would raise "can't compare offset-naive and offset-aware datetimes" on SQLite only.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            # A naive time is ambiguous (local or UTC?); refusing it here beats storing a wrong hour.
            raise ValueError(f"timestamp {value!r} has no time zone: pass an aware datetime, e.g. utcnow()")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    # none_as_null: a Python None in a JSON column is SQL NULL, not the JSON text 'null'.
    type_annotation_map = {dict[str, Any]: JSON(none_as_null=True), datetime: UTCDateTime()}


def _status_check(column: str, statuses: tuple[str, ...]) -> CheckConstraint:
    allowed = ", ".join(f"'{s}'" for s in statuses)
    return CheckConstraint(f"{column} IN ({allowed})", name="status")


# --- registry ------------------------------------------------------------------------------------------


class Dataset(Base):
    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)
    description: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class DatasetVersion(Base):
    """One immutable version of a dataset; its rows are the artifact `sha256` (see strop.store.artifacts)."""

    __tablename__ = "dataset_versions"
    __table_args__ = (
        UniqueConstraint("dataset_id", "version"),
        # the same content is never stored as two versions: registering it again returns the old one
        UniqueConstraint("dataset_id", "sha256"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="RESTRICT"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(SHA256_LEN))
    row_count: Mapped[int] = mapped_column(Integer, default=0)
    source: Mapped[str | None] = mapped_column(Text)  # the file it was registered from, for people
    info: Mapped[dict[str, Any] | None] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Bundle(Base):
    __tablename__ = "bundles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)
    description: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class BundleVersion(Base):
    """One immutable snapshot of a bundle directory; `sha256` names its deterministic tar artifact."""

    __tablename__ = "bundle_versions"
    __table_args__ = (
        UniqueConstraint("bundle_id", "version"),
        UniqueConstraint("bundle_id", "sha256"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    bundle_id: Mapped[int] = mapped_column(ForeignKey("bundles.id", ondelete="RESTRICT"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(SHA256_LEN))
    source: Mapped[str | None] = mapped_column(Text)
    info: Mapped[dict[str, Any] | None] = mapped_column()  # e.g. the files and the checked entry points
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# --- projects and base models ------------------------------------------------------------------------------


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)
    description: Mapped[str | None] = mapped_column(Text)
    # References as a person wrote them ('gsm8k', 'gsm8k@2', 'bundle:math#reward:compute_score'); a run
    # resolves and pins them when it starts, so "latest" here stays latest.
    eval_dataset: Mapped[str | None] = mapped_column(String(REF_LEN))
    eval_grader: Mapped[str | None] = mapped_column(String(REF_LEN))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class SelectedBaseModel(Base):
    """A base model a person selected (`strop base-models select`); the id is the hub or catalog id."""

    __tablename__ = "base_models"

    id: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    path: Mapped[str | None] = mapped_column(Text)  # local folder once resolved
    info: Mapped[dict[str, Any] | None] = mapped_column()
    selected_at: Mapped[datetime] = mapped_column(default=utcnow)


# --- runs ---------------------------------------------------------------------------------------------


class Run(Base):
    __tablename__ = "runs"
    __table_args__ = (_status_check("status", RUN_STATUSES),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True, default=lambda: new_id("run"))
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="RESTRICT"), index=True)
    config_name: Mapped[str | None] = mapped_column(String(NAME_LEN))
    descriptor: Mapped[dict[str, Any]] = mapped_column()
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    # {"dataset": {"name": "gsm8k", "version": 2, "sha256": ...}, "bundles": [...]}: exactly what ran
    pinned: Mapped[dict[str, Any] | None] = mapped_column()
    # A string, not a key into base_models: un-selecting a model later must not be blocked by old runs.
    base_model: Mapped[str] = mapped_column(String(NAME_LEN))
    worker_pid: Mapped[int | None] = mapped_column(Integer)
    # The machine worker_pid belongs to: with a store shared by several machines, only that one can tell
    # from its /proc whether the worker still runs.
    worker_host: Mapped[str | None] = mapped_column(String(HOST_LEN))
    current_step: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    error: Mapped[str | None] = mapped_column(Text)
    # No foreign key: models.run_id already points here, and a key both ways is a cycle that SQLite cannot
    # add after the fact. models.run_id is the authoritative link; this is the quick answer for `runs get`.
    model_id: Mapped[str | None] = mapped_column(String(ID_LEN))


class RunStep(Base):
    __tablename__ = "run_steps"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column()
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    manifest_sha256: Mapped[str | None] = mapped_column(String(SHA256_LEN))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Model(Base):
    """A tuned model: the LoRA adapter a run produced, on top of `base_model`."""

    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True, default=lambda: new_id("model"))
    # RESTRICT: a run that produced a model cannot be deleted out from under it.
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="RESTRICT"), index=True)
    base_model: Mapped[str] = mapped_column(String(NAME_LEN))
    adapter_path: Mapped[str | None] = mapped_column(Text)
    artifact_sha256: Mapped[str | None] = mapped_column(String(SHA256_LEN))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# --- evaluations --------------------------------------------------------------------------------------------


class Evaluation(Base):
    __tablename__ = "evaluations"
    __table_args__ = (_status_check("status", EVALUATION_STATUSES),)

    id: Mapped[str] = mapped_column(String(ID_LEN), primary_key=True, default=lambda: new_id("eval"))
    # What was evaluated, as typed: a modelId, a base model id, or 'openai:NAME@URL'.
    model_ref: Mapped[str] = mapped_column(String(REF_LEN))
    # Set when model_ref is a tuned model; SET NULL so deleting a model keeps its evaluations readable.
    model_id: Mapped[str | None] = mapped_column(ForeignKey("models.id", ondelete="SET NULL"), index=True)
    dataset_version_id: Mapped[int] = mapped_column(
        ForeignKey("dataset_versions.id", ondelete="RESTRICT"), index=True
    )
    grader_ref: Mapped[str] = mapped_column(String(REF_LEN))
    # Set for the evaluations a run makes every `evalEvery` steps and at its end.
    run_id: Mapped[str | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), index=True)
    run_step: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    samples: Mapped[int] = mapped_column(Integer, default=1)
    summary: Mapped[dict[str, Any] | None] = mapped_column()
    worker_pid: Mapped[int | None] = mapped_column(Integer)
    worker_host: Mapped[str | None] = mapped_column(String(HOST_LEN))  # as for runs: whose /proc knows
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column()
    finished_at: Mapped[datetime | None] = mapped_column()
    error: Mapped[str | None] = mapped_column(Text)


class EvaluationItem(Base):
    """One graded response: item `item_index` of the dataset, sample `sample` of the k drawn for it."""

    __tablename__ = "evaluation_items"
    __table_args__ = (UniqueConstraint("evaluation_id", "item_index", "sample"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    evaluation_id: Mapped[str] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"))
    item_index: Mapped[int] = mapped_column(Integer)
    sample: Mapped[int] = mapped_column(Integer, default=0)
    question: Mapped[str] = mapped_column(Text)
    gold: Mapped[str | None] = mapped_column(Text)
    response: Mapped[str | None] = mapped_column(Text)
    extracted: Mapped[str | None] = mapped_column(Text)  # the answer parsed from the response; None: none found
    score: Mapped[float | None] = mapped_column(Float)
    correct: Mapped[bool | None] = mapped_column(Boolean)
    tokens: Mapped[int | None] = mapped_column(Integer)
    latency_s: Mapped[float | None] = mapped_column(Float)
    # The LLM judge's verdict: {"scores": {metric: int}, "reasoning": str} or {"error": why none was had}.
    judge: Mapped[dict[str, Any] | None] = mapped_column()

