"""Cost per token: what the fleet costs per hour, divided by what it serves.

Why it exists: "cost-aware" means nothing unless the number is comparable across pools. A pool's
cost per hour is the node-hours it holds times its price: the live spot price where one is known,
the static list price otherwise, and for on-prem nodes (already paid for) the amortized capital
cost per GPU-hour plus the energy the GPUs draw (DCGM's energy counter) at the site's price per
kWh. Divided by the output tokens served per hour, that gives cost per million tokens, the number
budgets (``max_cost_per_million_tokens_usd``), ``/v1/status`` and ``/metrics`` show.

Pure functions over values (no I/O, no clock): the caller passes the samples it observed and
``now``. Missing stays missing: an unknown node count, an unknown power draw (without a configured
assumption) or no tokens served gives ``Sample(None, reason)``, never a cost of 0 or infinity.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Mapping

from controller.core.model import ModelSignals, ModelSpec, PoolSpec, PoolState, Sample

NODES_UNKNOWN = "NodesUnknown"
ENERGY_MISSING = "EnergyMissing"
NO_TOKENS = "NoTokens"
TOKENS_MISSING = "TokensMissing"
COST_MISSING = "CostMissing"
STATIC_PRICE = "StaticPrice"
ASSUMED_POWER = "AssumedPower"


@dataclass(frozen=True, slots=True)
class OnPremCost:
    """How an on-prem pool's hour is priced."""

    capital_usd_per_gpu_hour: float
    """Purchase price (plus hosting) of a GPU spread over its service life, per GPU-hour: paid
    whether the GPU works or idles, which is why on-prem fills first."""
    energy_usd_per_kwh: float
    """Electricity price at the site."""
    pue: float = 1.0
    """Power usage effectiveness: facility power / IT power (cooling); 1.0 counts GPUs only."""
    assumed_gpu_power_kw: float | None = None
    """Power per GPU to assume while DCGM's energy reading is missing; ``None``: the cost is then
    missing too (an on-prem hour without its energy would understate the cost)."""


def pool_cost_per_hour_usd(pool: PoolSpec, state: PoolState | None, now: datetime, *,
                           onprem: OnPremCost | None = None, power_kw: Sample | None = None,
                           max_age_s: float = 60.0) -> Sample:
    """Cost per hour of the nodes ``state`` says the pool holds.

    Cloud pools: nodes x (live price if known, else the static price; the reason says which).
    On-prem with ``onprem``: nodes x GPUs per node x capital per GPU-hour + the pool's GPU power
    (kW, fresh within ``max_age_s``) x PUE x price per kWh. On-prem without ``onprem``: nodes x the
    static amortized price per node-hour.
    """
    if state is None or state.nodes is None:
        return Sample.missing(f"{NODES_UNKNOWN}: pool {pool.name} node count unknown", now)
    nodes = state.nodes
    if not pool.tier.is_onprem:
        if state.price_per_node_hour_usd is not None:
            return Sample(nodes * state.price_per_node_hour_usd, now)
        reason = (f"{STATIC_PRICE}: no live price for {pool.name}; static {pool.price_per_node_hour_usd:g} USD/node-hour"
                  if pool.tier.is_spot else None)
        return Sample(nodes * pool.price_per_node_hour_usd, now, reason)
    if onprem is None:
        return Sample(nodes * pool.price_per_node_hour_usd, now)
    if nodes == 0:
        return Sample(0.0, now)  # no nodes held: nothing to pay for, no energy drawn
    capital = nodes * pool.gpus_per_node * onprem.capital_usd_per_gpu_hour
    kw = power_kw.fresh(now, max_age_s) if power_kw is not None else None
    reason = None
    if kw is None:
        if onprem.assumed_gpu_power_kw is None:
            why = power_kw.reason if power_kw is not None and power_kw.reason else "no reading"
            return Sample.missing(f"{ENERGY_MISSING}: pool {pool.name} GPU power unknown ({why})", now)
        kw = onprem.assumed_gpu_power_kw * nodes * pool.gpus_per_node
        reason = f"{ASSUMED_POWER}: pool {pool.name} energy at an assumed {onprem.assumed_gpu_power_kw:g} kW per GPU"
    energy = kw * onprem.pue * onprem.energy_usd_per_kwh
    return Sample(capital + energy, now, reason)


def cost_per_million_tokens_usd(cost_per_hour: Sample, output_tokens_per_s: Sample, now: datetime,
                                max_age_s: float = 60.0) -> Sample:
    """``cost_per_hour / (tokens per second x 3600) x 1e6``; missing when either side is, and
    when no tokens were served (the cost per token of an idle fleet is undefined, not infinite)."""
    cost = cost_per_hour.value
    if cost is None:
        return Sample.missing(f"{COST_MISSING}: {cost_per_hour.reason or 'unknown'}", now)
    tps = output_tokens_per_s.fresh(now, max_age_s)
    if tps is None:
        return Sample.missing(f"{TOKENS_MISSING}: output token rate {output_tokens_per_s.reason or 'missing or stale'}", now)
    if tps <= 0:
        return Sample.missing(f"{NO_TOKENS}: no output tokens served; cost per token undefined", now)
    reason = cost_per_hour.reason
    return Sample(cost / (tps * 3600.0) * 1e6, now, reason)


def model_cost_per_hour_usd(model: ModelSpec, pools: Mapping[str, PoolSpec], states: Mapping[str, PoolState],
                            now: datetime, *, onprem: OnPremCost | None = None,
                            power_kw: Mapping[str, Sample] | None = None, max_age_s: float = 60.0) -> Sample:
    """Sum of the model's pools' costs per hour; missing if any pool's is (a partial sum would
    understate the cost a budget compares against)."""
    total = 0.0
    notes: list[str] = []
    for name in model.pools:
        spec = pools.get(name)
        if spec is None:
            return Sample.missing(f"{COST_MISSING}: pool {name} of {model.name} is not configured", now)
        c = pool_cost_per_hour_usd(spec, states.get(name), now, onprem=onprem,
                                   power_kw=(power_kw or {}).get(name), max_age_s=max_age_s)
        if c.value is None:
            return c
        total += c.value
        if c.reason:
            notes.append(c.reason)
    return Sample(total, now, "; ".join(notes) or None)


def with_cost(signals: ModelSignals, model: ModelSpec, pools: Mapping[str, PoolSpec], now: datetime, *,
              onprem: OnPremCost | None = None, power_kw: Mapping[str, Sample] | None = None,
              max_age_s: float = 60.0) -> ModelSignals:
    """``signals`` with ``cost_per_million_tokens_usd`` filled from its own pool states and output
    token rate."""
    per_hour = model_cost_per_hour_usd(model, pools, signals.pools, now, onprem=onprem, power_kw=power_kw,
                                       max_age_s=max_age_s)
    return signals.replace_samples(cost_per_million_tokens_usd=cost_per_million_tokens_usd(
        per_hour, signals.output_tokens_per_s, now, max_age_s))
