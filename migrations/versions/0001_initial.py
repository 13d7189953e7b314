"""Initial decision log: decisions, actions, overrides, audit_log, policy_versions.

Revision ID: 0001
Revises:
Create Date: 2024-06-01 00:00:00+00:00

The DDL is written out literally; this script never imports ``controller.db.models``.
"""

from __future__ import annotations

from typing import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[object]:
    # Generic JSON, stored as jsonb on PostgreSQL.
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _ts() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=253), nullable=False),
        sa.Column("at", _ts(), nullable=False),
        sa.Column("policy_version", sa.String(length=128), nullable=False),
        sa.Column("dry_run", sa.Boolean(), nullable=False),
        sa.Column("actuate", sa.Boolean(), nullable=False),
        sa.Column("current_replicas", sa.Integer(), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("placement", _json(), nullable=False),
        sa.Column("previous_placement", _json(), nullable=False),
        sa.Column("signals", _json(), nullable=False),
        sa.Column("recommendations", _json(), nullable=False),
        sa.Column("trace", _json(), nullable=False),
        sa.Column("cost_per_hour_usd", sa.Float(), nullable=False),
        sa.Column("interrupted_replaced", sa.Integer(), nullable=False),
        sa.Column("stabilization_replicas", sa.Integer(), nullable=True),
        sa.Column("scale_from_replicas", sa.Integer(), nullable=True),
        sa.Column("scale_to_replicas", sa.Integer(), nullable=True),
        sa.Column("rule_state", _json(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("outcome_detail", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "outcome IN ('pending', 'applied', 'partial', 'failed', 'skipped', 'dry-run')",
            name="ck_decisions_outcome",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_decisions"),
    )
    op.create_index("ix_decisions_model_at", "decisions", ["model", "at"], unique=False)

    op.create_table(
        "actions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=False),
        sa.Column("at", _ts(), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("call", sa.String(length=64), nullable=False),
        sa.Column("pool", sa.String(length=253), nullable=False),
        sa.Column("model", sa.String(length=253), nullable=False),
        sa.Column("arguments", _json(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"], ["decisions.id"], name="fk_actions_decision_id_decisions", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_actions"),
    )
    op.create_index("ix_actions_decision_id", "actions", ["decision_id"], unique=False)

    op.create_table(
        "overrides",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=253), nullable=False),
        sa.Column("pool", sa.String(length=253), nullable=True),
        sa.Column("replicas", sa.Integer(), nullable=True),
        sa.Column("min_replicas", sa.Integer(), nullable=True),
        sa.Column("max_replicas", sa.Integer(), nullable=True),
        sa.Column("expires_at", _ts(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("author", sa.String(length=253), nullable=False),
        sa.Column("created_at", _ts(), nullable=False),
        sa.Column("deleted_at", _ts(), nullable=True),
        sa.Column("deleted_by", sa.String(length=253), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_overrides"),
    )
    op.create_index("ix_overrides_model_expires_at", "overrides", ["model", "expires_at"], unique=False)

    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", _ts(), nullable=False),
        sa.Column("author", sa.String(length=253), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=512), nullable=False),
        sa.Column("detail", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"], unique=False)

    op.create_table(
        "policy_versions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("model", sa.String(length=253), nullable=False),
        sa.Column("version", sa.String(length=128), nullable=False),
        sa.Column("sources", _json(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("first_seen_at", _ts(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_policy_versions"),
        sa.UniqueConstraint("model", "version", name="uq_policy_versions_model_version"),
    )


def downgrade() -> None:
    op.drop_table("policy_versions")
    op.drop_index("ix_audit_log_at", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_index("ix_overrides_model_expires_at", table_name="overrides")
    op.drop_table("overrides")
    op.drop_index("ix_actions_decision_id", table_name="actions")
    op.drop_table("actions")
    op.drop_index("ix_decisions_model_at", table_name="decisions")
    op.drop_table("decisions")
