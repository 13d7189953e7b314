"""What a ScalingPolicy object and a Deployment show: conditions read off a decision's trace, the
status written only on change, Events with the decision log's reasons, and the event correlator
that keeps a flapping signal from storming (table-driven and property tests, no cluster)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.model import Decision, ModelSignals, PoolState, Recommendation, Sample, Stage
from controller.core.reasons import Reason
from controller.kubestatus import (
    LIMIT_STAGES, Event, EventCorrelator, Refusal, able_condition, active_condition, conditions, decided_status,
    degraded_condition, error_status, limited_condition, ready_condition, rescale_events,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def decision(*stages: tuple[str, int | None, str, str], placement: dict[str, int] | None = None,
             previous: dict[str, int] | None = None, recs: tuple[Recommendation, ...] = (), actuate: bool = True,
             at: datetime = T0, reason: str | None = None) -> Decision:
    trace = tuple(Stage(*s) for s in stages)
    placement = placement or {"a": 2}
    previous = previous or {"a": 2}
    return Decision(model="llama", at=at, current_replicas=sum(previous.values()), replicas=sum(placement.values()),
                    placement=placement, previous_placement=previous, recommendations=recs, trace=trace,
                    reason=reason or (trace[-1].reason if trace else Reason.UNCHANGED.value), actuate=actuate,
                    cost_per_hour_usd=12.345)


RECOMMEND = ("recommend", 6, Reason.QUEUE_ABOVE_TARGET.value, "queue-depth=6 (queue 6 / 1 per replica)")


def test_scaling_limited_names_the_stage_that_cut_the_result() -> None:
    stage_names = {"bounds": "bounds", "budget": "budget", "rate limit": "rate-limit", "capacity": "placement",
                   "lead time": "lead-time"}
    for reason, label in LIMIT_STAGES.items():
        d = decision(RECOMMEND, (stage_names[label], 4, reason, "cut"), ("outcome", 4, "Scaled", "2 -> 4"))
        kind, status, got, message = limited_condition(d)
        assert (kind, status, got) == ("ScalingLimited", "True", reason)
        assert message == f"{label}: held at 4 replicas by the {stage_names[label]} stage"
    assert limited_condition(decision(RECOMMEND, ("outcome", 6, "Scaled", "2 -> 6")))[1:3] == ("False", "DesiredWithinRange")


def test_active_is_false_while_nothing_can_be_computed() -> None:
    assert active_condition(decision(RECOMMEND, ("outcome", 6, "Scaled", "")))[1:3] == ("True", "QueueAboveTarget")
    missing = decision(("recommend", None, Reason.METRIC_MISSING.value, "queue-depth: no data"), ("outcome", 2, "Unchanged", ""))
    assert active_condition(missing)[1:3] == ("False", "MetricMissing")
    waiting = decision(("observe", None, Reason.NOT_OBSERVED_YET.value, "pool a unknown"), actuate=False)
    assert active_condition(waiting)[1:] == ("False", "NotObservedYet", "pool a unknown")
    paused = decision(RECOMMEND, ("outcome", 6, Reason.PAUSED.value, "paused: decided, not acting"), actuate=False)
    assert active_condition(paused)[1:3] == ("False", "Paused")
    # the message carries no live numbers: a status that changed with every tick's load would be rewritten every tick
    busier = decision(("recommend", 9, Reason.QUEUE_ABOVE_TARGET.value, "queue 9"), ("outcome", 9, "Scaled", ""))
    assert active_condition(busier) == active_condition(decision(RECOMMEND, ("outcome", 6, "Scaled", "")))


def test_degraded_says_prometheus_down_or_which_rule_lacks_data() -> None:
    d = decision(RECOMMEND, ("outcome", 6, "Scaled", ""))
    assert degraded_condition(d, ModelSignals("llama", T0))[1:3] == ("False", "SignalsPresent")
    down = ModelSignals("llama", T0, degraded="PrometheusUnavailable: HTTP 503; values from Triton")
    assert degraded_condition(d, down)[1:] == ("True", "MetricsSourceDegraded", down.degraded)
    rec = Recommendation(rule="latency", kind="slo-guard", replicas=None, reason=Reason.METRIC_STALE.value,
                         message="p99 is 300 s old", missing_data=True)
    assert degraded_condition(decision(RECOMMEND, recs=(rec,)), ModelSignals("llama", T0))[1:] == (
        "True", "MetricStale", "rule latency: p99 is 300 s old")


def test_able_to_scale_and_ready_say_why_not() -> None:
    r = Refusal("b", "llm", "llama-b", "HorizontalPodAutoscalerActive", "HorizontalPodAutoscaler llm/h")
    kind, status, reason, message = able_condition("applied", None, [r])
    assert (status, reason) == ("False", "HorizontalPodAutoscalerActive") and message.startswith("HorizontalPodAutoscaler llm/h scales")
    assert "spec.adopt: true" in message
    assert able_condition("partial", "failed pools: b", [])[1:] == ("False", "FailedRescale", "failed pools: b")
    assert able_condition("applied", None, [])[1:3] == ("True", "ReadyForNewScale")
    assert ready_condition(["spec.bounds: min > max"], "abc")[1:] == (
        "False", "InvalidSpec", "spec.bounds: min > max; version abc keeps deciding")
    assert ready_condition(["x: y"], None)[3].endswith("no version of this model is in force")
    assert ready_condition([], "abc")[1:3] == ("True", "PolicyInForce")


def test_a_transition_time_moves_only_when_the_status_flips() -> None:
    first = conditions([("Ready", "True", "PolicyInForce", "v1")], [], T0)
    later = T0 + timedelta(minutes=5)
    same = conditions([("Ready", "True", "PolicyInForce", "v2")], first, later)
    assert same[0].lastTransitionTime == first[0].lastTransitionTime and same[0].message == "v2"
    flipped = conditions([("Ready", "False", "InvalidSpec", "bad")], same, later)
    assert flipped[0].lastTransitionTime == "2025-03-01T12:05:00Z"


def _status(d: Decision, previous: Any = None, decision_id: int = 1) -> Any:
    sig = ModelSignals("llama", d.at, pools={"a": PoolState("a", 2, ready_replicas=2)},
                       cost_per_million_tokens_usd=Sample(0.123456, d.at))
    return decided_status(d, decision_id, sig, "applied", None, [], [], "v1", 4, previous)


def test_status_is_the_same_object_when_only_the_decision_changed() -> None:
    d1 = decision(RECOMMEND, ("outcome", 2, "Unchanged", ""))
    s1 = _status(d1)
    assert s1.costPerHourUSD == "12.35" and s1.costPerMillionTokensUSD == "0.12"
    assert s1.pools["a"].model_dump() == {"desired": 2, "current": 2, "ready": 2, "managed": True}
    assert s1.lastDecision is not None and s1.lastDecision.id == 1 and s1.observedGeneration == 4
    s2 = _status(decision(RECOMMEND, ("outcome", 2, "Unchanged", ""), at=T0 + timedelta(seconds=5)), s1, 2)
    assert s2 is s1  # nothing to write: the decision id alone never costs a write
    s3 = _status(decision(RECOMMEND, ("outcome", 3, "Scaled", ""), placement={"a": 3}, at=T0 + timedelta(seconds=10)), s1, 3)
    assert s3 is not s1 and s3.lastDecision.id == 3 and s3.desiredReplicas == 3
    # a refused spec keeps what the last decision showed, and Ready says why
    bad = error_status(["spec.rules[0].params.target: must be > 0"], "v1", 5, s3, T0 + timedelta(seconds=20))
    assert bad.desiredReplicas == 3 and bad.observedGeneration == 5
    assert [(c.type, c.status) for c in bad.conditions][0] == ("Ready", "False")
    assert error_status(["spec.rules[0].params.target: must be > 0"], "v1", 5, bad, T0 + timedelta(seconds=30)) is bad


def test_rescale_events_carry_the_decision_log_reason() -> None:
    d = decision(RECOMMEND, ("outcome", 9, "Scaled", "6 -> 9"), placement={"onprem": 4, "aws-spot": 5},
                 previous={"onprem": 4, "aws-spot": 2}, reason=Reason.QUEUE_ABOVE_TARGET.value)
    events = rescale_events(d, {"onprem": ("llm", "llama-onprem"), "aws-spot": ("llm", "llama-aws-spot")},
                            [("llm", "llama-queue")], [])
    assert events == [
        Event("Deployment", "llm", "llama-aws-spot", "SuccessfulRescale",
              "SuccessfulRescale: 2 -> 5 on aws-spot: queue-depth=6 (queue 6 / 1 per replica)"),
        Event("ScalingPolicy", "llm", "llama-queue", "SuccessfulRescale",
              "SuccessfulRescale: 6 -> 9 (aws-spot 2 -> 5): QueueAboveTarget: queue-depth=6 (queue 6 / 1 per replica)"),
    ]
    failed = rescale_events(d, {"aws-spot": ("llm", "llama-aws-spot")}, [], ["aws-spot"])
    assert [(e.type, e.reason) for e in failed] == [("Warning", "FailedRescale")]


# --- the correlator --------------------------------------------------------------------------

events = st.lists(st.tuples(st.floats(min_value=0, max_value=400), st.sampled_from(["d1", "d2"]),
                            st.sampled_from(["6 -> 9", "9 -> 6", "9 -> 12"])), max_size=200)


@settings(max_examples=200, deadline=None)
@given(events, st.integers(min_value=1, max_value=10), st.floats(min_value=1, max_value=600))
def test_the_correlator_bounds_events_per_object_and_drops_repeats(seq: list[tuple[float, str, str]], burst: int,
                                                                    refill_s: float) -> None:
    c = EventCorrelator(burst=burst, refill_s=refill_s, dedupe_window_s=300)
    now = T0
    sent: list[tuple[datetime, str, str]] = []
    for step, obj, msg in seq:
        now += timedelta(seconds=step)
        if c.admit(Event("Deployment", "llm", obj, "SuccessfulRescale", msg), now):
            sent.append((now, obj, msg))
    for i, (t, obj, msg) in enumerate(sent):
        # never the same event twice within the dedupe window
        assert all((t2 - t).total_seconds() >= 300 for t2, o2, m2 in sent[i + 1:] if (o2, m2) == (obj, msg))
        # never more than the bucket allows from any moment on
        for j in range(i, len(sent)):
            t2 = sent[j][0]
            n = sum(1 for t3, o3, _ in sent[i:j + 1] if o3 == obj and t <= t3 <= t2)
            assert n <= burst + (t2 - t).total_seconds() / refill_s + 1e-9
    assert len(seq) - len(sent) == sum(c.dropped.values())


def test_a_flapping_signal_sends_each_move_once_and_a_new_object_still_gets_its_event() -> None:
    c = EventCorrelator(burst=25, refill_s=300, dedupe_window_s=600)
    sent = [c.admit(Event("Deployment", "llm", "d", "SuccessfulRescale", m), T0 + timedelta(seconds=5 * i))
            for i, m in enumerate(["6 -> 9", "9 -> 6"] * 20)]
    assert sent[:2] == [True, True] and not any(sent[2:]) and c.dropped == {"SuccessfulRescale": 38}
    assert c.admit(Event("Deployment", "llm", "other", "SuccessfulRescale", "6 -> 9"), T0 + timedelta(seconds=200))
    # after the window the move is news again
    assert c.admit(Event("Deployment", "llm", "d", "SuccessfulRescale", "6 -> 9"), T0 + timedelta(seconds=700))
