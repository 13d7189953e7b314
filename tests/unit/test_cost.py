"""Prices and costs (controller.core.pricing): node-hour prices, cost per hour of a fleet, cost per
million output tokens; table-driven cases and properties, and the property that the budget stage
and the displayed cost price a fleet alike. Pure: no sockets, no clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.model import History, ModelSignals, ModelSpec, PoolSpec, PoolState, ReplicaCapacity, Sample, Tier
from controller.core.pipeline import decide
from controller.core.pricing import (
    OnPremCost,
    cost_per_million_tokens_usd,
    model_cost_per_hour_usd,
    onprem_node_price,
    placement_cost,
    price_pools,
    with_cost,
)
from controller.core.reasons import Reason
from tests.unit.test_pipeline import decide_cases, fixed, policy

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
ONPREM = PoolSpec("dc", Tier.ONPREM, "onprem", "A100", gpus_per_node=8, max_nodes=4, price_per_node_hour_usd=12.0)
SPOT = PoolSpec("spot", Tier.SPOT, "aws", "A100", gpus_per_node=8, max_nodes=10, price_per_node_hour_usd=30.0)
ONDEMAND = PoolSpec("od", Tier.ONDEMAND, "gcp", "A100", gpus_per_node=8, max_nodes=10, price_per_node_hour_usd=40.0)
POOLS = {p.name: p for p in (ONPREM, SPOT, ONDEMAND)}
SITE = OnPremCost(capital_usd_per_gpu_hour=1.25, energy_usd_per_kwh=0.2, pue=1.5)
# TP 2 on 8-GPU nodes: 4 replicas per node
MODEL = ModelSpec("llama", 2, "fp8", ("A100",), 60, {"A100": ReplicaCapacity(1000, 2)}, ("dc", "spot", "od"))


def code(s: Sample | str | None) -> str | None:
    text = s.reason if isinstance(s, Sample) else s
    return None if text is None else text.split(":", 1)[0]


def fleet(dc: int | None = 0, spot: int | None = 0, od: int | None = 0, *, spot_price: float | None = None,
          nodes: int | None = None) -> dict[str, PoolState]:
    return {"dc": PoolState("dc", dc, nodes=nodes), "spot": PoolState("spot", spot, price_per_node_hour_usd=spot_price),
            "od": PoolState("od", od)}


@pytest.mark.parametrize("site,nodes,kw,price,note", [
    # capital per node (8 GPUs x 1.25) + measured kW spread over the nodes held x PUE x USD/kWh
    (SITE, 2, 4.0, 8 * 1.25 + 4.0 / 2 * 1.5 * 0.2, None),
    (SITE, 1, 0.0, 8 * 1.25, None),  # idle GPUs drawing nothing still cost their capital
    # no reading: the assumed power per GPU; none assumed: unknown
    (OnPremCost(1.25, 0.2, assumed_gpu_power_kw=0.3), 2, None, 8 * 1.25 + 8 * 0.3 * 0.2, "AssumedPower"),
    (SITE, 2, None, None, "EnergyMissing"),
    # no node held: nothing measured to spread, so a new node is priced at the assumed power
    (OnPremCost(1.25, 0.2, assumed_gpu_power_kw=0.3), 0, 5.0, 8 * 1.25 + 8 * 0.3 * 0.2, "AssumedPower"),
    (SITE, 0, 5.0, None, "EnergyMissing"),
])
def test_onprem_node_price(site: OnPremCost, nodes: int, kw: float | None, price: float | None, note: str | None) -> None:
    got, why = onprem_node_price(ONPREM, site, nodes, kw)
    assert got == (pytest.approx(price) if price is not None else None)
    assert code(why) == note


@pytest.mark.parametrize("states,site,power,value,reason", [
    # cloud: whole nodes for the replicas x live price; spot without one says it used the static one
    (fleet(spot=5, spot_price=11.5), None, None, 2 * 11.5, None),
    (fleet(spot=5), None, None, 2 * 30.0, "StaticPrice"),
    (fleet(od=1), None, None, 40.0, None),
    (fleet(spot=0), None, None, 0.0, None),  # an empty spot pool's price does not matter
    # on-prem: static amortized price without a site model; capital + energy with one
    (fleet(dc=8), None, None, 2 * 12.0, None),
    (fleet(dc=8), SITE, {"dc": Sample(4.0, NOW)}, 2 * 8 * 1.25 + 4.0 * 1.5 * 0.2, None),
    (fleet(dc=0), SITE, None, 0.0, None),
    # nodes held beyond the replicas (a scale-in under way, other models' nodes) are not this fleet's
    (fleet(dc=4, nodes=3), None, None, 12.0, None),
    # missing stays missing
    (fleet(dc=8), SITE, None, None, "EnergyMissing"),
    (fleet(dc=8), SITE, {"dc": Sample.missing("NaN: x", NOW)}, None, "EnergyMissing"),
    (fleet(dc=8), SITE, {"dc": Sample(4.0, NOW - timedelta(minutes=5))}, None, "EnergyMissing"),
    (fleet(spot=None), None, None, None, "ReplicasUnknown"),
    ({"dc": PoolState("dc", 1), "spot": PoolState("spot", 0)}, None, None, None, "ReplicasUnknown"),
])
def test_model_cost_per_hour(states: dict[str, PoolState], site: OnPremCost | None,
                             power: dict[str, Sample] | None, value: float | None, reason: str | None) -> None:
    priced, notes = price_pools(MODEL, POOLS, states, NOW, onprem=site, power_kw=power, max_age_s=60)
    got = model_cost_per_hour_usd(MODEL, POOLS, priced, NOW, notes)
    assert got.value == (pytest.approx(value) if value is not None else None)
    assert code(got) == reason
    assert got.at == NOW


def test_unconfigured_pool_makes_the_cost_missing() -> None:
    got = model_cost_per_hour_usd(MODEL, {"dc": ONPREM}, fleet(dc=1), NOW)
    assert got.value is None and code(got) == "CostMissing"


def test_energy_missing_keeps_the_static_price_for_placement() -> None:
    priced, notes = price_pools(MODEL, POOLS, fleet(dc=8), NOW, onprem=SITE)
    assert priced["dc"].price_per_node_hour_usd is None  # placement falls back to the static price
    assert code(notes["dc"]) == "EnergyMissing"


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


def test_with_cost_prices_the_pools_and_fills_the_signal() -> None:
    states = fleet(dc=8, spot=3, spot_price=10.0)
    power = {"dc": Sample(5.0, NOW)}
    signals = ModelSignals("llama", NOW, output_tokens_per_s=Sample(2000.0, NOW), pools=states)
    filled = with_cost(signals, MODEL, POOLS, NOW, onprem=SITE, power_kw=power)
    node = 8 * 1.25 + 5.0 / 2 * 1.5 * 0.2
    assert filled.pools["dc"].price_per_node_hour_usd == pytest.approx(node)  # what placement will use
    expected = 2 * node + 10.0
    assert filled.cost_per_million_tokens_usd.value == pytest.approx(expected / (2000 * 3600) * 1e6)
    assert filled.output_tokens_per_s == signals.output_tokens_per_s  # nothing else changes


def test_budget_cost_per_token_cap_prices_onprem_as_displayed() -> None:
    """With ``onprem_cost`` set, the budget's cost-per-token cap used to price on-prem nodes at their
    static $2/h while the display priced them at capital + energy ($14/h): the decision scaled out
    to 8 replicas "within budget" while ``/v1/status`` showed $1.94/M tokens against a $1.20/M cap."""
    dc = PoolSpec("dc", Tier.ONPREM, "onprem", "A100", gpus_per_node=1, max_nodes=10, price_per_node_hour_usd=2.0)
    model = ModelSpec("m", 1, "fp8", ("A100",), 60, {"A100": ReplicaCapacity(1000, 2)}, ("dc",))
    site = OnPremCost(capital_usd_per_gpu_hour=12.0, energy_usd_per_kwh=0.25, pue=1.6)
    pol = policy(fixed(8), budget={"max_cost_per_million_tokens_usd": 1.2})
    # 4 replicas on 4 nodes drawing 20 kW: 12 + 5 x 1.6 x 0.25 = $14 per node-hour, $56/h
    signals = ModelSignals("m", NOW, output_tokens_per_s=Sample(8000.0, NOW),
                           pools={"dc": PoolState("dc", 4, ready_replicas=4)})
    shown = with_cost(signals, model, {"dc": dc}, NOW, onprem=site, power_kw={"dc": Sample(20.0, NOW)})
    assert shown.cost_per_million_tokens_usd.value == pytest.approx(56.0 / (8000 * 3600) * 1e6)  # $1.94/M
    d = decide(model=model, pools={"dc": dc}, signals=shown, policy=pol, history=History(),
               overrides=(), now=NOW)
    # $1.20/M at 8000 tok/s allows $34.56/h: 2 nodes at $14, not 8 nodes at $2 (what the budget thought)
    assert d.placement == {"dc": 2} and d.cost_per_hour_usd == pytest.approx(28.0)
    assert d.reason == Reason.COST_PER_TOKEN_CAP_REACHED.value
    assert "$34.56/h" in (d.stage("budget") or pytest.fail("no budget stage")).message


prices = st.floats(min_value=0.01, max_value=500, allow_nan=False)
rates = st.floats(min_value=0.001, max_value=1e6, allow_nan=False)


@given(replicas=st.integers(0, 50), price=prices, k=st.integers(1, 5))
def test_cloud_cost_is_linear_in_nodes(replicas: int, price: float, k: int) -> None:
    one = placement_cost(MODEL, POOLS, fleet(spot_price=price), {"spot": 4 * replicas})
    many = placement_cost(MODEL, POOLS, fleet(spot_price=price), {"spot": 4 * replicas * k})
    assert many == pytest.approx(k * one) and one == pytest.approx(replicas * price)


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
    low, _ = onprem_node_price(ONPREM, SITE, 1, kw)
    high, _ = onprem_node_price(ONPREM, SITE, 1, kw + extra)
    assert low is not None and high is not None and high > low
    assert low >= ONPREM.gpus_per_node * SITE.capital_usd_per_gpu_hour  # capital is paid regardless


sites = st.one_of(st.none(), st.builds(
    OnPremCost, capital_usd_per_gpu_hour=st.integers(0, 40).map(lambda c: c / 8),
    energy_usd_per_kwh=st.integers(0, 10).map(lambda c: c / 20), pue=st.sampled_from([1.0, 1.2, 1.5]),
    assumed_gpu_power_kw=st.one_of(st.none(), st.integers(0, 10).map(lambda c: c / 10))))
readings = st.one_of(
    st.none(), st.integers(0, 400).map(lambda w: Sample(w / 10, NOW)),
    st.just(Sample(3.0, NOW - timedelta(minutes=10))), st.just(Sample.missing("NaN: no DCGM", NOW)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(decide_cases(), sites, st.data())
def test_prop_budget_and_display_price_the_fleet_alike(case, site: OnPremCost | None, data: st.DataObject) -> None:
    """For any fleet and signals, the cost the budget stage prices a fleet at and the displayed cost
    (``/v1/status``, ``/metrics``) are the same function of the same inputs: the signals the daemon
    shows are the ones ``decide`` receives."""
    sc, pol, sig, hist = case
    power = {n: data.draw(readings) for n, p in sc.pools.items() if p.tier.is_onprem}
    shown = with_cost(sig, sc.model, sc.pools, NOW, onprem=site, power_kw=power)
    d = decide(model=sc.model, pools=sc.pools, signals=shown, policy=pol, history=hist, overrides=(), now=NOW)
    current = {n: s.replicas or 0 for n, s in shown.pools.items()}
    rate = sig.output_tokens_per_s.fresh(NOW, 60)
    per_million = shown.cost_per_million_tokens_usd.value
    if per_million is not None:
        # the displayed cost per hour is the budget's cost of the fleet held now
        assert rate is not None and rate > 0
        assert per_million * rate * 3600 / 1e6 == pytest.approx(placement_cost(sc.model, sc.pools, shown.pools, current))
    elif rate is not None and rate > 0:
        # missing only for a reason the display names: energy unknown on an on-prem pool in use
        assert "EnergyMissing" in (shown.cost_per_million_tokens_usd.reason or "")
        assert any(sc.pools[n].tier.is_onprem and current[n] > 0 for n in current)
    # the decision's cost is the budget's price of what it placed, at the displayed prices
    assert d.cost_per_hour_usd == pytest.approx(placement_cost(sc.model, sc.pools, shown.pools, d.placement))
    # and when the decision keeps the fleet "within budget" under a cost-per-token cap, the display
    # shows a cost per token within that cap
    cap = pol.spec.budget.max_cost_per_million_tokens_usd
    budget = d.stage("budget")
    assert budget is not None
    if (per_million is not None and cap is not None and d.placement == current
            and Reason.WITHIN_BUDGET.value in budget.message and "raised to" not in budget.message):
        assert per_million <= cap * (1 + 1e-9) + 1e-9
