"""The decision log's repository against real databases (a SQLite file and PostgreSQL)."""

from __future__ import annotations

import random
import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from controller.core.model import (
    Action,
    ActionStatus,
    Decision,
    History,
    ModelSignals,
    Opinion,
    OverrideKind,
    PoolState,
    Recommendation,
    Sample,
    ScaleEvent,
    Stage,
)
from controller.core.reasons import Reason
from controller.db.migrate import upgrade
from controller.db.repo import Repository, make_engine

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
CEST = timezone(timedelta(hours=2))


def signals_for(model: str, at: datetime) -> ModelSignals:
    return ModelSignals(
        model=model,
        at=at,
        queue_depth=Sample(12.0, at - timedelta(seconds=3)),
        p99_latency_ms=Sample(850.5, at - timedelta(seconds=3)),
        gpu_utilization_pct=Sample.missing("NoData"),
        request_rate_per_s=Sample(7.25, at - timedelta(seconds=4)),
        output_tokens_per_s=Sample(1900.0, at - timedelta(seconds=4)),
        pools={
            "onprem": PoolState("onprem", replicas=2, ready_replicas=2, nodes=1, at=at),
            "aws-spot": PoolState(
                "aws-spot",
                replicas=1,
                ready_replicas=0,
                nodes=1,
                available=False,
                unavailable_reason="SpotPoolUnavailable",
                interrupted_replicas=1,
                recent_interruptions=2,
                price_per_node_hour_usd=3.1,
                at=at,
            ),
        },
    )


def decision_for(
    model: str,
    at: datetime,
    *,
    current: int = 3,
    replicas: int = 4,
    history: History | None = None,
    policy_version: str = "sha256:abc",
) -> Decision:
    return Decision(
        model=model,
        at=at,
        current_replicas=current,
        replicas=replicas,
        placement={"onprem": 2, "aws-spot": replicas - 2},
        previous_placement={"onprem": 2, "aws-spot": current - 2},
        recommendations=(
            Recommendation("latency", "slo-guard", replicas, Reason.LATENCY_ABOVE_TARGET.value, "p99 850 ms > 800 ms"),
            Recommendation(
                "warm",
                "schedule",
                2,
                Reason.SCHEDULE_WINDOW.value,
                opinion=Opinion.FLOOR,
                state={"window_started_at": at - timedelta(minutes=5), "ewma": 0.5},
            ),
            Recommendation("util", "target-utilization", None, Reason.METRIC_MISSING.value, missing_data=True),
        ),
        trace=(
            Stage("recommend", replicas, Reason.MAX_OF_RECOMMENDATIONS.value, "max(4, 2)"),
            Stage("stabilize", replicas, Reason.SCALE_UP_STABILIZED.value),
            Stage("place", replicas, Reason.PLACED.value, "onprem 2, aws-spot 2"),
        ),
        reason=Reason.PLACED.value,
        actuate=True,
        cost_per_hour_usd=7.5,
        policy_version=policy_version,
        history=history if history is not None else History(),
        interrupted_replaced=1,
    )


def record(repo: Repository, decision: Decision, dry_run: bool = False) -> int:
    return repo.record_decision(decision, signals_for(decision.model, decision.at), dry_run)


# --- decisions -----------------------------------------------------------------------------------


def test_full_decision_round_trip_keeps_values_and_aware_times(repo: Repository) -> None:
    at = datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=CEST)  # 12:00:00.123456 UTC
    history = History(
        recommendations=((at - timedelta(seconds=30), 3), (at, 4)),
        scale_events=(ScaleEvent(at, 3, 4),),
        rule_state={"latency": {"last_breach_at": at, "count": 2}},
    )
    decision = decision_for("llama", at, history=history)
    signals = signals_for("llama", at)
    actions = [
        Action("kubernetes", "scale_deployment", "aws-spot", "llama", {"replicas": 2, "at": at}, ActionStatus.OK, latency_ms=12.5),
        Action("aws", "set_desired_capacity", "aws-spot", "llama", {"desired": 1}, ActionStatus.FAILED_TRANSIENT, "Throttling", 80.0),
    ]
    decision_id = repo.record_decision(decision, signals, dry_run=False)
    assert repo.get_decision(decision_id)["outcome"] == "pending"  # type: ignore[index]
    repo.record_actions(decision_id, actions, "partial", "1 of 2 calls failed")

    loaded = repo.load_decision(decision_id)
    assert loaded is not None
    got_decision, got_signals, got_actions = loaded
    # The log keeps what this tick added to the history (older points live in older rows).
    this_tick = History(recommendations=((at, 4),), scale_events=(ScaleEvent(at, 3, 4),), rule_state=history.rule_state)
    assert got_decision == replace(decision, history=this_tick)
    assert got_signals == signals
    assert got_actions == actions
    for value in (got_decision.at, got_signals.at, got_signals.p99_latency_ms.at, got_decision.history.rule_state["latency"]["last_breach_at"]):
        assert value is not None and value.utcoffset() == timedelta(0)
    assert got_decision.at == at

    full = repo.get_decision(decision_id)
    assert full is not None
    assert full["at"] == "2024-05-01T12:00:00.123456+00:00"
    assert (full["outcome"], full["outcome_detail"], full["dry_run"]) == ("partial", "1 of 2 calls failed", False)
    assert [a["status"] for a in full["actions"]] == ["ok", "failed-transient"]
    assert full["actions"][1]["error"] == "Throttling"
    assert full["actions"][0]["at"] == full["at"]
    assert [s["reason"] for s in full["trace"]] == [s.reason for s in decision.trace]
    assert full["signals"]["gpu_utilization_pct"] == {"value": None, "at": None, "reason": "NoData"}
    assert repo.get_decision(decision_id + 1000) is None


def test_record_actions_validates_outcome_and_decision(repo: Repository) -> None:
    decision_id = record(repo, decision_for("m", T0))
    with pytest.raises(ValueError, match="outcome"):
        repo.record_actions(decision_id, [], "done")
    with pytest.raises(LookupError):
        repo.record_actions(decision_id + 1000, [], "applied")
    repo.record_actions(decision_id, [], "skipped", "frozen")
    assert repo.list_decisions()[0]["outcome"] == "skipped"


def test_naive_timestamps_are_refused(repo: Repository) -> None:
    naive = datetime(2024, 5, 1, 12, 0)
    with pytest.raises(ValueError, match="naive"):
        record(repo, replace(decision_for("m", T0), at=naive))


def test_list_decisions_pages_newest_first_by_id(repo: Repository) -> None:
    ids = {"a": [], "b": []}  # type: dict[str, list[int]]
    for i in range(7):
        for model in ("a", "b"):
            ids[model].append(record(repo, decision_for(model, T0 + timedelta(seconds=5 * i))))

    pages: list[list[int]] = []
    before: int | None = None
    while True:
        page = repo.list_decisions(model="a", limit=3, before_id=before)
        if not page:
            break
        pages.append([d["id"] for d in page])
        before = page[-1]["id"]
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for p in pages for i in p] == sorted(ids["a"], reverse=True)

    everything = repo.list_decisions(limit=100)
    assert [d["id"] for d in everything] == sorted(ids["a"] + ids["b"], reverse=True)
    summary = everything[0]
    assert set(summary) == {
        "id", "model", "at", "replicas", "current_replicas", "placement", "reason",
        "actuate", "dry_run", "outcome", "policy_version", "cost_per_hour_usd",
    }
    with pytest.raises(ValueError):
        repo.list_decisions(limit=0)


def test_list_decisions_time_range_is_half_open(repo: Repository) -> None:
    times = [T0 + timedelta(seconds=10 * i) for i in range(6)]
    by_time = {t: record(repo, decision_for("m", t)) for t in times}
    since, until = times[1], times[4]
    # Filters given in another zone mean the same instants.
    got = repo.list_decisions(model="m", since=since.astimezone(CEST), until=until.astimezone(CEST))
    assert [d["id"] for d in got] == [by_time[t] for t in reversed(times) if since <= t < until]
    assert repo.list_decisions(model="m", since=times[-1] + timedelta(microseconds=1)) == []
    assert [d["id"] for d in repo.list_decisions(model="other")] == []


def test_all_decisions_oldest_first_with_actions(repo: Repository) -> None:
    ids = [record(repo, decision_for("m" if i % 2 else "n", T0 + timedelta(seconds=i))) for i in range(5)]
    repo.record_actions(ids[1], [Action("k8s", "scale", "onprem", "m", {"replicas": 2}, ActionStatus.OK)], "applied")
    got = list(repo.all_decisions())
    assert [d["id"] for d in got] == ids
    assert [d["id"] for d in repo.all_decisions(model="m")] == [ids[1], ids[3]]
    assert [a["call"] for a in got[1]["actions"]] == ["scale"]


def test_last_placement(repo: Repository) -> None:
    assert repo.last_placement("m") is None
    first = record(repo, decision_for("m", T0, replicas=3))
    repo.record_actions(first, [], "applied")
    record(repo, decision_for("m", T0 + timedelta(seconds=5), replicas=5), dry_run=True)
    assert repo.last_placement("m") == {"onprem": 2, "aws-spot": 3}
    assert repo.last_placement("m", applied_only=True) == {"onprem": 2, "aws-spot": 1}


# --- restart: history ----------------------------------------------------------------------------


def run_pipeline_like(repo: Repository, model: str, start: datetime, ticks: int, seed: int) -> list[History]:
    """Record ``ticks`` decisions the way the daemon does: the history is carried from tick to tick
    (a recommendation point per tick, a scale event when the total changes, trimmed to a window)
    and each decision carries the history after its tick. Returns the histories."""
    rng = random.Random(seed)
    window_s = 300.0
    history = History()
    current = 3
    out = []
    for i in range(ticks):
        at = start + timedelta(seconds=15 * i)
        rec = max(1, current + rng.choice((-2, -1, 0, 0, 1, 2)))
        keep_after = at - timedelta(seconds=window_s)
        points = tuple(p for p in history.recommendations if p[0] >= keep_after)
        # Some ticks have no recommendation (missing data): no point for that tick.
        if i % 7 != 3:
            points += ((at, rec),)
        events = tuple(e for e in history.scale_events if e.at >= keep_after)
        decided = rec if i % 7 != 3 else current
        if decided != current:
            events += (ScaleEvent(at, current, decided),)
        history = History(points, events, {"queue": {"ewma": rng.random(), "seen_at": at}})
        record(repo, decision_for(model, at, current=max(current, 2), replicas=max(decided, 2), history=history))
        current = decided
        out.append(history)
    return out


def test_rebuild_history_reproduces_the_window_and_drops_older_entries(repo: Repository) -> None:
    histories = run_pipeline_like(repo, "m", T0, ticks=30, seed=11)
    run_pipeline_like(repo, "other", T0, ticks=30, seed=12)  # must not leak into "m"
    last = histories[-1]
    now = T0 + timedelta(seconds=15 * 29)
    horizon_s = 120.0
    cutoff = now - timedelta(seconds=horizon_s)

    rebuilt = repo.rebuild_history("m", now, horizon_s)

    assert rebuilt.recommendations == tuple(p for p in last.recommendations if p[0] >= cutoff)
    assert rebuilt.scale_events == tuple(e for e in last.scale_events if e.at >= cutoff)
    assert rebuilt.rule_state == last.rule_state
    assert rebuilt.recommendations and all(at >= cutoff for at, _ in rebuilt.recommendations)
    # Over the daemon's whole window the restart sees exactly what the running daemon had.
    assert repo.rebuild_history("m", now, 300.0) == last


def test_rebuild_history_as_of_an_earlier_instant(repo: Repository) -> None:
    histories = run_pipeline_like(repo, "m", T0, ticks=20, seed=5)
    k = 12
    now = T0 + timedelta(seconds=15 * k)
    rebuilt = repo.rebuild_history("m", now, 300.0)
    assert rebuilt == histories[k]  # later decisions are ignored
    assert repo.rebuild_history("m", T0 - timedelta(seconds=1), 300.0) == History()
    assert repo.rebuild_history("unknown", now, 300.0) == History()


# --- overrides and audit -------------------------------------------------------------------------


def test_override_ttl_expires_by_itself(repo: Repository) -> None:
    pin = repo.add_override(OverrideKind.PIN, "m", replicas=6, ttl_s=60, reason="load test", author="ana", now=T0)
    forever = repo.add_override("freeze", "n", reason="incident", author="bo", now=T0)
    assert pin.expires_at == T0 + timedelta(seconds=60)
    assert pin.created_at == T0 and pin.id != forever.id

    at_30 = T0 + timedelta(seconds=30)
    at_61 = T0 + timedelta(seconds=61)
    assert repo.active_overrides(at_30, model="m") == [pin]
    assert repo.active_overrides(at_61, model="m") == []
    assert pin.active(at_30) and not pin.active(at_61)
    assert repo.active_overrides(at_61) == [forever]

    assert [o["id"] for o in repo.list_overrides(include_inactive=False, now=at_61)] == [forever.id]
    listed = {o["id"]: o for o in repo.list_overrides(include_inactive=True, now=at_61)}
    assert (listed[pin.id]["status"], listed[pin.id]["active"]) == ("expired", False)
    assert listed[forever.id]["status"] == "active"


def test_override_validation(repo: Repository) -> None:
    with pytest.raises(ValueError, match="not both"):
        repo.add_override("pin", "m", replicas=1, ttl_s=5, expires_at=T0 + timedelta(hours=1), now=T0)
    with pytest.raises(ValueError, match="needs replicas"):
        repo.add_override("pin", "m", now=T0)
    with pytest.raises(ValueError, match="min_replicas 5 > max_replicas 2"):
        repo.add_override("bounds", "m", min_replicas=5, max_replicas=2, now=T0)
    with pytest.raises(ValueError, match="not after now"):
        repo.add_override("freeze", "m", expires_at=T0, now=T0)
    assert repo.list_overrides(include_inactive=True, now=T0) == []


def test_soft_delete_keeps_the_override_and_its_audit(repo: Repository) -> None:
    o = repo.add_override("drain-pool", "m", pool="aws-spot", ttl_s=3600, reason="spot storm", author="ana", now=T0)
    repo.audit("ana", "override.create", f"override/{o.id}", {"kind": "drain-pool", "pool": "aws-spot"}, T0)
    later = T0 + timedelta(minutes=5)

    assert repo.delete_override(o.id, "bo", later) is True
    repo.audit("bo", "override.delete", f"override/{o.id}", None, later)
    assert repo.delete_override(o.id, "bo", later) is False
    assert repo.delete_override(o.id + 1000, "bo", later) is False

    assert repo.active_overrides(later) == []
    kept = repo.get_override(o.id, later)
    assert kept is not None
    assert (kept["status"], kept["deleted_by"], kept["deleted_at"]) == ("deleted", "bo", later.isoformat())
    assert kept["reason"] == "spot storm" and kept["pool"] == "aws-spot"

    audit = repo.list_audit(limit=10)
    assert [(a["author"], a["action"]) for a in audit] == [("bo", "override.delete"), ("ana", "override.create")]
    assert audit[1]["detail"] == {"kind": "drain-pool", "pool": "aws-spot"}
    assert audit[1]["at"] == T0.isoformat()
    assert [a["id"] for a in repo.list_audit(limit=10, before_id=audit[0]["id"])] == [audit[1]["id"]]


# --- policy versions -----------------------------------------------------------------------------


def test_policy_versions_are_deduplicated(repo: Repository) -> None:
    sources = [{"path": "policies/llama.yaml", "sha256": "aa"}]
    assert repo.record_policy_version("llama", "v1", sources, "kind: slo-guard\n", T0) is True
    assert repo.record_policy_version("llama", "v1", sources, "kind: slo-guard\n", T0 + timedelta(seconds=9)) is False
    assert repo.record_policy_version("llama", "v2", sources, "kind: queue-depth\n", T0 + timedelta(seconds=10)) is True
    assert repo.record_policy_version("mistral", "v1", [], "", T0 + timedelta(seconds=20)) is True

    llama = repo.list_policy_versions("llama")
    assert [(v["version"], v["first_seen_at"]) for v in llama] == [
        ("v2", (T0 + timedelta(seconds=10)).isoformat()),
        ("v1", T0.isoformat()),  # the first sighting, not the repeat
    ]
    assert llama[1]["sources"] == sources and llama[0]["content"] == "kind: queue-depth\n"
    assert len(repo.list_policy_versions()) == 3


# --- restart and threads -------------------------------------------------------------------------


def test_data_survives_closing_and_reopening(migrated_db_url: str) -> None:
    first = Repository(migrated_db_url)
    histories = run_pipeline_like(first, "m", T0, ticks=8, seed=3)
    pin = first.add_override("pin", "m", replicas=4, ttl_s=600, author="ana", now=T0)
    last_id = first.list_decisions(limit=1)[0]["id"]
    before = first.get_decision(last_id)
    first.close()

    second = Repository(migrated_db_url)
    try:
        now = T0 + timedelta(seconds=15 * 7)
        assert second.get_decision(last_id) == before
        assert second.active_overrides(now) == [pin]
        assert second.rebuild_history("m", now, 300.0) == histories[-1]
        next_id = record(second, decision_for("m", now + timedelta(seconds=15)))
        assert next_id > last_id
        if second.engine.dialect.name == "sqlite":
            with second.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        second.close()


def test_concurrent_writers_and_readers(repo: Repository) -> None:
    # The daemon's tick thread and the API's threads share one repository.
    errors: list[BaseException] = []
    ids: list[int] = []
    lock = threading.Lock()

    def writer(worker: int) -> None:
        try:
            for i in range(10):
                decision_id = record(repo, decision_for(f"w{worker}", T0 + timedelta(seconds=i)))
                repo.record_actions(decision_id, [], "applied")
                repo.audit(f"w{worker}", "test.write", str(decision_id), {"i": i}, T0)
                with lock:
                    ids.append(decision_id)
        except BaseException as e:  # noqa: BLE001 - reported to the main thread below
            errors.append(e)

    def reader() -> None:
        try:
            for _ in range(10):
                repo.list_decisions(limit=5)
                repo.active_overrides(T0)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(set(ids)) == 40
    assert len(list(repo.all_decisions())) == 40
    with repo.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM audit_log")).scalar() == 40


def test_in_memory_sqlite_through_an_engine() -> None:
    # An in-memory database exists per connection: migrate it through the very engine the
    # repository uses (one shared connection), from another thread too.
    engine = make_engine("sqlite://")
    try:
        upgrade(engine)
        repo = Repository(engine)
        result: list[int] = []
        worker = threading.Thread(target=lambda: result.append(record(repo, decision_for("m", T0))))
        worker.start()
        worker.join(timeout=30)
        assert [d["id"] for d in repo.list_decisions()] == result
        repo.close()  # leaves the caller's engine alone
        assert Repository(engine).list_decisions()[0]["id"] == result[0]
    finally:
        engine.dispose()


def test_abandoned_decisions_are_each_models_newest_when_old_and_pending(repo: Repository) -> None:
    """What a start settles beyond its history window: a model's newest decision, when it is older
    than the window and still pending; over more models than one lookup query takes (600)."""
    old, new = T0 - timedelta(hours=2), T0
    names = [f"m{i:03d}" for i in range(600)]
    ids = repo.record_decisions([(decision_for(m, old), signals_for(m, old), False) for m in names])
    abandoned = {"m000", "m250", "m499", "m500", "m599"}  # both sides of the 500-model query boundary
    repo.record_outcomes([(i, [], "applied", None, None) for m, i in zip(names, ids) if m not in abandoned])
    # m250 was decided again since (still pending): its old intent is not its newest, its new one
    # is within the window; m001's newest is settled
    _, m001 = repo.record_decisions([(decision_for("m250", new), signals_for("m250", new), False),
                                     (decision_for("m001", new), signals_for("m001", new), False)])
    repo.record_outcomes([(m001, [], "applied", None, None)])
    found = repo.abandoned_decisions(names, before=T0 - timedelta(hours=1))
    assert [r["model"] for r in found] == ["m000", "m499", "m500", "m599"]
    assert all(r["at"].replace(tzinfo=timezone.utc) == old for r in found)
