"""The daemon loop acting through the real adapters: ``build_runtime`` on a ``providers.type: real``
config (``providers.wiring.build_real_providers``), ``Daemon.tick()`` on a manual clock, against
kmock (Kubernetes), moto behind its recording proxy (Auto Scaling, EC2, SQS) and the local compute
REST server (GCP managed instance groups), with a SQLite or PostgreSQL decision log.

The load is scripted (``ScriptedLoad``: a ``MetricsSource`` whose queue depth the test sets; the
issue allows it, and the Prometheus path has its own tests); the policy is ``queue-depth`` at one
waiting request per replica with no stabilization or rate limits, so every tick's total follows
the script and the assertions are about what the daemon does with it. The cluster's controllers
and the clouds are played by the test between ticks (``Cluster.catch_up``), never during one, so
each tick's window in the peers' request logs holds the daemon's requests only.

Shown, each on the decision log and on the peers' own request logs:

- a burst cycle: on-prem grows first, then an AWS and a GCP spot group are resized and their
  Deployments scaled (nodes before replicas); on the way down spot replicas go first, spot nodes
  are released once empty, on-prem shrinks last; every mutating request the peers saw is one
  ``ok`` action row of that tick's decision, and every ``ok`` write row is a request;
- spot interruptions (an SQS EventBridge warning; a GKE termination taint) replaced in the next
  tick (``SpotInterrupted``, ``interrupted_replaced``);
- insufficient capacity (failed Auto Scaling launches) moving the placement to on-demand;
- two daemons on one cluster and one PostgreSQL database: one acts, the other makes no request at
  all; the leader's lock session is terminated and the other takes over on its next tick;
- dry-run: DRY_RUN rows and not one mutating request (the SQS queue is not even read);
- the assembly: settings defaults agree with the adapters', cross-field errors, the spot price
  job scheduled by ``daemon.start()``, Triton endpoint discovery from pods;
- RBAC: every request the daemon's own client made to kmock in a test (the test's clients carry a
  token of their own), read as the API server's authorizer reads it (``tests.rbac``), is in the
  committed record ``tests/integration/daemon_kube_calls.yaml``, and each call the record names a
  test for was made by that test (checked when it passes). ``test_deploy.py`` holds the chart's
  Roles to the same record, so a new call fails here until it is recorded and there until the Role
  grants it.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kubernetes import client as k8s
from pydantic import ValidationError

from controller.config import DaemonConfig
from controller.daemon import TickReport
from controller.runtime import Runtime, build_runtime
from providers.aws import CALL_SET_DESIRED, CALL_TERMINATE, AwsSettings
from providers.cloudpool import CloudPoolProvider, CloudPoolSettings
from providers.clock import ManualClock
from providers.gcp import CALL_DELETE_INSTANCES, CALL_RESIZE, GcpSettings
from providers.kubernetes import CALL_DELETION_COST, CALL_SCALE, KubernetesCluster, KubernetesSettings
from controller.protocols import ShardElector
from providers.leader import LeaderElectionSettings, build_elector, libpq_dsn
from providers.real import RealSettings
from providers.wiring import build_real_providers, discover_triton_replicas
from tests.integration.gcp_server import GcpComputeServer
from tests.integration.kube_fleet import ScriptedLoad
from tests.integration.peers import (
    AWS_REGION, AwsPeer, KarpenterControllers, KubeControllers, KubePeer, KubeRequest, asg_instances, aws_env, create_asg,
    scaling_activities, spot_interruption_event, taint_node,
)
from tests.rbac import DAEMON_CALLS, Permission, load_daemon_calls, request_attributes, scope_of

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
TICK_S = 30.0
POOLS = ("onprem", "aws-spot", "gcp-spot", "aws-od")
RETRY_ATTEMPTS = 4
FAST_RETRY: dict[str, float] = {"budget_s": 2.0, "base_delay_s": 0.005, "max_delay_s": 0.02, "max_attempts": RETRY_ATTEMPTS}
GKE_TERMINATION_TAINT = "cloud.google.com/impending-node-termination"

POLICY = textwrap.dedent("""\
    apiVersion: tidegate/v1
    kind: ScalingPolicy
    metadata: {name: llama-queue}
    spec:
      model: llama
      bounds: {min_replicas: 1, max_replicas: 16}
      rules:
        - kind: queue-depth
          params: {target_per_replica: 1}
      behavior:
        tolerance: 0
        scale_up: {stabilization_s: 0, policies: []}
        scale_down: {stabilization_s: 0, policies: []}
      placement: {spot_spread_min_pools: 2}
      # these tests are about actuation: the burst goes to cloud at once (lead-time economics,
      # which would hold it on-prem for a lead time, has tests of its own)
      lead_time: {enabled: false}
    """)


# --- peers (module scope) ----------------------------------------------------------------------


# --- the scripted load and the world -----------------------------------------------------------


class Cluster:
    """One test's fleet on the shared peers: on-prem (1 node of 8 GPUs), AWS spot, GCP spot and AWS
    on-demand (nodes of 4 GPUs, at most 2 each), one model of TP 2 with a Deployment per pool
    (on-prem starts at 2 replicas), an SQS interruption queue; and the daemon config for it."""

    def __init__(self, aws: AwsPeer, gcp: GcpComputeServer, kube: KubePeer, tmp: Path, *,
                 db_url: str | None = None, spot_instance_type: str | None = None) -> None:
        self.aws, self.gcp, self.kube = aws, gcp, kube
        aws.reset()
        gcp.reset()
        self.clock = ManualClock(T0)
        self.load = ScriptedLoad()
        tag = uuid.uuid4().hex[:6]
        self.ns = f"d-{tag}"
        self.home_ns = f"tidegate-{tag}"
        """The daemon's own namespace (where its Lease lives), apart from the managed one."""
        self.api = kube.api_client()
        self.ctl = KubeControllers(self.api)
        self.core = k8s.CoreV1Api(self.api)
        self.apps = k8s.AppsV1Api(self.api)
        self.labels = {p: {"tidegate.io/pool": f"{p}-{tag}"} for p in POOLS}
        for p in POOLS:
            self.ctl.add_deployment(self.ns, f"llama-{p}", {"app": "llama", "pool": p}, 2 if p == "onprem" else 0,
                                    gpus=2, node_selector=self.labels[p])
        self.ctl.add_node(f"{self.ns}-onprem-0", self.labels["onprem"], 8)
        self.asg = {"aws-spot": f"spot-{tag}", "aws-od": f"od-{tag}"}
        create_asg(aws, self.asg["aws-spot"], max_size=2, spot=True)
        create_asg(aws, self.asg["aws-od"], max_size=2, spot=False)
        self.sqs = aws.client("sqs", direct=True)
        self.queue_url = self.sqs.create_queue(QueueName=f"itn-{tag}")["QueueUrl"]
        self.mig = gcp.add_mig("proj", f"spot-{tag}", zone="us-central1-a")
        policies = tmp / f"policies-{tag}"
        policies.mkdir()
        (policies / "llama.yaml").write_text(POLICY)

        def pool(name: str, kind: str, gpus: int, max_nodes: int, price: float, delay: float) -> dict[str, Any]:
            out: dict[str, Any] = {"name": name, "kind": kind, "gpu_type": "A100-80GB", "gpus_per_node": gpus,
                                   "max_nodes": max_nodes, "price_per_node_hour_usd": price,
                                   "provisioning_delay_s": delay, "kubernetes": {"node_selector": self.labels[name]}}
            if name in self.asg:
                out["aws"] = {"region": AWS_REGION, "auto_scaling_group": self.asg[name],
                              "instance_type": spot_instance_type if name == "aws-spot" else None}
            if name == "gcp-spot":
                out["gcp"] = {"project": "proj", "zone": "us-central1-a", "instance_group_manager": self.mig.name}
            return out

        self.raw: dict[str, Any] = {
            "policies_dir": str(policies),
            "database": {"url": db_url or f"sqlite:///{tmp / f'tidegate-{tag}.db'}"},
            "api": {"enabled": False},
            "loop": {"interval_s": 5},
            "providers": {"type": "real", "settings": {
                # never queried here: the tests drive the load through ScriptedLoad
                "prometheus": {"url": "http://127.0.0.1:9"},
                "kubernetes": {"host": kube.url, "retry": FAST_RETRY},
                "aws": {"endpoint_url": aws.url, "retry": FAST_RETRY, "interruption_queue_url": self.queue_url,
                        "queue_poll_interval_s": 0},
                "gcp": {"api_endpoint": gcp.url, "credentials": "anonymous", "retry": FAST_RETRY},
            }},
            "leader_election": {},
            "pools": [pool("onprem", "onprem", 8, 1, 9.0, 0), pool("aws-spot", "aws-spot", 4, 2, 4.0, 180),
                      pool("gcp-spot", "gcp-spot", 4, 2, 5.0, 120), pool("aws-od", "aws-ondemand", 4, 2, 12.0, 180)],
            "models": [{"name": "llama", "tp_degree": 2, "quantization": "fp8", "gpu_types": ["A100-80GB"],
                        "cold_start_s": 90,
                        "capacity": {"A100-80GB": {"output_tokens_per_s": 1500, "requests_per_s": 3}},
                        "deployments": {p: {"namespace": self.ns, "name": f"llama-{p}"} for p in POOLS}}],
        }
        self.runtimes: list[Runtime] = []

    def config(self, **leader: Any) -> DaemonConfig:
        raw = json.loads(json.dumps(self.raw))
        raw["leader_election"].update(leader)
        return DaemonConfig.model_validate(raw)

    def runtime(self, *, dry_run: bool | None = None, **leader: Any) -> Runtime:
        """The daemon as ``tidegate run`` builds it, with the scripted load as its metrics source."""
        rt = build_runtime(self.config(**leader), clock=self.clock, dry_run=dry_run, environ={},
                           election_clock=self.clock)
        self.runtimes.append(rt)
        rt.daemon.metrics_source = self.load
        rt.daemon.reload_policies()
        return rt

    def close(self) -> None:
        for rt in self.runtimes:
            rt.stop()

    # -- the world ---------------------------------------------------------------------------------

    def catch_up(self, *, aws_spot_launches: bool = True) -> None:
        """The clouds and the cluster do what was asked: instances become nodes (unless AWS spot
        launches fail), pods follow the Deployments and are scheduled."""
        for p in ("aws-spot", "aws-od"):
            if p == "aws-spot" and not aws_spot_launches:
                continue
            self.ctl.sync_nodes(asg_instances(self.aws, self.asg[p]), self.labels[p], 4)
        self.gcp.settle(self.mig)
        self.ctl.sync_nodes(self.gcp.running(self.mig), self.labels["gcp-spot"], 4)
        self.ctl.reconcile(self.clock.now())

    def replicas(self, pool: str) -> int:
        return int(self.apps.read_namespaced_deployment(f"llama-{pool}", self.ns).spec.replicas)

    def asg_desired(self, pool: str) -> int:
        g = self.aws.client("autoscaling", direct=True).describe_auto_scaling_groups(
            AutoScalingGroupNames=[self.asg[pool]])
        return int(g["AutoScalingGroups"][0]["DesiredCapacity"])

    def pods_on(self, node: str) -> list[str]:
        return [p.metadata.name for p in self.core.list_namespaced_pod(self.ns).items if p.spec.node_name == node]

    # -- ticks ---------------------------------------------------------------------------------

    def marks(self) -> tuple[int, int, int]:
        return self.kube.mark(), self.aws.mark(), self.gcp.mark()

    def tick(self, rt: Runtime, queue: float | None = None, *, ok: bool = True) -> "Tick":
        """Advance the clock, tick once, and return the decision row with the peers' requests
        made during the tick (``ok``: the tick must have succeeded)."""
        if queue is not None:
            self.load.queue = queue
        self.clock.advance(TICK_S)
        km, am, gm = self.marks()
        report = rt.daemon.tick()
        t = Tick(report, self.kube.requests_since(km), self.aws.requests_since(am), self.gcp.requests_since(gm))
        if report.skipped is None:
            assert report.ok or not ok, report.errors
            t.record = rt.daemon.repo.get_decision(report.decision_ids["llama"]) or {}
        return t


class Tick:
    def __init__(self, report: TickReport, kube: list[Any], aws: list[Any], gcp: list[Any]) -> None:
        self.report, self.kube, self.aws, self.gcp = report, kube, aws, gcp
        self.record: dict[str, Any] = {}

    @property
    def placement(self) -> dict[str, int]:
        return dict(self.record["placement"])

    @property
    def requests(self) -> int:
        return len(self.kube) + len(self.aws) + len(self.gcp)

    def peer_writes(self) -> Counter[str]:
        """Mutating requests the peers served during the tick, named as the action rows name
        them (SQS deletes of read messages are housekeeping of an observation, not actions)."""
        out: Counter[str] = Counter()
        for r in self.kube:
            if r.is_write:
                out[CALL_SCALE if r.path.endswith("/scale") else
                    CALL_DELETION_COST if "/pods/" in r.path else f"kube {r.method} {r.path}"] += 1
        for r in self.aws:
            if r.is_write and r.answered_by == "moto" and r.action != "DeleteMessageBatch":
                out[{"SetDesiredCapacity": CALL_SET_DESIRED,
                     "TerminateInstanceInAutoScalingGroup": CALL_TERMINATE}.get(r.action, r.action)] += 1
        for r in self.gcp:
            if r.is_write:
                out[{"resize": CALL_RESIZE, "deleteInstances": CALL_DELETE_INSTANCES}.get(r.verb, r.verb)] += 1
        return out

    def logged_writes(self) -> Counter[str]:
        """The decision's ``ok`` action rows, one per request (an instance release names its
        instances; AWS terminates them one request each)."""
        out: Counter[str] = Counter()
        for a in self.record["actions"]:
            if a["status"] == "ok":
                n = len(a["arguments"].get("instances", [])) if a["call"] == CALL_TERMINATE else 1
                out[a["call"]] += n
        return out

    def rows(self, pool: str | None = None) -> list[tuple[str, str, str]]:
        return [(a["pool"], a["call"], a["status"]) for a in self.record["actions"] if pool in (None, a["pool"])]

    def stage(self, name: str) -> dict[str, Any]:
        return next(s for s in self.record["trace"] if s["name"] == name)


def daemon_permissions(requests: Sequence[KubeRequest], *, managed: Sequence[str],
                       release: Sequence[str]) -> set[Permission]:
    """The permissions the daemon's own requests needed (the tests' requests carry their token), in
    the namespaces of its Deployments (``managed``) and its own (``release``)."""
    used = set()
    for r in requests:
        attrs = None if r.by_test else request_attributes(r.method, r.path, r.query)
        if attrs is not None:
            scope = scope_of(attrs, managed=managed, release=release)
            used.add(Permission(scope, attrs.group, attrs.resource, attrs.verb))
    return used


def check_daemon_permissions(used: set[Permission], test: str, passed: bool) -> None:
    recorded = load_daemon_calls()
    unrecorded = sorted(map(str, used - set(recorded)))
    assert not unrecorded, (
        f"{test}: the daemon called the Kubernetes API with {unrecorded}, which {DAEMON_CALLS.name} does not "
        f"record: add each to {DAEMON_CALLS} and grant it in deploy/helm/tidegate/templates/rbac.yaml")
    if passed:  # a test that stopped early may not have reached its calls
        unmade = sorted(str(p) for p, witness in recorded.items() if witness == test and p not in used)
        assert not unmade, (
            f"{test}: {DAEMON_CALLS.name} says this test makes {unmade}, and it did not: drop them from the "
            "record and from the chart's Roles, or name the test that makes them")


@pytest.fixture
def cluster_factory(aws: AwsPeer, gcp: GcpComputeServer, kube: KubePeer, tmp_path: Path,
                    request: pytest.FixtureRequest) -> Iterator[Any]:
    made: list[Cluster] = []
    mark = kube.mark()

    def make(**kw: Any) -> Cluster:
        c = Cluster(aws, gcp, kube, tmp_path, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
    report = getattr(request.node, "rep_call", None)
    check_daemon_permissions(daemon_permissions(kube.requests_since(mark), managed=[c.ns for c in made],
                                                release=[c.home_ns for c in made]),
                             request.node.name, passed=report is not None and report.passed)


def _steady_burst(c: Cluster, rt: Runtime) -> Tick:
    """From on-prem 2 to 8 replicas (on-prem 4, AWS spot 2, GCP spot 2), the world caught up."""
    c.catch_up()
    c.tick(rt, queue=8)
    c.catch_up()
    t = c.tick(rt)
    assert t.placement == {"onprem": 4, "aws-spot": 2, "gcp-spot": 2, "aws-od": 0}
    assert t.record["signals"]["pools"]["gcp-spot"]["ready_replicas"] == 2
    assert t.record["signals"]["pools"]["gcp-spot"]["scheduled_replicas"] == 2  # the bound pods, as read
    assert t.peer_writes() == Counter()
    return t


# --- (a) the burst cycle -----------------------------------------------------------------------


def test_burst_cycle_through_the_daemon_loop(cluster_factory: Any) -> None:
    c: Cluster = cluster_factory()
    rt = c.runtime()
    assert isinstance(rt.daemon.pool_providers["aws-spot"], CloudPoolProvider)
    c.catch_up()
    ticks: list[Tick] = []

    def tick(queue: float | None = None) -> Tick:
        t = c.tick(rt, queue)
        # The decision log holds every call: each mutating request a peer served is one ok row
        # of this tick's decision, and each ok write row is a request the peer served.
        assert +t.logged_writes() == +t.peer_writes(), (t.logged_writes(), t.peer_writes())
        assert t.record["outcome"] == "applied", t.record["outcome_detail"]
        assert all(a["status"] not in ("failed-transient", "failed-permanent") for a in t.record["actions"])
        ticks.append(t)
        return t

    # Steady at 2: every pool is observed and asked, nothing changes.
    t = tick(2)
    assert t.placement == {"onprem": 2, "aws-spot": 0, "gcp-spot": 0, "aws-od": 0}
    # calls that changed nothing are counted on the decision, not stored as rows
    assert t.record["actions"] == [] and t.record["noop_actions"] > 0 and t.peer_writes() == Counter()

    # The load rises: on-prem grows first, and alone; no cloud is touched.
    t = tick(4)
    assert t.placement == {"onprem": 4, "aws-spot": 0, "gcp-spot": 0, "aws-od": 0}
    assert t.peer_writes() == Counter({CALL_SCALE: 1}) and c.replicas("onprem") == 4
    assert (c.asg_desired("aws-spot"), c.mig.target_size) == (0, 0)
    c.catch_up()

    # More: both spot groups are resized, nodes ordered before replicas in each.
    t = tick(8)
    assert t.placement == {"onprem": 4, "aws-spot": 2, "gcp-spot": 2, "aws-od": 0}
    ok = [(p, call) for p, call, s in t.rows() if s == "ok"]
    assert ok.index(("aws-spot", CALL_SET_DESIRED)) < ok.index(("aws-spot", CALL_SCALE))
    assert ok.index(("gcp-spot", CALL_RESIZE)) < ok.index(("gcp-spot", CALL_SCALE))
    assert t.peer_writes() == Counter({CALL_SET_DESIRED: 1, CALL_RESIZE: 1, CALL_SCALE: 2})
    assert (c.asg_desired("aws-spot"), c.mig.target_size, c.replicas("aws-spot"), c.replicas("gcp-spot")) == (1, 1, 2, 2)
    assert c.asg_desired("aws-od") == 0
    c.catch_up()

    # Held: the same decision again changes nothing (idempotent), all replicas are ready.
    t = tick()
    assert t.record["reason"] == "WithinTargets" and t.peer_writes() == Counter()
    assert {p: s["ready_replicas"] for p, s in t.record["signals"]["pools"].items()} == t.placement

    # The load falls: spot replicas go first; their nodes still hold pods, so none is released yet.
    t = tick(4)
    assert t.placement == {"onprem": 4, "aws-spot": 0, "gcp-spot": 0, "aws-od": 0}
    assert t.peer_writes() == Counter({CALL_SCALE: 2})
    assert ("aws-spot", CALL_TERMINATE, "skipped") in t.rows() and ("gcp-spot", CALL_DELETE_INSTANCES, "skipped") in t.rows()
    assert ("onprem", CALL_SCALE, "noop") not in t.rows() and t.record["noop_actions"] >= 1
    assert c.replicas("onprem") == 4
    c.catch_up()

    # The pods are gone: the next tick releases exactly those nodes.
    t = tick()
    assert t.peer_writes() == Counter({CALL_TERMINATE: 1, CALL_DELETE_INSTANCES: 1})
    assert (c.asg_desired("aws-spot"), c.mig.target_size) == (0, 0)
    c.catch_up()

    # Only now does on-prem shrink.
    t = tick(2)
    assert t.placement == {"onprem": 2, "aws-spot": 0, "gcp-spot": 0, "aws-od": 0}
    assert t.peer_writes() == Counter({CALL_SCALE: 1}) and c.replicas("onprem") == 2

    # The whole cycle in the decision log: one row per tick with its actions; on-prem never
    # shrank while spot held replicas or nodes; every cloud and Kubernetes took part.
    log = list(rt.daemon.repo.all_decisions("llama"))
    assert [r["id"] for r in log] == [t.record["id"] for t in ticks]
    onprem = [r["placement"]["onprem"] for r in log]
    first_shrink = next(i for i in range(1, len(onprem)) if onprem[i] < onprem[i - 1])
    releases = [i for i, r in enumerate(log) for a in r["actions"]
                if a["call"] in (CALL_TERMINATE, CALL_DELETE_INSTANCES) and a["status"] == "ok"]
    assert releases and max(releases) < first_shrink
    assert {a["provider"] for r in log for a in r["actions"]} == {"kubernetes", "aws", "gcp"}
    assert all(a["latency_ms"] >= 0 for r in log for a in r["actions"])


def test_a_scale_that_fails_part_way_leaves_what_it_changed_in_the_log(cluster_factory: Any, kube: KubePeer) -> None:
    c: Cluster = cluster_factory()
    rt = c.runtime()
    c.catch_up()
    # The GCP group is resized, then every patch of the GCP Deployment's scale fails (503).
    kube.fault("PATCH", rf"/namespaces/{c.ns}/deployments/llama-gcp-spot/scale$", 503,
               times=RETRY_ATTEMPTS)
    t = c.tick(rt, queue=8, ok=False)
    assert t.record["outcome"] == "partial" and "gcp-spot" in t.record["outcome_detail"]
    gcp_rows = t.rows("gcp-spot")
    # the resize that did happen is in the log, before the failed patches and the failure row
    assert gcp_rows[0] == ("gcp-spot", CALL_RESIZE, "ok") and c.mig.target_size == 1
    assert gcp_rows[1:-1] == [("gcp-spot", CALL_SCALE, "failed-transient")] * RETRY_ATTEMPTS
    assert gcp_rows[-1] == ("gcp-spot", "scale", "failed-transient")
    assert [r for r in t.gcp if r.is_write] and c.replicas("gcp-spot") == 0
    # the other pools went through
    assert (c.replicas("onprem"), c.replicas("aws-spot"), c.asg_desired("aws-spot")) == (4, 2, 1)

    # The next tick completes it: the group is already at size (no second resize), the replicas follow.
    t = c.tick(rt)
    assert t.record["outcome"] == "applied"
    assert t.rows("gcp-spot") == [("gcp-spot", CALL_SCALE, "ok")] and t.record["noop_actions"] >= 1
    assert t.peer_writes() == Counter({CALL_SCALE: 1}) and c.replicas("gcp-spot") == 2


# --- (b) spot interruptions --------------------------------------------------------------------


def test_spot_interruptions_from_sqs_and_from_a_node_taint_are_replaced_in_the_next_tick(cluster_factory: Any) -> None:
    c: Cluster = cluster_factory()
    rt = c.runtime()
    _steady_burst(c, rt)

    # An EC2 spot interruption warning arrives through EventBridge -> SQS for the AWS spot node.
    (doomed,) = [pid.rsplit("/", 1)[-1] for pid in asg_instances(c.aws, c.asg["aws-spot"]).values()]
    c.sqs.send_message(QueueUrl=c.queue_url, MessageBody=json.dumps(spot_interruption_event(doomed, at=c.clock.now())))
    t = c.tick(rt)
    assert t.record["reason"] == "SpotInterrupted" and t.record["interrupted_replaced"] == 2
    assert t.record["signals"]["pools"]["aws-spot"]["interrupted_replicas"] == 2
    assert t.placement == {"onprem": 4, "aws-spot": 0, "gcp-spot": 4, "aws-od": 0}
    assert t.record["replicas"] == 8  # the same total: replaced, not lost
    assert "aws-spot: 2 replicas on interrupted nodes" in t.stage("placement")["message"]
    # make before break: the replacement grows first, the interrupted pool shrinks after it
    ok = [(p, call) for p, call, s in t.rows() if s == "ok"]
    assert ok.index(("gcp-spot", CALL_RESIZE)) < ok.index(("gcp-spot", CALL_SCALE)) < ok.index(("aws-spot", CALL_SCALE))
    assert any(r.action == "DeleteMessageBatch" for r in t.aws)  # the warning was consumed
    assert (c.replicas("aws-spot"), c.replicas("gcp-spot"), c.mig.target_size) == (0, 4, 2)

    # GKE taints a GCP spot node before preempting it: the pods on it are replaced next tick, and
    # marked as the ones the ReplicaSet removes (pod-deletion-cost) before the scale-in.
    c.catch_up()
    node = next(n for n in c.gcp.running(c.mig) if c.pods_on(n))
    doomed_pods = set(c.pods_on(node))
    assert len(doomed_pods) == 2
    taint_node(c.core, node, GKE_TERMINATION_TAINT, effect="NoSchedule", at=c.clock.now())
    t = c.tick(rt)
    assert t.record["reason"] == "SpotInterrupted" and t.record["interrupted_replaced"] == 2
    assert t.record["replicas"] == 8 and t.placement["gcp-spot"] == 2
    assert sum(t.placement.values()) - t.placement["gcp-spot"] == 6  # the two went elsewhere
    annotated = {a["arguments"]["pod"] for a in t.record["actions"] if a["call"] == CALL_DELETION_COST and a["status"] == "ok"}
    assert annotated == doomed_pods
    calls = [call for p, call, s in t.rows("gcp-spot") if s == "ok"]
    assert calls.index(CALL_DELETION_COST) < calls.index(CALL_SCALE)
    c.catch_up()
    assert c.pods_on(node) == []  # the ReplicaSet (here: the test's controller) removed exactly those


# --- (c) insufficient capacity -----------------------------------------------------------------


def test_insufficient_spot_capacity_moves_the_placement_to_on_demand(cluster_factory: Any) -> None:
    c: Cluster = cluster_factory()
    rt = c.runtime()
    c.catch_up()
    t = c.tick(rt, queue=12)
    assert t.placement == {"onprem": 4, "aws-spot": 4, "gcp-spot": 4, "aws-od": 0}
    assert (c.asg_desired("aws-spot"), c.mig.target_size) == (2, 2)

    # AWS cannot launch the spot instances: the group's launches fail for lack of capacity (moto
    # never fails a launch; the proxy answers the scaling activities as AWS would) and no node
    # joins, so the spot pods stay Pending.
    at = c.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")
    c.aws.fault("DescribeScalingActivities", 200, scaling_activities(c.asg["aws-spot"], [{
        "ActivityId": str(uuid.uuid4()), "StartTime": at, "EndTime": at, "StatusCode": "Failed", "Progress": "100",
        "Description": "Launching a new EC2 instance.  Status Reason: Could not launch Spot Instances. "
                       "InsufficientInstanceCapacity - There is no Spot capacity available that matches your request.",
        "StatusMessage": "InsufficientInstanceCapacity - There is no Spot capacity available"}]),
        times=1000, params={"AutoScalingGroupName": c.asg["aws-spot"]})
    c.catch_up(aws_spot_launches=False)

    t = c.tick(rt)
    spot = t.record["signals"]["pools"]["aws-spot"]
    assert spot["available"] is False and "InsufficientInstanceCapacity" in spot["unavailable_reason"]
    assert t.placement == {"onprem": 4, "aws-spot": 0, "gcp-spot": 4, "aws-od": 4}
    assert t.record["reason"] == "SpotPoolUnavailable"
    assert "4 on on-demand" in t.stage("placement")["message"]
    ok = [(p, call) for p, call, s in t.rows() if s == "ok"]
    # on-demand capacity first, then its replicas; the failed spot pool is emptied after that and
    # its instances (never nodes) are released at once
    assert ok.index(("aws-od", CALL_SET_DESIRED)) < ok.index(("aws-od", CALL_SCALE)) < ok.index(("aws-spot", CALL_SCALE))
    assert ok.index(("aws-spot", CALL_SCALE)) < ok.index(("aws-spot", CALL_TERMINATE))
    assert (c.asg_desired("aws-od"), c.replicas("aws-od"), c.asg_desired("aws-spot"), c.replicas("aws-spot")) == (2, 4, 0, 0)
    assert +t.logged_writes() == +t.peer_writes()

    # While the capacity error stands, nothing goes back to AWS spot.
    c.catch_up(aws_spot_launches=False)
    t = c.tick(rt)
    assert t.placement["aws-spot"] == 0 and t.placement["aws-od"] == 4
    assert CALL_SET_DESIRED not in {call for p, call, s in t.rows("aws-spot") if s == "ok"}


# --- (d) two daemons, one leader ---------------------------------------------------------------


def _terminate_session(pg_url: str, pid: int | None) -> None:
    """End a backend from outside (a crashed host, an operator) and wait until it is gone."""
    assert pid is not None
    with psycopg.connect(libpq_dsn(pg_url), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 5
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() != (0,):
            assert time.monotonic() < deadline, f"backend {pid} still alive"
            time.sleep(0.01)


@pytest.mark.postgres
def test_two_daemons_one_actuates_and_the_other_takes_over_when_the_leader_dies(
        cluster_factory: Any, pg_url: str) -> None:
    c: Cluster = cluster_factory(db_url=pg_url)
    election = f"t-{uuid.uuid4().hex}"
    a = c.runtime(name=election, identity="daemon-a")
    b = c.runtime(name=election, identity="daemon-b")
    assert type(a.daemon.elector).__name__ == "PostgresAdvisoryLock"  # the default on PostgreSQL
    c.catch_up()

    leader_ticks = 0
    ta = c.tick(a, queue=4)
    tb = c.tick(b)
    assert ta.report.skipped is None and tb.report.skipped == "not the leader"
    leader_ticks += 1
    assert tb.requests == 0  # the follower does not even observe
    assert ta.peer_writes() == Counter({CALL_SCALE: 1}) and c.replicas("onprem") == 4

    # Both at once, several times: exactly one decides and acts each round.
    for _ in range(3):
        c.clock.advance(TICK_S)
        reports: dict[str, TickReport] = {}
        gate = threading.Barrier(2)

        def run(name: str, rt: Runtime) -> None:
            gate.wait()
            reports[name] = rt.daemon.tick()

        threads = [threading.Thread(target=run, args=(n, rt)) for n, rt in (("a", a), ("b", b))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        assert sorted((r.skipped or "acted") for r in reports.values()) == ["acted", "not the leader"]
        assert reports["a"].skipped is None
        leader_ticks += 1

    # The leader dies: its lock session ends. The other daemon takes over on its very next tick,
    # rebuilds its history from the shared log, observes and acts (a burst to spot).
    _terminate_session(pg_url, a.daemon.elector.backend_pid)  # type: ignore[union-attr]
    tb = c.tick(b, queue=8)
    assert tb.report.skipped is None
    leader_ticks += 1
    assert tb.placement == {"onprem": 4, "aws-spot": 2, "gcp-spot": 2, "aws-od": 0}
    assert tb.peer_writes() == Counter({CALL_SET_DESIRED: 1, CALL_RESIZE: 1, CALL_SCALE: 2})
    assert (c.asg_desired("aws-spot"), c.mig.target_size) == (1, 1)

    # The old leader comes back: it is a follower now and touches nothing.
    ta = c.tick(a)
    assert ta.report.skipped == "not the leader" and ta.requests == 0
    tb = c.tick(b)
    assert tb.report.skipped is None
    leader_ticks += 1

    # One decision row per leader tick, in one shared log.
    log = list(a.daemon.repo.all_decisions("llama"))
    assert len(log) == leader_ticks
    assert log[-2]["placement"] == tb.placement == log[-1]["placement"]


def test_lease_leadership_is_wired_from_the_settings(cluster_factory: Any) -> None:
    c: Cluster = cluster_factory()
    cfgs = [c.config(backend="lease", lease_namespace=c.home_ns, identity=who, lease_duration_s=15)
            for who in ("daemon-a", "daemon-b")]
    # each elector's client is built from the daemon config, so its calls count as the daemon's
    a, b = (build_elector(cfg.leader_election, database_url="sqlite://",
                          api_client=cfg.providers.settings.kubernetes.api_client, clock=c.clock)  # type: ignore[union-attr]
            for cfg in cfgs)
    assert a is not None and b is not None
    try:
        assert a.try_acquire() and not b.try_acquire() and a.try_acquire()
        lease = k8s.CoordinationV1Api(c.api).read_namespaced_lease("tidegate-leader", c.home_ns)
        assert (lease.spec.holder_identity, lease.spec.lease_duration_seconds) == ("daemon-a", 15)
        c.clock.advance(16)  # daemon-a stopped renewing (it died): the lease has run out
        assert b.try_acquire() and not a.try_acquire()
    finally:
        a.release()
        b.release()


def test_bucket_leases_are_wired_from_the_settings(cluster_factory: Any) -> None:
    """Sharded (leader_election.buckets): the daemon's own client reads, creates and renews the
    bucket Leases and the members Lease under the names the chart's Role grants, with the same
    verbs as the single leader's Lease (this module's permission check holds it to the record)."""
    from controller.shards import bucket_lease_name, members_lease_name

    c: Cluster = cluster_factory()
    cfgs = [c.config(backend="lease", lease_namespace=c.home_ns, identity=who, lease_duration_s=15, buckets=4)
            for who in ("daemon-a", "daemon-b")]
    a, b = (build_elector(cfg.leader_election, database_url="sqlite://",
                          api_client=cfg.providers.settings.kubernetes.api_client, clock=c.clock)  # type: ignore[union-attr]
            for cfg in cfgs)
    assert isinstance(a, ShardElector) and isinstance(b, ShardElector)
    try:
        assert a.acquire_buckets() == {0, 1, 2, 3}  # alone: every bucket
        c.clock.advance(3)
        assert len(b.acquire_buckets()) < 4  # b joins; a still holds what b targets
        c.clock.advance(3)
        held_a = a.acquire_buckets()  # a sees b and hands b's share over
        c.clock.advance(3)
        held_b = b.acquire_buckets()
        assert held_a | held_b == {0, 1, 2, 3} and not held_a & held_b and len(held_a) == len(held_b) == 2
        leases = k8s.CoordinationV1Api(c.api)
        for i in range(4):
            lease = leases.read_namespaced_lease(bucket_lease_name(cfgs[0].leader_election.name, i, 4), c.home_ns)
            assert lease.spec.holder_identity == ("daemon-a" if i in held_a else "daemon-b")
        leases.read_namespaced_lease(members_lease_name(cfgs[0].leader_election.name), c.home_ns)
    finally:
        a.release()
        b.release()


# --- (d2) a Karpenter pool ----------------------------------------------------------------------


def test_a_karpenter_pool_is_scaled_through_its_deployment_and_read_through_its_nodeclaims(
        cluster_factory: Any) -> None:
    c: Cluster = cluster_factory()
    karpenter = KarpenterControllers(c.ctl)
    node_pool = f"gpu-spot-{c.ns}"
    karpenter.add_node_pool(node_pool, "spot", gpu_limit=16)
    c.ctl.add_deployment(c.ns, "llama-kp", {"app": "llama", "pool": "kp"}, 0, gpus=2, node_selector={
        "karpenter.sh/nodepool": node_pool, "karpenter.sh/capacity-type": "spot"})
    onprem = next(p for p in c.raw["pools"] if p["name"] == "onprem")
    c.raw["pools"] = [onprem, {"name": "kp", "tier": "spot", "provider": "karpenter", "gpu_type": "A100-80GB",
                               "gpus_per_node": 4, "max_nodes": 8, "price_per_node_hour_usd": 4.0,
                               "karpenter": {"node_pool": node_pool}}]
    c.raw["models"][0]["deployments"] = {"onprem": {"namespace": c.ns, "name": "llama-onprem"},
                                         "kp": {"namespace": c.ns, "name": "llama-kp"}}
    rt = c.runtime()
    c.ctl.reconcile(c.clock.now())
    t = c.tick(rt, queue=8)  # 8 replicas: on-prem holds 4, the Karpenter pool the rest
    assert t.placement == {"onprem": 4, "kp": 4}
    assert t.rows("kp") == [("kp", CALL_SCALE, "ok")]
    daemon = [(r.method, r.path) for r in t.kube if not r.by_test]
    assert ("GET", f"/apis/karpenter.sh/v1/nodepools/{node_pool}") in daemon
    assert ("GET", "/apis/karpenter.sh/v1/nodeclaims") in daemon
    assert not [r for r in t.kube if not r.by_test and r.is_write and "karpenter.sh" in r.path]
    assert t.aws == [] and t.gcp == []  # no node group anywhere
    karpenter.catch_up(c.clock.now())
    t = c.tick(rt)
    pools = t.record["signals"]["pools"]
    assert (pools["kp"]["ready_replicas"], pools["kp"]["nodes"], pools["kp"]["max_nodes"]) == (4, 2, 4)
    assert t.peer_writes() == Counter()


# --- (e) dry-run -------------------------------------------------------------------------------


def test_dry_run_over_the_real_adapters_makes_no_mutating_call(cluster_factory: Any) -> None:
    """Dry-run is the controller's act step alone (the providers have none): over kmock, moto and
    the GCP peer, three ticks that want to scale make no write request to any of them."""
    c: Cluster = cluster_factory()
    rt = c.runtime(dry_run=True)
    real = rt.extras["real"]
    assert real.parts["aws"]["interruptions"] is None  # reading the queue would delete an acting daemon's messages
    c.catch_up()
    c.sqs.send_message(QueueUrl=c.queue_url, MessageBody=json.dumps(spot_interruption_event("i-0123456789abcdef0", at=T0)))
    km, am, gm = c.marks()
    records = [c.tick(rt, queue=8), c.tick(rt), c.tick(rt, queue=14)]
    writes = ([r for r in c.kube.requests_since(km) if r.is_write] + [r for r in c.aws.requests_since(am) if r.is_write]
              + [r for r in c.gcp.requests_since(gm) if r.is_write])
    assert writes == []
    assert [r for r in c.aws.requests_since(am) if r.action.startswith(("Receive", "Delete"))] == []
    assert any(not r.is_write for r in c.kube.requests_since(km))  # it did observe
    for t in records:
        assert t.record["dry_run"] is True and t.record["outcome"] == "dry-run"
        assert t.record["actions"] and {a["status"] for a in t.record["actions"]} == {"dry-run"}
    assert records[0].placement == {"onprem": 4, "aws-spot": 2, "gcp-spot": 2, "aws-od": 0}
    assert {a["pool"]: a["arguments"] for a in records[-1].record["actions"]}["aws-od"] == {
        "replicas": 2, "nodes": 1, "previous_replicas": 0}
    # Nothing moved in the world, and the interruption warning is still waiting in the queue.
    assert (c.replicas("onprem"), c.replicas("aws-spot"), c.asg_desired("aws-spot"), c.mig.target_size) == (2, 0, 0, 0)
    attrs = c.sqs.get_queue_attributes(QueueUrl=c.queue_url, AttributeNames=["ApproximateNumberOfMessages"])
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "1"


# --- the assembly ------------------------------------------------------------------------------


def test_settings_defaults_are_the_adapters_defaults() -> None:
    s = RealSettings()
    # One class per provider: the section an operator writes is what the adapter takes.
    assert (type(s.kubernetes), type(s.aws), type(s.gcp), type(s.cloud)) == (
        KubernetesSettings, AwsSettings, GcpSettings, CloudPoolSettings)
    election = LeaderElectionSettings()
    assert election.resolved_backend("postgresql+psycopg://u@h/db") == "database"
    assert election.resolved_backend("sqlite:///x.db") == "none"
    assert s.kubernetes.use_in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert not s.kubernetes.use_in_cluster({})
    extra = RealSettings.model_validate({"kubernetes": {"extra_interruption_taints": {"example.com/going": "interruption"}}})
    taints = extra.kubernetes.interruption_taints
    assert "example.com/going" in taints and GKE_TERMINATION_TAINT in taints


MINI_CONFIG: dict[str, Any] = {
    "providers": {"type": "real", "settings": {"prometheus": {"url": "http://prometheus:9090"}}},
    "pools": [
        {"name": "onprem", "kind": "onprem", "gpu_type": "A100-80GB", "gpus_per_node": 8, "max_nodes": 1,
         "price_per_node_hour_usd": 9.0},
        {"name": "aws-spot", "kind": "aws-spot", "gpu_type": "A100-80GB", "gpus_per_node": 4, "max_nodes": 2,
         "price_per_node_hour_usd": 4.0, "aws": {"region": AWS_REGION, "auto_scaling_group": "spot"}},
        {"name": "gcp-spot", "kind": "gcp-spot", "gpu_type": "A100-80GB", "gpus_per_node": 4, "max_nodes": 2,
         "price_per_node_hour_usd": 5.0, "gcp": {"project": "p", "zone": "z", "instance_group_manager": "m"}},
    ],
    "models": [{"name": "llama", "tp_degree": 2, "quantization": "fp8", "gpu_types": ["A100-80GB"], "cold_start_s": 90,
                "capacity": {"A100-80GB": {"output_tokens_per_s": 1500, "requests_per_s": 3}},
                "deployments": {p: {"name": f"llama-{p}"} for p in ("onprem", "aws-spot", "gcp-spot")}}],
}


@pytest.mark.parametrize("settings, needles", [
    ({"gcp": {"spot_prices_usd": {"mars": 1.0}}}, ["'mars'", "not among the pools"]),
    ({"gcp": {"spot_prices_usd": {"aws-spot": 1.0}}}, ["'aws-spot'", "provider is aws, not gcp"]),
    ({"triton": {"replicas": {"llama": {"moon": ["h:8000"]}}}}, ["'moon'", "has no deployment"]),
    ({"triton": {"port": 8000}}, ["replicas", "discover"]),
    ({"aws": {"spot_price_refresh_s": 7200}}, ["spot_price_refresh_s (7200)", "spot_price_max_age_s (3600)"]),
    ({"kubernetes": {"in_cluster": True, "host": "http://x"}}, ["in_cluster", "'http://x'"]),
    ({"leader": {"backend": "zookeeper"}}, ["backend"]),
    ({"prometheus": {"url": "http://p:9090", "colour": "blue"}}, ["colour"]),
])
def test_bad_settings_are_refused_at_load_with_both_values(settings: dict[str, Any], needles: list[str]) -> None:
    raw = json.loads(json.dumps(MINI_CONFIG))
    raw["providers"]["settings"].update(settings)
    DaemonConfig.model_validate(MINI_CONFIG)  # the config is fine without the bad part
    with pytest.raises(ValidationError) as info:
        DaemonConfig.model_validate(raw)
    for n in needles:
        assert n in str(info.value), str(info.value)


def test_runtime_schedules_the_spot_price_job_and_needs_prometheus(cluster_factory: Any) -> None:
    c: Cluster = cluster_factory(spot_instance_type="g5.12xlarge")
    raw = json.loads(json.dumps(c.raw))
    raw["providers"]["settings"]["prometheus"] = None
    with pytest.raises(ValueError, match="prometheus is required"):
        build_real_providers(DaemonConfig.model_validate(raw), c.clock)

    rt = c.runtime(dry_run=True)
    real = rt.extras["real"]
    assert [(s, job_id) for _, s, job_id in real.jobs] == [(300.0, "aws-spot-prices")]
    pools = list(rt.daemon.pools.values())
    assert rt.daemon.price_source is not None
    assert rt.daemon.price_source.prices(pools, c.clock.now())["aws-spot"] == 4.0  # static until refreshed
    rt.daemon.start(wall_interval_s=3600, policy_reload_s=3600)
    deadline = time.monotonic() + 20
    while real.parts["aws"]["spot_prices"].live("aws-spot", c.clock.now()) is None:  # the job's first run is at start
        assert time.monotonic() < deadline, real.parts["aws"]["spot_prices"].errors
        time.sleep(0.05)
    live = rt.daemon.price_source.prices(pools, c.clock.now())
    assert live["aws-spot"] == real.parts["aws"]["spot_prices"].live("aws-spot", c.clock.now()) and live["onprem"] == 9.0


def test_triton_endpoints_come_from_the_config_and_the_pods_of_each_pool(cluster_factory: Any) -> None:
    c: Cluster = cluster_factory()
    raw = json.loads(json.dumps(c.raw))
    raw["providers"]["settings"]["triton"] = {"replicas": {"llama": {"aws-od": ["10.9.9.9:8000"]}}, "discover": True,
                                              "port": 8001, "triton_models": {"llama": "ensemble"}}
    cfg = DaemonConfig.model_validate(raw)
    real = build_real_providers(cfg, c.clock)
    try:
        assert type(real.metrics).__name__ == "CombinedMetricsSource"
    finally:
        real.close()
    c.catch_up()  # two on-prem pods, bound and Running
    pods = [p for p in c.core.list_namespaced_pod(c.ns).items if p.metadata.labels.get("pool") == "onprem"]
    assert len(pods) == 2
    c.core.patch_namespaced_pod_status(pods[0].metadata.name, c.ns, {"status": {"podIP": "10.1.0.7"}})
    c.core.patch_namespaced_pod_status(pods[1].metadata.name, c.ns, {"status": {"podIP": "10.1.0.8", "phase": "Pending"}})
    settings = getattr(cfg.providers, "settings", None)
    assert isinstance(settings, RealSettings) and settings.triton is not None
    # the daemon's own client, as build_real_providers makes it from the settings
    replicas = discover_triton_replicas(KubernetesCluster(settings.kubernetes.api_client(), KubernetesSettings()),
                                        cfg, settings.triton)()
    assert sorted((r.url, r.pool, r.triton_model) for r in replicas["llama"]) == [
        ("10.1.0.7:8001", "onprem", "ensemble"), ("10.9.9.9:8000", "aws-od", "ensemble")]
