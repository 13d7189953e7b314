"""Karpenter and cluster-autoscaler pools against the API emulator (kmock), Karpenter played by
``KarpenterControllers`` through the API (NodePools, NodeClaims, Nodes), the scheduler and the
Deployment controller by ``KubeControllers``.

The pools are wired from a daemon config (``providers.wiring.build_real_pools``), as the daemon
wires them. The emulator ignores label selectors, so every test has another NodePool's claims and
nodes beside its own.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from kubernetes import client as k8s

from controller.config import DaemonConfig
from controller.core.model import ActionStatus, ModelSpec
from controller.core.placement import place
from controller.core.spec import Placement
from controller.protocols import SharesReads
from providers.karpenter import KarpenterPoolProvider
from providers.kubernetes import CALL_SCALE, KubernetesPoolProvider, KubernetesSettings
from providers.real import RealSettings
from providers.wiring import build_real_pools
from tests.integration.peers import KarpenterControllers, KubeControllers, KubePeer
from tests.integration.test_kubernetes_provider import FAST_RETRY

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


class KarpenterWorld:
    """One test's NodePools (spot ``np-TAG``, on-demand ``od-TAG`` and a foreign one), the pools
    ``spot`` (karpenter), ``od`` (karpenter) and ``ca`` (cluster-autoscaler) with a Deployment of
    llama (TP 2) in each, nodes of 4 GPUs."""

    def __init__(self, kube: KubePeer, *, spot_gpu_limit: int | None = 16, pin: bool = True) -> None:
        self.kube = kube
        tag = uuid.uuid4().hex[:6]
        self.ns = f"k-{tag}"
        self.api = kube.api_client()
        self.ctl = KubeControllers(self.api)
        self.karpenter = KarpenterControllers(self.ctl)
        self.np = {"spot": f"np-{tag}", "od": f"od-{tag}"}
        self.karpenter.add_node_pool(self.np["spot"], "spot", gpu_limit=spot_gpu_limit)
        self.karpenter.add_node_pool(self.np["od"], "on-demand")
        self.karpenter.add_node_pool(f"other-{tag}", "spot")  # someone else's, beside ours
        self.ca_labels = {"tidegate.io/pool": f"ca-{tag}"}
        selectors = {
            "spot": {"karpenter.sh/nodepool": self.np["spot"], "karpenter.sh/capacity-type": "spot"},
            "od": {"karpenter.sh/nodepool": self.np["od"], "karpenter.sh/capacity-type": "on-demand"},
            "ca": self.ca_labels,
        }
        if not pin:
            selectors["spot"] = {"karpenter.sh/nodepool": self.np["spot"]}
        for p, sel in selectors.items():
            self.ctl.add_deployment(self.ns, f"llama-{p}", {"app": "llama", "pool": p}, 0, gpus=2, node_selector=sel)
        self.ctl.add_deployment(self.ns, f"other-{tag}", {"app": "other"}, 2, gpus=2,
                                node_selector={"karpenter.sh/nodepool": f"other-{tag}"})
        self.cfg = DaemonConfig.model_validate({
            "providers": {"type": "real"},
            "pools": [
                {"name": "spot", "tier": "spot", "provider": "karpenter", "gpu_type": "A100-80GB", "gpus_per_node": 4,
                 "max_nodes": 8, "price_per_node_hour_usd": 4.0, "karpenter": {"node_pool": self.np["spot"]}},
                {"name": "od", "tier": "ondemand", "provider": "karpenter", "gpu_type": "A100-80GB", "gpus_per_node": 4,
                 "max_nodes": 8, "price_per_node_hour_usd": 12.0, "karpenter": {"node_pool": self.np["od"]}},
                {"name": "ca", "tier": "spot", "provider": "cluster-autoscaler", "gpu_type": "A100-80GB",
                 "gpus_per_node": 4, "max_nodes": 2, "price_per_node_hour_usd": 5.0,
                 "kubernetes": {"node_selector": self.ca_labels}},
            ],
            "models": [{"name": "llama", "tp_degree": 2, "quantization": "fp8", "gpu_types": ["A100-80GB"],
                        "cold_start_s": 90, "capacity": {"A100-80GB": {"output_tokens_per_s": 1500, "requests_per_s": 3}},
                        "deployments": {p: {"namespace": self.ns, "name": f"llama-{p}"} for p in selectors}}],
        })
        self.model: ModelSpec = self.cfg.model_specs()["llama"]
        self.specs = self.cfg.pool_specs()
        settings = RealSettings(kubernetes=KubernetesSettings(retry=FAST_RETRY, unschedulable_timeout_s=120,
                                                              unavailable_for_s=180))
        # the daemon's own client (no test token), so the request log tells its calls apart
        daemon_api = k8s.ApiClient(k8s.Configuration(host=kube.url))
        self.pools = build_real_pools(self.cfg, kube_api=daemon_api, settings=settings).pools
        self.now = T0

    def later(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now

    def catch_up(self) -> None:
        self.karpenter.catch_up(self.now)

    def daemon_requests(self, mark: int) -> list[Any]:
        return [r for r in self.kube.requests_since(mark) if not r.by_test]


@pytest.fixture()
def world(kube: KubePeer) -> KarpenterWorld:
    return KarpenterWorld(kube)


def test_pools_are_wired_to_the_deployment_only_and_karpenter_brings_the_nodes(world: KarpenterWorld) -> None:
    spot = world.pools["spot"]
    assert isinstance(spot, KarpenterPoolProvider) and isinstance(world.pools["ca"], KubernetesPoolProvider)
    st = spot.state(world.model, world.now)
    assert (st.replicas, st.nodes, st.available, st.max_nodes) == (0, 0, True, 4)  # 16 GPUs / 4 per node

    mark = world.kube.mark()
    actions = spot.scale(world.model, 4, 2, world.now)
    assert [(a.call, a.status) for a in actions] == [(CALL_SCALE, ActionStatus.OK)]
    # the only write is the Deployment's scale: no node group, no NodePool or NodeClaim touched
    assert [(r.method, r.path) for r in world.daemon_requests(mark) if r.is_write] == [
        ("PATCH", f"/apis/apps/v1/namespaces/{world.ns}/deployments/llama-spot/scale")]

    # Karpenter sees the Pending pods and claims 2 nodes; they are billed from the launch on
    world.ctl.reconcile(world.now)
    world.karpenter.provision(world.now)
    world.karpenter.progress(world.now)
    st = spot.state(world.model, world.later(30))
    assert (st.replicas, st.ready_replicas, st.nodes) == (4, 0, 2)
    assert spot.last_claims is not None and spot.last_claims.registering == 2
    world.karpenter.progress(world.now)
    world.karpenter.progress(world.now)
    world.ctl.reconcile(world.now)
    st = spot.state(world.model, world.later(30))
    assert (st.ready_replicas, st.nodes, st.available) == (4, 2, True)
    assert spot.last_claims is not None and spot.last_claims.ready == 2
    # the other NodePool's claims (the emulator listed them too) are not ours
    assert len(world.karpenter.claims()) > len(world.karpenter.claims(world.np["spot"]))


def test_the_nodepool_limit_bounds_the_placement(kube: KubePeer) -> None:
    w = KarpenterWorld(kube, spot_gpu_limit=8)
    states = {p: prov.state(w.model, w.now) for p, prov in w.pools.items()}
    assert states["spot"].max_nodes == 2 and states["od"].max_nodes is None
    result = place(model=w.model, pools=w.specs, states=states, total=8, placement=Placement())
    # spot holds 2 nodes x 2 replicas; the rest goes to the cluster-autoscaler spot pool (2 nodes
    # at most) and then on-demand, although the spot pool's max_nodes says 8
    assert result.replicas == {"spot": 4, "ca": 4, "od": 0}


def test_a_launch_that_meets_insufficient_capacity_marks_the_pool_unavailable_for_the_configured_time(
        world: KarpenterWorld) -> None:
    spot = world.pools["spot"]
    world.karpenter.insufficient_capacity.add(world.np["spot"])
    spot.scale(world.model, 2, 1, world.now)
    world.ctl.reconcile(world.now)
    world.karpenter.provision(world.now)  # the claim is deleted before it launches
    st = spot.state(world.model, world.later(5))
    assert not st.available and st.unavailable_reason is not None
    assert st.unavailable_reason.startswith("SpotPoolUnavailable: InsufficientCapacity")
    assert world.np["spot"] in st.unavailable_reason and st.nodes == 0
    # The core moves the replicas elsewhere; Karpenter finishes the deletion. The mark stays for
    # its 180 s from the failure, then the pool is tried again.
    spot.scale(world.model, 0, 0, world.now)
    world.ctl.reconcile(world.now)
    world.karpenter.settle()
    world.karpenter.insufficient_capacity.clear()
    assert not spot.state(world.model, world.later(170)).available
    assert spot.state(world.model, world.later(10)).available


def test_launched_false_is_a_launch_failure_too(world: KarpenterWorld) -> None:
    od = world.pools["od"]
    od.scale(world.model, 2, 1, world.now)
    world.ctl.reconcile(world.now)
    world.karpenter.provision(world.now)
    claim = world.karpenter.claims(world.np["od"])[0]["metadata"]["name"]
    k8s.CustomObjectsApi(world.api).patch_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", claim, {
        "status": {"conditions": [{"type": "Launched", "status": "False", "reason": "LaunchFailed",
                                   "message": "InsufficientInstanceCapacity: no p4d capacity in us-east-1a",
                                   "lastTransitionTime": world.now.strftime("%Y-%m-%dT%H:%M:%SZ")}]}})
    st = od.state(world.model, world.later(5))
    assert not st.available and st.unavailable_reason is not None
    assert st.unavailable_reason.startswith("PoolUnavailable: LaunchFailed") and "no p4d capacity" in st.unavailable_reason


def test_karpenters_interruption_handling_counts_as_interruptions_and_consolidation_does_not(
        world: KarpenterWorld) -> None:
    spot = world.pools["spot"]
    spot.scale(world.model, 4, 2, world.now)
    world.catch_up()
    st = spot.state(world.model, world.later(30))
    assert (st.ready_replicas, st.interrupted_replicas, st.recent_interruptions) == (4, 0, 0)
    nodes = sorted(world.karpenter.claims(world.np["spot"]), key=lambda c: c["metadata"]["name"])
    doomed = nodes[0]["status"]["nodeName"]
    world.karpenter.interrupt(doomed, world.now)
    st = spot.state(world.model, world.later(5))
    assert (st.interrupted_replicas, st.recent_interruptions) == (2, 1)
    # the replicas go elsewhere; Karpenter drains and deletes the node, the Deployment shrinks
    spot.scale(world.model, 2, 1, world.now)
    world.karpenter.settle()
    world.ctl.reconcile(world.now)
    st = spot.state(world.model, world.later(5))
    assert (st.ready_replicas, st.interrupted_replicas, st.recent_interruptions, st.nodes) == (2, 0, 1, 1)
    # scale to zero: Karpenter consolidates the empty node, which is no interruption
    spot.scale(world.model, 0, 0, world.now)
    world.ctl.reconcile(world.now)
    world.karpenter.consolidate(world.now)
    st = spot.state(world.model, world.later(5))
    assert st.recent_interruptions == 1 and st.available


def test_a_deployment_not_pinned_to_the_capacity_type_makes_the_pool_unavailable_with_the_fix(kube: KubePeer) -> None:
    w = KarpenterWorld(kube, pin=False)
    st = w.pools["spot"].state(w.model, w.now)
    assert not st.available and st.unavailable_reason is not None
    assert "Misconfigured" in st.unavailable_reason and "karpenter.sh/capacity-type: spot" in st.unavailable_reason
    assert f"{w.ns}/llama-spot" in st.unavailable_reason and "nodeSelector" in st.unavailable_reason
    assert w.pools["od"].state(w.model, w.now).available


def test_a_missing_nodepool_makes_the_pool_unavailable_naming_it(world: KarpenterWorld) -> None:
    k8s.CustomObjectsApi(world.api).delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", world.np["od"])
    st = world.pools["od"].state(world.model, world.now)
    assert not st.available and st.unavailable_reason is not None
    assert world.np["od"] in st.unavailable_reason and "404" in st.unavailable_reason and st.max_nodes is None


def test_cluster_autoscaler_pool_is_the_deployment_alone_and_times_out_unschedulable_replicas(
        world: KarpenterWorld) -> None:
    ca = world.pools["ca"]
    mark = world.kube.mark()
    ca.scale(world.model, 2, 1, world.now)
    assert [(r.method, r.path) for r in world.daemon_requests(mark) if r.is_write] == [
        ("PATCH", f"/apis/apps/v1/namespaces/{world.ns}/deployments/llama-ca/scale")]
    world.ctl.reconcile(world.now)  # no node yet: Pending as unschedulable
    assert ca.state(world.model, world.later(60)).available
    st = ca.state(world.model, world.later(61))
    assert not st.available and (st.unavailable_reason or "").startswith("SpotPoolUnavailable: Unschedulable")


def test_burst_cycle_over_karpenter_pools_placed_by_the_core(world: KarpenterWorld) -> None:
    """Spot and on-demand Karpenter pools, placed by the core's placer as the daemon would: load
    rises onto spot, Karpenter cannot get spot capacity and on-demand takes the rest, a spot
    interruption is replaced in the same tick, and load falls back off on-demand first while
    Karpenter consolidates the empty nodes."""
    w = world
    pools = {p: w.specs[p] for p in ("spot", "od")}

    def tick(total: int) -> tuple[dict[str, int], Any]:
        w.later(30)
        states = {p: w.pools[p].state(w.model, w.now) for p in pools}
        result = place(model=w.model, pools=pools, states=states, total=total, placement=Placement())
        for p in sorted(pools, key=lambda p: result.replicas[p] - (states[p].replicas or 0)):
            w.pools[p].scale(w.model, result.replicas[p], pools[p].nodes_for(w.model, result.replicas[p]), w.now)
        return {p: result.replicas[p] for p in pools}, result

    assert tick(4)[0] == {"spot": 4, "od": 0}
    w.catch_up()
    assert w.pools["spot"].state(w.model, w.now).ready_replicas == 4

    # Spot runs dry: Karpenter's launches for the next replicas fail; the pool is marked and the
    # next tick puts the rest on on-demand.
    w.karpenter.insufficient_capacity.add(w.np["spot"])
    assert tick(8)[0] == {"spot": 8, "od": 0}
    w.catch_up()
    placed, result = tick(8)
    assert placed == {"spot": 4, "od": 4} and result.reason == "SpotPoolUnavailable"
    w.karpenter.settle()
    w.karpenter.insufficient_capacity.clear()
    w.catch_up()
    assert w.pools["od"].state(w.model, w.now).ready_replicas == 4

    # A spot node is interrupted: its two replicas move to on-demand in the same decision.
    node = w.karpenter.claims(w.np["spot"])[0]["status"]["nodeName"]
    w.karpenter.interrupt(node, w.now)
    placed, result = tick(8)
    assert result.interrupted_removed == 2 and placed == {"spot": 2, "od": 6}
    w.karpenter.settle()
    w.catch_up()
    assert {p: w.pools[p].state(w.model, w.now).ready_replicas for p in pools} == {"spot": 2, "od": 6}

    # Load falls: on-demand goes first; Karpenter consolidates its empty nodes, no interruption.
    assert tick(2)[0] == {"spot": 2, "od": 0}
    w.ctl.reconcile(w.now)
    w.karpenter.consolidate(w.now)
    w.karpenter.settle()
    od = w.pools["od"].state(w.model, w.later(5))
    assert (od.replicas, od.nodes, od.recent_interruptions, od.available) == (0, 0, 0, True)
    assert w.pools["spot"].state(w.model, w.now).recent_interruptions == 1


def test_a_lowered_nodepool_limit_stops_growth_but_keeps_the_nodes_already_there(world: KarpenterWorld) -> None:
    spot = world.pools["spot"]
    spot.scale(world.model, 6, 3, world.now)
    world.catch_up()
    assert spot.state(world.model, world.later(30)).nodes == 3
    k8s.CustomObjectsApi(world.api).patch_cluster_custom_object(
        "karpenter.sh", "v1", "nodepools", world.np["spot"], {"spec": {"limits": {"nvidia.com/gpu": "8"}}})
    st = spot.state(world.model, world.later(30))
    assert (st.max_nodes, st.ready_replicas) == (3, 6)  # 2 by the limit, but 3 are there
    spot.scale(world.model, 2, 1, world.now)
    world.ctl.reconcile(world.now)
    world.karpenter.consolidate(world.now)
    world.karpenter.settle()
    assert spot.state(world.model, world.later(30)).max_nodes == 2


def test_within_a_tick_the_pools_share_one_read_of_each_kind_and_the_next_tick_reads_afresh(
        world: KarpenterWorld) -> None:
    """The pools of one cluster, as the daemon wires them, inside the block the ``Controller``
    holds open for a tick: every NodeClaim by one LIST, each NodePool by one GET, the namespace's
    Deployments and pods and the nodes by one LIST each, however many models and pools ask."""
    spot = world.pools["spot"]
    assert isinstance(spot, KarpenterPoolProvider)
    assert all(isinstance(p, SharesReads) for p in world.pools.values())  # the Controller opens it for them
    mark = world.kube.mark()
    with spot.sharing_reads():
        for _ in range(3):  # three models would ask as often
            for p in world.pools.values():
                p.state(world.model, world.now)
    paths = sorted(r.path for r in world.daemon_requests(mark))
    assert paths == sorted([
        f"/apis/karpenter.sh/v1/nodepools/{world.np['spot']}", f"/apis/karpenter.sh/v1/nodepools/{world.np['od']}",
        "/apis/karpenter.sh/v1/nodeclaims", f"/apis/apps/v1/namespaces/{world.ns}/deployments",
        f"/api/v1/namespaces/{world.ns}/pods", "/api/v1/nodes"])

    # Karpenter launches for the spot pool between two ticks: the next tick sees the claims
    spot.scale(world.model, 2, 1, world.now)
    world.ctl.reconcile(world.now)
    world.karpenter.provision(world.now)
    with spot.sharing_reads():
        assert spot.state(world.model, world.later(30)).nodes == 1  # one claim, billed from its launch
