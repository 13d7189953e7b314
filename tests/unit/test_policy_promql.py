"""The ``promql`` kind: KEDA's Prometheus-scaler arithmetic on the rule's own expression, under the
same missing-data rules as every rule (the value reaches it in ``ModelSignals.queries``)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from controller.core.model import ModelSignals, ModelSpec, ReplicaCapacity, Sample
from controller.db.codec import signals_from_json, signals_to_json
from policies.base import PolicyContext
from policies.promql import PromQL

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
MODEL = ModelSpec(name="llama", tp_degree=2, quantization="fp8", gpu_types=("H100",), cold_start_s=300,
                  capacity={"H100": ReplicaCapacity(1000, 2)}, pools=("onprem",))
Q = 'sum(rate(http_requests_total{service="llama"}[2m]))'


def rule(**params: object) -> PromQL:
    return PromQL(PromQL.Params.model_validate({"query": Q, "target_per_replica": 10, **params}), "rps")


def ctx(sample: Sample | None, current: int = 3) -> PolicyContext:
    sig = ModelSignals(MODEL.name, NOW, queries={} if sample is None else {Q: sample})
    return PolicyContext(model=MODEL, signals=sig, now=NOW, current_replicas=current, ready_replicas=current,
                         capacity=None, max_signal_age_s=60)


@given(value=st.floats(min_value=0.001, max_value=1e6), target=st.floats(min_value=0.01, max_value=1e4),
       current=st.integers(0, 500))
def test_desired_is_keda_ceil_of_value_over_target(value: float, target: float, current: int) -> None:
    rec = rule(target_per_replica=target).recommend(ctx(Sample(value, NOW), current))
    assert not rec.missing_data
    # the fewest replicas that carry the value at the target each (float noise forgiven)
    assert rec.replicas is not None and rec.replicas >= 1
    assert rec.replicas * target >= value * (1 - 1e-9) and (rec.replicas - 1) * target < value
    assert rec.reason == ("QueryAboveTarget" if rec.replicas > current else
                          "WithinTargets" if rec.replicas == current else "BelowTargets")


@given(value=st.floats(min_value=0, max_value=100), threshold=st.floats(min_value=0, max_value=100))
@example(value=5e-324, threshold=0.0)  # active; the division underflows to 0: still one replica
def test_at_or_below_activation_the_rule_is_inactive(value: float, threshold: float) -> None:
    rec = rule(activation_threshold=threshold).recommend(ctx(Sample(value, NOW)))
    assert (rec.replicas == 0) is (value <= threshold)


@pytest.mark.parametrize("sample, code", [
    (None, "MetricMissing"),                                           # no source evaluated it
    (Sample.missing("HTTP 503: unavailable", NOW), "MetricMissing"),
    (Sample(float("nan"), NOW, "NaN"), "MetricMissing"),
    (Sample(-2.0, NOW), "MetricMissing"),                              # an exporter bug, not a load
    (Sample(40.0, NOW - timedelta(seconds=61)), "MetricStale"),
])
def test_missing_stale_or_negative_is_no_opinion(sample: Sample | None, code: str) -> None:
    rec = rule().recommend(ctx(sample))
    assert rec.replicas is None and rec.missing_data and rec.reason == code
    assert "query 'rps'" in rec.message
    # KEDA's reading, only when asked for: 0, so the policy's min_replicas decides
    keda = rule(missing_as_zero=True).recommend(ctx(sample))
    assert keda.replicas == 0 and not keda.missing_data and "missing_as_zero" in keda.message


def test_the_rule_asks_for_its_query_and_the_decision_log_keeps_the_value() -> None:
    assert rule().queries() == (Q,)
    sig = ModelSignals(MODEL.name, NOW, queries={Q: Sample(12.5, NOW)})
    back = signals_from_json(signals_to_json(sig))
    assert back.query(Q) == Sample(12.5, NOW) and back.replace_samples().queries == back.queries


@pytest.mark.parametrize("params", [{"query": ""}, {"target_per_replica": 0}, {"query": "x" * 4001},
                                    {"signal": "queue_depth"}])
def test_bad_params_are_refused(params: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        PromQL.Params.model_validate({"query": Q, "target_per_replica": 10, **params})
