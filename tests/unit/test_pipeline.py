"""The decision pipeline end to end, with tiny policy kinds defined here (not the built-ins).

Table-driven cases per stage, multi-tick scenarios that chain ``Decision.history`` with explicit
timestamps, and hypothesis properties over random fleets, policies and budgets.
"""

from __future__ import annotations

import dataclasses

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.model import (
    Decision,
    History,
    ModelSignals,
    ModelSpec,
    Opinion,
    Tier,
    PoolSpec,
    PoolState,
    Recommendation,
    ReplicaCapacity,
    Sample,
    ScaleEvent,
)
from controller.core.pipeline import STAGES, decide
from controller.core.placement import held_spare, place
from controller.core.policy import EffectivePolicy
from controller.core.pricing import placement_cost
from controller.core.reasons import Reason
from controller.core.spec import PolicySpec
from policies.base import PolicyContext, PolicyKind, StrictParams
from tests.unit.test_placement import Scenario, scenarios

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


# -- tiny policy kinds ------------------------------------------------------------------------------

class Fixed(PolicyKind):
    """Recommends a fixed number (or no opinion / missing data), as a target or a floor."""

    name = "fixed"

    class Params(StrictParams):
        replicas: int | None = None
        floor: bool = False
        missing: bool = False

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        p = self.params
        assert isinstance(p, Fixed.Params)
        if p.missing:
            return Recommendation(self.rule, self.name, None, Reason.METRIC_MISSING.value, "gone", missing_data=True)
        return Recommendation(self.rule, self.name, p.replicas, Reason.LATENCY_ABOVE_TARGET.value, "fixed",
                              opinion=Opinion.FLOOR if p.floor else Opinion.TARGET)


class PerQueue(PolicyKind):
    """Reads one signal: replicas = ceil(queue depth / per_replica); no opinion when missing."""

    name = "per-queue"

    class Params(StrictParams):
        per_replica: float = 10.0

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        q = ctx.fresh("queue_depth")
        if q is None:
            return self.no_opinion(ctx, "queue_depth")
        assert isinstance(self.params, PerQueue.Params)
        return Recommendation(self.rule, self.name, math.ceil(q / self.params.per_replica),
                              Reason.QUEUE_ABOVE_TARGET.value, f"queue {q:g}")


class Boom(PolicyKind):
    name = "boom"

    class Params(StrictParams):
        pass

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        raise RuntimeError("kaput")


class Spy(PolicyKind):
    """Counts its own ticks in explicit state and reports what its context said."""

    name = "spy"

    class Params(StrictParams):
        pass

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        n = int(ctx.state.get("n", 0)) + 1
        cap = ctx.capacity
        return Recommendation(
            self.rule, self.name, None, Reason.WITHIN_TARGETS.value,
            f"current={ctx.current_replicas} ready={ctx.ready_replicas} "
            f"tokens={cap.output_tokens_per_s if cap else None} slo={ctx.slo.p99_latency_ms} age={ctx.max_signal_age_s}",
            state={"n": n},
        )


def fixed(replicas: int | None = None, *, rule: str | None = None, **kw: Any) -> Fixed:
    return Fixed(Fixed.Params(replicas=replicas, **kw), rule)


# -- builders -------------------------------------------------------------------------------------

POOLS = {
    "onprem": PoolSpec("onprem", Tier.ONPREM, "onprem", "A100", 4, 1, 8.0),
    "spot-a": PoolSpec("spot-a", Tier.SPOT, "aws", "A100", 1, 6, 2.0),
    "spot-b": PoolSpec("spot-b", Tier.SPOT, "gcp", "L4", 1, 6, 1.5),
    "od": PoolSpec("od", Tier.ONDEMAND, "aws", "A100", 1, 6, 9.0),
}
MODEL = ModelSpec(
    name="m", tp_degree=1, quantization="fp8", gpu_types=("A100", "L4"), cold_start_s=60,
    capacity={"A100": ReplicaCapacity(1000.0, 4.0), "L4": ReplicaCapacity(400.0, 1.0)}, pools=tuple(POOLS),
)
QUIET = {"tolerance": 0, "scale_up": {"policies": []}, "scale_down": {"stabilization_s": 0, "policies": []}}


def policy(*rules: PolicyKind, version: str = "v1", **spec: Any) -> EffectivePolicy:
    # Lead-time economics off unless a test asks for it: these tests are about the other stages,
    # on a fleet whose on-prem pool holds 4 replicas (tests/unit/test_lead_time.py covers it).
    doc = {"model": "m", "bounds": {"min_replicas": 1, "max_replicas": 20}, "behavior": QUIET,
           "lead_time": {"enabled": False}, **spec}
    return EffectivePolicy("m", PolicySpec.model_validate(doc), tuple(rules), version)


def signals(placement: Mapping[str, int] | None = None, at: datetime = NOW, **samples: Any) -> ModelSignals:
    placement = placement or {}
    pools = {n: PoolState(n, placement.get(n, 0), ready_replicas=placement.get(n, 0)) for n in POOLS}
    return ModelSignals("m", at, pools=pools, **samples)


def run(pol: EffectivePolicy, placement: Mapping[str, int] | None = None, *, history: History | None = None,
        overrides: tuple = (), now: datetime = NOW, paused: bool = False, sig: ModelSignals | None = None) -> Decision:
    return decide(model=MODEL, pools=POOLS, signals=sig or signals(placement, now), policy=pol,
                  history=history or History(), overrides=overrides, now=now, paused=paused)


def stage(d: Decision, name: str):
    st_ = d.stage(name)
    assert st_ is not None, [s.name for s in d.trace]
    return st_


# -- stages ---------------------------------------------------------------------------------------

def test_full_trace_and_decision_fields() -> None:
    d = run(policy(fixed(3), fixed(5, rule="other"), version="abc123"), {"onprem": 1})
    assert tuple(s.name for s in d.trace) == STAGES
    assert [r.replicas for r in d.recommendations] == [3, 5]
    assert stage(d, "combine").reason == Reason.MAX_OF_RECOMMENDATIONS.value
    assert d.replicas == 5 and sum(d.placement.values()) == 5
    assert d.placement == {"onprem": 4, "spot-a": 0, "spot-b": 1, "od": 0}
    assert d.previous_placement == {"onprem": 1, "spot-a": 0, "spot-b": 0, "od": 0}
    assert d.cost_per_hour_usd == pytest.approx(8.0 + 1.5)
    assert d.actuate and d.reason == Reason.LATENCY_ABOVE_TARGET.value
    assert d.policy_version == "abc123"
    assert d.history.scale_events == (ScaleEvent(NOW, 1, 5),)
    assert stage(d, "outcome").reason == Reason.SCALED.value


def test_rule_that_raises_is_no_opinion_and_counts_as_missing() -> None:
    d = run(policy(Boom(Boom.Params()), fixed(2, rule="low")), {"onprem": 4})
    boom = d.recommendations[0]
    assert boom.reason == Reason.RULE_ERROR.value and boom.replicas is None and "kaput" in boom.message
    # missing data (hold) refuses the scale-down the other rule asks for
    assert d.replicas == 4 and d.reason == Reason.HOLD_ON_MISSING_DATA.value


def test_rule_returning_garbage_is_a_rule_error() -> None:
    class Negative(Fixed):
        name = "negative"

        def recommend(self, ctx: PolicyContext) -> Recommendation:
            return Recommendation(self.rule, self.name, -3, "Whatever")

    d = run(policy(Negative(Fixed.Params())), {"onprem": 2})
    assert d.recommendations[0].reason == Reason.RULE_ERROR.value
    assert d.replicas == 2


@pytest.mark.parametrize(
    ("rules", "reason"),
    [
        ((), Reason.NO_RULES),
        ((fixed(None),), Reason.NO_RULES),
        ((fixed(missing=True),), Reason.METRIC_MISSING),
        ((fixed(9, floor=True),), Reason.SCHEDULE_FLOOR),
    ],
)
def test_no_target_opinion_holds_current(rules, reason) -> None:
    d = run(policy(*rules), {"onprem": 3})
    assert stage(d, "combine").replicas == 3
    assert d.reason == reason.value
    assert d.replicas == (9 if reason is Reason.SCHEDULE_FLOOR else 3)


@pytest.mark.parametrize(
    ("current", "target", "tolerance", "expected", "reason"),
    [
        (10, 11, 0.1, 10, Reason.WITHIN_TOLERANCE),
        (10, 9, 0.1, 10, Reason.WITHIN_TOLERANCE),
        (10, 12, 0.1, 12, Reason.LATENCY_ABOVE_TARGET),
        (10, 11, 0.0, 11, Reason.LATENCY_ABOVE_TARGET),
    ],
)
def test_tolerance_stage(current, target, tolerance, expected, reason) -> None:
    pol = policy(fixed(target), behavior={**QUIET, "tolerance": tolerance})
    d = run(pol, {"onprem": 4, "spot-a": current - 4})
    assert d.replicas == expected and d.reason == reason.value


@pytest.mark.parametrize(
    ("on_missing", "other", "expected", "reason"),
    [
        ("hold", 2, 5, Reason.HOLD_ON_MISSING_DATA),  # scale-down refused
        ("hold", 8, 8, Reason.LATENCY_ABOVE_TARGET),  # scale-up allowed
        ("ignore", 2, 2, Reason.LATENCY_ABOVE_TARGET),  # the policy says missing may scale down
    ],
)
def test_missing_data_guard(on_missing, other, expected, reason) -> None:
    pol = policy(PerQueue(PerQueue.Params()), fixed(other), missing_data={"on_missing": on_missing})
    d = run(pol, {"onprem": 4, "spot-a": 1})  # queue_depth missing
    assert d.recommendations[0].missing_data
    assert d.replicas == expected and d.reason == reason.value


def test_stale_signal_is_missing() -> None:
    pol = policy(PerQueue(PerQueue.Params()), fixed(1), missing_data={"max_signal_age_s": 30})
    sig = signals({"onprem": 4}, queue_depth=Sample(100.0, NOW - timedelta(seconds=31)))
    d = run(pol, sig=sig)
    assert d.recommendations[0].reason == Reason.METRIC_STALE.value
    assert d.replicas == 4 and d.reason == Reason.HOLD_ON_MISSING_DATA.value
    fresh = signals({"onprem": 4}, queue_depth=Sample(100.0, NOW - timedelta(seconds=29)))
    assert run(pol, sig=fresh).replicas == 10


def test_stabilization_window_across_ticks_by_timestamp() -> None:
    """Scale-down waits until the high recommendation is older than the window."""
    pol = policy(PerQueue(PerQueue.Params()),
                 behavior={**QUIET, "scale_down": {"stabilization_s": 300, "policies": []}})
    placement = {"onprem": 4, "spot-a": 4}
    history = History()
    timeline = [(0, 80, 8), (60, 20, 8), (200, 20, 8), (299, 20, 8), (300, 20, 2)]
    for t, queue, expected in timeline:
        now = NOW + timedelta(seconds=t)
        d = run(pol, placement, history=history, now=now,
                sig=signals(placement, now, queue_depth=Sample(queue, now)))
        assert d.replicas == expected, (t, d.trace)
        if expected == 8 and t > 0:
            assert d.reason == Reason.SCALE_DOWN_STABILIZED.value
        history, placement = d.history, {k: v for k, v in d.placement.items()}
    # only recommendations inside the window are kept
    assert all(at > NOW for at, _ in history.recommendations)


def test_rate_limit_uses_scale_events_in_history() -> None:
    pol = policy(fixed(20), behavior={**QUIET, "scale_up": {"policies": [
        {"type": "replicas", "value": 2, "period_s": 60}]}})
    d1 = run(pol, {"onprem": 2})
    assert d1.replicas == 4 and d1.reason == Reason.SCALE_UP_LIMITED.value
    later = NOW + timedelta(seconds=30)
    d2 = run(pol, d1.placement, history=d1.history, now=later)
    assert d2.replicas == 4  # start of the period was 2: 2 + 2
    d3 = run(pol, d1.placement, history=d1.history, now=NOW + timedelta(seconds=61))
    assert d3.replicas == 6


def test_cooldown_through_pipeline() -> None:
    pol = policy(fixed(1), behavior={**QUIET, "scale_down": {"stabilization_s": 0, "cooldown_s": 120, "policies": []}})
    hist = History(scale_events=(ScaleEvent(NOW - timedelta(seconds=60), 6, 5),))
    d = run(pol, {"onprem": 4, "spot-a": 1}, history=hist)
    assert d.replicas == 5 and d.reason == Reason.SCALE_DOWN_COOLDOWN.value
    d = run(pol, {"onprem": 4, "spot-a": 1}, history=hist, now=NOW + timedelta(seconds=61))
    assert d.replicas == 1


@pytest.mark.parametrize(
    ("rules", "bounds", "expected", "reason"),
    [
        ((fixed(0),), (2, 8), 2, Reason.TOO_FEW_REPLICAS),
        ((fixed(30),), (2, 8), 8, Reason.TOO_MANY_REPLICAS),
        ((fixed(1), fixed(5, floor=True, rule="sched")), (2, 8), 5, Reason.SCHEDULE_FLOOR),
        # the floor never goes above max
        ((fixed(1), fixed(50, floor=True, rule="sched")), (2, 8), 8, Reason.SCHEDULE_FLOOR),
        # a floor below the target changes nothing
        ((fixed(6), fixed(3, floor=True, rule="sched")), (2, 8), 6, Reason.LATENCY_ABOVE_TARGET),
    ],
)
def test_bounds_and_floors(rules, bounds, expected, reason) -> None:
    pol = policy(*rules, bounds={"min_replicas": bounds[0], "max_replicas": bounds[1]})
    d = run(pol, {"onprem": 4})
    assert d.replicas == expected and d.reason == reason.value


def test_not_observed_yet_holds_and_does_not_act() -> None:
    sig = signals({"onprem": 2, "spot-a": 1})
    pools = dict(sig.pools)
    pools["od"] = PoolState("od", None)
    hist = History(recommendations=((NOW - timedelta(seconds=5), 3),))
    d = run(policy(fixed(9)), sig=replace(sig, pools=pools), history=hist)
    assert not d.actuate and d.reason == Reason.NOT_OBSERVED_YET.value
    assert d.placement == {"onprem": 2, "spot-a": 1, "spot-b": 0}
    assert d.history is hist
    assert "od" in d.trace[0].message
    # a pool without any state is not observed either
    del pools["od"]
    assert run(policy(fixed(9)), sig=replace(sig, pools=pools)).reason == Reason.NOT_OBSERVED_YET.value


def test_paused_decides_records_but_does_not_act() -> None:
    d = run(policy(fixed(6)), {"onprem": 2}, paused=True)
    assert not d.actuate and d.reason == Reason.PAUSED.value
    assert d.replicas == 6  # the decision is still computed
    assert d.history.scale_events == ()  # nothing was scaled
    assert stage(d, "outcome").reason == Reason.PAUSED.value


def test_scale_event_only_when_total_changes() -> None:
    d = run(policy(fixed(3)), {"onprem": 3})
    assert d.replicas == 3 and d.history.scale_events == ()
    assert stage(d, "outcome").reason == Reason.UNCHANGED.value


def test_history_is_pruned_to_longest_window() -> None:
    pol = policy(fixed(3), behavior={**QUIET, "scale_down": {"stabilization_s": 100, "policies": [
        {"type": "percent", "value": 50, "period_s": 200}]}})
    hist = History(
        recommendations=((NOW - timedelta(seconds=150), 9), (NOW - timedelta(seconds=50), 4)),
        scale_events=(ScaleEvent(NOW - timedelta(seconds=250), 1, 2), ScaleEvent(NOW - timedelta(seconds=20), 2, 3)),
    )
    d = run(pol, {"onprem": 3}, history=hist)
    assert d.history.recommendations == ((NOW - timedelta(seconds=50), 4), (NOW, 3))
    assert d.history.scale_events == (ScaleEvent(NOW - timedelta(seconds=20), 2, 3),)


def test_rule_state_round_trips_and_context_values() -> None:
    spy = Spy(Spy.Params())
    pol = policy(spy, fixed(4), slo={"p99_latency_ms": 900}, missing_data={"max_signal_age_s": 45})
    d1 = run(pol, {"onprem": 3, "spot-b": 1})
    # the rules' states, plus the capacity learner's under its reserved key (no evidence on the first tick)
    assert {k: v for k, v in d1.history.rule_state.items() if not k.startswith("@")} == {"spy": {"n": 1}, "fixed": {}}
    assert d1.history.rule_state["@capacity"]["scale"] == 1.0
    # replica-weighted capacity: 3 x A100 (1000 tok/s) + 1 x L4 (400) = 850
    assert "current=4 ready=4 tokens=850.0 slo=900.0 age=45.0" in d1.recommendations[0].message
    d2 = run(pol, d1.placement, history=d1.history, now=NOW + timedelta(seconds=5))
    assert d2.history.rule_state["spy"] == {"n": 2}
    # a rule that left the policy leaves its state behind
    d3 = run(policy(fixed(4)), d2.placement, history=d2.history)
    assert "spy" not in d3.history.rule_state


def test_capacity_with_no_replicas_uses_the_first_pool_to_fill() -> None:
    pol = policy(Spy(Spy.Params()), fixed(1))
    assert "tokens=1000.0" in run(pol, {}).recommendations[0].message  # on-prem is A100
    no_onprem = policy(Spy(Spy.Params()), fixed(1), placement={"pools": ["spot-a", "spot-b"]})
    assert "tokens=400.0" in run(no_onprem, {}).recommendations[0].message  # cheapest spot is L4


def test_capacity_is_the_serving_replicas_not_the_orders_still_starting() -> None:
    """An order on another GPU type does not move the capacity the rules size with until it
    serves: counted while it started, cancelling it moved the rules' count back, and the order
    came and went every minute."""
    pol = policy(Spy(Spy.Params()), fixed(8))
    placed = {"onprem": 4, "spot-b": 4}
    starting = ModelSignals("m", NOW, pools={
        n: PoolState(n, placed.get(n, 0), ready_replicas=4 if n == "onprem" else 0) for n in POOLS})
    assert "tokens=1000.0" in run(pol, sig=starting).recommendations[0].message  # the A100s alone serve
    assert "tokens=700.0" in run(pol, placed).recommendations[0].message  # (4 x 1000 + 4 x 400) / 8, all ready
    unknown = ModelSignals("m", NOW, pools={n: PoolState(n, placed.get(n, 0)) for n in POOLS})
    assert "tokens=700.0" in run(pol, sig=unknown).recommendations[0].message  # readiness not reported: as placed


def test_budget_beats_min_replicas() -> None:
    pol = policy(fixed(8), bounds={"min_replicas": 6, "max_replicas": 20},
                 budget={"max_cost_per_hour_usd": 11.0})
    d = run(pol, {"onprem": 4})
    assert d.cost_per_hour_usd <= 11.0
    assert d.replicas == 6  # on-prem 4 ($8) + 2 cheapest spot ($1.5 each)
    assert d.reason == Reason.BUDGET_CAP_REACHED.value
    pol = policy(fixed(8), bounds={"min_replicas": 6, "max_replicas": 20},
                 budget={"max_cost_per_hour_usd": 9.0})
    d = run(pol, {"onprem": 4, "spot-a": 2})
    assert d.replicas == 4 and d.cost_per_hour_usd == pytest.approx(8.0)
    assert "beats min_replicas 6" in stage(d, "budget").message and "$11.00/h" not in stage(d, "budget").message


def test_cost_per_token_cap() -> None:
    # $1 per million tokens at 3000 tok/s = $10.80/h
    pol = policy(fixed(8), budget={"max_cost_per_million_tokens_usd": 1.0})
    sig = signals({"onprem": 4}, output_tokens_per_s=Sample(3000.0, NOW))
    d = run(pol, sig=sig)
    assert d.cost_per_hour_usd <= 10.8 and d.replicas == 5
    assert d.reason == Reason.COST_PER_TOKEN_CAP_REACHED.value
    assert "$10.80/h" in stage(d, "budget").message
    # unknown token rate: the cap cannot be computed and is ignored
    d = run(pol, {"onprem": 4})
    assert d.replicas == 8 and "ignored" in stage(d, "budget").message
    # the hourly cap applies when it is the lower one
    both = policy(fixed(8), budget={"max_cost_per_million_tokens_usd": 1.0, "max_cost_per_hour_usd": 9.0})
    assert run(both, sig=sig).reason == Reason.BUDGET_CAP_REACHED.value


def test_cost_per_token_cap_never_starves_min_replicas() -> None:
    # a trickle of 10 tok/s at $1/M allows $0.04/h: far below one on-prem node ($8/h); the
    # efficiency ceiling gives way to min_replicas (the hourly cap would not)
    pol = policy(fixed(8), bounds={"min_replicas": 3, "max_replicas": 20},
                 budget={"max_cost_per_million_tokens_usd": 1.0})
    d = run(pol, sig=signals({"onprem": 4}, output_tokens_per_s=Sample(10.0, NOW)))
    # min 3 needs the on-prem node ($8/h); its fourth slot costs nothing more, so 4 fit the floor
    assert d.placement == {"onprem": 4, "spot-a": 0, "spot-b": 0, "od": 0}
    assert d.cost_per_hour_usd == pytest.approx(8.0)
    assert d.reason == Reason.COST_PER_TOKEN_CAP_REACHED.value
    assert "min_replicas 3" in stage(d, "budget").message


@pytest.mark.parametrize("on_missing,expected,reason", [
    ("hold", 6, Reason.HOLD_ON_MISSING_DATA), ("ignore", 2, None)])
def test_degraded_observation_never_releases_capacity(on_missing, expected, reason) -> None:
    """Prometheus down, values from the Triton fallback: every rule has data, yet nothing is released."""
    pol = policy(fixed(2), missing_data={"on_missing": on_missing})
    sig = dataclasses.replace(signals({"onprem": 4, "spot-a": 2}), degraded="PrometheusUnavailable: refused")
    d = run(pol, sig=sig)
    assert d.replicas == expected
    if reason is not None:
        assert stage(d, "missing-data").reason == reason.value
        assert "PrometheusUnavailable" in stage(d, "missing-data").message
    # scale-up still passes on degraded data
    assert run(policy(fixed(9), missing_data={"on_missing": on_missing}), sig=sig).replicas == 9


def test_partial_sample_never_releases_capacity() -> None:
    """Some pools' series were invalid: the queue covers the others only, a lower bound."""
    pol = policy(fixed(2))
    sig = signals({"onprem": 4, "spot-a": 2}, queue_depth=Sample(3.0, NOW, "Partial: pool spot-a NaN"))
    d = run(pol, sig=sig)
    assert d.replicas == 6 and stage(d, "missing-data").reason == Reason.HOLD_ON_MISSING_DATA.value
    assert "queue_depth" in stage(d, "missing-data").message
    assert run(policy(fixed(8)), sig=sig).replicas == 8


def test_spot_interruption_replaced_in_the_same_decision() -> None:
    sig = signals({"onprem": 4, "spot-a": 2})
    pools = dict(sig.pools)
    pools["spot-a"] = replace(pools["spot-a"], interrupted_replicas=1)
    d = run(policy(fixed(6)), sig=replace(sig, pools=pools))
    assert d.replicas == 6 and d.interrupted_replaced == 1
    assert d.placement == {"onprem": 4, "spot-a": 1, "spot-b": 1, "od": 0}
    assert d.reason == Reason.SPOT_INTERRUPTED.value


def test_capacity_exhausted() -> None:
    pol = policy(fixed(40), bounds={"min_replicas": 1, "max_replicas": 40})
    d = run(pol, {"onprem": 4})
    assert d.replicas == 4 + 6 + 6 + 6
    assert d.reason == Reason.CAPACITY_EXHAUSTED.value


# -- properties -----------------------------------------------------------------------------------

@st.composite
def decide_cases(draw: st.DrawFn) -> tuple[Scenario, EffectivePolicy, ModelSignals, History]:
    sc = draw(scenarios())
    lo = draw(st.integers(0, 6))
    hi = draw(st.integers(lo, 30))
    behavior = QUIET if draw(st.booleans()) else {}
    budget: dict[str, float] = {}
    if sc.cap is not None:
        budget["max_cost_per_hour_usd"] = sc.cap
    if draw(st.booleans()):
        budget["max_cost_per_million_tokens_usd"] = draw(st.integers(1, 40)) / 4
    rules: list[PolicyKind] = [fixed(sc.total)]
    if draw(st.booleans()):
        rules.append(fixed(draw(st.integers(0, 30)), floor=True, rule="floor"))
    if draw(st.booleans()):
        rules.append(fixed(missing=True, rule="gone"))
    doc = {"model": "m", "bounds": {"min_replicas": lo, "max_replicas": hi}, "behavior": behavior,
           "budget": budget, "placement": sc.spec.model_dump(),
           "missing_data": {"on_missing": draw(st.sampled_from(["hold", "ignore"]))},
           # off: the floor cost below is placed without the lead-time ceiling, which moves a cheap
           # spot replica to on-prem once the need fits there (tests/unit/test_lead_time.py)
           "lead_time": {"enabled": False}}
    pol = EffectivePolicy("m", PolicySpec.model_validate(doc), tuple(rules), "v")
    tokens = draw(st.one_of(st.none(), st.integers(0, 20000).map(float)))
    sig = ModelSignals("m", NOW, pools=sc.states,
                       output_tokens_per_s=Sample(tokens, NOW) if tokens is not None else Sample.missing("NoData"))
    hist = History(
        recommendations=tuple((NOW - timedelta(seconds=s), draw(st.integers(0, 30)))
                              for s in sorted(draw(st.lists(st.integers(1, 400), max_size=4)), reverse=True)),
        scale_events=tuple(ScaleEvent(NOW - timedelta(seconds=s), draw(st.integers(0, 20)), draw(st.integers(0, 20)))
                           for s in sorted(draw(st.lists(st.integers(1, 100), max_size=3)), reverse=True)),
    )
    return sc, pol, sig, hist


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decide_cases(), st.booleans())
def test_prop_decide_bounds_budget_determinism(case, paused: bool) -> None:
    sc, pol, sig, hist = case
    kw = dict(model=sc.model, pools=sc.pools, signals=sig, policy=pol, history=hist, overrides=(), now=NOW,
              paused=paused)
    d = decide(**kw)  # type: ignore[arg-type]
    spec = pol.spec
    assert tuple(s.name for s in d.trace) == STAGES
    assert sum(d.placement.values()) == d.replicas
    assert d.replicas <= spec.bounds.max_replicas
    assert d.cost_per_hour_usd == pytest.approx(placement_cost(sc.model, sc.pools, sc.states, d.placement))
    if spec.budget.max_cost_per_hour_usd is not None:  # the hard ceiling: never exceeded
        assert d.cost_per_hour_usd <= spec.budget.max_cost_per_hour_usd + 1e-6
    rate = sig.output_tokens_per_s.value
    if spec.budget.max_cost_per_million_tokens_usd is not None and rate and not paused:
        token_cap = spec.budget.max_cost_per_million_tokens_usd * rate * 3600 / 1e6
        if d.cost_per_hour_usd > token_cap + 1e-6:
            # the efficiency ceiling only gives way to hold min_replicas (or what was already there):
            # it is raised to what placing those costs, and replicas that fit in that cost (a
            # second replica on a node the floor already pays for) are free to keep
            floors = [r.replicas or 0 for r in d.recommendations if r.opinion is Opinion.FLOOR]
            floor = max(spec.bounds.min_replicas, d.current_replicas, *floors)
            floor_cost = place(model=sc.model, pools=sc.pools, states=sc.states, total=floor,
                               placement=spec.placement).cost_per_hour_usd
            assert d.cost_per_hour_usd <= max(token_cap, floor_cost) + 1e-6, d.trace
    if d.replicas < spec.bounds.min_replicas:
        limited = {Reason.BUDGET_CAP_REACHED.value, Reason.COST_PER_TOKEN_CAP_REACHED.value}
        assert (stage(d, "budget").reason in limited
                or stage(d, "placement").reason == Reason.CAPACITY_EXHAUSTED.value), d.trace
    for name, replicas in d.placement.items():
        pool = sc.pools[name]
        assert replicas * sc.model.tp_degree <= pool.max_nodes * pool.gpus_per_node
    assert d.actuate is not paused
    # the scale event is the demand's step: spares (the fallback return's replacements) left out
    demand = d.replicas - (held_spare(d.history.rule_state) if d.actuate else 0)
    current = max(0, d.current_replicas - held_spare(hist.rule_state))
    changed = d.actuate and demand != current
    assert (d.history.scale_events[-1:] == (ScaleEvent(NOW, current, demand),)) is changed
    assert decide(**kw) == d  # type: ignore[arg-type]


@pytest.mark.parametrize("queue, pressure", [(0.0, False), (2.0, True)])
def test_a_p99_ttft_over_target_is_capacity_pressure_only_while_requests_wait(queue: float, pressure: bool) -> None:
    """After a backlog is served the p99 TTFT of its window stays high with nothing waiting: the
    learner must not read it as replicas at capacity."""
    pol = policy(fixed(4), slo={"ttft_p99_ms": 1000})
    sig = signals({"onprem": 4}, output_tokens_per_s=Sample(3000.0, NOW), p99_ttft_ms=Sample(5000.0, NOW),
                  queue_depth=Sample(queue, NOW))
    evidence = run(pol, sig=sig).history.rule_state["@capacity"]["evidence"]
    assert evidence.startswith("pressure") == pressure, evidence


@pytest.mark.parametrize(("later_s", "expected", "reason"), [
    # the rules asked for 8 half a minute ago: the lost replicas are bought again at once
    (30, {"onprem": 4, "spot-a": 1, "spot-b": 3, "od": 0}, Reason.SPOT_POOL_UNAVAILABLE),
    # they asked for 2 for the last two minutes: the window still holds 8, but a cloud order
    # would serve after it lets them go; the replicas that stand stay
    (120, {"onprem": 4, "spot-a": 1, "spot-b": 1, "od": 0}, Reason.HELD_NOT_REPLACED),
])
def test_replicas_the_window_holds_are_not_bought_again_once_the_load_has_gone(later_s, expected, reason) -> None:
    pol = policy(PerQueue(PerQueue.Params()), behavior={**QUIET, "scale_down": {"stabilization_s": 300, "policies": []}})
    placement = {"onprem": 4, "spot-a": 3, "spot-b": 1}
    d = run(pol, placement, sig=signals(placement, NOW, queue_depth=Sample(80.0, NOW)))
    assert d.replicas == 8
    for t in range(60, later_s + 1, 60):  # the load gone: 20 queued asks for 2
        now = NOW + timedelta(seconds=t)
        d = run(pol, placement, history=d.history, now=now, sig=signals(placement, now, queue_depth=Sample(20.0, now)))
        assert stage(d, "recommend").replicas == 2
        assert d.replicas == 8 and {k: v for k, v in d.placement.items() if v} == placement  # held where they are
    now = NOW + timedelta(seconds=later_s + 5)
    sig = signals(placement, now, queue_depth=Sample(20.0, now))
    pools = dict(sig.pools)
    pools["spot-a"] = replace(pools["spot-a"], available=False, ready_replicas=1)  # 2 not ready yet, say
    d = run(pol, placement, history=d.history, now=now, sig=replace(sig, pools=pools))
    assert stage(d, "stabilize").replicas == 8
    assert d.placement == expected
    assert stage(d, "placement").reason == reason.value, d.trace
