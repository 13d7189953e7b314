"""Pure parts of the write path: what a pending intent became (reconciliation), hourly rollups
that merge the same whatever the batches, payload chains that decode to what was encoded."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.controller import PendingIntent, reconcile_intent
from controller.core.model import ModelSignals, PoolState
from controller.db import payload, rollup

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def observed(**replicas: int | None) -> ModelSignals:
    return ModelSignals(model="m", at=T0, pools={p: PoolState(pool=p, replicas=n) for p, n in replicas.items()})


INTENT = PendingIntent(decision_id=7, model="m", at=T0, placement={"onprem": 8, "spot": 4, "od": 0},
                       previous_placement={"onprem": 8, "spot": 0, "od": 2}, dry_run=False)


@pytest.mark.parametrize("seen, outcome, applied", [
    ({"onprem": 8, "spot": 4, "od": 0}, "applied", 12),  # every changed pool at its target
    ({"onprem": 8, "spot": 0, "od": 2}, "failed", 10),  # nothing moved: not applied
    ({"onprem": 8, "spot": 4, "od": 2}, "partial", 14),  # the spot pool grew, on-demand not released
    ({"onprem": 8, "spot": 2, "od": 0}, "partial", 10),  # the spot pool half way
    ({"onprem": 8, "spot": None, "od": 0}, "partial", 12),  # unknown: counted as applied (conservative)
])
def test_a_pending_intent_is_judged_by_the_replicas_the_pools_hold(seen: dict[str, int | None], outcome: str,
                                                                  applied: int) -> None:
    got = reconcile_intent(INTENT, observed(**seen))
    assert (got.decision_id, got.outcome, got.applied_replicas) == (7, outcome, applied)
    assert got.detail is not None and got.detail.startswith("reconciled at start")


def test_a_pending_dry_run_intent_stays_a_dry_run() -> None:
    assert reconcile_intent(PendingIntent(1, "m", T0, {"a": 3}, {"a": 1}, True), None).outcome == "dry-run"


decisions = st.lists(st.tuples(st.integers(0, 20), st.sampled_from(["A", "B"]), st.floats(0, 100),
                               st.one_of(st.none(), st.floats(-1e6, 1e6))), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(decisions, st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_rollups_merge_to_the_same_row_however_the_batches_split(rows: list, cuts: list[int]) -> None:
    ones = [rollup.from_decision({"id": i + 1, "model": "m", "at": T0 + timedelta(seconds=i), "replicas": r,
                                  "placement": {"p": r}, "cost_per_hour_usd": cost, "reason": reason,
                                  "outcome": "applied", "scale_from_replicas": None, "scale_to_replicas": None},
                                 {"queue_depth": {"value": q}})
            for i, (r, reason, cost, q) in enumerate(rows)]

    def fold(xs: list) -> dict:
        acc = xs[0]
        for x in xs[1:]:
            acc = rollup.merge(acc, x)
        return acc

    whole = fold(ones)
    bounds = sorted({c % len(ones) for c in cuts} | {0, len(ones)})
    parts = [fold(ones[a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]
    split = fold(parts)
    assert split["decisions"] == whole["decisions"] == len(rows)
    assert split["replicas_last"] == whole["replicas_last"] == rows[-1][0]
    assert split["reasons"] == whole["reasons"] and split["placement"]["p"]["last"] == rows[-1][0]
    assert split["cost_per_hour_sum_usd"] == pytest.approx(whole["cost_per_hour_sum_usd"])
    assert split["signals"].get("queue_depth", {}).get("n") == whole["signals"].get("queue_depth", {}).get("n")


docs = st.dictionaries(st.text(min_size=1, max_size=8), st.one_of(st.integers(), st.text(max_size=30),
                                                                  st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=20)),
                       max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.lists(docs, min_size=1, max_size=12))
def test_a_payload_chain_decodes_every_row_it_encoded(chain: list) -> None:
    rows: dict[int, tuple[bytes, int | None]] = {}
    previous: bytes | None = None
    for i, doc in enumerate(chain):
        packed, previous = payload.encode(doc, previous)
        rows[i] = (packed, i - 1 if i else None)
    for i in reversed(range(len(chain))):  # any order, any cache state
        assert payload.decode(i, rows, {}) == chain[i]
