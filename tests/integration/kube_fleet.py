"""A fleet of many models on the Kubernetes pools alone, run by the daemon as ``tidegate run`` builds
it, over kmock: what ``tests/integration/test_kube_reads.py`` and ``bench/kube_calls.py`` count the
daemon's API requests on.

``KubeFleet``: ``models`` models (TP 2, ``queue-depth`` at one waiting request per replica, no
stabilization) spread round-robin over ``namespaces`` namespaces, each with a Deployment in every
pool: ``onprem`` (provider ``onprem``, 8-GPU nodes, one replica each to start), ``ca-spot`` and
``ca-od`` (provider ``cluster-autoscaler``, spot and on-demand, no replica to start). The load
(``ScriptedLoad``) is the same for every model; one waiting request holds each model at its one
on-prem replica, so a steady tick decides nothing new and the daemon's requests are its reads.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from controller.config import DaemonConfig
from controller.core.model import ModelSignals, ModelSpec, Sample
from controller.daemon import TickReport
from controller.runtime import Runtime, build_runtime
from providers.clock import ManualClock
from tests.integration.peers import KubeControllers, KubePeer, KubeRequest

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
TICK_S = 30.0
POOLS = ("onprem", "ca-spot", "ca-od")
FAST_RETRY: dict[str, float] = {"budget_s": 2.0, "base_delay_s": 0.005, "max_delay_s": 0.02, "max_attempts": 4}


class ScriptedLoad:
    """A ``MetricsSource`` reporting the queue depth the test sets (``None``: missing), fresh at
    every observation, for every model."""

    def __init__(self) -> None:
        self.queue: float | None = None

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        q = Sample(self.queue, now) if self.queue is not None else Sample.missing("NoData: script has no load yet")
        return {m.name: ModelSignals(model=m.name, at=now, queue_depth=q) for m in models}


def policy_yaml(model: str) -> str:
    """A queue-depth policy holding `model` at one replica per waiting request, without delays."""
    return textwrap.dedent(f"""\
        apiVersion: tidegate/v1
        kind: ScalingPolicy
        metadata: {{name: {model}-queue}}
        spec:
          model: {model}
          bounds: {{min_replicas: 1, max_replicas: 8}}
          rules:
            - kind: queue-depth
              params: {{target_per_replica: 1}}
          behavior:
            tolerance: 0
            scale_up: {{stabilization_s: 0, policies: []}}
            scale_down: {{stabilization_s: 0, policies: []}}
          lead_time: {{enabled: false}}
        """)


def write_policies(tmp: Path, tag: str, models: Sequence[str]) -> Path:
    """A policies directory holding each model's ScalingPolicy file."""
    policies = tmp / f"policies-{tag}"
    policies.mkdir()
    for m in models:
        (policies / f"{m}.yaml").write_text(policy_yaml(m))
    return policies


def model_entry(name: str, deployments: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """One model of the fleets' config: a 70B-class model on A100s, its Deployment per pool."""
    return {"name": name, "tp_degree": 2, "quantization": "fp8", "gpu_types": ["A100-80GB"], "cold_start_s": 90,
            "capacity": {"A100-80GB": {"output_tokens_per_s": 1500, "requests_per_s": 3}},
            "deployments": {p: dict(ref) for p, ref in deployments.items()}}


def build_daemon(raw: Mapping[str, Any], clock: ManualClock, load: ScriptedLoad) -> Runtime:
    """The daemon as ``tidegate run`` builds it from ``raw``, with the scripted load as its metrics source."""
    rt = build_runtime(DaemonConfig.model_validate(json.loads(json.dumps(raw))), clock=clock, environ={})
    rt.daemon.metrics_source = load
    rt.daemon.reload_policies()
    return rt


class KubeFleet:
    """``models`` x 3 pools over ``namespaces`` namespaces on ``kube``, and the daemon that runs it."""

    def __init__(self, kube: KubePeer, tmp: Path, *, models: int, namespaces: int = 1) -> None:
        self.kube = kube
        tag = uuid.uuid4().hex[:6]
        self.namespaces = [f"fleet-{tag}-{i}" for i in range(namespaces)]
        self.home_ns = f"tidegate-{tag}"
        self.api = kube.api_client()
        self.ctl = KubeControllers(self.api)
        self.clock = ManualClock(T0)
        self.load = ScriptedLoad()
        self.labels = {p: {"tidegate.io/pool": f"{p}-{tag}"} for p in POOLS}
        self.models = [f"m{i:04d}" for i in range(models)]
        self.namespace_of = {m: self.namespaces[i % namespaces] for i, m in enumerate(self.models)}
        for m in self.models:
            for p in POOLS:
                self.ctl.add_deployment(self.namespace_of[m], f"{m}-{p}", {"app": m, "pool": p},
                                        1 if p == "onprem" else 0, gpus=2, node_selector=self.labels[p])
        for i in range(-(-models // 4)):  # four replicas of TP 2 to an 8-GPU node
            self.ctl.add_node(f"{tag}-onprem-{i}", self.labels["onprem"], 8)
        self.ctl.reconcile(self.clock.now())
        policies = write_policies(tmp, tag, self.models)
        ca = {"provider": "cluster-autoscaler", "gpu_type": "A100-80GB", "gpus_per_node": 4, "max_nodes": 2,
              "provisioning_delay_s": 120}
        self.raw: dict[str, Any] = {
            "policies_dir": str(policies),
            "database": {"url": f"sqlite:///{tmp / f'tidegate-{tag}.db'}"},
            "api": {"enabled": False},
            "providers": {"type": "real", "settings": {
                "prometheus": {"url": "http://127.0.0.1:9"},  # never queried: the load is scripted
                "kubernetes": {"host": kube.url, "retry": FAST_RETRY},
            }},
            "pools": [
                {"name": "onprem", "tier": "onprem", "provider": "onprem", "gpu_type": "A100-80GB", "gpus_per_node": 8,
                 "max_nodes": models, "price_per_node_hour_usd": 9.0,
                 "kubernetes": {"node_selector": self.labels["onprem"]}},
                {"name": "ca-spot", "tier": "spot", **ca, "price_per_node_hour_usd": 4.0,
                 "kubernetes": {"node_selector": self.labels["ca-spot"]}},
                {"name": "ca-od", "tier": "ondemand", **ca, "price_per_node_hour_usd": 12.0,
                 "kubernetes": {"node_selector": self.labels["ca-od"]}},
            ],
            "models": [model_entry(m, {p: {"namespace": self.namespace_of[m], "name": f"{m}-{p}"} for p in POOLS})
                       for m in self.models],
        }
        self.runtime = build_daemon(self.raw, self.clock, self.load)

    def close(self) -> None:
        self.runtime.stop()

    def tick(self, queue: float | None = None) -> tuple[TickReport, list[KubeRequest]]:
        """Advance the clock, tick once; the report and the daemon's own requests in the tick."""
        if queue is not None:
            self.load.queue = queue
        self.clock.advance(TICK_S)
        mark = self.kube.mark()
        report = self.runtime.daemon.tick()
        return report, [r for r in self.kube.requests_since(mark) if not r.by_test]
