"""``controller.core.spec.interned``: policies (and the daemon's config) written from one template
share their equal parts, and nothing a reader sees changes: values, equality, and which fields
the author wrote (the policy files merge by it)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.spec import Bounds, PolicySpec, ScalingPolicy, interned
from controller.policyfile import load_policy_text
from policies.base import Registry

TEMPLATE = """apiVersion: tidegate/v1
kind: ScalingPolicy
metadata: {{name: {name}}}
spec:
  model: {name}
  bounds: {{min_replicas: 2, max_replicas: 16}}
  slo: {{p99_latency_ms: 6000, queue_depth_per_replica: 4}}
  rules: [{{kind: forecast, params: {{lead_time_s: 600, headroom: 1.0}}}}]
"""


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.from_entry_points()


def test_policies_from_one_template_share_their_equal_parts(registry: Registry) -> None:
    a = load_policy_text("a.yaml", TEMPLATE.format(name="a"), registry).policies["a"]
    b = load_policy_text("b.yaml", TEMPLATE.format(name="b"), registry).policies["b"]
    assert a.spec.model != b.spec.model
    assert a.spec.bounds is b.spec.bounds and a.spec.slo is b.spec.slo
    assert a.spec.behavior is b.spec.behavior and a.spec.capacity is b.spec.capacity  # defaults too
    assert a.rules[0].params is b.rules[0].params  # the forecast rule's validated params


def test_interning_changes_no_value_and_no_field_the_author_wrote(registry: Registry) -> None:
    doc = ScalingPolicy.model_validate({"apiVersion": "tidegate/v1", "kind": "ScalingPolicy",
                                        "metadata": {"name": "m"},
                                        "spec": {"model": "m", "bounds": {"max_replicas": 8}}})
    # an equal Bounds seen before, with another field written: not the same model to a merge
    other = interned(Bounds(min_replicas=1, max_replicas=8))
    assert other.model_fields_set == {"min_replicas", "max_replicas"}
    out = interned(doc)
    assert out == doc
    assert out.spec.model_fields_set == doc.spec.model_fields_set == {"model", "bounds"}
    assert out.spec.bounds.model_fields_set == {"max_replicas"} and out.spec.bounds is not other
    assert interned(out) is out  # interning again makes nothing new


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 50), st.integers(50, 100))
def test_equal_values_share_one_model_and_unequal_ones_do_not(lo: int, hi: int) -> None:
    a = interned(Bounds(min_replicas=lo, max_replicas=hi))
    b = interned(Bounds(min_replicas=lo, max_replicas=hi))
    assert a is b and a == Bounds(min_replicas=lo, max_replicas=hi)
    c = interned(Bounds(min_replicas=lo, max_replicas=hi + 1))
    assert c is not a and c.max_replicas == hi + 1
    spec = interned(PolicySpec(model="x", bounds=Bounds(min_replicas=lo, max_replicas=hi)))
    assert spec.bounds is a
