"""The local journal's file on a real file system (``controller.db.journal``): a tick's intents in
one line, read back in order with the lines of the previous format before them, a line torn by a
crash skipped without losing the appends after it, and an append the disk cuts short refused
whole (the tick then acts on nothing). Replays through a daemon are in ``test_write_path.py``."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from controller.controller import SHADOW_DETAIL, Outcome
from controller.core.model import Action, ActionStatus, Decision, ModelSignals
from controller.db import codec
from controller.db.journal import Journal
from controller.db.recorder import RepositoryRecorder
from controller.db.repo import ReplayProgress, Repository
from tests.integration.test_db_repo import decision_for, signals_for

REPO_ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 2, tzinfo=timezone.utc)


def tick_items(n: int, at: datetime) -> list[tuple[Decision, ModelSignals]]:
    """One tick of ``n`` models (``m0``, ``m1``...): the same policy and pools, each its own load."""
    return [(replace(decision_for(f"m{k}", at, current=3, replicas=4 + k), cost_per_hour_usd=12.5 + k),
             signals_for(f"m{k}", at)) for k in range(n)]


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def test_a_ticks_intents_are_one_line_read_back_in_order_after_the_previous_formats_lines(tmp_path: Path) -> None:
    """A journal the previous daemon left (one intent a line) grows by one line a tick; its
    entries come back in file order, one per intent, with handles that go on from the old ones."""
    path = tmp_path / "journal.jsonl"
    shutil.copy(Path(__file__).with_name("journal_v1.jsonl"), path)
    journal = Journal(path)
    old_lines = len(lines(path))
    first, second = tick_items(3, T0), tick_items(2, T0 + timedelta(seconds=5))
    assert journal.append_intents(first, dry_run=False, skipped=[None, SHADOW_DETAIL, None]) == [-3, -4, -5]
    journal.append_outcomes([(-3, [Action("kubernetes", "scale", "onprem", "m0", {"replicas": 4}, ActionStatus.OK)],
                              "applied", None, None)])
    assert journal.append_intents(second, dry_run=True) == [-6, -7]
    assert len(lines(path)) == old_lines + 3, "one line a tick, one for the outcomes"

    reread = Journal(path)
    assert reread.journal_id() == "84356d03eccd47d2b509b21b2c80fcef", "the previous daemon's journal"
    entries = list(reread.entries())
    assert [(e["kind"], e.get("handle", e.get("decision_id"))) for e in entries] == [
        ("intent", -1), ("outcome", -1), ("intent", -2),  # the previous format's lines
        ("intent", -3), ("intent", -4), ("intent", -5), ("outcome", -3), ("intent", -6), ("intent", -7)]
    new = [e for e in entries[3:] if e["kind"] == "intent"]
    assert [codec.decision_from_json(e["decision"]) for e in new] == [d for d, _ in first + second]
    assert [codec.signals_from_json(e["signals"]) for e in new] == [s for _, s in first + second]
    assert [e.get("skipped") for e in new] == [None, SHADOW_DETAIL, None, None, None]
    assert [e["dry_run"] for e in new] == [False] * 3 + [True] * 2


def test_what_waits_in_a_journal_is_counted_as_it_grows_and_read_back_when_it_is_opened(tmp_path: Path) -> None:
    """What ``/v1/status`` and the status page say waits (``decisions``, ``outcomes``, ``since``):
    counted as ticks append, the same when a daemon opens the journal at start (the previous
    format's lines included, a torn line not counted), nothing once the journal is removed."""
    path = tmp_path / "journal.jsonl"
    shutil.copy(Path(__file__).with_name("journal_v1.jsonl"), path)
    journal = Journal(path)
    assert (journal.decisions(), journal.outcomes(), journal.since()) == (2, 1, T0 - timedelta(seconds=10))
    journal.append_intents(tick_items(3, T0), dry_run=False)
    journal.append_outcomes([(-3, [], "applied", None, None), (-4, [], "applied", None, None)])
    counted = (journal.decisions(), journal.outcomes(), journal.since())
    assert counted == (5, 3, T0 - timedelta(seconds=10))
    assert (Journal(path).decisions(), Journal(path).outcomes(), Journal(path).since()) == counted

    whole = path.read_bytes()
    journal.append_intents(tick_items(2, T0 + timedelta(seconds=5)), dry_run=False)
    assert journal.decisions() == 7
    path.write_bytes(path.read_bytes()[:len(whole) + 40])  # that tick's line, torn by a crash
    assert Journal(path).decisions() == 5, "a torn line's intents were never acted on"

    journal.remove()
    assert (journal.decisions(), journal.outcomes(), journal.since()) == (0, 0, None)
    fresh = Journal(tmp_path / "fresh.jsonl")
    assert (fresh.decisions(), fresh.outcomes(), fresh.since()) == (0, 0, None)
    fresh.append_outcomes([(12, [], "applied", None, None)])  # the database took the intent, not its outcome
    assert (fresh.decisions(), fresh.outcomes(), fresh.since()) == (0, 1, None)
    fresh.append_intents(tick_items(1, T0 + timedelta(seconds=5)), dry_run=False)
    assert (fresh.decisions(), fresh.since()) == (1, T0 + timedelta(seconds=5))


def test_a_shadow_decision_journaled_while_the_database_is_away_is_replayed_skipped(
        tmp_path: Path, migrated_db_url: str) -> None:
    """The recorder journals a tick of two models, one in shadow mode, while the database refuses
    them; only the acting model's outcome follows (the shadow's is in its intent). Replayed, the
    shadow decision is ``skipped`` with ``SHADOW_DETAIL`` (the shadow report's), never pending."""
    journal = Journal(tmp_path / "journal.jsonl")
    recorder = RepositoryRecorder(Repository("postgresql+psycopg://postgres@127.0.0.1:9/none?connect_timeout=1"),
                                  journal)
    recorded = recorder.intents(tick_items(2, T0), dry_run=False, shadow={"m0"})
    assert recorded.journaled and not recorded.behind_replay  # the database refused them
    assert recorder.waiting() == 2 and recorder.refused, "and says why (/v1/status)"
    shadow, acting = recorded.ids
    recorder.outcomes([Outcome(shadow, [], "skipped", SHADOW_DETAIL), Outcome(acting, [], "applied")])
    assert [(e["kind"], e.get("handle", e.get("decision_id"))) for e in journal.entries()] == [
        ("intent", shadow), ("intent", acting), ("outcome", acting)]
    recorder.repo = Repository(migrated_db_url)
    try:
        assert recorder.replay(T0) and not journal.exists()
        assert recorder.waiting() == 0 and recorder.refused is None
        rows = {r["model"]: r for r in recorder.repo.all_decisions()}
        assert (rows["m0"]["outcome"], rows["m0"]["outcome_detail"]) == ("skipped", SHADOW_DETAIL)
        assert rows["m1"]["outcome"] == "applied" and not recorder.repo.pending_decisions()
    finally:
        recorder.repo.close()


def test_the_decisions_of_a_tick_are_compressed_together(tmp_path: Path) -> None:
    """What the tick's one block is for: ten models' decisions, alike but for their names and
    numbers, take less than half of what ten ticks of one of them each take."""
    together, apart = Journal(tmp_path / "together.jsonl"), Journal(tmp_path / "apart.jsonl")
    items = tick_items(10, T0)
    together.append_intents(items, dry_run=False)
    for item in items:
        apart.append_intents([item], dry_run=False)
    header = len(lines(together.path)[0]) + 1
    assert together.path.stat().st_size - header < (apart.path.stat().st_size - header) / 2


def test_a_line_torn_by_a_crash_is_skipped_and_the_next_append_is_kept(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A crash in the middle of an append leaves part of a line (its intents were never acted on:
    acting waits for the append); the next daemon's append starts on a line of its own."""
    path = tmp_path / "journal.jsonl"
    Journal(path).append_intents(tick_items(2, T0), dry_run=False)
    whole = path.read_bytes()
    Journal(path).append_intents(tick_items(2, T0 + timedelta(seconds=5)), dry_run=False)
    path.write_bytes(path.read_bytes()[:len(whole) + 40])  # the second tick's line, torn

    after = Journal(path)
    assert after.append_intents(tick_items(1, T0 + timedelta(seconds=10)), dry_run=False) == [-3]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "tidegate.journal"):
        entries = list(after.entries())
    assert [(e["handle"], e["decision"]["at"]) for e in entries] == [
        (-1, codec.encode_datetime(T0)), (-2, codec.encode_datetime(T0)),
        (-3, codec.encode_datetime(T0 + timedelta(seconds=10)))]
    assert [r.getMessage() for r in caplog.records] == ["journal line torn by a crash; skipped"]


SHORT_WRITE = textwrap.dedent("""\
    import resource, signal, sys
    from datetime import datetime
    from pathlib import Path
    from controller.db.journal import Journal
    from tests.integration.test_journal import tick_items
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
    journal = Journal(Path(sys.argv[1]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    try:
        print(journal.append_intents(tick_items(50, datetime.fromisoformat(sys.argv[3])), dry_run=False))
    except OSError as e:
        print(e.errno)
    """)


def test_an_append_the_disk_cuts_short_is_refused_whole(tmp_path: Path) -> None:
    """The volume fills in the middle of a tick's line: the kernel writes part of it, then refuses
    the rest (here the process's file-size limit, which does what a full disk does: a short write,
    then an error). The append raises, so the tick acts on nothing, and the file is left as it was:
    no torn line, no intent the daemon could have believed recorded."""
    path = tmp_path / "journal.jsonl"
    Journal(path).append_intents(tick_items(2, T0), dry_run=False)
    before = path.read_bytes()
    proc = subprocess.run([sys.executable, "-c", SHORT_WRITE, str(path), str(len(before) + 200),
                           (T0 + timedelta(seconds=5)).isoformat()],
                          cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [str(errno.EFBIG)], proc.stdout
    assert path.read_bytes() == before
    assert [e["handle"] for e in Journal(path).entries()] == [-1, -2]


def _journal_of_ticks(path: Path, ticks: int, models: int) -> Journal:
    """A journal of ``ticks`` ticks of ``models`` models, each tick's intents then their outcomes,
    as the recorder appends them during an outage."""
    journal = Journal(path)
    for k in range(ticks):
        handles = journal.append_intents(tick_items(models, T0 + timedelta(seconds=5 * k)), dry_run=False)
        journal.append_outcomes([(h, [], "applied", None, None) for h in handles])
    return journal


def test_a_long_journal_is_replayed_a_slice_at_a_time_exactly_once_in_order(
        tmp_path: Path, migrated_db_url: str) -> None:
    """A running daemon replays a journal in slices (``budget_s``: here none, so each call writes
    the least it may, two ticks' lines): each slice is committed with the offset it reached,
    a repository opened afresh (a daemon killed between two slices) goes on from there, and in the
    end every decision is in the log once, in the journal's order, with its outcome."""
    journal = _journal_of_ticks(tmp_path / "journal.jsonl", ticks=5, models=3)
    jid = journal.journal_id()
    assert jid is not None
    progress = []
    while True:
        repo = Repository(migrated_db_url)  # a new daemon each slice
        try:
            p = repo.replay_journal(jid, Journal(journal.path).read_from, T0, budget_s=0.0)
            progress.append((p.written, p.complete))
            replays = repo.list_journal_replays()
            rows = list(repo.all_decisions())
        finally:
            repo.close()
        assert replays == [{"journal_id": jid, "replayed_at": replays[0]["replayed_at"],
                            "entries": min(12 * len(progress), 30), "complete": p.complete}]
        assert len(rows) == min(6 * len(progress), 15)  # whole ticks, never a part of one
        if p.complete:
            break
    assert progress == [(6, False), (6, False), (3, True)]
    assert [(r["model"], r["at"]) for r in sorted(rows, key=lambda r: r["id"])] == [
        (f"m{m}", (T0 + timedelta(seconds=5 * k)).isoformat()) for k in range(5) for m in range(3)]
    assert {r["outcome"] for r in rows} == {"applied"}
    repo = Repository(migrated_db_url)
    try:  # written whole: a daemon that died before removing the file writes nothing again
        assert repo.replay_journal(jid, journal.read_from, T0, budget_s=0.0) == ReplayProgress(0, True)
        assert len(list(repo.all_decisions())) == 15
    finally:
        repo.close()


def test_ticks_go_on_while_a_long_journal_drains_their_intents_queued_behind_it(
        tmp_path: Path, migrated_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the rest of a journal waits for the next slice, a tick's intents go on to the journal
    behind it (returned ``journaled``: the tick grows pools only), so the log keeps the order of
    events; the tick after the last slice writes to the database again and the file is gone."""
    monkeypatch.setattr("controller.db.recorder.REPLAY_SLICE_S", 0.0)  # two ticks' lines a slice
    journal = _journal_of_ticks(tmp_path / "journal.jsonl", ticks=5, models=2)
    recorder = RepositoryRecorder(Repository(migrated_db_url), journal)
    try:
        journaled, waiting = [], []
        for k in range(5, 11):
            at = T0 + timedelta(seconds=5 * k)
            recorded = recorder.intents(tick_items(2, at), dry_run=False)
            recorder.outcomes([Outcome(i, [], "applied") for i in recorded.ids])
            journaled.append((recorded.journaled, recorded.behind_replay))
            waiting.append(recorder.waiting())
            if not recorded.journaled:
                break
        # 5 ticks waiting; each tick writes two and adds one behind (4, 3, 2 wait after it), the
        # fourth writes the last two and its own intents go to the database
        # behind a replay, not refused: the daemon says so, and stays ready (``Daemon._tick``)
        assert journaled == [(True, True)] * 3 + [(False, False)] and not journal.exists()
        assert waiting == [8, 6, 4, 0] and recorder.refused is None, "what the status page counts down"
        rows = sorted(recorder.repo.all_decisions(), key=lambda r: r["id"])
        assert [r["at"] for r in rows] == sorted(r["at"] for r in rows) and len(rows) == 18
        assert {r["outcome"] for r in rows} == {"applied"}

    finally:
        recorder.repo.close()


def test_at_start_a_journal_is_replayed_whole(tmp_path: Path, migrated_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At start the history is rebuilt from the log, so the journal goes in whole first
    (``flush``), whatever the slice."""
    monkeypatch.setattr("controller.db.recorder.REPLAY_SLICE_S", 0.0)
    journal = _journal_of_ticks(tmp_path / "journal.jsonl", ticks=5, models=2)
    recorder = RepositoryRecorder(Repository(migrated_db_url), journal)
    try:
        assert recorder.flush(T0) and not journal.exists()
        assert len(list(recorder.repo.all_decisions())) == 10
    finally:
        recorder.repo.close()
