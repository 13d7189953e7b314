"""The one simulated world, built from a ``DaemonConfig``, for a driver outside it.

``tidegate simulate`` runs ``controller.sim.engine.Simulation`` on its own simulated clock; the
demo, the tests and ``tidegate run`` with ``providers.type: simulated`` run the daemon on a clock of
their own (accelerated, or moved by hand) over the same ``Simulation``, one per model, moved with
``advance_to`` by every provider call. So the demo's fleet has what the simulator's has: the
continuous-batching service model with the calibrated profile (``controller/sim/profiles``), node
provisioning and cold starts, spot interruptions drawn from ``interruptions_per_node_hour`` and
capacity windows, every signal of the table (KV-cache utilization included), and live spot prices
(``prices.SpotPriceWalk``). The providers over it are ``providers.sim``'s.

What the config gives each model's ``Simulation`` (``setup_for``):

- the load: ``load.LoadCurve`` (the diurnal curve with bursts of the ``providers`` section) as a
  rate series of ``LOAD_BIN_S`` bins over whole load cycles (about a week), repeated for as long as
  the world runs (``horizon_s``, a century by default), every request ``mean_input_tokens`` in and
  ``mean_output_tokens`` out, served as flows (fluid mode);
- the service profile: the shipped calibrated one for the model's name and GPU type when there is
  one; otherwise the shipped profile's shape with its times scaled so that one replica's top rate
  for this token mix is the config's ``capacity`` (requests/s, or output tokens/s over the mean
  output, whichever is lower);
- the fleet: the model's pools; ``initial_onprem_replicas`` replicas in each on-prem pool, ready at
  the epoch, nothing elsewhere; each spot pool draws interruptions at ``interruptions_per_node_hour``
  with its provider's notice.

Models do not share nodes: each model's ``Simulation`` holds its own nodes in a pool it shares with
another model, and the pool's ``nodes`` is their sum.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from controller.config import DaemonConfig, SimulatedProviders
from controller.core.model import ModelSignals, ModelSpec, PoolSpec, PoolState, Sample
from controller.core.signals import model_signal_names
from controller.sim.engine import DrivenFromOutside, EngineOptions, SimSetup, SloTargets, Simulation
from controller.sim.load import LoadCurve, LoadShape
from controller.sim.prices import SpotPriceWalk
from controller.sim.service import (
    PROFILES_DIR, FluidReplicaModel, ReplicaProfile, TokenGrid, default_profile_path, load_profile,
)
from controller.sim.spot import DEFAULT_NOTICE_S, SpotModel
from controller.sim.workload import RateSeries, TokenDistribution
from providers.registry import installed

LOAD_BIN_S = 5.0
"""Bin of the load's rate series: the fluid model's step."""
DEFAULT_HORIZON_S = 100 * 365 * 86400.0
"""How far the simulated world runs: longer than any daemon does."""
LOAD_SPAN_S = 7 * 86400.0
"""About how much load is generated before it repeats (whole load cycles)."""
_SHAPE_PROFILE = PROFILES_DIR / "llama3-70b-fp8.yaml"
_SHAPE_GPU = "H100"
_DEFAULT_SLO = SloTargets(ttft_s=2.0, tpot_s=0.1)


def _settings(cfg: DaemonConfig) -> SimulatedProviders:
    if not isinstance(cfg.providers, SimulatedProviders):
        raise ValueError(f"a simulated world needs providers.type 'simulated', got {cfg.providers.type!r}")
    return cfg.providers


def token_grid(cfg: DaemonConfig) -> TokenGrid:
    s = _settings(cfg)
    return TokenGrid(np.array([s.mean_input_tokens]), np.array([s.mean_output_tokens]))


def _scaled(base: ReplicaProfile, top_rate_per_s: float, grid: TokenGrid, tp: int) -> ReplicaProfile:
    have = FluidReplicaModel(base, grid).max_rate_per_s
    f = have / top_rate_per_s
    return base.model_copy(update={
        "tp_degree": tp, "prefill_ms_per_token": base.prefill_ms_per_token * f,
        "prefill_ms_per_token_sq": base.prefill_ms_per_token_sq * f, "decode_fixed_ms": base.decode_fixed_ms * f,
        "decode_ms_per_seq": base.decode_ms_per_seq * f,
        "decode_ms_per_context_token": base.decode_ms_per_context_token * f,
        "published": (), "source": f"{base.source}, times x{f:.3g} to the config's capacity"})


def profiles_for(cfg: DaemonConfig, model: ModelSpec) -> dict[str, ReplicaProfile]:
    """Per GPU type of ``model``'s pools: the calibrated profile, or the scaled shape (see above)."""
    path = default_profile_path(model.name)
    shipped = load_profile(path).gpus if path is not None else {}
    grid = token_grid(cfg)
    shape = load_profile(_SHAPE_PROFILE).gpus[_SHAPE_GPU]
    out: dict[str, ReplicaProfile] = {}
    for gpu in {cfg.pool_specs()[p].gpu_type for p in model.pools}:
        prof = shipped.get(gpu)
        if prof is not None and prof.tp_degree == model.tp_degree:
            out[gpu] = prof
            continue
        cap = model.capacity[gpu]
        top = min(cap.requests_per_s, cap.output_tokens_per_s / float(grid.mean_output))
        out[gpu] = _scaled(shape, top, grid, model.tp_degree)
    return out


def load_series(cfg: DaemonConfig, model: str, horizon_s: float) -> RateSeries:
    """The model's load curve as a repeating rate series (exact arrivals per bin over the bin):
    whole cycles of about ``LOAD_SPAN_S``, no more than ``horizon_s`` needs."""
    s = _settings(cfg)
    curve = LoadCurve(LoadShape.from_config(s), s.seed, stream=model)
    span = min(s.period_s * max(1, round(LOAD_SPAN_S / s.period_s)), horizon_s)
    n = int(np.ceil(span / LOAD_BIN_S))
    rates = np.fromiter((curve.arrivals(i * LOAD_BIN_S, (i + 1) * LOAD_BIN_S) / LOAD_BIN_S for i in range(n)),
                        dtype=np.float64, count=n)
    tokens = TokenDistribution(np.array([int(s.mean_input_tokens)]), np.array([int(s.mean_output_tokens)]))
    return RateSeries(f"load:{model}", LOAD_BIN_S, rates, tokens, repeats=True)


def initial_replicas(cfg: DaemonConfig, model: ModelSpec) -> dict[str, int]:
    """``initial_onprem_replicas`` in each of the model's on-prem pools, none elsewhere."""
    s = _settings(cfg)
    pools = cfg.pool_specs()
    return {p: (s.initial_onprem_replicas if pools[p].tier.is_onprem else 0) for p in model.pools}


def setup_for(cfg: DaemonConfig, model: ModelSpec, *, epoch: datetime,
              horizon_s: float = DEFAULT_HORIZON_S) -> SimSetup:
    """The ``SimSetup`` of one model of a simulated config (see the module's docstring)."""
    s = _settings(cfg)
    pools = {n: cfg.pool_specs()[n] for n in model.pools}
    registry = installed()
    spot: dict[str, SpotModel] = {}
    prices: dict[str, SpotPriceWalk] = {}
    for name, p in pools.items():
        if p.tier.is_spot:
            notice = registry.notice_s(p.provider)
            spot[name] = SpotModel(notice_s=DEFAULT_NOTICE_S if notice is None else notice,
                                   interruptions_per_node_hour=s.interruptions_per_node_hour, seed=s.seed,
                                   pool=f"{model.name}/{name}")
            prices[name] = SpotPriceWalk(p.price_per_node_hour_usd, s.seed, name)
    return SimSetup(model=model, pools=pools, profiles=profiles_for(cfg, model),
                    workload=load_series(cfg, model.name, horizon_s), slo=_DEFAULT_SLO, spot=spot, seed=s.seed,
                    epoch=epoch, options=EngineOptions(mode="fluid", progress=False), duration_s=horizon_s,
                    grid=token_grid(cfg), spot_prices=prices)


@dataclass(frozen=True, slots=True)
class Gap:
    start_s: float
    end_s: float


class World:
    """Every model of a simulated config, each on its ``Simulation``, moved by the time its
    providers are asked at. Thread-safe (the daemon's API reads while the scheduler ticks)."""

    def __init__(self, cfg: DaemonConfig, epoch: datetime, *, horizon_s: float = DEFAULT_HORIZON_S) -> None:
        if epoch.tzinfo is None or epoch.utcoffset() is None:
            raise ValueError(f"the world's epoch must be timezone-aware, got {epoch.isoformat()}")
        self.config = cfg
        self.epoch = epoch
        self.lock = threading.RLock()
        self.pool_specs: dict[str, PoolSpec] = cfg.pool_specs()
        self.model_specs: dict[str, ModelSpec] = cfg.model_specs()
        self.sims: dict[str, Simulation] = {}
        for name, m in self.model_specs.items():
            sim = Simulation(setup_for(cfg, m, epoch=epoch, horizon_s=horizon_s),
                             DrivenFromOutside(cfg.loop.interval_s, initial_replicas(cfg, m)))
            sim.start()
            self.sims[name] = sim
        self.gaps: list[Gap] = []

    def seconds(self, now: datetime) -> float:
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError(f"now must be timezone-aware, got naive {now.isoformat()}")
        return (now - self.epoch).total_seconds()

    def advance(self, now: datetime) -> None:
        """Move every model's world to ``now`` (never backwards)."""
        t = self.seconds(now)
        for sim in self.sims.values():
            sim.advance_to(t)

    @property
    def time(self) -> datetime:
        return self.epoch + timedelta(seconds=min(s.now for s in self.sims.values()))

    def signals(self, model: str, now: datetime) -> ModelSignals:
        """The last scrape of ``model``'s world, as Prometheus would answer at ``now``."""
        sim = self.sims.get(model)
        t = self.seconds(now)
        if sim is None:
            return ModelSignals(model, now, samples={n: Sample.missing("UnknownModel", now) for n in model_signal_names()})
        if any(g.start_s <= t < g.end_s for g in self.gaps):  # Prometheus answers no series
            return ModelSignals(model, now, samples={n: Sample.missing("NoData", now) for n in sim.scrape_samples})
        return ModelSignals(model, now, samples=sim.scrape_samples)

    def pool_state(self, pool: str, model: str, now: datetime) -> PoolState:
        """``model``'s Deployment in ``pool``; ``nodes`` sums every model's nodes there."""
        own = self.sims[model]._pool_views(now)[0][pool]
        nodes = sum(s._pool_views(now)[0][pool].nodes or 0 for s in self.sims.values() if pool in s.pools)
        return PoolState(pool=own.pool, replicas=own.replicas, ready_replicas=own.ready_replicas, nodes=nodes,
                         available=own.available, unavailable_reason=own.unavailable_reason,
                         interrupted_replicas=own.interrupted_replicas, recent_interruptions=own.recent_interruptions,
                         price_per_node_hour_usd=own.price_per_node_hour_usd, at=now)

    def models_in(self, pool: str) -> list[str]:
        return [m for m, s in self.sims.items() if pool in s.pools]

    def price(self, pool: str, now: datetime) -> float | None:
        for sim in self.sims.values():
            if pool in sim.pools:
                return sim._live_price(pool, self.seconds(now))
        return None

    # -- hooks (the demo's and the tests') --------------------------------------------------------

    def inject_capacity_shortage(self, pool: str, start: datetime, duration_s: float) -> None:
        """From ``start`` for ``duration_s`` node orders for ``pool`` fail and it reads unavailable."""
        a = self.seconds(start)
        with self.lock:
            for m in self.models_in(pool):
                self.sims[m].add_unavailable_window(pool, a, a + duration_s)

    def inject_metrics_gap(self, start: datetime, duration_s: float) -> None:
        """From ``start`` for ``duration_s`` every signal reads as missing (a scrape outage)."""
        a = self.seconds(start)
        with self.lock:
            self.gaps.append(Gap(a, a + duration_s))

    def interrupt(self, pool: str, model: str, now: datetime) -> bool:
        """An interruption notice at ``now`` for the newest serving node of ``model`` in ``pool``."""
        with self.lock:
            self.advance(now)
            return self.sims[model].interrupt(pool)

    def load_requests_per_s(self, model: str, now: datetime) -> float:
        """The arrival rate of ``model``'s load at ``now``."""
        w = self.sims[model].setup.workload
        assert isinstance(w, RateSeries)
        return w.rate_at(self.seconds(now))

    def cost_per_hour_usd(self, now: datetime) -> float:
        """What every billed node of the world costs per hour at ``now``."""
        with self.lock:
            self.advance(now)
            return sum(s.cost_per_hour() for s in self.sims.values())

    def served(self, model: str) -> tuple[float, float, float]:
        """(requests arrived, requests served, requests retried after their replica vanished) of
        ``model`` so far; a retried request is served again."""
        sim = self.sims[model]
        return sim.fluid_arrived, sim.fluid_served, sim.fluid_retried
