"""Write path and retention: the ``(model, id)`` index, room for in-place outcome updates on
PostgreSQL, the no-op count and the compressed payload on decisions, replayed journals and hourly rollups.

Revision ID: 0002_write_path
Revises: 0001
Create Date: 2026-11-24 00:00:00+00:00

The DDL is written out literally; this script never imports ``controller.db.models``.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002_write_path"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _ts() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_index("ix_decisions_model_id", "decisions", ["model", "id"], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        # room in each page for some of the outcomes' updates right after the intents (a HOT
        # update: no new index entries). About a fifth fitted (1,560 of 7,000 updates over 8 ticks
        # at 1,000 models, pg_stat_user_tables); migration 0003 gives outcomes a table of their own
        op.execute("ALTER TABLE decisions SET (fillfactor = 85)")
    op.add_column("decisions", sa.Column("noop_actions", sa.Integer(), server_default="0", nullable=False))
    op.add_column("decisions", sa.Column("payload", sa.LargeBinary(), nullable=True))
    op.add_column("decisions", sa.Column("payload_prev", sa.Integer(), nullable=True))
    op.add_column("decisions", sa.Column("payload_base", sa.Integer(), nullable=True))
    op.create_table(
        "journal_replays",
        sa.Column("journal_id", sa.String(length=64), nullable=False),
        sa.Column("replayed_at", _ts(), nullable=False),
        sa.Column("entries", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("journal_id", name="pk_journal_replays"),
    )
    op.create_table(
        "decision_rollups",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=253), nullable=False),
        sa.Column("hour", _ts(), nullable=False),
        sa.Column("decisions", sa.Integer(), nullable=False),
        sa.Column("first_id", sa.Integer(), nullable=False),
        sa.Column("last_id", sa.Integer(), nullable=False),
        sa.Column("replicas_min", sa.Integer(), nullable=False),
        sa.Column("replicas_max", sa.Integer(), nullable=False),
        sa.Column("replicas_last", sa.Integer(), nullable=False),
        sa.Column("placement", _json(), nullable=False),
        sa.Column("cost_per_hour_sum_usd", sa.Float(), nullable=False),
        sa.Column("cost_per_hour_max_usd", sa.Float(), nullable=False),
        sa.Column("signals", _json(), nullable=False),
        sa.Column("reasons", _json(), nullable=False),
        sa.Column("outcomes", _json(), nullable=False),
        sa.Column("scale_events", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_decision_rollups"),
        sa.UniqueConstraint("model", "hour", name="uq_decision_rollups_model_hour"),
    )


def downgrade() -> None:
    op.drop_table("decision_rollups")
    op.drop_table("journal_replays")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE decisions RESET (fillfactor)")
    op.drop_index("ix_decisions_model_id", table_name="decisions")
    with op.batch_alter_table("decisions") as batch:
        for column in ("payload_base", "payload_prev", "payload", "noop_actions"):
            batch.drop_column(column)
