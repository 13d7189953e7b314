"""The Kubernetes adapter against a real API server emulator (kmock over HTTP on 127.0.0.1).

What kmock lacks is either added by the peer (resourceVersion with 409 on stale writes, the scale
subresource, PUT) or worked around in the assertions: it ignores label selectors, so every test
puts a foreign Deployment's pods and another pool's nodes beside ours and checks they are not
counted; the controllers (scheduler, Deployment controller) are played by ``KubeControllers``
through the API.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client as k8s

from controller.core.model import ActionStatus, ModelSpec, Tier, PoolSpec, PoolState, ReplicaCapacity
from controller.core.placement import place
from controller.protocols import PermanentProviderError, TransientProviderError
from providers.base import RetryPolicy, actions_of
from providers.kubernetes import (
    CALL_DELETION_COST, CALL_SCALE, Deployment, KubernetesCluster, KubernetesPoolProvider, KubernetesSettings,
)
from tests.integration.peers import KubeControllers, KubePeer, taint_node

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
FAST_RETRY = RetryPolicy(budget_s=2.0, base_delay_s=0.005, max_delay_s=0.02, max_attempts=4)


def model_spec(name: str, pools: tuple[str, ...], tp: int = 2) -> ModelSpec:
    return ModelSpec(name=name, tp_degree=tp, quantization="fp8", gpu_types=("A100-80GB",), cold_start_s=90,
                     capacity={"A100-80GB": ReplicaCapacity(1500.0, 3.0)}, pools=pools)


class World:
    """One test's slice of the shared emulator: its namespace, its pool label, its objects."""

    def __init__(self, kube: KubePeer) -> None:
        self.kube = kube
        tag = uuid.uuid4().hex[:6]
        self.ns = f"t-{tag}"
        self.pool_label = {"tidegate.io/pool": f"onprem-{tag}"}
        self.api = kube.api_client()
        self.ctl = KubeControllers(self.api)
        self.core = k8s.CoreV1Api(self.api)
        self.apps = k8s.AppsV1Api(self.api)
        self.pool = PoolSpec(f"onprem-{tag}", Tier.ONPREM, "onprem", "A100-80GB", gpus_per_node=8, max_nodes=4,
                             price_per_node_hour_usd=9.0)
        self.model = model_spec("llama", (self.pool.name,))

    def settings(self, **kw: object) -> KubernetesSettings:
        return KubernetesSettings(retry=FAST_RETRY, **kw)  # type: ignore[arg-type]

    def provider(self, *, settings: KubernetesSettings | None = None,
                 models: dict[str, Deployment] | None = None) -> KubernetesPoolProvider:
        s = settings or self.settings()
        deployments = models or {"llama": Deployment(self.ns, "llama-onprem")}
        return KubernetesPoolProvider(self.pool, deployments, KubernetesCluster(self.api, s),
                                      node_selector=self.pool_label, settings=s)

    def setup(self, replicas: int = 1, nodes: int = 2) -> None:
        """Our Deployment plus, beside it, a foreign Deployment in the same namespace and a node of
        another pool: kmock answers lists with all of them."""
        self.ctl.add_deployment(self.ns, "llama-onprem", {"app": "llama", "pool": self.pool.name}, replicas,
                                gpus=2, node_selector=self.pool_label)
        self.ctl.add_deployment(self.ns, "mistral-onprem", {"app": "mistral", "pool": self.pool.name}, 3,
                                gpus=2, node_selector={"tidegate.io/pool": f"other-{self.ns}"})
        for i in range(nodes):
            self.ctl.add_node(f"{self.ns}-n{i}", self.pool_label, 8)
        self.ctl.add_node(f"{self.ns}-other", {"tidegate.io/pool": f"other-{self.ns}"}, 8)


@pytest.fixture()
def world(kube: KubePeer) -> World:
    return World(kube)


def test_scale_patches_the_scale_subresource_once_and_the_same_call_again_is_a_noop(world: World) -> None:
    world.setup(replicas=1)
    p = world.provider()
    mark = world.kube.mark()
    actions = p.scale(world.model, 3, 0, T0)
    assert [(a.call, a.status) for a in actions] == [(CALL_SCALE, ActionStatus.OK)]
    a = actions[0]
    assert a.provider == "kubernetes" and a.pool == world.pool.name and a.model == "llama"
    assert a.arguments["replicas"] == 3 and a.arguments["previous_replicas"] == 1 and a.latency_ms > 0
    writes = [r for r in world.kube.requests_since(mark) if r.is_write]
    assert [(r.method, r.path) for r in writes] == [
        ("PATCH", f"/apis/apps/v1/namespaces/{world.ns}/deployments/llama-onprem/scale")]
    assert world.apps.read_namespaced_deployment("llama-onprem", world.ns).spec.replicas == 3

    mark = world.kube.mark()
    again = p.scale(world.model, 3, 0, T0 + timedelta(seconds=5))
    assert [(x.call, x.status) for x in again] == [(CALL_SCALE, ActionStatus.NOOP)]
    assert [r for r in world.kube.requests_since(mark) if r.is_write] == []


def test_state_reads_desired_ready_and_the_pools_own_nodes_and_pods_despite_unfiltered_lists(world: World) -> None:
    world.setup(replicas=3, nodes=2)
    p = world.provider()
    before = p.state(world.model, T0)
    # Not reconciled yet: desired is known, readiness is not (missing is not zero).
    assert before.replicas == 3 and before.ready_replicas is None
    world.ctl.reconcile(T0)
    st = p.state(world.model, T0)
    assert (st.pool, st.replicas, st.ready_replicas, st.nodes, st.available) == (world.pool.name, 3, 3, 2, True)
    obs = p.last_observation("llama")
    assert obs is not None
    assert obs.gpus_allocatable == 16  # the other pool's node is not ours
    assert sum(obs.pods_by_node.values()) == 3  # mistral's pods share the namespace, not the count
    # The lists really were unfiltered: the emulator returned the foreign pods and node too.
    assert len(world.core.list_namespaced_pod(world.ns, label_selector="app=llama").items) == 6


def test_a_conflict_from_a_concurrent_writer_is_reread_and_retried(world: World) -> None:
    world.setup(replicas=1)
    p = world.provider()
    key = None

    def hpa_writes_first(emu: object) -> None:
        # Another writer (say, an HPA) scales to 5 between our read and our patch.
        nonlocal key
        for k in list(emu._objects):  # type: ignore[attr-defined]
            if k[2] == "llama-onprem" and k[1] == world.ns:
                key = k
                obj = emu._objects[k]  # type: ignore[attr-defined]
                obj.patch({"spec": {"replicas": 5}, "metadata": {"resourceVersion": emu._next_rv()}})  # type: ignore[attr-defined]

    world.kube.fault("PATCH", rf"/namespaces/{world.ns}/deployments/llama-onprem/scale$", None, before=hpa_writes_first)
    actions = p.scale(world.model, 3, 0, T0)
    assert key is not None
    assert [a.status for a in actions] == [ActionStatus.FAILED_TRANSIENT, ActionStatus.OK]
    assert "409" in (actions[0].error or "") and "ConflictError" in (actions[0].error or "")
    assert actions[1].arguments["previous_replicas"] == 5  # re-read before the second patch
    assert world.apps.read_namespaced_deployment("llama-onprem", world.ns).spec.replicas == 3


def test_persistent_conflicts_raise_a_transient_error_with_every_attempt_recorded(world: World) -> None:
    world.setup(replicas=1)
    p = world.provider()
    world.kube.fault("PATCH", rf"/namespaces/{world.ns}/deployments/llama-onprem/scale$", 409, times=50,
                     message="the object has been modified")
    with pytest.raises(TransientProviderError, match="gave up after 4 attempts") as info:
        p.scale(world.model, 3, 0, T0)
    assert isinstance(info.value.__cause__, k8s.ApiException) and info.value.__cause__.status == 409
    recorded = actions_of(info.value)
    assert len(recorded) == 4 and {a.status for a in recorded} == {ActionStatus.FAILED_TRANSIENT}
    assert world.apps.read_namespaced_deployment("llama-onprem", world.ns).spec.replicas == 1


def test_a_5xx_on_read_is_retried_with_backoff(world: World) -> None:
    world.setup(replicas=1)
    p = world.provider()
    world.kube.fault("GET", rf"/namespaces/{world.ns}/deployments/llama-onprem/scale$", 503, times=2)
    mark = world.kube.mark()
    actions = p.scale(world.model, 2, 0, T0)
    assert [a.status for a in actions] == [ActionStatus.OK]
    gets = [r for r in world.kube.requests_since(mark) if r.method == "GET" and r.subresource == "scale"]
    assert len(gets) == 3


def test_a_missing_deployment_is_a_permanent_error_for_that_model_only(world: World) -> None:
    world.setup(replicas=1)
    phi = model_spec("phi", (world.pool.name,))
    p = world.provider(models={"llama": Deployment(world.ns, "llama-onprem"), "phi": Deployment(world.ns, "phi-onprem")})
    with pytest.raises(PermanentProviderError) as info:
        p.state(phi, T0)
    msg = str(info.value)
    # the namespace's list of Deployments has no such name
    assert "phi-onprem" in msg and "'phi'" in msg and world.pool.name in msg and "not found" in msg
    with pytest.raises(PermanentProviderError) as info2:
        p.scale(phi, 2, 0, T0)
    assert "phi-onprem" in str(info2.value) and "404" in str(info2.value)  # the scale it read
    assert isinstance(info2.value.__cause__, k8s.ApiException)
    # the other model of the same pool is unaffected
    assert [a.status for a in p.scale(world.model, 2, 0, T0)] == [ActionStatus.OK]
    # a model without any Deployment in this pool is refused before any call
    mark = world.kube.mark()
    with pytest.raises(PermanentProviderError, match="has no Deployment in pool"):
        p.scale(model_spec("gemma", (world.pool.name,)), 1, 0, T0)
    assert world.kube.requests_since(mark) == []


def test_replicas_unschedulable_past_the_timeout_mark_the_pool_unavailable_until_the_mark_expires(world: World) -> None:
    world.setup(replicas=1, nodes=1)  # one node of 8 GPUs holds 4 replicas of TP 2
    p = world.provider(settings=world.settings(unschedulable_timeout_s=120, unavailable_for_s=300))
    p.scale(world.model, 6, 0, T0)
    world.ctl.reconcile(T0)  # 4 bound, 2 Pending as Unschedulable since T0
    st = p.state(world.model, T0 + timedelta(seconds=60))
    assert st.available and st.ready_replicas == 4
    st = p.state(world.model, T0 + timedelta(seconds=121))
    assert not st.available
    assert st.unavailable_reason is not None and st.unavailable_reason.startswith("PoolUnavailable: Unschedulable")
    assert "2 replica(s) of llama" in st.unavailable_reason and "insufficient nvidia.com/gpu" in st.unavailable_reason
    # The core moves the surplus elsewhere; the mark stays for its whole period, then expires.
    p.scale(world.model, 4, 0, T0 + timedelta(seconds=125))
    world.ctl.reconcile(T0 + timedelta(seconds=125))
    assert not p.state(world.model, T0 + timedelta(seconds=300)).available
    st = p.state(world.model, T0 + timedelta(seconds=422))
    assert st.available and st.unavailable_reason is None and st.ready_replicas == 4


def test_an_unavailable_pool_keeps_the_replicas_loading_on_its_nodes_and_moves_those_without_one(world: World) -> None:
    world.setup(replicas=1, nodes=1)  # one node of 8 GPUs holds 4 replicas of TP 2
    p = world.provider(settings=world.settings(unschedulable_timeout_s=120, unavailable_for_s=300))
    p.scale(world.model, 6, 0, T0)
    world.ctl.reconcile(T0)  # 4 bound to the node, 2 Pending as Unschedulable
    # two of the bound pods are still loading their engine: not ready yet
    loading = sorted(x.metadata.name for x in world.core.list_namespaced_pod(world.ns, label_selector="app=llama").items
                     if x.spec.node_name and x.metadata.labels.get("app") == "llama")[:2]
    for name in loading:
        world.core.patch_namespaced_pod_status(name, world.ns, {"status": {"conditions": [
            {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}]}})
    dep = world.apps.read_namespaced_deployment("llama-onprem", world.ns)
    world.apps.patch_namespaced_deployment_status("llama-onprem", world.ns, {"status": {
        "observedGeneration": dep.metadata.generation, "replicas": 6, "readyReplicas": 2,
        "availableReplicas": 2, "unavailableReplicas": 4}})
    st = p.state(world.model, T0 + timedelta(seconds=121))
    assert not st.available and (st.replicas, st.ready_replicas, st.scheduled_replicas) == (6, 2, 4)
    # placement keeps the four on the node (two serving, two about to) and moves the two without one
    spot = PoolSpec("spot", Tier.SPOT, "aws", "A100-80GB", gpus_per_node=8, max_nodes=2, price_per_node_hour_usd=12.0)
    model = model_spec("llama", (world.pool.name, "spot"))
    res = place(model=model, pools={world.pool.name: world.pool, "spot": spot},
                states={world.pool.name: st, "spot": PoolState(pool="spot", replicas=0, ready_replicas=0)}, total=6)
    assert res.replicas == {world.pool.name: 4, "spot": 2}
    # a pod being deleted is no replica that stays: one held by a finalizer stays listed with its
    # deletionTimestamp (terminating, as during a grace period), one without goes at once
    world.core.patch_namespaced_pod(loading[0], world.ns, {"metadata": {"finalizers": ["tidegate.test/hold"]}})
    world.core.delete_namespaced_pod(loading[0], world.ns)
    assert p.state(world.model, T0 + timedelta(seconds=125)).scheduled_replicas == 3
    world.core.delete_namespaced_pod(loading[1], world.ns)
    assert p.state(world.model, T0 + timedelta(seconds=126)).scheduled_replicas == 2


def test_interruption_taints_count_the_replicas_on_noticed_nodes(world: World) -> None:
    world.setup(replicas=1, nodes=2)
    p = world.provider()
    p.scale(world.model, 6, 0, T0)  # 4 on the first node, 2 on the second
    world.ctl.reconcile(T0)
    st = p.state(world.model, T0)
    assert (st.interrupted_replicas, st.recent_interruptions, st.nodes) == (0, 0, 2)
    obs = p.last_observation("llama")
    assert obs is not None
    first, second = sorted(obs.pods_by_node)
    taint_node(world.core, second, "aws-node-termination-handler/spot-itn", value="itn-1", at=T0)
    taint_node(world.core, first, "aws-node-termination-handler/rebalance-recommendation", at=T0)
    st = p.state(world.model, T0 + timedelta(seconds=5))
    assert st.interrupted_replicas == obs.pods_by_node[second] == 2  # rebalance alone does not count
    assert st.recent_interruptions == 1
    assert st.nodes == 1  # the noticed node is no capacity to place on
    taint_node(world.core, first, "cloud.google.com/impending-node-termination", at=T0)
    st = p.state(world.model, T0 + timedelta(seconds=10))
    assert st.interrupted_replicas == 6 and st.recent_interruptions == 2


def test_scaling_in_after_a_notice_removes_the_replicas_on_the_noticed_node(world: World) -> None:
    world.setup(replicas=1, nodes=2)
    p = world.provider()
    p.scale(world.model, 6, 0, T0)
    world.ctl.reconcile(T0)
    first, second = sorted(p.observe(world.model, T0).pods_by_node)
    taint_node(world.core, second, "aws-node-termination-handler/spot-itn", at=T0)
    assert p.state(world.model, T0 + timedelta(seconds=5)).interrupted_replicas == 2
    actions = p.scale(world.model, 4, 0, T0 + timedelta(seconds=5))
    # the two doomed pods get the lowest deletion cost first, then the Deployment shrinks
    assert [(a.call, a.status) for a in actions] == [
        (CALL_DELETION_COST, ActionStatus.OK), (CALL_DELETION_COST, ActionStatus.OK), (CALL_SCALE, ActionStatus.OK)]
    world.ctl.reconcile(T0 + timedelta(seconds=10))  # the ReplicaSet honours the cost
    st = p.state(world.model, T0 + timedelta(seconds=10))
    assert (st.replicas, st.ready_replicas, st.interrupted_replicas) == (4, 4, 0)
    assert dict(p.last_observation("llama").pods_by_node) == {first: 4}  # type: ignore[union-attr]
    # the same call again: nothing to annotate, nothing to scale
    assert [a.status for a in p.scale(world.model, 4, 0, T0 + timedelta(seconds=15))] == [ActionStatus.NOOP]
