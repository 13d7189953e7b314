"""Outcomes in a table of their own: an intent's outcome is inserted into ``decision_outcomes``
instead of rewriting the decision row (on PostgreSQL every update left the old ~600-byte row
version behind until vacuum).

Revision ID: 0003_decision_outcomes
Revises: 0002_write_path
Create Date: 2026-11-24 08:30:00+00:00

The DDL is written out literally; this script never imports ``controller.db.models``. Rows written
before keep their outcome in ``decisions``; readers take the ``decision_outcomes`` row when there
is one.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_decision_outcomes"
down_revision: str | None = "0002_write_path"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "decision_outcomes",
        sa.Column("decision_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("outcome_detail", sa.Text(), nullable=True),
        sa.Column("noop_actions", sa.Integer(), server_default="0", nullable=False),
        sa.CheckConstraint("outcome IN ('pending', 'applied', 'partial', 'failed', 'skipped', 'dry-run')",
                           name="ck_decision_outcomes_outcome"),
        sa.ForeignKeyConstraint(["decision_id"], ["decisions.id"],
                                name="fk_decision_outcomes_decision_id_decisions", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("decision_id", name="pk_decision_outcomes"),
    )


def downgrade() -> None:
    # the outcomes go back onto their decisions before the table goes
    op.execute("UPDATE decisions SET outcome = (SELECT o.outcome FROM decision_outcomes o WHERE o.decision_id = decisions.id), "
               "outcome_detail = (SELECT o.outcome_detail FROM decision_outcomes o WHERE o.decision_id = decisions.id), "
               "noop_actions = noop_actions + (SELECT o.noop_actions FROM decision_outcomes o WHERE o.decision_id = decisions.id) "
               "WHERE id IN (SELECT decision_id FROM decision_outcomes)")
    op.drop_table("decision_outcomes")
