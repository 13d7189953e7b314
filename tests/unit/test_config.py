"""The daemon config schema: the demo's config is valid, and every cross-field error quotes both values."""

from __future__ import annotations

import copy

import pytest
import yaml
from pydantic import ValidationError

from controller.config import DaemonConfig
from controller.core.model import PoolKind
from controller.demo import demo_config_path


def _demo() -> dict:
    return yaml.safe_load(demo_config_path().read_text())


def test_demo_config_is_valid_and_converts_to_core_values() -> None:
    cfg = DaemonConfig.model_validate(_demo())
    pools = cfg.pool_specs()
    models = cfg.model_specs()
    assert {p.kind for p in pools.values()} == {PoolKind.ONPREM, PoolKind.AWS_SPOT, PoolKind.GCP_SPOT, PoolKind.AWS_ONDEMAND}
    m = models["llama3-70b-fp8"]
    assert m.tp_degree == 2 and set(m.pools) == set(pools)
    assert pools["onprem-h100"].max_replicas(m) == 8
    assert pools["gcp-spot-a3"].nodes_for(m, 3) == 3
    assert pools["aws-spot-p5"].nodes_for(m, 5) == 2


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
    (lambda r: r["pools"][0].update(kind="moon-spot"), ["kind"]),
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
