"""The decision log's tables as SQLAlchemy 2 declarative models.

The database is the daemon's memory and its audit trail: one row per decision (with the signals
that caused it, the full trace and what stabilization needs to be rebuilt after a restart), one row
per provider call, the operators' overrides (soft-deleted, so the audit keeps them), every API write
in ``audit_log``, and each distinct policy file version seen.

These models are used by the repository (``controller.db.repo``) and by Alembic's autogenerate
comparison only. The migrations in ``migrations/versions`` spell their DDL out literally and never
import this module: a migration must describe the schema as it was when it was written, not as the
models say today. ``tests/integration/test_migrations.py`` checks that the two agree.

Portability: the same schema runs on SQLite (the embedded default) and PostgreSQL (production).
JSON columns are ``JSON`` (``JSONB`` on PostgreSQL); timestamps are ``DateTime(timezone=True)``
behind :class:`UTCDateTime`, which refuses naive values and gives back aware UTC datetimes on both
backends (SQLite stores no zone and would otherwise return naive ones).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = [
    "Base",
    "INTEGER_MAX",
    "UTCDateTime",
    "JSONType",
    "OUTCOMES",
    "DecisionRow",
    "OutcomeRow",
    "ActionRow",
    "OverrideRow",
    "AuditRow",
    "PolicyVersionRow",
    "JournalReplayRow",
    "RollupRow",
]

# Deterministic constraint and index names, identical on every backend, so the literal DDL of the
# migrations can name them and later migrations can drop them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

INTEGER_MAX = 2**31 - 1
"""Largest value every ``sa.Integer`` column holds on every backend: PostgreSQL's ``integer`` is
32-bit signed (SQLite's holds 64 bits). Ids and counts that reach the database through the API are
bounded by it, so an oversized number is a 422, never a database error."""

OUTCOMES = ("pending", "applied", "partial", "failed", "skipped", "dry-run")
"""What happened to a decision: ``pending`` until its actions are recorded; ``applied`` (every
call succeeded or was a no-op), ``partial`` (some failed), ``failed`` (all failed), ``skipped``
(not actuated: frozen, paused, not observed yet, nothing to change), ``dry-run``."""

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
"""Generic JSON; ``jsonb`` on PostgreSQL (compact, comparable, indexable)."""


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that only stores aware datetimes and always reads aware UTC.

    PostgreSQL keeps the instant in ``timestamptz``; SQLite keeps the text without an offset, so
    values are normalized to UTC before binding and tagged UTC after reading.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value.isoformat()} refused: the decision log stores aware UTC times")
        value = value.astimezone(timezone.utc)
        # SQLite compares the stored text: drop the offset so every row has the same UTC format
        # and range filters compare correctly.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime()}


class DecisionRow(Base):
    """One decision for one model at one tick: inputs, trace, outputs and outcome."""

    __tablename__ = "decisions"
    __table_args__ = (
        sa.Index("ix_decisions_model_at", "model", "at"),
        # /v1/decisions?model= pages by id within one model: without it SQLite sorts the model's
        # whole history for every page
        sa.Index("ix_decisions_model_id", "model", "id"),
        # The outcome columns hold what the intent knew ("pending", or "skipped" for a decision
        # that acts on nothing) and, for rows written before migration 0003, the outcome too.
        # Since 0003 the outcome of an intent is a row of ``decision_outcomes``: an insert, not an
        # update of this ~600-byte row (PostgreSQL kept every updated row's old version until
        # vacuum: 5,594 dead of 7,000 updates over 8 ticks at 1,000 models, pg_stat_user_tables).
        sa.CheckConstraint(
            "outcome IN ('pending', 'applied', 'partial', 'failed', 'skipped', 'dry-run')",
            name="outcome",
        ),
    )

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(sa.String(253))
    at: Mapped[datetime]
    policy_version: Mapped[str] = mapped_column(sa.String(128), default="")
    dry_run: Mapped[bool] = mapped_column(sa.Boolean)
    actuate: Mapped[bool] = mapped_column(sa.Boolean)
    current_replicas: Mapped[int] = mapped_column(sa.Integer)
    replicas: Mapped[int] = mapped_column(sa.Integer)
    reason: Mapped[str] = mapped_column(sa.String(64))
    placement: Mapped[dict[str, Any]] = mapped_column(JSONType)
    previous_placement: Mapped[dict[str, Any]] = mapped_column(JSONType)
    signals: Mapped[dict[str, Any]] = mapped_column(JSONType)
    recommendations: Mapped[list[Any]] = mapped_column(JSONType)
    trace: Mapped[list[Any]] = mapped_column(JSONType)
    cost_per_hour_usd: Mapped[float] = mapped_column(sa.Float)
    interrupted_replaced: Mapped[int] = mapped_column(sa.Integer, default=0)
    # What the stabilizer needs after a restart: the point this tick added to the recommendation
    # window, the scale event it recorded (if any), and the rules' explicit state after the tick.
    stabilization_replicas: Mapped[int | None] = mapped_column(sa.Integer)
    scale_from_replicas: Mapped[int | None] = mapped_column(sa.Integer)
    scale_to_replicas: Mapped[int | None] = mapped_column(sa.Integer)
    rule_state: Mapped[dict[str, Any]] = mapped_column(JSONType)
    intent_outcome: Mapped[str] = mapped_column("outcome", sa.String(16), default="pending")
    intent_outcome_detail: Mapped[str | None] = mapped_column("outcome_detail", sa.Text)
    intent_noop_actions: Mapped[int] = mapped_column("noop_actions", sa.Integer, default=0, server_default="0")
    # Rows written since the write-path migration keep signals, recommendations, trace and rule
    # state in ``payload`` (``controller.db.payload``: compressed against the row ``payload_prev``
    # of the same model, keyframe ``payload_base``); their JSON columns above hold empty values.
    payload: Mapped[bytes | None] = mapped_column(sa.LargeBinary)
    payload_prev: Mapped[int | None] = mapped_column(sa.Integer)
    payload_base: Mapped[int | None] = mapped_column(sa.Integer)

    actions: Mapped[list[ActionRow]] = relationship(
        back_populates="decision", order_by="ActionRow.id", cascade="all, delete-orphan"
    )
    result: Mapped[OutcomeRow | None] = relationship(lazy="joined", uselist=False, passive_deletes=True)
    """What came of the intent (``decision_outcomes``), once written."""

    @hybrid_property
    def outcome(self) -> str:
        """The outcome: its ``decision_outcomes`` row's, else what the intent row holds."""
        return self.result.outcome if self.result is not None else self.intent_outcome

    @outcome.inplace.expression
    @classmethod
    def _outcome_expression(cls) -> sa.ColumnElement[str]:
        written = sa.select(OutcomeRow.outcome).where(OutcomeRow.decision_id == cls.id).scalar_subquery()
        return sa.func.coalesce(written, cls.intent_outcome)

    @property
    def outcome_detail(self) -> str | None:
        return self.result.outcome_detail if self.result is not None else self.intent_outcome_detail

    @property
    def noop_actions(self) -> int:
        """Provider calls that found nothing to change: counted, not stored as action rows."""
        return self.intent_noop_actions + (self.result.noop_actions if self.result is not None else 0)


class OutcomeRow(Base):
    """What came of one decision's intent (migration 0003): written once the provider calls are
    made, or when a pending intent is reconciled; written again if a retry adds calls (the last
    outcome wins, no-op calls add up)."""

    __tablename__ = "decision_outcomes"
    __table_args__ = (
        sa.CheckConstraint("outcome IN ('pending', 'applied', 'partial', 'failed', 'skipped', 'dry-run')", name="outcome"),
    )

    decision_id: Mapped[int] = mapped_column(sa.ForeignKey("decisions.id", ondelete="CASCADE"), primary_key=True,
                                             autoincrement=False)
    outcome: Mapped[str] = mapped_column(sa.String(16))
    outcome_detail: Mapped[str | None] = mapped_column(sa.Text)
    noop_actions: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")


class ActionRow(Base):
    """One provider call made (or, in dry-run, not made) for a decision, and how it went."""

    __tablename__ = "actions"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    decision_id: Mapped[int] = mapped_column(sa.ForeignKey("decisions.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime]
    provider: Mapped[str] = mapped_column(sa.String(64))
    call: Mapped[str] = mapped_column(sa.String(64))
    pool: Mapped[str] = mapped_column(sa.String(253))
    model: Mapped[str] = mapped_column(sa.String(253))
    arguments: Mapped[dict[str, Any]] = mapped_column(JSONType)
    status: Mapped[str] = mapped_column(sa.String(32))
    error: Mapped[str | None] = mapped_column(sa.Text)
    latency_ms: Mapped[float] = mapped_column(sa.Float)

    decision: Mapped[DecisionRow] = relationship(back_populates="actions")


class OverrideRow(Base):
    """An operator's override. Never deleted: ``deleted_at`` / ``deleted_by`` mark a withdrawal."""

    __tablename__ = "overrides"
    __table_args__ = (sa.Index("ix_overrides_model_expires_at", "model", "expires_at"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(sa.String(32))
    model: Mapped[str] = mapped_column(sa.String(253))
    pool: Mapped[str | None] = mapped_column(sa.String(253))
    replicas: Mapped[int | None] = mapped_column(sa.Integer)
    min_replicas: Mapped[int | None] = mapped_column(sa.Integer)
    max_replicas: Mapped[int | None] = mapped_column(sa.Integer)
    expires_at: Mapped[datetime | None]
    reason: Mapped[str] = mapped_column(sa.Text, default="")
    author: Mapped[str] = mapped_column(sa.String(253), default="")
    created_at: Mapped[datetime]
    deleted_at: Mapped[datetime | None]
    deleted_by: Mapped[str | None] = mapped_column(sa.String(253))


class AuditRow(Base):
    """One write through the admin API (who, when, what, on which target)."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    author: Mapped[str] = mapped_column(sa.String(253))
    action: Mapped[str] = mapped_column(sa.String(64))
    target: Mapped[str] = mapped_column(sa.String(512))
    detail: Mapped[dict[str, Any]] = mapped_column(JSONType)


class PolicyVersionRow(Base):
    """A distinct version (content hash) of a model's merged policy, first time it was seen."""

    __tablename__ = "policy_versions"
    __table_args__ = (sa.UniqueConstraint("model", "version"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(sa.String(253))
    version: Mapped[str] = mapped_column(sa.String(128))
    sources: Mapped[Any] = mapped_column(JSONType)
    """Where the version came from (file paths and their hashes), as the policy loader reports."""
    content: Mapped[str] = mapped_column(sa.Text)
    first_seen_at: Mapped[datetime]


class JournalReplayRow(Base):
    """A local journal (intents written while the database was away) being or been replayed:
    committed in the same transaction as each slice of its rows, so a journal is replayed exactly
    once even when the daemon dies between a commit and the next slice, or the journal's removal."""

    __tablename__ = "journal_replays"

    journal_id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    replayed_at: Mapped[datetime]
    """When the last slice was written."""
    entries: Mapped[int] = mapped_column(sa.Integer)
    """Entries (intents and outcomes) written so far."""
    next_offset: Mapped[int] = mapped_column(sa.BigInteger, server_default="0")
    """Byte offset in the journal of the first line not written yet."""
    complete: Mapped[bool] = mapped_column(sa.Boolean, server_default=sa.true())
    """Every line was written (the journal may then be removed)."""


class RollupRow(Base):
    """One model's decisions of one hour, compacted by the retention job once the full rows are
    older than the retention period: replicas per pool, cost, signal summaries, counts by reason
    and by outcome."""

    __tablename__ = "decision_rollups"
    __table_args__ = (sa.UniqueConstraint("model", "hour"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(sa.String(253))
    hour: Mapped[datetime]
    """Start of the hour (UTC)."""
    decisions: Mapped[int] = mapped_column(sa.Integer)
    first_id: Mapped[int] = mapped_column(sa.Integer)
    last_id: Mapped[int] = mapped_column(sa.Integer)
    replicas_min: Mapped[int] = mapped_column(sa.Integer)
    replicas_max: Mapped[int] = mapped_column(sa.Integer)
    replicas_last: Mapped[int] = mapped_column(sa.Integer)
    placement: Mapped[dict[str, Any]] = mapped_column(JSONType)
    """Per pool: ``{"min": .., "max": .., "sum": .., "last": ..}`` replicas (mean: sum over decisions)."""
    cost_per_hour_sum_usd: Mapped[float] = mapped_column(sa.Float)
    """Sum of the decisions' cost per hour (the mean is this over ``decisions``)."""
    cost_per_hour_max_usd: Mapped[float] = mapped_column(sa.Float)
    signals: Mapped[dict[str, Any]] = mapped_column(JSONType)
    """Per signal: ``{"min": .., "max": .., "sum": .., "n": ..}`` over the measured samples."""
    reasons: Mapped[dict[str, Any]] = mapped_column(JSONType)
    outcomes: Mapped[dict[str, Any]] = mapped_column(JSONType)
    scale_events: Mapped[int] = mapped_column(sa.Integer)
