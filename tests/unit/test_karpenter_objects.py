"""What the karpenter provider reads from Karpenter's objects (pure functions on the API's dicts)
and from a Deployment's pod template."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from kubernetes import client as k8s

from providers.karpenter import (
    capacity_type_problem, failed_launch, interruption_notices, node_bound, pinning_problem, summarize,
)


def claim(name: str, *conds: tuple[str, str], deleting: bool = False, node: str | None = None,
          message: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2025-03-01T12:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": t, "status": s, "reason": "LaunchFailed" if s == "False" else "",
                                              "message": message, "lastTransitionTime": "2025-03-01T11:59:00Z"}
                                             for t, s in conds]}
    if node:
        status.update(nodeName=node, providerID=f"aws:///us-east-1a/{node}")
    return {"metadata": meta, "status": status}


def test_claims_are_counted_by_lifecycle_step_and_failures_are_not_billed() -> None:
    claims = [
        claim("a"),
        claim("b", ("Launched", "True")),
        claim("c", ("Launched", "True"), ("Registered", "True"), node="c"),
        claim("d", ("Launched", "True"), ("Registered", "True"), ("Initialized", "True"), node="d"),
        claim("e", ("Launched", "False"), message="InsufficientInstanceCapacity"),
        claim("f", ("Launched", "True"), ("Registered", "True"), ("Initialized", "True"), node="f", deleting=True),
    ]
    s = summarize(claims)
    assert (s.launching, s.registering, s.initializing, s.ready, s.deleting, s.billed) == (1, 1, 1, 1, 1, 4)


def test_launch_failures_and_interruptions_are_told_apart() -> None:
    assert failed_launch(claim("ok", ("Launched", "True"))) is None
    cause, msg, at = failed_launch(claim("x", ("Launched", "False"), message="no capacity in us-east-1a")) or ("", "", None)
    assert (cause, at) == ("LaunchFailed", datetime(2025, 3, 1, 11, 59, tzinfo=timezone.utc)) and "no capacity" in msg
    # deleted before it launched: Karpenter's answer to insufficient capacity
    assert (failed_launch(claim("y", deleting=True)) or ("",))[0] == "InsufficientCapacity"
    # deleted after it launched: an interruption (or expiry) notice naming the node and instance
    gone = claim("z", ("Launched", "True"), node="ip-10-0-0-7", deleting=True)
    assert failed_launch(gone) is None
    (n,) = interruption_notices([gone, claim("w", ("Launched", "True"), node="ip-10-0-0-8")])
    assert (n.node, n.instance_id, n.source) == ("ip-10-0-0-7", "aws:///us-east-1a/ip-10-0-0-7", "nodeclaim:z deleted")


@pytest.mark.parametrize("limits, bound", [
    ({"cpu": "1000"}, None), ({"nvidia.com/gpu": "16"}, 4), ({"nvidia.com/gpu": 18}, 4),
    ({"nvidia.com/gpu": "16", "nodes": "3"}, 3), ({"nvidia.com/gpu": "2"}, 0), ({"nvidia.com/gpu": "lots"}, None),
])
def test_the_nodepool_limit_is_the_gpu_limit_over_gpus_per_node(limits: dict[str, Any], bound: int | None) -> None:
    assert node_bound({"spec": {"limits": limits}}, 4, "nvidia.com/gpu") == bound


@pytest.mark.parametrize("req, ok", [
    (None, True), ({"operator": "In", "values": ["spot", "on-demand"]}, True), ({"operator": "In", "values": ["on-demand"]}, False),
    ({"operator": "NotIn", "values": ["spot"]}, False), ({"operator": "Exists"}, True),
])
def test_the_nodepool_must_allow_the_pools_capacity_type(req: dict[str, Any] | None, ok: bool) -> None:
    reqs = [] if req is None else [{"key": "karpenter.sh/capacity-type", **req}]
    np = {"metadata": {"name": "gpu"}, "spec": {"template": {"spec": {"requirements": reqs}}}}
    assert (capacity_type_problem(np, "spot") is None) is ok


def _affinity(*terms: list[tuple[str, str, list[str]]]) -> k8s.V1Affinity:
    return k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
        required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(node_selector_terms=[
            k8s.V1NodeSelectorTerm(match_expressions=[k8s.V1NodeSelectorRequirement(key=k, operator=o, values=v)
                                                      for k, o, v in t]) for t in terms])))


def test_a_deployment_pins_nodepool_and_capacity_type_by_selector_or_required_affinity() -> None:
    pinned = k8s.V1PodSpec(containers=[], node_selector={"karpenter.sh/nodepool": "gpu", "karpenter.sh/capacity-type": "spot"})
    assert pinning_problem(pinned, "gpu", "spot", "llm/llama") is None
    both = [("karpenter.sh/nodepool", "In", ["gpu"]), ("karpenter.sh/capacity-type", "In", ["spot"])]
    assert pinning_problem(k8s.V1PodSpec(containers=[], affinity=_affinity(both, both)), "gpu", "spot", "d") is None
    # one term that would allow on-demand: the pods could land elsewhere
    loose = [("karpenter.sh/nodepool", "In", ["gpu"]), ("karpenter.sh/capacity-type", "In", ["spot", "on-demand"])]
    why = pinning_problem(k8s.V1PodSpec(containers=[], affinity=_affinity(both, loose)), "gpu", "spot", "llm/llama")
    assert why is not None and "karpenter.sh/capacity-type: spot" in why and "karpenter.sh/nodepool" not in why
    assert "llm/llama" in (pinning_problem(None, "gpu", "spot", "llm/llama") or "")


# --- the NodePool's bound in placement ------------------------------------------------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from controller.core.model import ModelSpec, PoolSpec, PoolState, ReplicaCapacity, Tier  # noqa: E402
from controller.core.placement import place  # noqa: E402
from controller.core.spec import Placement  # noqa: E402


@given(bound=st.one_of(st.none(), st.integers(0, 12)), total=st.integers(0, 60), current=st.integers(0, 20))
def test_placement_never_plans_past_a_providers_node_bound(bound: int | None, total: int, current: int) -> None:
    spot = PoolSpec("spot", Tier.SPOT, "karpenter", "A100", 4, 8, 4.0)
    od = PoolSpec("od", Tier.ONDEMAND, "karpenter", "A100", 4, 8, 12.0)
    model = ModelSpec("llama", 2, "fp8", ("A100",), 60, {"A100": ReplicaCapacity(1000, 2)}, ("spot", "od"))
    states = {"spot": PoolState("spot", current, current, max_nodes=bound), "od": PoolState("od", 0, 0)}
    result = place(model=model, pools={"spot": spot, "od": od}, states=states, total=total, placement=Placement())
    cap = 2 * (8 if bound is None else min(8, bound))  # 2 replicas of TP 2 per 4-GPU node
    assert result.replicas["spot"] <= cap
    assert sum(result.replicas.values()) == min(total, cap + 2 * 8)
