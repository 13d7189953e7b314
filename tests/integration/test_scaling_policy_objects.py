"""ScalingPolicy objects over kmock, through the daemon as ``tidegate run`` builds it
(``build_runtime`` with ``providers.settings.kubernetes_objects.enabled``).

The story: a ScalingPolicy object is applied; the daemon loads it (no policy file at all), scales
the model's Deployments on an on-prem pool and a Karpenter pool as a scripted load rises and falls; the object's
status conditions and the Events on the Deployments and on the object appear and change with it;
an HPA added on one Deployment makes the daemon stop acting on that Deployment
(``AbleToScale=False``, a Warning Event, the pool unavailable in ``/v1/status``); a bad update of
the object is refused with its field while the previous version keeps deciding. A second test
shows a KEDA ScaledObject refused the same way until ``adopt: true``.

The fleet is ``Fleet.pools``: ``onprem`` (one 8-GPU node of its own) and ``karpenter``
(``provider: karpenter``, spot), whose Deployment is pinned to its NodePool and capacity type and
whose nodes Karpenter brings and takes away (``KarpenterControllers`` in ``tests.integration.peers``,
driven by ``Fleet.catch_up`` as the pods are by ``KubeControllers``).

Every request the daemon's own client makes is held to ``tests/integration/daemon_kube_calls.yaml``
(``tests.rbac``), as in ``test_daemon_actuation.py``; the calls this module is the witness of are
the ones the chart's RBAC grants for these objects.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from controller.config import DaemonConfig
from controller.crd import API_VERSION, GROUP, PLURAL, VERSION
from controller.runtime import Runtime, build_runtime
from providers.clock import ManualClock
from providers.karpenter import CAPACITY_TYPE_LABEL, NODEPOOL_LABEL
from providers.kubeobjects import CLAIM_ANNOTATION, DECISION_ANNOTATION, POLICY_ANNOTATION
from tests.integration.peers import KarpenterControllers, KubeControllers, KubePeer
from tests.integration.kube_fleet import ScriptedLoad
from tests.integration.test_daemon_actuation import check_daemon_permissions, daemon_permissions

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
TICK_S = 30.0


def policy_object(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "llama",
        "bounds": {"min_replicas": 1, "max_replicas": 8},
        "rules": [{"kind": "queue-depth", "params": {"target_per_replica": 1}}],
        "behavior": {"tolerance": 0, "scale_up": {"stabilization_s": 0, "policies": []},
                     "scale_down": {"stabilization_s": 0, "policies": []}},
        # the burst goes to the cloud pool at once: these tests are about the objects and the
        # actuation (lead-time economics, which holds a young burst on-prem, has tests of its own)
        "lead_time": {"enabled": False},
    }
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": "ScalingPolicy", "metadata": {"name": name, "namespace": ns},
            "spec": body}


class Fleet:
    """One model (TP 2) with a Deployment in each pool: ``onprem`` on one 8-GPU node, ``karpenter``
    on the spot NodePool ``np-TAG`` of one 8-GPU node at most (its GPU limit), nodes claimed by
    Karpenter for Pending pods and consolidated when empty."""

    def __init__(self, kube: KubePeer, tmp: Path) -> None:
        tag = uuid.uuid4().hex[:6]
        self.kube, self.ns, self.home_ns = kube, f"p-{tag}", f"tidegate-{tag}"
        self.clock = ManualClock(T0)
        self.load = ScriptedLoad()
        self.api = kube.api_client()
        self.ctl = KubeControllers(self.api)
        self.karpenter = KarpenterControllers(self.ctl, gpus_per_node=8)
        self.node_pool = f"np-{tag}"
        self.karpenter.add_node_pool(self.node_pool, "spot", gpu_limit=8)
        self.apps, self.core = k8s.AppsV1Api(self.api), k8s.CoreV1Api(self.api)
        self.custom, self.autoscaling = k8s.CustomObjectsApi(self.api), k8s.AutoscalingV2Api(self.api)
        onprem_labels = {"tidegate.io/pool": f"onprem-{tag}"}
        self.pools: dict[str, dict[str, Any]] = {
            "onprem": {"tier": "onprem", "price_per_node_hour_usd": 9.0,
                       "kubernetes": {"node_selector": onprem_labels}},
            "karpenter": {"tier": "spot", "provider": "karpenter", "price_per_node_hour_usd": 10.0,
                          "karpenter": {"node_pool": self.node_pool}},
        }
        self.ctl.add_deployment(self.ns, "llama-onprem", {"app": "llama", "pool": "onprem"}, 1, gpus=2,
                                node_selector=onprem_labels)
        self.ctl.add_node(f"{self.ns}-onprem-0", onprem_labels, 8)
        self.ctl.add_deployment(self.ns, "llama-karpenter", {"app": "llama", "pool": "karpenter"}, 0, gpus=2,
                                node_selector={NODEPOOL_LABEL: self.node_pool, CAPACITY_TYPE_LABEL: "spot"})
        policies = tmp / f"policies-{tag}"
        policies.mkdir()  # empty: every policy comes from the cluster
        self.raw: dict[str, Any] = {
            "policies_dir": str(policies),
            "database": {"url": f"sqlite:///{tmp / f'tidegate-{tag}.db'}"},
            "api": {"enabled": False},
            "providers": {"type": "real", "settings": {
                "prometheus": {"url": "http://127.0.0.1:9"},  # never queried: ScriptedLoad
                "kubernetes": {"host": kube.url},
                "kubernetes_objects": {"enabled": True, "conflict_check_s": 0},
            }},
            "pools": [{"name": p, "gpu_type": "A100-80GB", "gpus_per_node": 8, "max_nodes": 1,
                       "provisioning_delay_s": 0, **c} for p, c in self.pools.items()],
            "models": [{"name": "llama", "tp_degree": 2, "quantization": "fp8", "gpu_types": ["A100-80GB"],
                        "cold_start_s": 90, "capacity": {"A100-80GB": {"output_tokens_per_s": 1500, "requests_per_s": 3}},
                        "deployments": {p: {"namespace": self.ns, "name": f"llama-{p}"} for p in self.pools}}],
        }
        self.runtimes: list[Runtime] = []

    def runtime(self) -> Runtime:
        rt = build_runtime(DaemonConfig.model_validate(json.loads(json.dumps(self.raw))), clock=self.clock,
                           environ={}, election_clock=self.clock)
        self.runtimes.append(rt)
        rt.daemon.metrics_source = self.load
        return rt

    def catch_up(self) -> None:
        """Pods follow the Deployments; Karpenter claims nodes for the Pending ones, which come up
        and take them, and consolidates the nodes left empty."""
        now = self.clock.now()
        self.karpenter.catch_up(now)
        self.karpenter.consolidate(now)
        self.karpenter.settle()

    def node_claims(self) -> list[str]:
        return sorted(c["metadata"]["name"] for c in self.karpenter.claims(self.node_pool))

    def tick(self, rt: Runtime, queue: float | None = None, *, missing: bool = False) -> int:
        """Reload policies, advance the clock, tick, let the cluster catch up; the decision id."""
        self.load.queue = None if missing else (queue if queue is not None else self.load.queue)
        rt.daemon.reload_policies()
        self.clock.advance(TICK_S)
        report = rt.daemon.tick()
        assert report.skipped is None and not report.errors, report.errors
        self.catch_up()
        return report.decision_ids["llama"]

    # -- what kubectl shows -------------------------------------------------------------------------

    def apply(self, obj: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, obj)

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, {"spec": spec})

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name).get("status") or {})

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next(c for c in self.status(name)["conditions"] if c["type"] == kind)

    def replicas(self, pool: str) -> int:
        return int(self.apps.read_namespaced_deployment(f"llama-{pool}", self.ns).spec.replicas)

    def annotations(self, pool: str) -> dict[str, str]:
        return dict(self.apps.read_namespaced_deployment(f"llama-{pool}", self.ns).metadata.annotations or {})

    def events(self, kind: str, name: str) -> list[tuple[str, str, str]]:
        return [(e.type, e.reason, e.message) for e in self.core.list_namespaced_event(self.ns).items
                if e.involved_object.kind == kind and e.involved_object.name == name]

    def status_writes(self, since: int) -> int:
        return sum(1 for r in self.kube.requests_since(since) if not r.by_test and r.path.endswith("/status"))

    def scale_writes(self, since: int, pool: str) -> int:
        return sum(1 for r in self.kube.requests_since(since) if not r.by_test and r.method == "PATCH"
                   and r.path.endswith(f"/deployments/llama-{pool}/scale"))

    def add_hpa(self, pool: str) -> None:
        self.autoscaling.create_namespaced_horizontal_pod_autoscaler(self.ns, k8s.V2HorizontalPodAutoscaler(
            api_version="autoscaling/v2", kind="HorizontalPodAutoscaler",
            metadata=k8s.V1ObjectMeta(name=f"llama-{pool}-hpa", namespace=self.ns),
            spec=k8s.V2HorizontalPodAutoscalerSpec(
                max_replicas=4, min_replicas=1,
                scale_target_ref=k8s.V2CrossVersionObjectReference(api_version="apps/v1", kind="Deployment",
                                                                   name=f"llama-{pool}"))))

    def add_scaled_object(self, pool: str) -> None:
        self.custom.create_namespaced_custom_object("keda.sh", "v1alpha1", self.ns, "scaledobjects", {
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": f"llama-{pool}-so", "namespace": self.ns},
            "spec": {"scaleTargetRef": {"name": f"llama-{pool}"}, "minReplicaCount": 1, "maxReplicaCount": 4,
                     "triggers": [{"type": "prometheus", "metadata": {
                         "serverAddress": "http://prometheus:9090", "query": "sum(nv_inference_pending_request_count)",
                         "threshold": "4"}}]}})


def _metric(rt: Runtime, series: str) -> float:
    """One series of the daemon's own /metrics text."""
    for line in rt.daemon.metrics.render().decode().splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} is not exported")


@pytest.fixture
def fleet(kube: KubePeer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    mark = kube.mark()
    f = Fleet(kube, tmp_path)
    yield f
    for rt in f.runtimes:
        rt.stop()
    report = getattr(request.node, "rep_call", None)
    check_daemon_permissions(daemon_permissions(kube.requests_since(mark), managed=[f.ns], release=[f.home_ns]),
                             request.node.name, passed=report is not None and report.passed)


def test_a_scaling_policy_object_drives_the_daemon_and_shows_what_it_does(fleet: Fleet) -> None:
    f = fleet
    f.apply(policy_object("llama-queue", f.ns))
    rt = f.runtime()
    f.catch_up()
    start = f.kube.mark()

    # -- applied: loaded from the cluster, versioned like a file ---------------------------------
    first = f.tick(rt, queue=6)
    pol = rt.daemon.policy_store.policies()["llama"]
    assert pol.sources == (f"ScalingPolicy {f.ns}/llama-queue",)
    assert (f.replicas("onprem"), f.replicas("karpenter")) == (4, 2)  # cheaper pool first
    st = f.status("llama-queue")
    assert st["policyVersion"] == pol.version and st["desiredReplicas"] == 6 and st["observedGeneration"] == 1
    assert st["pools"]["karpenter"] == {"desired": 2, "current": 0, "ready": 0, "managed": True}
    assert st["lastDecision"]["id"] == first and st["costPerHourUSD"] == f"{rt.daemon.controller.last_decisions['llama'].cost_per_hour_usd:.2f}"
    assert {c["type"]: c["status"] for c in st["conditions"]} == {
        "Ready": "True", "Active": "True", "AbleToScale": "True", "ScalingLimited": "False", "Degraded": "False"}
    assert f.condition("llama-queue", "Active")["reason"] == "QueueAboveTarget"
    ev = f.events("Deployment", "llama-karpenter")
    assert [(t, r) for t, r, _ in ev] == [("Normal", "SuccessfulRescale")]
    assert ev[0][2].startswith("SuccessfulRescale: 0 -> 2 on karpenter: ")
    assert any(m.startswith("SuccessfulRescale: 1 -> 6 (karpenter 0 -> 2, onprem 1 -> 4): ")
               for _, _, m in f.events("ScalingPolicy", "llama-queue"))
    ann = f.annotations("karpenter")
    assert ann[POLICY_ANNOTATION] == f"{f.ns}/llama-queue" and ann[DECISION_ANNOTATION] == str(first)
    assert ann[CLAIM_ANNOTATION] == "tidegate/llama"

    # -- Karpenter brings a node for the Pending pods, they come up: one write with the ready counts;
    # then steady, nothing is written --------------------------------------------------------------
    assert len(f.node_claims()) == 1
    mark = f.kube.mark()
    seen = f.tick(rt)
    assert f.status_writes(mark) == 1
    assert f.status("llama-queue")["pools"]["karpenter"] == {"desired": 2, "current": 2, "ready": 2, "managed": True}
    mark = f.kube.mark()
    f.tick(rt)
    f.tick(rt)
    assert f.status_writes(mark) == 0 and f.status("llama-queue")["lastDecision"]["id"] == seen

    # -- load rises past the bounds: ScalingLimited names the stage ----------------------------------
    mark = f.kube.mark()
    up = f.tick(rt, queue=20)
    assert f.status_writes(mark) == 1  # one write per tick per object at most
    limited = f.condition("llama-queue", "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "TooManyReplicas") and limited["message"].startswith("bounds:")
    assert f.status("llama-queue")["desiredReplicas"] == 8 and f.annotations("karpenter")[DECISION_ANNOTATION] == str(up)

    # -- data goes missing: Degraded, and the policy holds (not Active) ------------------------------
    f.tick(rt, missing=True)
    degraded = f.condition("llama-queue", "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] in ("MetricMissing", "HoldOnMissingData")
    assert f.condition("llama-queue", "Active")["status"] == "False"
    assert (f.replicas("onprem"), f.replicas("karpenter")) == (4, 4)  # never released on missing data

    # -- load falls: scale-in, conditions clear ----------------------------------------------------
    f.tick(rt, queue=3)
    assert (f.replicas("onprem"), f.replicas("karpenter")) == (3, 0)
    assert f.node_claims() == []  # Karpenter consolidated the emptied node
    assert {c["type"]: c["status"] for c in f.status("llama-queue")["conditions"]} == {
        "Ready": "True", "Active": "True", "AbleToScale": "True", "ScalingLimited": "False", "Degraded": "False"}
    assert any(m.startswith("SuccessfulRescale: 4 -> 0 on karpenter") for _, _, m in f.events("Deployment", "llama-karpenter"))

    # -- a flapping signal: the same moves again and again, no new Events ----------------------------
    before = len(f.events("Deployment", "llama-karpenter"))
    for q in (6, 3, 6, 3, 6, 3):
        f.tick(rt, queue=q)
    flapped = f.events("Deployment", "llama-karpenter")
    assert len(flapped) - before <= 2, flapped[before:]  # one per distinct message, not one per tick
    assert rt.extras["kube_objects"].correlator.dropped["SuccessfulRescale"] >= 8  # 4 repeats x (Deployment + policy)
    assert _metric(rt, 'tidegate_kubernetes_writes_total{kind="event",result="dropped"}') >= 8

    # -- an HPA on one Deployment: the daemon stops acting on it -------------------------------------
    f.add_hpa("karpenter")
    mark = f.kube.mark()
    held = f.replicas("karpenter")
    f.tick(rt, queue=8)
    listed = [r for r in f.kube.requests_since(mark) if r.path.endswith("/horizontalpodautoscalers")]
    assert len(listed) == 1  # checked once in the tick, whatever the number of pools and calls
    able = f.condition("llama-queue", "AbleToScale")
    assert (able["status"], able["reason"]) == ("False", "HorizontalPodAutoscalerActive")
    assert f"HorizontalPodAutoscaler {f.ns}/llama-karpenter-hpa" in able["message"]
    assert f.scale_writes(mark, "karpenter") == 0 and f.replicas("karpenter") == held
    assert f.status("llama-queue")["pools"]["karpenter"]["managed"] is False
    assert any(t == "Warning" and r == "HorizontalPodAutoscalerActive" for t, r, _ in f.events("Deployment", "llama-karpenter"))
    assert _metric(rt, 'tidegate_pool_refused{model="llama",pool="karpenter",reason="HorizontalPodAutoscalerActive"}') == 1
    pools = rt.daemon.status()["models"]["llama"]["pools"]
    assert pools["karpenter"]["available"] is False and "HorizontalPodAutoscaler" in pools["karpenter"]["unavailable_reason"]
    assert f.replicas("onprem") == 4  # the other pool is still scaled (to what it can hold)

    # -- a bad update is refused with its field; the old version keeps deciding ----------------------
    old_version = f.status("llama-queue")["policyVersion"]
    f.patch_spec("llama-queue", {"rules": [{"kind": "queue-depth", "params": {"target_per_replica": -1}}]})
    mark = f.kube.mark()
    f.tick(rt, queue=2)
    assert f.status_writes(mark) == 1  # the refusal and the decision in one write
    ready = f.condition("llama-queue", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.rules[0].params.target_per_replica" in ready["message"] and old_version in ready["message"]
    assert rt.daemon.policy_store.policies()["llama"].version == old_version
    assert f.status("llama-queue")["observedGeneration"] == 2
    assert f.replicas("onprem") == 2  # queue 2 at one per replica: the old rule decided
    assert any(t == "Warning" and r == "InvalidPolicy" and "target_per_replica" in m
               for t, r, m in f.events("ScalingPolicy", "llama-queue"))
    # the Karpenter pool was its Deployment alone: the daemon never wrote to Karpenter's objects
    assert not [r for r in f.kube.requests_since(start) if not r.by_test and r.is_write and "karpenter.sh" in r.path]


def test_a_scaled_object_is_left_alone_until_the_policy_adopts_it(fleet: Fleet) -> None:
    f = fleet
    f.add_scaled_object("onprem")
    f.apply(policy_object("llama-queue", f.ns))
    rt = f.runtime()
    f.catch_up()
    mark = f.kube.mark()
    f.tick(rt, queue=6)
    able = f.condition("llama-queue", "AbleToScale")
    assert (able["status"], able["reason"]) == ("False", "ScaledObjectActive")
    assert "remove it and set spec.adopt: true" in able["message"]
    assert f.scale_writes(mark, "onprem") == 0 and f.replicas("onprem") == 1
    assert f.replicas("karpenter") == 4  # the rest of the fleet takes the load it can
    assert CLAIM_ANNOTATION not in f.annotations("onprem")

    f.patch_spec("llama-queue", {"adopt": True})
    f.tick(rt)
    assert f.condition("llama-queue", "AbleToScale")["status"] == "True"
    assert f.replicas("onprem") >= 1 and f.annotations("onprem")[CLAIM_ANNOTATION] == "tidegate/llama"


def test_an_object_that_was_never_valid_says_why_and_nothing_is_scaled(fleet: Fleet) -> None:
    f = fleet
    f.apply(policy_object("llama-queue", f.ns, bounds={"min_replicas": 5, "max_replicas": 2}))
    rt = f.runtime()
    f.catch_up()
    mark = f.kube.mark()
    rt.daemon.reload_policies()
    f.clock.advance(TICK_S)
    report = rt.daemon.tick()
    assert report.errors == {"llama": "no valid policy for this model"}
    ready = f.condition("llama-queue", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"] == ("spec.bounds: min_replicas (5) is greater than max_replicas (2); "
                                "no version of this model is in force")
    assert f.status_writes(mark) == 1 and f.scale_writes(mark, "onprem") == f.scale_writes(mark, "karpenter") == 0
    assert [(t, r) for t, r, _ in f.events("ScalingPolicy", "llama-queue")] == [("Warning", "InvalidPolicy")]


def test_a_deployment_another_tidegate_claims_is_left_alone(fleet: Fleet) -> None:
    f = fleet
    f.apps.patch_namespaced_deployment("llama-karpenter", f.ns, {"metadata": {"annotations": {
        CLAIM_ANNOTATION: "tidegate-eu/llama"}}})
    f.apply(policy_object("llama-queue", f.ns))
    rt = f.runtime()
    f.catch_up()
    mark = f.kube.mark()
    f.tick(rt, queue=6)
    able = f.condition("llama-queue", "AbleToScale")
    assert (able["status"], able["reason"]) == ("False", "ClaimedByAnotherPolicy") and "tidegate-eu/llama" in able["message"]
    assert f.scale_writes(mark, "karpenter") == 0 and f.annotations("karpenter")[CLAIM_ANNOTATION] == "tidegate-eu/llama"
    assert f.replicas("onprem") == 4 and f.annotations("onprem")[CLAIM_ANNOTATION] == "tidegate/llama"


def test_an_object_that_clashes_with_a_file_is_not_ready(fleet: Fleet) -> None:
    f = fleet
    Path(f.raw["policies_dir"], "llama.yaml").write_text(
        "apiVersion: tidegate/v1\nkind: ScalingPolicy\nmetadata: {name: llama-file}\n"
        "spec:\n  model: llama\n  behavior: {tolerance: 0.2}\n")
    f.apply(policy_object("llama-queue", f.ns))  # sets behavior too, at the same priority 0
    rt = f.runtime()
    rt.daemon.reload_policies()
    f.clock.advance(TICK_S)
    rt.daemon.tick()
    ready = f.condition("llama-queue", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.behavior" in ready["message"] and "priority 0" in ready["message"]
