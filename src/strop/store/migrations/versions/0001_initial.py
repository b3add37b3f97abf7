"""The first strop store: registry, projects, base models, runs, models and evaluations.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Every table, key and index is spelled out here rather than taken from strop.store.schema, so this file keeps
building exactly this schema after schema.py has moved on; later revisions upgrade from it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STATUS_CHECK = "status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')"
# Check constraints are named with op.f(): the store's naming convention ("ck_<table>_<name>") would
# otherwise be applied on top of a name that already follows it.


def _when() -> sa.types.TypeEngine:
    return sa.DateTime(timezone=True)


def _fk(table: str, column: str, target: str, ondelete: str) -> sa.ForeignKeyConstraint:
    target_table = target.split(".")[0]
    return sa.ForeignKeyConstraint(
        [column], [target], name=f"fk_{table}_{column}_{target_table}", ondelete=ondelete
    )


def _index(table: str, column: str) -> None:
    op.create_index(f"ix_{table}_{column}", table, [column])


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("created_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_datasets"),
        sa.UniqueConstraint("name", name="uq_datasets_name"),
    )
    op.create_table(
        "dataset_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("info", sa.JSON(), nullable=True),
        sa.Column("created_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_dataset_versions"),
        _fk("dataset_versions", "dataset_id", "datasets.id", "RESTRICT"),
        sa.UniqueConstraint("dataset_id", "version", name="uq_dataset_versions_dataset_id_version"),
        sa.UniqueConstraint("dataset_id", "sha256", name="uq_dataset_versions_dataset_id_sha256"),
    )
    _index("dataset_versions", "dataset_id")

    op.create_table(
        "bundles",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("created_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_bundles"),
        sa.UniqueConstraint("name", name="uq_bundles_name"),
    )
    op.create_table(
        "bundle_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("bundle_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("source", sa.Text(), nullable=True),
        sa.Column("info", sa.JSON(), nullable=True),
        sa.Column("created_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_bundle_versions"),
        _fk("bundle_versions", "bundle_id", "bundles.id", "RESTRICT"),
        sa.UniqueConstraint("bundle_id", "version", name="uq_bundle_versions_bundle_id_version"),
        sa.UniqueConstraint("bundle_id", "sha256", name="uq_bundle_versions_bundle_id_sha256"),
    )
    _index("bundle_versions", "bundle_id")

    op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("eval_dataset", sa.String(1000), nullable=True),
        sa.Column("eval_grader", sa.String(1000), nullable=True),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("updated_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_projects"),
        sa.UniqueConstraint("name", name="uq_projects_name"),
    )

    op.create_table(
        "base_models",
        sa.Column("id", sa.String(200), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("info", sa.JSON(), nullable=True),
        sa.Column("selected_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_base_models"),
    )

    op.create_table(
        "runs",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("config_name", sa.String(200), nullable=True),
        sa.Column("descriptor", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("pinned", sa.JSON(), nullable=True),
        sa.Column("base_model", sa.String(200), nullable=False),
        sa.Column("worker_pid", sa.Integer(), nullable=True),
        sa.Column("current_step", sa.Integer(), nullable=False),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("started_at", _when(), nullable=True),
        sa.Column("finished_at", _when(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("model_id", sa.String(40), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        _fk("runs", "project_id", "projects.id", "RESTRICT"),
        sa.CheckConstraint(STATUS_CHECK, name=op.f("ck_runs_status")),
    )
    _index("runs", "project_id")
    _index("runs", "status")

    op.create_table(
        "run_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_run_steps"),
        _fk("run_steps", "run_id", "runs.id", "CASCADE"),
        sa.UniqueConstraint("run_id", "step", name="uq_run_steps_run_id_step"),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("manifest_sha256", sa.String(64), nullable=True),
        sa.Column("created_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
        _fk("checkpoints", "run_id", "runs.id", "CASCADE"),
        sa.UniqueConstraint("run_id", "step", name="uq_checkpoints_run_id_step"),
    )

    op.create_table(
        "models",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("base_model", sa.String(200), nullable=False),
        sa.Column("adapter_path", sa.Text(), nullable=True),
        sa.Column("artifact_sha256", sa.String(64), nullable=True),
        sa.Column("created_at", _when(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_models"),
        _fk("models", "run_id", "runs.id", "RESTRICT"),
    )
    _index("models", "run_id")

    op.create_table(
        "evaluations",
        sa.Column("id", sa.String(40), nullable=False),
        sa.Column("model_ref", sa.String(1000), nullable=False),
        sa.Column("model_id", sa.String(40), nullable=True),
        sa.Column("dataset_version_id", sa.Integer(), nullable=False),
        sa.Column("grader_ref", sa.String(1000), nullable=False),
        sa.Column("run_id", sa.String(40), nullable=True),
        sa.Column("run_step", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("worker_pid", sa.Integer(), nullable=True),
        sa.Column("created_at", _when(), nullable=False),
        sa.Column("started_at", _when(), nullable=True),
        sa.Column("finished_at", _when(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_evaluations"),
        _fk("evaluations", "model_id", "models.id", "SET NULL"),
        _fk("evaluations", "dataset_version_id", "dataset_versions.id", "RESTRICT"),
        _fk("evaluations", "run_id", "runs.id", "SET NULL"),
        sa.CheckConstraint(STATUS_CHECK, name=op.f("ck_evaluations_status")),
    )
    for column in ("model_id", "dataset_version_id", "run_id", "status"):
        _index("evaluations", column)

    op.create_table(
        "evaluation_items",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("evaluation_id", sa.String(40), nullable=False),
        sa.Column("item_index", sa.Integer(), nullable=False),
        sa.Column("sample", sa.Integer(), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("gold", sa.Text(), nullable=True),
        sa.Column("response", sa.Text(), nullable=True),
        sa.Column("extracted", sa.Text(), nullable=True),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("correct", sa.Boolean(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=True),
        sa.Column("latency_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_evaluation_items"),
        _fk("evaluation_items", "evaluation_id", "evaluations.id", "CASCADE"),
        sa.UniqueConstraint("evaluation_id", "item_index", "sample",
                            name="uq_evaluation_items_evaluation_id_item_index_sample"),
    )


def downgrade() -> None:
    for table in ("evaluation_items", "evaluations", "models", "checkpoints", "run_steps", "runs",
                  "base_models", "projects", "bundle_versions", "bundles", "dataset_versions", "datasets"):
        op.drop_table(table)
