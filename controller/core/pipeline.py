"""The decision pipeline: one pure function from everything observed to one explained ``Decision``.

``decide`` runs the same stages, in the same order, for every policy kind (the kinds only give
raw opinions; the framework owns the safeguards, as in Ray Serve and the HPA):

 1. ``recommend``    each rule's opinion, from a ``PolicyContext`` built here; a rule that raises
                     has no opinion (``RuleError``) and counts as missing data
 2. ``combine``      max of the TARGET opinions; none at all holds the current replicas
 3. ``tolerance``    HPA dead band around the current replicas
 4. ``missing-data`` with ``on_missing: hold``, missing data never lets the total fall
 5. ``stabilize``    HPA stabilization windows over timestamped recommendations
 6. ``rate-limit``   cooldowns, then HPA rate limits relative to the start of each period
 7. ``bounds``       min/max (an operator's bounds override replaces them, never above the
                     policy's max); FLOOR opinions (schedules) raise the min
 8. ``overrides``    pins (total or per pool), drains, freezes
 9. ``placement``    replicas per pool (``controller.core.placement.place``)
10. ``budget``       the cost ceilings, integrated into placement: the best placement within them
11. ``outcome``      whether to actuate, and the scale event for the rate limits' memory

Each stage appends a ``Stage`` (replicas after it, a reason code, a message with the numbers).
A stage that changes (or holds) the value sets the decision's ``reason``; a stage that lets the
value pass repeats the reason in force. ``Decision.reason`` thus answers "why this many": the code
of the last stage that determined the total, or, when only the placement moved, the placement's
(``SpotInterrupted``, ``OverrideDrain``...); ``Paused`` and ``OverrideFreeze`` when not acting.

Nothing here reads the clock (``now`` is an argument), does I/O, or builds pydantic models: the
simulator calls ``decide`` hundreds of thousands of times.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Sequence

from controller.core import stabilize as stab
from controller.core.model import (
    Decision,
    History,
    ModelSignals,
    ModelSpec,
    Opinion,
    Override,
    PoolSpec,
    Recommendation,
    ReplicaCapacity,
    ScaleEvent,
    Stage,
)
from controller.core.overrides import resolve
from controller.core.placement import place, placement_cost, preferred_pool
from controller.core.policy import EffectivePolicy
from controller.core.reasons import Reason
from controller.core.signals import pooled_signal_names
from controller.core.spec import OnMissing, PolicySpec
from policies.base import PolicyContext, SLOTargets

STAGES = ("recommend", "combine", "tolerance", "missing-data", "stabilize", "rate-limit", "bounds",
          "overrides", "placement", "budget", "outcome")
"""Stage names, in order, as they appear in every full trace. A decision taken before every pool
was observed has the single stage ``observe`` (``NotObservedYet``)."""

_EMPTY_STATE: Mapping[str, Any] = {}
_TOKENS_PER_MILLION = 1e6
_S_PER_HOUR = 3600.0

def _slo_targets(spec: PolicySpec) -> SLOTargets:
    slo = spec.slo
    return SLOTargets(p99_latency_ms=slo.p99_latency_ms, queue_depth_per_replica=slo.queue_depth_per_replica,
                      ttft_p99_ms=slo.ttft_p99_ms)


def _capacity(
    model: ModelSpec,
    pools: Mapping[str, PoolSpec],
    signals: ModelSignals,
    current: Mapping[str, int],
    policy: EffectivePolicy,
) -> ReplicaCapacity | None:
    """Replica-weighted mean capacity over the GPU types now holding replicas; with no replicas,
    the capacity on the GPU type of the pool the first replica would go to."""
    if not model.capacity:
        return None
    weight = 0
    tokens = requests = 0.0
    for name, replicas in current.items():
        spec = pools.get(name)
        if replicas <= 0 or spec is None:
            continue
        cap = model.capacity.get(spec.gpu_type)
        if cap is None:
            continue
        weight += replicas
        tokens += replicas * cap.output_tokens_per_s
        requests += replicas * cap.requests_per_s
    if weight:
        if len(model.capacity) == 1:
            return next(iter(model.capacity.values()))
        return ReplicaCapacity(tokens / weight, requests / weight)
    first = preferred_pool(model, pools, signals.pools, policy.spec.placement)
    if first is not None:
        cap = model.capacity.get(pools[first].gpu_type)
        if cap is not None:
            return cap
    for gpu in model.gpu_types:
        if gpu in model.capacity:
            return model.capacity[gpu]
    return next(iter(model.capacity.values()))


def _recommend(rule: Any, ctx: PolicyContext) -> Recommendation:
    """Call one rule; a rule that raises or returns nonsense has no opinion, not the tick's life."""
    try:
        rec = rule.recommend(ctx)
    except Exception as exc:  # noqa: BLE001 - third-party kinds must not crash the tick
        return Recommendation(rule=rule.rule, kind=rule.name, replicas=None, reason=Reason.RULE_ERROR.value,
                              message=f"{type(exc).__name__}: {exc}", missing_data=True, state=ctx.state)
    if not isinstance(rec, Recommendation):
        return Recommendation(rule=rule.rule, kind=rule.name, replicas=None, reason=Reason.RULE_ERROR.value,
                              message=f"returned {type(rec).__name__}, not a Recommendation",
                              missing_data=True, state=ctx.state)
    r = rec.replicas
    if r is not None and (isinstance(r, bool) or not isinstance(r, int) or r < 0):
        return Recommendation(rule=rule.rule, kind=rule.name, replicas=None, reason=Reason.RULE_ERROR.value,
                              message=f"returned invalid replicas {r!r}", missing_data=True, state=ctx.state)
    return rec


def decide(
    *,
    model: ModelSpec,
    pools: Mapping[str, PoolSpec],
    signals: ModelSignals,
    policy: EffectivePolicy,
    history: History,
    overrides: Sequence[Override],
    now: datetime,
    paused: bool = False,
) -> Decision:
    """Decide replicas per pool for ``model`` at ``now``. Pure: same inputs, same ``Decision``."""
    spec = policy.spec
    states = signals.pools

    # 0. Nothing is decided before every pool of the model has been observed (Karpenter's rule):
    #    acting on a partial picture could scale a pool we cannot see.
    previous: dict[str, int] = {}
    unknown: list[str] = []
    for name in model.pools:
        st = states.get(name)
        if st is None or st.replicas is None:
            unknown.append(name)
        else:
            previous[name] = st.replicas
    if unknown:
        known = sum(previous.values())
        return Decision(
            model=model.name, at=now, current_replicas=known, replicas=known, placement=dict(previous),
            previous_placement=previous, recommendations=(),
            trace=(Stage("observe", None, Reason.NOT_OBSERVED_YET.value,
                         f"replicas of pool(s) {', '.join(unknown)} not observed yet: holding, not acting"),),
            reason=Reason.NOT_OBSERVED_YET.value, actuate=False,
            cost_per_hour_usd=placement_cost(model, pools, states, previous),
            policy_version=policy.version, history=history,
        )
    current = sum(previous.values())
    trace: list[Stage] = []
    max_age_s = spec.missing_data.max_signal_age_s

    # 1. recommend
    ctx_capacity = _capacity(model, pools, signals, previous, policy)
    ready = signals.ready_replicas
    slo = _slo_targets(spec)
    recs: list[Recommendation] = []
    rule_state: dict[str, Mapping[str, Any]] = {}
    old_state = history.rule_state
    for rule in policy.rules:
        ctx = PolicyContext(model=model, signals=signals, now=now, current_replicas=current, ready_replicas=ready,
                            capacity=ctx_capacity, slo=slo, max_signal_age_s=max_age_s,
                            state=old_state.get(rule.rule, _EMPTY_STATE))
        rec = _recommend(rule, ctx)
        recs.append(rec)
        rule_state[rule.rule] = rec.state
    best: Recommendation | None = None
    n_targets = 0
    floor: Recommendation | None = None
    missing: list[Recommendation] = []
    for rec in recs:
        if rec.missing_data:
            missing.append(rec)
        if rec.replicas is None:
            continue
        if rec.opinion is Opinion.FLOOR:
            if floor is None or rec.replicas > (floor.replicas or 0):
                floor = rec
        else:
            n_targets += 1
            if best is None or rec.replicas > (best.replicas or 0):
                best = rec
    summary = "; ".join(f"{r.rule}={r.replicas} ({r.reason}{': ' + r.message if r.message else ''})" for r in recs)
    if best is not None:
        reason = best.reason
        value = best.replicas or 0
        trace.append(Stage("recommend", value, reason, summary))
        # 2. combine
        trace.append(Stage("combine", value, Reason.MAX_OF_RECOMMENDATIONS.value if n_targets > 1 else reason,
                           f"max of {n_targets} target opinion(s) = {value} ({best.rule})"))
    else:
        if not recs:
            reason, why = Reason.NO_RULES.value, "policy has no rules"
        elif missing:
            reason = Reason.METRIC_MISSING.value
            why = "no target opinion (missing data: " + ", ".join(r.rule for r in missing) + ")"
        else:
            reason, why = Reason.NO_RULES.value, "no rule has a target opinion"
        value = current
        trace.append(Stage("recommend", None, reason, summary or why))
        trace.append(Stage("combine", current, reason, f"{why}: hold current {current}"))

    # 3. tolerance
    behavior = spec.behavior
    step = stab.tolerance(value, current, behavior.tolerance)
    value, reason = step.replicas, step.reason or reason
    trace.append(Stage("tolerance", value, reason, step.message))

    # 4. missing-data guard: missing data never releases capacity (scale-up still passes).
    # A degraded observation (the primary metrics source is down and values come from a fallback,
    # e.g. Triton's statistics instead of Prometheus) counts as missing data for every rule: a
    # fallback average is good enough to add capacity, never to release it.
    # Likewise a sample that covers only some pools ("Partial": the others were invalid) is a lower
    # bound: HPA's asymmetry, the replicas we could not see may be busy, so it never scales down.
    partial = [n for n in pooled_signal_names() if (signals.sample(n).reason or "").startswith("Partial")]
    if spec.missing_data.on_missing is OnMissing.HOLD and not missing:
        if signals.degraded:
            missing = [Recommendation(rule=f"degraded: {signals.degraded}", kind="observation", replicas=None,
                                      reason=Reason.METRIC_MISSING.value, missing_data=True)]
        elif partial:
            missing = [Recommendation(rule=f"partial data: {', '.join(partial)}", kind="observation",
                                      replicas=None, reason=Reason.METRIC_MISSING.value, missing_data=True)]
    if missing and spec.missing_data.on_missing is OnMissing.HOLD:
        names = ", ".join(r.rule for r in missing)
        if value < current:
            msg = f"missing data ({names}): not below current {current} (wanted {value})"
            value, reason = current, Reason.HOLD_ON_MISSING_DATA.value
        else:
            msg = f"missing data ({names}): {value} >= current {current} passes"
        trace.append(Stage("missing-data", value, reason, msg))
    elif missing:
        trace.append(Stage("missing-data", value, reason,
                           f"missing data ({', '.join(r.rule for r in missing)}) ignored by policy"))
    else:
        trace.append(Stage("missing-data", value, reason, "all rules had data"))

    # 5. stabilize
    up, down = behavior.scale_up, behavior.scale_down
    rec_keep_s, ev_keep_s = stab.keep_seconds(behavior)
    recommendations = stab.prune_recommendations(history.recommendations, now, rec_keep_s)
    step = stab.stabilize(value, current, now, recommendations,
                          up_window_s=up.stabilization_s, down_window_s=down.stabilization_s)
    recommendations = recommendations + ((now, value),) if rec_keep_s > 0 else ()
    value, reason = step.replicas, step.reason or reason
    trace.append(Stage("stabilize", value, reason, step.message))

    # 6. rate-limit
    events = stab.prune_events(history.scale_events, now, ev_keep_s)
    step = stab.rate_limit(value, current, now, events, up=up, down=down)
    value, reason = step.replicas, step.reason or reason
    trace.append(Stage("rate-limit", value, reason, step.message))

    # 7. bounds (an operator's bounds override replaces the policy's, below its hard max)
    effect = resolve(overrides, model=model, now=now)
    pol_min, pol_max = spec.bounds.min_replicas, spec.bounds.max_replicas
    lo, hi = effect.bounds_for(pol_min, pol_max)
    by_override = effect.bounds is not None
    lo_reason = Reason.OVERRIDE_BOUNDS.value if by_override and lo != pol_min else Reason.TOO_FEW_REPLICAS.value
    if floor is not None and (floor.replicas or 0) > lo:
        lo = min(floor.replicas or 0, hi)
        lo_reason = Reason.SCHEDULE_FLOOR.value
    bounds_msg = f"[{lo}, {hi}]" + (f" (override #{effect.bounds.id})" if effect.bounds is not None else "")
    if floor is not None:
        bounds_msg += f"; floor {floor.replicas} from {floor.rule}"
    if value < lo:
        bounds_msg = f"{value} below min {bounds_msg}: {lo}"
        value, reason = lo, lo_reason
    elif value > hi:
        hi_reason = Reason.OVERRIDE_BOUNDS.value if by_override and hi != pol_max else Reason.TOO_MANY_REPLICAS.value
        bounds_msg = f"{value} above max {bounds_msg}: {hi}"
        value, reason = hi, hi_reason
    else:
        bounds_msg = f"{value} within {bounds_msg}"
    trace.append(Stage("bounds", value, reason, bounds_msg))

    # 8. overrides: pins beat bounds (never above the policy's hard max), drains, freezes.
    fixed: dict[str, int] = {}
    drained: frozenset[str] = frozenset()
    if effect.empty:
        trace.append(Stage("overrides", value, reason, "no active overrides"))
    else:
        if effect.pin_total is not None:
            pin = min(effect.pin_total.replicas or 0, pol_max)
            value, reason = pin, Reason.OVERRIDE_PIN.value
        fixed, drained = effect.pool_constraints(previous, pol_max)
        fixed_sum = sum(fixed.values())
        if fixed_sum > value:
            # Pinned and frozen pools need at least their sum (already capped at the policy's max).
            value = fixed_sum
            reason = (Reason.OVERRIDE_FREEZE if effect.frozen_pools else Reason.OVERRIDE_PIN).value
        trace.append(Stage("overrides", value, reason, effect.describe()))

    # 9-10. placement within the budget
    cap_usd: float | None = spec.budget.max_cost_per_hour_usd
    cap_reason = Reason.BUDGET_CAP_REACHED.value
    budget_note = ""
    per_million = spec.budget.max_cost_per_million_tokens_usd
    if per_million is not None:
        rate = signals.output_tokens_per_s.fresh(now, max_age_s)
        if rate is None or rate <= 0:
            # Cost per token is undefined without a token rate: the ceiling cannot be computed.
            budget_note = f"cost-per-token cap ${per_million:g}/M ignored: output token rate unknown"
        else:
            token_cap = per_million * rate * _S_PER_HOUR / _TOKENS_PER_MILLION
            budget_note = f"${per_million:g}/M tokens at {rate:g} tok/s = ${token_cap:.2f}/h"
            if cap_usd is None or token_cap < cap_usd:
                # Cost per token is an efficiency ceiling, not a spending one: at low traffic it
                # would otherwise starve the fleet below min_replicas (even to zero). It limits
                # scale-out only; the hard max_cost_per_hour_usd still beats min_replicas.
                floor_usd = place(model=model, pools=pools, states=states, total=min(lo, value),
                                  placement=spec.placement, max_cost_per_hour_usd=cap_usd,
                                  drained=drained, pinned=fixed).cost_per_hour_usd
                if token_cap < floor_usd:
                    budget_note += f", raised to ${floor_usd:.2f}/h (the cost of min_replicas {lo})"
                    token_cap = floor_usd
                cap_usd, cap_reason = token_cap, Reason.COST_PER_TOKEN_CAP_REACHED.value
    result = place(model=model, pools=pools, states=states, total=value, placement=spec.placement,
                   max_cost_per_hour_usd=cap_usd, drained=drained, pinned=fixed)
    placed = result.total
    placement = result.replicas
    placement_reason = reason
    if result.capacity_limited:
        reason = placement_reason = Reason.CAPACITY_EXHAUSTED.value
    elif result.reason != Reason.BUDGET_CAP_REACHED.value and result.reason != Reason.PLACED.value:
        placement_reason = result.reason
        if placed == current and placement != previous:
            # The total did not move but replicas did: the placement event is the story.
            reason = result.reason
    elif fixed and placed == current and placement != previous:
        reason = placement_reason = Reason.OVERRIDE_PIN.value
    trace.append(Stage("placement", placed, placement_reason, result.message()))
    if cap_usd is None:
        trace.append(Stage("budget", placed, reason,
                           f"${result.cost_per_hour_usd:.2f}/h, no cap" + (f"; {budget_note}" if budget_note else "")))
    elif result.budget_limited:
        reason = cap_reason
        msg = f"cap ${cap_usd:.2f}/h reached: ${result.cost_per_hour_usd:.2f}/h for {placed} of {value} replicas"
        if result.budget_removed:
            msg += f", removed {result.budget_removed}"
        if placed < lo:
            msg += f"; the budget beats min_replicas {lo}"
        if budget_note:
            msg += f"; {budget_note}"
        trace.append(Stage("budget", placed, reason, msg))
    else:
        trace.append(Stage("budget", placed, reason,
                           f"${result.cost_per_hour_usd:.2f}/h <= cap ${cap_usd:.2f}/h ({Reason.WITHIN_BUDGET.value})"
                           + (f"; {budget_note}" if budget_note else "")))

    # 11. outcome
    actuate = True
    cost = result.cost_per_hour_usd
    replaced = result.interrupted_replaced
    if effect.freeze is not None:
        trace.append(Stage("outcome", current, Reason.OVERRIDE_FREEZE.value,
                           f"frozen by override #{effect.freeze.id}: would place {placed}, keeping {current}"))
        placement, placed, actuate, replaced = dict(previous), current, False, 0
        cost = placement_cost(model, pools, states, previous)
        reason = Reason.PAUSED.value if paused else Reason.OVERRIDE_FREEZE.value
    elif paused:
        actuate = False
        reason = Reason.PAUSED.value
        trace.append(Stage("outcome", placed, reason, "paused: decided, not acting"))
    elif placement != previous:
        trace.append(Stage("outcome", placed, Reason.SCALED.value, f"{current} -> {placed}"))
    else:
        trace.append(Stage("outcome", placed, Reason.UNCHANGED.value, f"unchanged at {placed}"))
    if actuate and placed != current:
        events = events + (ScaleEvent(now, current, placed),)
    return Decision(
        model=model.name, at=now, current_replicas=current, replicas=placed, placement=placement,
        previous_placement=previous, recommendations=tuple(recs), trace=tuple(trace), reason=reason,
        actuate=actuate, cost_per_hour_usd=cost, policy_version=policy.version,
        history=History(recommendations=recommendations, scale_events=events, rule_state=rule_state),
        interrupted_replaced=replaced,
    )
