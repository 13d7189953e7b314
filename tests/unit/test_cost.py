"""Cost per hour per pool and cost per million output tokens (providers.cost): table-driven cases
and properties. Pure: no sockets, no clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.core.model import ModelSignals, ModelSpec, Tier, PoolSpec, PoolState, ReplicaCapacity, Sample
from providers.cost import (
    OnPremCost,
    cost_per_million_tokens_usd,
    model_cost_per_hour_usd,
    pool_cost_per_hour_usd,
    with_cost,
)

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
ONPREM = PoolSpec("dc", Tier.ONPREM, "onprem", "A100", gpus_per_node=8, max_nodes=4, price_per_node_hour_usd=12.0)
SPOT = PoolSpec("spot", Tier.SPOT, "aws", "A100", gpus_per_node=8, max_nodes=10, price_per_node_hour_usd=30.0)
ONDEMAND = PoolSpec("od", Tier.ONDEMAND, "gcp", "A100", gpus_per_node=8, max_nodes=10, price_per_node_hour_usd=40.0)
SITE = OnPremCost(capital_usd_per_gpu_hour=1.25, energy_usd_per_kwh=0.2, pue=1.5)
MODEL = ModelSpec("llama", 2, "fp8", ("A100",), 60, {"A100": ReplicaCapacity(1000, 2)}, ("dc", "spot", "od"))


def code(s: Sample) -> str | None:
    return None if s.reason is None else s.reason.split(":", 1)[0]


@pytest.mark.parametrize("pool,state,onprem,power,value,reason", [
    # cloud: nodes x live price; spot without a live price says it used the static one
    (SPOT, PoolState("spot", 4, nodes=3, price_per_node_hour_usd=11.5), None, None, 3 * 11.5, None),
    (SPOT, PoolState("spot", 4, nodes=3), None, None, 3 * 30.0, "StaticPrice"),
    (ONDEMAND, PoolState("od", 1, nodes=2), None, None, 80.0, None),
    # on-prem: amortized capital per GPU-hour + energy (kW x PUE x USD/kWh)
    (ONPREM, PoolState("dc", 8, nodes=2), SITE, Sample(4.0, NOW), 2 * 8 * 1.25 + 4.0 * 1.5 * 0.2, None),
    (ONPREM, PoolState("dc", 8, nodes=2), None, None, 2 * 12.0, None),  # no site model: static price
    (ONPREM, PoolState("dc", 0, nodes=0), SITE, None, 0.0, None),
    # missing stays missing
    (ONPREM, PoolState("dc", 8, nodes=2), SITE, None, None, "EnergyMissing"),
    (ONPREM, PoolState("dc", 8, nodes=2), SITE, Sample.missing("NaN: x", NOW), None, "EnergyMissing"),
    (ONPREM, PoolState("dc", 8, nodes=2), SITE, Sample(4.0, NOW - timedelta(minutes=5)), None, "EnergyMissing"),
    (ONPREM, PoolState("dc", 8, nodes=2), OnPremCost(1.25, 0.2, assumed_gpu_power_kw=0.3), None,
     2 * 8 * 1.25 + 2 * 8 * 0.3 * 0.2, "AssumedPower"),
    (SPOT, PoolState("spot", None, nodes=None), None, None, None, "NodesUnknown"),
    (SPOT, None, None, None, None, "NodesUnknown"),
])
def test_pool_cost_per_hour(pool: PoolSpec, state: PoolState | None, onprem: OnPremCost | None,
                            power: Sample | None, value: float | None, reason: str | None) -> None:
    got = pool_cost_per_hour_usd(pool, state, NOW, onprem=onprem, power_kw=power, max_age_s=60)
    assert got.value == (pytest.approx(value) if value is not None else None)
    assert code(got) == reason
    assert got.at == NOW


@pytest.mark.parametrize("cost,tokens,value,reason", [
    (Sample(36.0, NOW), Sample(1000.0, NOW), 36.0 / 3.6e6 * 1e6, None),  # 3.6 M tokens/h at 36 USD/h
    (Sample(36.0, NOW, "StaticPrice: x"), Sample(1000.0, NOW), 10.0, "StaticPrice"),
    (Sample(36.0, NOW), Sample(0.0, NOW), None, "NoTokens"),  # undefined, not infinite
    (Sample(36.0, NOW), Sample.missing("NoData: y", NOW), None, "TokensMissing"),
    (Sample(36.0, NOW), Sample(1000.0, NOW - timedelta(minutes=3)), None, "TokensMissing"),  # stale
    (Sample.missing("EnergyMissing: z", NOW), Sample(1000.0, NOW), None, "CostMissing"),
])
def test_cost_per_million_tokens(cost: Sample, tokens: Sample, value: float | None, reason: str | None) -> None:
    got = cost_per_million_tokens_usd(cost, tokens, NOW, max_age_s=60)
    assert got.value == (pytest.approx(value) if value is not None else None)
    assert code(got) == reason


def test_model_cost_sums_pools_and_fills_the_signal() -> None:
    states = {"dc": PoolState("dc", 8, nodes=2), "spot": PoolState("spot", 4, nodes=1, price_per_node_hour_usd=10.0),
              "od": PoolState("od", 0, nodes=0)}
    power = {"dc": Sample(5.0, NOW)}
    per_hour = model_cost_per_hour_usd(MODEL, {p.name: p for p in (ONPREM, SPOT, ONDEMAND)}, states, NOW,
                                       onprem=SITE, power_kw=power)
    expected = (2 * 8 * 1.25 + 5.0 * 1.5 * 0.2) + 10.0 + 0.0
    assert per_hour.value == pytest.approx(expected)
    signals = ModelSignals("llama", NOW, output_tokens_per_s=Sample(2000.0, NOW), pools=states)
    filled = with_cost(signals, MODEL, {p.name: p for p in (ONPREM, SPOT, ONDEMAND)}, NOW, onprem=SITE, power_kw=power)
    assert filled.cost_per_million_tokens_usd.value == pytest.approx(expected / (2000 * 3600) * 1e6)
    assert filled.output_tokens_per_s == signals.output_tokens_per_s  # nothing else changes


def test_model_cost_missing_when_any_pool_is() -> None:
    states = {"dc": PoolState("dc", 8, nodes=2), "spot": PoolState("spot", 4, nodes=None), "od": PoolState("od", 0, nodes=0)}
    got = model_cost_per_hour_usd(MODEL, {p.name: p for p in (ONPREM, SPOT, ONDEMAND)}, states, NOW)
    assert got.value is None and code(got) == "NodesUnknown"
    unknown_pool = model_cost_per_hour_usd(MODEL, {"dc": ONPREM}, states, NOW)
    assert unknown_pool.value is None and code(unknown_pool) == "CostMissing"


prices = st.floats(min_value=0.01, max_value=500, allow_nan=False)
rates = st.floats(min_value=0.001, max_value=1e6, allow_nan=False)


@given(nodes=st.integers(0, 50), price=prices, k=st.integers(1, 5))
def test_cloud_cost_is_linear_in_nodes(nodes: int, price: float, k: int) -> None:
    one = pool_cost_per_hour_usd(SPOT, PoolState("spot", 0, nodes=nodes, price_per_node_hour_usd=price), NOW)
    many = pool_cost_per_hour_usd(SPOT, PoolState("spot", 0, nodes=nodes * k, price_per_node_hour_usd=price), NOW)
    assert one.value is not None and many.value is not None
    assert many.value == pytest.approx(k * one.value)
    assert one.value >= 0


@given(cost=prices, tps=rates, factor=st.floats(min_value=1.01, max_value=100))
def test_more_tokens_for_the_same_cost_is_cheaper_per_token(cost: float, tps: float, factor: float) -> None:
    base = cost_per_million_tokens_usd(Sample(cost, NOW), Sample(tps, NOW), NOW)
    more = cost_per_million_tokens_usd(Sample(cost, NOW), Sample(tps * factor, NOW), NOW)
    assert base.value is not None and more.value is not None
    assert more.value < base.value
    # and back: cost per token x tokens per hour is the cost per hour
    assert base.value * tps * 3600 / 1e6 == pytest.approx(cost)


@given(kw=st.floats(min_value=0, max_value=100), extra=st.floats(min_value=0.01, max_value=100))
def test_onprem_cost_grows_with_power(kw: float, extra: float) -> None:
    low = pool_cost_per_hour_usd(ONPREM, PoolState("dc", 1, nodes=1), NOW, onprem=SITE, power_kw=Sample(kw, NOW))
    high = pool_cost_per_hour_usd(ONPREM, PoolState("dc", 1, nodes=1), NOW, onprem=SITE, power_kw=Sample(kw + extra, NOW))
    assert low.value is not None and high.value is not None and high.value > low.value
    assert low.value >= ONPREM.gpus_per_node * SITE.capital_usd_per_gpu_hour  # capital is paid regardless
