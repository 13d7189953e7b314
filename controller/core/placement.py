"""Placement: turn a total replica count into replicas per pool, cheapest safe capacity first.

This is the part of the pipeline that knows about pools, prices, GPUs and spot interruptions; it
is a pure function of its own (``place``) so that the simulator and tests can call it alone. The
rules, in the order they apply:

1. **What is still valid of the current placement** (avoid churn: replicas that can stay, stay).
   Pools the model cannot use (not allowed by the policy, no engine for the pool's GPU type, no
   pool spec) and drained pools keep nothing. Replicas on nodes with an interruption notice leave
   their pool now and are replaced elsewhere in the same decision; a pool with such notices takes
   no new replicas this tick. An unavailable pool (``PoolState.available`` false, or a spot pool
   with more recent interruptions than ``max_recent_interruptions``) keeps at most its replicas
   on nodes that are up (ready, or starting there: ``PoolState.scheduled_replicas``; the ready
   ones alone when the provider cannot tell) and takes no new ones: the replicas still waiting
   for a node move elsewhere. No pool keeps more than its capacity
   (``max_nodes * (gpus_per_node // tp)``: whole replicas of TP GPUs on whole nodes).
2. **Too many**: remove on-demand first, then spot, on-prem last; cloud replicas that are not
   ready yet go before any that serve (an order still provisioning is cancelled first), dearest
   first. Within a tier the replicas that serve go so that the nodes they empty save the most per
   hour (a replica alone on a node pays for the whole node; one off a full node saves nothing),
   then the most expensive first (effective cost = node price / replicas per node, live price
   when known). With ``max_cloud`` (lead-time economics, ``controller.core.leadtime``) the cloud pools
   keep at most that many, not-ready ones removed first. Of the replicas only the scale-down
   memory holds (``window_held``, below; at most what the placement holds above the rules' total),
   the on-demand ones not ready yet are cancelled, whole nodes only (``HeldNotReplaced``; not
   while spares are held): an on-demand order serves after its lead time, by when the window has
   let the total go.
3. **Budget**: while the cost is above the cap, remove whole nodes' worth of replicas in the same
   order (on-prem last, pinned pools after unpinned ones). The budget beats ``min_replicas``.
4. **Too few**: fill on-prem first (already paid for), then spot in order of effective cost,
   spreading over the ``spot_spread_min_pools`` cheapest open spot pools (the next replica goes to
   the one of them with the fewest replicas, ties to the cheaper), then on-demand as the fallback
   (when allowed), the cloud tiers within ``max_cloud``. A replica is added only if the cost stays
   within the cap, so the result is the best placement the budget allows; cloud pools are tried
   when on-prem is full or unaffordable. The replicas only the scale-down memory holds
   (``window_held``: the stabilization window or rate limit above what the rules asked lately)
   that no pool kept (interrupted, on an unavailable pool) take on-prem room and free slots on
   cloud nodes already paid for, but no cloud node is bought for them (``HeldNotReplaced``): a
   cloud order serves after its lead time, by when the window has let them go.
5. **Spread repair**: when more than one replica is on spot but fewer spot pools hold them than
   the spread asks for (and open spot pools exist), move replicas from the fullest spot pool to
   the cheapest empty one, within the budget. Interruptions hit one pool at a time; a spread
   fleet survives them.

6. **Spot hedge** (``placement.spot_hedge`` > 0; SkyServe's SpotHedge over-provisioning, sized
   per pool from what it was seen to lose): a spot pool whose recent interruptions (interrupted
   nodes within the provider's window) took ``k`` replicas' worth, holding ``r`` replicas now,
   has ``min(r, k)`` replicas at risk and gets ``ceil(spot_hedge x at risk)`` spare replicas
   above the total, placed away from every interrupted pool: on-prem room first, then the spot
   pools with no recent interruption (spread as in step 4), then on-demand, each within the
   budget and ``max_total``. A pool never interrupted gets no spare. When such a pool is then
   reclaimed whole, the spares are already serving while its replacements start. The spares are
   kept from tick to tick (step 2 trims to the total plus the spare) and reported
   (``PlacementResult.hedge_spare``, reason ``SpotHedge``) so the pipeline does not count them
   as demand.
7. **Fallback return** (``placement.return_from_fallback``, on by default; SkyServe's dynamic
   fallback): on-demand replicas are kept by step 1 like any other, so after a spot pool comes
   back they would stay until the demand falls. While unpinned on-demand pools hold replicas and
   cheaper pools take new ones (on-prem room, spot pools that accept replicas: available, no
   notices, not over ``max_recent_interruptions``, not drained or pinned, and with the hedge on
   not interrupted recently, and not still starting replicas: an order beyond what the cloud has
   left would make it unavailable and drop them), replacements are ordered there **above the
   total**, the on-demand
   replicas serving on: make before break. One step per on-demand node, in step 2's removal order
   (dearest replica-hour first, the fewest-held node of a pool first), each only if its
   replacements fit (placed as step 4 places: on-prem, then spot spread) and the new nodes they
   need cost less per hour than the node it empties (whole nodes: a replica on a node already
   paid for is free; an on-demand node is saved only when it empties), with the overlap within the
   cap, ``max_total`` and ``max_cloud``; the first step that does not save stops it. An on-demand
   pool still starting replicas is left alone (they were ordered because the cheaper pools could
   not take them). Nothing here removes an on-demand replica: at the next decision the
   replacements are spare replicas above the total; step 2 first cancels those still starting
   (``returning``: how many the previous decision held; step 7 orders them again at once), then
   trims the rest of the excess as it trims any, on-demand before anything else: an on-demand
   replica goes exactly when a replacement serves, and is reported as released for it. The
   replacements are reported (``PlacementResult.return_spare``, reason ``FallbackReturn``) so
   the pipeline does not count them as demand.

8. **Paid slots** (``placement.fill_paid_nodes``, off by default): an on-prem node is billed while
   it holds any replica, so the free slots of on-prem nodes that hold replicas are filled, at no
   cost, within ``max_total``, on pools that take replicas (not pinned, drained or unavailable).
   They are spares (``PlacementResult.paid_spare``, recorded in the spare state as the hedge's
   are, no demand for the pipeline; step 2 trims them with any excess and this step fills the
   slots again, so the placement holds still): on the benchmark's step (a third of the load for 30 minutes, then
   three times that) the fleet holds 8 ready replicas on two on-prem nodes where the total asks 7.
   Then the **warm spot node** (``placement.warm_spot_at``; the pipeline says when: ``warm_spot``,
   :func:`warm_spot`): when no spot pool holds a replica, one spare on the spot pool with the most
   replicas per node (then the cheapest replica-hour) among the ``spot_spread_min_pools`` cheapest
   (those step 4 fills first) whose nodes hold more than one, within ``max_total``, ``max_cloud``
   and the budget (``PlacementResult.warm_spare``, a spare as above). Its node is billed whole, so
   when the load steps beyond on-prem the node's free slots serve after the cold start alone,
   where a new node serves after the pool's provisioning delay and the cold start.

Each rule is a function of ``place``'s (``_keep_valid``, ``_trim_excess``, ``_trim_cloud``, ``_trim_to_budget``,
``_fill``, ``_repair_spread``, ``_fill_hedge``, ``_return_from_fallback``, ``_spares``, then ``_shortfall`` and ``_reason`` for what shaped the result);
they work on private per-pool views and return what they did with their events (reason code,
message), which ``PlacementResult.events`` lists in that order.

Cost = sum over pools of whole nodes for the replicas times the node price per hour
(``controller.core.pricing``, the one definition the budget, the daemon and the simulator share).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Collection, Mapping, NamedTuple

from controller.core.model import ModelSpec, PoolSpec, PoolState, Tier, fast_init
from controller.core.pricing import replica_price, whole_nodes
from controller.core.reasons import (  # the codes as plain strings: see controller.core.reasons
    Reason,
    PLACED as _PLACED,
    BUDGET_CAP_REACHED as _BUDGET_CAP_REACHED,
    CAPACITY_EXHAUSTED as _CAPACITY_EXHAUSTED,
    OVERRIDE_DRAIN as _OVERRIDE_DRAIN,
    SPOT_INTERRUPTED as _SPOT_INTERRUPTED,
    SPOT_POOL_UNAVAILABLE as _SPOT_POOL_UNAVAILABLE,
    POOL_UNAVAILABLE as _POOL_UNAVAILABLE,
    ON_DEMAND_FALLBACK as _ON_DEMAND_FALLBACK,
    HELD_NOT_REPLACED as _HELD_NOT_REPLACED,
    SPOT_HEDGE as _SPOT_HEDGE,
    FALLBACK_RETURN as _FALLBACK_RETURN,
)
from controller.core.spec import Placement as PlacementSpec

DEFAULT_PLACEMENT = PlacementSpec.model_validate({})
"""Used when no placement spec is given (built once: pydantic models are not built per call)."""

_EPS_USD = 1e-9
"""Slack on budget comparisons, US dollars per hour: float sums must not flip a decision."""

_ONPREM, _SPOT, _ONDEMAND = 0, 1, 2  # Tier.rank of each tier
"""Looked up once per pool and call: enum properties are slow in hot loops."""


class _Pool:
    """Working state of one pool during ``place`` (mutable, private, never returned)."""

    __slots__ = ("name", "spec", "tier", "priority", "per_node", "capacity", "price", "eff_cost",
                 "current", "ready", "kept", "replicas", "accepts", "pinned", "usable")

    def __init__(self, name: str, spec: PoolSpec | None, state: PoolState | None, model: ModelSpec) -> None:
        self.name = name
        self.spec = spec
        if state is None:
            self.current = self.ready = 0
            limit = live = None
        else:  # max(0, ...) as conditionals: a builtin call per pool and decision (hot path)
            r, ready = state.replicas, state.ready_replicas
            limit, live = state.max_nodes, state.price_per_node_hour_usd
            self.current = current = 0 if r is None or r < 0 else r
            # unknown readiness counts as ready: never cancel first what cannot be seen starting
            self.ready = current if ready is None else 0 if ready < 0 else ready
        self.kept = self.replicas = 0
        self.accepts = self.pinned = False
        if spec is None:
            self.tier, self.priority, self.per_node, self.capacity = _ONDEMAND, 0, 0, 0
            self.price, self.eff_cost, self.usable = 0.0, math.inf, False
            return
        tier = spec.tier  # Tier.rank inlined: a property call per pool and decision (hot path)
        self.tier = _ONPREM if tier is Tier.ONPREM else _SPOT if tier is Tier.SPOT else _ONDEMAND
        self.priority = spec.priority
        per_node = self.per_node = spec.replicas_per_node(model)
        bound = spec.max_nodes if limit is None else min(spec.max_nodes, max(0, limit))
        self.capacity = bound * per_node
        # pricing.pool_price inlined (a call per pool and decision): the live price, else the spec's
        self.price = price = spec.price_per_node_hour_usd if live is None else live
        # pricing.replica_price, with the price and replicas per node this pool already holds: hot loop
        self.eff_cost = price / per_node if per_node > 0 else math.inf
        self.usable = per_node > 0

    def nodes(self) -> int:
        return whole_nodes(self.replicas, self.per_node)

    def cost(self) -> float:
        r, per_node = self.replicas, self.per_node  # nodes() (pricing.whole_nodes) inlined: hot loop
        return (0 if r <= 0 else r if per_node <= 0 else -(-r // per_node)) * self.price

    def add_cost(self) -> float:
        """Extra cost per hour of one more replica: a new node, or nothing when one has room."""
        return self.price if self.replicas % self.per_node == 0 else 0.0

    def remove_saving(self) -> float:
        """Cost per hour saved by one replica fewer: a node, when it was the last on its node."""
        return self.price if self.replicas > 0 and (self.replicas - 1) % self.per_node == 0 else 0.0

    rank = operator.attrgetter("eff_cost", "priority", "name")
    """The fill order within a tier: cheapest replica-hour first, then priority, then name (a C-level
    key: pools are sorted by it several times a decision)."""

    def not_ready(self) -> int:
        """Of its replicas now, those not serving yet (still provisioning or starting)."""
        return max(0, self.replicas - self.ready)


@fast_init
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
    ``OverrideDrain``, ``HeldNotReplaced``, ``SpotInterrupted``, ``SpotPoolUnavailable``,
    ``PoolUnavailable``, ``OnDemandFallback`` or ``Placed``."""
    events: tuple[tuple[str, str], ...]
    """(reason code, message) for everything noteworthy, in the order it happened."""
    interrupted_removed: int = 0
    """Replicas taken off nodes with interruption notices."""
    interrupted_replaced: int = 0
    """Of those, how many were replaced in other pools in this placement."""
    not_replaced: int = 0
    """Replicas of ``requested`` that only the scale-down memory held and no pool kept (not bought
    in the cloud), or that were on-demand orders not ready yet (cancelled): ``place``'s
    ``window_held``, reason ``HeldNotReplaced``."""
    capacity_limited: bool = False
    """Fewer than ``requested`` because no usable pool had room."""
    budget_limited: bool = False
    """The budget removed replicas or stopped additions that had room."""
    budget_removed: int = 0
    """Replicas removed from the kept placement to get within the budget."""
    cap_usd: float | None = None
    """The cost ceiling applied, USD per hour."""
    hedge_spare: int = 0
    """Spare replicas above the total held by the spot hedge (``placement.spot_hedge``)."""
    return_spare: int = 0
    """Spare replicas above the total (and the hedge's) that are replacements for on-demand
    replicas (``placement.return_from_fallback``): the on-demand replicas go when they serve."""
    return_released: int = 0
    """On-demand replicas released because the previous decision's replacements serve."""
    paid_spare: int = 0
    """Spare replicas above the total (and the other spares) in the free slots of on-prem nodes
    already billed (``placement.fill_paid_nodes``)."""
    warm_spare: int = 0
    """The warm spot node's spare replica (``placement.warm_spot_at``; ``place``'s ``warm_spot``)."""
    why: tuple[str, ...] = ()
    """Why each pool got what it got, for people: the order pools were filled in with the
    replica-hour prices that set it (``gcp-spot before aws-spot: $3.75 vs $3.79 per replica-hour``),
    pools that are full, on-demand left out by the policy."""

    @property
    def total(self) -> int:
        return sum(self.replicas.values())

    @property
    def spare(self) -> int:
        """Replicas above the total asked for that are no demand: the hedge's, the replacements, the
        paid slots' and the warm spot node's."""
        return self.hedge_spare + self.return_spare + self.paid_spare + self.warm_spare

    def message(self) -> str:
        pools = ", ".join([f"{k}={v}" for k, v in self.replicas.items()])
        head = f"placed {self.total} of {self.requested}: {pools}; ${self.cost_per_hour_usd:.2f}/h"
        parts = [msg for _, msg in self.events] + [f"why: {w}" for w in self.why]
        return "; ".join([head, *parts])


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
        key = (tier, replica_price(spec, model, states.get(name)), spec.priority, name)
        if best is None or key < best:
            best = key
    return None if best is None else best[3]


@dataclass(slots=True)
class _Kept:
    """Step 1's value: the pools' working views with what stays of the current placement, and
    what had to leave (mutable, private, never returned)."""

    views: list[_Pool] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)
    moved_off: dict[str, int] = field(default_factory=dict)
    """Replicas that had to leave their pool, per reason code."""
    interrupted_removed: int = 0

    def move_off(self, code: str, replicas: int) -> None:
        self.moved_off[code] = self.moved_off.get(code, 0) + replicas


class _Trim(NamedTuple):
    """Step 3's value: what the budget removed from the kept placement."""

    cost: float
    removed: int
    onprem: bool
    """On-prem replicas had to go: cloud replicas would only replace them."""
    events: list[tuple[str, str]]


class _Fill(NamedTuple):
    """Step 4's value: what was added for the total, and what of it was not bought (held by the
    scale-down memory only)."""

    cost: float
    added: int
    on_demand: int
    events: list[tuple[str, str]]
    not_bought: int = 0


class _Shortfall(NamedTuple):
    """Why the placement has fewer replicas than asked, if it has."""

    capacity_limited: bool
    budget_limited: bool
    events: list[tuple[str, str]]


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
    max_total: int | None = None,
    max_cloud: int | None = None,
    returning: int = 0,
    window_held: int = 0, warm_spot: bool = False,
) -> PlacementResult:
    """Replicas per pool for ``total`` replicas of ``model``, by the module docstring's steps.

    ``states`` gives each pool's current replicas (``None`` reads as 0 here: the pipeline refuses
    to place before every pool has been observed), readiness, availability, interruption notices
    and live price. ``drained`` pools get nothing. ``pinned`` pools get exactly their pin (capped
    by capacity) and are neither filled nor trimmed for the total, only for the budget (last).
    ``max_cost_per_hour_usd`` is the ceiling on the placement's cost. ``max_total`` bounds the
    total with the spares (the spot hedge's, none with pins; the fallback return's). ``max_cloud``
    caps the replicas on the unpinned cloud pools, spares included (``None``: no cap).
    ``returning``: the previous decision's ``return_spare`` (step 2 cancels those still starting).
    ``window_held``: of ``total``, what only the scale-down memory holds (steps 2 and 4); ``warm_spot``: step 8's.
    """
    cap = max_cost_per_hour_usd
    kept = _keep_valid(model, pools, states, placement, drained, pinned or {})
    views = kept.views
    want = max(total, sum([p.replicas for p in views if p.pinned]))
    risk = _spot_risk(views, states, placement.spot_hedge, want if pinned else max_total, want)
    cancelled = _trim_excess(views, want + risk.spare, returning)
    held = _cancel_held_orders(views, window_held, want - window_held, risk.spare + returning)
    want -= held.replicas
    released = _released(views, returning - cancelled) if returning > cancelled else _NO_RETURN
    cloud_events = _trim_cloud(views, max_cloud)
    trim = _trim_to_budget(views, cap)
    fill = _fill(views, want, trim, cap, placement, max_cloud, window_held - held.replicas)
    want -= fill.not_bought
    spread = _repair_spread(views, fill.cost, cap, placement.spot_spread_min_pools)
    hedge = _fill_hedge(views, want, risk, cap, placement, max_cloud)
    back = _return_from_fallback(views, cap, max_total, max_cloud, risk.interrupted, placement)
    paid = _spares(views, placement, warm_spot, max_total, max_cloud, cap)
    short = _shortfall(views, want, cap, placement.allow_on_demand, trim.removed, max_cloud)
    return PlacementResult(
        replicas={p.name: p.replicas for p in views},
        cost_per_hour_usd=sum([p.cost() for p in views]),
        requested=total,
        kept={p.name: p.kept for p in views},
        reason=_hedge_reason(_return_reason(_reason(kept, short, fill, held.replicas), released, back), hedge),
        events=tuple(kept.events + held.events + released.events + cloud_events + trim.events + fill.events + spread
                     + hedge.events + back.events + paid.events + short.events),
        hedge_spare=hedge.spare, paid_spare=paid.spare, warm_spare=paid.warm, return_spare=back.replicas, return_released=released.replicas,
        interrupted_removed=kept.interrupted_removed,
        interrupted_replaced=min(kept.interrupted_removed, fill.added), not_replaced=fill.not_bought + held.replicas,
        capacity_limited=short.capacity_limited, budget_limited=short.budget_limited,
        budget_removed=trim.removed, cap_usd=cap,
        why=_why(views, placement.allow_on_demand),
    )


def _keep_valid(model: ModelSpec, pools: Mapping[str, PoolSpec], states: Mapping[str, PoolState],
                placement: PlacementSpec, drained: Collection[str], pinned: Mapping[str, int]) -> _Kept:
    """Step 1: what stays valid of the current placement, pool by pool in the model's order.
    Unusable and drained pools keep nothing; pinned pools get their pin; the others keep what is
    still valid of their replicas."""
    kept = _Kept()
    allowed = placement.pools
    for name in model.pools:
        state = states.get(name)
        p = _Pool(name, pools.get(name), state, model)
        kept.views.append(p)
        if not p.usable or (allowed is not None and name not in allowed):
            _unusable(kept, p, model, allowed)
        elif name in drained:
            kept.events.append((_OVERRIDE_DRAIN, f"{name} drained: moving {p.current}"))
            if p.current:
                kept.move_off(_OVERRIDE_DRAIN, p.current)
        elif name in pinned:
            p.pinned = True
            p.kept = p.replicas = min(max(0, pinned[name]), p.capacity)
        else:
            _keep_current(kept, p, state, placement)
    return kept


def _unusable(kept: _Kept, p: _Pool, model: ModelSpec, allowed: Collection[str] | None) -> None:
    """A pool the model cannot use (no pool spec, not allowed by the policy, no engine for its GPU
    type) keeps nothing and takes nothing."""
    p.usable = False
    if not p.current:
        return
    spec = p.spec
    why = ("no pool spec" if spec is None else
           "not allowed by the policy" if allowed is not None and p.name not in allowed else
           f"no engine for GPU {spec.gpu_type} x{spec.gpus_per_node} at TP {model.tp_degree}")
    kept.events.append((_POOL_UNAVAILABLE, f"{p.name} unusable ({why}): moving {p.current}"))
    kept.move_off(_POOL_UNAVAILABLE, p.current)


def _unavailable(p: _Pool, state: PoolState | None, placement: PlacementSpec) -> tuple[str, str] | None:
    """(reason code, why) when the pool takes no new replicas: unavailable, or a spot pool with
    more recent interruptions than the policy accepts."""
    if state is None:
        return None
    if not state.available:
        code = (Reason.SPOT_POOL_UNAVAILABLE if p.tier == _SPOT else Reason.POOL_UNAVAILABLE).value
        return code, state.unavailable_reason or "unavailable"
    if p.tier == _SPOT and state.recent_interruptions > placement.max_recent_interruptions:
        return (_SPOT_POOL_UNAVAILABLE,
                f"{state.recent_interruptions} recent interruptions > {placement.max_recent_interruptions}")
    return None


def _keep_current(kept: _Kept, p: _Pool, state: PoolState | None, placement: PlacementSpec) -> None:
    """A usable pool's current replicas, less those on interrupted nodes, those still waiting for a
    node on an unavailable pool, and those beyond its capacity."""
    keep = p.current
    accepts = True
    if state is not None and state.interrupted_replicas > 0 and keep > 0:
        gone = min(state.interrupted_replicas, keep)
        keep -= gone
        kept.interrupted_removed += gone
        accepts = False  # the noticed nodes are going away: replace elsewhere, not here
        kept.events.append((_SPOT_INTERRUPTED, f"{p.name}: {gone} replicas on interrupted nodes"))
    unavailable = _unavailable(p, state, placement)
    if unavailable is not None:
        accepts = False
        code, why = unavailable
        stay, starting = _stay_on_unavailable(keep, state)
        if stay < keep:
            kept.move_off(code, keep - stay)
        kept.events.append((code, f"{p.name} unavailable ({why}): keeps {stay} of {keep}"
                                  + (f" ({starting} starting on nodes that are up)" if starting else "") + ", no new"))
        keep = stay
    if keep > p.capacity:
        kept.events.append((_CAPACITY_EXHAUSTED, f"{p.name} holds {keep} but fits {p.capacity}"))
        keep = p.capacity
    p.kept = p.replicas = keep
    p.accepts = accepts and p.capacity > 0


def _stay_on_unavailable(keep: int, state: PoolState | None) -> tuple[int, int]:
    """Of ``keep`` replicas on an unavailable pool, (those that stay, of them those still
    starting): the ready ones and those starting on a node that is up
    (``PoolState.scheduled_replicas``, less those on noticed nodes). An order that launched part
    of its nodes before the capacity ran out keeps what launched, and only the replicas still
    waiting for a node move. Unknown readiness keeps them all (never release what cannot be
    seen); unknown scheduling keeps the ready ones."""
    if state is None or state.ready_replicas is None:
        return keep, 0
    ready = max(0, state.ready_replicas)
    if state.scheduled_replicas is None:
        return min(keep, ready), 0
    stay = min(keep, max(ready, state.scheduled_replicas - state.interrupted_replicas))
    return stay, max(0, stay - ready)


def _trim_order(views: list[_Pool], tiers: tuple[int, ...]) -> list[_Pool]:
    """Unpinned pools of ``tiers`` holding replicas, in removal order: higher tier first, dearest
    first within a tier."""
    return sorted((p for p in views if not p.pinned and p.replicas > 0 and p.tier in tiers), key=_removal_key)


def _removal_key(p: _Pool) -> tuple[int, float, int, str]:
    """Removal order: higher tier first, dearest replica-hour first, then higher priority, then name."""
    return -p.tier, -p.eff_cost, -p.priority, p.name


def _remove(order: list[_Pool], excess: int, not_ready_only: bool = False) -> int:
    """Remove up to ``excess`` replicas from ``order``: first those not ready yet, cloud pools only
    (a cloud order still provisioning is cancelled before a replica that serves), then tier by
    tier, emptying the nodes that save the most (:func:`_remove_emptying_nodes`).
    ``not_ready_only``: those not ready yet only, on-prem ones too. Returns the replicas removed."""
    removed = 0
    for p in order:
        if removed >= excess:
            return removed
        if p.tier == _ONPREM and not not_ready_only:
            continue
        take = min(p.not_ready(), excess - removed)
        p.replicas -= take
        removed += take
    if not_ready_only:
        return removed
    for tier in sorted({p.tier for p in order}, reverse=True):  # the order's tiers, higher first
        if removed >= excess:
            break
        removed += _remove_emptying_nodes([p for p in order if p.tier == tier], excess - removed)
    return removed


EXACT_SCALE_IN = 32
"""A scale-in of at most this many replicas within a tier is placed by an exact search over the
splits (:func:`_cheapest_split`: pools x replicas squared steps); a larger one by the greedy
:func:`_empty_nodes_greedily` (pools x nodes steps). ``python bench/scale_in.py`` times both: taking 505 of 1,010 replicas over
four pools, the exact search 299 ms, ``place()`` with the greedy split 0.23 ms, for the same cost
(on the 110-replica fleet the greedy split leaves $1/h more of $346)."""


def _remove_emptying_nodes(pools: list[_Pool], excess: int) -> int:
    """Remove ``excess`` replicas (at most what they hold) from ``pools``, one tier in removal
    order, so that the nodes they empty save the most per hour; on a tie, from pools earlier in
    the order (dearest replica-hour first). A replica alone on a node of four costs the whole
    node, and taking it saves that; taking one of four off a full node saves nothing until the
    other three go. Run only when the total falls. Returns the replicas removed."""
    excess = min(excess, sum([p.replicas for p in pools]))
    if excess <= 0:
        return 0
    if len(pools) == 1:
        pools[0].replicas -= excess
        return excess
    if excess > EXACT_SCALE_IN:
        return _empty_nodes_greedily(pools, excess)
    for p, k in zip(pools, _cheapest_split(pools, excess)):
        p.replicas -= k
    return excess


def _cheapest_split(pools: list[_Pool], excess: int) -> tuple[int, ...]:
    """Replicas to take from each of ``pools`` (``excess`` in all, at most what they hold) that
    save the most per hour; ties: from pools earlier in the order. An exact search over the splits."""
    # best[j]: (saving per hour, preference, replicas taken per pool) for j replicas taken so far
    best: list[tuple[float, float, tuple[int, ...]] | None] = [(0.0, 0.0, ())] + [None] * excess
    for i, p in enumerate(pools):
        rank = float(len(pools) - i)
        nodes = p.nodes()
        saved = [(nodes - whole_nodes(p.replicas - k, p.per_node)) * p.price for k in range(min(p.replicas, excess) + 1)]
        nxt: list[tuple[float, float, tuple[int, ...]] | None] = [None] * (excess + 1)
        for j, got in enumerate(best):
            if got is None:
                continue
            for k in range(min(p.replicas, excess - j) + 1):
                cand = (got[0] + saved[k], got[1] + k * rank, (*got[2], k))
                cur = nxt[j + k]
                if cur is None or (round(cand[0], 6), cand[1]) > (round(cur[0], 6), cur[1]):
                    nxt[j + k] = cand
        best = nxt
    chosen = best[excess]
    assert chosen is not None  # excess is at most what the pools hold: some split takes exactly that
    return chosen[2]


def _empty_nodes_greedily(pools: list[_Pool], excess: int) -> int:
    """:func:`_remove_emptying_nodes` for a large scale-in: empty whole nodes, each time the one
    that saves the most per replica taken (:func:`_next_node`) while it fits in what is left, then
    take the rest in removal order. Not always the best split (it is a knapsack); where taking
    replicas in removal order alone costs less, that."""
    before = [p.replicas for p in pools]
    in_order = _take_in_order(pools, excess)
    by_order = [p.replicas for p in pools]
    cost_in_order = sum([p.cost() for p in pools])
    for p, n in zip(pools, before):
        p.replicas = n
    left = excess
    while (node := _next_node(pools, left)) is not None:
        node[0].replicas -= node[1]
        left -= node[1]
    removed = excess - left + _take_in_order(pools, left)
    if sum([p.cost() for p in pools]) > cost_in_order:
        for p, n in zip(pools, by_order):
            p.replicas = n
        return in_order
    return removed


def _next_node(pools: list[_Pool], left: int) -> tuple[_Pool, int] | None:
    """The pool whose least-filled node saves the most per replica taken to empty it, and its
    replicas, among those at most ``left`` (ties: earlier in the order); ``None`` if none fits."""
    pick: tuple[float, int, _Pool, int] | None = None
    for i, p in enumerate(pools):
        on_last = p.replicas - (p.nodes() - 1) * p.per_node if p.per_node > 0 else 1
        if p.replicas > 0 and p.price > 0 and on_last <= left and (pick is None or p.price / on_last > pick[0]):
            pick = (p.price / on_last, i, p, on_last)
    return None if pick is None else (pick[2], pick[3])


def _take_in_order(pools: list[_Pool], n: int) -> int:
    """Take up to ``n`` replicas from ``pools`` in their order; returns how many."""
    left = n
    for p in pools:
        take = min(p.replicas, left)
        p.replicas -= take
        left -= take
    return n - left


class _Held(NamedTuple):
    """What :func:`_cancel_held_orders` did."""

    replicas: int
    events: list[tuple[str, str]]


_NO_HELD = _Held(0, [])


def _cancel_held_orders(views: list[_Pool], window_held: int, asked: int, spares: int) -> _Held:
    """Step 2, last: of the ``window_held`` replicas only the scale-down memory holds (at most as
    many as the placement holds above the rules' ``asked`` total: never one the rules' own need
    would then buy elsewhere), the on-demand ones not ready yet that the trim left are cancelled,
    dearest first, whole nodes only. An on-demand order serves after its lead time (provisioning
    and cold start), by when the window has let the total go, and it is the dearest capacity
    there is: kept, it was paid for while it started and released about when it would have
    served (ordered as a spot pool was lost during the hold). Spot orders stay (cancelling them
    as well lost 5.7 points on the Azure code trace's first half hour, where bursts recur sooner
    than their lead time). Not while spares are held (the spot hedge's, the fallback return's
    replacements): an on-demand order may be one."""
    if window_held <= 0 or spares > 0:  # the common case first: no sum on the hot path
        return _NO_HELD
    window_held = min(window_held, sum([p.replicas for p in views]) - asked)
    if window_held <= 0:
        return _NO_HELD
    gone = 0
    for p in _trim_order(views, (_ONDEMAND,)):
        if p.per_node <= 0:
            continue
        # whole nodes only: a replica taken off a node that stays saves nothing and serves less
        left = p.replicas - min(p.not_ready(), window_held - gone)
        take = max(0, p.replicas - whole_nodes(left, p.per_node) * p.per_node)
        p.replicas -= take
        gone += take
    if not gone:
        return _NO_HELD
    return _Held(gone, [(_HELD_NOT_REPLACED, f"{gone} on-demand not ready yet, held by the scale-down window only: "
                                             "order cancelled")])


def _trim_excess(views: list[_Pool], want: int, returning: int) -> int:
    """Step 2, too many: the previous decision's fallback-return replacements still starting go
    first (up to ``returning``: replicas not ready yet on the on-prem and spot pools; step 7 orders
    them again), then not-ready cloud replicas, then on-demand, then spot, on-prem last; most
    expensive first within a tier; pinned pools keep their pin. Returns the replacements cancelled."""
    excess = sum([p.replicas for p in views]) - want
    if excess <= 0:
        return 0
    cancelled = _remove(_trim_order(views, (_ONPREM, _SPOT)), min(excess, returning), True) if returning > 0 else 0
    _remove(_trim_order(views, (_ONPREM, _SPOT, _ONDEMAND)), excess - cancelled)
    return cancelled


def _cloud(views: list[_Pool]) -> int:
    """Replicas on the unpinned cloud pools."""
    return sum(p.replicas for p in views if p.tier != _ONPREM and not p.pinned)


def _trim_cloud(views: list[_Pool], max_cloud: int | None) -> list[tuple[str, str]]:
    """Step 2, lead-time ceiling: the unpinned cloud pools keep at most ``max_cloud`` replicas,
    not-ready ones removed first, then on-demand before spot, dearest first."""
    excess = 0 if max_cloud is None else _cloud(views) - max(0, max_cloud)
    if excess <= 0:
        return []
    removed = _remove(_trim_order(views, (_SPOT, _ONDEMAND)), excess)
    return [(Reason.CLOUD_RELEASED.value, f"cloud ceiling {max_cloud}: removed {removed} cloud replicas")]


def _trim_to_budget(views: list[_Pool], cap: float | None) -> _Trim:
    """Step 3, budget: while the cost is above the cap, remove whole nodes, cloud before on-prem,
    unpinned before pinned, dearest first."""
    cost = sum([p.cost() for p in views])
    if cap is None or cost <= cap + _EPS_USD:
        return _Trim(cost, 0, False, [])
    before = cost
    removed = 0
    onprem = False
    order = sorted((p for p in views if p.replicas > 0 and p.price > 0),
                   key=lambda p: (p.tier == _ONPREM, p.pinned, -p.tier, -p.eff_cost, -p.priority, p.name))
    for p in order:
        n, cost = _remove_nodes(p, cost, cap)
        removed += n
        onprem = onprem or (n > 0 and p.tier == _ONPREM)
        if cost <= cap + _EPS_USD:
            break
    event = (_BUDGET_CAP_REACHED, f"${before:.2f}/h over the ${cap:.2f}/h cap: removed {removed} replicas")
    return _Trim(sum(p.cost() for p in views), removed, onprem, [event])


def _remove_nodes(p: _Pool, cost: float, cap: float) -> tuple[int, float]:
    """Remove ``p``'s replicas a whole node at a time while the cost is above the cap:
    (replicas removed, new cost)."""
    removed = 0
    while p.replicas > 0 and cost > cap + _EPS_USD:
        last_node = p.replicas - (p.nodes() - 1) * p.per_node
        p.replicas -= last_node
        removed += last_node
        cost -= p.price
    return removed, cost


def _ranked(views: list[_Pool], tier: int) -> list[_Pool]:
    """The pools of ``tier`` that take new replicas, cheapest first."""
    return sorted((p for p in views if p.accepts and p.tier == tier), key=_Pool.rank)


def _fill(views: list[_Pool], want: int, trim: _Trim, cap: float | None, placement: PlacementSpec,
          max_cloud: int | None = None, window_held: int = 0) -> _Fill:
    """Step 4, too few: on-prem, then spot (spread), then on-demand, the cloud tiers within
    ``max_cloud``; each replica only within the budget. The ``window_held`` replicas of ``want``
    (the scale-down memory's, above what the rules ask now) take on-prem room and free slots on
    cloud nodes already paid for, but no cloud node is bought for them: a cloud order serves after
    its lead time, by when the window has let them go (``HeldNotReplaced``)."""
    cost = trim.cost
    need = want - sum([p.replicas for p in views])
    if need <= 0:
        return _Fill(cost, 0, 0, [])
    added, cost = _fill_tier(_ranked(views, _ONPREM), need, cost, cap)
    cloud_room = need if max_cloud is None else max(0, max_cloud - _cloud(views))
    # Budget already forced on-prem replicas out: cloud replicas would only replace them.
    if added >= need or trim.onprem or cloud_room <= 0:
        return _Fill(cost, added, 0, [])
    held = _not_to_buy(views, window_held, need - added, trim, placement, max_cloud)
    n, on_demand, cost = _fill_cloud(views, min(need - added - held, cloud_room), cost, cap, placement)
    free = on_demand_free = 0
    if held:
        free, on_demand_free = _fill_free_slots(views, held, cloud_room - n, placement.allow_on_demand)
    events = [(_HELD_NOT_REPLACED, f"{held - free} of {want} held by the scale-down window only: not bought in the "
                                   "cloud" + (f" ({free} on nodes already paid for)" if free else ""))] if held > free else []
    on_demand += on_demand_free
    if on_demand:
        events.append((_ON_DEMAND_FALLBACK, f"on-prem and spot full: {on_demand} on on-demand"))
    return _Fill(cost, added + n + free, on_demand, events, held - free)


def _not_to_buy(views: list[_Pool], window_held: int, short: int, trim: _Trim, placement: PlacementSpec,
                max_cloud: int | None) -> int:
    """Of the ``short`` replicas the cloud would be asked for, those only the scale-down window
    holds (at most what the cloud could take). None when the budget removed replicas: the budget
    says why the rest is short, not the window."""
    if trim.removed or window_held <= 0:
        return 0
    return min(window_held, short, _cloud_room(views, placement.allow_on_demand, max_cloud))


def _fill_cloud(views: list[_Pool], n: int, cost: float, cap: float | None, placement: PlacementSpec
                ) -> tuple[int, int, float]:
    """Up to ``n`` replicas on spot (spread), then on-demand when allowed: (added, of them on
    on-demand, new cost)."""
    if n <= 0:
        return 0, 0, cost
    added, cost = _fill_spot(_ranked(views, _SPOT), n, cost, cap, placement.spot_spread_min_pools)
    on_demand = 0
    if added < n and placement.allow_on_demand:
        on_demand, cost = _fill_tier(_ranked(views, _ONDEMAND), n - added, cost, cap)
    return added + on_demand, on_demand, cost


def _fill_free_slots(views: list[_Pool], n: int, room: int, allow_on_demand: bool) -> tuple[int, int]:
    """Up to ``n`` replicas (within ``room``) into the free slots of cloud nodes the placement
    already pays for (a replica there costs nothing more), spot first, cheapest first: (added, of
    them on on-demand)."""
    added = on_demand = 0
    for p in sorted(_cloud_takers(views, allow_on_demand), key=_tier_rank):
        k = min(min(p.nodes() * p.per_node, p.capacity) - p.replicas, n - added, room - added)
        if k > 0:
            p.replicas += k
            added += k
            on_demand += k if p.tier == _ONDEMAND else 0
    return added, on_demand


def _fill_tier(ranked: list[_Pool], need: int, cost: float, cap: float | None) -> tuple[int, float]:
    """Fill ``ranked`` pools in order, each as far as room and budget allow: (added, new cost)."""
    added = 0
    for p in ranked:
        if added >= need:
            break
        n = _affordable(p, need - added, cost, cap)
        if n > 0:
            cost += _grow(p, n)
            added += n
    return added, cost


def _fill_spot(spot: list[_Pool], need: int, cost: float, cap: float | None, spread: int) -> tuple[int, float]:
    """One replica at a time over the ``spread`` cheapest open spot pools (to the one with the
    fewest, ties to the cheaper), else the next affordable one: (added, new cost)."""
    added = 0
    while added < need:
        open_pools = [p for p in spot if p.replicas < p.capacity]
        if not open_pools:
            break
        first = min(open_pools[:spread], key=lambda p: p.replicas)  # ties: first = cheaper
        chosen, delta = _first_affordable([first] + [q for q in open_pools if q is not first], cost, cap)
        if chosen is None:
            break
        chosen.replicas += 1
        cost += delta
        added += 1
    return added, cost


def _first_affordable(candidates: list[_Pool], cost: float, cap: float | None,
                      saving: float = 0.0) -> tuple[_Pool | None, float]:
    """The first candidate one more replica fits on within the cap (less ``saving`` elsewhere), and
    the change of cost; ``None`` with the last change tried when none fits."""
    delta = 0.0
    for p in candidates:
        delta = p.add_cost() - saving
        if cap is None or cost + delta <= cap + _EPS_USD:
            return p, delta
    return None, delta


def _repair_spread(views: list[_Pool], cost: float, cap: float | None, spread: int) -> list[tuple[str, str]]:
    """Step 5, spread repair: more than one spot replica should not sit in fewer pools than asked
    for; move replicas from the fullest spot pool to the cheapest empty one, within the budget."""
    spot = [p for p in views if p.tier == _SPOT and p.usable]
    target = min(spread, sum([p.replicas for p in spot])) if spread >= 2 else 0
    nonempty = len([p for p in spot if p.replicas > 0])
    if target < 2 or nonempty >= target:
        return []
    return _spread_moves(spot, target, target - nonempty, cost, cap)


def _spread_moves(spot: list[_Pool], target: int, moves: int, cost: float, cap: float | None
                  ) -> list[tuple[str, str]]:
    """Up to ``moves`` single-replica moves from the fullest spot pool to the cheapest empty one
    that takes replicas and fits within the cap; the events say what moved, or that the budget
    stopped it."""
    dests = sorted((p for p in spot if p.accepts and p.replicas == 0 and p.capacity > 0), key=_Pool.rank)
    events: list[tuple[str, str]] = []
    while len(events) < moves and dests:
        src = _spread_source(spot)
        if src is None:
            break
        moved_to, delta = _first_affordable(dests, cost, cap, src.remove_saving())
        if moved_to is None:
            events.append((_BUDGET_CAP_REACHED,
                           f"spot spread over {target} pools would exceed the ${cap:.2f}/h cap"))
            break
        src.replicas -= 1
        moved_to.replicas += 1
        cost += delta
        dests.remove(moved_to)
        events.append((_PLACED, f"spot spread: moved 1 from {src.name} to {moved_to.name}"))
    return events


def _spread_source(spot: list[_Pool]) -> _Pool | None:
    """The spot pool a replica moves from to spread: the fullest unpinned one holding two or more
    (ties: the dearer, then the later name)."""
    sources = [p for p in spot if not p.pinned and p.replicas >= 2]
    return max(sources, key=lambda p: (p.replicas, p.eff_cost, p.name)) if sources else None


def _room(views: list[_Pool], allow_on_demand: bool, max_cloud: int | None = None) -> int:
    """Replicas the pools that take new ones could still hold (the cloud ones within ``max_cloud``)."""
    onprem = sum(p.capacity - p.replicas for p in views if p.accepts and p.tier == _ONPREM)
    return onprem + _cloud_room(views, allow_on_demand, max_cloud)


def _cloud_takers(views: list[_Pool], allow_on_demand: bool) -> list[_Pool]:
    """The cloud pools that take new replicas (on-demand only when allowed)."""
    return [p for p in views if p.accepts and p.tier != _ONPREM and (p.tier != _ONDEMAND or allow_on_demand)]


def _cloud_room(views: list[_Pool], allow_on_demand: bool, max_cloud: int | None) -> int:
    """Replicas the cloud pools that take new ones could still hold, within ``max_cloud``."""
    cloud = sum(p.capacity - p.replicas for p in _cloud_takers(views, allow_on_demand))
    if max_cloud is not None:
        cloud = min(cloud, max(0, max_cloud - _cloud(views)))
    return cloud


def _shortfall(views: list[_Pool], want: int, cap: float | None, allow_on_demand: bool,
               budget_removed: int, max_cloud: int | None = None) -> _Shortfall:
    """Whether the placement falls short of ``want`` for lack of room or of budget (a shortfall
    the cloud ceiling makes is neither: the pipeline's lead-time stage sized the total to it)."""
    short = want - sum([p.replicas for p in views])
    room = _room(views, allow_on_demand, max_cloud) if short > 0 else 0
    capacity_limited = short > room
    events: list[tuple[str, str]] = []
    if capacity_limited:
        events.append((_CAPACITY_EXHAUSTED, f"no room for {short - room} of {want}"))
    if short > 0 and room > 0 and cap is not None:
        events.append((_BUDGET_CAP_REACHED, f"{min(short, room)} more would exceed the ${cap:.2f}/h cap"))
    return _Shortfall(capacity_limited, budget_removed > 0 or (short > 0 and room > 0), events)


def _why(views: list[_Pool], allow_on_demand: bool) -> tuple[str, ...]:
    """Why each pool got what it got: within each tier the fill order with the prices that set it
    (only pairs where one of the two holds replicas), full pools, on-demand left out."""
    usable = [p for p in views if p.usable]
    out = _order(usable)
    out.extend([f"{p.name} full: {p.replicas} of {p.capacity}" for p in usable
                if p.capacity > 0 and p.replicas >= p.capacity])
    if not allow_on_demand and any(p.tier == _ONDEMAND for p in usable):
        out.append("on-demand pools left out: the policy does not allow on-demand")
    return tuple(out)


def _order(usable: list[_Pool]) -> list[str]:
    """The fill order within each tier (on-prem, spot, on-demand), pair by pair, where one of the
    pair holds replicas (one sort: by tier, then as ``_Pool.rank``)."""
    ranked = sorted(usable, key=_tier_rank)
    return [_before(a, b) for a, b in zip(ranked, ranked[1:]) if a.tier == b.tier and (a.replicas or b.replicas)]


_tier_rank = operator.attrgetter("tier", "eff_cost", "priority", "name")
"""By tier, then as ``_Pool.rank``."""


def _before(a: _Pool, b: _Pool) -> str:
    """``a before b`` with what ordered them: the replica-hour price, else priority, else name."""
    if abs(a.eff_cost - b.eff_cost) > _EPS_USD:
        return f"{a.name} before {b.name}: ${a.eff_cost:.2f} vs ${b.eff_cost:.2f} per replica-hour"
    if a.priority != b.priority:
        return f"{a.name} before {b.name}: same ${a.eff_cost:.2f} per replica-hour, priority {a.priority} vs {b.priority}"
    return f"{a.name} before {b.name}: same ${a.eff_cost:.2f} per replica-hour and priority, by name"


def _reason(kept: _Kept, short: _Shortfall, fill: _Fill, held_cancelled: int) -> str:
    """The most significant reason code, in this order of precedence."""
    moved = kept.moved_off
    if short.budget_limited:
        return _BUDGET_CAP_REACHED
    if short.capacity_limited:
        return _CAPACITY_EXHAUSTED
    if moved.get(_OVERRIDE_DRAIN):
        return _OVERRIDE_DRAIN
    if fill.not_bought or held_cancelled:
        return _HELD_NOT_REPLACED
    if kept.interrupted_removed:
        return _SPOT_INTERRUPTED
    if moved.get(_SPOT_POOL_UNAVAILABLE):
        return _SPOT_POOL_UNAVAILABLE
    if moved.get(_POOL_UNAVAILABLE):
        return _POOL_UNAVAILABLE
    if fill.on_demand:
        return _ON_DEMAND_FALLBACK
    return _PLACED


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


# ---------------------------------------------------------------------------------------------
# Spot hedge (step 6), kept apart from the steps above
# ---------------------------------------------------------------------------------------------

SPARE_STATE_KEY = "@spot-hedge"
"""Key of the spares a decision held above its total in ``History.rule_state`` (the pipeline's
explicit state; rule names cannot start with ``@``): ``{"spare": n}``, the spot hedge's and the
fallback return's together, with ``"return": m`` where ``m`` of them are replacements for on-demand
replicas (step 7). The key keeps the name it had when only the hedge held spares: decision logs
written before read the same."""


class _Risk(NamedTuple):
    """What the spot hedge covers: replicas at risk per interrupted spot pool, every pool with a
    recent interruption, and the spare replicas to hold above the total."""

    at_risk: dict[str, int]
    interrupted: frozenset[str]
    spare: int
    factor: float


def _spot_risk(views: list[_Pool], states: Mapping[str, PoolState], factor: float, max_total: int | None,
               want: int) -> _Risk:
    """Replicas at risk per spot pool (``min(replicas kept, interrupted nodes x replicas per
    node)``) and the spare: ``ceil(factor x at risk)`` per pool, within ``max_total``."""
    at_risk: dict[str, int] = {}
    interrupted: set[str] = set()
    if factor <= 0:
        return _Risk(at_risk, frozenset(), 0, factor)
    spare = 0
    for p in views:
        state = states.get(p.name)
        if p.tier != _SPOT or state is None or state.recent_interruptions <= 0:
            continue
        interrupted.add(p.name)
        risk = min(p.kept, state.recent_interruptions * max(1, p.per_node))
        if risk > 0:
            at_risk[p.name] = risk
            spare += math.ceil(factor * risk - 1e-9)
    if max_total is not None:
        spare = max(0, min(spare, max_total - want))
    return _Risk(at_risk, frozenset(interrupted), spare, factor)


class _Hedge(NamedTuple):
    """Step 6's value: the spares held above the total and the events saying where."""

    spare: int
    events: list[tuple[str, str]]


def _fill_hedge(views: list[_Pool], want: int, risk: _Risk, cap: float | None, placement: PlacementSpec,
                max_cloud: int | None = None) -> _Hedge:
    """Step 6: hold ``risk.spare`` replicas above ``want``, away from interrupted pools: on-prem
    room, then spot pools with no recent interruption (spread), then on-demand; within the cap
    and, on the cloud tiers, within ``max_cloud``. Spares kept from earlier ticks count (step 2
    left them in place)."""
    if risk.spare <= 0:
        return _Hedge(0, [])
    held = sum(p.replicas for p in views) - want
    need = risk.spare - max(0, held)
    cost = sum(p.cost() for p in views)
    added_by: dict[int, int] = {}
    if need > 0:
        added_by = _add_spares(views, need, cost, cap, risk, placement, max_cloud)
    spare = max(0, sum(p.replicas for p in views) - want)
    return _Hedge(spare, [(_SPOT_HEDGE, _hedge_message(spare, risk, added_by))])


def _add_spares(views: list[_Pool], need: int, cost: float, cap: float | None, risk: _Risk,
                placement: PlacementSpec, max_cloud: int | None) -> dict[int, int]:
    """Add up to ``need`` spares: on-prem room, then uninterrupted spot pools, then on-demand
    (when allowed), the cloud ones within ``max_cloud``; the count added per tier."""
    added_by: dict[int, int] = {}
    n, cost = _fill_tier(_ranked(views, _ONPREM), need, cost, cap)
    added_by[_ONPREM] = n
    room = need if max_cloud is None else max(0, max_cloud - _cloud(views))
    safe = [p for p in _ranked(views, _SPOT) if p.name not in risk.interrupted]
    n, cost = _fill_spot(safe, min(room, need - sum(added_by.values())), cost, cap, placement.spot_spread_min_pools)
    added_by[_SPOT] = n
    if placement.allow_on_demand:
        n, cost = _fill_tier(_ranked(views, _ONDEMAND), min(room - n, need - sum(added_by.values())), cost, cap)
        added_by[_ONDEMAND] = n
    return added_by


def _hedge_message(spare: int, risk: _Risk, added_by: Mapping[int, int]) -> str:
    """``spot hedge: 2 spare for 4 replicas at risk (aws-spot 4; x0.5): added 2 on-prem``."""
    pools = ", ".join(f"{name} {n}" for name, n in sorted(risk.at_risk.items()))
    msg = f"spot hedge: {spare} spare for {sum(risk.at_risk.values())} replicas at risk ({pools}; x{risk.factor:g})"
    added = [f"{n} {tier}" for tier, n in (("on-prem", added_by.get(_ONPREM, 0)), ("spot", added_by.get(_SPOT, 0)),
                                           ("on-demand", added_by.get(_ONDEMAND, 0))) if n]
    if added:
        msg += ": added " + ", ".join(added)
    if spare < risk.spare:
        msg += f"; {risk.spare - spare} more found no room or budget"
    return msg


def _hedge_reason(reason: str, hedge: _Hedge) -> str:
    """``SpotHedge`` where the placement was otherwise unremarkable and holds spares."""
    return _SPOT_HEDGE if hedge.spare > 0 and reason == _PLACED else reason


WARM_STATE_KEY = "@warm-spot"
"""Key of the warm spot node's state in ``History.rule_state``: ``{"until": epoch seconds}`` while
it is held (:func:`warm_spot`); absent otherwise."""

class _Paid(NamedTuple):
    """Step 8's value: the spares added in the free slots of billed on-prem nodes, the warm spot
    node's, and where."""

    spare: int
    events: list[tuple[str, str]]
    warm: int = 0


_NO_PAID = _Paid(0, [])


def _spares(views: list[_Pool], placement: PlacementSpec, warm_spot: bool, max_total: int | None,
            max_cloud: int | None, cap: float | None) -> _Paid:
    """Step 8: the spares that cost little, each as the policy asks: the paid slots, then the warm
    spot node."""
    paid = _fill_paid(views, max_total) if placement.fill_paid_nodes else _NO_PAID
    if not warm_spot:
        return paid
    warm, events = _fill_warm(views, max_total, max_cloud, cap, placement.spot_spread_min_pools)
    return _Paid(paid.spare, paid.events + events, warm)


def _fill_warm(views: list[_Pool], max_total: int | None, max_cloud: int | None, cap: float | None,
               spread: int) -> tuple[int, list[tuple[str, str]]]:
    """One spare replica on a spot pool that takes replicas, when no spot pool holds any, within
    ``max_total``, ``max_cloud`` and the budget: (added, events). Only among the ``spread``
    cheapest (those step 4 fills first, so a step's replicas reach the warm node's free slots) whose
    nodes hold more than one replica (a node of one has no free slot to serve from): the most
    replicas per node, then the cheaper."""
    if any([p.replicas > 0 for p in views if p.tier == _SPOT]):
        return 0, []
    if _at_bound(views, max_total, max_cloud):
        return 0, [(_PLACED, "warm spot node: none (max_replicas or the cloud ceiling reached)")]
    cost = sum([p.cost() for p in views])
    for p in _warm_candidates(views, spread):
        if cap is None or cost + p.add_cost() <= cap + _EPS_USD:
            p.replicas += 1
            return 1, [(_PLACED, f"warm spot node: 1 on {p.name} (spare; a step beyond on-prem gets its "
                                 f"{p.per_node - 1} free slots after the cold start alone)")]
    return 0, [(_PLACED, f"warm spot node: none (no spot pool among the {spread} a scale-up fills first takes "
                         "replicas on nodes of more than one within the budget)")]


def _warm_candidates(views: list[_Pool], spread: int) -> list[_Pool]:
    """The ``spread`` cheapest spot pools that take replicas (not pinned) whose nodes hold more than
    one, by ``_warm_rank``."""
    ranked = [p for p in _ranked(views, _SPOT) if not p.pinned][:spread]
    return sorted([p for p in ranked if p.per_node > 1], key=_warm_rank)


def _at_bound(views: list[_Pool], max_total: int | None, max_cloud: int | None) -> bool:
    """No replica more fits within ``max_total`` or the cloud ceiling ``max_cloud``."""
    if max_total is not None and sum([p.replicas for p in views]) >= max_total:
        return True
    return max_cloud is not None and _cloud(views) >= max_cloud


def _warm_rank(p: _Pool) -> tuple[int, float, int, str]:
    """The warm spot node's pool: the most replicas per node first, then as ``_Pool.rank``."""
    return -p.per_node, p.eff_cost, p.priority, p.name


def warm_spot(state: Mapping[str, object], *, present: int | None, slots: int, at: float, hold_s: float,
              now_s: float) -> tuple[bool, dict[str, float]]:
    """Whether the warm spot node is held (``placement.warm_spot_at``), and the state for the next
    decision (under :data:`WARM_STATE_KEY`): held while the ``present`` need reaches ``at`` of the
    on-prem ``slots`` and ``hold_s`` after (``until``, epoch seconds); never without on-prem slots.
    ``present`` ``None`` (no rule can tell the need: missing data) keeps a held node past its end,
    as missing data releases no capacity; the first need known after decides."""
    raw = state.get("until")
    until = float(raw) if isinstance(raw, (int, float)) and math.isfinite(raw) else None
    if present is None:
        return (True, {"until": until}) if until is not None else (False, {})
    if slots > 0 and present >= at * slots:
        until = now_s + hold_s
        return True, {"until": until}
    if until is not None and now_s < until:
        return True, {"until": until}
    return False, {}


def _fill_paid(views: list[_Pool], max_total: int | None) -> _Paid:
    """Step 8: fill the free slots of on-prem nodes that hold replicas (billed whole while they
    hold any: the slots cost nothing), on pools that take replicas, within ``max_total``."""
    room = math.inf if max_total is None else max_total - sum([p.replicas for p in views])
    added: list[str] = []
    n = 0
    for p in views:
        if room <= 0:
            break
        if p.tier != _ONPREM or not p.accepts or p.pinned or p.replicas <= 0:
            continue
        free = int(min((-p.replicas) % p.per_node, p.capacity - p.replicas, room))
        if free > 0:
            p.replicas += free
            room -= free
            n += free
            added.append(f"{free} on {p.name}")
    if not n:
        return _NO_PAID
    return _Paid(n, [(_PLACED, f"paid slots: {', '.join(added)} (free slots of on-prem nodes already billed; spares)")])


def held_spare(rule_state: Mapping[str, Mapping[str, object]], part: str = "spare") -> int:
    """The spares the previous decision held above its total (its ``rule_state``): the pipeline
    takes them off the observed replicas before the rules and safeguards see them. ``part="return"``:
    of those, the fallback return's replacements (``place``'s ``returning``)."""
    held = rule_state.get(SPARE_STATE_KEY)
    if held is None:  # the common case: no spares were held
        return 0
    raw = held.get(part, 0)
    return raw if isinstance(raw, int) and raw > 0 else 0


def spare_state(spare: int, returning: int) -> dict[str, int]:
    """The ``rule_state`` entry for ``spare`` replicas held above the total, ``returning`` of them
    the fallback return's replacements."""
    return {"spare": spare, "return": returning} if returning else {"spare": spare}


# ---------------------------------------------------------------------------------------------
# Fallback return (step 7), kept apart from the steps above
# ---------------------------------------------------------------------------------------------


class _Return(NamedTuple):
    """Step 7's value (replacements ordered above the total), or what step 2's removals released
    for the replacements of the previous decision; and the events saying so."""

    replicas: int
    events: list[tuple[str, str]]


_NO_RETURN = _Return(0, [])


def _return_from_fallback(views: list[_Pool], cap: float | None, max_total: int | None, max_cloud: int | None,
                          interrupted: frozenset[str], placement: PlacementSpec) -> _Return:
    """Step 7 (``placement.return_from_fallback``): replacements above the total, on cheaper pools
    that take replicas, for the on-demand replicas, one on-demand node at a time in step 2's
    removal order, each only if it saves money and the overlap fits the cap, ``max_total`` and
    ``max_cloud``. ``interrupted``: spot pools the hedge keeps spares away from (no target either)."""
    if not placement.return_from_fallback or not _holds_on_demand(views):  # the common case: no on-demand
        return _NO_RETURN
    # pools still starting replicas are left alone: they were just ordered because the cheaper
    # pools could not take them (a spot pool whose launches fail reads available again at once)
    sources = [p for p in _trim_order(views, (_ONDEMAND,)) if p.ready >= p.replicas]
    onprem, spot = _return_targets(views, interrupted)
    if not sources or (not onprem and not spot):
        return _NO_RETURN
    targets = onprem + spot
    start = [p.replicas for p in targets]
    overlap = _Overlap.of(views, cap, max_total, max_cloud)
    for src in sources:
        if not _empty_nodes(src, onprem, spot, overlap, placement.spot_spread_min_pools):
            break  # dearest first: stop at the first node that cannot be emptied at a saving
    return _ordered(targets, start, overlap)


def _holds_on_demand(views: list[_Pool]) -> bool:
    """Whether an unpinned on-demand pool holds replicas (a loop that stops early: every decision
    asks)."""
    for p in views:
        if p.tier == _ONDEMAND and p.replicas > 0 and not p.pinned:
            return True
    return False


def _return_targets(views: list[_Pool], interrupted: frozenset[str]) -> tuple[list[_Pool], list[_Pool]]:
    """The pools replacements may go to, in step 4's order: on-prem pools and spot pools (not
    ``interrupted``) that take new replicas and have room. A spot pool still starting replicas is
    none: an order beyond what the cloud has left would mark it unavailable, and step 1 would then
    drop the replicas it is starting."""
    onprem = [p for p in _ranked(views, _ONPREM) if p.replicas < p.capacity]
    return onprem, [p for p in _ranked(views, _SPOT)
                    if p.ready >= p.replicas < p.capacity and p.name not in interrupted]


@dataclass(slots=True)
class _Overlap:
    """Step 7's working state (mutable, private): what the replacements may still add while the
    on-demand replicas serve on (the cost per hour so far against the cap, the replicas left
    under ``max_total``, the cloud replicas left under ``max_cloud``), and what those ordered so
    far free once ready (replicas per on-demand pool; the on-demand nodes' cost per hour, and
    the new nodes')."""

    cost: float
    cap: float | None
    room: float
    cloud_room: float
    freed: dict[str, int] = field(default_factory=dict)
    freed_usd: float = 0.0
    new_usd: float = 0.0

    @classmethod
    def of(cls, views: list[_Pool], cap: float | None, max_total: int | None, max_cloud: int | None) -> "_Overlap":
        room = math.inf if max_total is None else max_total - sum([p.replicas for p in views])
        cloud_room = math.inf if max_cloud is None else max_cloud - _cloud(views)
        return cls(sum([p.cost() for p in views]), cap, room, cloud_room)


def _empty_nodes(src: _Pool, onprem: list[_Pool], spot: list[_Pool], overlap: _Overlap, spread: int) -> bool:
    """Replacements for ``src``'s nodes, its fewest-held node first, while each saves money;
    whether all of them were emptied."""
    left = src.replicas
    while left > 0:
        node = left - (whole_nodes(left, src.per_node) - 1) * src.per_node
        new = _replace_node(onprem, spot, node, src.price, overlap, spread)
        if new is None:
            return False
        overlap.freed[src.name] = overlap.freed.get(src.name, 0) + node
        overlap.freed_usd += src.price
        overlap.new_usd += new
        left -= node
    return True


def _replace_node(onprem: list[_Pool], spot: list[_Pool], n: int, price: float, overlap: _Overlap,
                  spread: int) -> float | None:
    """Add the ``n`` replacements for an on-demand node of ``price`` as step 4 adds replicas:
    on-prem first (already paid for), then spot spread over the ``spread`` cheapest open pools;
    the cost per hour of the new nodes they need, or ``None`` (nothing added) if they do not all
    fit ``overlap`` or cost as much as the node."""
    if n > overlap.room:
        return None
    before = [(p, p.replicas) for p in onprem + spot]
    on, cost = _fill_tier(onprem, n, 0.0, None)
    cloud, cost = _fill_spot(spot, int(min(n - on, overlap.cloud_room)), cost, None, spread) if n > on else (0, cost)
    cap = overlap.cap
    if on + cloud < n or cost >= price - _EPS_USD or (cap is not None and overlap.cost + cost > cap + _EPS_USD):
        for p, replicas in before:
            p.replicas = replicas
        return None
    overlap.cost += cost
    overlap.room -= n
    overlap.cloud_room -= cloud
    return cost


def _ordered(targets: list[_Pool], start: list[int], overlap: _Overlap) -> _Return:
    """``fallback return: 4 replacements ordered on gcp-spot-h100 for aws-od-h200 (saves
    $54.80/h once ready: $84.80/h of on-demand for $30.00/h)``."""
    ordered = {p.name: p.replicas - n for p, n in zip(targets, start) if p.replicas > n}
    n = sum(ordered.values())
    if n <= 0:
        return _NO_RETURN
    freed_usd, new_usd = overlap.freed_usd, overlap.new_usd
    msg = (f"fallback return: {n} replacement{'s' if n > 1 else ''} ordered on {_per_pool(ordered)} "
           f"for {_per_pool(overlap.freed)} "
           f"(saves ${freed_usd - new_usd:.2f}/h once ready: ${freed_usd:.2f}/h of on-demand for ${new_usd:.2f}/h)")
    return _Return(n, [(_FALLBACK_RETURN, msg)])


def _per_pool(counts: Mapping[str, int]) -> str:
    """``gcp-spot-h100`` for one pool, ``onprem-h100 2, gcp-spot-h100 2`` for several."""
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{name} {n}" for name, n in counts.items())


def _released(views: list[_Pool], ready: int) -> _Return:
    """Of the serving on-demand replicas step 2 removed, those released for the previous
    decision's replacements that serve now (``ready``: those it did not cancel as still starting);
    the rest of a removal is the demand falling."""
    released: dict[str, int] = {}
    left = ready
    for p in sorted((p for p in views if p.tier == _ONDEMAND and p.kept > p.replicas), key=_removal_key):
        serving = p.kept - p.replicas - (p.kept - min(p.ready, p.kept))  # not-ready ones went first
        n = min(serving, left)
        if n > 0:
            released[p.name] = n
            left -= n
    if not released:
        return _NO_RETURN
    where = ", ".join(f"{n} on {name}" for name, n in released.items())
    return _Return(sum(released.values()), [(_FALLBACK_RETURN, f"fallback return: released {where} (replacements ready)")])


def _return_reason(reason: str, released: _Return, back: _Return) -> str:
    """``FallbackReturn`` where the placement was otherwise unremarkable and ordered or released
    replacements."""
    return _FALLBACK_RETURN if (back.replicas > 0 or released.replicas > 0) and reason == _PLACED else reason
