"""The write path against real parts: intent before effect across a kill -9 of a real daemon
process (kmock answering its scale call slowly; on SQLite and on PostgreSQL), the local journal
across a stop of a real PostgreSQL, and a decision log that refuses writes because its size limit
is reached.

What the user depends on, each checked on the peer's own record of what was done to it (kmock
keeps every version of the Deployment) against the decision log:

- no actuation without its decision row, whatever moment the daemon dies at; after a restart the
  policy's scale-down rate limit still holds (the step the dead daemon made counts);
- with the database away, the intents of the gap are kept (journal) and none is lost or written
  twice when it returns; the load's scale-up happens, nothing is released;
- with nowhere to record (database full, journal full), nothing is acted on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from controller.config import DaemonConfig
from controller.controller import SHADOW_DETAIL
from controller.daemon import TickReport
from controller.core.model import History, ScaleEvent
from controller.db.journal import Journal
from controller.db.migrate import upgrade
from controller.db.repo import ReplayProgress, Repository, make_engine
from controller.runtime import Runtime, build_runtime
from providers.clock import ManualClock
from tests.integration.daemon_process import FileLoad
from tests.integration.own_postgres import OwnPostgres
from tests.integration.peers import KubeControllers, KubePeer
from tests.integration.test_db_repo import decision_for, signals_for

REPO_ROOT = Path(__file__).resolve().parents[2]

POLICY = textwrap.dedent("""\
    apiVersion: tidegate/v1
    kind: ScalingPolicy
    metadata: {name: llama-queue}
    spec:
      model: llama
      bounds: {min_replicas: 1, max_replicas: 32}
      rules:
        - kind: queue-depth
          params: {target_per_replica: 1}
      behavior:
        tolerance: 0
        scale_up: {stabilization_s: 0, policies: []}
        scale_down:
          stabilization_s: 0
          policies: [{type: percent, value: 50, period_s: 60}]
    """)


class Fleet:
    """One Deployment on one on-prem pool of the shared kmock, and a daemon config for it."""

    def __init__(self, kube: KubePeer, tmp: Path, db_url: str, replicas: int, **database: Any) -> None:
        self.kube = kube
        tag = uuid.uuid4().hex[:6]
        self.ns = f"w-{tag}"
        self.api = kube.api_client()
        self.ctl = KubeControllers(self.api)
        labels = {"tidegate.io/pool": f"onprem-{tag}"}
        self.ctl.add_deployment(self.ns, "llama-onprem", {"app": "llama"}, replicas, gpus=1, node_selector=labels)
        self.ctl.add_node(f"{self.ns}-n0", labels, 16)
        self.ctl.add_node(f"{self.ns}-n1", labels, 16)
        policies = tmp / f"policies-{tag}"
        policies.mkdir()
        (policies / "llama.yaml").write_text(POLICY)
        self.load = tmp / f"load-{tag}"
        self.raw: dict[str, Any] = {
            "policies_dir": str(policies),
            "database": {"url": db_url, **database},
            "api": {"enabled": False},
            "loop": {"interval_s": 0.5},
            "providers": {"type": "real", "settings": {
                "prometheus": {"url": "http://127.0.0.1:9"},
                "kubernetes": {"host": kube.url, "retry": {"budget_s": 2.0, "base_delay_s": 0.005,
                                                            "max_delay_s": 0.02, "max_attempts": 2}},
            }},
            "pools": [{"name": "onprem", "kind": "onprem", "gpu_type": "A100-80GB", "gpus_per_node": 16,
                       "max_nodes": 2, "price_per_node_hour_usd": 9.0,
                       "kubernetes": {"node_selector": labels}}],
            "models": [{"name": "llama", "tp_degree": 1, "quantization": "fp8", "cold_start_s": 90,
                        "gpu_types": ["A100-80GB"],
                        "capacity": {"A100-80GB": {"output_tokens_per_s": 1500, "requests_per_s": 3}},
                        "deployments": {"onprem": {"namespace": self.ns, "name": "llama-onprem"}}}],
        }
        self.config = tmp / f"config-{tag}.yaml"
        self.config.write_text(yaml.safe_dump(self.raw))

    def set_load(self, queue: float) -> None:
        tmp = self.load.with_suffix(".tmp")
        tmp.write_text(str(queue))
        tmp.replace(self.load)

    def replica_history(self) -> list[int]:
        """Every ``spec.replicas`` the Deployment has had, in order, repeats collapsed (kmock keeps
        each version of the object)."""
        emu = self.kube.emu
        with emu.lock:
            obj = next(o for k, o in emu._objects.items() if k[1] == self.ns and k[2] == "llama-onprem"
                       and k[0].plural == "deployments")
            versions = [(v.get("spec") or {}).get("replicas") for v in obj.history]
        out: list[int] = []
        for r in versions:
            if r is not None and (not out or out[-1] != r):
                out.append(int(r))
        return out

    def start_daemon(self, log: Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        with open(log, "ab") as out:
            return subprocess.Popen([sys.executable, "-m", "tests.integration.daemon_process", str(self.config),
                                     str(self.load)], cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_for(what: str, check: Any, timeout_s: float = 30.0, proc: subprocess.Popen[bytes] | None = None,
             log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"daemon exited ({proc.returncode}) while waiting for {what}:\n"
                        f"{log.read_text()[-3000:] if log else ''}")
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}:\n{log.read_text()[-3000:] if log else ''}")


def decisions(repo: Repository) -> list[dict[str, Any]]:
    return list(reversed(repo.list_decisions(model="llama", limit=10_000)))


def test_kill_9_during_a_slow_scale_call_leaves_no_actuation_unrecorded(
        kube: KubePeer, tmp_path: Path, db_url: str) -> None:
    """On SQLite and on PostgreSQL (``db_url``; on PostgreSQL the daemons take the advisory lock,
    which the kill releases with the dead daemon's connection)."""
    fleet = Fleet(kube, tmp_path, db_url, replicas=16)
    fleet.set_load(16)
    upgrade(db_url)
    log = tmp_path / "daemon.log"
    a = fleet.start_daemon(log)
    repo = Repository(db_url)
    try:
        wait_for("a first settled decision at 16 replicas", lambda: any(
            d["outcome"] != "pending" and d["replicas"] == 16 for d in decisions(repo)), proc=a, log=log)
        # the next scale call is carried out at once and answered a minute later: the daemon is
        # killed while it waits for the answer
        mark = kube.mark()
        kube.fault("PATCH", rf"/namespaces/{fleet.ns}/deployments/llama-onprem/scale$", answer_after_s=60)
        fleet.set_load(1)
        wait_for("the daemon's scale call", lambda: any(
            r.method == "PATCH" and r.subresource == "scale" and not r.by_test for r in kube.requests_since(mark)),
            proc=a, log=log)
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        assert fleet.replica_history() == [16, 8], "the cluster carried out the 16 -> 8 step (50 % per 60 s)"
        intent = decisions(repo)[-1]
        assert (intent["replicas"], intent["outcome"]) == (8, "pending"), "the intent was written before the call"

        started = time.monotonic()
        last_id = intent["id"]
        b = fleet.start_daemon(log)
        try:
            wait_for("five decisions of the restarted daemon",
                     lambda: len([d for d in decisions(repo) if d["id"] > last_id and d["outcome"] != "pending"]) >= 5,
                     proc=b, log=log)
        finally:
            b.send_signal(signal.SIGKILL)
            b.wait(10)
        assert time.monotonic() - started < 60, "the rate limit's period was still running"

        rows = decisions(repo)
        reconciled = repo.get_decision(intent["id"]) or {}
        assert reconciled["outcome"] == "applied", reconciled["outcome_detail"]
        assert "reconciled at start" in (reconciled["outcome_detail"] or "")
        assert reconciled["scale_event"] == {"at": reconciled["at"], "from_replicas": 16, "to_replicas": 8}
        # the rate limit held across the restart: 8 removed of 16 within 60 s is the 50 % allowed
        assert fleet.replica_history() == [16, 8]
        after = [d for d in rows if d["id"] > last_id]
        assert after and all(d["replicas"] == 8 for d in after), [(d["replicas"], d["reason"]) for d in after]
        # every value the Deployment took is a decision the log says was applied (or the start)
        applied = {d["placement"]["onprem"] for d in rows if d["outcome"] in ("applied", "partial")}
        assert set(fleet.replica_history()[1:]) <= applied
        assert not [d for d in rows if d["outcome"] == "pending"], "nothing left pending"
    finally:
        if a.poll() is None:
            a.kill()
        repo.close()


@pytest.mark.postgres
def test_a_shadow_daemon_killed_between_intent_and_outcome_leaves_nothing_to_reconcile(
        kube: KubePeer, tmp_path: Path, pg_url: str) -> None:
    """The daemon in shadow mode (``mode: shadow``) beside a Deployment that stays at 4 is killed
    (kill -9) after the intent of its 4 -> 12, while the outcomes table takes no writes (the test
    holds a lock on it: the moment between an intent and its outcome, made to last). A shadow
    decision is never carried out, so its outcome is in its intent: the restarted daemon finds
    nothing pending and does not judge the shadow's step by the pool that runs (as an acting
    daemon's step, 4 -> 12 with 4 running would read "not applied" and lose its scale step), and
    the shadow report of the killed daemon's time reads the same before and after the restart."""
    from controller.shadow import report

    fleet = Fleet(kube, tmp_path, pg_url, replicas=4)
    fleet.raw["mode"] = "shadow"
    fleet.config.write_text(yaml.safe_dump(fleet.raw))
    cfg = DaemonConfig.model_validate(fleet.raw)
    fleet.set_load(4)
    upgrade(pg_url)
    log = tmp_path / "daemon.log"
    repo = Repository(pg_url)
    engine = make_engine(pg_url)
    mark = kube.mark()
    a = fleet.start_daemon(log)

    def shadow_report(since: datetime, until: datetime) -> dict[str, Any]:
        return report(repo, models=cfg.model_specs(), pools=cfg.pool_specs(), p99_targets={"llama": None},
                      since=since, until=until)

    try:
        wait_for("a first shadow decision", lambda: decisions(repo), proc=a, log=log)
        with engine.connect() as lock:
            lock.exec_driver_sql("LOCK TABLE decision_outcomes IN SHARE MODE")  # inserts wait; reads go on
            fleet.set_load(12)
            intent = wait_for("the intent of 4 -> 12", lambda: next(
                (d for d in decisions(repo) if d["replicas"] == 12), None), proc=a, log=log)
            a.send_signal(signal.SIGKILL)
            a.wait(10)
            lock.rollback()
        killed = decisions(repo)
        since = datetime.fromisoformat(killed[0]["at"])
        until = datetime.fromisoformat(killed[-1]["at"]) + timedelta(seconds=1)
        before = shadow_report(since, until)

        b = fleet.start_daemon(log)
        try:
            wait_for("three decisions of the restarted daemon",
                     lambda: len([d for d in decisions(repo) if d["id"] > killed[-1]["id"]]) >= 3, proc=b, log=log)
        finally:
            b.send_signal(signal.SIGKILL)
            b.wait(10)

        row = repo.get_decision(intent["id"]) or {}
        assert (row["outcome"], row["outcome_detail"]) == ("skipped", SHADOW_DETAIL)
        assert row["scale_event"] == {"at": row["at"], "from_replicas": 4, "to_replicas": 12}, "the shadow's own step"
        assert {(d["outcome"], d["outcome_detail"]) for d in repo.all_decisions(model="llama")} == {
            ("skipped", SHADOW_DETAIL)}
        with engine.connect() as c:  # a shadow decision is one write: no outcome row after it
            assert c.exec_driver_sql("SELECT count(*) FROM decision_outcomes").scalar() == 0
        assert before and shadow_report(since, until) == before
        assert fleet.replica_history() == [4]
        assert not [r for r in kube.requests_since(mark) if r.is_write and not r.by_test], "a shadow never writes"
    finally:
        if a.poll() is None:
            a.kill()
        engine.dispose()
        repo.close()


# --- the database away: the journal ------------------------------------------------------------

T0 = datetime(2026, 11, 2, tzinfo=timezone.utc)


def manual_daemon(fleet: Fleet) -> tuple[Runtime, ManualClock]:
    """The daemon as ``tidegate run`` builds it from the fleet's config, on a manual clock."""
    clock = ManualClock(T0)
    cfg = DaemonConfig.model_validate(yaml.safe_load(fleet.config.read_text()))
    rt = build_runtime(cfg, clock=clock, environ={}, election_clock=clock)
    rt.daemon.metrics_source = FileLoad(fleet.load)
    rt.daemon.reload_policies()
    return rt, clock


def tick(rt: Runtime, clock: ManualClock, fleet: Fleet, queue: float) -> TickReport:
    fleet.set_load(queue)
    clock.advance(5)
    return rt.daemon.tick()


def test_postgresql_stopped_mid_run_loses_no_decision_and_releases_nothing(
        kube: KubePeer, tmp_path: Path, own_postgres: OwnPostgres) -> None:
    journal = tmp_path / "journal" / "intents.jsonl"
    journal.parent.mkdir()
    fleet = Fleet(kube, tmp_path, own_postgres.url, replicas=4, journal_path=str(journal))
    fleet.raw["leader_election"] = {"backend": "none"}  # the advisory lock would stand the daemon down
    fleet.config.write_text(yaml.safe_dump(fleet.raw))
    rt, clock = manual_daemon(fleet)
    try:
        assert tick(rt, clock, fleet, 4).ok
        own_postgres.stop()
        # 30 s of the daemon's clock without a database: the load rises (scale-up acts), then
        # falls (the scale-down is decided and journaled, but nothing is released)
        gap = [tick(rt, clock, fleet, q) for q in (12, 12, 12, 2, 2, 2)]
        assert all(r.journaled for r in gap), [r.errors for r in gap]
        assert journal.exists()
        # users see it: the daemon's own metrics and /v1/status (which answers without the
        # database, for the status page's flag) show what waits in the journal, since when and why
        waiting = journal.stat().st_size
        kinds = [e["kind"] for e in Journal(journal).entries()]
        status = rt.daemon.status()["journal"]
        assert status == rt.daemon.journal_status()
        assert {k: v for k, v in status.items() if k != "database_error"} == {
            "path": str(journal), "bytes": waiting, "decisions": 6, "outcomes": kinds.count("outcome"),
            "since": (T0 + timedelta(seconds=10)).isoformat(), "replaying": False}
        assert kinds.count("intent") == 6 and status["database_error"], status
        assert f"tidegate_journal_bytes {float(waiting)}" in rt.daemon.metrics.render().decode()
        assert fleet.replica_history() == [4, 12], "the scale-up happened, nothing was released"
        assert gap[3].decisions["llama"].replicas < 12, "a scale-down was decided in the gap"
        own_postgres.start()
        back = tick(rt, clock, fleet, 2)
        assert back.ok and not back.journaled, back.errors
        assert not journal.exists(), "the journal is removed once replayed"
        assert rt.daemon.status()["journal"] == {"path": str(journal), "bytes": 0, "decisions": 0, "outcomes": 0,
                                                 "since": None, "replaying": False, "database_error": None}
        assert "tidegate_journal_bytes 0.0" in rt.daemon.metrics.render().decode()
        repo = rt.daemon.repo
        rows = decisions(repo)
        ats = [datetime.fromisoformat(d["at"]) for d in rows]
        assert ats == [T0 + timedelta(seconds=5 * i) for i in range(1, 9)], "every tick once, in order"
        gap_rows = rows[1:7]
        assert [d["replicas"] for d in gap_rows] == [r.decisions["llama"].replicas for r in gap]
        assert [d["outcome"] for d in gap_rows[:3]] == ["applied", "skipped", "skipped"]
        held = repo.get_decision(gap_rows[3]["id"]) or {}
        assert held["outcome"] in ("skipped", "partial") and "not released" in (held["outcome_detail"] or "")
        # replaying the same journal again (a kill between the commit and the removal) adds nothing
        assert repo.replay_journal(repo.list_journal_replays()[0]["journal_id"], lambda offset: [], clock.now()
                                   ) == ReplayProgress(0, True)
    finally:
        rt.stop()


def test_an_intent_left_in_the_journal_by_a_dead_daemon_is_replayed_then_reconciled(
        kube: KubePeer, tmp_path: Path) -> None:
    """The daemon died after journaling an intent (the database away) and scaling 4 -> 12, before
    its outcome: the next daemon replays the journal, then finds the step applied."""
    journal = tmp_path / "intents.jsonl"
    fleet = Fleet(kube, tmp_path, f"sqlite:///{tmp_path / 'tidegate.db'}", replicas=12, journal_path=str(journal))
    at = T0 - timedelta(seconds=5)
    step = replace(decision_for("llama", at, current=4, replicas=12,
                                history=History(scale_events=(ScaleEvent(at, 4, 12),))),
                   placement={"onprem": 12}, previous_placement={"onprem": 4})
    Journal(journal).append_intents([(step, signals_for("llama", at))], dry_run=False)
    rt, clock = manual_daemon(fleet)
    try:
        first = tick(rt, clock, fleet, 12)
        assert first.ok, first.errors
        assert not journal.exists()
        replayed = decisions(rt.daemon.repo)[0]
        assert (replayed["at"], replayed["replicas"], replayed["outcome"]) == (at.isoformat(), 12, "applied")
        assert "reconciled at start" in (rt.daemon.repo.get_decision(replayed["id"]) or {})["outcome_detail"]
        assert rt.daemon.controller.histories["llama"].scale_events[0] == ScaleEvent(at, 4, 12)
    finally:
        rt.stop()


def test_a_journal_a_daemon_left_before_its_upgrade_is_replayed_by_the_new_one(kube: KubePeer, tmp_path: Path) -> None:
    """A daemon of the previous journal format (one intent a line: ``journal_v1.jsonl``, written
    by commit 0cb5a40's ``Journal`` for two ticks, 4 -> 12 with its outcome, then 12 -> 16 without:
    it died after scaling) is replaced by this one during the outage: the new daemon replays the
    old lines in order, once, and settles the intent left pending by what runs."""
    journal = tmp_path / "intents.jsonl"
    shutil.copy(Path(__file__).with_name("journal_v1.jsonl"), journal)
    fleet = Fleet(kube, tmp_path, f"sqlite:///{tmp_path / 'tidegate.db'}", replicas=16, journal_path=str(journal))
    rt, clock = manual_daemon(fleet)
    try:
        first = tick(rt, clock, fleet, 16)
        assert first.ok, first.errors
        assert not journal.exists()
        repo = rt.daemon.repo
        up, more, now = (repo.get_decision(d["id"]) or {} for d in decisions(repo))
        assert [(d["at"], d["replicas"]) for d in (up, more)] == [
            ((T0 - timedelta(seconds=10)).isoformat(), 12), ((T0 - timedelta(seconds=5)).isoformat(), 16)]
        assert (up["outcome"], [a["arguments"] for a in up["actions"]]) == ("applied", [{"replicas": 12}])
        assert (more["outcome"], more["outcome_detail"]) == ("applied", "reconciled at start: applied")
        assert now["replicas"] == 16 and len(repo.list_journal_replays()) == 1
        assert rt.daemon.controller.histories["llama"].scale_events[:2] == (
            ScaleEvent(T0 - timedelta(seconds=10), 4, 12), ScaleEvent(T0 - timedelta(seconds=5), 12, 16))
    finally:
        rt.stop()


# --- nowhere to record: the disk-full case -----------------------------------------------------


def _full(engine: sa.engine.Engine, limit: dict[str, int]) -> None:
    @sa.event.listens_for(engine, "connect")
    def _limit(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute(f"PRAGMA max_page_count={limit['pages']}")


@pytest.mark.parametrize("journal", ["none", "full"])
def test_a_full_decision_log_acts_on_nothing_it_cannot_record(kube: KubePeer, tmp_path: Path, journal: str) -> None:
    """The SQLite file may not grow (``max_page_count`` two pages past its size, then filled by
    another table, then by steady decisions); the journal is absent or refuses writes
    (``/dev/full``): the load's scale-up waits until its decision can be written."""
    db = tmp_path / "full.db"
    extra = {"journal_path": "/dev/full"} if journal == "full" else {}
    fleet = Fleet(kube, tmp_path, f"sqlite:///{db}", replicas=4, **extra)
    rt, clock = manual_daemon(fleet)
    try:
        assert tick(rt, clock, fleet, 4).ok
        limit = {"pages": 2**30}
        engine = make_engine(f"sqlite:///{db}")
        _full(engine, limit)
        with engine.connect() as conn:
            limit["pages"] = int(conn.exec_driver_sql("PRAGMA page_count").scalar() or 0) + 2
        engine.dispose()  # every new connection meets the limit
        with engine.connect() as conn:  # fill it to the limit, as another writer on the disk would
            conn.exec_driver_sql("CREATE TABLE filler (b BLOB)")
            conn.commit()
            for size in (512, 64, 8):  # down to the last few bytes of the last page
                with contextlib.suppress(sa.exc.OperationalError):
                    for _ in range(10_000):
                        conn.exec_driver_sql(f"INSERT INTO filler VALUES (zeroblob({size}))")
                        conn.commit()
                conn.rollback()
        rt.daemon.controller.recorder.repo = Repository(engine)
        # rows still fit in the pages the log has; steady ticks fill them
        for _ in range(500):
            if tick(rt, clock, fleet, 4).errors:
                break
        else:
            pytest.fail("the decision log never filled up")
        refused = [tick(rt, clock, fleet, 12) for _ in range(3)]
        assert all(not r.decisions and r.errors for r in refused)
        assert any(words in refused[0].errors["llama"] for words in ("disk is full", "No space left")), refused[0].errors
        assert fleet.replica_history() == [4], "no scale went out without its decision row"
        limit["pages"] = 2**30
        engine.dispose()
        ok = tick(rt, clock, fleet, 12)
        while ok.skipped is not None:  # the daemon backs off after ticks that failed for every model
            ok = tick(rt, clock, fleet, 12)
        assert ok.ok, ok.errors
        assert fleet.replica_history() == [4, 12]
        row = Repository(f"sqlite:///{db}").get_decision(ok.decision_ids["llama"]) or {}
        assert (row["replicas"], row["outcome"]) == (12, "applied")
    finally:
        rt.stop()


# --- no intent stays pending -------------------------------------------------------------------


@pytest.mark.parametrize("running, outcome, words", [(12, "applied", "applied"), (4, "failed", "not applied")])
def test_an_intent_older_than_the_history_window_is_settled_at_start(
        kube: KubePeer, tmp_path: Path, db_url: str, running: int, outcome: str, words: str) -> None:
    """A daemon died two hours ago between its intent (4 -> 12) and its outcome, and nothing acted
    on the model since: the intent weighs on no window (the policy looks back 60 s), but the next
    daemon settles it all the same, by what runs now, and says how old it was."""
    fleet = Fleet(kube, tmp_path, db_url, replicas=running)
    upgrade(db_url)
    repo = Repository(db_url)
    try:
        at = T0 - timedelta(hours=2)
        earlier = replace(decision_for("llama", at - timedelta(seconds=5), current=4, replicas=4),
                          placement={"onprem": 4}, previous_placement={"onprem": 4})
        step = replace(decision_for("llama", at, current=4, replicas=12,
                                    history=History(scale_events=(ScaleEvent(at, 4, 12),))),
                       placement={"onprem": 12}, previous_placement={"onprem": 4})
        settled, intent = (repo.record_decisions([(d, signals_for("llama", d.at), False)])[0] for d in (earlier, step))
        repo.record_outcomes([(settled, [], "applied", None, None)])
        assert [d["outcome"] for d in decisions(repo)] == ["applied", "pending"]
    finally:
        repo.close()
    rt, clock = manual_daemon(fleet)
    try:
        first = tick(rt, clock, fleet, running)
        assert first.ok, first.errors
        row = rt.daemon.repo.get_decision(intent) or {}
        assert row["outcome"] == outcome
        assert row["outcome_detail"] == (f"reconciled at start: {words} (7205 s after the intent, older than the "
                                         "history window; judged by what runs now)")
        assert not rt.daemon.repo.pending_decisions(), "nothing left pending"
        # two hours old: the step weighs on no rate limit of the restarted daemon
        assert rt.daemon.controller.histories["llama"].scale_events == ()
    finally:
        rt.stop()


def test_an_outcome_the_database_refused_is_reconciled_at_the_next_tick(kube: KubePeer, tmp_path: Path) -> None:
    """The database takes a tick's intent (4 -> 12) but refuses to write its outcome (a trigger
    refuses the update): the scale went out; the next tick finds the intent pending and settles it
    by what runs, instead of leaving it pending until a restart."""
    db = tmp_path / "tidegate.db"
    fleet = Fleet(kube, tmp_path, f"sqlite:///{db}", replicas=4)
    rt, clock = manual_daemon(fleet)
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        assert tick(rt, clock, fleet, 4).ok
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TRIGGER refuse_outcomes BEFORE INSERT ON decision_outcomes "
                                 "BEGIN SELECT RAISE(ABORT, 'outcomes refused by the test'); END")
        refused = tick(rt, clock, fleet, 12)
        assert "outcomes refused by the test" in refused.errors["llama"], refused.errors
        assert fleet.replica_history() == [4, 12], "the scale went out after its intent was written"
        intent = refused.decision_ids["llama"]
        assert (rt.daemon.repo.get_decision(intent) or {})["outcome"] == "pending"
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER refuse_outcomes")
        after = tick(rt, clock, fleet, 12)
        assert after.ok, after.errors
        row = rt.daemon.repo.get_decision(intent) or {}
        assert (row["outcome"], row["outcome_detail"]) == (
            "applied", "reconciled after its outcome could not be written: applied")
        assert row["scale_event"]["to_replicas"] == 12
        assert not rt.daemon.repo.pending_decisions()
    finally:
        engine.dispose()
        rt.stop()
