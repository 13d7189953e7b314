"""The daemon's ``controller.controller.Recorder``: the decision log (``Repository``), with a local
journal (``controller.db.journal``) for the intents the database cannot take.

Each method covers the whole tick: one query for every model's history, one for the overrides, one
transaction for the intents, one for the outcomes. When the database refuses an intent for a
reason of its own (unreachable, disk full: SQLAlchemy's ``OperationalError`` / ``InterfaceError``)
and a journal is configured, the intents are appended to it and returned as ``journaled`` (the
controller then acts on growing pools only); outcomes follow their intents there. Before reading
or writing anything the recorder replays a waiting journal, so the log keeps the order of events:
whole at start (the history is rebuilt from the log), and in slices of about ``REPLAY_SLICE_S`` a
tick while the daemon runs, so a long outage's journal does not stop its ticks (``python
bench/journal_size.py --models 1000 --warmup 20 --replay``: 0.27 ms a decision with the demo
policy, 0.35 with a ``forecast`` rule, so written whole an hour's journal of 1,000 models would
hold one tick 3-4 minutes). Until the last slice is written the tick's own intents go on to the
journal behind it, and the tick acts on growing pools only, as during the outage.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Collection, Mapping, Sequence

import sqlalchemy.exc as sa_exc

from controller.controller import SHADOW_DETAIL, Outcome, PendingIntent, RecordedIntents
from controller.core.model import Decision, History, ModelSignals, Override
from controller.db.journal import Journal
from controller.db.repo import Repository
from controller.logs import log

logger = logging.getLogger("tidegate.recorder")

REPLAY_SLICE_S = 1.0
"""About how long a running daemon's tick spends replaying a journal (``Repository.replay_journal``'s
budget); the rest waits for the next tick."""

UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError)
"""The database's own failures (cannot connect, connection lost, disk full): an intent it refuses
for one of these goes to the journal. Anything else is a bug and raises."""


class RepositoryRecorder:
    """The decision log as the controller's recorder; ``journal``: where intents go while the
    database is away (``None``: nowhere, and the tick acts on nothing)."""

    def __init__(self, repo: Repository, journal: Journal | None = None) -> None:
        self.repo = repo
        self.journal = journal
        self._settled: dict[int, str] = {}
        """Intents stored ``skipped`` at once (decisions that act on nothing: those that do not
        actuate, and shadow decisions), with their detail."""
        self.replaying = False
        """The database took the last replay's slice, and more of the journal waits for the next."""
        self.refused: str | None = None
        """Why the database refused the last write or replay, in the driver's words (``None``: it
        took the last one)."""
        self._replayed = 0
        """Decisions of the waiting journal already written by this recorder's replay slices."""

    def waiting(self) -> int:
        """Decisions in the journal not yet in the decision log (0: none, or no journal). Of a
        journal another daemon had partly replayed before it died, what that daemon wrote counts
        too, until the replay completes."""
        return 0 if self.journal is None else max(0, self.journal.decisions() - self._replayed)

    # --- reads ---------------------------------------------------------------------------------

    def histories(self, horizons: Mapping[str, float], now: datetime) -> Mapping[str, History]:
        return self.repo.rebuild_histories(horizons, now)

    def flush(self, now: datetime) -> bool:
        return self.replay(now, whole=True)

    def overrides(self, now: datetime) -> Sequence[Override]:
        return self.repo.active_overrides(now)

    def pending(self, models: Sequence[str], since: datetime) -> Sequence[PendingIntent]:
        rows = [*self.repo.abandoned_decisions(models, before=since), *self.repo.pending_decisions(models, since=since)]
        return [PendingIntent(decision_id=r["id"], model=r["model"], at=r["at"], placement=r["placement"],
                              previous_placement=r["previous_placement"], dry_run=r["dry_run"])
                for r in sorted(rows, key=lambda r: int(r["id"]))]

    # --- writes --------------------------------------------------------------------------------

    def intents(self, items: Sequence[tuple[Decision, ModelSignals]], dry_run: bool,
                shadow: Collection[str] = frozenset()) -> RecordedIntents:
        skipped = [SHADOW_DETAIL if d.model in shadow else None for d, _ in items]
        recorded = self._intents(items, dry_run, skipped)
        self._settled = {i: detail or d.reason for i, (d, _), detail in zip(recorded.ids, items, skipped)
                         if detail is not None or not d.actuate}
        return recorded

    def _intents(self, items: Sequence[tuple[Decision, ModelSignals]], dry_run: bool,
                 skipped: Sequence[str | None]) -> RecordedIntents:
        now = items[0][0].at if items else None
        if now is None or self.replay(now):
            try:
                recorded = RecordedIntents(self.repo.record_decisions([(d, sig, dry_run) for d, sig in items], skipped))
                self.refused = None
                return recorded
            except UNAVAILABLE as e:
                self.refused = database_words(e)
                if self.journal is None:
                    raise
                log(logger, logging.WARNING, "database refused the intents; journaled locally, only scale-ups act",
                    error=self.refused, journal=str(self.journal.path), decisions=len(items))
        assert self.journal is not None  # replay() is True without one
        return RecordedIntents(self.journal.append_intents(items, dry_run, skipped), journaled=True,
                               behind_replay=self.replaying)

    def outcomes(self, items: Sequence[Outcome]) -> None:
        # a decision that acts on nothing (no actuation, or a shadow's) was stored skipped with its intent
        rows = [(o.decision_id, o.actions, o.outcome, o.detail, o.applied_replicas) for o in items
                if not (o.outcome == "skipped" and not o.actions and o.applied_replicas is None
                        and self._settled.get(o.decision_id, None) == o.detail)]
        if not rows:
            return
        if self.journal is not None and (self.journal.exists() or any(o.decision_id < 0 for o in items)):
            self.journal.append_outcomes(rows)  # after their intents, in order
            return
        try:
            self.repo.record_outcomes(rows)
            self.refused = None
        except UNAVAILABLE as e:
            self.refused = database_words(e)
            if self.journal is None:
                raise
            log(logger, logging.WARNING, "database refused the outcomes; journaled locally", error=self.refused)
            self.journal.append_outcomes(rows)

    def replay(self, now: datetime, whole: bool = False) -> bool:
        """Replay a waiting journal into the database and remove it once written whole; True when
        no journal waits (now or any more), False while the database still refuses it or, unless
        ``whole``, while a slice of about ``REPLAY_SLICE_S`` left some of it for the next tick."""
        self.replaying = False
        if self.journal is None or not self.journal.exists():
            return True
        journal_id = self.journal.journal_id() or self.journal.path.name
        try:  # the entries are decoded only once the database answers: not at every tick of an outage
            progress = self.repo.replay_journal(journal_id, self.journal.read_from, now,
                                                budget_s=None if whole else REPLAY_SLICE_S)
        except UNAVAILABLE as e:
            self.refused = database_words(e)
            log(logger, logging.DEBUG, "journal not replayed yet: database unavailable", error=self.refused)
            return False
        self.refused = None
        self._replayed += progress.written
        if not progress.complete:
            self.replaying = True
            log(logger, logging.INFO, "journal replay goes on next tick", journal=journal_id,
                decisions=progress.written, journal_bytes=self.journal.size())
            return False
        self.journal.remove()
        self._replayed = 0
        log(logger, logging.INFO, "journal replayed into the decision log", journal=journal_id,
            decisions=progress.written)
        return True


def database_words(e: BaseException) -> str:
    """The driver's one-line message, not SQLAlchemy's wrapping (the journal flag, the API's 503,
    the log lines)."""
    return " ".join(str(getattr(e, "orig", None) or e).split())
