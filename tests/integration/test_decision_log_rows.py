"""The decision log's rows: small (no-op calls counted, the bulky part compressed against the
previous row of the model, rule state stored once), still exact on reading, old rows still
readable, a tick's writes in one transaction each, and pages of one model read by index."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from controller.controller import Outcome
from controller.core.model import Action, ActionStatus, History, ScaleEvent
from controller.db import codec, payload
from controller.db.migrate import upgrade
from controller.db.recorder import RepositoryRecorder
from controller.db.repo import Repository
from tests.integration.test_db_repo import decision_for, signals_for

T0 = datetime(2026, 11, 2, tzinfo=timezone.utc)


def ticking(model: str, i: int):  # noqa: ANN201 - a decision as the pipeline makes them
    at = T0 + timedelta(seconds=5 * i)
    state = {"samples": [[float(j), 1.5 * j] for j in range(max(0, i - 40), i + 1)]}
    d = decision_for(model, at, current=3, replicas=3 + i % 3,
                     history=History(recommendations=((at, 3 + i % 3),), scale_events=(ScaleEvent(at, 3, 3 + i % 3),),
                                     rule_state={"latency": state}))
    recs = tuple(replace(r, state=state) if r.rule == "latency" else r for r in d.recommendations)
    return replace(d, recommendations=recs)


def test_rows_decode_exactly_through_payload_chains_keyframes_and_a_restart(migrated_db_url: str) -> None:
    repo = Repository(migrated_db_url)
    n = payload.KEYFRAME_EVERY * 2 + 5
    made = {}
    for i in range(n):  # two models interleaved, a tick's rows written together
        items = [(ticking(m, i), signals_for(m, T0 + timedelta(seconds=5 * i)), False) for m in ("a", "b")]
        for (d, _, _), decision_id in zip(items, repo.record_decisions(items)):
            made[decision_id] = d
    repo.close()
    repo = Repository(migrated_db_url)  # a restarted reader knows no chain
    try:
        for decision_id, d in list(made.items())[:: 7]:
            got = repo.load_decision(decision_id)
            assert got is not None and got[0].recommendations == d.recommendations and got[0].trace == d.trace
            assert got[0].history.rule_state == d.history.rule_state
        with repo.engine.connect() as c:
            rows = c.execute(sa.text("SELECT id, payload_prev, payload_base FROM decisions WHERE model = 'a' ORDER BY id")).all()
        keyframes = [r.id for r in rows if r.payload_prev is None]
        assert len(keyframes) == 3, "a keyframe every KEYFRAME_EVERY rows of a model"
        assert [d["id"] for d in repo.all_decisions(model="b")] == [i for i, d in made.items() if d.model == "b"]
        last = max(i for i, d in made.items() if d.model == "a")
        h = repo.rebuild_histories({"a": 60, "b": 60}, T0 + timedelta(seconds=5 * n))
        assert h["a"].rule_state == made[last].history.rule_state
        # the writer restarted too: its next row is a keyframe, and old chains stay readable
        new = repo.record_decisions([(ticking("a", n), signals_for("a", T0 + timedelta(seconds=5 * n)), False)])[0]
        with repo.engine.connect() as c:
            assert c.execute(sa.text(f"SELECT payload_prev FROM decisions WHERE id = {new}")).scalar() is None
    finally:
        repo.close()


def test_one_batch_with_a_model_more_than_once_chains_each_row_to_its_models_previous(migrated_db_url: str) -> None:
    # A journal replay writes several ticks of a model in one batch: each row is compressed
    # against the row of its model just before it, written in the same transaction.
    repo = Repository(migrated_db_url)
    try:
        order = ["a", "b", "a", "a", "b", "c", "a"]
        items = [(ticking(m, i), signals_for(m, T0 + timedelta(seconds=5 * i)), False) for i, m in enumerate(order)]
        ids = repo.record_decisions(items)
        with repo.engine.connect() as c:
            prev = dict(c.execute(sa.text("SELECT id, payload_prev FROM decisions")).all())
        last: dict[str, int] = {}
        for m, decision_id in zip(order, ids):
            assert prev[decision_id] == last.get(m)
            last[m] = decision_id
        for (d, _, _), decision_id in zip(items, ids):
            got = repo.load_decision(decision_id)
            assert got is not None and got[0].recommendations == d.recommendations
            assert got[0].history.rule_state == d.history.rule_state
    finally:
        repo.close()


def test_rows_written_before_the_payload_format_still_decode(db_url: str) -> None:
    upgrade(db_url, "0001")
    d = ticking("old", 3)
    sig = signals_for("old", d.at)
    engine = sa.create_engine(db_url)
    with engine.begin() as c:
        c.execute(sa.text(
            "INSERT INTO decisions (model, at, policy_version, dry_run, actuate, current_replicas, replicas, reason,"
            " placement, previous_placement, signals, recommendations, trace, cost_per_hour_usd, interrupted_replaced,"
            " stabilization_replicas, scale_from_replicas, scale_to_replicas, rule_state, outcome, outcome_detail)"
            " VALUES (:model, :at, '', false, true, 3, 6, 'Placed', :pl, :ppl, :sig, :recs, :trace, 7.5, 0, 6, 3, 6,"
            " :state, 'applied', NULL)"),
            {"model": "old", "at": d.at.replace(tzinfo=None) if db_url.startswith("sqlite") else d.at,
             "pl": json.dumps(d.placement), "ppl": json.dumps(d.previous_placement),
             "sig": json.dumps(codec.signals_to_json(sig)),
             "recs": json.dumps([codec.recommendation_to_json(r) for r in d.recommendations]),
             "trace": json.dumps([codec.stage_to_json(s) for s in d.trace]),
             "state": json.dumps(codec.to_jsonable(d.history.rule_state))})
    engine.dispose()
    upgrade(db_url)
    repo = Repository(db_url)
    try:
        old_id = repo.list_decisions(model="old")[0]["id"]
        got = repo.load_decision(old_id)
        assert got is not None and got[0].recommendations == d.recommendations and got[1] == sig
        assert repo.rebuild_history("old", d.at, 60).rule_state == d.history.rule_state
    finally:
        repo.close()


def test_noop_calls_are_counted_not_stored(repo: Repository) -> None:
    d = ticking("m", 1)
    decision_id = repo.record_decision(d, signals_for("m", d.at), False)
    calls = [Action("kubernetes", "scale", "onprem", "m", {"replicas": 2}, ActionStatus.NOOP),
             Action("aws", "set_desired_capacity", "aws-spot", "m", {"desired": 1}, ActionStatus.OK, latency_ms=3.0),
             Action("aws", "terminate", "aws-spot", "m", {}, ActionStatus.NOOP)]
    repo.record_actions(decision_id, calls, "applied")
    got = repo.get_decision(decision_id) or {}
    assert [a["call"] for a in got["actions"]] == ["set_desired_capacity"] and got["noop_actions"] == 2


def test_a_tick_is_one_transaction_for_its_intents_and_one_for_its_outcomes(repo: Repository) -> None:
    commits: list[int] = []
    sa.event.listen(repo.engine, "commit", lambda conn: commits.append(1))
    recorder = RepositoryRecorder(repo)

    for models in (1, 40):
        commits.clear()
        items = [(ticking(f"m{k}", 2), signals_for(f"m{k}", ticking(f"m{k}", 2).at)) for k in range(models)]
        ids = recorder.intents(items, dry_run=False).ids
        assert len(commits) == 1
        recorder.outcomes([Outcome(i, [], "applied") for i in ids])
        assert len(commits) == 2, f"{models} models: {len(commits)} commits"
    assert not repo.pending_decisions()


def test_one_models_page_is_read_by_index_not_sorted(repo: Repository) -> None:
    if repo.engine.dialect.name != "sqlite":
        return  # the plan below is SQLite's words; PostgreSQL has the same index
    q = sa.text("EXPLAIN QUERY PLAN SELECT id FROM decisions WHERE model = 'm' ORDER BY id DESC LIMIT 50")
    with repo.engine.connect() as c:
        plan = " ".join(str(r[-1]) for r in c.execute(q))
    assert "ix_decisions_model_id" in plan and "TEMP B-TREE" not in plan, plan
