"""The controllers a simulation compares: tidegate itself, and what people use today.

Every one runs as the daemon's ``controller.controller.Controller`` over the simulation's providers,
at its own interval, on the same fleet, spot behaviour and service model. tidegate decides with
``controller.core.pipeline.decide``; a baseline (``engine.Baseline``) with its own decision
function, which returns desired replicas per pool from what it can see (the last Prometheus scrape
and the live pool states, ``engine.Observation``). Each baseline is an emulation of the published
algorithm with its published defaults, cited next to it, not a straw man:

``tidegate``        the daemon's tick exactly (the policy file's rules, stabilization, rate limits,
                    bounds, placement, budget; node sums, make before break), every
                    ``loop.interval_s``; it resizes node groups itself (``node_mode="direct"``).
``all-on-demand``   the same, restricted to the on-demand pools: the savings reference.
``hpa``             Kubernetes HPA v2 (``autoscaling/v2``) on GPU utilization, target 70 %:
                    ``pkg/controller/podautoscaler`` (``replica_calculator.go``: not-yet-ready pods
                    count as 0 % on scale-up and are set aside on scale-down; tolerance 0.1;
                    ``horizontal.go``: 15 s sync period, default behaviour scale-up max(100 %, 4
                    pods) per 15 s, scale-down 300 s stabilization and 100 % per 15 s). Pods land
                    on-prem first (existing nodes), then on spot (cheapest pool with capacity),
                    on-demand when spot is out (Karpenter-style spot-first with fallback); nodes by
                    an emulated cluster-autoscaler.
``keda``            KEDA ScaledObject with the Prometheus scaler on the pending requests (waiting
                    plus in flight, the queue metric users give it for Triton; threshold per
                    replica, AverageValue): the KEDA operator polls every 30 s
                    (``pollingInterval``) to activate from zero and deactivates after
                    ``cooldownPeriod`` 300 s without activity; between 1 and N the HPA it creates
                    scales on the same metric (15 s sync, HPA default behaviour). Same placement and
                    node provisioning as ``hpa``.
``seed-stack``      the hybrid-cloud Triton guides' setup: an on-prem Deployment under HPA on GPU
                    utilization (target 70 %) plus a cloud burst Deployment under KEDA on queue
                    length (threshold 50, min 0) on spot nodes only. Within the policy's bounds
                    like every controller: the on-prem HPA holds at least ``min_replicas`` (at most
                    what on-prem fits), the burst at most ``max_replicas`` less the on-prem part.
``skyserve``        SkyServe's ``FallbackRequestRateAutoscaler`` (``sky/serve/autoscalers.py``):
                    target = ceil(requests in the last 60 s / 60 / target_qps_per_replica), changed
                    only after 300 s (up) / 1200 s (down) of consecutive agreement at its 20 s
                    decision interval; spot replicas with dynamic on-demand fallback (on-demand
                    covers spot replicas not ready). On-prem capacity is used first as its cheapest
                    "cloud". It launches and terminates instances itself (``node_mode="direct"``).
``oracle``          knows the future load and the spot traces: for every moment it computes the
                    cheapest set of replicas that serves the arrivals of the next minute and of
                    every burst down to one second within the TTFT target (cheapest capacity per
                    request first), counts only spot capacity the trace holds from the order until
                    the moment of use, and orders it exactly provisioning delay plus cold start
                    ahead. It reaches ~99 % attainment on the shared traces; its cost is the lower
                    bound the others are measured against.
``schedule:FILE``   replays a recorded replica schedule (CSV ``t_s,target_replicas`` placed by
                    tidegate's placement, or ``t_s,<pool>,<pool>...`` per pool).
"""

from __future__ import annotations

import csv
import math
from datetime import datetime
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np

from controller.controller import Controller
from controller.core.capacity import capacity_of
from controller.core.model import Decision, ModelSpec, PoolSpec, PoolState, Tier
from controller.core.pipeline import decide
from controller.core.placement import place
from controller.core.policy import EffectivePolicy
from controller.core.pricing import replica_price
from controller.core.spec import Placement as PlacementSpec
from controller.sim.engine import Autoscaler, Baseline, Observation, Simulation, SimSetup
from controller.sim.workload import RequestTrace, rate_profile

BASELINES = ("seed-stack", "hpa", "keda", "skyserve", "all-on-demand", "oracle")
"""Names ``--baselines all`` expands to (``schedule:FILE`` is named explicitly)."""


def _capacity(spec: PoolSpec, model: ModelSpec) -> int:
    return spec.max_nodes * spec.replicas_per_node(model)


def _clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


# ---------------------------------------------------------------------------------------------
# tidegate
# ---------------------------------------------------------------------------------------------


class TidegateController:
    """The daemon's ``Controller`` on the simulated clock and providers: same ``decide``, same
    policy, same history threading, make-before-break and node sums; no overrides, never paused."""

    node_mode: Literal["direct", "autoscaler"] = "direct"

    def __init__(self, policy: EffectivePolicy, interval_s: float = 5.0, only_tiers: Iterable[Tier] | None = None,
                 name: str = "tidegate") -> None:
        self.policy = policy
        self.interval_s = interval_s
        self.name = name
        self.only_tiers = None if only_tiers is None else frozenset(only_tiers)
        self.model: ModelSpec | None = None
        self.pools: dict[str, PoolSpec] = {}
        self.reasons: Mapping[str, int] = {}
        """Decisions per reason code (filled by the run's recorder)."""
        self.capacity_log: list[tuple[float, float, float, float]] = []
        """(t_s, learned output tok/s per replica, the profile's for the same mix, scale) per
        decision whose capacity changed: what the learned capacity did over the run."""
        self._t0: datetime | None = None

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        model = setup.model
        pools = {n: setup.pools[n] for n in model.pools}
        if self.only_tiers is not None:
            keep = tuple(n for n in model.pools if pools[n].tier in self.only_tiers)
            if not keep:
                raise ValueError(f"{self.name}: the fleet has no pool of tier {sorted(k.value for k in self.only_tiers)}")
            model = ModelSpec(name=model.name, tp_degree=model.tp_degree, quantization=model.quantization,
                              gpu_types=model.gpu_types, cold_start_s=model.cold_start_s, capacity=model.capacity,
                              pools=keep)
            pools = {n: pools[n] for n in keep}
        self.model = model
        self.pools = pools
        b = self.policy.spec.bounds
        total = _clamp(need, b.min_replicas, b.max_replicas)
        states = {n: PoolState(pool=n, replicas=0, ready_replicas=0) for n in model.pools}
        res = place(model=model, pools=pools, states=states, total=total, placement=self.policy.spec.placement)
        return dict(res.replicas)

    def controller(self, sim: Simulation) -> Controller:
        assert self.model is not None
        self.reasons = sim.recorder.reasons
        self._t0 = sim.setup.epoch
        return sim.controller_for(self.model, self.pools, self._decide, self.policy)

    def _decide(self, **kw: Any) -> Decision:
        d = decide(**kw)
        learned = capacity_of(d)
        if learned is not None and self._t0 is not None:
            if not self.capacity_log or self.capacity_log[-1][1:] != learned:
                self.capacity_log.append(((d.at - self._t0).total_seconds(), *learned))
        return d

    def report(self) -> dict[str, object]:
        out: dict[str, object] = {"decision_reasons": dict(sorted(self.reasons.items(), key=lambda kv: -kv[1]))}
        if self.capacity_log:
            t, learned, prior, scale = self.capacity_log[-1]
            out["capacity"] = {"output_tokens_per_s": round(learned, 2), "profile_output_tokens_per_s": round(prior, 2),
                               "scale": round(scale, 4), "since_s": round(t, 1),
                               "log": [[round(x, 4) for x in row] for row in self.capacity_log]}
        return out


# ---------------------------------------------------------------------------------------------
# Kubernetes HPA (autoscaling/v2), emulated
# ---------------------------------------------------------------------------------------------


@dataclass
class HpaAlgorithm:
    """One HPA object's state machine (the parts of ``horizontal.go`` and
    ``replica_calculator.go`` that decide the replica count)."""

    min_replicas: int
    max_replicas: int
    tolerance: float = 0.1
    down_stabilization_s: float = 300.0
    up_stabilization_s: float = 0.0
    up_percent: float = 100.0
    up_pods: int = 4
    up_period_s: float = 15.0
    down_percent: float = 100.0
    down_period_s: float = 15.0
    recs: deque[tuple[float, int]] = field(default_factory=deque)
    events: deque[tuple[float, int]] = field(default_factory=deque)

    @staticmethod
    def pods_metric_replicas(current: int, ready: int, unready: int, value: float, target: float,
                             tolerance: float) -> int:
        """``calcPlainMetricReplicas`` for a per-pod average (e.g. GPU utilization): not-ready pods
        count as 0 when scaling up, are set aside when scaling down."""
        if ready <= 0:
            return current
        ratio = value / target
        if not (unready > 0 and ratio > 1.0):
            if abs(1.0 - ratio) <= tolerance:
                return current
            return int(math.ceil(ratio * ready))
        new_ratio = value * ready / (target * (ready + unready))
        if abs(1.0 - new_ratio) <= tolerance or (ratio > 1.0 and new_ratio < 1.0):
            return current
        n = int(math.ceil(new_ratio * (ready + unready)))
        return current if n < current else n

    @staticmethod
    def external_average_replicas(current: int, total: float, target_per_replica: float, tolerance: float) -> int:
        """``GetExternalMetricReplicas`` with an AverageValue target."""
        if current <= 0:
            return int(math.ceil(total / target_per_replica))
        ratio = total / (target_per_replica * current)
        if abs(1.0 - ratio) <= tolerance:
            return current
        return int(math.ceil(total / target_per_replica))

    def normalize(self, now_s: float, current: int, proposed: int) -> int:
        """Stabilization windows, rate limits, bounds (``normalizeDesiredReplicasWithBehaviors``)."""
        self.recs.append((now_s, proposed))
        keep = max(self.down_stabilization_s, self.up_stabilization_s)
        while self.recs and self.recs[0][0] < now_s - keep:
            self.recs.popleft()
        up = down = proposed
        for t, r in self.recs:
            if t >= now_s - self.up_stabilization_s:
                up = min(up, r)
            if t >= now_s - self.down_stabilization_s:
                down = max(down, r)
        rec = current
        if rec < up:
            rec = up
        if rec > down:
            rec = down
        # rate limits relative to the replicas at the start of each period
        while self.events and self.events[0][0] < now_s - max(self.up_period_s, self.down_period_s):
            self.events.popleft()
        if rec > current:
            added = sum(d for t, d in self.events if d > 0 and t > now_s - self.up_period_s)
            start = current - added
            limit = max(start + self.up_pods, int(math.ceil(start * (1 + self.up_percent / 100.0))))
            rec = min(rec, limit)
        elif rec < current:
            removed = -sum(d for t, d in self.events if d < 0 and t > now_s - self.down_period_s)
            start = current + removed
            limit = int(math.floor(start * (1 - self.down_percent / 100.0)))
            rec = max(rec, limit)
        rec = _clamp(rec, self.min_replicas, self.max_replicas)
        if rec != current:
            self.events.append((now_s, rec - current))
        return rec


class SpotFirst:
    """Where a Kubernetes Deployment's pods land with spot-first node provisioning (Karpenter-like):
    existing pods stay; new pods go on-prem while it has room, then to the cheapest spot pool with
    capacity, then on-demand; pods stuck Pending in a pool that cannot launch are re-created in the
    next option; scale-in removes the newest capacity first (on-demand, spot, on-prem)."""

    def __init__(self, model: ModelSpec, pools: Sequence[PoolSpec], allow: Iterable[Tier] | None = None) -> None:
        tiers = None if allow is None else frozenset(allow)
        self.model = model
        self.pools = [p for p in pools if p.replicas_per_node(model) > 0 and (tiers is None or p.tier in tiers)]
        self.order = sorted(self.pools, key=lambda p: (p.tier.rank, replica_price(p, model), p.priority, p.name))

    def place(self, total: int, current: Mapping[str, int], pending: Mapping[str, int],
              states: Mapping[str, PoolState]) -> dict[str, int]:
        cur = {p.name: int(current.get(p.name, 0)) for p in self.pools}
        for p in self.pools:
            st = states.get(p.name)
            if st is not None and not st.available and pending.get(p.name, 0) > 0:
                cur[p.name] -= min(cur[p.name], pending[p.name])
        have = sum(cur.values())
        if total > have:
            need = total - have
            for p in self.order:
                st = states.get(p.name)
                if st is not None and not st.available:
                    continue
                room = _capacity(p, self.model) - cur[p.name]
                take = min(room, need)
                if take > 0:
                    cur[p.name] += take
                    need -= take
                if need == 0:
                    break
        elif total < have:
            extra = have - total
            for p in reversed(self.order):
                take = min(cur[p.name], extra)
                cur[p.name] -= take
                extra -= take
                if extra == 0:
                    break
        return cur


def _fresh(obs: Observation, name: str, max_age_s: float = 120.0) -> float | None:
    sample = getattr(obs.signals, name)
    return sample.fresh(obs.at, max_age_s)


class HpaController(Baseline):
    """``hpa``: one Deployment across all pools under HPA on GPU utilization."""

    node_mode: Literal["direct", "autoscaler"] = "autoscaler"

    def __init__(self, min_replicas: int, max_replicas: int, target_util_pct: float = 70.0, sync_s: float = 15.0,
                 name: str = "hpa") -> None:
        self.name = name
        self.interval_s = sync_s
        self.target = target_util_pct
        self.hpa = HpaAlgorithm(min_replicas=min_replicas, max_replicas=max_replicas)
        self.placer: SpotFirst | None = None

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        self.placer = SpotFirst(setup.model, setup.model_pools())
        n = _clamp(need, self.hpa.min_replicas, self.hpa.max_replicas)
        return self.placer.place(n, {}, {}, {})

    def decide(self, now_s: float, obs: Observation) -> Mapping[str, int] | None:
        assert self.placer is not None
        current = sum(obs.desired_by_pool.values())
        ready = sum(obs.ready_by_pool.values())
        pending = sum(obs.pending_by_pool.values())
        unready = max(0, current - ready - pending)
        util = _fresh(obs, "gpu_utilization_pct")
        if util is None or current == 0:
            proposed = current  # no metrics: the HPA cannot compute and leaves the scale alone
        else:
            proposed = HpaAlgorithm.pods_metric_replicas(current, ready, unready, util, self.target, self.hpa.tolerance)
        total = self.hpa.normalize(now_s, current, proposed)
        return self.placer.place(total, obs.desired_by_pool, obs.pending_by_pool, obs.signals.pools)


class KedaScaledObject:
    """A KEDA ScaledObject on one external metric: activation/deactivation by the operator at the
    polling interval, 1..N by the HPA KEDA creates (external metric, AverageValue)."""

    def __init__(self, min_replicas: int, max_replicas: int, threshold: float, polling_s: float = 30.0,
                 cooldown_s: float = 300.0, activation_threshold: float = 0.0) -> None:
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.threshold = threshold
        self.polling_s = polling_s
        self.cooldown_s = cooldown_s
        self.activation = activation_threshold
        self.hpa = HpaAlgorithm(min_replicas=max(1, min_replicas), max_replicas=max_replicas)
        self.last_active_s = 0.0  # the workload was running when the simulation starts
        self.next_poll_s = 0.0

    def step(self, now_s: float, current: int, metric: float | None) -> int:
        target = current
        if now_s + 1e-9 >= self.next_poll_s:
            self.next_poll_s = (math.floor(now_s / self.polling_s + 1e-9) + 1) * self.polling_s
            active = metric is not None and metric > self.activation
            if active:
                self.last_active_s = now_s
                if current == 0:
                    return max(1, self.min_replicas)
            elif current > self.min_replicas and self.min_replicas == 0 and now_s - self.last_active_s >= self.cooldown_s:
                return 0
        if current == 0:
            return 0  # the HPA does not act on a workload scaled to zero
        if metric is None:
            return current
        proposed = HpaAlgorithm.external_average_replicas(current, metric, self.threshold, self.hpa.tolerance)
        target = self.hpa.normalize(now_s, current, proposed)
        return target


class KedaController(Baseline):
    """``keda``: one Deployment across all pools under a KEDA ScaledObject on the queue depth."""

    node_mode: Literal["direct", "autoscaler"] = "autoscaler"

    def __init__(self, min_replicas: int, max_replicas: int, threshold: float = 50.0, polling_s: float = 30.0,
                 cooldown_s: float = 300.0, hpa_sync_s: float = 15.0, name: str = "keda") -> None:
        self.name = name
        # the HPA syncs every 15 s; the KEDA operator's 30 s poll falls on every other sync
        self.interval_s = hpa_sync_s
        self.so = KedaScaledObject(min_replicas, max_replicas, threshold, polling_s, cooldown_s)
        self.placer: SpotFirst | None = None

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        self.placer = SpotFirst(setup.model, setup.model_pools())
        n = _clamp(need, self.so.min_replicas, self.so.max_replicas)
        return self.placer.place(n, {}, {}, {})

    def decide(self, now_s: float, obs: Observation) -> Mapping[str, int] | None:
        assert self.placer is not None
        current = sum(obs.desired_by_pool.values())
        total = self.so.step(now_s, current, obs.pending_requests)
        return self.placer.place(total, obs.desired_by_pool, obs.pending_by_pool, obs.signals.pools)


class SeedStackController(Baseline):
    """``seed-stack``: on-prem Deployment under HPA (GPU util 70 %, 2..10) + spot burst Deployment
    under KEDA (queue length 50 per replica, 0..30). Both share the traffic (one Service)."""

    node_mode: Literal["direct", "autoscaler"] = "autoscaler"

    def __init__(self, onprem_min: int = 2, onprem_max: int = 10, target_util_pct: float = 70.0,
                 burst_min: int = 0, burst_max: int = 30, queue_threshold: float = 50.0, max_total: int | None = None,
                 polling_s: float = 30.0, cooldown_s: float = 300.0, sync_s: float = 15.0, name: str = "seed-stack") -> None:
        self.name = name
        self.interval_s = sync_s
        self.target = target_util_pct
        self.hpa = HpaAlgorithm(min_replicas=onprem_min, max_replicas=onprem_max)
        self.keda = KedaScaledObject(burst_min, burst_max, queue_threshold, polling_s, cooldown_s)
        self.max_total = max_total
        """The policy's ``max_replicas``: the burst holds at most this less the on-prem part."""
        self.onprem: list[str] = []
        self.burst: SpotFirst | None = None

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        self.onprem = [p.name for p in setup.model_pools() if p.tier.is_onprem]
        if not self.onprem:
            raise ValueError("seed-stack needs an on-prem pool")
        spot = [p for p in setup.model_pools() if p.tier.is_spot]
        self.burst = SpotFirst(setup.model, spot)
        out = {p.name: 0 for p in setup.model_pools()}
        out[self.onprem[0]] = _clamp(need, self.hpa.min_replicas, self.hpa.max_replicas)
        if self.keda.min_replicas > 0:
            out.update(self.burst.place(self.keda.min_replicas, {}, {}, {}))
        return out

    def decide(self, now_s: float, obs: Observation) -> Mapping[str, int] | None:
        assert self.burst is not None
        d = obs.desired_by_pool
        # on-prem HPA (its own Deployment's pods)
        op = self.onprem[0]
        cur_op = d.get(op, 0)
        ready_op = obs.ready_by_pool.get(op, 0)
        pend_op = obs.pending_by_pool.get(op, 0)
        util = _fresh(obs, "gpu_utilization_pct")
        if util is None or cur_op == 0:
            proposed = cur_op
        else:
            proposed = HpaAlgorithm.pods_metric_replicas(cur_op, ready_op, max(0, cur_op - ready_op - pend_op), util,
                                                         self.target, self.hpa.tolerance)
        new_op = self.hpa.normalize(now_s, cur_op, proposed)
        # burst KEDA on queue length
        burst_names = [p.name for p in self.burst.pools]
        cur_b = sum(d.get(n, 0) for n in burst_names)
        q = _fresh(obs, "queue_depth")
        new_b = self.keda.step(now_s, cur_b, q)
        if self.max_total is not None:
            new_b = max(0, min(new_b, self.max_total - new_op))
        out = dict(d)
        out[op] = new_op
        out.update(self.burst.place(new_b, {n: d.get(n, 0) for n in burst_names}, obs.pending_by_pool, obs.signals.pools))
        return out


# ---------------------------------------------------------------------------------------------
# SkyServe
# ---------------------------------------------------------------------------------------------


class SkyServeController(Baseline):
    """``skyserve``: ``FallbackRequestRateAutoscaler`` with ``dynamic_ondemand_fallback``."""

    node_mode: Literal["direct", "autoscaler"] = "direct"

    def __init__(self, min_replicas: int, max_replicas: int, target_qps_per_replica: float,
                 upscale_delay_s: float = 300.0, downscale_delay_s: float = 1200.0, decision_interval_s: float = 20.0,
                 qps_window_s: float = 60.0, name: str = "skyserve") -> None:
        if target_qps_per_replica <= 0:
            raise ValueError("skyserve needs target_qps_per_replica > 0")
        self.name = name
        self.interval_s = decision_interval_s
        self.min = min_replicas
        self.max = max_replicas
        self.qps_target = target_qps_per_replica
        self.window_s = qps_window_s
        self.up_periods = int(upscale_delay_s / decision_interval_s)
        self.down_periods = int(downscale_delay_s / decision_interval_s)
        self.up_counter = 0
        self.down_counter = 0
        self.target = min_replicas
        self.onprem: list[PoolSpec] = []
        self.spot: SpotFirst | None = None
        self.ondemand: SpotFirst | None = None
        self.model: ModelSpec | None = None

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        self.model = setup.model
        pools = setup.model_pools()
        self.onprem = [p for p in pools if p.tier.is_onprem and p.replicas_per_node(setup.model) > 0]
        self.spot = SpotFirst(setup.model, pools, allow=(Tier.SPOT,))
        self.ondemand = SpotFirst(setup.model, pools, allow=(Tier.ONDEMAND,))
        self.target = _clamp(need, self.min, self.max)
        return self._split(self.target, {}, {}, {}, ready_spot=None)

    def _qps_target(self, qps: float) -> int:
        return _clamp(int(math.ceil(qps / self.qps_target)), self.min, self.max)

    def _hysteresis(self, qps: float) -> None:
        t = self._qps_target(qps)
        if self.target == 0:
            self.target = t
        elif t > self.target:
            self.up_counter += 1
            self.down_counter = 0
            if self.up_counter >= self.up_periods:
                self.up_counter = 0
                self.target = t
        elif t < self.target:
            self.down_counter += 1
            self.up_counter = 0
            if self.down_counter >= self.down_periods:
                self.down_counter = 0
                self.target = t
        else:
            self.up_counter = self.down_counter = 0

    def _split(self, n: int, current: Mapping[str, int], pending: Mapping[str, int],
               states: Mapping[str, PoolState], ready_spot: int | None) -> dict[str, int]:
        assert self.model is not None and self.spot is not None and self.ondemand is not None
        out: dict[str, int] = {}
        left = n
        for p in self.onprem:
            k = min(left, _capacity(p, self.model))
            out[p.name] = k
            left -= k
        spot_cur = {p.name: current.get(p.name, 0) for p in self.spot.pools}
        out.update(self.spot.place(left, spot_cur, pending, states))
        spot_target = left
        ready = spot_target if ready_spot is None else ready_spot
        od = max(0, spot_target - ready)
        od_cur = {p.name: current.get(p.name, 0) for p in self.ondemand.pools}
        out.update(self.ondemand.place(od, od_cur, pending, states))
        return out

    def decide(self, now_s: float, obs: Observation) -> Mapping[str, int] | None:
        assert self.spot is not None
        qps = obs.requests_in_window / self.window_s
        self._hysteresis(qps)
        ready_spot = sum(obs.ready_by_pool.get(p.name, 0) for p in self.spot.pools)
        return self._split(self.target, obs.desired_by_pool, obs.pending_by_pool, obs.signals.pools, ready_spot)


# ---------------------------------------------------------------------------------------------
# Oracle
# ---------------------------------------------------------------------------------------------


def _forward_max(x: np.ndarray, width: int) -> np.ndarray:
    """``out[i] = max(x[i : i + width + 1])`` (the window clipped at the end), for non-negative
    ``x``, by doubling (sparse-table style)."""
    n = len(x)
    if n == 0 or width <= 0:
        return x.copy()
    length = width + 1
    pad = np.concatenate([x, np.zeros(length, dtype=x.dtype)])
    cur = pad
    span = 1
    while span * 2 <= length:
        nxt = cur.copy()
        nxt[:-span] = np.maximum(cur[:-span], cur[span:])
        cur = nxt
        span *= 2
    return np.maximum(cur[:n], cur[length - span: length - span + n])


def _backward_min(x: np.ndarray, width: int) -> np.ndarray:
    """``out[i] = min(x[max(0, i - width) : i + 1])``, for non-negative ``x``."""
    if width <= 0 or len(x) == 0:
        return x.copy()
    big = int(x.max()) + 1
    return big - _forward_max((big - x)[::-1], width)[::-1]


def work_per_bin(setup: SimSetup, g: float, n: int) -> np.ndarray:
    """Arrivals per bin of ``g`` seconds, weighted by prefill work (average request = 1)."""
    w = setup.workload
    if isinstance(w, RequestTrace):
        prof = setup.profiles[setup.pools[setup.model.pools[0]].gpu_type]
        p = w.prompt_tokens.astype(np.float64)
        work = prof.prefill_ms_per_token * p + prof.prefill_ms_per_token_sq * p * p
        weight = work / work.mean() if len(work) and work.mean() > 0 else np.ones(len(p))
        idx = np.minimum((w.arrival_s / g).astype(np.int64), n - 1)
        return np.bincount(idx, weights=weight, minlength=n)[:n]
    return rate_profile(w, g, n * g) * g


def demand_parts(setup: SimSetup, interval_s: float, *, window_s: float = 60.0,
                 burst_windows_s: Sequence[float] = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0), fine_s: float = 1.0,
                 burst_utilization: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    """The two parts of :func:`burst_demand`, per interval of ``interval_s`` seconds: the next
    minute's arrival rate (requests/s, each weighted by its prefill work) and the reference
    (first on-prem) GPU type's replicas that absorb every burst window ``W`` starting in the
    interval within ``W`` plus the TTFT target at ``burst_utilization`` of a replica's maximum
    rate. Intervals ``ceil(span / interval_s) + 2`` (the last two past the end)."""
    g = interval_s
    n = int(math.ceil(setup.span_s / g)) + 2
    # demand on a fine grid (bursts shorter than a tick matter), then the max over each tick
    sub = max(1, int(round(g / fine_s)))
    fine = g / sub
    nf = n * sub
    counts = work_per_bin(setup, fine, nf)
    c0 = np.concatenate([[0.0], np.cumsum(counts)])

    def arrivals(width_bins: int) -> np.ndarray:
        hi = np.minimum(np.arange(nf) + width_bins, nf)
        return c0[hi] - c0[:nf]

    per = max(1, int(round(window_s / fine)))
    sustained = arrivals(per) / (per * fine)                  # requests/s over the next minute
    r_max_ref = setup.fluid_model(setup.reference_gpu()).max_rate_per_s
    burst = np.zeros(nf)
    if r_max_ref > 0:
        ttft = setup.slo.ttft_s
        for wsec in burst_windows_s:
            k = max(1, int(round(wsec / fine)))
            need_rate = arrivals(k) / (k * fine + ttft)        # requests/s to finish the burst in time
            burst = np.maximum(burst, need_rate)
        burst /= burst_utilization * r_max_ref                # replicas
    return sustained.reshape(n, sub).max(axis=1), burst.reshape(n, sub).max(axis=1)


def burst_demand(setup: SimSetup, interval_s: float, *, window_s: float = 60.0,
                 burst_windows_s: Sequence[float] = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0), fine_s: float = 1.0,
                 burst_utilization: float = 0.6) -> np.ndarray:
    """The capacity each interval of ``interval_s`` seconds needs, in requests/s at the SLO on the
    reference (first on-prem) GPU type, one replica on its own (``SimSetup.rate_at_slo``): the
    larger of the next minute's arrival rate and the burst replicas of :func:`demand_parts` at
    that rate (see ``OracleController``). Intervals ``ceil(span / interval_s) + 2``."""
    sustained, burst = demand_parts(setup, interval_s, window_s=window_s, burst_windows_s=burst_windows_s,
                                    fine_s=fine_s, burst_utilization=burst_utilization)
    r_slo_ref = setup.rate_at_slo(setup.reference_gpu())
    if r_slo_ref <= 0:
        return sustained
    return np.maximum(sustained, burst * r_slo_ref)


class OracleController(Baseline):
    """``oracle``: future-aware, cheapest-capacity-first, just in time (see the module doc).

    Demand at ``t`` is the larger of (a) the next minute's arrival rate, to be served at the
    per-replica rate that meets the SLO, and (b) for every burst window ``W`` of 5-60 s starting at
    ``t`` (on a 1 s grid), the work arriving in it, to be done within ``W`` plus the TTFT target at 80 % of a
    replica's maximum rate (what absorbing the burst inside the SLO takes). Work is counted in
    "average requests": a request weighs its prompt's prefill time over the mean's, so a burst of
    long prompts counts for more. Each pool's replicas are ordered provisioning delay plus cold start
    (plus one tick) ahead and kept while they will be needed again within that lead; a spot pool
    counts only the nodes its trace holds over that whole lead (a launch into an empty market
    fails, a node taken back before use is lost), the rest falls to the next cheapest pool.

    ``burst_utilization`` 0.6: the largest value (of 0.8, 0.6, 0.5, 0.4) at which the oracle meets
    99 % attainment on both shared traces (Azure code hour: 0.8 -> 92.8 %, 0.6 -> 99.1 %; rate
    series day: 0.8 -> 97.4 %, 0.6 -> 99.6 %): sub-second arrival clumps queue on a replica, and
    batching at 80 % of its maximum rate leaves no room for them inside a 1.5 s TTFT. The largest
    such value is the cheapest schedule of this shape that keeps the SLO.
    """

    node_mode: Literal["direct", "autoscaler"] = "direct"

    def __init__(self, interval_s: float = 5.0, window_s: float = 60.0,
                 burst_windows_s: Sequence[float] = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0), fine_s: float = 1.0,
                 burst_utilization: float = 0.6, name: str = "oracle") -> None:
        self.name = name
        self.fine_s = fine_s
        self.burst_utilization = burst_utilization
        self.interval_s = interval_s
        self.window_s = window_s
        self.burst_windows_s = tuple(burst_windows_s)
        self.plan: dict[str, np.ndarray] = {}

    def _build(self, setup: SimSetup) -> None:
        g = self.interval_s
        demand = burst_demand(setup, g, window_s=self.window_s, burst_windows_s=self.burst_windows_s,
                              fine_s=self.fine_s, burst_utilization=self.burst_utilization)
        n = len(demand)
        model = setup.model
        pools = setup.model_pools()
        t = np.arange(n) * g
        rows = []
        for p in pools:
            per_node = p.replicas_per_node(model)
            if per_node <= 0:
                continue
            r = setup.rate_at_slo(p.gpu_type)
            if r <= 0:
                continue
            cap = np.full(n, p.max_nodes * per_node, dtype=np.int64)
            sm = setup.spot.get(p.name)
            if sm is not None and (sm.trace is not None or sm.unavailable_windows):
                cap = np.minimum(cap, self._cap_fast(sm, t, p.max_nodes) * per_node)
            lead = (0.0 if p.tier.is_onprem else p.provisioning_delay_s) + model.cold_start_s + g
            if sm is not None and (sm.trace is not None or sm.unavailable_windows):
                # a replica serving at t was ordered at t - lead and must survive until t: only
                # capacity the cloud holds over that whole span counts (a launch into an empty
                # market fails, and a node the trace takes back in between is lost)
                cap = _backward_min(cap, int(math.ceil(lead / g)))
            cost_per_req = replica_price(p, model) / r
            rows.append((cost_per_req, p.tier.rank, p.name, r, cap, lead))
        rows.sort(key=lambda x: (x[0], x[1], x[2]))
        remaining = demand.copy()
        plan: dict[str, np.ndarray] = {}
        for _, _, name, r, cap, lead in rows:
            take = np.minimum(cap, np.ceil(np.maximum(remaining, 0.0) / r - 1e-9).astype(np.int64))
            remaining = remaining - take * r
            plan[name] = _forward_max(take, int(math.ceil(lead / g)))
        for p in pools:
            plan.setdefault(p.name, np.zeros(n, dtype=np.int64))
        self.plan = plan

    @staticmethod
    def _cap_fast(sm: object, t: np.ndarray, max_nodes: int) -> np.ndarray:
        from controller.sim.spot import SpotModel
        assert isinstance(sm, SpotModel)
        out = np.full(len(t), max_nodes, dtype=np.int64)
        if sm.trace is not None:
            tr = sm.trace
            tt = t % tr.period_s
            idx = np.maximum(np.searchsorted(tr.times_s, tt, side="right") - 1, 0)
            out = np.floor(tr.fraction[idx] * sm.scale_nodes + 1e-9).astype(np.int64)
        for a, b in sm.unavailable_windows:
            out[(t >= a) & (t < b)] = 0
        return out

    def _at(self, now_s: float) -> dict[str, int]:
        i = int(now_s // self.interval_s)
        return {name: int(arr[min(i, len(arr) - 1)]) for name, arr in self.plan.items()}

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        self._build(setup)
        return self._at(0.0)

    def decide(self, now_s: float, obs: Observation) -> Mapping[str, int] | None:
        return self._at(now_s)


# ---------------------------------------------------------------------------------------------
# Recorded schedules
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedSchedule:
    times_s: np.ndarray
    total: np.ndarray | None
    per_pool: dict[str, np.ndarray]

    def at(self, t_s: float) -> int | dict[str, int]:
        i = max(0, int(np.searchsorted(self.times_s, t_s, side="right")) - 1)
        if self.total is not None:
            return int(self.total[i])
        return {k: int(v[i]) for k, v in self.per_pool.items()}


def read_schedule(path: str | Path, pools: Iterable[str]) -> RecordedSchedule:
    """``t_s,target_replicas`` (a total, placed by tidegate's placement) or ``t_s,<pool>,...``."""
    path = Path(path)
    known = set(pools)
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows or len(rows[0]) < 2 or rows[0][0].strip() != "t_s":
        raise ValueError(f"{path}: expected a header 't_s,target_replicas' or 't_s,<pool>,...'")
    header = [h.strip() for h in rows[0]]
    data = [r for r in rows[1:] if r and any(x.strip() for x in r)]
    if not data:
        raise ValueError(f"{path}: no rows")
    try:
        arr = np.array([[float(x) for x in r] for r in data])
    except ValueError as e:
        raise ValueError(f"{path}: non-numeric value: {e}") from e
    order = np.argsort(arr[:, 0], kind="stable")
    arr = arr[order]
    if (arr[:, 1:] < 0).any():
        raise ValueError(f"{path}: negative replica counts")
    if header[1:] == ["target_replicas"] or header[1:] == ["replicas"]:
        return RecordedSchedule(arr[:, 0], arr[:, 1].astype(np.int64), {})
    unknown = [h for h in header[1:] if h not in known]
    if unknown:
        raise ValueError(f"{path}: columns {unknown} are not pools of the model (pools: {sorted(known)})")
    return RecordedSchedule(arr[:, 0], None, {h: arr[:, i + 1].astype(np.int64) for i, h in enumerate(header[1:])})


class ScheduleController(Baseline):
    """``schedule:FILE``: a recorded replica schedule on the same fleet, placement and service."""

    node_mode: Literal["direct", "autoscaler"] = "direct"

    def __init__(self, path: str | Path, interval_s: float = 5.0, placement: PlacementSpec | None = None) -> None:
        self.path = Path(path)
        self.name = f"schedule:{self.path.name}"
        self.interval_s = interval_s
        self.placement = placement or PlacementSpec()
        self.sched: RecordedSchedule | None = None
        self.model: ModelSpec | None = None
        self.pools: dict[str, PoolSpec] = {}

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        self.model = setup.model
        self.pools = {n: setup.pools[n] for n in setup.model.pools}
        self.sched = read_schedule(self.path, self.pools)
        states = {n: PoolState(pool=n, replicas=0, ready_replicas=0) for n in self.pools}
        return self._place(self.sched.at(0.0), states)

    def _place(self, value: int | dict[str, int], states: Mapping[str, PoolState]) -> dict[str, int]:
        assert self.model is not None
        if isinstance(value, dict):
            return {n: value.get(n, 0) for n in self.pools}
        res = place(model=self.model, pools=self.pools, states=states, total=value, placement=self.placement)
        return dict(res.replicas)

    def decide(self, now_s: float, obs: Observation) -> Mapping[str, int] | None:
        assert self.sched is not None
        return self._place(self.sched.at(now_s), obs.signals.pools)


# ---------------------------------------------------------------------------------------------
# Building controllers by name
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BaselineSettings:
    """Knobs shared by the baselines (the defaults are the published ones)."""

    min_replicas: int = 1
    max_replicas: int = 10
    hpa_target_util_pct: float = 70.0
    keda_queue_threshold: float = 50.0
    """``keda``'s target pending requests (waiting plus in flight) per replica."""
    seed_target_util_pct: float = 70.0
    seed_queue_threshold: float = 50.0
    """``seed-stack``: its on-prem HPA's GPU-utilization target and its burst KEDA's queue length."""
    keda_min_replicas: int | None = None
    """``keda`` baseline's minReplicaCount (default: ``min_replicas``; KEDA's own default is 0)."""
    skyserve_target_qps: float | None = None
    """Requests/s per replica for SkyServe (default: the bundle's capacity profile requests_per_s; for a mix-free profile, the rate one replica sustains at the SLO for the workload's mix)."""
    tidegate_interval_s: float = 5.0
    max_cost_per_hour_usd: float | None = None
    """The policy's budget ceiling, for every baseline too (equal terms): a placement above it
    loses replicas from its dearest pools (per replica) until it fits, as tidegate's budget stage
    caps its own."""


class BudgetCapped(Baseline):
    """A baseline whose every placement is held under ``max_cost_per_hour_usd`` (nodes it needs,
    at their pools' prices): what a cost ceiling wrapped around any autoscaler does."""

    def __init__(self, inner: Baseline, max_cost_per_hour_usd: float) -> None:
        self.inner = inner
        self.name = inner.name
        self.interval_s = inner.interval_s
        self.node_mode = inner.node_mode
        self.cap = max_cost_per_hour_usd
        self.model: ModelSpec | None = None
        self.pools: dict[str, PoolSpec] = {}

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)  # the inner baseline's own state (tests read it)

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        self.model = setup.model
        self.pools = {n: setup.pools[n] for n in setup.model.pools}
        return self._fit(self.inner.initial(setup, need))

    def decide(self, now_s: float, obs: Observation) -> Mapping[str, int] | None:
        out = self.inner.decide(now_s, obs)
        return None if out is None else self._fit(out)

    def _cost(self, placement: Mapping[str, int]) -> float:
        assert self.model is not None
        return sum(self.pools[n].nodes_for(self.model, k) * self.pools[n].price_per_node_hour_usd
                   for n, k in placement.items() if k > 0 and n in self.pools)

    def _fit(self, placement: Mapping[str, int]) -> dict[str, int]:
        assert self.model is not None
        out = {n: int(k) for n, k in placement.items()}
        while self._cost(out) > self.cap + 1e-9:
            dearest = max((n for n, k in out.items() if k > 0 and n in self.pools),
                          key=lambda n: replica_price(self.pools[n], self.model))  # type: ignore[arg-type]
            out[dearest] -= 1
        return out


def make_controller(name: str, setup: SimSetup, policy: EffectivePolicy | None,
                    settings: BaselineSettings) -> Autoscaler:
    """A fresh controller for one run (controllers hold state)."""
    if name == "tidegate":
        if policy is None:
            raise ValueError("tidegate needs a policy file")
        return TidegateController(policy, settings.tidegate_interval_s)
    if name == "all-on-demand":
        if policy is None:
            raise ValueError("all-on-demand needs a policy file")
        return TidegateController(policy, settings.tidegate_interval_s,
                                  only_tiers=(Tier.ONDEMAND,), name="all-on-demand")
    base = _make_baseline(name, setup, settings)
    if settings.max_cost_per_hour_usd is not None and isinstance(base, Baseline) \
            and not isinstance(base, (ScheduleController, OracleController)):
        return BudgetCapped(base, settings.max_cost_per_hour_usd)
    return base


def _make_baseline(name: str, setup: SimSetup, settings: BaselineSettings) -> Autoscaler:
    lo, hi = settings.min_replicas, settings.max_replicas
    if name == "hpa":
        return HpaController(lo, hi, settings.hpa_target_util_pct)
    if name == "keda":
        kmin = lo if settings.keda_min_replicas is None else settings.keda_min_replicas
        return KedaController(kmin, hi, settings.keda_queue_threshold)
    if name == "seed-stack":
        onprem = sum(_capacity(p, setup.model) for p in setup.model_pools() if p.tier.is_onprem)
        op_max = max(1, min(10, hi, onprem))
        return SeedStackController(onprem_min=min(lo, op_max), onprem_max=op_max,
                                   target_util_pct=settings.seed_target_util_pct,
                                   queue_threshold=settings.seed_queue_threshold, max_total=hi)
    if name == "skyserve":
        qps = settings.skyserve_target_qps
        if qps is None:
            ref = next((p for p in setup.model_pools() if p.tier.is_onprem), setup.model_pools()[0])
            cap = setup.model.capacity.get(ref.gpu_type)
            # A capacity for one mix is the operator's target; a mix-free one (prefill/decode
            # tokens/s) names no request rate, so SkyServe gets the rate one replica sustains at
            # the SLO for this workload's mix, as its operator would measure it.
            mix_free = cap is None or cap.prefill_tokens_per_s is not None
            qps = setup.rate_at_slo(ref.gpu_type) if cap is None or mix_free else cap.requests_per_s
        return SkyServeController(lo, hi, qps)
    if name == "oracle":
        return OracleController()
    if name.startswith("schedule:"):
        return ScheduleController(name.split(":", 1)[1])
    raise ValueError(f"unknown controller {name!r} (known: tidegate, {', '.join(BASELINES)}, schedule:FILE)")


def expand_baselines(spec: str) -> list[str]:
    """``all`` -> every baseline; else a comma-separated list (``schedule:FILE`` allowed)."""
    spec = spec.strip()
    if not spec or spec == "none":
        return []
    out: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        if part == "all":
            out.extend(b for b in BASELINES if b not in out)
        elif part:
            if part not in BASELINES and not part.startswith("schedule:"):
                raise ValueError(f"unknown baseline {part!r} (known: {', '.join(BASELINES)}, schedule:FILE, all)")
            if part not in out:
                out.append(part)
    return out


def trace_tokens_note(setup: SimSetup) -> str:
    w = setup.workload
    return "request trace" if isinstance(w, RequestTrace) else "rate series"
