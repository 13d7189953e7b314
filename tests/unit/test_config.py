"""The daemon config schema: the demo's config is valid, and every cross-field error quotes both values."""

from __future__ import annotations

import copy

import pytest
import yaml
from pydantic import ValidationError

from controller.config import DaemonConfig
from controller.core.model import Tier
from controller.demo import demo_config_path


def _demo() -> dict:
    return yaml.safe_load(demo_config_path().read_text())


def test_demo_config_is_valid_and_converts_to_core_values() -> None:
    cfg = DaemonConfig.model_validate(_demo())
    pools = cfg.pool_specs()
    models = cfg.model_specs()
    assert {(p.tier, p.provider) for p in pools.values()} == {
        (Tier.ONPREM, "onprem"), (Tier.SPOT, "aws"), (Tier.SPOT, "gcp"), (Tier.ONDEMAND, "aws")}
    m = models["llama3-70b-fp8"]
    assert m.tp_degree == 2 and set(m.pools) == set(pools)
    assert pools["onprem-h100"].max_replicas(m) == 8
    assert pools["gcp-spot-a3"].nodes_for(m, 3) == 3
    assert pools["aws-spot-p5"].nodes_for(m, 5) == 2


@pytest.mark.parametrize("kind, tier, provider", [
    ("onprem", Tier.ONPREM, "onprem"), ("aws-spot", Tier.SPOT, "aws"), ("aws-ondemand", Tier.ONDEMAND, "aws"),
    ("gcp-spot", Tier.SPOT, "gcp"), ("gcp-ondemand", Tier.ONDEMAND, "gcp"),
])
def test_the_older_kind_still_loads_as_tier_plus_provider(kind: str, tier: Tier, provider: str) -> None:
    # Config files written before tier/provider (kind: aws-spot...) keep working, unchanged.
    raw = _demo()
    old = raw["pools"][1]
    old.pop("tier"), old.pop("provider")
    old["kind"] = kind
    spec = DaemonConfig.model_validate(raw).pool_specs()[old["name"]]
    assert (spec.tier, spec.provider) == (tier, provider)
    new = _demo()
    new["pools"][1].update(tier=tier.value, provider=provider)
    assert DaemonConfig.model_validate(new).pool_specs()[old["name"]] == spec


def test_an_onprem_pool_needs_no_provider() -> None:
    raw = _demo()
    raw["pools"][0].pop("provider")
    assert DaemonConfig.model_validate(raw).pool_specs()["onprem-h100"].provider == "onprem"


def _err(raw: dict) -> str:
    with pytest.raises(ValidationError) as e:
        DaemonConfig.model_validate(raw)
    return str(e.value)


@pytest.mark.parametrize("mutate,needles", [
    (lambda r: r["pools"][0].update(min_nodes=5, max_nodes=2), ["min_nodes (5)", "max_nodes (2)"]),
    (lambda r: r["pools"].append(copy.deepcopy(r["pools"][0])), ["onprem-h100"]),
    (lambda r: r["models"][0]["deployments"].update({"mars": {"name": "x"}}), ["mars"]),
    (lambda r: r["pools"][2].update(gpu_type="L4"), ["L4", "gcp-spot-a3"]),
    (lambda r: r["pools"][2].update(gpus_per_node=1), ["gpus_per_node (1)", "tp_degree (2)"]),
    (lambda r: r["models"][0].update(gpu_types=["H100", "L40S"]), ["L40S"]),
    (lambda r: r["pools"][0].update(colour="blue"), ["colour"]),
    (lambda r: r["pools"][1].update(provider="moon"), ["'moon'", "not installed", "installed: aws, cluster-autoscaler, gcp, karpenter, onprem"]),
    (lambda r: r["pools"][1].pop("provider"), ["tier 'spot' needs a provider"]),
    (lambda r: r["pools"][0].update(tier="spot"), ["tier 'spot'", "provider 'onprem' holds only onprem"]),
    (lambda r: r["pools"][1].update(kind="aws-ondemand"), ["kind ('aws-ondemand')", "tier is 'spot'"]),
    (lambda r: r["pools"][1].update(kind="gcp-spot"), ["kind ('gcp-spot')", "provider is 'aws'"]),
    (lambda r: r["pools"][0].pop("tier"), ["set tier", "or the older kind"]),
    (lambda r: (r["pools"][0].pop("tier"), r["pools"][0].update(kind="aws-sideways")), ["kind 'aws-sideways'", "set tier"]),
    (lambda r: r.update(leader_election={"backend": "database"}), ["leader_election.backend is database", "sqlite:///", "backend lease"]),
    (lambda r: r.update(leader_election={"lease_duration_s": 3, "retry_period_s": 2}), ["retry_period_s (2)", "lease_duration_s (3)"]),
    (lambda r: r.update(leader_election={"backend": "etcd"}), ["leader_election.backend"]),
    (lambda r: r.update(leader_election={"name": "Tidegate_Leader"}), ["leader_election.name"]),
])
def test_cross_field_errors_quote_the_values(mutate, needles) -> None:
    raw = _demo()
    mutate(raw)
    msg = _err(raw)
    for n in needles:
        assert n in msg, msg


def test_real_providers_need_cloud_sections() -> None:
    raw = _demo()
    raw["providers"] = {"type": "real"}
    msg = _err(raw)
    assert "aws-spot-p5" in msg and "aws section" in msg


def test_leader_election_backend_defaults_follow_the_database_and_identity_the_pod() -> None:
    from providers.leader import LeaderElectionSettings, default_identity

    election = DaemonConfig.model_validate(_demo()).leader_election
    assert election.resolved_backend("sqlite:///x.db") == "none"
    assert election.resolved_backend("postgresql+psycopg://u@h/db") == "database"
    assert LeaderElectionSettings(backend="lease").resolved_backend("sqlite:///x.db") == "lease"
    assert default_identity({"POD_NAME": "tidegate-7c9-x2"}) == "tidegate-7c9-x2"
    assert default_identity({}).endswith(f"/{__import__('os').getpid()}")
