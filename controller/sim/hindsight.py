"""The yardstick: the cheapest capacity schedule with perfect hindsight, and a relaxed lower bound.

Why: "cost / oracle" is only a ratio to a limit if the reference is the cheapest schedule that
keeps the SLO *under the same terms* every controller runs under. The ``oracle`` baseline is a
greedy heuristic that ignores the policy's bounds and budget; this module instead solves for the
schedule exactly, as an integer program (scipy's ``milp``, HiGHS), knowing the whole trace, the
spot capacity over time and the fleet, under:

- the policy's bounds (at least ``min_replicas`` ready, at most ``max_replicas`` desired) and its
  budget (``max_cost_per_hour_usd`` on the nodes held, all pools, as tidegate's budget stage counts);
- provisioning delays and cold starts: a node ordered at the start of interval ``s`` serves from
  interval ``s + lead`` on, ``lead = ceil((provisioning + cold start + one tick) / interval)``
  (on-prem: cold start only), and is billed from the order;
- spot capacity: the nodes held in a spot pool never exceed what its trace holds during the
  interval (so no launch fails and nothing held is reclaimed);
- the same initial state as every controller: ``min_replicas`` ready on-prem at t = 0.

What "serves the interval within the SLO" means is the demand model of ``baselines.demand_parts``:
the replicas that sustain the next minute's rate at the SLO, and those that absorb every 1-60 s
burst within the TTFT target, whichever is more (:func:`demand_replicas`). Replicas that serve
together behind the gateway sustain more each than a lone one (a request waits only when all are
busy: ``service.prefill_wait``), so the replicas for a rate come from the pooled capacity curve
(:func:`capacity_curve`; in the engine's fluid mode, where each replica serves on its own, the
lone replica's rate). Each pool's node counts ``replicas_per_node`` replicas at its GPU type's rate
in a pool the size of the plan's peak. Demand the fleet cannot serve under the bounds, budget and
leads is left unserved at a penalty (``unserved_rps``), so the program is always feasible. Nodes
are the integer unit: a node that is paid for holds all the replicas it fits (they cost nothing
more), subject to ``max_replicas``.

Long traces are solved in chunks (``chunk_intervals``, with a look-ahead overlap) carrying the held
nodes and the orders still in flight across each boundary; each chunk is solved to the MIP gap
``mip_rel_gap``. The plan is then replayed by :class:`HindsightController` through the same
``Controller`` path as every baseline, so its attainment and cost are measured, not assumed.

The **relaxed bound** (:func:`relaxed_bound_usd`) drops every delay and the node granularity:
fractional replicas, spot within its trace, each replica at the most it sustains at the SLO in the
largest pool the fleet holds with one shared queue (no routing waits less), mean rates (no burst
allowance), and at least ``min_replicas`` replicas in every interval at the cheapest replica
prices. Without an attainment it is the cost of serving the demand: per interval, the arrivals'
mean rate (at most what the plan serves) at the cheapest prices available then; it is below the
plan's cost by construction. With the plan's measured attainment ``A`` it is below what any run
pays to reach ``A``: ``A`` of the span's requests meet the SLO; the ``min_replicas`` floor, paid in
every interval, serves up to its capacity of that interval's arrivals, and the rest are served by
the capacity the floor leaves, at the cheapest price per request anywhere in the span (no
interval serving more than its arrivals); never more than the value without an attainment.
Counting the whole demand put the bound above runs that reach a low attainment for the price of
the floor alone (a short trace far above the starting fleet: every run, the plan too, meets the
SLO for a few requests and no more). No run should reach the plan's attainment for less than the
bound at it (``bench/decision_quality.py`` checks every run and fails loudly if one does: the
bound would be wrong). Before the capacity was pooled, each replica counted as a lone one (its
own M/G/1 prefill queue): on 4-12k-token prompts that is ~0.1 req/s where one of four behind the
gateway sustains ~0.55, so the plan bought four times the replicas and the bound sat above runs
that kept the SLO on four.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Mapping

import numpy as np

from controller.core.model import ModelSpec
from controller.core.pricing import S_PER_HOUR, pool_price
from controller.sim.baselines import OracleController, demand_parts
from controller.sim.engine import Baseline, Observation, SimSetup
from controller.sim.workload import RequestTrace, rate_profile


@dataclass(frozen=True)
class PlanPool:
    """One pool as the program sees it."""

    name: str
    per_node: int
    rps_per_node: float
    """Requests/s at the SLO one full node serves, its replicas counted at the per-replica rate
    of a pool of the plan's size (:func:`capacity_curve`)."""
    usd_per_interval: float
    """Price of one node held for one interval."""
    lead: int
    """Intervals from an order to serving."""
    cap_nodes: np.ndarray
    """Nodes the pool can hold in each interval (its size, and its spot trace)."""
    init_nodes: int
    init_ready_replicas: int


@dataclass
class Plan:
    """A solved schedule: nodes held per pool and interval (desired replicas = nodes x per node)."""

    interval_s: float
    pools: list[PlanPool]
    nodes: dict[str, np.ndarray]
    ready_nodes: dict[str, np.ndarray]
    demand_rps: np.ndarray
    unserved_rps: np.ndarray
    cost_usd: float
    """The program's cost (nodes held x price), over the span."""
    status: list[str] = field(default_factory=list)
    """HiGHS's message per chunk."""
    rps_per_replica: float = 0.0
    """Requests/s one reference replica counts for in ``demand_rps`` and the pools'
    ``rps_per_node`` (the per-replica rate at the SLO in a pool of the plan's peak size)."""

    def replicas_at(self, t_s: float) -> dict[str, int]:
        i = min(int(t_s // self.interval_s), len(self.demand_rps) - 1)
        return {p.name: int(self.nodes[p.name][i]) * p.per_node for p in self.pools}


def default_interval_s(span_s: float) -> float:
    """15 s up to two hours (tidegate ticks every 5 s; sub-minute bursts matter on request traces),
    60 s beyond: the rate series have one-minute bins."""
    return 15.0 if span_s <= 7200.0 else 60.0


def fleet_replicas(setup: SimSetup) -> int:
    """The most replicas the model's pools hold together."""
    return max(1, sum(p.max_replicas(setup.model) for p in setup.model_pools()))


def pooled(setup: SimSetup) -> bool:
    """Whether replicas serve together behind the gateway in this run (request by request), so
    that a replica in a pool sustains more at the SLO than one on its own; in the engine's fluid
    mode every replica serves its share of the flow on its own (``FluidReplicaModel.steady`` for
    one replica), and the plan counts capacity the same way."""
    return setup.engine_mode() == "requests"


def capacity_curve(setup: SimSetup, gpu: str, n_max: int, *, shared_queue: bool = False) -> np.ndarray:
    """``curve[k]``: requests/s that ``k`` replicas on ``gpu`` sustain together at the SLO,
    ``k = 0 .. n_max`` (``SimSetup.pool_rate_at_slo``; each replica on its own in fluid mode)."""
    if not pooled(setup):
        return np.arange(n_max + 1) * setup.rate_at_slo(gpu)
    return np.array([0.0] + [k * setup.pool_rate_at_slo(gpu, k, shared_queue) for k in range(1, n_max + 1)])


def replicas_for(rate_rps: np.ndarray, curve: np.ndarray) -> np.ndarray:
    """Replicas (fractional: interpolated between whole counts; past the curve's end at its last
    per-replica rate) that sustain ``rate_rps`` at the SLO, from :func:`capacity_curve`."""
    x = np.maximum(np.asarray(rate_rps, dtype=np.float64), 0.0)
    n_max = len(curve) - 1
    last = curve[-1] / n_max if n_max > 0 else 0.0
    if last <= 0:
        return np.where(x > 0, np.inf, 0.0)
    k = np.clip(np.searchsorted(curve, x, side="left"), 1, n_max)
    lo, hi = curve[k - 1], curve[k]
    inside = (k - 1) + np.where(hi > lo, (x - lo) / np.maximum(hi - lo, 1e-12), 0.0)
    return np.where(x > curve[-1], n_max + (x - curve[-1]) / last, inside)


def demand_replicas(setup: SimSetup, interval_s: float) -> np.ndarray:
    """Reference replicas each interval needs: the larger of the replicas that sustain the next
    minute's rate at the SLO together (:func:`capacity_curve`) and those that absorb its bursts
    (``baselines.demand_parts``)."""
    sustained, burst = demand_parts(setup, interval_s)
    curve = capacity_curve(setup, setup.reference_gpu(), fleet_replicas(setup))
    return np.maximum(replicas_for(sustained, curve), burst)


def plan_pools(setup: SimSetup, interval_s: float, n: int, min_replicas: int, tick_s: float,
               pool_size: int = 1) -> list[PlanPool]:
    """The pools as the program sees them, each replica counted at the rate at the SLO of one of
    ``pool_size`` replicas (:func:`capacity_curve`)."""
    model: ModelSpec = setup.model
    out: list[PlanPool] = []
    left = min_replicas
    for spec in setup.model_pools():
        per_node = spec.replicas_per_node(model)
        if per_node <= 0:
            continue
        cap = np.full(n, spec.max_nodes, dtype=np.int64)
        sm = setup.spot.get(spec.name)
        if sm is not None and (sm.trace is not None or sm.unavailable_windows):
            # the least capacity anywhere in the interval (sampled every 5 s, one step either side)
            step = 5.0
            k = max(1, int(round(interval_s / step)))
            fine_t = np.maximum(np.arange(-1, n * k + 1) * (interval_s / k), 0.0)
            c = OracleController._cap_fast(sm, fine_t, spec.max_nodes)
            lo = np.minimum(c[:-2], np.minimum(c[1:-1], c[2:]))[: n * k].reshape(n, k).min(axis=1)
            cap = np.minimum(cap, lo)
        delay = 0.0 if spec.tier.is_onprem else spec.provisioning_delay_s
        lead = int(math.ceil((delay + model.cold_start_s + tick_s) / interval_s - 1e-9))
        init_rep = 0
        if spec.tier.is_onprem and left > 0:
            init_rep = min(left, spec.max_nodes * per_node)
            left -= init_rep
        rate = capacity_curve(setup, spec.gpu_type, pool_size)[-1] / pool_size
        out.append(PlanPool(spec.name, per_node, per_node * rate,
                            pool_price(spec, None) * interval_s / S_PER_HOUR, max(1, lead), cap,
                            -(-init_rep // per_node), init_rep))
    return out


def _solve_chunk(pools: list[PlanPool], demand: np.ndarray, t0: int, horizon: int, held: Mapping[str, int],
                 inflight: Mapping[str, np.ndarray], min_replicas: int, max_replicas: int,
                 budget_per_interval: float | None, penalty: float, gap: float,
                 time_limit_s: float) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray, str]:
    """One chunk ``[t0, t0 + horizon)``. Per pool and interval: ``o`` (nodes ordered) and ``b``
    (nodes held), integers; per interval ``u`` (unserved requests/s). The nodes serving in an
    interval are those held less those ordered in its last ``lead - 1`` intervals (and, before the
    first lead, on-prem holds only its initial ready replicas). ``inflight[p][j]``: nodes ordered
    ``j + 1`` intervals before ``t0`` and still held."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    H, P = horizon, len(pools)
    nv = 2 * P * H + H
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(coefs: list[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(lo)
        for c, v in coefs:
            rows.append(r)
            cols.append(c)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)

    c = np.zeros(nv)
    ub = np.full(nv, np.inf)
    integrality = np.ones(nv)
    integrality[2 * P * H:] = 0
    serving: list[list[list[tuple[int, float]]]] = [[[] for _ in range(H)] for _ in pools]
    """Per pool and interval: the serving nodes as a linear expression (plus ``serving_const``)."""
    serving_const = np.zeros((P, H))
    for p, pool in enumerate(pools):
        o0, b0 = 2 * p * H, (2 * p + 1) * H
        pre = inflight.get(pool.name, np.zeros(0))
        c[b0: b0 + H] = pool.usd_per_interval
        ub[b0: b0 + H] = pool.cap_nodes[t0: t0 + H]
        for t in range(H):
            # held: b_t <= b_{t-1} + o_t (what is released is gone)
            if t == 0:
                add([(b0, 1.0), (o0, -1.0)], -np.inf, float(held.get(pool.name, 0)))
            else:
                add([(b0 + t, 1.0), (b0 + t - 1, -1.0), (o0 + t, -1.0)], -np.inf, 0.0)
            expr = [(b0 + t, 1.0)] + [(o0 + s, -1.0) for s in range(max(0, t - pool.lead + 1), t + 1)]
            serving[p][t] = expr
            serving_const[p, t] = -sum(float(pre[j]) for j in range(len(pre)) if t + 1 + j < pool.lead)
            if t0 + t < pool.lead and pool.init_ready_replicas < pool.per_node * pool.init_nodes:
                serving_const[p, t] -= pool.init_nodes - pool.init_ready_replicas / pool.per_node
    for t in range(H):
        g = t0 + t
        u = 2 * P * H + t
        c[u] = penalty
        const = float(sum(pool.rps_per_node * serving_const[p, t] for p, pool in enumerate(pools)))
        add([(i, v * pool.rps_per_node) for p, pool in enumerate(pools) for i, v in serving[p][t]] + [(u, 1.0)],
            float(demand[g]) - const, np.inf)
        if min_replicas > 0:
            const = float(sum(pool.per_node * serving_const[p, t] for p, pool in enumerate(pools)))
            add([(i, v * pool.per_node) for p, pool in enumerate(pools) for i, v in serving[p][t]],
                float(min_replicas) - const, np.inf)
        b_t = [((2 * p + 1) * H + t, pool) for p, pool in enumerate(pools)]
        if max_replicas > 0:
            # nodes held are filled (their replicas cost nothing more)
            add([(i, float(pool.per_node)) for i, pool in b_t], -np.inf, float(max_replicas))
        if budget_per_interval is not None:
            add([(i, pool.usd_per_interval) for i, pool in b_t], -np.inf, budget_per_interval)
    a = coo_matrix((vals, (rows, cols)), shape=(len(lo), nv)).tocsr()
    res = milp(c, constraints=LinearConstraint(a, np.array(lo), np.array(hi)), integrality=integrality,
               bounds=Bounds(np.zeros(nv), ub), options={"mip_rel_gap": gap, "time_limit": time_limit_s, "disp": False})
    if res.x is None:
        raise RuntimeError(f"hindsight plan: the solver found no schedule ({res.message})")
    xs = np.round(res.x[: 2 * P * H]).astype(np.int64)
    nodes = {pool.name: xs[(2 * p + 1) * H: (2 * p + 2) * H] for p, pool in enumerate(pools)}
    orders = {pool.name: xs[2 * p * H: (2 * p + 1) * H] for p, pool in enumerate(pools)}
    unserved = np.maximum(res.x[2 * P * H:], 0.0)
    return nodes, orders, unserved, str(res.message)


def solve_plan(setup: SimSetup, *, min_replicas: int, max_replicas: int, max_cost_per_hour_usd: float | None,
               interval_s: float | None = None, tick_s: float = 5.0, chunk_intervals: int = 720,
               overlap_intervals: int = 120, mip_rel_gap: float = 1e-4, time_limit_s: float = 120.0,
               demand_rps: np.ndarray | None = None) -> Plan:
    """The cheapest schedule (see the module doc). ``demand_rps``: reference replicas' worth of
    requests/s at the SLO per interval, one replica on its own (default: :func:`demand_replicas`)."""
    g = interval_s or default_interval_s(setup.span_s)
    ref = setup.reference_gpu()
    if demand_rps is None:
        need = demand_replicas(setup, g)
    else:
        r1 = setup.rate_at_slo(ref)
        need = np.asarray(demand_rps, dtype=np.float64) / r1 if r1 > 0 else np.zeros(len(demand_rps))
    n = len(need)
    # Every pool's replicas count at the per-replica rate of a pool the size of the peak need (in
    # the bounds): the program stays linear, and the rates only weigh GPU types against each other.
    peak = float(np.nan_to_num(need, posinf=float(fleet_replicas(setup))).max(initial=1.0))
    size = int(min(max(1.0, math.ceil(peak - 1e-9)), max(max_replicas, 1), fleet_replicas(setup)))
    pools = plan_pools(setup, g, n, min_replicas, tick_s, size)
    if not pools:
        raise ValueError("hindsight plan: no pool can host the model")
    unit = capacity_curve(setup, ref, size)[-1] / size
    demand = need * unit
    budget = None if max_cost_per_hour_usd is None else max_cost_per_hour_usd * g / S_PER_HOUR
    nodes, orders, unserved, status = schedule(pools, demand, min_replicas=min_replicas, max_replicas=max_replicas,
                                               budget_per_interval=budget, chunk_intervals=chunk_intervals,
                                               overlap_intervals=overlap_intervals, mip_rel_gap=mip_rel_gap,
                                               time_limit_s=time_limit_s)
    ready = {p.name: ready_nodes(nodes[p.name], orders[p.name], p) for p in pools}
    # billed over the simulated span only (the last intervals lie past the end)
    span_n = setup.span_s / g
    weights = np.clip(span_n - np.arange(n), 0.0, 1.0)
    cost = float(sum((nodes[p.name] * weights).sum() * p.usd_per_interval for p in pools))
    return Plan(g, pools, nodes, ready, demand, unserved, cost, status, unit)


def unserved_penalty(pools: list[PlanPool]) -> float:
    """Cost of one request/s left unserved for one interval: far above serving it on any pool."""
    return 1000.0 * max(p.usd_per_interval / p.rps_per_node for p in pools if p.rps_per_node > 0)


def schedule(pools: list[PlanPool], demand: np.ndarray, *, min_replicas: int, max_replicas: int,
             budget_per_interval: float | None, chunk_intervals: int = 720, overlap_intervals: int = 120,
             mip_rel_gap: float = 1e-4, time_limit_s: float = 120.0,
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray, list[str]]:
    """Nodes held and ordered per pool and interval, and the demand left unserved, minimizing the
    nodes' cost plus :func:`unserved_penalty` per unserved request/s and interval; solved in
    chunks of ``chunk_intervals`` (each with ``overlap_intervals`` of look-ahead)."""
    n = len(demand)
    penalty = unserved_penalty(pools)
    nodes = {p.name: np.zeros(n, dtype=np.int64) for p in pools}
    orders = {p.name: np.zeros(n, dtype=np.int64) for p in pools}
    unserved = np.zeros(n)
    held = {p.name: p.init_nodes for p in pools}
    status: list[str] = []
    t0 = 0
    while t0 < n:
        commit = min(chunk_intervals, n - t0)
        horizon = min(n - t0, commit + overlap_intervals)
        inflight = {p.name: np.array([orders[p.name][t0 - 1 - j] if t0 - 1 - j >= 0 else 0
                                      for j in range(p.lead - 1)]) for p in pools}
        nd, od, un, msg = _solve_chunk(pools, demand, t0, horizon, held, inflight, min_replicas, max_replicas,
                                       budget_per_interval, penalty, mip_rel_gap, time_limit_s)
        for p in pools:
            nodes[p.name][t0: t0 + commit] = nd[p.name][:commit]
            orders[p.name][t0: t0 + commit] = od[p.name][:commit]
            held[p.name] = int(nd[p.name][commit - 1])
        unserved[t0: t0 + commit] = un[:commit]
        status.append(msg)
        t0 += commit
    return nodes, orders, unserved, status


def ready_nodes(held: np.ndarray, orders: np.ndarray, pool: PlanPool) -> np.ndarray:
    """Nodes serving per interval: held minus those ordered in the last ``lead - 1`` intervals
    (the initial nodes are ready from the start)."""
    c = np.concatenate([[0], np.cumsum(orders)])
    n = len(held)
    idx = np.arange(n)
    recent = c[idx + 1] - c[np.maximum(idx + 1 - (pool.lead), 0)]
    return np.maximum(held - recent, 0)


def relaxed_bound_usd(setup: SimSetup, plan: Plan, *, min_replicas: int, attainment: float | None = None) -> float:
    """The relaxed lower bound (module doc): no delays, fractional replicas, each replica counted
    at the most it sustains at the SLO in any pool the fleet can hold (one queue for all: no
    routing does better), and at least ``min_replicas`` replicas at the cheapest replica prices.

    ``attainment=None``: the cost of serving the demand, per interval the mean arrival rate
    (capped at what the plan serves) at the cheapest fractional prices available then.
    ``attainment=A``: below the cost of any run that serves ``A`` of the span's requests
    (:func:`interval_requests`) within the SLO: the ``min_replicas`` floor in every interval,
    which serves up to its capacity of that interval's arrivals, plus the rest of the ``A`` share
    served by the capacity the floor leaves, at the cheapest price per request anywhere in the
    span (:func:`cheapest_fill`); never more than the ``attainment=None`` value (anything below a
    lower bound is one too; where the plan leaves demand unserved, serving every arrival can cost
    more than serving what the plan serves). Non-decreasing in ``A``; the floor alone where it
    serves the ``A`` share."""
    g = plan.interval_s
    n = len(plan.demand_rps)
    span_n = setup.span_s / g
    weights = np.clip(span_n - np.arange(n), 0.0, 1.0)
    mean = rate_profile(setup.workload, g, n * g)[:n]
    if len(mean) < n:
        mean = np.concatenate([mean, np.zeros(n - len(mean))])
    big = fleet_replicas(setup)
    best = {p.gpu_type: capacity_curve(setup, p.gpu_type, big, shared_queue=True)[-1] / big
            for p in setup.model_pools()}
    ref_best = best[setup.reference_gpu()]
    unit = plan.rps_per_replica or (plan.pools[0].rps_per_node / plan.pools[0].per_node)
    served_replicas = np.maximum(plan.demand_rps - plan.unserved_rps, 0.0) / unit
    need = np.minimum(mean, served_replicas * ref_best)
    rps_per_node = {p.name: p.per_node * best[setup.pools[p.name].gpu_type] for p in plan.pools}
    by_rps = sorted((p for p in plan.pools if rps_per_node[p.name] > 0),
                    key=lambda p: p.usd_per_interval / rps_per_node[p.name])
    left = need.copy()
    cost = np.zeros(n)
    for p in by_rps:
        cap_rps = p.cap_nodes.astype(np.float64) * rps_per_node[p.name]
        take = np.minimum(left, cap_rps)
        cost += take / rps_per_node[p.name] * p.usd_per_interval
        left -= take
    by_rep = sorted(plan.pools, key=lambda p: p.usd_per_interval / p.per_node)
    rep_left = np.full(n, float(min_replicas))
    floor = np.zeros(n)
    in_floor: dict[str, np.ndarray] = {}
    for p in by_rep:
        take = np.minimum(rep_left, p.cap_nodes.astype(np.float64) * p.per_node)
        floor += take / p.per_node * p.usd_per_interval
        rep_left -= take
        in_floor[p.name] = take
    full = float((np.maximum(cost, floor) * weights).sum())
    if attainment is None:
        return full
    arrivals = interval_requests(setup, g, n)
    # what the floor serves for nothing more: its replicas at the fastest GPU type's rate
    free = np.minimum(arrivals, (min_replicas - rep_left) * max(best.values()) * g * weights)
    required = min(max(float(attainment), 0.0), 1.0) * float(arrivals.sum())
    # extra capacity per interval and pool: the replicas the floor leaves, counted in requests
    # served in the part of the interval inside the span, at their price per request (the
    # weight cancels: that part alone is paid for). Why any run pays at least this: it holds at
    # least the floor's count; take away, pool by pool, its replicas where the floor's are, then as
    # many more as the floor has left (each priced at least like the floor's dearest, the floor
    # being the cheapest per replica, and serving at most the fastest rate): the rest fits in what
    # the floor leaves, costs at most the run's cost less the floor's, and serves at least what
    # the run serves beyond ``free``.
    priced = [p for p in plan.pools if rps_per_node[p.name] > 0]
    price = np.zeros((n, len(priced)))
    caps = np.zeros((n, len(priced)))
    for j, p in enumerate(priced):
        spare = np.maximum(p.cap_nodes.astype(np.float64) * p.per_node - in_floor[p.name], 0.0) / p.per_node
        price[:, j] = p.usd_per_interval / (rps_per_node[p.name] * g)
        caps[:, j] = spare * rps_per_node[p.name] * g * weights
    extra = cheapest_fill(price, caps, arrivals - free, required - float(free.sum()))
    return min(full, float((floor * weights).sum()) + extra)


def interval_requests(setup: SimSetup, interval_s: float, n: int) -> np.ndarray:
    """Requests arriving in each of ``n`` intervals of ``interval_s`` over the run's span: a
    request trace's own arrivals up to the span's end (those the engine replays), a rate series'
    expected requests (its mean rate, :func:`rate_profile`, over the part of the interval inside
    the span)."""
    g = interval_s
    w = setup.workload
    if isinstance(w, RequestTrace):
        out = rate_profile(w.head(setup.span_s), g, n * g)[:n] * g
    else:
        out = rate_profile(w, g, n * g)[:n] * g
    if len(out) < n:
        out = np.concatenate([out, np.zeros(n - len(out))])
    if not isinstance(w, RequestTrace):
        out = out * np.clip(setup.span_s / g - np.arange(n), 0.0, 1.0)
    return out


def cheapest_fill(price: np.ndarray, caps: np.ndarray, room: np.ndarray, amount: float) -> float:
    """The least cost of ``amount`` requests, fractional: interval ``i``'s pool ``p`` serves at
    most ``caps[i, p]`` of them at ``price[i, p]`` each, and interval ``i`` at most ``room[i]`` in
    all (arrays ``(n, P)``, ``(n, P)``, ``(n,)``). Each interval's pools cheapest first, then
    those pieces cheapest first across the span: the linear program's optimum. Where less than
    ``amount`` can be served, the cost of all that can."""
    if amount <= 0 or caps.size == 0:
        return 0.0
    order = np.argsort(price, axis=1, kind="stable")
    p_sorted = np.take_along_axis(price, order, axis=1)
    c_sorted = np.take_along_axis(np.maximum(caps, 0.0), order, axis=1)
    cum = np.minimum(np.cumsum(c_sorted, axis=1), np.maximum(room, 0.0)[:, None])
    pieces = np.diff(np.concatenate([np.zeros((len(cum), 1)), cum], axis=1), axis=1).ravel()
    unit_price = p_sorted.ravel()
    by = np.argsort(unit_price, kind="stable")
    pieces, unit_price = pieces[by], unit_price[by]
    before = np.concatenate([[0.0], np.cumsum(pieces)[:-1]])
    take = np.clip(amount - before, 0.0, pieces)
    return float((take * unit_price).sum())


class HindsightController(Baseline):
    """``hindsight``: replays a :class:`Plan` (solved at ``initial``) through the same ``Controller``
    path as every baseline; it orders and releases its nodes itself (``node_mode="direct"``)."""

    node_mode: Literal["direct", "autoscaler"] = "direct"

    def __init__(self, *, min_replicas: int, max_replicas: int, max_cost_per_hour_usd: float | None,
                 interval_s: float = 5.0, plan: Plan | None = None, name: str = "hindsight") -> None:
        self.name = name
        self.interval_s = interval_s
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.budget = max_cost_per_hour_usd
        self.plan = plan

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        if self.plan is None:
            self.plan = solve_plan(setup, min_replicas=self.min_replicas, max_replicas=self.max_replicas,
                                   max_cost_per_hour_usd=self.budget, tick_s=self.interval_s)
        return self.plan.replicas_at(0.0)

    def decide(self, now_s: float, obs: Observation) -> Mapping[str, int] | None:
        assert self.plan is not None
        return self.plan.replicas_at(now_s)
