"""Runs and evaluations record the host their worker runs on, so only that machine judges whether the worker is still alive.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


TABLES = ("runs", "evaluations")


def upgrade() -> None:
    for name in TABLES:
        with op.batch_alter_table(name) as table:
            table.add_column(sa.Column("worker_host", sa.String(length=255), nullable=True))


def downgrade() -> None:
    for name in TABLES:
        with op.batch_alter_table(name) as table:
            table.drop_column("worker_host")
