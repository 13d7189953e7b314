"""Pool providers come from a registry (entry points), so a new one needs no change to the core."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from controller.config import DaemonConfig
from controller.core.model import Tier
from controller.demo import demo_config_path
from providers.aws import AwsProvider
from providers.gcp import GcpProvider
from providers.karpenter import KarpenterProvider
from providers.kubernetes import ClusterAutoscalerProvider, OnPremProvider
from providers.registry import PoolProviderKind, ProviderRegistry, UnknownProvider, installed, split_legacy_kind


class SpotBroker(PoolProviderKind):
    """A provider from another package, with no settings sections: its pools are their
    Kubernetes side only."""

    name = "spot-broker"
    tiers = frozenset({Tier.SPOT, Tier.ONDEMAND})


def test_the_built_ins_are_found_through_their_entry_points() -> None:
    reg = installed()
    assert reg.names() == ["aws", "cluster-autoscaler", "gcp", "karpenter", "onprem"]
    cloud = {Tier.SPOT, Tier.ONDEMAND}
    assert {n: reg.get(n).tiers for n in reg.names()} == {
        "onprem": {Tier.ONPREM}, "aws": cloud, "gcp": cloud, "karpenter": cloud, "cluster-autoscaler": cloud}
    assert [type(reg.get(n)) for n in reg.names()] == [
        AwsProvider, ClusterAutoscalerProvider, GcpProvider, KarpenterProvider, OnPremProvider]


def test_unknown_and_doubly_registered_providers_are_refused() -> None:
    reg = ProviderRegistry([OnPremProvider])
    with pytest.raises(UnknownProvider, match=r"unknown pool provider 'azure' \(installed: onprem\)"):
        reg.get("azure")

    class OtherOnPrem(OnPremProvider):
        pass

    with pytest.raises(ValueError, match="registered twice"):
        reg.register(OtherOnPrem)
    assert "no pool provider is installed" in (ProviderRegistry().problem("p", "aws", Tier.SPOT) or "")


@pytest.mark.parametrize("kind, expected", [
    ("onprem", (Tier.ONPREM, "onprem")), ("aws-spot", (Tier.SPOT, "aws")), ("gcp-ondemand", (Tier.ONDEMAND, "gcp")),
    ("azure-spot", (Tier.SPOT, "azure")), ("my-cloud-ondemand", (Tier.ONDEMAND, "my-cloud")),
])
def test_the_older_kind_splits_into_tier_and_provider(kind: str, expected: tuple[Tier, str]) -> None:
    assert split_legacy_kind(kind) == expected


@pytest.mark.parametrize("kind", ["spot", "aws", "aws-onprem", "-spot", "aws-preemptible"])
def test_a_kind_that_is_no_tier_is_refused(kind: str) -> None:
    with pytest.raises(ValueError, match="set tier"):
        split_legacy_kind(kind)


def test_a_provider_from_another_package_is_usable_in_a_config() -> None:
    # A registry holding a provider this repository does not ship: the config takes pools of it
    # (legacy spelling too), by tier, with no change to the core or the schema.
    raw = yaml.safe_load(demo_config_path().read_text())
    raw["pools"][1].update(provider="spot-broker")
    raw["pools"][2].pop("tier"), raw["pools"][2].pop("provider")
    raw["pools"][2]["kind"] = "spot-broker-spot"
    with pytest.raises(ValidationError, match="'spot-broker', which is not installed"):
        DaemonConfig.model_validate(raw)
    reg = ProviderRegistry([OnPremProvider, AwsProvider, SpotBroker])
    specs = DaemonConfig.model_validate(raw, context={"providers": reg}).pool_specs()
    assert [(s.tier, s.provider) for s in specs.values()] == [
        (Tier.ONPREM, "onprem"), (Tier.SPOT, "spot-broker"), (Tier.SPOT, "spot-broker"), (Tier.ONDEMAND, "aws")]
