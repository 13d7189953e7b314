"""The simulator's event loop: a workload, a fleet of pools, and one controller, on a simulated clock.

What the world does, in the order a replica lives through it:

- A controller sets the desired replicas of each pool at its own interval: the daemon's
  ``controller.controller.Controller`` over this module's providers (``SimClock``, ``SimMetrics``,
  one ``SimPool`` per pool, a ``MemoryRecorder``), deciding with tidegate's ``decide`` or with a
  baseline's decision function (``Baseline``). Pods are created Pending and bound to ready nodes with free GPUs (TP GPUs per pod,
  never across nodes, fullest node first); a bound pod becomes ready ``cold_start_s`` later.
- Nodes: on-prem pools own ``max_nodes`` nodes from the start (each made when a pod first
  needs it, as the next of the pool's nodes in order, which binds exactly as if all were there). Cloud nodes are ordered either by
  the controller itself (``node_mode = "direct"``: tidegate and SkyServe resize node groups to
  the nodes the controller's ``scale`` asks for and release empty nodes at once) or by an emulated Kubernetes cluster-autoscaler (``"autoscaler"``:
  every ``ca_scan_interval_s`` it orders nodes for Pending pods and removes nodes empty for
  ``ca_unneeded_s``, the cluster-autoscaler defaults 10 s and 10 min). A node is schedulable
  ``provisioning_delay_s`` after it is ordered; on spot, the order fails while the spot model
  says the pool is out of capacity, and the pool reads as unavailable until capacity returns.
- Spot interruptions (``spot.SpotModel``): a notice, then the node vanishes ``notice_s`` later
  (AWS 120 s, GCP 30 s). Its pods' requests go back to the front of the gateway queue (the client
  retries) and the pods are recreated Pending in the same pool, as a Deployment does.
- Scale-in removes Pending pods first, then pods on noticed nodes, then starting ones (newest
  first), then ready pods on the emptiest nodes; ready pods drain (finish what they hold) first.

Requests: in *request* mode every request is routed from a FIFO gateway queue to the least-loaded
ready replica with room (``service.Replica``: continuous batching, KV reservation); a request that
waits longer than ``request_timeout_s`` in the gateway is dropped. In *fluid* mode (long rate
series) the same replicas are served as flows every ``fluid_step_s`` with ``service.FluidReplicaModel``
and the gateway backlog is a FIFO of per-step buckets. ``mode="auto"`` replays request traces
request by request and switches rate series to fluid when they would hold too many requests.

Observations: every ``scrape_interval_s`` a Prometheus-like scrape records the gauges (queue depth,
GPU utilization over the interval, request and token rates and p99 latency over the last
``rate_window_s``); controllers see the last scrape (as the daemon reads Prometheus) plus the live
pool state (as it reads Kubernetes and the clouds). Everything random is seeded: a run is a pure
function of its inputs and seed.

Cost: cloud nodes are billed from order to release (provisioning included); on-prem nodes at their
amortized price while they hold a pod (``onprem_cost="used"``) or all the time (``"always"``).
Controllers see the cost per million tokens the daemon shows: the Controller prices it
(``controller.core.pricing``) from the pools' replicas and the scraped token rate, with the function
the budget prices placements with. Billing stops at the end of the workload; requests still in
flight then are served to completion (up to ``drain_s``) for the latency figures.

Driven from outside: ``start()`` then ``advance_to(t)`` moves the same world for a clock that is
not the simulation's (the daemon's, over ``controller.sim.world`` and ``providers.sim``); a driver
that ticks at the world's tick marks makes the decisions ``run()`` makes
(``tests/integration/test_one_world.py``).

Layout, one concern per module, each class layered on the one before: ``state`` (the state and
the event heap), ``billing``, ``fleet`` (nodes, pods, node modes, spot), ``serving`` (requests and
flows), ``scrape`` (signals and pool states), ``results`` (timeline and summary), and this module's
``Simulation`` (the event loop, the tick, ``advance_to``) with the providers its ``Controller``
sees and ``Baseline``. ``setup`` holds the run's inputs, ``control`` the autoscaler slot, what a
baseline sees and the in-memory recorder, ``nodes`` the fleet's records, ``stats`` the percentile
and histograms.
"""

from __future__ import annotations

import heapq
import math
import time as _wall
from datetime import datetime
from functools import cached_property
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from controller.controller import Controller, DecisionFunction
from controller.core.model import Action, ActionStatus, Decision, History, ModelSignals, ModelSpec, PoolSpec, PoolState
from controller.core.policy import EffectivePolicy
from controller.sim.control import Autoscaler, DrivenFromOutside, MemoryRecorder, Observation
from controller.sim.nodes import INF, N_PROV, N_READY, P_STARTING
from controller.sim.results import Reporting, RunResult
from controller.sim.setup import DEFAULT_EPOCH, EngineOptions, SimSetup, SloTargets
from controller.sim.state import (
    EV_CA, EV_CAP, EV_CTRL, EV_FLUID, EV_NODE_GONE, EV_NODE_READY, EV_NOTICE, EV_POD_READY, EV_RECORD,
    EV_REPLICA, EV_SCRAPE,
)
from controller.sim.stats import percentile
from controller.sim.workload import RequestTrace

__all__ = [
    "DEFAULT_EPOCH", "Autoscaler", "Baseline", "DrivenFromOutside", "EngineOptions", "MemoryRecorder", "Observation",
    "RunResult", "SimSetup", "Simulation", "SloTargets", "percentile", "simulate",
]


class Baseline:
    """A baseline is a decision function of what it can see (``decide(now_s, obs)``: desired
    replicas per pool, or ``None`` to leave everything as it is), run by the same ``Controller``
    as tidegate. Subclasses set ``name``, ``interval_s``, ``node_mode`` and write ``initial`` and
    ``decide``."""

    name: str
    interval_s: float
    node_mode: Literal["direct", "autoscaler"]

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        raise NotImplementedError

    def decide(self, now_s: float, obs: Observation) -> Mapping[str, int] | None:
        raise NotImplementedError

    def controller(self, sim: "Simulation") -> Controller:
        model = sim.model
        return sim.controller_for(model, {n: sim.setup.pools[n] for n in model.pools},
                                  _BaselineDecision(self, sim), policy=None)


class _BaselineDecision:
    """A baseline's ``decide(now_s, obs)`` as a ``DecisionFunction``: the placement it returns
    becomes a ``Decision`` (``actuate`` unless it returned ``None``)."""

    def __init__(self, baseline: Baseline, sim: "Simulation") -> None:
        self.baseline = baseline
        self.sim = sim
        self.reason = f"Baseline:{baseline.name}"

    def __call__(self, *, model: ModelSpec, signals: ModelSignals, history: History, now: datetime,
                 **_: object) -> Decision:
        obs = self.sim.observation(signals)
        placement = self.baseline.decide(obs.now_s, obs)
        previous = dict(obs.desired_by_pool)
        placed = previous if placement is None else {n: int(v) for n, v in placement.items()}
        return Decision(model=model.name, at=now, current_replicas=sum(previous.values()),
                        replicas=sum(placed.values()), placement=placed, previous_placement=previous,
                        recommendations=(), trace=(), reason=self.reason, actuate=placement is not None,
                        cost_per_hour_usd=0.0, history=history)


class SimClock:
    """The simulated clock as the ``Clock`` protocol."""

    def __init__(self, sim: "Simulation") -> None:
        self.sim = sim

    def now(self) -> datetime:
        return self.sim._dt(self.sim.now)


class SimMetrics:
    """The simulated Prometheus as a ``MetricsSource``: the last scrape's samples."""

    def __init__(self, sim: "Simulation") -> None:
        self.sim = sim

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        sig = self.sim.signals()
        return {m.name: sig for m in models if m.name == sig.model}


class SimPool:
    """One simulated pool as a ``PoolProvider``: its live state, and ``scale`` setting the desired
    replicas (and, for controllers that manage nodes, the nodes to hold)."""

    def __init__(self, sim: "Simulation", pool: PoolSpec) -> None:
        self.sim = sim
        self.pool = pool

    def state(self, model: ModelSpec, now: datetime) -> PoolState:
        sim = self.sim
        cache = sim.obs_cache
        if cache is not None and sim.obs_at_s == sim.now and sim.obs_version == sim.version:
            return cache[0][self.pool.name]  # the tick's other pools: what ``_pool_views`` would return
        return sim._pool_views(now)[0][self.pool.name]

    def scale(self, model: ModelSpec, replicas: int, nodes: int, now: datetime) -> Sequence[Action]:
        before = self.sim.scale_pool(self.pool.name, replicas, nodes)
        if before is None:
            return ()
        return (Action(provider="simulated", call="scale", pool=self.pool.name, model=model.name,
                       arguments={"replicas": replicas, "nodes": nodes, "from": before}, status=ActionStatus.OK),)


class Simulation(Reporting):
    """One controller, one workload, one fleet: ``run()`` once, or ``start()`` and ``advance_to``
    for a driver outside (``DrivenFromOutside``). The concerns are layered classes of their own
    modules (``state`` -> ``billing`` -> ``fleet`` -> ``serving`` -> ``scrape`` -> ``results``);
    this one is the event loop and the controller's tick."""

    # The providers a Controller sees (its tick is built in _start, after the initial fleet), made
    # when first asked for: a world driven from outside (the daemon's, a run per model) never asks.

    @cached_property
    def clock(self) -> SimClock:
        return SimClock(self)

    @cached_property
    def metrics(self) -> SimMetrics:
        return SimMetrics(self)

    @cached_property
    def pool_providers(self) -> dict[str, SimPool]:
        return {name: SimPool(self, self.setup.pools[name]) for name in self.model.pools}

    @cached_property
    def recorder(self) -> MemoryRecorder:
        return MemoryRecorder()

    # ------------------------------------------------------------------ control
    def controller_for(self, model: ModelSpec, pools: Mapping[str, PoolSpec], decide: DecisionFunction,
                       policy: EffectivePolicy | None) -> Controller:
        """A ``Controller`` for ``model`` on ``pools`` over this simulation's providers."""
        policies: dict[str, EffectivePolicy] = {} if policy is None else {model.name: policy}
        return Controller(models={model.name: model}, pools=pools, clock=self.clock, metrics_source=self.metrics,
                          pool_providers={n: self.pool_providers[n] for n in model.pools}, recorder=self.recorder,
                          policies=lambda: policies, decide=decide, policy_required=policy is not None)

    def scale_pool(self, name: str, replicas: int, nodes: int) -> int | None:
        """A controller's ``scale`` of one pool: its desired replicas (clamped to what the pool
        can hold) and the nodes to hold. Returns the previous desired replicas if they changed."""
        pool = self.pools[name]
        self._actuated = True
        pool.want_nodes = nodes
        n = min(max(0, int(replicas)), pool.spec.max_nodes * pool.per_node)
        if n == pool.desired:
            return None
        before = pool.desired
        self.actions += 1
        self.action_log.append((self.now, name, before, n))
        self._set_desired(pool, n)
        return before

    def _settle(self, changed: bool) -> None:
        """After a controller scaled: nodes (direct mode), binding, dispatch."""
        if changed:
            self.decisions_changed += 1
        if not changed and self.applied_version == self.version:
            return  # nothing moved since the last reconciliation
        for pool in self.pools.values():
            if self.ctrl.node_mode == "direct":
                self._reconcile_nodes(pool)
            self._bind(pool)
        if self.mode == "requests":
            self._dispatch()
        self.applied_version = self.version

    def _tick(self) -> None:
        assert self.controller is not None
        self.decisions += 1
        actions = self.actions
        self._actuated = False
        self.controller.tick(self._dt(self.now))
        if self._actuated:
            self._settle(self.actions != actions)
        nxt = self.now + self.ctrl.interval_s
        if nxt < self.end_s:
            self._push(nxt, EV_CTRL)

    # ------------------------------------------------------------------ run
    def _initial_need(self) -> int:
        # The run starts from a fleet sized for the busiest minute of its first ten minutes (about
        # the provisioning plus cold-start lead of a cloud replica): the fleet a well-run service
        # would have had in place when the trace begins. Every controller starts from it, so no
        # one is scored on the accident of where the trace starts (a spike three minutes in that
        # no controller could have ordered capacity for).
        w = self.setup.workload
        horizon = min(600.0, max(self.end_s, 1.0))
        if isinstance(w, RequestTrace):
            head = w.arrival_s[: int(np.searchsorted(w.arrival_s, horizon))]
            per_min = np.bincount((head // 60.0).astype(np.int64)) if len(head) else np.zeros(1)
            rate = float(per_min.max()) / min(60.0, horizon)
        else:
            rates = w.head(horizon).rate_per_s
            rate = float(rates.max()) if len(rates) else 0.0
        ref = self.setup.reference_gpu()
        per = self.setup.rate_at_slo(ref)
        if rate <= 0:
            return 0
        return max(1, int(math.ceil(rate / per))) if per > 0 else 1

    def _onprem_fill(self, replicas: int) -> dict[str, int]:
        out = dict.fromkeys(self.pools, 0)
        for name, pool in self.pools.items():
            if pool.onprem and replicas > 0:
                out[name] = min(replicas, pool.spec.max_nodes * pool.per_node)
                replicas -= out[name]
        return out

    def _start(self) -> None:
        for pool in self.pools.values():
            if pool.onprem:  # ready from the start; made when a pod first needs one (Fleet._bind)
                pool.unmade = pool.spec.max_nodes
        equal = self.opt.initial_replicas
        init = self.ctrl.initial(self.setup, self._initial_need() if equal is None else equal)
        if equal is not None:
            init = self._onprem_fill(equal)
        for name, n in init.items():
            if name not in self.pools:
                continue
            pool = self.pools[name]
            n = min(max(0, int(n)), pool.spec.max_nodes * pool.per_node)
            if pool.spot is not None and not pool.onprem:
                cap = pool.spot.capacity_nodes(0.0)
                if cap is not None:
                    n = min(n, cap * pool.per_node)  # the warm fleet only holds what the cloud had
            self._set_desired(pool, n)
            pool.want_nodes = max(pool.spec.nodes_for(self.model, n), pool.spec.min_nodes) if pool.per_node > 0 else 0
            if not pool.onprem and pool.per_node > 0:
                need = max(-(-n // pool.per_node), pool.spec.min_nodes)  # a node group starts at its minimum
                for _ in range(need):
                    self._new_node(pool, 0.0, N_READY)
            self._bind(pool)
        # the initial fleet is warm: ready at time 0
        for pool in self.pools.values():
            for pod in pool.pods:
                if pod.state == P_STARTING:
                    pod.ready_s = 0.0
                    self._pod_ready(pod)
            pool.bill_t = 0.0
            self._bill(pool)
            if pool.spot is not None and (pool.spot.trace is not None or pool.spot.unavailable_windows):
                self._push(0.0, EV_CAP, pool)
        self.controller = self.ctrl.controller(self)
        self.started = True
        self._push(0.0, EV_SCRAPE)
        self._push(self.ctrl.interval_s, EV_CTRL)
        if self.opt.run_stats:  # a run without statistics keeps no timeline
            self._push(0.0, EV_RECORD)
        if self.ctrl.node_mode == "autoscaler":
            self._push(self.opt.ca_scan_interval_s, EV_CA)
        if self.mode == "fluid":
            self._push(0.0, EV_FLUID)

    def _want_progress(self) -> bool:
        if self.opt.progress is not None:
            return self.opt.progress
        # runs longer than a few seconds: many requests, or many decisions (a decide() is ~0.2 ms)
        return self.n_req > 200_000 or self.end_s / max(self.ctrl.interval_s, 1e-9) > 20_000

    def start(self) -> None:
        """Build the initial fleet and the first events (``run()`` does it; a driver outside calls
        it once before ``advance_to``)."""
        self._start()

    def run(self) -> RunResult:
        wall0 = _wall.perf_counter()
        self._start()
        bar = None
        if self._want_progress():
            from tqdm import tqdm
            bar = tqdm(total=int(self.end_s), unit="sim-s", desc=self.ctrl.name, leave=False, mininterval=0.5)
        last_bar = 0
        heap = self.heap
        arrivals = self.arrivals
        n_req = self.n_req
        hard_end = self.end_s + self.opt.drain_s
        while True:
            t_arr = arrivals[self.next_req] if self.next_req < n_req else INF
            t_ev = heap[0][0] if heap else INF
            if t_arr <= t_ev:
                if t_arr == INF:
                    break
                self._arrive(float(t_arr))
                continue
            if t_ev > hard_end:
                break
            t, _, kind, obj, ver = heapq.heappop(heap)
            self.now = t
            self._handle(t, kind, obj, ver)
            if bar is not None and self.now - last_bar >= 3600:
                bar.update(int(min(self.now, self.end_s)) - last_bar)
                last_bar = int(min(self.now, self.end_s))
            if self.now > self.end_s and self.mode == "requests" and not self.queue and self.completed + self.dropped >= n_req \
                    and self.next_req >= n_req:
                break
        if bar is not None:
            bar.update(max(0, int(self.end_s) - last_bar))
            bar.close()
        self.now = max(self.now, self.end_s)
        for pool in self.pools.values():
            self._bill(pool)
        summary, timeline = self._finish()
        return RunResult(self.ctrl.name, summary, timeline, _wall.perf_counter() - wall0, list(self.action_log))


    # ------------------------------------------------------------------ driven from outside
    def advance_to(self, target_s: float) -> None:
        """Move the world to ``target_s`` (seconds since the epoch; never backwards) for a driver
        outside it (``DrivenFromOutside``: the daemon's clock ticks the ``Controller``). Stops at a
        tick mark at exactly ``target_s`` before what comes after it at that instant, as ``run()``
        does when it ticks its own controller there: a driver that ticks at the marks sees what a
        ``run()`` controller sees. Scaling done at a mark settles (nodes, binding) when the world
        moves on or is read again, as after ``run()``'s tick (whose controller reads nothing after
        it scales); scaling between marks settles at once."""
        if not self.started:
            raise RuntimeError("advance_to before start()")
        if self._tick_at is not None:
            if target_s <= self._tick_at:
                if self._actuated:  # a read after scaling at the mark: what was asked is in place
                    self._settle(self.actions != self._tick_actions)
                    self._actuated = False
                    self._tick_actions = self.actions
                return
            self._end_tick()
        heap = self.heap
        while True:
            t_arr = self.arrivals[self.next_req] if self.next_req < self.n_req else INF
            t_ev = heap[0][0] if heap else INF
            if min(t_arr, t_ev) > target_s:
                break
            if t_arr <= t_ev:
                self._arrive(float(t_arr))
                continue
            t, _, kind, obj, ver = heapq.heappop(heap)
            self.now = t
            if kind != EV_CTRL:
                self._handle(t, kind, obj, ver)
                continue
            self._tick_at = t
            self._tick_actions = self.actions
            if t == target_s:
                return
            self._end_tick()  # a mark the driver did not tick at
        self.now = max(self.now, target_s)

    def _end_tick(self) -> None:
        """What ``_tick`` does after the controller's tick: settle, then the next mark."""
        assert self._tick_at is not None
        at, self._tick_at = self._tick_at, None
        if self._actuated:
            self._settle(self.actions != self._tick_actions)
        self._actuated = False
        if at + self.ctrl.interval_s < self.end_s:
            self._push(at + self.ctrl.interval_s, EV_CTRL)

    def set_pool_nodes(self, name: str, nodes: int) -> int:
        """The nodes a driver asks pool ``name`` to hold (direct node management); returns the
        previous ask."""
        pool = self.pools[name]
        before = pool.want_nodes
        pool.want_nodes = nodes
        self._scaled()
        return before

    def set_pool_replicas(self, name: str, replicas: int) -> int:
        """A driver's desired replicas of pool ``name`` (clamped to what it can hold); returns the
        previous desired count."""
        pool = self.pools[name]
        before = pool.desired
        n = min(max(0, int(replicas)), pool.spec.max_nodes * pool.per_node)
        if n != before:
            self.actions += 1
            self.action_log.append((self.now, name, before, n))
            self._set_desired(pool, n)
        self._scaled()
        return before

    def _scaled(self) -> None:
        self._actuated = True
        if self._tick_at is None:  # between marks: nothing else comes at this instant, settle now
            self._settle(True)
            self._actuated = False

    def _handle(self, t: float, kind: int, obj: Any, ver: int) -> None:
        """Apply one event of the heap at ``t`` (``self.now`` is ``t``)."""
        if kind == EV_REPLICA:
            self._replica_event(obj, ver)
        elif kind == EV_FLUID:
            self._fluid_step()
        elif kind == EV_SCRAPE:
            if t <= self.end_s:
                self._do_scrape()
        elif kind == EV_CTRL:
            self._tick()
        elif kind == EV_POD_READY:
            if obj.state == P_STARTING and obj.ready_s <= t + 1e-9:
                self._pod_ready(obj)
        elif kind == EV_NODE_READY:
            if obj.state == N_PROV:
                self.version += 1
                obj.state = N_READY
                obj.empty_since = t
                self._bind(obj.pool)
                if self.ctrl.node_mode == "direct":
                    self._reconcile_nodes(obj.pool)
        elif kind == EV_NOTICE:
            self._notice(obj)
        elif kind == EV_NODE_GONE:
            self._node_gone(obj)
        elif kind == EV_CAP:
            self._capacity_change(obj)
        elif kind == EV_CA:
            self._ca_scan()
            if t + self.opt.ca_scan_interval_s < self.end_s:
                self._push(t + self.opt.ca_scan_interval_s, EV_CA)
        elif kind == EV_RECORD:
            self._record()


def simulate(setup: SimSetup, autoscaler: Autoscaler) -> RunResult:
    """Run ``autoscaler`` on ``setup`` once."""
    return Simulation(setup, autoscaler).run()
