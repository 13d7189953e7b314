"""One contract for every ``PoolProvider``: the simulated pools (``providers.sim``) and each real
adapter (Kubernetes alone for on-prem, Kubernetes + AWS Auto Scaling, Kubernetes + GCP managed
instance group, Kubernetes + Karpenter's NodePool and NodeClaims, Kubernetes alone under
cluster-autoscaler) pass the same tests, so the simulated fleet cannot drift from the real ones.

The real adapters run against their peers (kmock, moto, the local compute server). "The world
catches up" (nodes come up, pods get scheduled and become ready) is, for the sim, time passing, and
for the real peers, the test playing the cloud and the Kubernetes controllers.

The end of the file drives a whole burst cycle through the real adapters with the real placement
function of the core: on-prem first, spot spread over AWS and GCP, a spot interruption replaced in
the same tick, an insufficient-capacity failure falling back to on-demand, and the way down
releasing spot first, nodes last.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials

from controller.core.model import Action, ActionStatus, ModelSpec, Tier, PoolSpec, PoolState
from controller.core.placement import place
from controller.core.spec import Placement
from controller.protocols import PermanentProviderError, PoolProvider, TransientProviderError
from providers.aws import (
    CALL_SET_DESIRED, CALL_TERMINATE, AwsInterruptionQueue, AwsNodeGroup, AwsSettings, make_client,
)
from providers.cloudpool import CloudPoolProvider
from providers.gcp import CALL_DELETE_INSTANCES, CALL_RESIZE, GcpNodeGroup, GcpSettings, make_mig_client
from providers.kubernetes import CALL_SCALE, Deployment, KubernetesCluster, KubernetesPoolProvider, KubernetesSettings
from tests.integration.gcp_server import GcpComputeServer
from tests.integration.peers import (
    AWS_REGION, AwsPeer, KubeControllers, KubePeer, asg_instances, aws_env, create_asg, query_error,
    scaling_activities, spot_interruption_event,
)
from tests.integration.test_aws_provider import AwsWorld
from tests.integration.test_gcp_provider import GcpWorld
from tests.integration.test_kubernetes_provider import FAST_RETRY, World, model_spec

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
SPREAD = Placement.model_validate({"spot_spread_min_pools": 2})


# --- peers (module scope: started once for every parameter) ------------------------------------


@pytest.fixture(scope="module")
def gcp_clients(gcp: GcpComputeServer) -> dict[str, object]:
    s = GcpSettings(api_endpoint=gcp.url, retry=FAST_RETRY)
    return {"zonal": make_mig_client(regional=False, settings=s, credentials=AnonymousCredentials()),
            "regional": make_mig_client(regional=True, settings=s, credentials=AnonymousCredentials()),
            "settings": s}


# --- harnesses ---------------------------------------------------------------------------------


@dataclass
class Harness:
    """One provider under the contract, with the knobs the contract needs."""

    provider: PoolProvider
    model: ModelSpec
    pool: PoolSpec
    has_node_group: bool
    node_calls: frozenset[str]
    replica_call: str
    catch_up: Callable[[datetime], None]
    """Let the world catch up with what was asked (time passes / controllers and cloud act)."""
    writes: Callable[[], int]
    """How many changes the peers have accepted so far."""
    fail_next_write: Callable[[], None]
    """Make the next scale's first change fail transiently (without effect)."""
    now: datetime = T0

    def later(self, seconds: float) -> datetime:
        self.now = self.now + timedelta(seconds=seconds)
        return self.now


_SIM_CONFIG: dict[str, Any] = {
    "providers": {"type": "simulated", "seed": 7, "interruptions_per_node_hour": 0.0},
    "pools": [
        {"name": "onprem", "kind": "onprem", "gpu_type": "A100-80GB", "gpus_per_node": 8, "max_nodes": 1,
         "price_per_node_hour_usd": 9.0},
        {"name": "aws-spot", "kind": "aws-spot", "gpu_type": "A100-80GB", "gpus_per_node": 4, "max_nodes": 4,
         "price_per_node_hour_usd": 12.0, "provisioning_delay_s": 180},
    ],
    "models": [{"name": "llama", "tp_degree": 2, "quantization": "fp8", "gpu_types": ["A100-80GB"],
                "cold_start_s": 90, "capacity": {"A100-80GB": {"output_tokens_per_s": 1500, "requests_per_s": 3}},
                "deployments": {"onprem": {"name": "llama-onprem"}, "aws-spot": {"name": "llama-spot"}}}],
}


def _sim(pool_name: str) -> Harness:
    """A pool of the one simulated world (``controller.sim.world``, the ``Simulation`` that
    ``tidegate simulate`` runs), through ``providers.sim``."""
    from controller.config import DaemonConfig
    from providers import sim
    from providers.clock import ManualClock

    cfg = DaemonConfig.model_validate(_SIM_CONFIG)
    clock = ManualClock(T0)
    providers = sim.build_simulated_providers(cfg, clock)
    provider = providers.pools[pool_name]
    h: Harness

    def catch_up(now: datetime) -> None:
        clock.set(max(clock.now(), now))
        provider.state(cfg.model_specs()["llama"], clock.advance(400))
        h.now = clock.now()

    def fail() -> None:
        providers.fail_next(pool_name, TransientProviderError("injected: 503 Service Unavailable"))

    h = Harness(provider, cfg.model_specs()["llama"], cfg.pool_specs()[pool_name],
                has_node_group=pool_name != "onprem", node_calls=frozenset({sim.CALL_RESIZE_NODE_GROUP}),
                replica_call=sim.CALL_SCALE_DEPLOYMENT, catch_up=catch_up,
                writes=lambda: sum(1 for a in providers.actions if a.status is ActionStatus.OK), fail_next_write=fail)
    return h


def _kubernetes(kube: KubePeer) -> Harness:
    w = World(kube)
    w.setup(replicas=1, nodes=1)
    p = w.provider()

    def fail() -> None:
        kube.fault("PATCH", rf"/namespaces/{w.ns}/deployments/llama-onprem/scale$", 503, times=FAST_RETRY.max_attempts)

    return Harness(p, w.model, w.pool, False, frozenset(), CALL_SCALE, catch_up=w.ctl.reconcile,
                   writes=lambda: len(kube.writes()), fail_next_write=fail)


def _aws(aws: AwsPeer, kube: KubePeer) -> Harness:
    w = AwsWorld(aws, kube)

    def fail() -> None:
        aws.fault("SetDesiredCapacity", 503, query_error("ServiceUnavailable", "try again"), times=FAST_RETRY.max_attempts)

    return Harness(w.provider(), w.model, w.pool, True, frozenset({CALL_SET_DESIRED, CALL_TERMINATE}), CALL_SCALE,
                   catch_up=w.cluster_catches_up,
                   writes=lambda: len(kube.writes()) + sum(1 for r in aws.requests() if r.is_write and r.answered_by == "moto"),
                   fail_next_write=fail)


def _gcp(gcp: GcpComputeServer, kube: KubePeer, clients: dict[str, object]) -> Harness:
    w = GcpWorld(gcp, kube, clients)

    def fail() -> None:
        gcp.fault("POST", "/resize$", 503, times=FAST_RETRY.max_attempts)

    def writes() -> int:
        return len(kube.writes()) + sum(1 for r in gcp.requests() if r.is_write)

    return Harness(w.provider(), w.model, w.pool, True, frozenset({CALL_RESIZE, CALL_DELETE_INSTANCES}), CALL_SCALE,
                   catch_up=w.cloud_and_cluster_catch_up, writes=writes, fail_next_write=fail)


def _deployment_only(kube: KubePeer, pool: str) -> Harness:
    """A Karpenter pool (``spot``) or a cluster-autoscaler pool (``ca``), wired from a daemon config:
    replicas only; Karpenter (played by the test) or the test brings the nodes."""
    from tests.integration.test_karpenter_provider import KarpenterWorld

    w = KarpenterWorld(kube)
    provider = w.pools[pool]
    provider.scale(w.model, 1, 0, w.now)

    def catch_up(now: datetime) -> None:
        if pool == "ca":
            w.ctl.sync_nodes({f"{w.ns}-ca-{i}": f"ca-{i}" for i in range(2)}, w.ca_labels, 4)
        w.karpenter.catch_up(now)

    def fail() -> None:
        kube.fault("PATCH", rf"/namespaces/{w.ns}/deployments/llama-{pool}/scale$", 503, times=FAST_RETRY.max_attempts)

    return Harness(provider, w.model, w.specs[pool], False, frozenset(), CALL_SCALE, catch_up=catch_up,
                   writes=lambda: len(kube.writes()), fail_next_write=fail)


@pytest.fixture(params=["sim-onprem", "sim-aws-spot", "kubernetes-onprem", "aws-spot", "gcp-spot",
                        "karpenter-spot", "cluster-autoscaler-spot"])
def h(request: pytest.FixtureRequest) -> Harness:
    kind = request.param
    if kind == "sim-onprem":
        return _sim("onprem")
    if kind == "sim-aws-spot":
        return _sim("aws-spot")
    kube = request.getfixturevalue("kube")
    if kind == "karpenter-spot":
        return _deployment_only(kube, "spot")
    if kind == "cluster-autoscaler-spot":
        return _deployment_only(kube, "ca")
    if kind == "kubernetes-onprem":
        return _kubernetes(kube)
    if kind == "aws-spot":
        return _aws(request.getfixturevalue("aws"), kube)
    return _gcp(request.getfixturevalue("gcp"), kube, request.getfixturevalue("gcp_clients"))


def _nodes(h: Harness, replicas: int) -> int:
    return h.pool.nodes_for(h.model, replicas) if h.has_node_group else 0


# --- the contract ------------------------------------------------------------------------------


def test_state_names_the_pool_and_reports_what_is_known(h: Harness) -> None:
    st = h.provider.state(h.model, h.now)
    assert isinstance(st, PoolState) and st.pool == h.pool.name
    assert isinstance(st.replicas, int) and st.replicas >= 0
    assert st.available and st.unavailable_reason is None
    assert st.interrupted_replicas == 0 and st.at == h.now


def test_scale_reaches_the_replicas_and_the_same_call_again_changes_nothing(h: Harness) -> None:
    r0 = h.provider.state(h.model, h.now).replicas
    assert r0 is not None
    target = r0 + 2
    actions = h.provider.scale(h.model, target, _nodes(h, target), h.now)
    assert ActionStatus.OK in {a.status for a in actions}
    assert {a.status for a in actions} <= {ActionStatus.OK, ActionStatus.NOOP}
    assert h.provider.state(h.model, h.now).replicas == target
    h.catch_up(h.later(1))
    st = h.provider.state(h.model, h.now)
    assert (st.replicas, st.ready_replicas) == (target, target)

    before = h.writes()
    again = h.provider.scale(h.model, target, _nodes(h, target), h.later(5))
    assert again and {a.status for a in again} == {ActionStatus.NOOP}
    assert h.writes() == before


def test_every_action_names_its_pool_model_call_and_status(h: Harness) -> None:
    actions = list(h.provider.scale(h.model, 3, _nodes(h, 3), h.now))
    h.catch_up(h.later(1))
    actions += h.provider.scale(h.model, 1, _nodes(h, 1), h.later(1))
    assert actions
    for a in actions:
        assert isinstance(a, Action)
        assert (a.pool, a.model) == (h.pool.name, h.model.name)
        assert a.provider and a.call in h.node_calls | {h.replica_call}
        assert isinstance(a.status, ActionStatus) and a.latency_ms >= 0
        assert (a.error is None) is (a.status in (ActionStatus.OK, ActionStatus.NOOP, ActionStatus.DRY_RUN))


def test_capacity_is_ordered_before_replicas_and_released_after_them(h: Harness) -> None:
    if not h.has_node_group:
        pytest.skip("pool without a node group: only replicas move")
    up = [a.call for a in h.provider.scale(h.model, 4, _nodes(h, 4), h.now)]
    assert up.index(h.replica_call) > min(up.index(c) for c in h.node_calls if c in up)
    h.catch_up(h.later(1))
    down = [a.call for a in h.provider.scale(h.model, 0, 0, h.later(1))]
    node_positions = [i for i, c in enumerate(down) if c in h.node_calls]
    assert node_positions and down.index(h.replica_call) < min(node_positions)


def test_invalid_requests_are_permanent_errors_that_change_nothing(h: Harness) -> None:
    before = h.writes()
    with pytest.raises(PermanentProviderError):
        h.provider.scale(h.model, -1, 0, h.now)
    stranger = model_spec("not-served-here", ("elsewhere",))
    with pytest.raises(PermanentProviderError):
        h.provider.scale(stranger, 1, _nodes(h, 1), h.now)
    if h.has_node_group:
        with pytest.raises(PermanentProviderError):
            h.provider.scale(h.model, 1, h.pool.max_nodes + 1, h.now)
    assert h.writes() == before


def test_a_transient_failure_surfaces_as_transient_changes_nothing_and_the_retry_succeeds(h: Harness) -> None:
    r0 = h.provider.state(h.model, h.now).replicas
    assert r0 is not None
    h.fail_next_write()
    with pytest.raises(TransientProviderError) as info:
        h.provider.scale(h.model, r0 + 2, _nodes(h, r0 + 2), h.now)
    assert info.value.retryable
    assert h.provider.state(h.model, h.now).replicas == r0
    ok = h.provider.scale(h.model, r0 + 2, _nodes(h, r0 + 2), h.later(5))
    assert ActionStatus.OK in {a.status for a in ok}
    assert h.provider.state(h.model, h.now).replicas == r0 + 2


# --- a burst cycle through the real adapters, placed by the real core --------------------------


@dataclass
class Fleet:
    """On-prem (1 node of 8 GPUs), AWS spot and GCP spot (nodes of 4 GPUs) and AWS on-demand, one
    model of TP 2 with a Deployment in each; the cluster and clouds played by the test."""

    aws: AwsPeer
    gcp: GcpComputeServer
    kube: KubePeer
    clients: dict[str, object]
    now: datetime = T0
    log: list[Action] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.aws.reset()
        self.gcp.reset()
        tag = uuid.uuid4().hex[:6]
        self.ns = f"f-{tag}"
        self.api = self.kube.api_client()
        self.ctl = KubeControllers(self.api)
        self.specs = {
            "onprem": PoolSpec("onprem", Tier.ONPREM, "onprem", "A100-80GB", 8, 1, 9.0),
            "aws-spot": PoolSpec("aws-spot", Tier.SPOT, "aws", "A100-80GB", 4, 2, 4.0, provisioning_delay_s=180),
            "gcp-spot": PoolSpec("gcp-spot", Tier.SPOT, "gcp", "A100-80GB", 4, 2, 5.0, provisioning_delay_s=120),
            "aws-od": PoolSpec("aws-od", Tier.ONDEMAND, "aws", "A100-80GB", 4, 2, 12.0, provisioning_delay_s=180),
        }
        self.model = model_spec("llama", tuple(self.specs))
        self.labels = {p: {"tidegate.io/pool": f"{p}-{tag}"} for p in self.specs}
        ks = KubernetesSettings(retry=FAST_RETRY)
        cluster = KubernetesCluster(self.api, ks)
        for p in self.specs:
            self.ctl.add_deployment(self.ns, f"llama-{p}", {"app": "llama", "pool": p}, 2 if p == "onprem" else 0,
                                    gpus=2, node_selector=self.labels[p])
        self.ctl.add_node(f"{self.ns}-onprem-0", self.labels["onprem"], 8)

        def kpool(p: str) -> KubernetesPoolProvider:
            return KubernetesPoolProvider(self.specs[p], {"llama": Deployment(self.ns, f"llama-{p}")}, cluster,
                                          node_selector=self.labels[p], settings=ks)

        s = AwsSettings(endpoint_url=self.aws.url, retry=FAST_RETRY, queue_poll_interval_s=0)
        self.asg = {"aws-spot": f"spot-{tag}", "aws-od": f"od-{tag}"}
        create_asg(self.aws, self.asg["aws-spot"], max_size=2, spot=True)
        create_asg(self.aws, self.asg["aws-od"], max_size=2, spot=False)
        self.queue_url = self.aws.client("sqs", direct=True).create_queue(QueueName=f"itn-{tag}")["QueueUrl"]
        autoscaling = make_client("autoscaling", AWS_REGION, s)
        queue = AwsInterruptionQueue(make_client("sqs", AWS_REGION, s), self.queue_url, s)
        self.mig = self.gcp.add_mig("proj", f"spot-{tag}", zone="us-central1-a")
        gs: GcpSettings = self.clients["settings"]  # type: ignore[assignment]
        self.providers: dict[str, PoolProvider] = {
            "onprem": kpool("onprem"),
            "aws-spot": CloudPoolProvider(kpool("aws-spot"), AwsNodeGroup(self.asg["aws-spot"], autoscaling,
                                                                          interruptions=queue, settings=s)),
            "gcp-spot": CloudPoolProvider(kpool("gcp-spot"), GcpNodeGroup("proj", self.mig.name, self.clients["zonal"],
                                                                          zone="us-central1-a", settings=gs)),
            "aws-od": CloudPoolProvider(kpool("aws-od"), AwsNodeGroup(self.asg["aws-od"], autoscaling,
                                                                      interruptions=queue, settings=s)),
        }

    def world_catches_up(self) -> None:
        for p in ("aws-spot", "aws-od"):
            self.ctl.sync_nodes(asg_instances(self.aws, self.asg[p]), self.labels[p], 4)
        self.gcp.settle(self.mig)
        self.ctl.sync_nodes(self.gcp.running(self.mig), self.labels["gcp-spot"], 4)
        self.ctl.reconcile(self.now)

    def tick(self, total: int, seconds: float = 30) -> tuple[dict[str, int], Any, list[Action]]:
        """Observe every pool, place ``total`` with the core's placer, act (pools losing replicas
        first, so that capacity moves rather than doubles), return placement, result and actions."""
        self.now += timedelta(seconds=seconds)
        states = {p: prov.state(self.model, self.now) for p, prov in self.providers.items()}
        result = place(model=self.model, pools=self.specs, states=states, total=total,
                       placement=SPREAD)
        order = sorted(self.specs, key=lambda p: result.replicas[p] - (states[p].replicas or 0))
        actions: list[Action] = []
        for p in order:
            r = result.replicas[p]
            nodes = self.specs[p].nodes_for(self.model, r)
            actions += self.providers[p].scale(self.model, r, nodes, self.now)
        self.log += actions
        return dict(result.replicas), result, actions

    def asg_desired(self, pool: str) -> int:
        g = self.aws.client("autoscaling", direct=True).describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.asg[pool]])
        return int(g["AutoScalingGroups"][0]["DesiredCapacity"])


def test_burst_cycle_through_the_real_adapters(aws: AwsPeer, gcp: GcpComputeServer, kube: KubePeer,
                                               gcp_clients: dict[str, object]) -> None:
    f = Fleet(aws, gcp, kube, gcp_clients)
    f.world_catches_up()

    # Load rises: on-prem fills first.
    placed, _, _ = f.tick(4)
    assert placed == {"onprem": 4, "aws-spot": 0, "gcp-spot": 0, "aws-od": 0}
    f.world_catches_up()

    # More: spot, spread over both clouds, nodes ordered before replicas in each.
    placed, _, actions = f.tick(8)
    assert placed == {"onprem": 4, "aws-spot": 2, "gcp-spot": 2, "aws-od": 0}
    calls = [(a.pool, a.call, a.status) for a in actions if a.status is ActionStatus.OK]
    assert calls.index(("aws-spot", CALL_SET_DESIRED, ActionStatus.OK)) < calls.index(("aws-spot", CALL_SCALE, ActionStatus.OK))
    assert calls.index(("gcp-spot", CALL_RESIZE, ActionStatus.OK)) < calls.index(("gcp-spot", CALL_SCALE, ActionStatus.OK))
    assert (f.asg_desired("aws-spot"), f.mig.target_size) == (1, 1)
    f.world_catches_up()

    # A spot interruption warning arrives through SQS: the next tick replaces the two replicas on
    # that node elsewhere, in the same decision.
    doomed = next(iter(asg_instances(aws, f.asg["aws-spot"]).values())).rsplit("/", 1)[-1]
    aws.client("sqs", direct=True).send_message(QueueUrl=f.queue_url, MessageBody=json.dumps(
        spot_interruption_event(doomed, at=f.now)))
    placed, result, actions = f.tick(8)
    assert result.interrupted_removed == 2 and result.interrupted_replaced == 2
    assert placed["aws-spot"] == 0 and placed["gcp-spot"] + placed["aws-od"] == 4
    assert any(a.pool == "aws-spot" and a.call == CALL_SCALE and a.arguments["replicas"] == 0 for a in actions)
    f.world_catches_up()

    # AWS spot cannot get capacity (failed launches); the next rise falls back to on-demand.
    aws.fault("DescribeScalingActivities", 200, scaling_activities(f.asg["aws-spot"], [{
        "ActivityId": str(uuid.uuid4()), "Description": "Launching a new EC2 instance.  Status Reason: Could not "
        "launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available that matches "
        "your request. Launching EC2 instance failed.", "StartTime": f.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "EndTime": f.now.strftime("%Y-%m-%dT%H:%M:%SZ"), "StatusCode": "Failed",
        "StatusMessage": "InsufficientInstanceCapacity - There is no Spot capacity available", "Progress": "100"}]),
        times=1000, params={"AutoScalingGroupName": f.asg["aws-spot"]})
    placed, result, _ = f.tick(12)
    assert placed == {"onprem": 4, "aws-spot": 0, "gcp-spot": 4, "aws-od": 4}
    assert f.providers["aws-spot"].state(f.model, f.now).available is False
    assert result.reason == "OnDemandFallback"
    assert ("SpotPoolUnavailable", "aws-spot") in {(code, msg.split()[0]) for code, msg in result.events}
    assert f.asg_desired("aws-od") == 2
    f.world_catches_up()

    # Load falls: on-demand and spot replicas go first, on-prem stays; nodes follow once empty.
    placed, _, actions = f.tick(4)
    assert placed == {"onprem": 4, "aws-spot": 0, "gcp-spot": 0, "aws-od": 0}
    releases = [a for a in actions if a.call in (CALL_TERMINATE, CALL_DELETE_INSTANCES)]
    assert releases and {a.status for a in releases} == {ActionStatus.SKIPPED}  # pods still on the nodes
    f.world_catches_up()
    f.tick(4)
    assert (f.asg_desired("aws-spot"), f.asg_desired("aws-od"), f.mig.target_size) == (0, 0, 0)
    f.world_catches_up()
    assert {a.status for a in f.tick(4)[2]} == {ActionStatus.NOOP}

    # The log holds every call with its result; nothing failed along the way.
    assert all(a.status is not ActionStatus.FAILED_TRANSIENT and a.status is not ActionStatus.FAILED_PERMANENT
               for a in f.log)
    assert {a.provider for a in f.log} == {"kubernetes", "aws", "gcp"}


def test_real_pools_are_wired_from_the_daemon_config(aws: AwsPeer, gcp: GcpComputeServer, kube: KubePeer) -> None:
    from controller.config import DaemonConfig
    from providers.real import RealSettings
    from providers.wiring import build_real_pools

    aws.reset()
    gcp.reset()
    tag = uuid.uuid4().hex[:6]
    ns = f"c-{tag}"
    create_asg(aws, f"spot-{tag}", max_size=2)
    queue_url = aws.client("sqs", direct=True).create_queue(QueueName=f"itn-{tag}")["QueueUrl"]
    mig = gcp.add_mig("proj", f"mig-{tag}", zone="us-central1-a")
    labels = {p: {"tidegate.io/pool": f"{p}-{tag}"} for p in ("onprem", "aws-spot", "gcp-spot")}
    cfg = DaemonConfig.model_validate({
        "providers": {"type": "real"},
        "pools": [
            {"name": "onprem", "kind": "onprem", "gpu_type": "A100-80GB", "gpus_per_node": 8, "max_nodes": 1,
             "price_per_node_hour_usd": 9.0, "kubernetes": {"node_selector": labels["onprem"]}},
            {"name": "aws-spot", "kind": "aws-spot", "gpu_type": "A100-80GB", "gpus_per_node": 4, "max_nodes": 2,
             "price_per_node_hour_usd": 4.0, "kubernetes": {"node_selector": labels["aws-spot"]},
             "aws": {"region": AWS_REGION, "auto_scaling_group": f"spot-{tag}", "instance_type": "g5.12xlarge"}},
            {"name": "gcp-spot", "kind": "gcp-spot", "gpu_type": "A100-80GB", "gpus_per_node": 4, "max_nodes": 2,
             "price_per_node_hour_usd": 5.0, "kubernetes": {"node_selector": labels["gcp-spot"]},
             "gcp": {"project": "proj", "zone": "us-central1-a", "instance_group_manager": mig.name}},
        ],
        "models": [{"name": "llama", "tp_degree": 2, "quantization": "fp8", "gpu_types": ["A100-80GB"],
                    "cold_start_s": 90, "capacity": {"A100-80GB": {"output_tokens_per_s": 1500, "requests_per_s": 3}},
                    "deployments": {p: {"namespace": ns, "name": f"llama-{p}"} for p in labels}}],
    })
    ctl = KubeControllers(kube.api_client())
    for p in labels:
        ctl.add_deployment(ns, f"llama-{p}", {"app": "llama", "pool": p}, 1 if p == "onprem" else 0, gpus=2,
                           node_selector=labels[p])
    settings = RealSettings(
        kubernetes=KubernetesSettings(retry=FAST_RETRY),
        aws=AwsSettings(endpoint_url=aws.url, retry=FAST_RETRY, interruption_queue_url=queue_url),
        gcp=GcpSettings(api_endpoint=gcp.url, retry=FAST_RETRY, spot_prices_usd={"gcp-spot": 3.3}))
    real = build_real_pools(cfg, kube_api=kube.api_client(), settings=settings,
                            clients={"gcp": AnonymousCredentials()})
    model = cfg.model_specs()["llama"]
    assert isinstance(real.pools["onprem"], KubernetesPoolProvider)
    assert isinstance(real.pools["aws-spot"], CloudPoolProvider) and isinstance(real.pools["gcp-spot"], CloudPoolProvider)
    queue = real.parts["aws"]["interruptions"]
    assert queue is not None and queue.queue_url == queue_url
    states = {p: prov.state(model, T0) for p, prov in real.pools.items()}
    assert {p: (s.replicas, s.available) for p, s in states.items()} == {
        "onprem": (1, True), "aws-spot": (0, True), "gcp-spot": (0, True)}
    for p, r in (("aws-spot", 2), ("gcp-spot", 2)):
        acts = real.pools[p].scale(model, r, 1, T0)
        assert [a.status for a in acts] == [ActionStatus.OK, ActionStatus.OK]
    assert mig.target_size == 1 and asg_instances(aws, f"spot-{tag}")

    specs = list(cfg.pool_specs().values())
    assert real.prices.prices(specs, T0) == {"onprem": 9.0, "aws-spot": 4.0, "gcp-spot": 3.3}
    spot_prices = real.parts["aws"]["spot_prices"]
    assert spot_prices is not None and set(spot_prices.refresh(T0)) == {"aws-spot"}
    live = real.prices.prices(specs, T0)
    assert live["aws-spot"] != 4.0 and (live["onprem"], live["gcp-spot"]) == (9.0, 3.3)
