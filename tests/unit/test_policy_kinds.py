"""The four built-in policy kinds: table-driven cases and properties."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from controller.core.model import (
    ModelSignals,
    ModelSpec,
    Opinion,
    Recommendation,
    ReplicaCapacity,
    Sample,
)
from controller.core.reasons import Reason
from controller.core.signals import model_signal_names, signal
from policies.base import PolicyContext, PolicyKind, Registry, SLOTargets, UnknownPolicyKind
from policies.cron import parse_cron
from policies.promql import PromQL
from policies.queue_depth import QueueDepth
from policies.schedule import Schedule
from policies.slo_guard import SloGuard
from policies.target_utilization import TargetUtilization

UTC = timezone.utc
NOW = datetime(2024, 9, 9, 12, 0, tzinfo=UTC)  # a Monday
CAPACITY = ReplicaCapacity(output_tokens_per_s=1000, requests_per_s=2)
MODEL = ModelSpec(name="llama3-70b-fp8", tp_degree=2, quantization="fp8", gpu_types=("H100",),
                  cold_start_s=300, capacity={"H100": CAPACITY}, pools=("onprem-h100",))
BUILTINS = (SloGuard, TargetUtilization, QueueDepth, Schedule, PromQL)
STALE = object()
NAN = object()
MISS = object()


def sample(v: Any) -> Sample:
    if v is MISS:
        return Sample.missing("NoData", NOW)
    if v is STALE:
        return Sample(1.0, NOW - timedelta(seconds=600))
    if v is NAN:
        return Sample(float("nan"), NOW, "NaN")
    return v if isinstance(v, Sample) else Sample(float(v), NOW - timedelta(seconds=5))


def ctx(current: int = 10, ready: int | None = 10, capacity: ReplicaCapacity | None = CAPACITY,
        slo: SLOTargets = SLOTargets(), now: datetime = NOW, **signals: Any) -> PolicyContext:
    sig = ModelSignals(model=MODEL.name, at=now, **{k: sample(v) for k, v in signals.items()})
    return PolicyContext(model=MODEL, signals=sig, now=now, current_replicas=current,
                         ready_replicas=ready, capacity=capacity, slo=slo, max_signal_age_s=60)


def build(kind: type[PolicyKind], **params: Any) -> PolicyKind:
    return kind(kind.Params.model_validate(params))


# --- the kinds as kinds ---------------------------------------------------------------------------

def test_entry_points_register_the_builtins() -> None:
    reg = Registry.from_entry_points()
    for kind in BUILTINS:
        assert reg.get(kind.name) is kind
    assert {"slo-guard", "target-utilization", "queue-depth", "schedule"} <= set(reg.names())


def test_an_explicit_registry_builds_rules_and_rejects_unknown_kinds() -> None:
    reg = Registry([SloGuard, QueueDepth])
    rule = reg.build("queue-depth", {"target_per_replica": 4}, rule="q")
    assert isinstance(rule, QueueDepth) and rule.rule == "q" and rule.params.target_per_replica == 4
    with pytest.raises(UnknownPolicyKind) as info:
        reg.build("schedule", {})
    assert "known: queue-depth, slo-guard" in str(info.value)
    with pytest.raises(ValidationError):
        reg.build("queue-depth", {"target_per_replica": 4, "targt": 1})


def _fields(model: type[BaseModel], seen: set[type[BaseModel]]) -> list[tuple[str, Any]]:
    out = []
    for name, f in model.model_fields.items():
        out.append((f"{model.__name__}.{name}", f))
        for arg in _models_in(f.annotation):
            if arg not in seen:
                seen.add(arg)
                out.extend(_fields(arg, seen))
    return out


def _models_in(tp: Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in getattr(tp, "__args__", ()) for m in _models_in(a)]


@pytest.mark.parametrize("kind", BUILTINS, ids=lambda k: k.name)
def test_every_param_has_a_description_and_unknown_keys_are_errors(kind: type[PolicyKind]) -> None:
    for name, f in _fields(kind.Params, set()):
        assert f.description, f"{kind.name}: {name} has no description"
    assert kind.Params.model_config.get("extra") == "forbid"
    assert kind.description


@pytest.mark.parametrize("name", model_signal_names())
def test_a_rule_may_track_every_signal_of_the_table_and_reports_its_reason(name: str) -> None:
    rule = build(TargetUtilization, signal=name, target=10)
    rec = rule.recommend(ctx(current=2, ready=2, **{name: 40}))
    assert (rec.replicas, rec.reason) == (8, signal(name).above_reason.value)


def test_a_rule_naming_a_signal_the_table_lacks_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValidationError) as e:
        TargetUtilization.Params.model_validate({"signal": "gpu_temperature_c", "target": 1})
    assert all(n in str(e.value) for n in model_signal_names())
    assert "gpu_power_kw" not in str(e.value)  # per pool only: not a ModelSignals sample


# --- target-utilization (HPA) -----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("params", "signals", "current", "ready", "replicas", "reason"),
    [
        # proportional scale-up in one step, not +1
        ({"target": 70}, {"gpu_utilization_pct": 140}, 4, 4, 8, Reason.UTILIZATION_ABOVE_TARGET),
        ({"target": 70}, {"gpu_utilization_pct": 210}, 4, 4, 12, Reason.UTILIZATION_ABOVE_TARGET),
        # within the 10 % tolerance: keep current
        ({"target": 70}, {"gpu_utilization_pct": 76}, 4, 4, 4, Reason.WITHIN_TARGETS),
        ({"target": 70}, {"gpu_utilization_pct": 64}, 4, 4, 4, Reason.WITHIN_TARGETS),
        # tolerance 0: a 2 % excess already scales
        ({"target": 70, "tolerance": 0}, {"gpu_utilization_pct": 71.4}, 4, 4, 5, Reason.UTILIZATION_ABOVE_TARGET),
        ({"target": 70, "tolerance": 0.5}, {"gpu_utilization_pct": 100}, 4, 4, 4, Reason.WITHIN_TARGETS),
        # scale-down
        ({"target": 70}, {"gpu_utilization_pct": 35}, 4, 4, 2, Reason.BELOW_TARGETS),
        ({"target": 70}, {"gpu_utilization_pct": 0}, 4, 4, 0, Reason.BELOW_TARGETS),
        # exact: 10 x 56/70 = 8, no float noise turning it into 9
        ({"target": 70}, {"gpu_utilization_pct": 56}, 10, 10, 8, Reason.BELOW_TARGETS),
        # not all replicas ready: above target never recommends fewer than current
        ({"target": 70}, {"gpu_utilization_pct": 140}, 6, 2, 6, Reason.UTILIZATION_ABOVE_TARGET),
        # ... and below target, the 4 unready replicas count as at target: ceil(2 x 0.5 + 4) = 5
        ({"target": 70}, {"gpu_utilization_pct": 35}, 6, 2, 5, Reason.BELOW_TARGETS),
        # ready unknown: the current replicas are the base; ready 0 at 0 replicas: base 1
        ({"target": 70}, {"gpu_utilization_pct": 140}, 3, None, 6, Reason.UTILIZATION_ABOVE_TARGET),
        ({"target": 70}, {"gpu_utilization_pct": 140}, 0, 0, 2, Reason.UTILIZATION_ABOVE_TARGET),
        # total-type signal: HPA AverageValue, ceil(total / target)
        ({"signal": "queue_depth", "target": 5, "target_type": "total"}, {"queue_depth": 30}, 3, 3, 6, Reason.QUEUE_ABOVE_TARGET),
        ({"signal": "queue_depth", "target": 5, "target_type": "total"}, {"queue_depth": 16}, 3, 3, 3, Reason.WITHIN_TARGETS),
        ({"signal": "queue_depth", "target": 5, "target_type": "total"}, {"queue_depth": 5}, 3, 3, 1, Reason.BELOW_TARGETS),
        ({"signal": "request_rate_per_s", "target": 2, "target_type": "total"}, {"request_rate_per_s": 10}, 1, 1, 5, Reason.THROUGHPUT_ABOVE_CAPACITY),
        ({"signal": "p99_latency_ms", "target": 2000}, {"p99_latency_ms": 3000}, 4, 4, 6, Reason.LATENCY_ABOVE_TARGET),
    ],
)
def test_target_utilization(params: dict[str, Any], signals: dict[str, float], current: int,
                            ready: int | None, replicas: int, reason: Reason) -> None:
    rec = build(TargetUtilization, **params).recommend(ctx(current=current, ready=ready, **signals))
    assert (rec.replicas, rec.reason) == (replicas, reason.value)
    assert not rec.missing_data
    assert rec.kind == "target-utilization" and rec.opinion is Opinion.TARGET


@pytest.mark.parametrize(
    ("value", "reason", "needle"),
    [
        (MISS, Reason.METRIC_MISSING, "NoData"),
        (STALE, Reason.METRIC_STALE, "600s old"),
        (NAN, Reason.METRIC_MISSING, "NaN"),
        (Sample(float("inf"), NOW), Reason.METRIC_MISSING, "missing"),
        (-3, Reason.METRIC_MISSING, "negative"),
    ],
)
def test_missing_stale_nan_and_negative_are_no_opinion(value: Any, reason: Reason, needle: str) -> None:
    kinds = [
        build(TargetUtilization, target=70, signal="queue_depth"),
        build(QueueDepth, target_per_replica=4),
        build(SloGuard, queue_depth_per_replica=4, gpu_utilization_target_pct=None),
    ]
    for kind in kinds:
        rec = kind.recommend(ctx(capacity=None, queue_depth=value))
        assert rec.replicas is None, kind.name
        assert rec.missing_data, kind.name
        assert rec.reason == reason.value, kind.name
        assert needle in rec.message, (kind.name, rec.message)


@settings(max_examples=150, deadline=None)
@given(value=st.floats(0, 1e4), target=st.floats(0.1, 1e3), tolerance=st.floats(0, 0.9),
       ready=st.one_of(st.none(), st.integers(0, 500)), current=st.integers(0, 500),
       total=st.booleans())
def test_target_utilization_properties(value: float, target: float, tolerance: float,
                                       ready: int | None, current: int, total: bool) -> None:
    kind = build(TargetUtilization, signal="queue_depth", target=target, tolerance=tolerance,
                 target_type="total" if total else "average")
    rec = kind.recommend(ctx(current=current, ready=ready, queue_depth=value))
    assert rec.replicas is not None and rec.replicas >= 0
    base = ready or max(current, 1)
    ratio = value / (target * base) if total else value / target
    if abs(ratio - 1) <= tolerance:
        assert rec.replicas == current
    elif ratio > 1:
        assert rec.replicas >= current
    else:
        assert rec.replicas <= current


# --- queue-depth (KEDA) -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("params", "value", "current", "replicas", "reason", "missing"),
    [
        ({}, 0, 5, 0, Reason.BELOW_TARGETS, False),
        ({"activation_threshold": 1}, 1, 5, 0, Reason.BELOW_TARGETS, False),   # at threshold: inactive
        ({"activation_threshold": 1}, 1.5, 5, 1, Reason.BELOW_TARGETS, False),  # active: ceil(1.5/4)
        ({}, 40, 5, 10, Reason.QUEUE_ABOVE_TARGET, False),
        ({}, 41, 5, 11, Reason.QUEUE_ABOVE_TARGET, False),
        ({}, 20, 5, 5, Reason.WITHIN_TARGETS, False),
        ({}, 8, 5, 2, Reason.BELOW_TARGETS, False),
        ({}, MISS, 5, None, Reason.METRIC_MISSING, True),
        ({}, STALE, 5, None, Reason.METRIC_STALE, True),
        ({"missing_as_zero": True}, MISS, 5, 0, Reason.BELOW_TARGETS, False),
        ({"missing_as_zero": True}, STALE, 5, 0, Reason.BELOW_TARGETS, False),
        ({"signal": "request_rate_per_s"}, 10, 1, 3, Reason.THROUGHPUT_ABOVE_CAPACITY, False),
    ],
)
def test_queue_depth(params: dict[str, Any], value: Any, current: int, replicas: int | None,
                     reason: Reason, missing: bool) -> None:
    p = {"target_per_replica": 4, **params}
    signal = p.get("signal", "queue_depth")
    rec = build(QueueDepth, **p).recommend(ctx(current=current, **{signal: value}))
    assert (rec.replicas, rec.reason, rec.missing_data) == (replicas, reason.value, missing)
    if params.get("missing_as_zero"):
        assert "missing_as_zero" in rec.message


@settings(max_examples=100, deadline=None)
@given(value=st.floats(0, 1e5), target=st.floats(0.01, 100), activation=st.floats(0, 100),
       current=st.integers(0, 100))
def test_queue_depth_properties(value: float, target: float, activation: float, current: int) -> None:
    rec = build(QueueDepth, target_per_replica=target, activation_threshold=activation).recommend(
        ctx(current=current, queue_depth=value))
    assert rec.replicas is not None and rec.replicas >= 0
    if value <= activation:
        assert rec.replicas == 0
    else:
        # enough replicas for the target, and not one more
        assert rec.replicas * target >= value * (1 - 1e-6)
        assert (rec.replicas - 1) * target < value


# --- slo-guard ----------------------------------------------------------------------------------------

SLO = SLOTargets(p99_latency_ms=1000, queue_depth_per_replica=4)
# 10 ready replicas, latency and queue well below target, GPU util 40 % (-> 5), 3000 tok/s and
# 6 req/s (-> 4 each at 80 % of 1000 tok/s and 2 req/s per replica).
QUIET = {"p99_latency_ms": 300, "queue_depth": 0, "gpu_utilization_pct": 40,
         "output_tokens_per_s": 3000, "request_rate_per_s": 6}


@pytest.mark.parametrize(
    ("changes", "replicas", "reason", "missing"),
    [
        ({}, 5, Reason.BELOW_TARGETS, False),
        # latency above target: proportional, 10 x 2.5 = 25 in one step
        ({"p99_latency_ms": 2500}, 25, Reason.LATENCY_ABOVE_TARGET, False),
        # latency under target but not well under: holds the current 10 (vetoes the scale-down)
        ({"p99_latency_ms": 800}, 10, Reason.WITHIN_TARGETS, False),
        ({"p99_latency_ms": 500}, 10, Reason.WITHIN_TARGETS, False),  # exactly at the ratio: hold
        # queue: 80 waiting over 10 replicas = 8 per replica vs 4 -> ceil(80 / 4) = 20
        ({"queue_depth": 80}, 20, Reason.QUEUE_ABOVE_TARGET, False),
        ({"queue_depth": 30}, 10, Reason.WITHIN_TARGETS, False),
        ({"gpu_utilization_pct": 96}, 12, Reason.UTILIZATION_ABOVE_TARGET, False),
        ({"output_tokens_per_s": 12000}, 15, Reason.THROUGHPUT_ABOVE_CAPACITY, False),
        ({"request_rate_per_s": 40}, 25, Reason.THROUGHPUT_ABOVE_CAPACITY, False),
        # two signals above: the larger wins
        ({"p99_latency_ms": 1500, "output_tokens_per_s": 16000}, 20, Reason.THROUGHPUT_ABOVE_CAPACITY, False),
        # one signal missing: the max of the rest, flagged so the pipeline will not scale down
        ({"p99_latency_ms": MISS}, 5, Reason.BELOW_TARGETS, True),
        ({"gpu_utilization_pct": STALE, "output_tokens_per_s": NAN}, 4, Reason.BELOW_TARGETS, True),
        ({"gpu_utilization_pct": MISS, "queue_depth": 80}, 20, Reason.QUEUE_ABOVE_TARGET, True),
        # everything missing: no opinion at all
        ({k: MISS for k in QUIET}, None, Reason.METRIC_MISSING, True),
        ({k: STALE for k in QUIET}, None, Reason.METRIC_STALE, True),
    ],
)
def test_slo_guard(changes: dict[str, Any], replicas: int | None, reason: Reason, missing: bool) -> None:
    rec = build(SloGuard, gpu_utilization_target_pct=80).recommend(ctx(slo=SLO, **{**QUIET, **changes}))
    assert (rec.replicas, rec.reason, rec.missing_data) == (replicas, reason.value, missing), rec.message
    assert rec.opinion is Opinion.TARGET


def test_slo_guard_message_says_the_numbers() -> None:
    rec = build(SloGuard, gpu_utilization_target_pct=80).recommend(ctx(slo=SLO, **{**QUIET, "p99_latency_ms": 2500, "queue_depth": MISS}))
    assert "p99 2500ms vs target 1000ms" in rec.message
    assert "ceil(10 x 2.500) = 25" in rec.message
    assert "queue_depth is missing (NoData)" in rec.message
    assert rec.message.startswith("latency decides 25 (current 10)")


def test_slo_guard_params_override_the_policy_slo() -> None:
    guard = build(SloGuard, p99_latency_ms=500, queue_depth_per_replica=1, gpu_utilization_target_pct=80)
    rec = guard.recommend(ctx(slo=SLO, **{**QUIET, "p99_latency_ms": 800}))
    assert (rec.replicas, rec.reason) == (16, Reason.LATENCY_ABOVE_TARGET.value)
    rec = guard.recommend(ctx(slo=SLO, **{**QUIET, "queue_depth": 25}))
    assert (rec.replicas, rec.reason) == (25, Reason.QUEUE_ABOVE_TARGET.value)


def test_slo_guard_uses_current_replicas_when_ready_is_unknown_or_zero() -> None:
    guard = build(SloGuard, gpu_utilization_target_pct=None)
    only_latency = {"p99_latency_ms": 2000}
    assert guard.recommend(ctx(current=6, ready=None, capacity=None, slo=SLO, **only_latency)).replicas == 12
    assert guard.recommend(ctx(current=6, ready=0, capacity=None, slo=SLO, **only_latency)).replicas == 12
    assert guard.recommend(ctx(current=0, ready=0, capacity=None, slo=SLO, **only_latency)).replicas == 2
    # with 3 of 6 ready, latency 2x target: ceil(3 x 2) = 6, never below current
    rec = guard.recommend(ctx(current=6, ready=3, capacity=None, slo=SLO, p99_latency_ms=2500))
    assert (rec.replicas, rec.reason) == (8, Reason.LATENCY_ABOVE_TARGET.value)


def test_slo_guard_ignore_list_and_configuration_gaps() -> None:
    # latency not exported: ignoring it means its absence no longer flags missing data
    rec = build(SloGuard, ignore=["latency"], gpu_utilization_target_pct=80).recommend(ctx(slo=SLO, **{**QUIET, "p99_latency_ms": MISS}))
    assert (rec.replicas, rec.missing_data) == (5, False)
    # only pressure signals, all well below: nothing sizes a scale-down, so hold
    rec = build(SloGuard, gpu_utilization_target_pct=None).recommend(
        ctx(capacity=None, slo=SLO, p99_latency_ms=100, queue_depth=0))
    assert (rec.replicas, rec.reason, rec.missing_data) == (10, Reason.BELOW_TARGETS.value, False)
    assert "no load signal" in rec.message
    # nothing configured at all: no opinion, conservatively flagged
    rec = build(SloGuard, gpu_utilization_target_pct=None).recommend(ctx(capacity=None))
    assert (rec.replicas, rec.missing_data) == (None, True)
    assert "no signal configured" in rec.message


maybe = st.one_of(st.just(MISS), st.floats(0, 1e5))


@settings(max_examples=150, deadline=None)
@given(p99=maybe, queue=maybe, util=st.one_of(st.just(MISS), st.floats(0, 100)), tok=maybe, req=maybe,
       current=st.integers(0, 200), ready=st.one_of(st.none(), st.integers(0, 200)))
def test_slo_guard_properties(p99: Any, queue: Any, util: Any, tok: Any, req: Any, current: int,
                              ready: int | None) -> None:
    signals = {"p99_latency_ms": p99, "queue_depth": queue, "gpu_utilization_pct": util,
               "output_tokens_per_s": tok, "request_rate_per_s": req}
    rec = build(SloGuard, gpu_utilization_target_pct=80).recommend(ctx(current=current, ready=ready, slo=SLO, **signals))
    values = [v for v in signals.values() if v is not MISS]
    if not values:
        assert rec.replicas is None and rec.missing_data
        return
    assert rec.replicas is not None and rec.replicas >= 0
    # an absent p99 with a fresh zero request rate is an idle model, not missing data
    idle_latency = p99 is MISS and req is not MISS and req == 0
    assert rec.missing_data == (len(values) + idle_latency < len(signals))
    # latency or queue not well below target: never a scale-down
    base = ready or max(current, 1)
    if (p99 is not MISS and p99 >= 500) or (queue is not MISS and queue / base >= 2):
        assert rec.replicas >= current
    # a throughput above the current capacity always scales up past it
    if tok is not MISS and tok > current * 800 * (1 + 1e-9):
        assert rec.replicas > current
        assert rec.replicas >= math.ceil(tok / 800 - 1e-6)


# --- schedule -----------------------------------------------------------------------------------------

WINDOWS = [
    {"name": "office", "cron": "0 8 * * mon-fri", "duration_s": 36000, "min_replicas": 6,
     "timezone": "Europe/Paris"},
    {"name": "saturday", "cron": "0 9 * * sat", "duration_s": 14400, "min_replicas": 3,
     "timezone": "Europe/Paris"},
    {"name": "night-batch", "cron": "0 22 * * *", "duration_s": 8 * 3600, "min_replicas": 2},
]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("now", "floor"),
    [
        (utc(2024, 9, 9, 10), 6),          # Monday 12:00 Paris
        (utc(2024, 9, 9, 5, 59), 2),       # Monday 07:59 Paris: the night batch (22:00 UTC + 8 h)
        (utc(2024, 9, 9, 6, 0), 6),        # 08:00 Paris: office opens, night batch just closed
        (utc(2024, 9, 9, 15, 59), 6),      # 17:59 Paris
        (utc(2024, 9, 9, 16, 0), None),    # 18:00 Paris: closed (the end is exclusive)
        (utc(2024, 9, 14, 8), 3),          # Saturday 10:00 Paris
        (utc(2024, 9, 14, 23), 2),         # Saturday night batch
        (utc(2024, 9, 15, 12), None),      # Sunday noon
        (utc(2024, 1, 15, 7, 30), 6),      # winter: 08:30 CET
        (utc(2024, 1, 15, 6, 30), None),   # winter: 07:30 CET, office not open, night batch over
        (utc(2024, 1, 15, 5, 30), 2),      # winter: 06:30 CET, night batch
    ],
)
def test_schedule_floor(now: datetime, floor: int | None) -> None:
    rec = build(Schedule, windows=WINDOWS).recommend(ctx(now=now))
    assert rec.opinion is Opinion.FLOOR
    assert rec.replicas == floor
    assert not rec.missing_data
    if floor is None:
        assert rec.reason == Reason.OUTSIDE_SCHEDULE.value
    else:
        assert rec.reason == Reason.SCHEDULE_WINDOW.value
        assert f"floor {floor}" in rec.message


def test_overlapping_windows_take_the_largest_floor_and_say_which_are_open() -> None:
    windows = WINDOWS + [{"name": "launch-day", "cron": "0 0 9 9 *", "duration_s": 86400, "min_replicas": 10}]
    rec = build(Schedule, windows=windows).recommend(ctx(now=utc(2024, 9, 9, 10)))
    assert rec.replicas == 10
    assert "'office' open 2024-09-09T06:00:00+00:00 until 2024-09-09T16:00:00+00:00 (floor 6)" in rec.message
    assert "'launch-day'" in rec.message


def test_long_windows_and_naive_now() -> None:
    week = build(Schedule, windows=[{"cron": "0 0 * * mon", "duration_s": 5 * 86400, "min_replicas": 4}])
    assert week.recommend(ctx(now=utc(2024, 9, 13, 23, 59))).replicas == 4   # Friday
    assert week.recommend(ctx(now=utc(2024, 9, 14, 0, 0))).replicas is None  # Saturday
    assert week.recommend(ctx(now=datetime(2024, 9, 10, 12))).replicas == 4  # naive = UTC


@pytest.mark.parametrize(
    ("window", "needle"),
    [
        ({"cron": "0 25 * * *"}, "hour field: 25 is out of range 0-23"),
        ({"cron": "0 8 * *"}, "expected 5 fields"),
        ({"timezone": "Europe/Atlantis"}, "unknown time zone 'Europe/Atlantis'"),
        ({"duration_s": 0}, "greater than 0"),
        ({"min_replicas": -1}, "greater than or equal to 0"),
        ({"minutes": 5}, "Extra inputs are not permitted"),
    ],
)
def test_schedule_params_are_validated_at_load(window: dict[str, Any], needle: str) -> None:
    good = {"cron": "0 8 * * *", "duration_s": 60, "min_replicas": 1}
    with pytest.raises(ValidationError) as info:
        Schedule.Params.model_validate({"windows": [{**good, **window}]})
    assert needle in str(info.value)
    with pytest.raises(ValidationError):
        Schedule.Params.model_validate({"windows": []})


@settings(max_examples=60, deadline=None)
@given(st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2025, 12, 31), timezones=st.just(UTC)))
def test_schedule_floor_agrees_with_a_minute_scan(now: datetime) -> None:
    """The floor is the max min_replicas over windows that fired in (now - duration, now]."""
    windows = WINDOWS[:2]
    expected = None
    t = now.replace(second=0, microsecond=0)
    for w in windows:
        cron, zone = parse_cron(w["cron"]), ZoneInfo(w["timezone"])
        for minutes_back in range(0, int(w["duration_s"]) // 60 + 1):
            fired = t - timedelta(minutes=minutes_back)
            if now - fired < timedelta(seconds=w["duration_s"]) and cron.matches(fired.astimezone(zone)):
                expected = max(expected or 0, w["min_replicas"])
    rec: Recommendation = build(Schedule, windows=windows).recommend(ctx(now=now))
    assert rec.replicas == expected


def test_slo_guard_utilization_is_off_by_default() -> None:
    """DCGM's GPU_UTIL reads ~100 % whenever a batching replica holds a request: not a sizing signal
    unless the operator says so."""
    rec = build(SloGuard).recommend(ctx(slo=SLO, **{**QUIET, "gpu_utilization_pct": 100}))
    assert "gpu util" not in rec.message and rec.reason != Reason.UTILIZATION_ABOVE_TARGET.value


@pytest.mark.parametrize("latency,rate,idle", [
    (Sample(None, NOW, "NoRequests: no request completed"), Sample(0.0, NOW), True),
    (Sample(None, NOW, "NoData"), Sample(0.0, NOW), True),            # a fresh zero rate says idle
    (Sample(None, NOW, "HTTP 503"), Sample(3.0, NOW), False),         # traffic but no latency: missing
])
def test_slo_guard_idle_model_is_not_missing_latency(latency: Sample, rate: Sample, idle: bool) -> None:
    guard = build(SloGuard, gpu_utilization_target_pct=80)
    c = ctx(slo=SLO, **QUIET)
    c = dataclasses.replace(c, signals=dataclasses.replace(c.signals, p99_latency_ms=latency, request_rate_per_s=rate))
    rec = guard.recommend(c)
    assert rec.missing_data is (not idle), rec.message
