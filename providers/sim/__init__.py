"""The simulated providers: the provider protocols over the one simulated world
(``controller.sim.world.World``, the ``Simulation`` that ``tidegate simulate`` runs), for the demo,
the tests and ``tidegate run`` with ``providers.type: simulated``.

Every call first moves the world to the ``now`` it was given (never backwards; an earlier ``now``
answers with the world's current state). ``SimMetrics`` answers the world's last scrape (every
signal of the table; cost per token is priced by the daemon, as with Prometheus), ``SimPoolProvider``
one pool (a Deployment per model, a node group for cloud pools), ``SimPrices`` the spot pools' live
prices. Build all at once with ``build_simulated_providers(config, clock)``.

Actions: ``scale`` makes one ``resize_node_group`` call (cloud pools; the group never goes below
``min_nodes``) and one ``scale_deployment`` call, nodes first on the way up and last on the way
down, each ``OK`` when it changed something and ``NOOP`` otherwise; ``actions`` logs the last
``ACTION_LOG_LIMIT`` calls (failures included). Test hooks: ``fail_next`` (the next call on a pool raises the given error
without effect) and the world's own (``inject_capacity_shortage``, ``inject_metrics_gap``,
``interrupt``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Mapping, Sequence

from controller.config import DaemonConfig
from controller.core.model import Action, ActionStatus, ModelSignals, ModelSpec, PoolSpec, PoolState
from controller.protocols import Clock, PermanentProviderError, PoolProvider, ProviderError
from controller.sim.world import DEFAULT_HORIZON_S, World

PROVIDER = "sim"
ACTION_LOG_LIMIT = 10_000
"""Calls the simulated providers remember (``SimProviders.actions``); older ones are dropped."""
CALL_RESIZE_NODE_GROUP = "resize_node_group"
CALL_SCALE_DEPLOYMENT = "scale_deployment"


@dataclass(slots=True)
class _InjectedFailure:
    call: str | None
    error: ProviderError


class SimMetrics:
    """``MetricsSource`` over the world: its last scrape per model."""

    def __init__(self, world: World) -> None:
        self.world = world

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        w = self.world
        with w.lock:
            w.advance(now)
            return {m.name: w.signals(m.name, now) for m in models}


class SimPrices:
    """``PriceSource`` over the world: the live prices of its spot pools (others: static)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def prices(self, pools: Sequence[PoolSpec], now: datetime) -> Mapping[str, float]:
        w = self.world
        with w.lock:
            w.advance(now)
            out = {p.name: w.price(p.name, now) for p in pools}
            return {n: v for n, v in out.items() if v is not None}


class SimPoolProvider:
    """``PoolProvider`` for one pool of the world."""

    def __init__(self, world: World, pool: str, actions: deque[Action]) -> None:
        self.world = world
        self.pool: PoolSpec = world.pool_specs[pool]
        self.actions = actions
        self.failures: list[_InjectedFailure] = []

    def _served(self, model: ModelSpec) -> None:
        if not self.world.serves(self.pool.name, model.name):
            raise PermanentProviderError(f"model {model.name!r} has no Deployment in pool {self.pool.name!r} "
                                         f"(it serves {sorted(self.world.models_in(self.pool.name))})")

    def state(self, model: ModelSpec, now: datetime) -> PoolState:
        w = self.world
        with w.lock:
            self._served(model)
            w.advance(now)
            return w.pool_state(self.pool.name, model.name, now)

    def scale(self, model: ModelSpec, replicas: int, nodes: int, now: datetime) -> Sequence[Action]:
        w, pool = self.world, self.pool
        with w.lock:
            self._served(model)
            if replicas < 0:
                raise PermanentProviderError(f"replicas must be >= 0, got {replicas} for {model.name}/{pool.name}")
            group = not pool.tier.is_onprem
            if group and not 0 <= nodes <= pool.max_nodes:
                raise PermanentProviderError(
                    f"nodes ({nodes}) must be between 0 and pool {pool.name!r} max_nodes ({pool.max_nodes})")
            w.advance(now)
            sim = w.sims[model.name]
            shared = len(w.models_in(pool.name)) > 1  # models do not share nodes: each holds its own
            target = max(pool.nodes_for(model, replicas) if shared else nodes, pool.min_nodes)

            def deployment() -> Action:
                self._maybe_fail(model.name, CALL_SCALE_DEPLOYMENT, {"replicas": replicas})
                before = sim.set_pool_replicas(pool.name, replicas)
                return Action(PROVIDER, CALL_SCALE_DEPLOYMENT, pool.name, model.name,
                              {"replicas": replicas, "previous_replicas": before},
                              ActionStatus.OK if before != replicas else ActionStatus.NOOP)

            def node_group() -> Action:
                args = {"nodes": target, "requested_nodes": nodes}
                self._maybe_fail(model.name, CALL_RESIZE_NODE_GROUP, args)
                before = sim.set_pool_nodes(pool.name, target)
                return Action(PROVIDER, CALL_RESIZE_NODE_GROUP, pool.name, model.name,
                              {**args, "previous_nodes": before},
                              ActionStatus.OK if before != target else ActionStatus.NOOP)

            steps = [deployment]
            if group:
                out = target > sim.pools[pool.name].want_nodes or (
                    target == sim.pools[pool.name].want_nodes and replicas >= sim.pools[pool.name].desired)
                steps = [node_group, deployment] if out else [deployment, node_group]
            done = []
            try:
                for step in steps:
                    done.append(step())
                    self.actions.append(done[-1])
            finally:
                if any(a.status is not ActionStatus.NOOP for a in done):
                    w.touched(model.name)  # settled and recomputed at the next read; a no-op changes nothing
            return done

    def _maybe_fail(self, model: str, call: str, args: Mapping[str, object]) -> None:
        for i, f in enumerate(self.failures):
            if f.call is None or f.call == call:
                del self.failures[i]
                status = ActionStatus.FAILED_TRANSIENT if f.error.retryable else ActionStatus.FAILED_PERMANENT
                self.actions.append(Action(PROVIDER, call, self.pool.name, model, dict(args), status, error=str(f.error)))
                raise f.error


@dataclass(frozen=True)
class SimProviders:
    """Everything the daemon needs from the simulated world, wired to it."""

    metrics: SimMetrics
    pools: dict[str, PoolProvider]
    prices: SimPrices
    world: World = field(repr=False)
    actions: deque[Action] = field(repr=False)
    """The last ``ACTION_LOG_LIMIT`` calls made through the pool providers, in order (NOOPs and
    failures included): bounded, so a daemon on the simulated world does not grow per tick."""

    def fail_next(self, pool: str, error: ProviderError, call: str | None = None) -> None:
        """The next matching call on ``pool`` (``call`` = ``resize_node_group`` or
        ``scale_deployment``; ``None`` = either) raises ``error`` without taking effect."""
        provider = self.pools.get(pool)
        if not isinstance(provider, SimPoolProvider):
            raise PermanentProviderError(f"no pool {pool!r} (pools: {sorted(self.pools)})")
        provider.failures.append(_InjectedFailure(call, error))


def build_simulated_providers(config: DaemonConfig, clock: Clock, *, start: datetime | None = None,
                              horizon_s: float = DEFAULT_HORIZON_S) -> SimProviders:
    """The world of ``config`` (epoch: ``start``, default the clock's now; load for ``horizon_s``)
    and its providers."""
    world = World(config, start if start is not None else clock.now(), horizon_s=horizon_s)
    actions: deque[Action] = deque(maxlen=ACTION_LOG_LIMIT)
    pools: dict[str, PoolProvider] = {p: SimPoolProvider(world, p, actions) for p in world.pool_specs}
    return SimProviders(metrics=SimMetrics(world), pools=pools, prices=SimPrices(world), world=world, actions=actions)


__all__ = ["ACTION_LOG_LIMIT", "CALL_RESIZE_NODE_GROUP", "CALL_SCALE_DEPLOYMENT", "PROVIDER", "SimMetrics", "SimPoolProvider",
           "SimPrices", "SimProviders", "World", "build_simulated_providers"]
