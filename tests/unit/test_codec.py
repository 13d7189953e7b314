"""The JSON form of the core's values: exact round trips, strict JSON, aware UTC times."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.core.model import (
    Action,
    ActionStatus,
    Decision,
    History,
    ModelSignals,
    Opinion,
    Override,
    OverrideKind,
    PoolState,
    Recommendation,
    Sample,
    ScaleEvent,
    Stage,
)
from controller.core.reasons import Reason
from controller.db import codec

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
TOKYO = timezone(timedelta(hours=9))


def strict_json(data: Any) -> Any:
    """Through real, strict JSON text (no NaN/Infinity literals), as a database would store it."""
    return json.loads(json.dumps(data, allow_nan=False))


SIGNALS = ModelSignals(
    model="llama",
    at=T0,
    queue_depth=Sample(4.0, T0 - timedelta(seconds=2)),
    p99_latency_ms=Sample.missing("HTTP 503", T0),
    gpu_utilization_pct=Sample(71.5, T0.astimezone(TOKYO)),
    pools={
        "onprem": PoolState("onprem", 2, 2, 1, at=T0),
        "gcp-spot": PoolState("gcp-spot", None, available=False, unavailable_reason="Stockout", price_per_node_hour_usd=2.2),
    },
)
RECOMMENDATION = Recommendation(
    "queue", "queue-depth", 5, Reason.QUEUE_ABOVE_TARGET.value, "queue 40 > 8 per replica",
    opinion=Opinion.FLOOR, missing_data=False, state={"since": T0, "values": [1, 2.5, None], "ok": True},
)
HISTORY = History(
    recommendations=((T0, 3), (T0 + timedelta(seconds=5), 4)),
    scale_events=(ScaleEvent(T0 + timedelta(seconds=5), 3, 4),),
    rule_state={"queue": {"since": T0, "n": 3}},
)
DECISION = Decision(
    model="llama", at=T0, current_replicas=3, replicas=4, placement={"onprem": 2, "gcp-spot": 2},
    previous_placement={"onprem": 2, "gcp-spot": 1}, recommendations=(RECOMMENDATION,),
    trace=(Stage("recommend", 5, Reason.MAX_OF_RECOMMENDATIONS.value), Stage("place", 4, Reason.CAPACITY_EXHAUSTED.value, "gcp-spot full")),
    reason=Reason.CAPACITY_EXHAUSTED.value, actuate=True, cost_per_hour_usd=6.4, policy_version="sha256:1",
    history=HISTORY, interrupted_replaced=1,
)
ACTION = Action("gcp", "resize", "gcp-spot", "llama", {"size": 2, "deadline": T0}, ActionStatus.FAILED_PERMANENT, "quota", 40.5)
OVERRIDE = Override(7, OverrideKind.BOUNDS, "llama", None, None, 2, 8, T0 + timedelta(hours=1), "launch", "ana", T0)

ROUND_TRIPS: list[tuple[str, object, Callable[[Any], Any], Callable[[Any], Any]]] = [
    ("signals", SIGNALS, codec.signals_to_json, codec.signals_from_json),
    ("recommendation", RECOMMENDATION, codec.recommendation_to_json, codec.recommendation_from_json),
    ("stage", DECISION.trace[1], codec.stage_to_json, codec.stage_from_json),
    ("history", HISTORY, codec.history_to_json, codec.history_from_json),
    ("decision", DECISION, codec.decision_to_json, codec.decision_from_json),
    ("action", ACTION, codec.action_to_json, codec.action_from_json),
    ("override", OVERRIDE, codec.override_to_json, codec.override_from_json),
    ("override without expiry", Override(1, OverrideKind.FREEZE, "m"), codec.override_to_json, codec.override_from_json),
    ("pool state", SIGNALS.pools["gcp-spot"], codec.pool_state_to_json, codec.pool_state_from_json),
]


@pytest.mark.parametrize(("name", "value", "encode", "decode"), ROUND_TRIPS, ids=[r[0] for r in ROUND_TRIPS])
def test_round_trip_through_strict_json(name: str, value: object, encode: Callable[[Any], Any], decode: Callable[[Any], Any]) -> None:
    assert decode(strict_json(encode(value))) == value


def test_times_come_back_in_utc_and_enums_by_value() -> None:
    data = codec.signals_to_json(SIGNALS)
    assert data["gpu_utilization_pct"]["at"] == "2024-05-01T12:00:00+00:00"
    decoded = codec.signals_from_json(data)
    assert decoded.gpu_utilization_pct.at is not None and decoded.gpu_utilization_pct.at.tzinfo == timezone.utc
    assert codec.recommendation_to_json(RECOMMENDATION)["opinion"] == "floor"
    assert codec.action_to_json(ACTION)["status"] == "failed-permanent"
    assert codec.override_to_json(OVERRIDE)["kind"] == "bounds"


def test_missing_stays_missing_never_zero() -> None:
    data = codec.signals_to_json(SIGNALS)
    assert data["p99_latency_ms"] == {"value": None, "at": "2024-05-01T12:00:00+00:00", "reason": "HTTP 503"}
    assert data["pools"]["gcp-spot"]["replicas"] is None
    # An older row without some sample reads it as missing.
    del data["kv_cache_utilization_pct"]
    assert codec.signals_from_json(data).kv_cache_utilization_pct.value is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_survive_strict_json(value: float) -> None:
    sample = codec.sample_from_json(strict_json(codec.sample_to_json(Sample(value, T0, "NaN"))))
    assert sample.value is not None
    assert (math.isnan(sample.value) and math.isnan(value)) or sample.value == value
    state = codec.from_jsonable(strict_json(codec.to_jsonable({"v": value})))
    assert (math.isnan(state["v"]) and math.isnan(value)) or state["v"] == value


@pytest.mark.parametrize("bad", [datetime(2024, 5, 1, 12, 0), datetime(2024, 5, 1)])
def test_naive_datetimes_are_refused(bad: datetime) -> None:
    with pytest.raises(ValueError, match="naive"):
        codec.encode_datetime(bad)
    with pytest.raises(ValueError, match="naive"):
        codec.signals_to_json(ModelSignals(model="m", at=bad))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T12:00:00+00:00", T0),
        ("2024-05-01T21:00:00+09:00", T0),
        ("2024-05-01T12:00:00", T0),  # no offset: the log's convention is UTC
    ],
)
def test_decode_datetime(text: str, expected: datetime) -> None:
    got = codec.decode_datetime(text)
    assert got == expected and got.tzinfo == timezone.utc


def test_unencodable_values_are_refused() -> None:
    with pytest.raises(TypeError, match="object"):
        codec.to_jsonable({"x": object()})


aware_datetimes = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.sampled_from([timezone.utc, TOKYO])
)
json_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8) | aware_datetimes
json_values = st.recursive(
    json_leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6).filter(lambda k: not k.startswith("$")), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_free_form_values_round_trip(value: Any) -> None:
    assert codec.from_jsonable(strict_json(codec.to_jsonable(value))) == value


@given(st.lists(st.tuples(aware_datetimes, st.integers(0, 10_000)), max_size=5))
def test_history_points_round_trip(points: list[tuple[datetime, int]]) -> None:
    history = History(recommendations=tuple(points))
    assert codec.history_from_json(strict_json(codec.history_to_json(history))) == history
