"""Evaluation items carry the LLM judge's verdict (scores per metric, its reasoning, or why none was had).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("evaluation_items") as table:
        table.add_column(sa.Column("judge", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("evaluation_items") as table:
        table.drop_column("judge")
