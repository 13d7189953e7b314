"""The decision log's repository: the only code that reads and writes the database.

The daemon's tick thread records decisions and their actions and, on start, rebuilds the
stabilizer's history from the log; the admin API's threads list decisions, manage overrides and
write the audit log. Both share one :class:`Repository`: every method opens its own short
transaction (SQLAlchemy 2 ``Session``), so no session, connection or ORM object is ever shared
between threads; methods return plain dicts or the core's frozen values, never ORM rows.

Time is data here too: every method that needs "now" takes it as an argument (the daemon's clock,
the API's clock, a test's fixed instant). The repository never reads the clock itself, so expired
overrides stop applying by comparison (``expires_at > now``), with no cleanup job.

Restart safety: each decision row also stores what that tick added to the pipeline's memory (the
point it added to the stabilization window, the scale event it recorded, the rules' state after the
tick). :meth:`Repository.rebuild_history` folds the rows within a horizon back into a
:class:`~controller.core.model.History`, so a restarted daemon decides as if it had never stopped.
"""

from __future__ import annotations

import threading
import time
import zlib
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta, timezone
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, selectinload, sessionmaker
from sqlalchemy.pool import StaticPool

from controller.core.model import (
    Action,
    ActionStatus,
    Decision,
    History,
    ModelSignals,
    Override,
    OverrideKind,
    ScaleEvent,
)
from controller.controller import SHADOW_DETAIL
from controller.db import codec, payload, rollup
from controller.db.journal import JournalLine
from controller.db.models import (
    OUTCOMES,
    ActionRow,
    AuditRow,
    DecisionRow,
    JournalReplayRow,
    OutcomeRow,
    OverrideRow,
    PolicyVersionRow,
    RollupRow,
)

__all__ = ["Repository", "make_engine"]

_SQLITE_BUSY_TIMEOUT_MS = 10_000
"""How long a SQLite writer waits for another connection's write lock before failing (ms): far
longer than any of our transactions, short enough to surface a stuck writer."""

_PG_RETENTION_LOCK = zlib.crc32(b"tidegate-retention")
"""Key of the transaction advisory lock a compaction batch holds on PostgreSQL (one at a time)."""

_BATCH = 500
"""Rows fetched per round trip by :meth:`Repository.all_decisions` (bounded memory on big logs)."""


def _is_sqlite_memory(url: sa.engine.URL) -> bool:
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


def _dump_json(value: Any) -> str:
    """The JSON columns' serializer: compact separators, and the empty values most rows carry
    (the columns of rows before the payload format) without a call to the encoder."""
    if not value and isinstance(value, (dict, list)):
        return "{}" if isinstance(value, dict) else "[]"
    return codec.dump_json(value).decode()


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine configured for the decision log.

    SQLite: usable from several threads (``check_same_thread=False``); a file database runs in
    WAL mode so the API's readers never block the tick's writer, with foreign keys enforced and a
    busy timeout; an in-memory database keeps one shared connection (``StaticPool``) because each
    new connection would otherwise see a different, empty database. PostgreSQL: connections are
    checked before use, so a database restart costs one failed tick at most, not a broken pool.
    """
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(parsed, echo=echo, pool_pre_ping=True, json_serializer=_dump_json)
    memory = _is_sqlite_memory(parsed)
    engine = sa.create_engine(
        parsed,
        echo=echo,
        connect_args={"check_same_thread": False},
        json_serializer=_dump_json,
        **({"poolclass": StaticPool} if memory else {}),
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            if not memory:
                cur.execute("PRAGMA journal_mode=WAL")
                # Safe with WAL (no corruption on power loss; at worst the last commits are lost).
                cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_MS}")
        finally:
            cur.close()

    return engine


def _iso(value: datetime | None) -> str | None:
    return None if value is None else codec.encode_datetime(value)


def _tick_delta(decision: Decision) -> tuple[int | None, ScaleEvent | None]:
    """What this tick added to the pipeline's history: the recommendation point and the scale
    event stamped with the decision's own time (the pipeline stamps what it adds with ``now``)."""
    point = None
    for at, replicas in decision.history.recommendations:
        if at == decision.at:
            point = replicas
    scale = None
    for ev in decision.history.scale_events:
        if ev.at == decision.at:
            scale = ev
    return point, scale


@dataclass(frozen=True)
class _Chain:
    """The newest row written of one model: the dictionary of its next row's payload."""

    last_id: int
    raw: bytes
    base_id: int
    length: int


_REPLAY_BATCH = 1000
"""Journal entries a replay decodes and writes at a time (a tick of 1,000 models): what it holds in
memory besides the handles, however long the outage the journal covers."""

@dataclass(frozen=True)
class ReplayProgress:
    """What one :meth:`Repository.replay_journal` call did: decisions written, and whether the
    journal is now written whole (it may be removed)."""

    written: int
    complete: bool


_NEWEST_PER_QUERY = 500
"""Models whose newest decision one query looks up (SQLite allows 2,000 result columns)."""


class Repository:
    """Reads and writes the decision log. Thread-safe; one instance per process is enough.

    ``engine_or_url``: an engine (the caller keeps ownership) or a URL (the repository makes the
    engine with :func:`make_engine` and disposes of it in :meth:`close`). The schema must exist
    (``controller.db.migrate.upgrade``); the repository never creates tables.
    """

    def __init__(self, engine_or_url: Engine | str, *, echo: bool = False) -> None:
        if isinstance(engine_or_url, Engine):
            self._engine = engine_or_url
            self._owns_engine = False
        else:
            self._engine = make_engine(engine_or_url, echo=echo)
            self._owns_engine = True
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        self._chains: dict[str, _Chain] = {}
        """Per model, the last row this repository wrote (payload chains; see ``controller.db.payload``)."""
        self._lock: AbstractContextManager[Any] = nullcontext()
        self._read_lock: AbstractContextManager[Any] = nullcontext()
        if self._engine.dialect.name == "sqlite":
            # SQLite has one writer at a time: serializing our own writers in-process turns lock
            # contention into a short wait instead of "database is locked" errors. An in-memory
            # database shares one connection, so its readers must take the lock too.
            lock = threading.RLock()
            self._lock = lock
            if _is_sqlite_memory(self._engine.url):
                self._read_lock = lock

    @property
    def engine(self) -> Engine:
        return self._engine

    def ping(self) -> None:
        """One round trip (``SELECT 1``); raises when the database cannot be reached."""
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    def close(self) -> None:
        """Release the connections (only of an engine the repository made)."""
        if self._owns_engine:
            self._engine.dispose()

    def __enter__(self) -> "Repository":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- decisions -----------------------------------------------------------------------------

    @staticmethod
    def _decision_values(decision: Decision, signals: ModelSignals, dry_run: bool,
                         skipped: str | None = None) -> dict[str, Any]:
        if signals.model != decision.model:
            raise ValueError(f"signals are for model {signals.model!r}, decision for {decision.model!r}")
        point, scale = _tick_delta(decision)
        rule_state = codec.to_jsonable(decision.history.rule_state)
        settled = skipped if skipped is not None else None if decision.actuate else decision.reason
        return dict(
            model=decision.model,
            at=decision.at,
            policy_version=decision.policy_version,
            dry_run=dry_run,
            actuate=decision.actuate,
            current_replicas=decision.current_replicas,
            replicas=decision.replicas,
            reason=decision.reason,
            placement={k: int(v) for k, v in decision.placement.items()},
            previous_placement={},
            # the JSON columns of rows before the payload format; new rows keep all of it in payload
            signals={},
            recommendations=[],
            trace=[],
            _doc={
                "previous_placement": {k: int(v) for k, v in decision.previous_placement.items()},
                "signals": codec.signals_to_json(signals),
                "recommendations": payload.split_state(
                    [codec.recommendation_to_json(r) for r in decision.recommendations], rule_state),
                "trace": [codec.stage_to_json(s) for s in decision.trace],
                "rule_state": rule_state,
            },
            cost_per_hour_usd=decision.cost_per_hour_usd,
            interrupted_replaced=decision.interrupted_replaced,
            stabilization_replicas=point,
            scale_from_replicas=None if scale is None else scale.from_replicas,
            scale_to_replicas=None if scale is None else scale.to_replicas,
            rule_state={},
            # a decision that acts on nothing has its outcome now: one write, no update (on
            # PostgreSQL an update leaves a dead row version behind until vacuum)
            outcome="skipped" if settled is not None else "pending",
            outcome_detail=settled,
            noop_actions=0,
        )

    def record_decision(self, decision: Decision, signals: ModelSignals, dry_run: bool) -> int:
        """Store one decision with the signals it was made from; returns its id. Its outcome is
        ``pending`` until :meth:`record_actions` says what happened (``skipped`` at once for a
        decision that does not actuate)."""
        return self.record_decisions([(decision, signals, dry_run)])[0]

    def record_decisions(self, items: Sequence[tuple[Decision, ModelSignals, bool]],
                         skipped: Sequence[str | None] = ()) -> list[int]:
        """Store a tick's decisions (each with its signals and dry-run flag), outcome ``pending``,
        in one transaction (one bulk insert); returns their ids in the order given. A decision
        that acts on nothing is stored ``skipped`` at once: one that does not actuate with its
        reason as the detail, and one given a detail in ``skipped`` (per item; a shadow
        decision, never acted on) with that detail."""
        rows = [self._decision_values(d, sig, dry_run, detail)
                for (d, sig, dry_run), detail in zip(items, skipped or [None] * len(items), strict=True)]
        if not rows:
            return []
        with self._lock, self._sessions.begin() as s:
            ids, chains = self._insert_decisions(s, rows)
        self._chains.update(chains)  # committed: later rows may use these as dictionaries
        return ids

    def _insert_decisions(self, s: Session, rows: list[dict[str, Any]]) -> tuple[list[int], dict[str, _Chain]]:
        """Insert rows (bulk, in order) with their payloads compressed against their model's
        previous row; returns the ids and the chains as they stand after them (for the caller to
        keep once the transaction is committed)."""
        conn = s.connection()
        insert = self._row_inserter(conn, len(rows))
        chains: dict[str, _Chain] = {}
        ids: list[int] = []
        waves: list[list[dict[str, Any]]] = []  # rows of distinct models, so each knows its previous id
        in_wave: set[str] = set()  # the models of the last wave
        for row in rows:
            if not waves or row["model"] in in_wave:
                waves.append([])
                in_wave = set()
            waves[-1].append(row)
            in_wave.add(row["model"])
        for wave in waves:
            raws = []
            for row in wave:
                chain = chains.get(row["model"]) or self._chains.get(row["model"])
                keep = chain is not None and chain.length < payload.KEYFRAME_EVERY
                row["payload"], raw = payload.encode(row.pop("_doc"), chain.raw if keep and chain else None)
                row["payload_prev"] = chain.last_id if keep and chain else None
                row["payload_base"] = chain.base_id if keep and chain else None
                raws.append((raw, chain if keep else None))
            new_ids = insert(wave)
            for row, new_id, (raw, chain) in zip(wave, new_ids, raws):
                chains[row["model"]] = _Chain(new_id, raw, new_id if chain is None else chain.base_id,
                                              1 if chain is None else chain.length + 1)
            ids.extend(new_ids)
        return ids, chains

    @staticmethod
    def _row_inserter(conn: sa.Connection, n: int) -> Callable[[list[dict[str, Any]]], list[int]]:
        """A function inserting decision rows (Core: no ORM objects are made from them) and
        returning their ids in order, for up to ``n`` rows in all.

        PostgreSQL: the ``n`` ids are taken from the table's sequence in one query and the rows
        go in with them by ``COPY ... FROM STDIN``, in the tick's transaction, each value bound by
        its column's own type as an ``INSERT`` would bind it. Against one ``executemany`` of
        ``INSERT``s (psycopg's pipeline) this took the intents' transaction at 1,000 models from
        0.22-0.24 to 0.19-0.20 s wall and 0.12 to 0.10 CPU s (``bench/record_tick.py --database
        postgresql``, two runs each). An ``INSERT ... VALUES (...), (...) RETURNING`` of 1,000 rows
        is one 25,000-parameter statement that psycopg parses again at every tick.
        SQLite: one ``INSERT ... RETURNING`` of the rows, in order."""
        table = cast(sa.Table, DecisionRow.__table__)
        if conn.dialect.name != "postgresql":
            stmt = sa.insert(table).returning(table.c.id, sort_by_parameter_order=True)
            return lambda rows: list(conn.execute(stmt, rows).scalars())
        reserved = iter(sorted(conn.execute(
            sa.text("SELECT nextval(pg_get_serial_sequence('decisions', 'id')) FROM generate_series(1, :n)"),
            {"n": n}).scalars()))
        dialect = conn.dialect
        columns = [(c.name, c.type.dialect_impl(dialect).bind_processor(dialect)) for c in table.columns]
        copy = f"COPY {table.name} ({', '.join(name for name, _ in columns)}) FROM STDIN"

        def insert(rows: list[dict[str, Any]]) -> list[int]:
            ids = [next(reserved) for _ in rows]
            for row, i in zip(rows, ids):
                row["id"] = i
            raw = conn.connection.driver_connection  # psycopg's, in the transaction SQLAlchemy began
            assert raw is not None, "a live connection has its driver's connection"
            with raw.cursor() as cur, cur.copy(copy) as out:
                for row in rows:
                    out.write_row([row[name] if proc is None else proc(row[name]) for name, proc in columns])
            return ids
        return insert

    def _docs(self, s: Session, rows: Sequence[Any]) -> dict[int, dict[str, Any]]:
        """Signals, recommendations, trace and rule state of each row (``id``, ``model``,
        ``payload``...): from the payload, whose chain is read in one query, or from the JSON
        columns of a row written before the payload format."""
        out: dict[int, dict[str, Any]] = {}
        packed = [r for r in rows if r.payload is not None]
        if packed:
            q = (sa.select(DecisionRow.id, DecisionRow.payload, DecisionRow.payload_prev)
                 .where(DecisionRow.model.in_({r.model for r in packed}),
                        DecisionRow.id >= min(r.payload_base or r.id for r in packed),
                        DecisionRow.id <= max(r.id for r in packed), DecisionRow.payload.is_not(None)))
            chain = {i: (p, prev) for i, p, prev in s.execute(q) if p is not None}
            cache: dict[int, bytes] = {}
            for r in packed:
                doc = payload.decode(r.id, chain, cache)
                doc.setdefault("previous_placement", r.previous_placement)
                doc["recommendations"] = payload.join_state(doc["recommendations"], doc["rule_state"])
                out[r.id] = doc
        for r in rows:
            if r.payload is None:
                out[r.id] = {"signals": r.signals, "recommendations": r.recommendations, "trace": r.trace,
                             "rule_state": r.rule_state, "previous_placement": r.previous_placement}
        return out

    def record_actions(
        self,
        decision_id: int,
        actions: Sequence[Action],
        outcome: str,
        outcome_detail: str | None = None,
        *,
        at: datetime | None = None,
    ) -> None:
        """Store the provider calls made for a decision and set its outcome (one of
        ``models.OUTCOMES``). ``at``: when the calls were made; defaults to the decision's time.
        May be called more than once (a retry adds its calls; the last outcome wins)."""
        self.record_outcomes([(decision_id, actions, outcome, outcome_detail, None)], at=at)

    def record_outcomes(
        self,
        items: Sequence[tuple[int, Sequence[Action], str, str | None, int | None]],
        *,
        at: datetime | None = None,
    ) -> None:
        """Store the outcomes of many decisions in one transaction: for each ``(decision_id,
        actions, outcome, detail, applied_replicas)`` the calls (one bulk insert for all; calls
        that changed nothing, ``noop``, are counted on the decision instead of stored) and the
        outcome. ``applied_replicas`` (reconciliation): the total found applied, which becomes the
        decision's scale step (dropped when nothing moved). ``at``: when the calls were made;
        defaults to each decision's time."""
        for _, _, outcome, _, _ in items:
            if outcome not in OUTCOMES:
                raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
        if not items:
            return
        with self._lock, self._sessions.begin() as s:
            self._write_outcomes(s, items, at)

    @staticmethod
    def _write_outcomes(s: Session, items: Sequence[tuple[int, Sequence[Action], str, str | None, int | None]],
                        at: datetime | None) -> None:
        ids = [i[0] for i in items]
        known = {r.id: r for r in s.execute(
            sa.select(DecisionRow.id, DecisionRow.at, DecisionRow.scale_from_replicas).where(DecisionRow.id.in_(ids)))}
        missing = sorted(set(ids) - set(known))
        if missing:
            raise LookupError(f"no decision with id {', '.join(map(str, missing))}")
        action_rows: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        steps: list[dict[str, Any]] = []
        for decision_id, actions, outcome, detail, applied in items:
            row = known[decision_id]
            noops = 0
            for a in actions:
                if a.status is ActionStatus.NOOP:
                    noops += 1
                    continue
                action_rows.append(dict(
                    decision_id=decision_id, at=row.at if at is None else at, provider=a.provider,
                    call=a.call, pool=a.pool, model=a.model, arguments=codec.to_jsonable(a.arguments),
                    status=a.status.value, error=a.error, latency_ms=a.latency_ms))
            results.append({"decision_id": decision_id, "outcome": outcome, "outcome_detail": detail,
                            "noop_actions": noops})
            if applied is not None and row.scale_from_replicas is not None:
                moved = applied != row.scale_from_replicas
                steps.append({"id": decision_id, "scale_to_replicas": applied if moved else None,
                              "scale_from_replicas": row.scale_from_replicas if moved else None})
        if action_rows:
            s.execute(sa.insert(ActionRow), action_rows)
        # the outcomes: inserted (the decision row is not rewritten), or, for a decision given one
        # before (a retry's calls), replaced with the no-op calls added up
        table = cast(sa.Table, OutcomeRow.__table__)
        upsert = (postgresql.insert if s.get_bind().dialect.name == "postgresql" else sqlite.insert)(table)
        s.execute(upsert.on_conflict_do_update(index_elements=[table.c.decision_id], set_={
            "outcome": upsert.excluded.outcome, "outcome_detail": upsert.excluded.outcome_detail,
            "noop_actions": table.c.noop_actions + upsert.excluded.noop_actions}), results)
        if steps:  # reconciliation's scale steps (rare: after a restart or a refused outcome)
            s.execute(sa.update(DecisionRow), steps)

    def replay_journal(self, journal_id: str, read_from: Callable[[int], Iterable[JournalLine]], now: datetime,
                       budget_s: float | None = None) -> ReplayProgress:
        """Write a local journal's lines (``controller.db.journal``) in order, from where an
        earlier call stopped, in one transaction that also records how far it came
        (``journal_replays``): exactly once, whatever crashes in between. ``read_from(offset)``
        reads the lines from a byte offset, decoding each as it is read (nothing is decoded while
        the database is away). With ``budget_s`` the call stops before the first tick's line it
        reaches after that many seconds, having written at least two ticks' lines (more than the
        tick that replays it appends behind, so the journal drains however slow a slice): a
        running daemon replays a long journal a slice a tick (``Recorder.replay``) instead of
        stopping its ticks for the whole of it; without, it writes every line. Entries go in
        ``_REPLAY_BATCH`` at a time."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        handles: dict[int, int] = {}
        chains: dict[str, _Chain] = {}
        written = count = 0
        buffer: list[Mapping[str, Any]] = []

        def flush(s: Session) -> None:
            nonlocal written
            if not buffer:
                return
            if buffer[0]["kind"] == "intent":
                new_ids = self._replay_intents(s, buffer, chains)
                handles.update(zip((int(e["handle"]) for e in buffer), new_ids))
                written += len(buffer)
            else:
                self._write_outcomes(s, [
                    (handles[key] if (key := int(e["decision_id"])) < 0 else key,
                     [codec.action_from_json(a) for a in e["actions"]], e["outcome"], e.get("detail"),
                     e.get("applied_replicas")) for e in buffer], None)
            buffer.clear()

        with self._lock, self._sessions.begin() as s:
            row = s.get(JournalReplayRow, journal_id)
            if row is not None and row.complete:
                return ReplayProgress(0, True)
            start = 0 if row is None else int(row.next_offset)
            end, complete = start, True
            ticks = 0
            for line in read_from(start):
                if line.tick:
                    # at least two ticks a slice: more than the tick that replays it adds behind
                    if deadline is not None and ticks >= 2 and time.monotonic() >= deadline:
                        complete = False  # the outcomes before this line name only intents before it
                        break
                    ticks += 1
                for e in line.entries:
                    if buffer and (buffer[0]["kind"] == "intent") != (e["kind"] == "intent"):
                        flush(s)
                    buffer.append(e)
                    count += 1
                    if len(buffer) >= _REPLAY_BATCH:
                        flush(s)
                end = line.end
            flush(s)
            if row is None:
                s.add(JournalReplayRow(journal_id=journal_id, replayed_at=now, entries=count, next_offset=end,
                                       complete=complete))
            else:
                row.replayed_at, row.entries, row.next_offset, row.complete = now, row.entries + count, end, complete
        self._chains.update(chains)
        return ReplayProgress(written, complete)

    def _replay_intents(self, s: Session, intents: Sequence[Mapping[str, Any]], chains: dict[str, _Chain]) -> list[int]:
        """Insert a batch of a journal's intents; ``chains``: the payload chains of the replay's
        transaction so far (updated; the repository keeps them once it is committed)."""
        rows = [self._decision_values(codec.decision_from_json(e["decision"]), codec.signals_from_json(e["signals"]),
                                      bool(e["dry_run"]), e.get("skipped")) for e in intents]
        saved = self._chains
        self._chains = {**saved, **chains}
        try:
            new_ids, more = self._insert_decisions(s, rows)
        finally:
            self._chains = saved
        chains.update(more)
        return new_ids

    def list_journal_replays(self) -> list[dict[str, Any]]:
        """Journals replayed (or being replayed) into this log, newest first: ``journal_id``,
        ``replayed_at`` (its last slice), ``entries`` (so far), ``complete``."""
        q = sa.select(JournalReplayRow).order_by(JournalReplayRow.replayed_at.desc())
        with self._read_lock, self._sessions() as s:
            return [{"journal_id": r.journal_id, "replayed_at": _iso(r.replayed_at), "entries": r.entries,
                     "complete": r.complete} for r in s.scalars(q)]

    def pending_decisions(self, models: Sequence[str] | None = None, *,
                          since: datetime | None = None) -> list[dict[str, Any]]:
        """Decisions still ``pending`` (an intent without an outcome) made at or after ``since``,
        oldest first: ``id``, ``model``, ``at``, ``placement``, ``previous_placement``,
        ``dry_run``. With ``models`` and ``since`` the search runs on the ``(model, at)`` index
        (no index on the outcome: it would stop PostgreSQL from updating outcomes in place)."""
        q = sa.select(DecisionRow).where(DecisionRow.outcome == "pending")
        if models is not None:
            q = q.where(DecisionRow.model.in_(list(models)))
        if since is not None:
            q = q.where(DecisionRow.at >= since)
        with self._read_lock, self._sessions() as s:
            rows = list(s.scalars(q.order_by(DecisionRow.id)))
            docs = self._docs(s, rows)
        return [self._intent(r, docs[r.id]) for r in rows]

    def abandoned_decisions(self, models: Sequence[str], *, before: datetime) -> list[dict[str, Any]]:
        """Each model's newest decision when it was made before ``before`` and is still
        ``pending`` (its daemon died between intent and outcome, and nothing acted on the model
        since), oldest first, as :meth:`pending_decisions` gives them. Each model's newest id is
        one lookup at the end of its range of the ``(model, id)`` index (a ``max(id)`` per model,
        up to 500 models a query), not a scan of its history."""
        names = list(dict.fromkeys(models))
        rows: list[DecisionRow] = []
        with self._read_lock, self._sessions() as s:
            # not kept in the engine's compiled cache: statements of 500 subqueries, run once a start,
            # held ~3.5 MB there (tracemalloc, 1,000 models, bench/control_plane.py)
            s.connection(execution_options={"compiled_cache": None})
            for i in range(0, len(names), _NEWEST_PER_QUERY):
                newest = [sa.select(sa.func.max(DecisionRow.id)).where(DecisionRow.model == m).scalar_subquery()
                          for m in names[i:i + _NEWEST_PER_QUERY]]
                ids = [n for n in s.execute(sa.select(*newest)).one() if n is not None]
                rows += s.scalars(sa.select(DecisionRow).where(
                    DecisionRow.id.in_(ids), DecisionRow.outcome == "pending", DecisionRow.at < before))
            rows.sort(key=lambda r: r.id)
            docs = self._docs(s, rows)
        return [self._intent(r, docs[r.id]) for r in rows]

    @staticmethod
    def _intent(row: DecisionRow, doc: Mapping[str, Any]) -> dict[str, Any]:
        """A pending decision as reconciliation reads it."""
        return {"id": row.id, "model": row.model, "at": row.at, "placement": row.placement,
                "previous_placement": doc.get("previous_placement", row.previous_placement), "dry_run": row.dry_run}

    @staticmethod
    def _summary(row: DecisionRow) -> dict[str, Any]:
        return {
            "id": row.id,
            "model": row.model,
            "at": _iso(row.at),
            "replicas": row.replicas,
            "current_replicas": row.current_replicas,
            "placement": dict(row.placement),
            "reason": row.reason,
            "actuate": row.actuate,
            "dry_run": row.dry_run,
            "outcome": row.outcome,
            "policy_version": row.policy_version,
            "cost_per_hour_usd": row.cost_per_hour_usd,
        }

    @classmethod
    def _full(cls, row: DecisionRow, doc: Mapping[str, Any]) -> dict[str, Any]:
        out = cls._summary(row)
        scale = None
        if row.scale_from_replicas is not None and row.scale_to_replicas is not None:
            scale = {"at": _iso(row.at), "from_replicas": row.scale_from_replicas, "to_replicas": row.scale_to_replicas}
        out.update(
            previous_placement=dict(doc["previous_placement"]),
            outcome_detail=row.outcome_detail,
            interrupted_replaced=row.interrupted_replaced,
            signals=doc["signals"],
            recommendations=doc["recommendations"],
            trace=doc["trace"],
            stabilization_replicas=row.stabilization_replicas,
            scale_event=scale,
            noop_actions=row.noop_actions,
            rule_state=doc["rule_state"],
            actions=[
                {
                    "id": a.id,
                    "at": _iso(a.at),
                    "provider": a.provider,
                    "call": a.call,
                    "pool": a.pool,
                    "model": a.model,
                    "arguments": a.arguments,
                    "status": a.status,
                    "error": a.error,
                    "latency_ms": a.latency_ms,
                }
                for a in row.actions
            ],
        )
        return out

    def list_decisions(
        self,
        model: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """Summaries, newest first. ``since`` is inclusive, ``until`` exclusive; pass the last id
        of a page as ``before_id`` to get the next (keyset pagination: stable while rows arrive)."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        q = sa.select(DecisionRow)
        if model is not None:
            q = q.where(DecisionRow.model == model)
        if since is not None:
            q = q.where(DecisionRow.at >= since)
        if until is not None:
            q = q.where(DecisionRow.at < until)
        if before_id is not None:
            q = q.where(DecisionRow.id < before_id)
        q = q.order_by(DecisionRow.id.desc()).limit(limit)
        with self._read_lock, self._sessions() as s:
            return [self._summary(r) for r in s.scalars(q)]

    def get_decision(self, decision_id: int) -> dict[str, Any] | None:
        """Everything about one decision: signals, recommendations, trace, history delta, actions."""
        q = sa.select(DecisionRow).where(DecisionRow.id == decision_id).options(selectinload(DecisionRow.actions))
        with self._read_lock, self._sessions() as s:
            row = s.scalars(q).one_or_none()
            return None if row is None else self._full(row, self._docs(s, [row])[row.id])

    def load_decision(self, decision_id: int) -> tuple[Decision, ModelSignals, list[Action]] | None:
        """One decision as core values (for replays and analyses). The decision's ``history`` holds
        only what that tick added to it (its recommendation point, its scale event) and the rule
        state after it; the full history at any instant comes from :meth:`rebuild_history`."""
        record = self.get_decision(decision_id)
        if record is None:
            return None
        at = codec.decode_datetime(record["at"])
        history = History(
            recommendations=()
            if record["stabilization_replicas"] is None
            else ((at, int(record["stabilization_replicas"])),),
            scale_events=()
            if record["scale_event"] is None
            else (codec.scale_event_from_json(record["scale_event"]),),
            rule_state=codec.from_jsonable(record["rule_state"]),
        )
        decision = Decision(
            model=record["model"],
            at=at,
            current_replicas=record["current_replicas"],
            replicas=record["replicas"],
            placement=record["placement"],
            previous_placement=record["previous_placement"],
            recommendations=tuple(codec.recommendation_from_json(r) for r in record["recommendations"]),
            trace=tuple(codec.stage_from_json(st) for st in record["trace"]),
            reason=record["reason"],
            actuate=record["actuate"],
            cost_per_hour_usd=record["cost_per_hour_usd"],
            policy_version=record["policy_version"],
            history=history,
            interrupted_replaced=record["interrupted_replaced"],
        )
        actions = [codec.action_from_json(a) for a in record["actions"]]
        return decision, codec.signals_from_json(record["signals"]), actions

    def all_decisions(self, model: str | None = None, limit: int | None = None) -> Iterator[dict[str, Any]]:
        """Every decision in full (as :meth:`get_decision`), oldest first, fetched in batches; no
        session stays open between batches, so abandoning the iterator leaks nothing. With
        ``limit``: only the newest ``limit`` decisions (still oldest first), and only those are read."""
        after_id = 0
        if limit is not None:
            if limit < 1:
                raise ValueError(f"limit must be at least 1, got {limit}")
            # the oldest id among the newest `limit`: the batches below start there
            first = sa.select(DecisionRow.id).order_by(DecisionRow.id.desc()).offset(limit - 1).limit(1)
            if model is not None:
                first = first.where(DecisionRow.model == model)
            with self._read_lock, self._sessions() as s:
                first_id = s.scalars(first).one_or_none()
            after_id = 0 if first_id is None else first_id - 1
        while True:
            q = (
                sa.select(DecisionRow)
                .where(DecisionRow.id > after_id)
                .options(selectinload(DecisionRow.actions))
                .order_by(DecisionRow.id)
                .limit(_BATCH)
            )
            if model is not None:
                q = q.where(DecisionRow.model == model)
            with self._read_lock, self._sessions() as s:
                rows = list(s.scalars(q))
                docs = self._docs(s, rows)
                batch = [self._full(r, docs[r.id]) for r in rows]
            yield from batch
            if len(batch) < _BATCH:
                return
            after_id = batch[-1]["id"]

    def decisions_between(self, model: str, since: datetime, until: datetime) -> Iterator[dict[str, Any]]:
        """What a replay reads of each decision of ``model`` in ``[since, until)``, oldest first,
        in batches: id, at, signals, placement, cost, reason, trace, outcome and its detail, and the
        rule state (the learned capacity in it; replays and the shadow report read these)."""
        after_id = 0
        while True:
            q = (sa.select(DecisionRow).where(DecisionRow.model == model, DecisionRow.at >= since,
                                              DecisionRow.at < until, DecisionRow.id > after_id)
                 .order_by(DecisionRow.id).limit(_BATCH))
            with self._read_lock, self._sessions() as s:
                rows = list(s.scalars(q))
                docs = self._docs(s, rows)  # signals and trace live in the payload since 0002
            batch = [{"id": r.id, "at": r.at, "signals": docs[r.id]["signals"], "placement": r.placement,
                      "cost_per_hour_usd": r.cost_per_hour_usd, "reason": r.reason, "trace": docs[r.id]["trace"],
                      "outcome": r.outcome, "outcome_detail": r.outcome_detail,
                      "rule_state": docs[r.id].get("rule_state") or {}} for r in rows]
            yield from batch
            if len(batch) < _BATCH:
                return
            after_id = batch[-1]["id"]

    def rebuild_history(self, model: str, now: datetime, horizon_s: float) -> History:
        """The pipeline's history as it stood after the last decision before ``now``: the
        recommendation points and scale events from decisions in ``[now - horizon_s, now]``,
        oldest first, and the rule state of the latest decision (however old: a rule's state
        carries its own timestamps and the rule judges their age)."""
        return self.rebuild_histories({model: horizon_s}, now)[model]

    def rebuild_histories(self, horizons: Mapping[str, float], now: datetime) -> dict[str, History]:
        """:meth:`rebuild_history` for many models at once (``horizons``: model -> seconds back),
        in two queries whatever the number of models: a daemon of a thousand models starts in one
        round trip, not a thousand."""
        for model, horizon_s in horizons.items():
            if horizon_s < 0:
                raise ValueError(f"horizon_s must be >= 0, got {horizon_s} for {model}")
        if not horizons:
            return {}
        models = list(horizons)
        start = now - timedelta(seconds=max(horizons.values()))
        window = (
            sa.select(DecisionRow.model, DecisionRow.at, DecisionRow.stabilization_replicas,
                      DecisionRow.scale_from_replicas, DecisionRow.scale_to_replicas)
            .where(DecisionRow.model.in_(models), DecisionRow.at >= start, DecisionRow.at <= now)
            .order_by(DecisionRow.at, DecisionRow.id)
        )
        latest = (
            sa.select(sa.func.max(DecisionRow.id))
            .where(DecisionRow.model.in_(models), DecisionRow.at <= now)
            .group_by(DecisionRow.model)
        )
        with self._read_lock, self._sessions() as s:
            rows = s.execute(window).all()
            last = list(s.scalars(sa.select(DecisionRow).where(DecisionRow.id.in_(latest))))
            docs = self._docs(s, last)
            state = {r.model: docs[r.id]["rule_state"] for r in last}
        points: dict[str, list[tuple[datetime, int]]] = {m: [] for m in models}
        events: dict[str, list[ScaleEvent]] = {m: [] for m in models}
        starts = {m: now - timedelta(seconds=h) for m, h in horizons.items()}
        for model, at, point, scale_from, scale_to in rows:
            if at < starts[model]:
                continue
            if point is not None:
                points[model].append((at, point))
            if scale_from is not None and scale_to is not None:
                events[model].append(ScaleEvent(at=at, from_replicas=scale_from, to_replicas=scale_to))
        return {
            m: History(recommendations=tuple(points[m]), scale_events=tuple(events[m]),
                       rule_state=codec.from_jsonable(state[m]) if state.get(m) else {})
            for m in models
        }

    # --- retention ------------------------------------------------------------------------------

    def compact_decisions(self, before: datetime, batch: int = 500) -> int:
        """One batch of the retention job: the oldest ``batch`` decisions older than ``before``
        are added to their model's hourly rollups and deleted with their actions, in one short
        transaction; returns how many (0: nothing older is left). A kept row whose payload was
        compressed against a deleted one is rewritten on its own first (``controller.db.payload``)."""
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        q = sa.select(DecisionRow).where(DecisionRow.at < before).order_by(DecisionRow.id).limit(batch)
        with self._lock, self._sessions.begin() as s:
            if self._engine.dialect.name == "postgresql" and not s.execute(
                    sa.text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _PG_RETENTION_LOCK}).scalar():
                return 0  # another daemon compacts now: the same rows must not be rolled up twice
            rows = list(s.scalars(q))
            if not rows:
                return 0
            docs = self._docs(s, rows)
            self._add_to_rollups(s, rows, docs)
            gone = {r.id for r in rows}
            self._rekey_dependents(s, rows, gone)
            s.execute(sa.delete(ActionRow).where(ActionRow.decision_id.in_(gone)))
            s.execute(sa.delete(OutcomeRow).where(OutcomeRow.decision_id.in_(gone)))
            s.execute(sa.delete(DecisionRow).where(DecisionRow.id.in_(gone)))
        for model, chain in list(self._chains.items()):  # a deleted row cannot be a dictionary
            if chain.last_id in gone:
                del self._chains[model]
        return len(rows)

    @staticmethod
    def _add_to_rollups(s: Session, rows: Sequence[DecisionRow], docs: Mapping[int, Mapping[str, Any]]) -> None:
        acc: dict[tuple[str, datetime], dict[str, Any]] = {}
        for r in rows:
            one = rollup.from_decision({c: getattr(r, c) for c in (
                "id", "model", "at", "replicas", "placement", "cost_per_hour_usd", "reason", "outcome",
                "scale_from_replicas", "scale_to_replicas")}, docs[r.id]["signals"])
            key = (one["model"], one["hour"])
            acc[key] = rollup.merge(acc[key], one) if key in acc else one
        existing = s.scalars(sa.select(RollupRow).where(
            RollupRow.model.in_({m for m, _ in acc}), RollupRow.hour.in_({h for _, h in acc})))
        found = {(r.model, r.hour): r for r in existing}
        for key, new in acc.items():
            old = found.get(key)
            if old is None:
                s.add(RollupRow(**new))
                continue
            merged = rollup.merge({c: getattr(old, c) for c in new}, new)
            for c, v in merged.items():
                setattr(old, c, v)

    def _rekey_dependents(self, s: Session, rows: Sequence[DecisionRow], gone: set[int]) -> None:
        """Rewrite as keyframes the kept rows whose payload dictionary is about to be deleted:
        among the next ``KEYFRAME_EVERY`` rows of each model after the batch."""
        last_of: dict[str, int] = {}
        for r in rows:
            last_of[r.model] = max(r.id, last_of.get(r.model, 0))
        for model, last in last_of.items():
            nxt = list(s.scalars(sa.select(DecisionRow).where(DecisionRow.model == model, DecisionRow.id > last)
                                 .order_by(DecisionRow.id).limit(payload.KEYFRAME_EVERY)))
            dependents = [r for r in nxt if r.payload_prev in gone]
            if not dependents:
                continue
            docs = self._docs(s, dependents)
            for r in dependents:
                doc = dict(docs[r.id])
                doc["recommendations"] = payload.split_state(doc["recommendations"], doc["rule_state"])
                r.payload, _ = payload.encode(doc, None)
                r.payload_prev = r.payload_base = None

    def list_rollups(self, model: str | None = None, since: datetime | None = None, until: datetime | None = None,
                     limit: int = 1000) -> list[dict[str, Any]]:
        """Hourly rollups (``controller.db.rollup.to_json``), newest first: hours that start at or
        after ``since``'s hour and before ``until``."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        q = sa.select(RollupRow)
        if model is not None:
            q = q.where(RollupRow.model == model)
        if since is not None:
            q = q.where(RollupRow.hour >= rollup.hour_of(since.astimezone(timezone.utc)))
        if until is not None:
            q = q.where(RollupRow.hour < until)
        q = q.order_by(RollupRow.hour.desc(), RollupRow.model).limit(limit)
        with self._read_lock, self._sessions() as s:
            return [rollup.to_json({c.name: getattr(r, c.name) for c in RollupRow.__table__.columns}) for r in s.scalars(q)]

    def oldest_decision_at(self, model: str | None = None) -> datetime | None:
        """When the oldest full decision kept was made (the retention job compacts in id order,
        so this is the first row's time; older decisions live in rollups only)."""
        q = sa.select(DecisionRow.at)
        if model is not None:
            q = q.where(DecisionRow.model == model)
        with self._read_lock, self._sessions() as s:
            return s.scalar(q.order_by(DecisionRow.id).limit(1))

    def last_placement(self, model: str, *, applied_only: bool = False) -> dict[str, int] | None:
        """The placement of the model's latest decision (``applied_only``: of the latest one whose
        actions were at least partly applied); ``None`` if there is none."""
        q = sa.select(DecisionRow.placement).where(DecisionRow.model == model)
        if applied_only:
            q = q.where(DecisionRow.outcome.in_(("applied", "partial")))
        q = q.order_by(DecisionRow.at.desc(), DecisionRow.id.desc()).limit(1)
        with self._read_lock, self._sessions() as s:
            placement = s.scalars(q).first()
        return None if placement is None else {k: int(v) for k, v in placement.items()}

    def acted_placements(self, after_id: int | None = None) -> list[tuple[int, str, dict[str, int]]]:
        """``(id, model, placement)`` of decisions that were acted on (``actuate``), in id order:
        those with an id above ``after_id``, or, with ``None``, each model's latest. A sharded
        replica counts these placements of the models other replicas act on in its pools' node
        sums (``controller.daemon``). A shadow decision's placement was never run: it reads as
        empty, as the tick's own node sums leave shadow models out (``Controller._tick``)."""
        q = sa.select(DecisionRow.id, DecisionRow.model, DecisionRow.placement,
                      DecisionRow.intent_outcome_detail).where(DecisionRow.actuate.is_(True))
        if after_id is None:
            latest = sa.select(sa.func.max(DecisionRow.id)).where(DecisionRow.actuate.is_(True)).group_by(DecisionRow.model)
            q = q.where(DecisionRow.id.in_(latest))
        else:
            q = q.where(DecisionRow.id > after_id)
        with self._read_lock, self._sessions() as s:
            rows = s.execute(q.order_by(DecisionRow.id)).all()
        return [(int(i), str(m), {} if detail == SHADOW_DETAIL else {k: int(v) for k, v in (p or {}).items()})
                for i, m, p, detail in rows]

    # --- overrides -----------------------------------------------------------------------------

    @staticmethod
    def _override(row: OverrideRow) -> Override:
        return Override(
            id=row.id,
            kind=OverrideKind(row.kind),
            model=row.model,
            pool=row.pool,
            replicas=row.replicas,
            min_replicas=row.min_replicas,
            max_replicas=row.max_replicas,
            expires_at=row.expires_at,
            reason=row.reason,
            author=row.author,
            created_at=row.created_at,
        )

    @classmethod
    def _override_dict(cls, row: OverrideRow, now: datetime) -> dict[str, Any]:
        out = codec.override_to_json(cls._override(row))
        if row.deleted_at is not None:
            status = "deleted"
        elif row.expires_at is not None and row.expires_at <= now:
            status = "expired"
        else:
            status = "active"
        out.update(deleted_at=_iso(row.deleted_at), deleted_by=row.deleted_by, status=status, active=status == "active")
        return out

    def add_override(
        self,
        kind: OverrideKind | str,
        model: str,
        pool: str | None = None,
        replicas: int | None = None,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        *,
        ttl_s: float | None = None,
        expires_at: datetime | None = None,
        reason: str = "",
        author: str = "",
        now: datetime,
    ) -> Override:
        """Store an override. It expires at ``now + ttl_s`` or at ``expires_at`` (give at most
        one; neither: until deleted). Raises ``ValueError`` on an inconsistent override."""
        kind = OverrideKind(kind)
        if ttl_s is not None and expires_at is not None:
            raise ValueError("give ttl_s or expires_at, not both")
        if ttl_s is not None:
            if ttl_s <= 0:
                raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
            expires_at = now + timedelta(seconds=ttl_s)
        if expires_at is not None and expires_at <= now:
            raise ValueError(f"expires_at {expires_at.isoformat()} is not after now {now.isoformat()}")
        for name, value in (("replicas", replicas), ("min_replicas", min_replicas), ("max_replicas", max_replicas)):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if kind is OverrideKind.PIN and replicas is None:
            raise ValueError("a pin override needs replicas")
        if kind is OverrideKind.BOUNDS:
            if min_replicas is None and max_replicas is None:
                raise ValueError("a bounds override needs min_replicas or max_replicas")
            if min_replicas is not None and max_replicas is not None and min_replicas > max_replicas:
                raise ValueError(f"min_replicas {min_replicas} > max_replicas {max_replicas}")
        if kind is OverrideKind.DRAIN_POOL and pool is None:
            raise ValueError("a drain-pool override needs a pool")
        row = OverrideRow(
            kind=kind.value,
            model=model,
            pool=pool,
            replicas=replicas,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            expires_at=expires_at,
            reason=reason,
            author=author,
            created_at=now,
        )
        with self._lock, self._sessions.begin() as s:
            s.add(row)
            s.flush()
            return self._override(row)

    def get_override(self, override_id: int, now: datetime) -> dict[str, Any] | None:
        with self._read_lock, self._sessions() as s:
            row = s.get(OverrideRow, override_id)
            return None if row is None else self._override_dict(row, now)

    def delete_override(self, override_id: int, author: str, now: datetime) -> bool:
        """Withdraw an override (soft delete: the row stays for the audit). False if there is no
        such override or it was already deleted."""
        with self._lock, self._sessions.begin() as s:
            row = s.get(OverrideRow, override_id)
            if row is None or row.deleted_at is not None:
                return False
            row.deleted_at = now
            row.deleted_by = author
            return True

    def active_overrides(self, now: datetime, model: str | None = None) -> list[Override]:
        """Overrides in force at ``now`` (not deleted, not expired), oldest first."""
        q = sa.select(OverrideRow).where(
            OverrideRow.deleted_at.is_(None),
            sa.or_(OverrideRow.expires_at.is_(None), OverrideRow.expires_at > now),
        )
        if model is not None:
            q = q.where(OverrideRow.model == model)
        with self._read_lock, self._sessions() as s:
            return [self._override(r) for r in s.scalars(q.order_by(OverrideRow.id))]

    def list_overrides(self, include_inactive: bool, now: datetime) -> list[dict[str, Any]]:
        """Overrides as dicts, newest first, each with ``status`` (active / expired / deleted)."""
        q = sa.select(OverrideRow)
        if not include_inactive:
            q = q.where(
                OverrideRow.deleted_at.is_(None),
                sa.or_(OverrideRow.expires_at.is_(None), OverrideRow.expires_at > now),
            )
        with self._read_lock, self._sessions() as s:
            return [self._override_dict(r, now) for r in s.scalars(q.order_by(OverrideRow.id.desc()))]

    # --- audit ---------------------------------------------------------------------------------

    def audit(self, author: str, action: str, target: str, detail: Mapping[str, Any] | None, now: datetime) -> int:
        """Record one API write; returns the entry's id."""
        row = AuditRow(at=now, author=author, action=action, target=target, detail=codec.to_jsonable(detail or {}))
        with self._lock, self._sessions.begin() as s:
            s.add(row)
            s.flush()
            return row.id

    def list_audit(self, limit: int = 100, before_id: int | None = None) -> list[dict[str, Any]]:
        """Audit entries, newest first (keyset pagination by ``before_id``)."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        q = sa.select(AuditRow)
        if before_id is not None:
            q = q.where(AuditRow.id < before_id)
        q = q.order_by(AuditRow.id.desc()).limit(limit)
        with self._read_lock, self._sessions() as s:
            return [
                {"id": r.id, "at": _iso(r.at), "author": r.author, "action": r.action, "target": r.target, "detail": r.detail}
                for r in s.scalars(q)
            ]

    # --- policy versions -----------------------------------------------------------------------

    def record_policy_version(self, model: str, version: str, sources: Any, content: str, now: datetime) -> bool:
        """Remember a policy version (content hash) for a model; True if it was not known yet."""
        return self.record_policy_versions([(model, version, sources, content)], now)[0]

    def record_policy_versions(self, items: Sequence[tuple[str, str, Any, str]], now: datetime) -> list[bool]:
        """Remember policy versions ``(model, version, sources, content)`` in one transaction (a
        start with 1,000 policy files is one commit, not 1,000); True for each not known yet."""
        if not items:
            return []
        with self._lock, self._sessions.begin() as s:
            conn = s.connection()
            return [conn.execute(self._policy_version_insert(model, version, sources, content, now)).scalar()
                    is not None for model, version, sources, content in items]

    def _policy_version_insert(self, model: str, version: str, sources: Any, content: str,
                               now: datetime) -> sa.Executable:
        values = {
            "model": model,
            "version": version,
            "sources": codec.to_jsonable(sources),
            "content": content,
            "first_seen_at": now,
        }
        # INSERT ... ON CONFLICT DO NOTHING: several processes (two daemons during a rollout, the
        # CLI) may meet the same version at once; the unique constraint decides which one is first.
        # Core statements on the table (not the ORM entity), RETURNING the new id: the only
        # portable way to learn whether a row went in (psycopg reports rowcount -1 here).
        table = PolicyVersionRow.__table__
        assert isinstance(table, sa.Table)
        dialect = self._engine.dialect.name
        if dialect == "sqlite":
            stmt = sqlite.insert(table).values(**values).on_conflict_do_nothing().returning(table.c.id)
        elif dialect == "postgresql":
            stmt = postgresql.insert(table).values(**values).on_conflict_do_nothing().returning(table.c.id)
        else:  # pragma: no cover - only SQLite and PostgreSQL are supported
            raise NotImplementedError(f"unsupported database dialect {dialect}")
        return stmt

    def list_policy_versions(self, model: str | None = None) -> list[dict[str, Any]]:
        """Known policy versions, newest first."""
        q = sa.select(PolicyVersionRow)
        if model is not None:
            q = q.where(PolicyVersionRow.model == model)
        q = q.order_by(PolicyVersionRow.first_seen_at.desc(), PolicyVersionRow.id.desc())
        with self._read_lock, self._sessions() as s:
            return [
                {
                    "id": r.id,
                    "model": r.model,
                    "version": r.version,
                    "sources": r.sources,
                    "content": r.content,
                    "first_seen_at": _iso(r.first_seen_at),
                }
                for r in s.scalars(q)
            ]

