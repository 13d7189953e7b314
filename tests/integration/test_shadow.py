"""Shadow mode beside an autoscaler that is not tidegate: a real daemon (manual clock, SQLite) reads
an on-prem pool's Deployment from kmock through the real Kubernetes adapter while the test plays
an HPA that changes the Deployment's replicas a phase late; signals are simulated (scripted load).
The daemon decides as if in charge, never writes to the cluster, and ``GET /v1/shadow`` and
``tidegate report --shadow`` give the figures computed here by hand.

The fleet: one pool of 4 nodes x 8 GPUs at $16/node-hour, a TP-2 model (4 replicas per node) whose
replica serves 500 output tokens/s; tidegate's policy follows the queue (one waiting request per
replica, no stabilization or rate limits), p99 SLO 2000 ms. Ticks every 30 s, three phases of ten:

| phase | queue | tokens/s | p99 ms | tidegate (nodes, $/h) | the HPA (nodes, $/h) |
| ----- | ----- | -------- | ------ | --------------------- | -------------------- |
| A     | 3     | 1000     | 1000   | 3 (1, $16)            | 8 (2, $32)           |
| B     | 12    | 5000     | 5000   | 12 (3, $48)           | 8 (2, $32): a miss   |
| C     | 2     | 2000     | 500    | 2 (1, $16): short     | 12 (3, $48)          |

Each phase is 300 s: actual $32+$32+$48 for 300 s each = $9.3333, shadow $16+$48+$16 = $6.6667,
saving $2.6667 (28.57 %); tidegate short in C (2 x 500 < 2000 tok/s): 300 s; the HPA's misses in
B, where tidegate's 12 replicas (6000 tok/s) would have served 5000 tok/s: 300 s covered.
"""

from __future__ import annotations

import json
import textwrap
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Sequence

import pytest
from kubernetes import client as k8s

from controller.cli import main
from controller.config import DaemonConfig
from controller.controller import SHADOW_DETAIL
from controller.core.model import ModelSignals, ModelSpec, Sample
from controller.daemon import Daemon
from controller.db.migrate import upgrade
from controller.db.repo import Repository
from policies.base import Registry
from providers.clock import ManualClock
from providers.kubernetes import Deployment, KubernetesCluster, KubernetesPoolProvider, KubernetesSettings
from tests.integration.daemon_harness import Harness, serving
from tests.integration.peers import KubeControllers, KubePeer

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc)
TICK_S = 30.0
PHASES = [  # (queue, output tokens/s, p99 ms, the HPA's replicas)
    (3.0, 1000.0, 1000.0, 8),
    (12.0, 5000.0, 5000.0, 8),
    (2.0, 2000.0, 500.0, 12),
]
POLICY = textwrap.dedent("""\
    apiVersion: tidegate/v1
    kind: ScalingPolicy
    metadata: {name: llama-shadow}
    spec:
      model: llama
      mode: shadow
      bounds: {min_replicas: 1, max_replicas: 16}
      slo: {p99_latency_ms: 2000}
      rules:
        - kind: queue-depth
          params: {target_per_replica: 1}
      behavior:
        tolerance: 0
        scale_up: {stabilization_s: 0, policies: []}
        scale_down: {stabilization_s: 0, policies: []}
      # the shadow follows the burst to cloud at once (lead-time economics has tests of its own)
      lead_time: {enabled: false}
    """)


class Script:
    """Simulated signals: the phase's queue, token and request rates and p99, fresh every tick."""

    def __init__(self) -> None:
        self.phase = PHASES[0]

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        queue, tokens, p99, _ = self.phase
        return {m.name: ModelSignals(m.name, now, queue_depth=Sample(queue, now), output_tokens_per_s=Sample(tokens, now),
                                     request_rate_per_s=Sample(tokens / 1000, now), p99_latency_ms=Sample(p99, now))
                for m in models}


def _config(tmp_path: Path, ns: str, selector: dict[str, str]) -> DaemonConfig:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "llama.yaml").write_text(POLICY)
    return DaemonConfig.model_validate({
        "policies_dir": str(tmp_path / "policies"),
        "database": {"url": f"sqlite:///{tmp_path / 'shadow.db'}"},
        "loop": {"interval_s": TICK_S},
        "pools": [{"name": "onprem", "tier": "onprem", "gpu_type": "H100", "gpus_per_node": 8, "max_nodes": 4,
                   "price_per_node_hour_usd": 16.0, "kubernetes": {"node_selector": selector}}],
        "models": [{"name": "llama", "tp_degree": 2, "quantization": "fp8", "gpu_types": ["H100"], "cold_start_s": 0,
                    "capacity": {"H100": {"output_tokens_per_s": 500, "requests_per_s": 2}},
                    "deployments": {"onprem": {"namespace": ns, "name": "llama-onprem"}}}],
    })


def test_shadow_mode_beside_an_hpa_reports_hand_computed_figures(kube: KubePeer, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    ns, tag = f"s-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:6]
    selector = {"tidegate.io/pool": f"onprem-{tag}"}
    api = kube.api_client()
    ctl = KubeControllers(api)
    ctl.add_deployment(ns, "llama-onprem", {"app": "llama"}, PHASES[0][3], gpus=2, node_selector=selector)
    for i in range(4):
        ctl.add_node(f"{ns}-n{i}", selector, 8)
    cfg = _config(tmp_path, ns, selector)
    upgrade(cfg.database.url)
    repo = Repository(cfg.database.url)
    clock = ManualClock(T0)
    settings = KubernetesSettings()
    daemon_api = k8s.ApiClient(k8s.Configuration(host=kube.url))  # the daemon's own client, no test token
    pool = KubernetesPoolProvider(cfg.pool_specs()["onprem"], {"llama": Deployment(ns, "llama-onprem")},
                                  KubernetesCluster(daemon_api, settings), node_selector=selector, settings=settings)
    script = Script()
    daemon = Daemon(cfg, clock=clock, metrics_source=script, pool_providers={"onprem": pool}, repo=repo,
                    registry=Registry.from_entry_points())
    daemon.reload_policies()
    mark = kube.mark()
    try:
        for phase in PHASES:
            script.phase = phase
            # the HPA acts at the phase's start, on the load it saw before: a phase late
            ctl.apps.patch_namespaced_deployment_scale("llama-onprem", ns, {"spec": {"replicas": phase[3]}})
            for _ in range(10):
                clock.advance(TICK_S)
                ctl.reconcile(clock.now())
                report = daemon.tick()
                assert not report.errors, report.errors
        mine = [r for r in kube.requests_since(mark) if not r.by_test]
        assert mine and not [r for r in mine if r.is_write], "a shadow never writes to the cluster"
        rows = list(repo.all_decisions(model="llama"))
        assert len(rows) == 30 and {(r["outcome"], r["outcome_detail"]) for r in rows} == {("skipped", SHADOW_DETAIL)}
        assert [r["replicas"] for r in rows] == [3] * 10 + [12] * 10 + [2] * 10
        assert [r["signals"]["pools"]["onprem"]["replicas"] for r in rows] == [8] * 10 + [8] * 10 + [12] * 10

        h = Harness(daemon=daemon, clock=clock, repo=repo, sim=None, config=cfg, policies_dir=tmp_path / "policies")
        with serving(h, {"TIDEGATE_VIEWER_TOKENS": "v:viewer"}) as url:
            code = main(["report", "--shadow", "--since", "1h", "--server", url, "--token", "viewer", "--json"])
            figures = json.loads(capsys.readouterr().out)
            assert code == 1  # tidegate would have had less capacity than the load used in phase C
            assert figures == {"llama": {
                "window_s": 900.0, "actual_cost": pytest.approx(9.3333, abs=1e-4),
                "shadow_cost": pytest.approx(6.6667, abs=1e-4), "saving": pytest.approx(2.6667, abs=1e-4),
                "saving_pct": pytest.approx(28.57, abs=0.01), "under_capacity_s": 300.0, "misses_covered_s": 300.0}}
            assert main(["status", "--server", url, "--token", "viewer", "--json"]) == 0
            view = json.loads(capsys.readouterr().out)["models"]["llama"]
            assert {c["type"]: c["status"] for c in view["conditions"]}["Shadow"] == "True"
            # what ran beside what tidegate would run
            assert view["pools"]["onprem"]["current_replicas"] == 12 and view["pools"]["onprem"]["desired_replicas"] == 2
            assert main(["report", "--shadow", "--since", "1h", "--server", url, "--token", "viewer"]) == 1
            text = capsys.readouterr().out
            assert ("llama: over 15 minutes tidegate would have cost $2.67 less (-28.6 %), with 5.0 minutes of lower "
                    "capacity than needed; it would have covered 5.0 minutes of the current autoscaler's p99 SLO misses"
                    ) in text
    finally:
        repo.close()



def test_the_whole_daemon_in_shadow_mode_never_acts(tmp_path: Path) -> None:
    """``mode: shadow`` in the daemon config shadows every model whatever its policy says: the
    simulated fleet keeps what it had while tidegate's own placement grows with the load."""
    from tests.integration.daemon_harness import build_harness

    h = build_harness(tmp_path, config_updates={"mode": "shadow"})
    try:
        model = h.config.model_specs()["llama3-70b-fp8"]
        before = {p: h.sim.pools[p].state(model, h.clock.now()).replicas for p in model.pools}
        h.run(1800)
        rows = list(h.repo.all_decisions())
        assert rows and {(r["outcome"], r["outcome_detail"]) for r in rows} == {("skipped", SHADOW_DETAIL)}
        assert all(r["actions"] == [] for r in rows)
        after = {p: h.sim.pools[p].state(model, h.clock.now()).replicas for p in model.pools}
        assert after == before
        assert max(r["replicas"] for r in rows) > sum(before.values())  # it would have scaled up
    finally:
        h.close()


def test_a_shadow_placement_is_no_node_in_another_replicas_sums(tmp_path: Path) -> None:
    """Sharded replicas add the acted-on placements of the models others own to their pools' node
    sums (``Repository.acted_placements``). A shadow decision's placement never ran: it reads as
    empty there, as the deciding replica's own node sums leave it out."""
    from tests.integration.daemon_harness import build_harness

    h = build_harness(tmp_path, config_updates={"mode": "shadow"})
    try:
        h.run(300)
        rows = list(h.repo.all_decisions())
        assert rows and all(sum(r["placement"].values()) > 0 for r in rows)  # it decided placements
        assert h.repo.acted_placements() and all(p == {} for _, _, p in h.repo.acted_placements())
        assert all(p == {} for _, _, p in h.repo.acted_placements(after_id=0))
    finally:
        h.close()


def test_a_shadow_beside_a_real_hpa_object_is_not_refused_and_writes_no_scale(kube: KubePeer, tmp_path: Path,
                                                                               request: pytest.FixtureRequest) -> None:
    """With ScalingPolicy objects on, an HPA on a pool makes an acting policy leave the pool alone;
    a shadow policy sees the pool as the HPA runs it (its decisions place replicas there) and makes
    no scale call anywhere."""
    from tests.integration.test_scaling_policy_objects import Fleet, policy_object

    f = Fleet(kube, tmp_path)
    try:
        f.add_hpa("onprem")
        f.apply(policy_object("llama-shadow", f.ns, mode="shadow"))
        rt = f.runtime()
        f.catch_up()
        mark = f.kube.mark()
        decision_id = f.tick(rt, queue=6)
        f.tick(rt)
        row = rt.daemon.repo.get_decision(decision_id)
        assert row is not None and (row["outcome"], row["outcome_detail"]) == ("skipped", SHADOW_DETAIL)
        assert row["placement"] == {"onprem": 4, "karpenter": 2}  # the cheaper pool first, HPA or not
        assert f.scale_writes(mark, "onprem") == 0 and f.scale_writes(mark, "karpenter") == 0
        assert (f.replicas("onprem"), f.replicas("karpenter")) == (1, 0)
    finally:
        for rt in f.runtimes:
            rt.stop()
