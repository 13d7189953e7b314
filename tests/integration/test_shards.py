"""Models sharded over daemon replicas by bucket Leases, on the kmock API emulator.

Three daemons, 300 models hashed into 12 buckets, one SQLite decision log, one Lease per bucket
and the members Lease in kmock, every clock (ticks and Leases) one manual clock. Shown:

- every model is acted on by exactly one daemon per tick once the three have balanced (4 buckets
  each), and a daemon that joins later takes its share: the first daemon acts on all 300 at first,
  then hands buckets over;
- kill one (it stops ticking and never releases): its models go unacted for at most the lease
  time, then the two others take its buckets over; nothing is lost for good;
- across the whole run, no model is ever acted on by two daemons in one tick.

"Acted on" is what the tick reports: the models whose decision went through the act step and the
decision log (``TickReport.decisions``).
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from controller.config import DaemonConfig
from controller.daemon import Daemon
from controller.db.migrate import upgrade
from controller.db.repo import Repository
from controller.shards import bucket_lease_name, bucket_of, members_lease_name
from policies.base import Registry
from providers.clock import ManualClock
from providers.leader import KubernetesBucketElector
from providers.sim import build_simulated_providers
from tests.integration.peers import KubePeer

T0 = datetime(2026, 11, 2, tzinfo=timezone.utc)
MODELS = 300
BUCKETS = 12
LEASE_S = 15
RETRY_S = 2.0
INTERVAL_S = 5.0

POLICY = """apiVersion: tidegate/v1
kind: ScalingPolicy
metadata: {{name: {name}}}
spec:
  model: {name}
  bounds: {{min_replicas: 1, max_replicas: 4}}
  slo: {{p99_latency_ms: 6000, queue_depth_per_replica: 4}}
  rules: [{{kind: slo-guard}}]
"""


def fleet(tmp_path: Path, count: int = MODELS) -> DaemonConfig:
    policies = tmp_path / "policies"
    policies.mkdir()
    models = []
    for i in range(count):
        name = f"m{i:03d}"
        models.append({"name": name, "tp_degree": 1, "quantization": "fp8", "gpu_types": ["L4"], "cold_start_s": 30,
                       "capacity": {"L4": {"output_tokens_per_s": 500, "requests_per_s": 2.0}},
                       "deployments": {"onprem": {"namespace": "llm", "name": f"{name}-onprem"}}})
        (policies / f"{name}.yaml").write_text(POLICY.format(name=name))
    return DaemonConfig.model_validate({
        "policies_dir": str(policies), "database": {"url": f"sqlite:///{tmp_path / 'tidegate.db'}"},
        "loop": {"interval_s": INTERVAL_S},
        "providers": {"type": "simulated", "initial_onprem_replicas": 1, "base_requests_per_s": 1,
                      "peak_requests_per_s": 2},
        "pools": [{"name": "onprem", "tier": "onprem", "gpu_type": "L4", "gpus_per_node": 8, "max_nodes": 100,
                   "price_per_node_hour_usd": 4.0}],
        "models": models,
        "leader_election": {"backend": "lease", "buckets": BUCKETS, "lease_duration_s": LEASE_S,
                            "retry_period_s": RETRY_S},
    })


class Replica:
    def __init__(self, who: str, cfg: DaemonConfig, kube: KubePeer, ns: str, clock: ManualClock,
                 registry: Registry) -> None:
        self.who = who
        sim = build_simulated_providers(cfg, clock)
        self.elector = KubernetesBucketElector(kube.api_client(), namespace=ns, name="tg", buckets=BUCKETS,
                                               identity=who, lease_duration_s=LEASE_S, retry_period_s=RETRY_S,
                                               clock=clock)
        self.repo = Repository(cfg.database.url)
        self.daemon = Daemon(cfg, clock=clock, metrics_source=sim.metrics, pool_providers=sim.pools,
                             price_source=sim.prices, repo=self.repo, registry=registry, elector=self.elector)
        self.daemon.reload_policies()

    def tick(self) -> set[str]:
        return set(self.daemon.tick().decisions)


def test_three_daemons_share_300_models_and_take_over_a_killed_ones(kube: KubePeer, tmp_path: Path) -> None:
    cfg = fleet(tmp_path)
    upgrade(cfg.database.url)
    clock = ManualClock(T0)
    ns = f"s-{uuid.uuid4().hex[:6]}"
    registry = Registry.from_entry_points()
    models = {m.name for m in cfg.models}
    by_bucket = Counter(bucket_of(m, BUCKETS) for m in models)
    assert len(by_bucket) == BUCKETS  # every bucket holds some of the 300
    replicas: dict[str, Replica] = {"a": Replica("a", cfg, kube, ns, clock, registry)}
    history: list[dict[str, set[str]]] = []

    def round_() -> dict[str, set[str]]:
        clock.advance(INTERVAL_S)
        acted = {who: r.tick() for who, r in replicas.items()}
        counts = Counter(m for ms in acted.values() for m in ms)
        twice = sorted(m for m, n in counts.items() if n > 1)
        assert not twice, f"acted on by two daemons in one tick: {twice[:5]}"
        history.append(acted)
        return acted

    # one daemon alone holds every bucket and acts on every model
    assert round_()["a"] == models
    # two more join: within a few rounds the buckets are split 4/4/4 and each tick covers all 300
    replicas["b"] = Replica("b", cfg, kube, ns, clock, registry)
    replicas["c"] = Replica("c", cfg, kube, ns, clock, registry)
    for _ in range(4):
        round_()
    acted = round_()
    assert set().union(*acted.values()) == models
    assert {who: len(r.elector.held()) for who, r in replicas.items()} == {"a": 4, "b": 4, "c": 4}
    for who, r in replicas.items():
        assert acted[who] == {m for m in models if bucket_of(m, BUCKETS) in r.elector.held()}
        # its /metrics shows its own models only: a handed-over model's series went with it
        text = r.daemon.metrics.render().decode()
        exported = set(re.findall(r'^tidegate_desired_replicas\{model="([^"]+)"\}', text, re.M))
        assert exported == acted[who]
        assert f"tidegate_buckets_held {float(len(r.elector.held()))}" in text
    leases = k8s.CoordinationV1Api(kube.api_client())
    holders = Counter(leases.read_namespaced_lease(bucket_lease_name("tg", i, BUCKETS), ns).spec.holder_identity
                      for i in range(BUCKETS))
    assert holders == {"a": 4, "b": 4, "c": 4}
    members = leases.read_namespaced_lease(members_lease_name("tg"), ns)
    assert set(members.metadata.annotations["tidegate.io/members"].split('"')[1::4]) == {"a", "b", "c"}

    # kill c: it stops ticking and renewing, and releases nothing
    killed = replicas.pop("c")
    last_renewal = clock.now()  # c renewed in its last tick (the retry period is shorter than a tick)
    orphans = {m for m in models if bucket_of(m, BUCKETS) in killed.elector.held()}
    assert len(orphans) > 50
    while True:
        acted = round_()
        waited_s = (clock.now() - last_renewal).total_seconds()
        if waited_s < LEASE_S:
            # until c's Leases run out, its models wait: no one else may act on them yet
            assert not (set().union(*acted.values()) & orphans), waited_s
        if orphans <= set().union(*acted.values()):
            break
        assert waited_s <= LEASE_S + RETRY_S + INTERVAL_S, "takeover took longer than the lease"
    print(f"c's models were taken over {waited_s:.0f} s after its last renewal (lease {LEASE_S} s)")
    assert sorted(len(r.elector.held()) for r in replicas.values()) == [6, 6]
    for _ in range(2):
        acted = round_()
        assert set().union(*acted.values()) == models
    # the orphans' history was rebuilt from the log: the decisions of the new owner follow c's
    taken = next(m for m in sorted(orphans))
    log = list(replicas["a"].daemon.repo.all_decisions(taken))
    assert len(log) >= 4
    for r in [*replicas.values(), killed]:
        r.repo.close()


def test_every_replica_validates_every_policy_file_and_takes_over_with_the_policies_in_force(
        kube: KubePeer, tmp_path: Path) -> None:
    """A replica parses and validates every policy file, not only its buckets' (README, "Sharding"):
    a broken file of a model another replica acts on is reported the same by both (the admin API
    answers alike whichever pod the Service picks), and a replica that takes a dead one's buckets
    over acts on their models at once, with the versions in force, from the files it had read."""
    cfg = fleet(tmp_path, 24)
    upgrade(cfg.database.url)
    clock = ManualClock(T0)
    ns = f"p-{uuid.uuid4().hex[:6]}"
    registry = Registry.from_entry_points()
    replicas = {who: Replica(who, cfg, kube, ns, clock, registry) for who in ("a", "b")}

    def round_() -> dict[str, dict[str, Any]]:
        clock.advance(INTERVAL_S)
        return {who: r.daemon.tick().decisions for who, r in replicas.items()}

    for _ in range(5):
        acted = round_()
    assert {who: len(r.elector.held()) for who, r in replicas.items()} == {"a": 6, "b": 6}
    x = sorted(acted["a"])[0]  # a model a acts on; b never did
    version = acted["a"][x].policy_version
    assert x not in acted["b"]
    broken = POLICY.format(name=x).replace("max_replicas: 4", "max_replicas: 0")  # below min_replicas
    (Path(cfg.policies_dir) / f"{x}.yaml").write_text(broken)
    for r in replicas.values():
        r.daemon.reload_policies()
    seen = {who: r.daemon.policy_store.status() for who, r in replicas.items()}
    assert seen["a"] == seen["b"], "both replicas report the same policies and errors"
    assert seen["b"]["models"][x]["kept_previous"] and seen["b"]["models"][x]["version"] == version
    assert [e["file"] for e in seen["b"]["models"][x]["errors"]] == [str(Path(cfg.policies_dir) / f"{x}.yaml")]

    killed = replicas.pop("a")
    last_renewal = clock.now()
    while x not in (acted := round_())["b"]:
        assert (clock.now() - last_renewal).total_seconds() <= LEASE_S + RETRY_S + INTERVAL_S
    # no reload since the kill: b acts on x with the version in force (the last good one)
    assert acted["b"][x].policy_version == version
    for r in [*replicas.values(), killed]:
        r.repo.close()


def test_buckets_with_a_single_leader_backend_are_refused_at_load() -> None:
    import pytest
    from pydantic import ValidationError

    raw: dict[str, Any] = {"leader_election": {"backend": "database", "buckets": 4}}
    with pytest.raises(ValidationError, match=r"buckets \(4\) shard models over Leases: set backend lease"):
        DaemonConfig.model_validate(raw)
