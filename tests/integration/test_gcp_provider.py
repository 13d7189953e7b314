"""The GCP adapter (google-cloud-compute on its REST transport, anonymous credentials) against the
local compute server in ``gcp_server.py``, combined with the Kubernetes adapter against kmock for
the pool as a whole."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials

from controller.core.model import ActionStatus, Tier, PoolSpec
from controller.protocols import PermanentProviderError, TransientProviderError
from providers.base import NoticeKind
from providers.cloudpool import CloudPoolProvider, CloudPoolSettings
from providers.gcp import (
    CALL_DELETE_INSTANCES, CALL_RESIZE, GcpNodeGroup, GcpSettings, GcpSpotPrices, instance_name_from_provider_id,
    make_mig_client,
)
from providers.kubernetes import CALL_SCALE, Deployment, KubernetesCluster, KubernetesPoolProvider, KubernetesSettings
from tests.integration.gcp_server import GcpComputeServer, Mig, RawBody
from tests.integration.peers import KubeControllers, KubePeer
from tests.integration.test_kubernetes_provider import FAST_RETRY, model_spec

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
PROJECT = "tidegate-test"
ZONE = "us-central1-a"


@pytest.fixture(scope="module")
def clients(gcp: GcpComputeServer) -> dict[str, object]:
    s = GcpSettings(api_endpoint=gcp.url, retry=FAST_RETRY)
    return {"zonal": make_mig_client(regional=False, settings=s, credentials=AnonymousCredentials()),
            "regional": make_mig_client(regional=True, settings=s, credentials=AnonymousCredentials()),
            "settings": s}


class GcpWorld:
    def __init__(self, gcp: GcpComputeServer, kube: KubePeer, clients: dict[str, object], *, size: int = 0,
                 region: str | None = None) -> None:
        gcp.reset()
        self.gcp = gcp
        self.kube = kube
        tag = uuid.uuid4().hex[:6]
        self.name = f"gpu-spot-{tag}"
        self.ns = f"g-{tag}"
        self.labels = {"cloud.google.com/gke-nodepool": f"spot-{tag}"}
        self.settings: GcpSettings = clients["settings"]  # type: ignore[assignment]
        if region:
            self.mig: Mig = gcp.add_mig(PROJECT, self.name, region=region, size=size)
            self.group = GcpNodeGroup(PROJECT, self.name, clients["regional"], region=region, settings=self.settings)
        else:
            self.mig = gcp.add_mig(PROJECT, self.name, zone=ZONE, size=size)
            self.group = GcpNodeGroup(PROJECT, self.name, clients["zonal"], zone=ZONE, settings=self.settings)
        self.pool = PoolSpec(f"gcp-spot-{tag}", Tier.SPOT, "gcp", "A100-80GB", gpus_per_node=4, max_nodes=6,
                             price_per_node_hour_usd=11.0, provisioning_delay_s=120)
        self.model = model_spec("llama", (self.pool.name,))
        self.api = kube.api_client()
        self.ctl = KubeControllers(self.api)
        self.ctl.add_deployment(self.ns, "llama-gcp", {"app": "llama", "pool": self.pool.name}, 0, gpus=2,
                                node_selector=self.labels)
        ks = KubernetesSettings(retry=FAST_RETRY)
        self.kpool = KubernetesPoolProvider(self.pool, {"llama": Deployment(self.ns, "llama-gcp")},
                                            KubernetesCluster(self.api, ks), node_selector=self.labels, settings=ks)

    def provider(self, *, settings: CloudPoolSettings = CloudPoolSettings()) -> CloudPoolProvider:
        return CloudPoolProvider(self.kpool, self.group, settings=settings)

    def cloud_and_cluster_catch_up(self, now: datetime) -> None:
        self.gcp.settle(self.mig)
        self.ctl.sync_nodes(self.gcp.running(self.mig), self.labels, self.pool.gpus_per_node)
        self.ctl.reconcile(now)


def test_describe_tells_running_from_creating_and_follows_pages(gcp: GcpComputeServer, kube: KubePeer,
                                                                clients: dict[str, object]) -> None:
    w = GcpWorld(gcp, kube, clients, size=3)
    w.group.set_target(5)
    gcp.page_size = 2  # 5 instances over 3 pages
    g = w.group.describe(T0)
    assert (g.target, g.running, g.creating, len(g.instances)) == (5, 3, 2, 5)
    lists = [r for r in gcp.requests() if r.verb == "listManagedInstances"]
    assert len(lists) == 3 and lists[-1].query.get("pageToken") == ["4"]
    assert {i.zone for i in g.instances} == {ZONE}


def test_errors_are_translated_transient_or_permanent_with_the_cause_chained(gcp: GcpComputeServer, kube: KubePeer,
                                                                              clients: dict[str, object]) -> None:
    w = GcpWorld(gcp, kube, clients, size=1)
    gcp.fault("POST", "/resize$", 503)
    gcp.fault("POST", "/resize$", 403, reason="rateLimitExceeded", message="Rate Limit Exceeded")
    mark = gcp.mark()
    w.group.set_target(2)  # retried through both
    assert [r.verb for r in gcp.requests_since(mark)] == ["resize", "resize", "resize"]
    assert w.mig.target_size == 2

    gcp.fault("POST", "/resize$", 403, reason="forbidden", message="Required 'compute.instanceGroupManagers.update' permission")
    mark = gcp.mark()
    with pytest.raises(PermanentProviderError, match="permission") as info:
        w.group.set_target(3)
    assert isinstance(info.value.__cause__, gexc.Forbidden)
    assert len(gcp.requests_since(mark)) == 1

    gcp.fault("POST", "/resize$", 429, times=100, reason="rateLimitExceeded")
    with pytest.raises(TransientProviderError, match="gave up after") as info2:
        w.group.set_target(3)
    assert isinstance(info2.value.__cause__, gexc.TooManyRequests)

    with pytest.raises(PermanentProviderError, match="not found") as info3:
        GcpNodeGroup(PROJECT, "no-such-mig", clients["zonal"], zone=ZONE, settings=w.settings).describe(T0)
    assert isinstance(info3.value.__cause__, gexc.NotFound)


NGINX_502 = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway"
             b"</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")  # nginx's page


def test_an_answer_that_is_not_the_api_is_transient_and_never_an_empty_group(
        gcp: GcpComputeServer, kube: KubePeer, clients: dict[str, object]) -> None:
    """A 200 whose body is not the API's JSON (a proxy's page) is retried, then a transient error
    naming the likely cause. Another service's JSON object parses (protobuf ignores unknown
    fields) into a group of target 0 with no instances: it is refused the same way, so the pool is
    never read, and acted on, as empty."""
    w = GcpWorld(gcp, kube, clients, size=3)
    gcp.fault("GET", "/instanceGroupManagers/[^/]+$", 200, body=RawBody(NGINX_502))
    assert w.group.describe(T0).target == 3  # the retry read it
    gcp.fault("GET", "/instanceGroupManagers/[^/]+$", 200, body=RawBody(NGINX_502), times=100)
    with pytest.raises(TransientProviderError, match="could not be read.*endpoint"):
        w.group.describe(T0 + timedelta(seconds=5))
    gcp.clear_faults()

    other = RawBody(b'{"status": "ok", "items": []}', "application/json")
    gcp.fault("GET", "/instanceGroupManagers/[^/]+$", 200, body=other)
    assert w.group.describe(T0 + timedelta(seconds=10)).target == 3  # retried
    gcp.fault("GET", "/instanceGroupManagers/[^/]+$", 200, body=other, times=100)
    with pytest.raises(TransientProviderError, match="not this group.*endpoint"):
        w.group.describe(T0 + timedelta(seconds=15))


def test_scale_out_resizes_before_replicas_then_scale_in_deletes_only_empty_instances(
        gcp: GcpComputeServer, kube: KubePeer, clients: dict[str, object]) -> None:
    w = GcpWorld(gcp, kube, clients)
    p = w.provider()
    gmark, kmark = gcp.mark(), kube.mark()
    up = p.scale(w.model, 6, 3, T0)
    assert [(a.provider, a.call, a.status) for a in up] == [
        ("gcp", CALL_RESIZE, ActionStatus.OK), ("kubernetes", CALL_SCALE, ActionStatus.OK)]
    assert [(r.verb, r.query.get("size")) for r in gcp.requests_since(gmark) if r.is_write] == [("resize", ["3"])]
    assert [r.subresource for r in kube.requests_since(kmark) if r.is_write] == ["scale"]
    st = p.state(w.model, T0)
    assert (st.replicas, st.nodes) == (6, 3)  # three instances ordered, still being created
    assert p.last_group_state is not None and p.last_group_state.creating == 3
    w.cloud_and_cluster_catch_up(T0 + timedelta(seconds=120))
    assert p.state(w.model, T0 + timedelta(seconds=120)).ready_replicas == 6
    assert {a.status for a in p.scale(w.model, 6, 3, T0 + timedelta(seconds=125))} == {ActionStatus.NOOP}

    down = p.scale(w.model, 2, 1, T0 + timedelta(seconds=130))
    assert [(a.call, a.status) for a in down] == [(CALL_SCALE, ActionStatus.OK), (CALL_DELETE_INSTANCES, ActionStatus.SKIPPED)]
    w.ctl.reconcile(T0 + timedelta(seconds=140))
    mark = gcp.mark()
    down2 = p.scale(w.model, 2, 1, T0 + timedelta(seconds=150))
    assert [(a.call, a.status) for a in down2] == [(CALL_SCALE, ActionStatus.NOOP), (CALL_DELETE_INSTANCES, ActionStatus.OK)]
    deletes = [r for r in gcp.requests_since(mark) if r.verb == "deleteInstances"]
    assert len(deletes) == 1
    deleted = {u.rsplit("/", 1)[-1] for u in deletes[0].body["instances"]}
    assert deleted == set(down2[1].arguments["instances"]) and len(deleted) == 2
    assert w.mig.target_size == 1
    assert set(w.mig.instances) == p.kube.busy_nodes(T0)  # the instance kept is the one still serving


def test_stockouts_and_quota_errors_mark_the_pool_unavailable_while_reported(gcp: GcpComputeServer, kube: KubePeer,
                                                                              clients: dict[str, object]) -> None:
    w = GcpWorld(gcp, kube, clients, size=1)
    p = w.provider(settings=CloudPoolSettings(capacity_unavailable_s=180))
    w.mig.stockout = ("ZONE_RESOURCE_POOL_EXHAUSTED", "The zone 'us-central1-a' does not have enough resources "
                      "available to fulfill the request.")
    p.scale(w.model, 4, 2, T0)
    gcp.settle(w.mig)
    st = p.state(w.model, T0 + timedelta(seconds=30))
    assert not st.available and st.unavailable_reason is not None
    assert st.unavailable_reason.startswith("SpotPoolUnavailable: InsufficientCapacity")
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in st.unavailable_reason
    # the stock-out ends; the mark lasts its period from the last time the error was seen
    w.mig.stockout = None
    gcp.settle(w.mig)
    assert not p.state(w.model, T0 + timedelta(seconds=200)).available
    assert p.state(w.model, T0 + timedelta(seconds=211)).available

    w2 = GcpWorld(gcp, kube, clients, size=0)
    w2.mig.stockout = ("QUOTA_EXCEEDED", "Quota 'NVIDIA_A100_80GB_GPUS' exceeded. Limit: 8.0 in region us-central1.")
    w2.group.set_target(1)
    gcp.settle(w2.mig)
    st2 = w2.provider().state(w2.model, T0)
    assert not st2.available and "QUOTA_EXCEEDED" in (st2.unavailable_reason or "")


def test_a_preempted_spot_vm_marks_the_replicas_on_its_node_interrupted(gcp: GcpComputeServer, kube: KubePeer,
                                                                         clients: dict[str, object]) -> None:
    w = GcpWorld(gcp, kube, clients)
    p = w.provider()
    p.scale(w.model, 4, 2, T0)
    w.cloud_and_cluster_catch_up(T0)
    obs = p.kube.observe(w.model, T0)
    victim = sorted(obs.pods_by_node)[0]
    gcp.preempt(w.mig, victim)
    st = p.state(w.model, T0 + timedelta(seconds=10))
    assert st.interrupted_replicas == obs.pods_by_node[victim] == 2 and st.recent_interruptions == 1
    g = p.last_group_state
    assert g is not None and [(n.instance_id, n.kind) for n in g.notices] == [(victim, NoticeKind.INTERRUPTION)]
    assert instance_name_from_provider_id(f"gce://{PROJECT}/{ZONE}/{victim}") == victim


def test_regional_groups_resize_and_delete_through_the_regional_client(gcp: GcpComputeServer, kube: KubePeer,
                                                                         clients: dict[str, object]) -> None:
    w = GcpWorld(gcp, kube, clients, size=3, region="us-central1")
    g = w.group.describe(T0)
    assert g.running == 3 and {i.zone for i in g.instances} == {"us-central1-a", "us-central1-b", "us-central1-c"}
    w.group.release([g.instances[0].instance_id])
    w.group.set_target(4)
    paths = [r.path for r in gcp.requests() if r.is_write]
    assert all("/regions/us-central1/" in p for p in paths) and len(paths) == 2
    assert w.mig.target_size == 4 and g.instances[0].instance_id not in w.mig.instances


def test_spot_list_prices_come_from_the_config() -> None:
    spot = PoolSpec("gcp-spot", Tier.SPOT, "gcp", "A100-80GB", 4, 8, price_per_node_hour_usd=11.0)
    od = PoolSpec("gcp-od", Tier.ONDEMAND, "gcp", "A100-80GB", 4, 8, price_per_node_hour_usd=20.0)
    assert GcpSpotPrices({"gcp-spot": 4.4}).prices([spot, od], T0) == {"gcp-spot": 4.4, "gcp-od": 20.0}
