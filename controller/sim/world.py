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
  ``mean_output_tokens`` out, served as flows (fluid mode); each bin is computed when the world
  reaches it (``workload.CurveSeries``), not held;
- the service profile: the shipped calibrated one for the model's name and GPU type when there is
  one; otherwise the shipped profile's shape with its times scaled so that one replica's top rate
  for this token mix is the config's ``capacity`` (requests/s, or output tokens/s over the mean
  output, whichever is lower);
- the fleet: the model's pools; ``initial_onprem_replicas`` replicas in each on-prem pool, ready at
  the epoch, nothing elsewhere; each spot pool draws interruptions at ``interruptions_per_node_hour``
  with its provider's notice.

Models do not share nodes: each model's ``Simulation`` holds its own nodes in a pool it shares with
another model, and the pool's ``nodes`` is their sum. Models share what is the same value for each
(``Shared``: service profiles and fluid models, spot price walks).
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from controller.config import DaemonConfig, SimulatedProviders
from controller.core.model import ModelSignals, ModelSpec, PoolSpec, PoolState, Sample
from controller.core.signals import model_signal_names
from controller.sim.engine import DrivenFromOutside, EngineOptions, SimSetup, SloTargets, Simulation
from controller.sim.setup import FluidEntry
from controller.sim.load import LoadCurve, LoadShape
from controller.sim.prices import SpotPriceWalk
from controller.sim.service import (
    PROFILES_DIR, FluidReplicaModel, ReplicaProfile, ServiceProfile, TokenGrid, default_profile_path, load_profile,
)
from controller.sim.spot import DEFAULT_NOTICE_S, SpotModel
from controller.sim.workload import CurveSeries, RateSeries, TokenDistribution
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
ACTION_LOG_PER_MODEL = 100
"""Changes of desired replicas each model's world remembers (``Simulation.action_log``): nothing
of the world grows per tick without bound (the providers keep their own calls' log)."""


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


@functools.lru_cache(maxsize=32)
def _profile_file(path: Path) -> ServiceProfile:
    """A shipped service profile, read once per process (profiles are values: never changed)."""
    return load_profile(path)


def profiles_for(cfg: DaemonConfig, model: ModelSpec) -> dict[str, ReplicaProfile]:
    """Per GPU type of ``model``'s pools: the calibrated profile, or the scaled shape (see above)."""
    path = default_profile_path(model.name)
    shipped = _profile_file(path).gpus if path is not None else {}
    grid = token_grid(cfg)
    shape = _profile_file(_SHAPE_PROFILE).gpus[_SHAPE_GPU]
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
    whole cycles of about ``LOAD_SPAN_S``, no more than ``horizon_s`` needs. Its bins are computed
    when read (``workload.CurveSeries``), so a model's world holds no week of bins."""
    s = _settings(cfg)
    curve = LoadCurve(LoadShape.from_config(s), s.seed, stream=model)
    span = min(s.period_s * max(1, round(LOAD_SPAN_S / s.period_s)), horizon_s)
    n = int(np.ceil(span / LOAD_BIN_S))
    tokens = TokenDistribution(np.array([int(s.mean_input_tokens)]), np.array([int(s.mean_output_tokens)]))
    return CurveSeries(f"load:{model}", LOAD_BIN_S, n, curve.arrivals, tokens, repeats=True)


def initial_replicas(cfg: DaemonConfig, model: ModelSpec) -> dict[str, int]:
    """``initial_onprem_replicas`` in each of the model's on-prem pools, none elsewhere."""
    s = _settings(cfg)
    pools = cfg.pool_specs()
    return {p: (s.initial_onprem_replicas if pools[p].tier.is_onprem else 0) for p in model.pools}


class Shared:
    """What models of one world share because it is the same value for each: the service
    profiles, fluid models and their steady states of models with the same profile inputs (name's shipped profile, GPU
    types, TP degree, capacity), and each spot pool's live price walk (a function of the seed, the
    pool and time). A thousand models then hold a few of each, not a thousand."""

    def __init__(self) -> None:
        self.profiles: dict[tuple[object, ...], tuple[dict[str, ReplicaProfile], dict[str, FluidReplicaModel],
                                                      dict[tuple[str, int | None], FluidEntry]]] = {}
        self.prices: dict[str, SpotPriceWalk] = {}

    def profiles_for(self, cfg: DaemonConfig, model: ModelSpec) -> tuple[
            dict[str, ReplicaProfile], dict[str, FluidReplicaModel], dict[tuple[str, int | None], FluidEntry]]:
        pools = cfg.pool_specs()
        gpus = sorted({pools[p].gpu_type for p in model.pools})
        key = (default_profile_path(model.name), model.tp_degree,
               tuple((g, model.capacity[g].requests_per_s, model.capacity[g].output_tokens_per_s)
                     if g in model.capacity else (g,) for g in gpus))
        found = self.profiles.get(key)
        if found is None:
            found = self.profiles[key] = (profiles_for(cfg, model), {}, {})
        return found

    def price_walk(self, pool: PoolSpec, seed: int) -> SpotPriceWalk:
        walk = self.prices.get(pool.name)
        if walk is None:
            walk = self.prices[pool.name] = SpotPriceWalk(pool.price_per_node_hour_usd, seed, pool.name)
        return walk


def setup_for(cfg: DaemonConfig, model: ModelSpec, *, epoch: datetime,
              horizon_s: float = DEFAULT_HORIZON_S, shared: Shared | None = None,
              run_stats: bool = True) -> SimSetup:
    """The ``SimSetup`` of one model of a simulated config (see the module's docstring); models
    set up with one ``shared`` share its values. ``run_stats=False``: no run summary (the
    world's, observed only through its scrapes; ``EngineOptions.run_stats``)."""
    s = _settings(cfg)
    shared = shared if shared is not None else Shared()
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
            prices[name] = shared.price_walk(p, s.seed)
    profiles, fluid, entries = shared.profiles_for(cfg, model)
    return SimSetup(model=model, pools=pools, profiles=profiles,
                    workload=load_series(cfg, model.name, horizon_s), slo=_DEFAULT_SLO, spot=spot, seed=s.seed,
                    epoch=epoch, options=EngineOptions(mode="fluid", progress=False, run_stats=run_stats),
                    duration_s=horizon_s,
                    grid=token_grid(cfg), spot_prices=prices, _fluid=fluid, _fluid_entries=entries)


@dataclass(frozen=True, slots=True)
class Gap:
    start_s: float
    end_s: float


class World:
    """Every model of a simulated config, each on its ``Simulation``, moved by the time its
    providers are asked at. Thread-safe (the daemon's API reads while the scheduler ticks).

    What a thousand models cost the world, per provider call: ``advance`` moves every model once
    per new instant (a later call at the same instant only settles the models scaled since, as
    each model's ``advance_to`` would); a pool's node sum over its models is computed once per
    instant and scaling; which models a pool serves is fixed at the start."""

    def __init__(self, cfg: DaemonConfig, epoch: datetime, *, horizon_s: float = DEFAULT_HORIZON_S) -> None:
        if epoch.tzinfo is None or epoch.utcoffset() is None:
            raise ValueError(f"the world's epoch must be timezone-aware, got {epoch.isoformat()}")
        self.config = cfg
        self.epoch = epoch
        self.lock = threading.RLock()
        self.pool_specs: dict[str, PoolSpec] = cfg.pool_specs()
        self.model_specs: dict[str, ModelSpec] = cfg.model_specs()
        self.sims: dict[str, Simulation] = {}
        shared = Shared()
        for name, m in self.model_specs.items():
            sim = Simulation(setup_for(cfg, m, epoch=epoch, horizon_s=horizon_s, shared=shared, run_stats=False),
                             DrivenFromOutside(cfg.loop.interval_s, initial_replicas(cfg, m)))
            sim.action_log = deque(maxlen=ACTION_LOG_PER_MODEL)
            sim.start()
            self.sims[name] = sim
        self._served: dict[str, tuple[str, ...]] = {
            p: tuple(m for m, s in self.sims.items() if p in s.pools) for p in self.pool_specs}
        self._serves = {p: frozenset(ms) for p, ms in self._served.items()}
        self._at: float | None = None
        """The instant every model was last moved to."""
        self._scaled: set[str] = set()
        """Models scaled (or hooked) since: the next ``advance`` settles them even at the same instant."""
        self._nodes: dict[str, int] | None = None
        """Each pool's node sum over its models, while nothing moved."""
        self.gaps: list[Gap] = []

    def seconds(self, now: datetime) -> float:
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError(f"now must be timezone-aware, got naive {now.isoformat()}")
        return (now - self.epoch).total_seconds()

    def advance(self, now: datetime) -> None:
        """Move every model's world to ``now`` (never backwards)."""
        t = self.seconds(now)
        if self._at is not None and t <= self._at:  # every model is there: settle the ones scaled since
            for name in self._scaled:
                self.sims[name].advance_to(t)
            if self._scaled:
                self._scaled.clear()
                self._nodes = None
            return
        for sim in self.sims.values():
            sim.advance_to(t)
        self._at = t
        self._scaled.clear()
        self._nodes = None

    def touched(self, model: str) -> None:
        """``model``'s world was changed from outside (scaled, interrupted): what it reports is
        recomputed at the next read."""
        self._scaled.add(model)
        self._nodes = None

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

    def pool_nodes(self, pool: str, now: datetime) -> int:
        """Every model's nodes in ``pool`` (models do not share nodes)."""
        if self._nodes is None:
            self._nodes = {p: sum(self.sims[m]._pool_views(now)[0][p].nodes or 0 for m in ms)
                           for p, ms in self._served.items()}
        return self._nodes[pool]

    def pool_state(self, pool: str, model: str, now: datetime) -> PoolState:
        """``model``'s Deployment in ``pool``; ``nodes`` sums every model's nodes there."""
        own = self.sims[model]._pool_views(now)[0][pool]
        return replace(own, nodes=self.pool_nodes(pool, now), at=now)

    def models_in(self, pool: str) -> tuple[str, ...]:
        """The models with a Deployment in ``pool``, in the config's order."""
        return self._served.get(pool, ())

    def serves(self, pool: str, model: str) -> bool:
        return model in self._serves.get(pool, ())

    def price(self, pool: str, now: datetime) -> float | None:
        for m in self._served.get(pool, ()):
            return self.sims[m]._live_price(pool, self.seconds(now))
        return None

    # -- hooks (the demo's and the tests') --------------------------------------------------------

    def inject_capacity_shortage(self, pool: str, start: datetime, duration_s: float) -> None:
        """From ``start`` for ``duration_s`` node orders for ``pool`` fail and it reads unavailable."""
        a = self.seconds(start)
        with self.lock:
            for m in self.models_in(pool):
                self.sims[m].add_unavailable_window(pool, a, a + duration_s)
                self.touched(m)

    def inject_metrics_gap(self, start: datetime, duration_s: float) -> None:
        """From ``start`` for ``duration_s`` every signal reads as missing (a scrape outage)."""
        a = self.seconds(start)
        with self.lock:
            self.gaps.append(Gap(a, a + duration_s))

    def interrupt(self, pool: str, model: str, now: datetime) -> bool:
        """An interruption notice at ``now`` for the newest serving node of ``model`` in ``pool``."""
        with self.lock:
            self.advance(now)
            self.touched(model)
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
