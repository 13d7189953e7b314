"""Label selectors, error translation (409 conflicts above all) and node / pod interpretation on
real ``kubernetes.client`` model objects: the parts of the Kubernetes adapter that the API emulator
used by the integration tests cannot check (it ignores selectors and never conflicts by itself).
Also the shared retry and unavailable-cache pieces of ``providers.cloudpool``, on a fake clock."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controller.core.model import Tier, PoolSpec
from controller.protocols import PermanentProviderError, TransientProviderError
from providers.base import NoticeKind, RetryPolicy, UnavailableMarks, retry_transient, unavailable_reason
from providers.kubernetes import (
    ConflictError, LabelIndex, node_allocatable_gpus, node_notices, node_ready, node_schedulable, parse_selector,
    pod_unschedulable, pod_unschedulable_since, selector_from_label_selector, selector_from_labels,
    selector_matches, translate_api_error,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


# --- selectors ---------------------------------------------------------------------------------

POD = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="p", labels={
    "app": "llama", "pool": "aws-spot", "tier": "gpu", "app.kubernetes.io/name": "triton"}))


@pytest.mark.parametrize("selector, expected", [
    ("", True),
    ("app=llama", True),
    ("app==llama", True),
    ("app=mistral", False),
    ("app!=mistral", True),
    ("app!=llama", False),
    ("missing!=x", True),  # != matches objects without the label, as the API server does
    ("app in (llama, mistral)", True),
    ("app in (mistral)", False),
    ("app notin (mistral,phi)", True),
    ("missing notin (x)", True),
    ("pool", True),
    ("!pool", False),
    ("!missing", True),
    ("app.kubernetes.io/name=triton,pool in (aws-spot,gcp-spot),!canary", True),
    ("app=llama,pool=onprem", False),
    ("app=llama, tier = gpu", True),
])
def test_selector_matches_real_pod_labels(selector: str, expected: bool) -> None:
    assert selector_matches(POD.metadata.labels, selector) is expected


@pytest.mark.parametrize("bad", ["app in (a", "app in a)", "=x", "app in ()", "a,,b", "app notin (,)", "app=(x)"])
def test_bad_selectors_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_selector(bad)


def test_structured_selector_string_form_matches_like_the_structure() -> None:
    sel = k8s.V1LabelSelector(
        match_labels={"app": "llama"},
        match_expressions=[
            k8s.V1LabelSelectorRequirement(key="pool", operator="In", values=["aws-spot", "gcp-spot"]),
            k8s.V1LabelSelectorRequirement(key="canary", operator="DoesNotExist"),
            k8s.V1LabelSelectorRequirement(key="tier", operator="Exists"),
            k8s.V1LabelSelectorRequirement(key="zone", operator="NotIn", values=["bad"]),
        ])
    text = selector_from_label_selector(sel)
    assert text == "app=llama,pool in (aws-spot,gcp-spot),!canary,tier,zone notin (bad)"
    assert selector_matches(POD.metadata.labels, text)
    assert not selector_matches({**POD.metadata.labels, "canary": "1"}, text)
    assert not selector_matches({**POD.metadata.labels, "pool": "onprem"}, text)


def _structured(labels: dict[str, str], sel: k8s.V1LabelSelector) -> bool:
    """The label selector semantics of the Kubernetes API, written directly on the structure."""
    for k, v in (sel.match_labels or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.match_expressions or []:
        if e.operator == "In" and labels.get(e.key) not in e.values:
            return False
        if e.operator == "NotIn" and e.key in labels and labels[e.key] in e.values:
            return False
        if e.operator == "Exists" and e.key not in labels:
            return False
        if e.operator == "DoesNotExist" and e.key in labels:
            return False
    return True


_keys = st.sampled_from(["app", "pool", "tier", "example.com/zone"])
_vals = st.sampled_from(["a", "b", "c-1", "x.y"])


@st.composite
def _selectors(draw: st.DrawFn) -> k8s.V1LabelSelector:
    exprs = []
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
        vals = sorted(set(draw(st.lists(_vals, min_size=1, max_size=3)))) if op in ("In", "NotIn") else None
        exprs.append(k8s.V1LabelSelectorRequirement(key=draw(_keys), operator=op, values=vals))
    return k8s.V1LabelSelector(match_labels=draw(st.dictionaries(_keys, _vals, max_size=2)) or None,
                               match_expressions=exprs or None)


@settings(max_examples=300, deadline=None)
@given(labels=st.dictionaries(_keys, _vals, max_size=4), sel=_selectors())
def test_string_form_of_any_structured_selector_agrees_with_the_structure(labels: dict[str, str],
                                                                          sel: k8s.V1LabelSelector) -> None:
    assert selector_matches(labels, selector_from_label_selector(sel)) is _structured(labels, sel)


@settings(max_examples=300, deadline=None)
@given(objects=st.lists(st.dictionaries(_keys, _vals, max_size=4), max_size=12), sel=_selectors())
def test_a_label_index_selects_what_the_selector_matches_in_the_order_listed(objects: list[dict[str, str]],
                                                                            sel: k8s.V1LabelSelector) -> None:
    pods = [k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=f"p{i}", labels=labels or None)) for i, labels in enumerate(objects)]
    reqs = parse_selector(selector_from_label_selector(sel))
    index = LabelIndex(pods, lambda p: p.metadata.labels)
    assert index.select(reqs) == [p for p in pods if selector_matches(p.metadata.labels, reqs)]


def test_selector_from_labels_round_trips() -> None:
    text = selector_from_labels({"pool": "aws-spot", "karpenter.sh/capacity-type": "spot"})
    assert text == "karpenter.sh/capacity-type=spot,pool=aws-spot"
    assert selector_matches({"pool": "aws-spot", "karpenter.sh/capacity-type": "spot", "x": "y"}, text)
    assert not selector_matches({"pool": "aws-spot"}, text)


# --- error translation -------------------------------------------------------------------------


def _api_exc(status: int, reason: str, message: str) -> ApiException:
    e = ApiException(status=status, reason=reason)
    e.body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status,
                         "reason": reason, "message": message})
    return e


def _raise_translated(e: BaseException, what: str) -> BaseException:
    try:
        try:
            raise e
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as inner:
            raise translate_api_error(inner, what) from inner
    except (TransientProviderError, PermanentProviderError) as out:
        return out
    raise AssertionError("not translated")


def test_409_conflict_is_a_retryable_conflict_with_the_api_error_chained() -> None:
    e = _api_exc(409, "Conflict", 'Operation cannot be fulfilled on deployments.apps "llama": the object has been modified')
    out = _raise_translated(e, "Deployment llm/llama of model 'llama' in pool 'aws-spot'")
    assert isinstance(out, ConflictError) and isinstance(out, TransientProviderError)
    assert out.retryable
    assert out.__cause__ is e
    assert "the object has been modified" in str(out)


def test_404_names_the_configured_deployment_model_and_pool_and_is_permanent() -> None:
    e = _api_exc(404, "NotFound", 'deployments.apps "llama-spot" not found')
    out = _raise_translated(e, "Deployment llm/llama-spot of model 'llama' in pool 'aws-spot'")
    assert isinstance(out, PermanentProviderError) and not out.retryable
    assert "llama-spot" in str(out) and "'llama'" in str(out) and "'aws-spot'" in str(out) and "404" in str(out)
    assert out.__cause__ is e


@pytest.mark.parametrize("status, transient", [
    (429, True), (500, True), (502, True), (503, True), (504, True), (0, True),
    (400, False), (401, False), (403, False), (422, False),
])
def test_status_codes_map_onto_transient_or_permanent(status: int, transient: bool) -> None:
    out = translate_api_error(_api_exc(status, "X", "m"), "thing")
    assert isinstance(out, TransientProviderError) is transient
    assert isinstance(out, PermanentProviderError) is (not transient)


def test_network_errors_are_transient() -> None:
    pool = urllib3.HTTPConnectionPool("127.0.0.1", 1)
    out = _raise_translated(urllib3.exceptions.MaxRetryError(pool, "/", reason=ConnectionRefusedError()), "list nodes")
    assert isinstance(out, TransientProviderError)
    assert isinstance(out.__cause__, urllib3.exceptions.MaxRetryError)


# --- nodes and pods ----------------------------------------------------------------------------


def _node(taints: list[k8s.V1Taint] | None = None, ready: str = "True", gpus: str | None = "8",
          unschedulable: bool | None = None, conditions: list[k8s.V1NodeCondition] | None = None) -> k8s.V1Node:
    return k8s.V1Node(
        metadata=k8s.V1ObjectMeta(name="ip-10-0-0-1.ec2.internal", labels={"pool": "aws-spot"}),
        spec=k8s.V1NodeSpec(taints=taints, unschedulable=unschedulable, provider_id="aws:///us-east-1a/i-0abc"),
        status=k8s.V1NodeStatus(
            allocatable={"nvidia.com/gpu": gpus} if gpus is not None else {"cpu": "8"},
            conditions=[k8s.V1NodeCondition(type="Ready", status=ready)] + (conditions or [])))


def test_termination_handler_taints_become_notices_of_the_right_kind() -> None:
    n = _node(taints=[
        k8s.V1Taint(key="aws-node-termination-handler/spot-itn", effect="NoSchedule", value="evt-1",
                    time_added=T0),
        k8s.V1Taint(key="aws-node-termination-handler/rebalance-recommendation", effect="NoSchedule"),
        k8s.V1Taint(key="nvidia.com/gpu", effect="NoSchedule"),
    ])
    notices = node_notices(n)
    assert [(x.kind, x.source) for x in notices] == [
        (NoticeKind.INTERRUPTION, "taint:aws-node-termination-handler/spot-itn"),
        (NoticeKind.REBALANCE, "taint:aws-node-termination-handler/rebalance-recommendation"),
    ]
    assert notices[0].at == T0 and notices[0].node == "ip-10-0-0-1.ec2.internal"


def test_gke_impending_termination_taint_and_configured_conditions() -> None:
    n = _node(taints=[k8s.V1Taint(key="cloud.google.com/impending-node-termination", effect="NoSchedule")],
              conditions=[k8s.V1NodeCondition(type="TerminationScheduled", status="True",
                                              last_transition_time=T0)])
    assert [x.source for x in node_notices(n)] == ["taint:cloud.google.com/impending-node-termination"]
    both = node_notices(n, condition_types=("TerminationScheduled",))
    assert [x.kind for x in both] == [NoticeKind.INTERRUPTION, NoticeKind.INTERRUPTION]
    assert both[1].source == "condition:TerminationScheduled" and both[1].at == T0


def test_node_readiness_schedulability_and_gpus() -> None:
    assert node_ready(_node()) and not node_ready(_node(ready="False")) and not node_ready(_node(ready="Unknown"))
    assert node_schedulable(_node()) and not node_schedulable(_node(unschedulable=True))
    assert node_allocatable_gpus(_node(gpus="4")) == 4
    assert node_allocatable_gpus(_node(gpus=None)) == 0


def _pod(phase: str, *, node: str | None = None, cond: k8s.V1PodCondition | None = None,
         created: datetime | None = None) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="p", namespace="llm", creation_timestamp=created),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="c")], node_name=node),
        status=k8s.V1PodStatus(phase=phase, conditions=[cond] if cond else None))


def test_unschedulable_pods_and_since_when() -> None:
    unsched = k8s.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable",
                                 last_transition_time=T0, message="0/3 nodes are available: insufficient nvidia.com/gpu")
    assert pod_unschedulable(_pod("Pending", cond=unsched))
    assert pod_unschedulable_since(_pod("Pending", cond=unsched)) == T0
    no_time = k8s.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable")
    assert pod_unschedulable_since(_pod("Pending", cond=no_time, created=T0 - timedelta(minutes=5))) == T0 - timedelta(minutes=5)
    assert pod_unschedulable_since(_pod("Pending", cond=no_time)) is None
    # pending for other reasons (image pull, just created) or bound: not a capacity problem
    assert not pod_unschedulable(_pod("Pending"))
    assert not pod_unschedulable(_pod("Pending", node="n1", cond=unsched))
    assert not pod_unschedulable(_pod("Running", node="n1"))


# --- shared provider pieces: retry with jitter inside a budget, unavailable marks ---------------


class _FakeTime:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_retry_backs_off_exponentially_with_full_jitter_until_success() -> None:
    ft = _FakeTime()
    calls = []

    def flaky() -> str:
        calls.append(ft.t)
        if len(calls) < 4:
            raise TransientProviderError("throttled")
        return "ok"

    value, attempts = retry_transient(flaky, RetryPolicy(budget_s=100, base_delay_s=1, max_delay_s=3, max_attempts=10),
                                      sleep=ft.sleep, monotonic=ft.monotonic, rng=lambda: 0.5)
    assert (value, attempts) == ("ok", 4)
    assert ft.sleeps == [0.5, 1.0, 1.5]  # half of the bounds 1, 2, 3 (capped at max_delay_s)


def test_retry_stops_at_the_budget_and_keeps_the_library_error_chained() -> None:
    ft = _FakeTime()
    lib = ConnectionResetError("reset by peer")

    def always() -> None:
        ft.t += 0.4  # each attempt takes time too
        try:
            raise lib
        except OSError as e:
            raise TransientProviderError("throttled") from e

    with pytest.raises(TransientProviderError, match="gave up after") as info:
        retry_transient(always, RetryPolicy(budget_s=2.0, base_delay_s=1, max_delay_s=8, max_attempts=50),
                        sleep=ft.sleep, monotonic=ft.monotonic, rng=lambda: 1.0)
    assert info.value.__cause__ is lib
    assert ft.t <= 2.0 + 0.4  # never sleeps past the budget
    assert len(ft.sleeps) == 1


def test_permanent_errors_are_not_retried() -> None:
    ft = _FakeTime()
    n = []

    def bad() -> None:
        n.append(1)
        raise PermanentProviderError("no such group")

    with pytest.raises(PermanentProviderError):
        retry_transient(bad, RetryPolicy(), sleep=ft.sleep, monotonic=ft.monotonic)
    assert n == [1] and ft.sleeps == []


def test_unavailable_marks_expire_and_a_later_expiry_wins() -> None:
    m = UnavailableMarks()
    m.mark("aws-spot", T0 + timedelta(minutes=3), "first")
    m.mark("aws-spot", T0 + timedelta(minutes=1), "shorter")  # does not shorten the mark
    assert m.reason("aws-spot", T0 + timedelta(minutes=2)) == "first"
    m.mark("aws-spot", T0 + timedelta(minutes=5), "renewed")
    assert m.reason("aws-spot", T0 + timedelta(minutes=4)) == "renewed"
    assert m.reason("aws-spot", T0 + timedelta(minutes=5)) is None
    assert m.reason("gcp-spot", T0) is None


def test_unavailable_reason_carries_the_placement_reason_code() -> None:
    spot = PoolSpec("aws-spot", Tier.SPOT, "aws", "A10G", 4, 8, 2.0)
    od = PoolSpec("aws-od", Tier.ONDEMAND, "aws", "A10G", 4, 8, 5.0)
    assert unavailable_reason(spot, "InsufficientCapacity", "x").startswith("SpotPoolUnavailable: InsufficientCapacity")
    assert unavailable_reason(od, "Unschedulable", "x").startswith("PoolUnavailable: Unschedulable")
