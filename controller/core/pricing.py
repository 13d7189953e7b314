"""Prices and costs, defined once: what a node-hour costs, what a fleet costs per hour, what a
million output tokens cost.

Why it exists: the budget compares a placement's cost with its caps, ``/v1/status`` and
``/metrics`` show cost per hour and per million tokens, the simulator bills node-hours, and the
baselines rank pools by price per replica. When each of them priced a node its own way, the
budget's cost-per-token cap and the displayed cost per million tokens could disagree (with
``onprem_cost`` set, the budget used the static on-prem price, the display capital plus energy).
Here is the one definition they all call:

- **Price per node-hour** of a pool (``pool_price``): the price carried by the pool's state when
  there is one (the live spot price, or an on-prem pool's capital plus energy filled in by
  ``price_pools``), else the static ``price_per_node_hour_usd`` of the pool spec (the fallback).
- **On-prem** (``onprem_node_price``): GPUs per node x amortized capital per GPU-hour, plus the
  energy a node draws (the model's measured GPU power in the pool spread over the nodes its
  replicas hold, or the assumed power per GPU) x PUE x price per kWh.
- **Cost per hour** of a placement (``placement_cost``): whole nodes for each pool's replicas
  (``whole_nodes``) x the pool's price per node-hour. The budget prices the placements it tries
  with it; the daemon's displayed cost (``model_cost_per_hour_usd``) is the same function of the
  replicas the pools hold now, so the displayed cost per million tokens and the budget's
  cost-per-token cap compare the same number.
- **Cost per million tokens** (``usd_per_million_tokens``, ``cost_per_million_tokens_usd``) and
  its inverse, the hourly cost a cost-per-token ceiling allows (``hourly_cost_at_usd``).

Pure functions over values (no I/O, no clock): the I/O edges (the daemon, the simulated world)
read live prices and measured power and pass them in. Missing stays missing in what is displayed:
unknown replicas, an on-prem pool with replicas whose energy is unknown (and no assumed power), or
no tokens served give ``Sample(None, reason)``, never a cost of 0 or infinity. Placement cannot
wait for a reading: it prices such a pool at its static price, as the budget always did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Mapping

from controller.core.model import ModelSignals, ModelSpec, PoolSpec, PoolState, Sample

S_PER_HOUR = 3600.0
TOKENS_PER_MILLION = 1e6

REPLICAS_UNKNOWN = "ReplicasUnknown"
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


# ---------------------------------------------------------------------------------- node-hours

def pool_price(spec: PoolSpec, state: PoolState | None) -> float:
    """Price per node-hour, USD: the price the state carries (live spot, or on-prem capital plus
    energy from ``price_pools``), else the spec's static price."""
    if state is not None and state.price_per_node_hour_usd is not None:
        return state.price_per_node_hour_usd
    return spec.price_per_node_hour_usd


def replica_price(spec: PoolSpec, model: ModelSpec, state: PoolState | None = None) -> float:
    """Price per replica-hour when nodes are full (node price / replicas per node): how pools are
    ranked. Infinite where the pool cannot host the model."""
    per_node = spec.replicas_per_node(model)
    return pool_price(spec, state) / per_node if per_node > 0 else math.inf


def whole_nodes(replicas: int, per_node: int) -> int:
    """Whole nodes that hold ``replicas`` replicas at ``per_node`` per node."""
    if replicas <= 0:
        return 0
    if per_node <= 0:
        # Replicas where they cannot fit (a stale placement on a pool of the wrong GPU type): count
        # one node each so their cost is not hidden.
        return replicas
    return -(-replicas // per_node)


def onprem_node_price(spec: PoolSpec, site: OnPremCost, nodes: int, power_kw: float | None) -> tuple[float | None, str | None]:
    """Price per node-hour of an on-prem pool at ``site``, and a note on how it was priced.

    ``power_kw``: the fresh measured GPU power of the model's replicas in the pool (``None``: no
    reading), spread over the ``nodes`` they hold; without a reading, or with no node held (nothing
    measured to spread), the assumed power per GPU. ``(None, EnergyMissing...)`` when neither is
    known."""
    capital = spec.gpus_per_node * site.capital_usd_per_gpu_hour
    note = None
    if power_kw is not None and nodes > 0:
        kw_per_node = power_kw / nodes
    elif site.assumed_gpu_power_kw is not None:
        kw_per_node = site.assumed_gpu_power_kw * spec.gpus_per_node
        note = f"{ASSUMED_POWER}: pool {spec.name} energy at an assumed {site.assumed_gpu_power_kw:g} kW per GPU"
    else:
        return None, f"{ENERGY_MISSING}: pool {spec.name} GPU power unknown"
    return capital + kw_per_node * site.pue * site.energy_usd_per_kwh, note


def price_pools(model: ModelSpec, pools: Mapping[str, PoolSpec], states: Mapping[str, PoolState], now: datetime, *,
                onprem: OnPremCost | None = None, power_kw: Mapping[str, Sample] | None = None,
                max_age_s: float = 60.0) -> tuple[dict[str, PoolState], dict[str, str]]:
    """The model's pool states with on-prem pools priced at ``onprem`` (their
    ``price_per_node_hour_usd``), and per pool a note on how it was priced (assumed power, energy
    missing, static spot price). Without ``onprem`` on-prem pools keep their static price. A pool
    whose energy is unknown keeps its static price too (placement needs a number) and its note
    says so; ``model_cost_per_hour_usd`` then shows the cost as missing."""
    out = dict(states)
    notes: dict[str, str] = {}
    for name in model.pools:
        spec, st = pools.get(name), states.get(name)
        if spec is None or st is None:
            continue
        note = None
        if spec.tier.is_spot and st.price_per_node_hour_usd is None:
            note = f"{STATIC_PRICE}: no live price for {name}; static {spec.price_per_node_hour_usd:g} USD/node-hour"
        elif onprem is not None and spec.tier.is_onprem:
            out[name], note = _priced_onprem(model, spec, st, onprem, (power_kw or {}).get(name), now, max_age_s)
        if note is not None:
            notes[name] = note
    return out, notes


def _priced_onprem(model: ModelSpec, spec: PoolSpec, state: PoolState, site: OnPremCost, power_kw: Sample | None,
                   now: datetime, max_age_s: float) -> tuple[PoolState, str | None]:
    """One on-prem pool's state priced at ``site`` (unchanged when its energy is unknown), and the
    note on how it was priced."""
    kw = power_kw.fresh(now, max_age_s) if power_kw is not None else None
    nodes = whole_nodes(state.replicas or 0, spec.replicas_per_node(model))
    price, note = onprem_node_price(spec, site, nodes, kw)
    if price is None:
        if note is not None and power_kw is not None and power_kw.reason:
            note += f" ({power_kw.reason})"
        return state, note
    return replace(state, price_per_node_hour_usd=price), note


# ---------------------------------------------------------------------------------- fleets

def pool_cost_per_hour_usd(model: ModelSpec, spec: PoolSpec, state: PoolState | None, replicas: int) -> float:
    """Cost per hour, USD, of ``replicas`` of ``model`` in one pool: whole nodes x node price."""
    return whole_nodes(replicas, spec.replicas_per_node(model)) * pool_price(spec, state)


def placement_cost(model: ModelSpec, pools: Mapping[str, PoolSpec], states: Mapping[str, PoolState],
                   placement: Mapping[str, int]) -> float:
    """Cost per hour (USD) of ``placement``: whole nodes per pool times the node price."""
    cost = 0.0
    for name, replicas in placement.items():
        spec = pools.get(name)
        if spec is None or replicas <= 0:
            continue
        cost += pool_cost_per_hour_usd(model, spec, states.get(name), replicas)
    return cost


def model_cost_per_hour_usd(model: ModelSpec, pools: Mapping[str, PoolSpec], states: Mapping[str, PoolState],
                            now: datetime, notes: Mapping[str, str] | None = None) -> Sample:
    """What the model's fleet costs per hour now: ``placement_cost`` of the replicas its pools hold
    (``states`` as priced by ``price_pools``, ``notes`` its notes). Missing when a pool's replicas
    are unknown, a pool is not configured, or an on-prem pool with replicas has no energy figure
    (a partial sum would understate the cost)."""
    held: dict[str, int] = {}
    reasons: list[str] = []
    for name in model.pools:
        st = states.get(name)
        if name not in pools:
            return Sample.missing(f"{COST_MISSING}: pool {name} of {model.name} is not configured", now)
        if st is None or st.replicas is None:
            return Sample.missing(f"{REPLICAS_UNKNOWN}: pool {name} replicas unknown", now)
        held[name] = st.replicas
        note = (notes or {}).get(name)
        if note is not None and st.replicas > 0:
            if note.startswith(ENERGY_MISSING):
                return Sample.missing(note, now)
            reasons.append(note)
    return Sample(placement_cost(model, pools, states, held), now, "; ".join(reasons) or None)


# ---------------------------------------------------------------------------------- tokens

def usd_per_million_tokens(usd: float, tokens: float) -> float:
    """``usd`` spent on ``tokens`` tokens, per million tokens (``tokens`` > 0)."""
    return usd / tokens * TOKENS_PER_MILLION


def hourly_cost_at_usd(usd_per_million: float, tokens_per_s: float) -> float:
    """The cost per hour at which ``tokens_per_s`` cost ``usd_per_million`` per million tokens:
    the inverse of ``usd_per_million_tokens`` over an hour (a cost-per-token ceiling in USD/h)."""
    return usd_per_million * tokens_per_s * S_PER_HOUR / TOKENS_PER_MILLION


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
    return Sample(usd_per_million_tokens(cost, tps * S_PER_HOUR), now, cost_per_hour.reason)


def with_cost(signals: ModelSignals, model: ModelSpec, pools: Mapping[str, PoolSpec], now: datetime, *,
              onprem: OnPremCost | None = None, power_kw: Mapping[str, Sample] | None = None,
              max_age_s: float = 60.0) -> ModelSignals:
    """``signals`` with its pools priced (``price_pools``) and, unless the source measured it,
    ``cost_per_million_tokens_usd`` filled from those prices, the replicas the pools hold and the
    output token rate: what the daemon shows, and what the budget stage then prices with."""
    states, notes = price_pools(model, pools, signals.pools, now, onprem=onprem, power_kw=power_kw,
                                max_age_s=max_age_s)
    if signals.cost_per_million_tokens_usd.value is not None:
        return replace(signals, pools=states)
    per_hour = model_cost_per_hour_usd(model, pools, states, now, notes)
    cost = cost_per_million_tokens_usd(per_hour, signals.output_tokens_per_s, now, max_age_s)
    return replace(signals, pools=states, samples={**signals.samples, "cost_per_million_tokens_usd": cost})
