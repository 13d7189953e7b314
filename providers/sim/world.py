"""The simulated world: every pool, model, queue and price of a ``DaemonConfig``, moved by time.

The demo, the unit and integration tests and the daemon's offline mode run the real tick (observe,
decide, act, record) against this world instead of Prometheus, Kubernetes and the clouds. It
implements the same protocols as the real adapters (``controller.protocols``): ``world.metrics`` is
a ``MetricsSource``, ``world.pool_provider(name)`` a ``PoolProvider`` per pool, ``world.prices`` a
``PriceSource``. All of them read one consistent state, so what the metrics say follows from what
the pools hold.

Time: the world keeps its own time (seconds since its epoch, the clock's time at construction) and
only moves forward. Every provider call first ``advance``s the world to the ``now`` it was given;
a ``now`` earlier than the world's time changes nothing (the world never runs backwards) and the
answer describes the world's current state, stamped with the given ``now``. Between events (a node
ready, a replica ready, a notice, a node gone, a shortage starting or ending) the fleet is constant
and the queues are integrated; events are applied at their exact times, so the state at a given time
does not depend on how often the world was observed on the way (up to the small error of the
queue integration's sub-steps near an emptying backlog).

Pool state: ``replicas`` is the Deployment's desired count, ``ready_replicas`` the pods past their
cold start on ready nodes, ``nodes`` the node group's instances that exist (provisioning, ready or
under an interruption notice: what is billed), ``interrupted_replicas`` the model's pods on noticed
nodes, ``recent_interruptions`` the pool's notices in the last ``interruption_window_s``, and the
price the live spot price (``None`` for other tiers: use the static price).

Queueing model (per model, fluid, documented because policies are tuned against it):

- A ready replica in a pool of GPU type g serves ``mu_1 = min(requests_per_s, output_tokens_per_s /
  mean_output_tokens)`` requests/s (``ModelSpec.capacity[g]``); the model's service rate ``mu`` is
  the sum over its ready replicas in every pool.
- Arrivals ``lambda(t)`` come from the model's ``LoadCurve``. The backlog ``q`` follows
  ``dq/dt = lambda - mu`` while positive (integrated exactly per sub-step of at most 5 s, clipped at
  0); served rate is ``mu`` while a backlog exists, else ``min(lambda, mu)``.
- p99 latency: an M/M/c-flavoured estimate plus the backlog's wait. With ``c`` ready replicas, mean
  service time ``S = c / mu`` and utilization ``rho = served / mu`` (capped at 0.95 for the formula),
  the mean wait is Sakasegawa's ``Wq = S * rho^(sqrt(2(c+1)) - 1) / (c (1 - rho))``; p99 is
  ``ln(100) * (S + Wq)`` (an exponential tail) plus ``q / mu`` (the backlog ahead of a new request).
  With no ready replica and requests waiting, p99 is the backlog's age plus the saturated estimate
  for one replica: large, never missing while requests wait.
- Queue depth: the backlog plus the stochastic queue ``served * Wq`` (Little's law).
- GPU utilization: ``served / mu * 100`` (missing with no ready replica: no GPU serves).
- Request rate: the arrival rate (demand, as a gateway counter sees it). Token rates: served
  requests/s times the configured mean input / output tokens (throughput, as the engines report).
- Cost per million output tokens: not measured, as Prometheus does not measure it; the daemon prices
  it (``controller.core.pricing``) from the pool states (spot at the world's live price) and the
  output token rate, as it does in production.

Pools, nodes, pods and interruptions: see ``providers.sim.fleet``. Test hooks: capacity shortages,
metric scrape gaps and injected provider failures (``inject_*`` / ``fail_next``), and ``actions``,
the log of every call made.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Mapping, Sequence

from controller.config import DaemonConfig, SimulatedProviders
from controller.core.model import (
    Action, ActionStatus, ModelSignals, ModelSpec, PoolSpec, PoolState, Sample,
)
from controller.core.signals import NOT_SIMULATED
from controller.protocols import Clock, PermanentProviderError, PoolProvider, ProviderError
from providers.sim.fleet import PoolFleet
from providers.sim.load import LoadCurve, LoadShape
from providers.sim.prices import SpotPriceWalk

PROVIDER = "sim"
CALL_RESIZE_NODE_GROUP = "resize_node_group"
CALL_SCALE_DEPLOYMENT = "scale_deployment"

MAX_STEP_S = 5.0
"""Longest sub-step of the queue integration while a backlog may form or drain, seconds."""
RHO_MAX = 0.95
"""Utilization cap inside the M/M/c formula (it diverges at 1); beyond it the backlog term grows."""
P99_OVER_MEAN = math.log(100.0)
"""p99 / mean of an exponential distribution: the tail factor applied to the sojourn time."""
_EPS = 1e-9


def _to_seconds(epoch: datetime, now: datetime) -> float:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError(f"now must be timezone-aware, got naive {now.isoformat()}")
    return (now - epoch).total_seconds()


def mmc_wait_s(replicas: int, service_s: float, rho: float) -> float:
    """Mean queueing wait (seconds) of ``replicas`` servers with mean service time ``service_s`` at
    utilization ``rho`` (clamped to [0, RHO_MAX]): Sakasegawa's M/M/c approximation."""
    c = max(replicas, 1)
    r = min(max(rho, 0.0), RHO_MAX)
    return service_s * math.pow(r, math.sqrt(2.0 * (c + 1)) - 1.0) / (c * (1.0 - r))


def mmc_p99_s(replicas: int, service_s: float, rho: float) -> float:
    """p99 sojourn estimate (seconds): the exponential tail factor times service plus wait."""
    return P99_OVER_MEAN * (service_s + mmc_wait_s(replicas, service_s, rho))


@dataclass(slots=True)
class _ModelRuntime:
    spec: ModelSpec
    load: LoadCurve
    replica_rps: dict[str, float]
    """Requests/s one ready replica serves, per pool name."""
    queue: float = 0.0
    """Backlog of the fluid model, requests."""
    backlog_since_s: float | None = None
    arrived_total: float = 0.0
    served_total: float = 0.0


@dataclass(frozen=True, slots=True)
class ModelTotals:
    """Cumulative counters of one model since the epoch (for summaries and demo output)."""

    arrived_requests: float
    served_requests: float
    queue_depth: float


@dataclass(slots=True)
class _InjectedFailure:
    call: str | None
    error: ProviderError


class SimWorld:
    """Simulated pools, Deployments, load and prices for every model and pool of a config."""

    def __init__(
        self,
        config: DaemonConfig,
        clock: Clock,
        *,
        start: datetime | None = None,
        initial_replicas: Mapping[str, Mapping[str, int]] | None = None,
        unavailable_after_interruptions: int = 3,
        interruption_window_s: float = 3600.0,
    ) -> None:
        """``initial_replicas`` (model -> pool -> replicas) replaces the default start:
        ``initial_onprem_replicas`` per model in each on-prem pool, none elsewhere; the starting replicas are ready at once.
        A spot pool reports itself unavailable while it has had ``unavailable_after_interruptions``
        notices within ``interruption_window_s``; ``recent_interruptions`` counts that window."""
        if not isinstance(config.providers, SimulatedProviders):
            raise ValueError(f"SimWorld needs providers.type 'simulated', got {config.providers.type!r}")
        self.config = config
        self.settings: SimulatedProviders = config.providers
        self.clock = clock
        self.epoch: datetime = start if start is not None else clock.now()
        _to_seconds(self.epoch, self.epoch)  # rejects a naive start
        self.unavailable_after_interruptions = unavailable_after_interruptions
        self.interruption_window_s = interruption_window_s
        self._lock = threading.RLock()
        self._t = 0.0
        self.pool_specs: dict[str, PoolSpec] = config.pool_specs()
        self.model_specs: dict[str, ModelSpec] = config.model_specs()
        seed = self.settings.seed
        shape = LoadShape.from_config(self.settings)
        mean_out = self.settings.mean_output_tokens

        self._models: dict[str, _ModelRuntime] = {}
        for name, m in self.model_specs.items():
            rps = {}
            for pool_name in m.pools:
                cap = m.capacity[self.pool_specs[pool_name].gpu_type]
                rps[pool_name] = min(cap.requests_per_s, cap.output_tokens_per_s / mean_out)
            self._models[name] = _ModelRuntime(m, LoadCurve(shape, seed, stream=name), rps)

        self._fleets: dict[str, PoolFleet] = {}
        for pname, pspec in self.pool_specs.items():
            served = {m.name: m for m in self.model_specs.values() if pname in m.pools}
            self._fleets[pname] = PoolFleet(
                pspec, served, seed=seed,
                interruptions_per_node_hour=self.settings.interruptions_per_node_hour)
        self._spot_prices = {
            pname: SpotPriceWalk(p.price_per_node_hour_usd, seed, pname)
            for pname, p in self.pool_specs.items() if p.tier.is_spot}

        start_replicas = self._initial_replicas(initial_replicas)
        for mname, per_pool in start_replicas.items():
            for pname, r in per_pool.items():
                self._fleets[pname].set_desired_replicas(mname, r, 0.0)
        for fleet in self._fleets.values():
            fleet.mark_ready(0.0)

        self._metric_gaps: list[tuple[float, float]] = []
        self._failures: dict[str, list[_InjectedFailure]] = {p: [] for p in self.pool_specs}
        self.actions: list[Action] = []
        """Every call made through the pool providers, in order (NOOPs and failures included)."""

        self._metrics = SimMetrics(self)
        self._prices = SimPrices(self)
        self._providers = {p: SimPoolProvider(self, p) for p in self.pool_specs}

    def _initial_replicas(
        self, given: Mapping[str, Mapping[str, int]] | None,
    ) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {
            m.name: {p: (self.settings.initial_onprem_replicas if self.pool_specs[p].tier.is_onprem else 0)
                     for p in m.pools}
            for m in self.model_specs.values()}
        for mname, per_pool in (given or {}).items():
            if mname not in out:
                raise ValueError(f"initial_replicas names model {mname!r}, not among {sorted(out)}")
            for pname, r in per_pool.items():
                if pname not in out[mname]:
                    raise ValueError(
                        f"initial_replicas names pool {pname!r} for model {mname!r}, which has Deployments in {sorted(out[mname])}")
                if r < 0:
                    raise ValueError(f"initial_replicas for {mname}/{pname} must be >= 0, got {r}")
                out[mname][pname] = r
        return out

    # -- the providers ----------------------------------------------------------------------------

    @property
    def metrics(self) -> "SimMetrics":
        return self._metrics

    @property
    def prices(self) -> "SimPrices":
        return self._prices

    def pool_provider(self, pool_name: str) -> "SimPoolProvider":
        try:
            return self._providers[pool_name]
        except KeyError:
            raise PermanentProviderError(f"no pool {pool_name!r} (pools: {sorted(self._providers)})") from None

    @property
    def pool_providers(self) -> dict[str, "SimPoolProvider"]:
        return dict(self._providers)

    # -- time -------------------------------------------------------------------------------------

    @property
    def time(self) -> datetime:
        """The world's current time."""
        return self.epoch + timedelta(seconds=self._t)

    def seconds_since_epoch(self, now: datetime) -> float:
        return _to_seconds(self.epoch, now)

    def advance(self, now: datetime | None = None) -> None:
        """Move the world to ``now`` (default: the clock's now). Never moves backwards."""
        target = _to_seconds(self.epoch, now if now is not None else self.clock.now())
        with self._lock:
            self._advance_to(target)

    def _advance_to(self, target: float) -> None:
        while self._t < target:
            nxt = min(target, min(f.next_event_after(self._t) for f in self._fleets.values()))
            self._integrate(self._t, nxt)
            self._t = nxt
            for fleet in self._fleets.values():
                fleet.process(nxt)

    def _service_rate(self, m: _ModelRuntime, t: float) -> tuple[int, float]:
        """(ready replicas, requests/s they serve together) of one model at ``t``."""
        count, rate = 0, 0.0
        for pname, rps in m.replica_rps.items():
            n = self._fleets[pname].ready_pods(m.spec.name, t)
            count += n
            rate += n * rps
        return count, rate

    def _integrate(self, a: float, b: float) -> None:
        """Advance every model's backlog over [a, b], during which the fleet does not change."""
        for m in self._models.values():
            _, mu = self._service_rate(m, a)
            if m.queue <= 0.0 and mu >= m.load.max_requests_per_s:
                # Capacity above any possible arrival rate: no backlog can form, one exact step.
                arrived = m.load.arrivals(a, b)
                m.arrived_total += arrived
                m.served_total += arrived
                continue
            step = (b - a) if mu <= 0.0 else MAX_STEP_S  # nothing served: one exact step too
            s = a
            while s < b:
                e = min(b, s + step)
                arrived = m.load.arrivals(s, e)
                q_new = m.queue + arrived - mu * (e - s)
                if q_new <= _EPS:
                    q_new = 0.0
                    m.backlog_since_s = None
                elif m.queue <= 0.0:
                    m.backlog_since_s = s
                m.served_total += m.queue + arrived - q_new
                m.arrived_total += arrived
                m.queue = q_new
                s = e

    # -- observation ------------------------------------------------------------------------------

    def _observe_model(self, name: str, now: datetime) -> ModelSignals:
        m = self._models.get(name)
        if m is None:
            return ModelSignals.all_missing(name, now, Sample.missing("UnknownModel", now))
        t = self._t
        if any(a <= t < b for a, b in self._metric_gaps):
            return ModelSignals.all_missing(name, now, Sample.missing("NoData", now))

        lam = m.load.requests_per_s(t)
        c, mu = self._service_rate(m, t)
        backlog = m.queue
        if mu > 0.0:
            served = mu if backlog > 0.0 else min(lam, mu)
            rho = served / mu
            service_s = c / mu
            wait_s = mmc_wait_s(c, service_s, rho)
            p99: Sample = Sample(1000.0 * (mmc_p99_s(c, service_s, rho) + backlog / mu), now)
            queue = backlog + served * wait_s
            util = Sample(min(100.0, 100.0 * rho), now)
        else:
            served = 0.0
            queue = backlog
            util = Sample.missing("NoReadyReplicas", now)
            if backlog > 0.0 or lam > 0.0:
                age_s = t - m.backlog_since_s if m.backlog_since_s is not None else 0.0
                fastest_s = 1.0 / max(m.replica_rps.values()) if m.replica_rps else 1.0
                p99 = Sample(1000.0 * (age_s + mmc_p99_s(1, fastest_s, RHO_MAX)), now)
            else:
                p99 = Sample.missing("NoRequests", now)
        if mu > 0.0 and lam <= 0.0 and backlog <= 0.0:
            # Nothing arrives: a latency histogram has no new observations (NaN in Prometheus).
            p99 = Sample.missing("NoRequests", now)

        out_tps = served * self.settings.mean_output_tokens
        in_tps = served * self.settings.mean_input_tokens
        return ModelSignals(
            model=name, at=now,
            queue_depth=Sample(queue, now),
            p99_latency_ms=p99,
            gpu_utilization_pct=util,
            request_rate_per_s=Sample(lam, now),
            output_tokens_per_s=Sample(out_tps, now),
            input_tokens_per_s=Sample(in_tps, now),
            kv_cache_utilization_pct=Sample.missing(NOT_SIMULATED, now),
            # Cost per token is not measured (Prometheus does not either): the daemon prices it
            # (controller.core.pricing) from the pool states and the token rate above.
            cost_per_million_tokens_usd=Sample.missing("NotMeasured: priced by the daemon", now),
        )

    def _price(self, pool: str, t: float) -> float:
        walk = self._spot_prices.get(pool)
        return walk.price_usd(t) if walk is not None else self.pool_specs[pool].price_per_node_hour_usd

    def _pool_state(self, pool: str, model: ModelSpec, now: datetime) -> PoolState:
        fleet = self._fleets[pool]
        if model.name not in fleet.models:
            raise PermanentProviderError(
                f"model {model.name!r} has no Deployment in pool {pool!r} (it serves {sorted(fleet.models)})")
        t = self._t
        recent = fleet.recent_notices(t, self.interruption_window_s)
        available, why = True, None
        if fleet.in_shortage(t):
            end = max(s.end_s for s in fleet.shortages if s.start_s <= t < s.end_s)
            available = False
            why = f"InsufficientCapacity: simulated capacity shortage until {self.epoch + timedelta(seconds=end):%Y-%m-%dT%H:%M:%SZ}"
        elif fleet.spec.tier.is_spot and recent >= self.unavailable_after_interruptions:
            available = False
            why = f"RepeatedInterruptions: {recent} interruption notices in the last {self.interruption_window_s:g} s"
        return PoolState(
            pool=pool,
            replicas=fleet.desired_replicas(model.name),
            ready_replicas=fleet.ready_pods(model.name, t),
            nodes=len(fleet.nodes),
            available=available,
            unavailable_reason=why,
            interrupted_replicas=fleet.interrupted_pods(model.name, t),
            recent_interruptions=recent,
            price_per_node_hour_usd=self._price(pool, t) if fleet.spec.tier.is_spot else None,
            at=now,
        )

    # -- actuation --------------------------------------------------------------------------------

    def _scale(self, pool: str, model: ModelSpec, replicas: int, nodes: int, now: datetime) -> list[Action]:
        fleet = self._fleets[pool]
        spec = fleet.spec
        if model.name not in fleet.models:
            raise PermanentProviderError(
                f"model {model.name!r} has no Deployment in pool {pool!r} (it serves {sorted(fleet.models)})")
        if replicas < 0:
            raise PermanentProviderError(f"replicas must be >= 0, got {replicas} for {model.name}/{pool}")
        t = self._t
        target_nodes = nodes
        if fleet.has_node_group:
            if not 0 <= nodes <= spec.max_nodes:
                raise PermanentProviderError(
                    f"nodes ({nodes}) must be between 0 and pool {pool!r} max_nodes ({spec.max_nodes})")
            # The node group never goes below its minimum (as an ASG / MIG with min size would).
            target_nodes = max(nodes, spec.min_nodes)

        def deployment() -> Action:
            self._maybe_fail(pool, model.name, CALL_SCALE_DEPLOYMENT, {"replicas": replicas})
            before = fleet.desired_replicas(model.name)
            if before != replicas:
                fleet.set_desired_replicas(model.name, replicas, t)
            return Action(PROVIDER, CALL_SCALE_DEPLOYMENT, pool, model.name,
                          {"replicas": replicas, "previous_replicas": before},
                          ActionStatus.OK if before != replicas else ActionStatus.NOOP)

        def node_group() -> Action:
            args = {"nodes": target_nodes, "requested_nodes": nodes}
            self._maybe_fail(pool, model.name, CALL_RESIZE_NODE_GROUP, args)
            before = fleet.desired_nodes
            if before != target_nodes:
                fleet.set_desired_nodes(target_nodes, t)
            return Action(PROVIDER, CALL_RESIZE_NODE_GROUP, pool, model.name,
                          {**args, "previous_nodes": before},
                          ActionStatus.OK if before != target_nodes else ActionStatus.NOOP)

        steps = [deployment]
        if fleet.has_node_group:
            # Scale-out orders nodes before replicas; scale-in removes replicas before nodes.
            out = target_nodes > fleet.desired_nodes or (
                target_nodes == fleet.desired_nodes and replicas >= fleet.desired_replicas(model.name))
            steps = [node_group, deployment] if out else [deployment, node_group]
        done: list[Action] = []
        for step in steps:
            action = step()
            done.append(action)
            self.actions.append(action)
        return done

    def _maybe_fail(self, pool: str, model: str, call: str, args: Mapping[str, object]) -> None:
        queue = self._failures[pool]
        for i, f in enumerate(queue):
            if f.call is None or f.call == call:
                del queue[i]
                status = ActionStatus.FAILED_TRANSIENT if f.error.retryable else ActionStatus.FAILED_PERMANENT
                self.actions.append(Action(PROVIDER, call, pool, model, dict(args), status, error=str(f.error)))
                raise f.error

    # -- test and demo hooks ----------------------------------------------------------------------

    def inject_capacity_shortage(self, pool: str, start: datetime, duration_s: float) -> None:
        """From ``start`` for ``duration_s`` the pool cannot get new nodes (orders wait) and
        reports itself unavailable."""
        with self._lock:
            self.pool_provider(pool)  # raises for an unknown pool
            a = _to_seconds(self.epoch, start)
            self._fleets[pool].add_shortage(a, a + duration_s)
            self._fleets[pool].process(self._t)

    def inject_metrics_gap(self, start: datetime, duration_s: float) -> None:
        """From ``start`` for ``duration_s`` every signal reads as missing (a scrape outage)."""
        a = _to_seconds(self.epoch, start)
        with self._lock:
            self._metric_gaps.append((a, a + duration_s))

    def fail_next(self, pool: str, error: ProviderError, call: str | None = None) -> None:
        """The next matching call on ``pool`` (``call`` = ``resize_node_group`` or
        ``scale_deployment``; ``None`` = either) raises ``error`` without taking effect."""
        with self._lock:
            self.pool_provider(pool)
            self._failures[pool].append(_InjectedFailure(call, error))

    # -- inspection (demo output, tests) ----------------------------------------------------------

    def load_requests_per_s(self, model: str, now: datetime) -> float:
        """The arrival rate the load curve gives ``model`` at ``now`` (pure; no advance)."""
        return self._models[model].load.requests_per_s(_to_seconds(self.epoch, now))

    def totals(self, model: str) -> ModelTotals:
        with self._lock:
            m = self._models[model]
            return ModelTotals(m.arrived_total, m.served_total, m.queue)

    def cost_per_hour_usd(self, now: datetime | None = None) -> float:
        """What every node in the world costs per hour now (idle and provisioning ones included)."""
        with self._lock:
            self._advance_to(_to_seconds(self.epoch, now if now is not None else self.clock.now()))
            return sum(self._price(p, self._t) * len(f.nodes) for p, f in self._fleets.items())


class SimMetrics:
    """``MetricsSource`` over a ``SimWorld``."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        w = self.world
        with w._lock:
            w._advance_to(_to_seconds(w.epoch, now))
            return {m.name: w._observe_model(m.name, now) for m in models}


class SimPoolProvider:
    """``PoolProvider`` for one pool of a ``SimWorld``."""

    def __init__(self, world: SimWorld, pool: str) -> None:
        self.world = world
        self.pool: PoolSpec = world.pool_specs[pool]

    def state(self, model: ModelSpec, now: datetime) -> PoolState:
        w = self.world
        with w._lock:
            w._advance_to(_to_seconds(w.epoch, now))
            return w._pool_state(self.pool.name, model, now)

    def scale(self, model: ModelSpec, replicas: int, nodes: int, now: datetime) -> Sequence[Action]:
        w = self.world
        with w._lock:
            w._advance_to(_to_seconds(w.epoch, now))
            return w._scale(self.pool.name, model, replicas, nodes, now)


class SimPrices:
    """``PriceSource`` over a ``SimWorld``: live prices for its spot pools (others: static)."""

    def __init__(self, world: SimWorld) -> None:
        self.world = world

    def prices(self, pools: Sequence[PoolSpec], now: datetime) -> Mapping[str, float]:
        w = self.world
        with w._lock:
            w._advance_to(_to_seconds(w.epoch, now))
            return {p.name: w._price(p.name, w._t) for p in pools if p.name in w._spot_prices}


@dataclass(frozen=True)
class SimProviders:
    """Everything the daemon needs from a simulated world, wired to it."""

    metrics: SimMetrics
    pools: dict[str, PoolProvider]
    prices: SimPrices
    world: SimWorld = field(repr=False)


def build_simulated_providers(
    config: DaemonConfig,
    clock: Clock,
    *,
    start: datetime | None = None,
    initial_replicas: Mapping[str, Mapping[str, int]] | None = None,
) -> SimProviders:
    """Build a ``SimWorld`` for ``config`` on ``clock`` (see ``SimWorld`` for the arguments) and
    return its providers."""
    world = SimWorld(config, clock, start=start, initial_replicas=initial_replicas)
    pools: dict[str, PoolProvider] = dict(world.pool_providers)
    return SimProviders(metrics=world.metrics, pools=pools, prices=world.prices, world=world)

