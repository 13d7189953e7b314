"""A journal's replay in slices: ``journal_replays`` records how far a replay has come.

Revision ID: 0004_journal_replay_progress
Revises: 0003_decision_outcomes
Create Date: 2026-11-24 15:00:00+00:00

A running daemon replays a long journal a slice a tick (``Repository.replay_journal``), each slice
committed with the byte offset of the first line it has not written (``next_offset``) and
``complete`` false until the last; rows from before (whole replays) are complete. The DDL is
written out literally; this script never imports ``controller.db.models``.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_journal_replay_progress"
down_revision: str | None = "0003_decision_outcomes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("journal_replays", sa.Column("next_offset", sa.BigInteger(), server_default="0", nullable=False))
    op.add_column("journal_replays", sa.Column("complete", sa.Boolean(), server_default=sa.true(), nullable=False))


def downgrade() -> None:
    # The previous revision reads any row as a whole replay: with one in progress it would remove
    # the journal's unwritten rest. Refuse, and say what to do.
    unfinished = op.get_bind().execute(sa.text("SELECT journal_id FROM journal_replays WHERE NOT complete")).fetchall()
    if unfinished:
        raise RuntimeError(f"journal replay in progress ({', '.join(r[0] for r in unfinished)}): run the daemon "
                           "until its journal is replayed (the log says 'journal replayed'), then downgrade")
    with op.batch_alter_table("journal_replays") as batch:
        batch.drop_column("complete")
        batch.drop_column("next_offset")
