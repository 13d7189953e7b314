"""Placement: turn a total replica count into replicas per pool, cheapest safe capacity first.

This is the part of the pipeline that knows about pools, prices, GPUs and spot interruptions; it
is a pure function of its own (``place``) so that the simulator and tests can call it alone. The
rules, in the order they apply:

1. **What is still valid of the current placement** (avoid churn: replicas that can stay, stay).
   Pools the model cannot use (not allowed by the policy, no engine for the pool's GPU type, no
   pool spec) and drained pools keep nothing. Replicas on nodes with an interruption notice leave
   their pool now and are replaced elsewhere in the same decision; a pool with such notices takes
   no new replicas this tick. An unavailable pool (``PoolState.available`` false, or a spot pool
   with more recent interruptions than ``max_recent_interruptions``) keeps at most its ready
   replicas and takes no new ones. No pool keeps more than its capacity
   (``max_nodes * (gpus_per_node // tp)``: whole replicas of TP GPUs on whole nodes).
2. **Too many**: remove on-demand first, then spot, on-prem last; most expensive first within a
   tier (effective cost = node price / replicas per node, live price when known).
3. **Budget**: while the cost is above the cap, remove whole nodes' worth of replicas in the same
   order (on-prem last, pinned pools after unpinned ones). The budget beats ``min_replicas``.
4. **Too few**: fill on-prem first (already paid for), then spot in order of effective cost,
   spreading over the ``spot_spread_min_pools`` cheapest open spot pools (the next replica goes to
   the one of them with the fewest replicas, ties to the cheaper), then on-demand as the fallback
   (when allowed). A replica is added only if the cost stays within the cap, so the result is the
   best placement the budget allows; cloud pools are tried when on-prem is full or unaffordable.
5. **Spread repair**: when more than one replica is on spot but fewer spot pools hold them than
   the spread asks for (and open spot pools exist), move replicas from the fullest spot pool to
   the cheapest empty one, within the budget. Interruptions hit one pool at a time; a spread
   fleet survives them.

Cost = sum over pools of whole nodes for the replicas times the node price per hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Mapping

from controller.core.model import ModelSpec, PoolSpec, PoolState
from controller.core.reasons import Reason
from controller.core.spec import Placement as PlacementSpec

DEFAULT_PLACEMENT = PlacementSpec.model_validate({})
"""Used when no placement spec is given (built once: pydantic models are not built per call)."""

_EPS_USD = 1e-9
"""Slack on budget comparisons, US dollars per hour: float sums must not flip a decision."""

_ONPREM, _SPOT, _ONDEMAND = 0, 1, 2  # Tier.rank of each tier
"""Looked up once per pool and call: enum properties are slow in hot loops."""


def pool_price(spec: PoolSpec, state: PoolState | None) -> float:
    """Price per node-hour, USD: the live price when the state carries one, else the static one."""
    if state is not None and state.price_per_node_hour_usd is not None:
        return state.price_per_node_hour_usd
    return spec.price_per_node_hour_usd


def _nodes(replicas: int, per_node: int) -> int:
    if replicas <= 0:
        return 0
    if per_node <= 0:
        # Replicas where they cannot fit (a stale placement on a pool of the wrong GPU type): count
        # one node each so their cost is not hidden.
        return replicas
    return -(-replicas // per_node)


def placement_cost(
    model: ModelSpec,
    pools: Mapping[str, PoolSpec],
    states: Mapping[str, PoolState],
    placement: Mapping[str, int],
) -> float:
    """Cost per hour (USD) of ``placement``: whole nodes per pool times the node price."""
    cost = 0.0
    for name, replicas in placement.items():
        spec = pools.get(name)
        if spec is None or replicas <= 0:
            continue
        cost += _nodes(replicas, spec.replicas_per_node(model)) * pool_price(spec, states.get(name))
    return cost


class _Pool:
    """Working state of one pool during ``place`` (mutable, private, never returned)."""

    __slots__ = ("name", "spec", "tier", "priority", "per_node", "capacity", "price", "eff_cost",
                 "current", "kept", "replicas", "accepts", "pinned", "usable")

    def __init__(self, name: str, spec: PoolSpec | None, state: PoolState | None, model: ModelSpec) -> None:
        self.name = name
        self.spec = spec
        self.current = 0 if state is None or state.replicas is None else max(0, state.replicas)
        self.kept = 0
        self.replicas = 0
        self.accepts = False
        self.pinned = False
        if spec is None:
            self.tier, self.priority, self.per_node, self.capacity = _ONDEMAND, 0, 0, 0
            self.price, self.eff_cost, self.usable = 0.0, float("inf"), False
            return
        self.tier = spec.tier.rank
        self.priority = spec.priority
        self.per_node = spec.replicas_per_node(model)
        self.capacity = spec.max_nodes * self.per_node
        self.price = pool_price(spec, state)
        self.eff_cost = self.price / self.per_node if self.per_node > 0 else float("inf")
        self.usable = self.per_node > 0

    def nodes(self) -> int:
        return _nodes(self.replicas, self.per_node)

    def cost(self) -> float:
        return self.nodes() * self.price

    def add_cost(self) -> float:
        """Extra cost per hour of one more replica: a new node, or nothing when one has room."""
        return self.price if self.replicas % self.per_node == 0 else 0.0

    def remove_saving(self) -> float:
        """Cost per hour saved by one replica fewer: a node, when it was the last on its node."""
        return self.price if self.replicas > 0 and (self.replicas - 1) % self.per_node == 0 else 0.0

    def rank(self) -> tuple[float, int, str]:
        return (self.eff_cost, self.priority, self.name)


@dataclass(frozen=True, slots=True)
class PlacementResult:
    """Replicas per pool and what shaped them."""

    replicas: dict[str, int]
    """Per pool of the model, in the model's pool order (zeros included)."""
    cost_per_hour_usd: float
    requested: int
    """The total asked for."""
    kept: dict[str, int]
    """Per pool: what was still valid of the current placement (step 1)."""
    reason: str
    """The most significant ``Reason``: ``BudgetCapReached``, ``CapacityExhausted``,
    ``OverrideDrain``, ``SpotInterrupted``, ``SpotPoolUnavailable``, ``PoolUnavailable``,
    ``OnDemandFallback`` or ``Placed``."""
    events: tuple[tuple[str, str], ...]
    """(reason code, message) for everything noteworthy, in the order it happened."""
    interrupted_removed: int = 0
    """Replicas taken off nodes with interruption notices."""
    interrupted_replaced: int = 0
    """Of those, how many were replaced in other pools in this placement."""
    capacity_limited: bool = False
    """Fewer than ``requested`` because no usable pool had room."""
    budget_limited: bool = False
    """The budget removed replicas or stopped additions that had room."""
    budget_removed: int = 0
    """Replicas removed from the kept placement to get within the budget."""
    cap_usd: float | None = None
    """The cost ceiling applied, USD per hour."""

    @property
    def total(self) -> int:
        return sum(self.replicas.values())

    def message(self) -> str:
        pools = ", ".join(f"{k}={v}" for k, v in self.replicas.items())
        head = f"placed {self.total} of {self.requested}: {pools}; ${self.cost_per_hour_usd:.2f}/h"
        if not self.events:
            return head
        return head + "; " + "; ".join(msg for _, msg in self.events)


def preferred_pool(
    model: ModelSpec,
    pools: Mapping[str, PoolSpec],
    states: Mapping[str, PoolState],
    placement: PlacementSpec = DEFAULT_PLACEMENT,
) -> str | None:
    """The pool the next new replica would go to absent budget limits (on-prem first, then the
    cheapest spot, then on-demand), ignoring room; ``None`` if the model can use no pool."""
    allowed = placement.pools
    best: tuple[int, float, int, str] | None = None
    for name in model.pools:
        spec = pools.get(name)
        if spec is None or (allowed is not None and name not in allowed):
            continue
        per_node = spec.replicas_per_node(model)
        if per_node <= 0:
            continue
        tier = spec.tier.rank
        if tier == _ONDEMAND and not placement.allow_on_demand:
            continue
        key = (tier, pool_price(spec, states.get(name)) / per_node, spec.priority, name)
        if best is None or key < best:
            best = key
    return None if best is None else best[3]


def place(
    *,
    model: ModelSpec,
    pools: Mapping[str, PoolSpec],
    states: Mapping[str, PoolState],
    total: int,
    placement: PlacementSpec = DEFAULT_PLACEMENT,
    max_cost_per_hour_usd: float | None = None,
    drained: Collection[str] = (),
    pinned: Mapping[str, int] | None = None,
) -> PlacementResult:
    """Replicas per pool for ``total`` replicas of ``model``.

    ``states`` gives each pool's current replicas (``None`` reads as 0 here: the pipeline refuses
    to place before every pool has been observed), readiness, availability, interruption notices
    and live price. ``drained`` pools get nothing. ``pinned`` pools get exactly their pin (capped
    by capacity) and are neither filled nor trimmed for the total, only for the budget (last).
    ``max_cost_per_hour_usd`` is the ceiling on the placement's cost.
    """
    cap = max_cost_per_hour_usd
    allowed = placement.pools
    events: list[tuple[str, str]] = []
    views: list[_Pool] = []
    interrupted_removed = 0
    moved_off: dict[str, int] = {}
    pinned = pinned or {}

    # 1. What stays valid of the current placement.
    for name in model.pools:
        spec = pools.get(name)
        state = states.get(name)
        p = _Pool(name, spec, state, model)
        views.append(p)
        if spec is None or not p.usable or (allowed is not None and name not in allowed):
            p.usable = False
            if p.current:
                why = ("no pool spec" if spec is None else
                       "not allowed by the policy" if allowed is not None and name not in allowed else
                       f"no engine for GPU {spec.gpu_type} x{spec.gpus_per_node} at TP {model.tp_degree}")
                events.append((Reason.POOL_UNAVAILABLE.value, f"{name} unusable ({why}): moving {p.current}"))
                moved_off[Reason.POOL_UNAVAILABLE.value] = moved_off.get(Reason.POOL_UNAVAILABLE.value, 0) + p.current
            continue
        if name in drained:
            events.append((Reason.OVERRIDE_DRAIN.value, f"{name} drained: moving {p.current}"))
            if p.current:
                moved_off[Reason.OVERRIDE_DRAIN.value] = moved_off.get(Reason.OVERRIDE_DRAIN.value, 0) + p.current
            continue
        if name in pinned:
            p.pinned = True
            p.kept = p.replicas = min(max(0, pinned[name]), p.capacity)
            continue
        kept = p.current
        accepts = True
        assert spec is not None
        if state is not None and state.interrupted_replicas > 0 and kept > 0:
            gone = min(state.interrupted_replicas, kept)
            kept -= gone
            interrupted_removed += gone
            accepts = False  # the noticed nodes are going away: replace elsewhere, not here
            events.append((Reason.SPOT_INTERRUPTED.value, f"{name}: {gone} replicas on interrupted nodes"))
        unavailable_code: str | None = None
        unavailable_why = ""
        if state is not None and not state.available:
            unavailable_code = (Reason.SPOT_POOL_UNAVAILABLE if p.tier == _SPOT else Reason.POOL_UNAVAILABLE).value
            unavailable_why = state.unavailable_reason or "unavailable"
        elif (state is not None and p.tier == _SPOT
              and state.recent_interruptions > placement.max_recent_interruptions):
            unavailable_code = Reason.SPOT_POOL_UNAVAILABLE.value
            unavailable_why = (f"{state.recent_interruptions} recent interruptions > "
                               f"{placement.max_recent_interruptions}")
        if unavailable_code is not None:
            accepts = False
            ready = None if state is None else state.ready_replicas
            # Ready replicas keep serving; the unready ones will not start there. Unknown
            # readiness keeps them all: never release what cannot be seen.
            keep = kept if ready is None else min(kept, max(0, ready))
            if keep < kept:
                moved_off[unavailable_code] = moved_off.get(unavailable_code, 0) + kept - keep
            events.append((unavailable_code, f"{name} unavailable ({unavailable_why}): keeps {keep} of {kept}, no new"))
            kept = keep
        if kept > p.capacity:
            events.append((Reason.CAPACITY_EXHAUSTED.value, f"{name} holds {kept} but fits {p.capacity}"))
            kept = p.capacity
        p.kept = p.replicas = kept
        p.accepts = accepts and p.capacity > 0

    kept_map = {p.name: p.kept for p in views}
    pinned_sum = sum(p.replicas for p in views if p.pinned)
    want = max(total, pinned_sum)
    count = sum(p.replicas for p in views)

    # 2. Too many: on-demand first, then spot, on-prem last; most expensive first within a tier.
    if count > want:
        order = sorted((p for p in views if not p.pinned and p.replicas > 0),
                       key=lambda p: (-p.tier, -p.eff_cost, -p.priority, p.name))
        for p in order:
            take = min(p.replicas, count - want)
            p.replicas -= take
            count -= take
            if count == want:
                break

    cost = sum(p.cost() for p in views)

    # 3. Budget: remove whole nodes, cloud before on-prem, unpinned before pinned, dearest first.
    budget_removed = 0
    trimmed_onprem = False
    if cap is not None and cost > cap + _EPS_USD:
        before = cost
        order = sorted((p for p in views if p.replicas > 0 and p.price > 0),
                       key=lambda p: (p.tier == _ONPREM, p.pinned, -p.tier, -p.eff_cost, -p.priority, p.name))
        for p in order:
            while p.replicas > 0 and cost > cap + _EPS_USD:
                last_node = p.replicas - (p.nodes() - 1) * p.per_node
                p.replicas -= last_node
                budget_removed += last_node
                cost -= p.price
                trimmed_onprem = trimmed_onprem or p.tier == _ONPREM
            if cost <= cap + _EPS_USD:
                break
        count = sum(p.replicas for p in views)
        cost = sum(p.cost() for p in views)
        events.append((Reason.BUDGET_CAP_REACHED.value,
                       f"${before:.2f}/h over the ${cap:.2f}/h cap: removed {budget_removed} replicas"))

    # 4. Too few: on-prem, then spot (spread), then on-demand; each replica only within budget.
    need = want - count
    added_total = 0
    ondemand_added = 0
    if need > 0:
        onprem = sorted((p for p in views if p.accepts and p.tier == _ONPREM), key=_Pool.rank)
        spot = sorted((p for p in views if p.accepts and p.tier == _SPOT), key=_Pool.rank)
        ondemand = sorted((p for p in views if p.accepts and p.tier == _ONDEMAND), key=_Pool.rank)
        for p in onprem:
            if need <= 0:
                break
            n = _affordable(p, need, cost, cap)
            if n > 0:
                cost += _grow(p, n)
                need -= n
                added_total += n
        # Budget already forced on-prem replicas out: cloud replicas would only replace them.
        if need > 0 and not trimmed_onprem:
            k = placement.spot_spread_min_pools
            while need > 0:
                open_pools = [p for p in spot if p.replicas < p.capacity]
                if not open_pools:
                    break
                first = min(open_pools[:k], key=lambda p: p.replicas)  # ties: first = cheaper
                chosen: _Pool | None = None
                delta = 0.0
                for p in [first] + [q for q in open_pools if q is not first]:
                    delta = p.add_cost()
                    if cap is None or cost + delta <= cap + _EPS_USD:
                        chosen = p
                        break
                if chosen is None:
                    break
                chosen.replicas += 1
                cost += delta
                need -= 1
                added_total += 1
            if need > 0 and placement.allow_on_demand:
                for p in ondemand:
                    if need <= 0:
                        break
                    n = _affordable(p, need, cost, cap)
                    if n > 0:
                        cost += _grow(p, n)
                        need -= n
                        added_total += n
                        ondemand_added += n
        if ondemand_added:
            events.append((Reason.ON_DEMAND_FALLBACK.value,
                           f"on-prem and spot full: {ondemand_added} on on-demand"))

    # 5. Spread repair: more than one spot replica should not sit in fewer pools than asked for.
    spread_blocked = False
    k = placement.spot_spread_min_pools
    if k >= 2:
        spot_all = [p for p in views if p.tier == _SPOT and p.usable]
        spot_count = sum(p.replicas for p in spot_all)
        target = min(k, spot_count)
        nonempty = sum(1 for p in spot_all if p.replicas > 0)
        if spot_count >= 2 and nonempty < target:
            dests = sorted((p for p in spot_all if p.accepts and p.replicas == 0 and p.capacity > 0),
                           key=_Pool.rank)
            while nonempty < target and dests:
                sources = [p for p in spot_all if not p.pinned and p.replicas >= 2]
                if not sources:
                    break
                src = max(sources, key=lambda p: (p.replicas, p.eff_cost, p.name))
                saving = src.remove_saving()
                moved_to: _Pool | None = None
                for d in dests:
                    delta = d.add_cost() - saving
                    if cap is None or cost + delta <= cap + _EPS_USD:
                        moved_to = d
                        break
                if moved_to is None:
                    spread_blocked = True
                    break
                src.replicas -= 1
                moved_to.replicas += 1
                cost += delta
                nonempty += 1
                dests.remove(moved_to)
                events.append((Reason.PLACED.value, f"spot spread: moved 1 from {src.name} to {moved_to.name}"))
        if spread_blocked:
            events.append((Reason.BUDGET_CAP_REACHED.value,
                           f"spot spread over {target} pools would exceed the ${cap:.2f}/h cap"))

    count = sum(p.replicas for p in views)
    short = want - count
    room = 0
    if short > 0:
        for p in views:
            if p.accepts and (p.tier != _ONDEMAND or placement.allow_on_demand):
                room += p.capacity - p.replicas
    capacity_limited = short > room
    budget_limited = budget_removed > 0 or (short > 0 and room > 0)
    if capacity_limited:
        events.append((Reason.CAPACITY_EXHAUSTED.value, f"no room for {short - room} of {want}"))
    if short > 0 and room > 0 and cap is not None:
        events.append((Reason.BUDGET_CAP_REACHED.value,
                       f"{min(short, room)} more would exceed the ${cap:.2f}/h cap"))

    if budget_limited:
        reason = Reason.BUDGET_CAP_REACHED.value
    elif capacity_limited:
        reason = Reason.CAPACITY_EXHAUSTED.value
    elif moved_off.get(Reason.OVERRIDE_DRAIN.value):
        reason = Reason.OVERRIDE_DRAIN.value
    elif interrupted_removed:
        reason = Reason.SPOT_INTERRUPTED.value
    elif moved_off.get(Reason.SPOT_POOL_UNAVAILABLE.value):
        reason = Reason.SPOT_POOL_UNAVAILABLE.value
    elif moved_off.get(Reason.POOL_UNAVAILABLE.value):
        reason = Reason.POOL_UNAVAILABLE.value
    elif ondemand_added:
        reason = Reason.ON_DEMAND_FALLBACK.value
    else:
        reason = Reason.PLACED.value

    return PlacementResult(
        replicas={p.name: p.replicas for p in views},
        cost_per_hour_usd=sum(p.cost() for p in views),
        requested=total,
        kept=kept_map,
        reason=reason,
        events=tuple(events),
        interrupted_removed=interrupted_removed,
        interrupted_replaced=min(interrupted_removed, added_total),
        capacity_limited=capacity_limited,
        budget_limited=budget_limited,
        budget_removed=budget_removed,
        cap_usd=cap,
    )


def _affordable(p: _Pool, need: int, cost: float, cap: float | None) -> int:
    """How many of ``need`` replicas ``p`` takes: its room, and what the budget leaves."""
    n = min(need, p.capacity - p.replicas)
    if n <= 0 or cap is None or p.price <= 0:
        return max(n, 0)
    free_slots = p.nodes() * p.per_node - p.replicas
    left_usd = cap + _EPS_USD - cost
    new_nodes = int(left_usd // p.price) if left_usd > 0 else 0
    return min(n, free_slots + new_nodes * p.per_node)


def _grow(p: _Pool, n: int) -> float:
    """Add ``n`` replicas to ``p``; return the extra cost per hour."""
    before = p.nodes()
    p.replicas += n
    return (p.nodes() - before) * p.price
