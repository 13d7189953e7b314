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
 9. ``lead-time``    how many replicas the cloud pools may hold (``controller.core.leadtime``): cloud
                     capacity only for demand expected at its ready time, released on its own
                     short window; the rest of the total stays on-prem or waits
10. ``placement``    replicas per pool (``controller.core.placement.place``)
11. ``budget``       the cost ceilings, integrated into placement: the best placement within them
12. ``outcome``      whether to actuate, and the scale event for the rate limits' memory

Each stage is a function of its own, named after it (``_recommend``, ``_combine``, ...,
``_outcome``; HPA's shape: one step, one value, one reason), and ``decide`` is the sequence of
their calls. Each returns the total and the reason in force after it together with its trace
entry, a ``Stage`` (replicas after it, a reason code, a message with the numbers); the budget is
two calls, ``_cost_cap`` (the ceiling, before placing) and ``_budget`` (its entry, after). A stage
that changes (or holds) the value sets the decision's ``reason``; a stage that lets the value pass
repeats the reason in force. ``Decision.reason`` thus answers "why this many": the code of the
last stage that determined the total, or, when only the placement moved, the placement's
(``SpotInterrupted``, ``OverrideDrain``...); ``Paused`` and ``OverrideFreeze`` when not acting.

Nothing here reads the clock (``now`` is an argument), does I/O, or builds pydantic models: the
simulator calls ``decide`` hundreds of thousands of times.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from controller.core import capacity as learned_capacity
from controller.core import leadtime
from controller.core import stabilize as stab
from controller.core.model import (
    Decision,
    History,
    ModelSignals,
    ModelSpec,
    Opinion,
    Override,
    PoolSpec,
    PoolState,
    Recommendation,
    ScaleEvent,
    Stage,
)
from controller.core.overrides import OverrideEffect, resolve
from controller.core.placement import (SPARE_STATE_KEY, WARM_STATE_KEY, PlacementResult, held_spare, place, preferred_pool,
                                       spare_state, warm_spot)
from controller.core.policy import EffectivePolicy
from controller.core.pricing import hourly_cost_at_usd, placement_cost
from controller.core.reasons import (  # the codes as plain strings: see controller.core.reasons
    Reason,
    PLACED as _PLACED,
    BUDGET_CAP_REACHED as _BUDGET_CAP_REACHED,
    WITHIN_BUDGET as _WITHIN_BUDGET,
    SCALED as _SCALED,
    UNCHANGED as _UNCHANGED,
    TOO_FEW_REPLICAS as _TOO_FEW_REPLICAS,
    TOO_MANY_REPLICAS as _TOO_MANY_REPLICAS,
    OVERRIDE_BOUNDS as _OVERRIDE_BOUNDS,
    CAPACITY_EXHAUSTED as _CAPACITY_EXHAUSTED,
)
from controller.core.signals import pooled_signal_names
from controller.core.spec import Behavior, Bounds, Budget, MissingData, OnMissing, PolicySpec
from policies.base import PolicyContext

STAGES = ("recommend", "combine", "tolerance", "missing-data", "stabilize", "rate-limit", "bounds",
          "overrides", "lead-time", "placement", "budget", "outcome")
"""Stage names, in order, as they appear in every full trace. A decision taken before every pool
was observed has the single stage ``observe`` (``NotObservedYet``)."""

_EMPTY_STATE: Mapping[str, Any] = {}


class _Step(NamedTuple):
    """What one stage leaves for the next: the total and the reason in force after it, and the
    stage's own trace entry (whose reason differs where the stage only reports, e.g. ``combine``'s
    ``MaxOfRecommendations`` or the ``outcome``'s ``Scaled``)."""

    value: int
    reason: str
    stage: Stage


class _Opinions(NamedTuple):
    """What the rules said (stage 1), sorted for the stages that read it."""

    recs: tuple[Recommendation, ...]
    rule_state: dict[str, Mapping[str, Any]]
    best: Recommendation | None
    """The largest target opinion (the first of equals)."""
    n_targets: int
    floor: Recommendation | None
    """The largest floor opinion (schedules), applied at the bounds stage."""
    missing: tuple[Recommendation, ...]
    """Rules without an opinion for lack of data."""


class _Cap(NamedTuple):
    """The cost ceiling placement works within (stage 11, computed before placing)."""

    usd: float | None
    reason: str
    """The reason code when the ceiling removes replicas."""
    note: str
    """How a cost-per-token cap was derived (or why it was ignored), for the budget stage."""


class _Outcome(NamedTuple):
    """Stage 12's value: what the decision carries out (or, frozen or paused, does not)."""

    placement: Mapping[str, int]
    replicas: int
    reason: str
    actuate: bool
    cost_per_hour_usd: float
    interrupted_replaced: int
    stage: Stage


def _capacity_weights(
    model: ModelSpec,
    pools: Mapping[str, PoolSpec],
    signals: ModelSignals,
    current: Mapping[str, int],
    policy: EffectivePolicy,
) -> dict[str, float]:
    """Replicas per GPU type (of those the bundle gives a capacity for) now serving: each pool's
    placed replicas that are ready (all of them where readiness is not reported); with none
    serving, those placed; with none placed, the GPU type of the pool the first replica would go
    to. A replica still starting carries no load: counted, an order on a GPU type learned faster
    raised the fleet's capacity before it served, so the rules asked for fewer replicas, and
    cancelling it made them ask for more again (on a conversation day, an on-demand H200 order
    cancelled and placed again every 65 s)."""
    weights = _by_gpu(model, pools, _serving(current, signals.pools)) or _by_gpu(model, pools, current)
    if weights:
        return {g: float(n) for g, n in weights.items()}
    first = preferred_pool(model, pools, signals.pools, policy.spec.placement)
    if first is not None and pools[first].gpu_type in model.capacity:
        return {pools[first].gpu_type: 1.0}
    return {next((g for g in model.gpu_types if g in model.capacity), next(iter(model.capacity))): 1.0}


def _serving(current: Mapping[str, int], states: Mapping[str, PoolState]) -> dict[str, int]:
    """Per pool, the placed replicas that are ready (all of them where readiness is not reported)."""
    out = dict(current)
    for name, n in current.items():
        st = states.get(name)
        if st is not None and st.ready_replicas is not None:
            out[name] = min(n, st.ready_replicas)
    return out


def _by_gpu(model: ModelSpec, pools: Mapping[str, PoolSpec], counts: Mapping[str, int]) -> dict[str, int]:
    """Replicas per pool summed per GPU type (of those the bundle gives a capacity for)."""
    out: dict[str, int] = {}
    for name, n in counts.items():
        spec = pools.get(name)
        if n > 0 and spec is not None and spec.gpu_type in model.capacity:
            out[spec.gpu_type] = out.get(spec.gpu_type, 0) + n
    return out


def _ready_by_gpu(model: ModelSpec, pools: Mapping[str, PoolSpec], signals: ModelSignals) -> dict[str, int]:
    """Ready replicas per GPU type (of those the bundle gives a capacity for)."""
    return _by_gpu(model, pools, {name: st.ready_replicas or 0 for name, st in signals.pools.items()})


class _Fresh(NamedTuple):
    """The fresh values (``Sample.fresh``) of the signals the pipeline's own stages read, each read
    once per decision (capacity, pressure, lead time and budget share them)."""

    request_rate: float | None
    """Requests completed per second (``request_rate_per_s``)."""
    output_tokens: float | None
    input_tokens: float | None
    queue: float | None
    latency: float | None
    ttft: float | None
    arrivals: float | None
    """Requests arriving per second (``arrival_rate_per_s``: completions plus the growth of the
    requests in the system), or the completions where that signal is missing: the load offered,
    which the learned capacity, the pressure's wait and lead-time economics read. The completions
    exceed it while a backlog drains and fall short of it while the replicas saturate."""

    @classmethod
    def of(cls, signals: ModelSignals, now: datetime, max_age_s: float) -> "_Fresh":
        s = signals
        done = s.request_rate_per_s.fresh(now, max_age_s)
        arrivals = s.arrival_rate_per_s.fresh(now, max_age_s)
        return cls(done, s.output_tokens_per_s.fresh(now, max_age_s),
                   s.input_tokens_per_s.fresh(now, max_age_s), s.queue_depth.fresh(now, max_age_s),
                   s.p99_latency_ms.fresh(now, max_age_s), s.p99_ttft_ms.fresh(now, max_age_s),
                   done if arrivals is None else arrivals)

    @property
    def offered_tokens(self) -> float | None:
        """Output tokens per second the arrivals bring (``capacity.offered_tokens``)."""
        return learned_capacity.offered_tokens(self.output_tokens, self.request_rate, self.arrivals)


def _capacity(
    model: ModelSpec,
    pools: Mapping[str, PoolSpec],
    signals: ModelSignals,
    current: Mapping[str, int],
    policy: EffectivePolicy,
    history: History,
    now: datetime,
    fresh: _Fresh,
    ready: int | None,
    pressure: _Pressure,
) -> learned_capacity.Learned | None:
    """The per-replica capacity for the served token mix, corrected by what ready replicas
    sustain (``controller.core.capacity``), learned per GPU type and averaged over the GPU types
    of the replicas that serve (:func:`_capacity_weights`); ``None`` if the bundle declares none.
    ``ready``: the ready replicas (``ModelSignals.ready_replicas``); ``pressure``: their
    :func:`_pressure`."""
    if not model.capacity:
        return None
    spec = policy.spec
    state = history.rule_state.get(learned_capacity.STATE_KEY, _EMPTY_STATE)
    c, now_s = policy.capacity_learning, now.timestamp()
    mix = learned_capacity.smoothed_mix(
        state, learned_capacity.mix_of(fresh.request_rate, fresh.output_tokens, fresh.input_tokens), now_s, c.mix_tau_s)
    weights = _capacity_weights(model, pools, signals, current, policy)
    ready_gpus = _ready_by_gpu(model, pools, signals)
    priors = {g: learned_capacity.for_mix(model.capacity[g], mix) for g in set(weights) | set(ready_gpus)}
    total = sum(current.values())
    obs = learned_capacity.Observed(
        now_s=now_s, load_units=None, ready=ready or 0,
        settled=ready is not None and ready >= total > 0, slack=int(spec.behavior.tolerance * (ready or 0)),
        pressure=pressure.base, ttft_ratio=pressure.ttft, queued=pressure.queued,
        prompt_tokens=None if mix is None else mix.prompt_tokens)
    # offered, not served: a backlog that drains is no measure of the load, a saturated fleet's
    # completions no measure of what it was offered; the served tokens bound it under pressure
    units, served = learned_capacity.load_units_by_gpu(state, c, ready_gpus, priors, fresh.arrivals,
                                                       fresh.offered_tokens, fresh.output_tokens)
    scales, evidence, new_state = learned_capacity.learn_by_gpu(state, obs, units, c, policy.planned_fraction, served, ready_gpus)
    caps = {g: learned_capacity.for_mix(model.capacity[g], mix, scales.get(g, 1.0)) for g in weights}
    cap = learned_capacity.weighted(caps, weights)
    prior = learned_capacity.weighted(priors, weights)
    # the placement's correction as one number, for readers (replay, status): learned over profile
    # (on one GPU type its own scale; each GPU type's is under "gpus")
    scale = (cap.output_tokens_per_s / prior.output_tokens_per_s if prior.output_tokens_per_s > 0
             else scales.get(next(iter(weights)), 1.0))
    new_state["scale"] = scale
    new_state.update(learned_capacity.shown(cap, prior, evidence))
    if mix is not None:
        new_state["mix"] = (now_s, mix.prompt_tokens, mix.output_tokens)
    return learned_capacity.Learned(cap, prior, scale, evidence, new_state)


class _Pressure(NamedTuple):
    """How close the ready replicas are to the SLO (1 = at it), in parts: ``base``, the largest of
    the queue per replica and p99 latency over their targets and, where no p99 TTFT is measured, the
    mean wait (Little's law: queue / arrival rate) over ``wait_fraction`` of the TTFT target;
    ``ttft``, the p99 TTFT over its target where measured; ``queued``, whether requests wait (or the
    queue is not known). A p99
    TTFT over a window while no request waits is the window's memory of a backlog already served
    (after a cold start into a queue it stays high for the window): it counts only with a queue.
    The learned capacity counts the TTFT above its latency floor (``capacity._latency_pressure``);
    lead-time economics reads it whole (``value``)."""

    base: float | None
    ttft: float | None
    queued: bool

    @property
    def value(self) -> float | None:
        """The largest part, the p99 TTFT whole (only with a queue)."""
        if self.ttft is None or not self.queued:
            return self.base
        return self.ttft if self.base is None else max(self.base, self.ttft)


_NO_PRESSURE = _Pressure(None, None, False)


def _pressure(fresh: _Fresh, spec: PolicySpec, ready: int | None) -> _Pressure:
    """The parts of :class:`_Pressure` from the fresh signals."""
    queue, slo = fresh.queue, spec.slo
    ratio = fresh.ttft / slo.ttft_p99_ms if fresh.ttft is not None and slo.ttft_p99_ms else None
    wait = _wait_ratio(queue, fresh.arrivals, spec) if ratio is None or queue == 0 else None
    per_replica = (queue / ready / slo.queue_depth_per_replica
                   if queue is not None and ready and slo.queue_depth_per_replica else None)
    latency = fresh.latency / slo.p99_latency_ms if fresh.latency is not None and slo.p99_latency_ms else None
    base = max([r for r in (per_replica, wait, latency) if r is not None], default=None)
    return _Pressure(base, ratio, queue != 0)


def _wait_ratio(queue: float | None, arrivals: float | None, spec: PolicySpec) -> float | None:
    """The mean wait (Little's law: queue / arrival rate) over ``wait_fraction`` of the TTFT target."""
    target = spec.slo.ttft_p99_ms
    if queue is None or not arrivals or not target:
        return None
    return queue / arrivals * 1000.0 / (target * spec.capacity.wait_fraction)


def _observe(model: ModelSpec, signals: ModelSignals, spec: PolicySpec, now: datetime
             ) -> tuple[_Fresh, int | None, _Pressure]:
    """The fresh values of the signals the stages read, the ready replicas, and their
    :func:`_pressure` where learned capacity or lead-time economics reads it (no parts otherwise)."""
    fresh, ready = _Fresh.of(signals, now, spec.missing_data.max_signal_age_s), signals.ready_replicas
    if not model.capacity and not spec.lead_time.enabled:
        return fresh, ready, _NO_PRESSURE
    return fresh, ready, _pressure(fresh, spec, ready)


def _ask(rule: Any, ctx: PolicyContext) -> Recommendation:
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


def _observed(model: ModelSpec, states: Mapping[str, PoolState]) -> tuple[dict[str, int], list[str]]:
    """(replicas per observed pool, pools whose replicas are not known yet)."""
    previous: dict[str, int] = {}
    unknown: list[str] = []
    for name in model.pools:
        st = states.get(name)
        if st is None or st.replicas is None:
            unknown.append(name)
        else:
            previous[name] = st.replicas
    return previous, unknown


def _not_observed(
    model: ModelSpec,
    pools: Mapping[str, PoolSpec],
    states: Mapping[str, PoolState],
    policy: EffectivePolicy,
    history: History,
    previous: dict[str, int],
    unknown: list[str],
    now: datetime,
) -> Decision:
    """Stage 0: nothing is decided before every pool of the model has been observed (Karpenter's
    rule): acting on a partial picture could scale a pool we cannot see."""
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


def _opinions(policy: EffectivePolicy, history: History, make_ctx: Callable[..., PolicyContext]) -> _Opinions:
    """Ask every rule (``make_ctx(state=...)`` builds its context), then sort the answers: the
    largest target, the largest floor, the missing."""
    recs: list[Recommendation] = []
    rule_state: dict[str, Mapping[str, Any]] = {}
    old_state = history.rule_state
    for rule in policy.rules:
        rec = _ask(rule, make_ctx(state=old_state.get(rule.rule, _EMPTY_STATE)))
        recs.append(rec)
        rule_state[rule.rule] = rec.state
    return _sorted_opinions(tuple(recs), rule_state)


def _sorted_opinions(recs: tuple[Recommendation, ...], rule_state: dict[str, Mapping[str, Any]]) -> _Opinions:
    """The largest target (the first of equals), the largest floor, the rules missing data."""
    best: Recommendation | None = None
    floor: Recommendation | None = None
    n_targets = 0
    for rec in recs:
        if rec.replicas is None:
            continue
        if rec.opinion is Opinion.FLOOR:
            if floor is None or rec.replicas > (floor.replicas or 0):
                floor = rec
            continue
        n_targets += 1
        if best is None or rec.replicas > (best.replicas or 0):
            best = rec
    return _Opinions(recs, rule_state, best, n_targets, floor, tuple(rec for rec in recs if rec.missing_data))


def _no_target(op: _Opinions) -> tuple[str, str]:
    """(reason, why) when no rule has a target opinion."""
    if not op.recs:
        return Reason.NO_RULES.value, "policy has no rules"
    if op.missing:
        names = ", ".join(r.rule for r in op.missing)
        return Reason.METRIC_MISSING.value, f"no target opinion (missing data: {names})"
    return Reason.NO_RULES.value, "no rule has a target opinion"


def _recommend(op: _Opinions, current: int, learned: learned_capacity.Learned | None = None) -> _Step:
    """Stage 1: every rule's opinion; the largest target is the value, none at all holds ``current``.
    The message ends with the capacity the rules sized with (learned, and the profile's)."""
    summary = "; ".join([f"{r.rule}={r.replicas} ({r.reason}{': ' + r.message if r.message else ''})"
                         for r in op.recs])
    if learned is not None:
        summary = f"{summary} [{learned.describe()}]" if summary else f"[{learned.describe()}]"
    if op.best is not None:
        value = op.best.replicas or 0
        return _Step(value, op.best.reason, Stage("recommend", value, op.best.reason, summary))
    reason, why = _no_target(op)
    return _Step(current, reason, Stage("recommend", None, reason, summary or why))


def _combine(op: _Opinions, rec: _Step, current: int) -> _Step:
    """Stage 2: max of the target opinions (the reason in force stays the winning rule's)."""
    if op.best is None:
        _, why = _no_target(op)
        return _Step(current, rec.reason, Stage("combine", current, rec.reason, f"{why}: hold current {current}"))
    code = Reason.MAX_OF_RECOMMENDATIONS.value if op.n_targets > 1 else rec.reason
    msg = f"max of {op.n_targets} target opinion(s) = {rec.value} ({op.best.rule})"
    return _Step(rec.value, rec.reason, Stage("combine", rec.value, code, msg))


def _safeguard(name: str, prev: _Step, step: stab.Step) -> _Step:
    """A shared safeguard's ``Step`` as this pipeline's stage: its reason when it acted, else the
    reason in force."""
    reason = step.reason or prev.reason
    return _Step(step.replicas, reason, Stage(name, step.replicas, reason, step.message))


def _tolerance(prev: _Step, current: int, behavior: Behavior) -> _Step:
    """Stage 3: HPA dead band around the current replicas."""
    return _safeguard("tolerance", prev, stab.tolerance(prev.value, current, behavior.tolerance))


def _observation_gaps(signals: ModelSignals) -> tuple[Recommendation, ...]:
    """The observation itself as missing data: a degraded source, or samples covering some pools.

    A degraded observation (the primary metrics source is down and values come from a fallback,
    e.g. Triton's statistics instead of Prometheus) counts as missing data for every rule: a
    fallback average is good enough to add capacity, never to release it. Likewise a sample that
    covers only some pools ("Partial": the others were invalid) is a lower bound: HPA's asymmetry,
    the replicas we could not see may be busy, so it never scales down.
    """
    if signals.degraded:
        return (Recommendation(rule=f"degraded: {signals.degraded}", kind="observation", replicas=None,
                               reason=Reason.METRIC_MISSING.value, missing_data=True),)
    samples = signals.samples
    partial_samples = [n for n in pooled_signal_names()
                       if (why := samples[n].reason) is not None and why.startswith("Partial")]
    if partial_samples:
        return (Recommendation(rule=f"partial data: {', '.join(partial_samples)}", kind="observation",
                               replicas=None, reason=Reason.METRIC_MISSING.value, missing_data=True),)
    return ()


def _missing_data(prev: _Step, missing: tuple[Recommendation, ...], signals: ModelSignals, current: int,
                  rules: MissingData) -> _Step:
    """Stage 4: with ``on_missing: hold``, missing data never releases capacity (scale-up passes)."""
    value, reason = prev.value, prev.reason
    hold = rules.on_missing is OnMissing.HOLD
    if hold and not missing:
        missing = _observation_gaps(signals)
    if not missing:
        return _Step(value, reason, Stage("missing-data", value, reason, "all rules had data"))
    names = ", ".join(r.rule for r in missing)
    if not hold:
        return _Step(value, reason, Stage("missing-data", value, reason, f"missing data ({names}) ignored by policy"))
    if value < current:
        code = Reason.HOLD_ON_MISSING_DATA.value
        return _Step(current, code, Stage("missing-data", current, code,
                                          f"missing data ({names}): not below current {current} (wanted {value})"))
    return _Step(value, reason, Stage("missing-data", value, reason,
                                      f"missing data ({names}): {value} >= current {current} passes"))


def _stabilize(prev: _Step, current: int, history: History, now: datetime, behavior: Behavior, keep_s: float
               ) -> tuple[tuple[tuple[datetime, int], ...], _Step]:
    """Stage 5: HPA stabilization windows; also the recommendations the next tick remembers (for
    ``keep_s`` seconds)."""
    recommendations = stab.prune_recommendations(history.recommendations, now, keep_s)
    step = stab.stabilize(prev.value, current, now, recommendations, up_window_s=behavior.scale_up.stabilization_s,
                          down_window_s=behavior.scale_down.stabilization_s)
    kept = recommendations + ((now, prev.value),) if keep_s > 0 else ()
    return kept, _safeguard("stabilize", prev, step)


def _rate_limit(prev: _Step, current: int, history: History, now: datetime, behavior: Behavior, keep_s: float
                ) -> tuple[tuple[ScaleEvent, ...], _Step]:
    """Stage 6: cooldowns, then HPA rate limits; also the scale events younger than ``keep_s``."""
    events = stab.prune_events(history.scale_events, now, keep_s)
    step = stab.rate_limit(prev.value, current, now, events, up=behavior.scale_up, down=behavior.scale_down)
    return events, _safeguard("rate-limit", prev, step)


def _limits(effect: OverrideEffect, floor: Recommendation | None, bounds: Bounds) -> tuple[int, str, int, str, str]:
    """(min, its reason, max, its reason, description) after a bounds override and the floors."""
    pol_min, pol_max = bounds.min_replicas, bounds.max_replicas
    lo, hi = effect.bounds_for(pol_min, pol_max)
    by_override = effect.bounds is not None
    lo_reason = _OVERRIDE_BOUNDS if by_override and lo != pol_min else _TOO_FEW_REPLICAS
    hi_reason = _OVERRIDE_BOUNDS if by_override and hi != pol_max else _TOO_MANY_REPLICAS
    if floor is not None and (floor.replicas or 0) > lo:
        lo = min(floor.replicas or 0, hi)
        lo_reason = Reason.SCHEDULE_FLOOR.value
    text = f"[{lo}, {hi}]" + (f" (override #{effect.bounds.id})" if effect.bounds is not None else "")
    if floor is not None:
        text += f"; floor {floor.replicas} from {floor.rule}"
    return lo, lo_reason, hi, hi_reason, text


def _bounds(prev: _Step, effect: OverrideEffect, floor: Recommendation | None, bounds: Bounds) -> tuple[int, _Step]:
    """Stage 7: (the min, the step) within min/max; an operator's bounds override replaces the
    policy's (never above its max); FLOOR opinions (schedules) raise the min."""
    lo, lo_reason, hi, hi_reason, text = _limits(effect, floor, bounds)
    value = prev.value
    if value < lo:
        return lo, _Step(lo, lo_reason, Stage("bounds", lo, lo_reason, f"{value} below min {text}: {lo}"))
    if value > hi:
        return lo, _Step(hi, hi_reason, Stage("bounds", hi, hi_reason, f"{value} above max {text}: {hi}"))
    return lo, _Step(value, prev.reason, Stage("bounds", value, prev.reason, f"{value} within {text}"))


def _overrides(prev: _Step, effect: OverrideEffect, previous: Mapping[str, int], pol_max: int
               ) -> tuple[dict[str, int], frozenset[str], _Step]:
    """Stage 8: (fixed replicas per pool, drained pools, the step): pins beat bounds (never above
    the policy's hard max), drains, freezes."""
    value, reason = prev.value, prev.reason
    if effect.empty:
        return {}, frozenset(), _Step(value, reason, Stage("overrides", value, reason, "no active overrides"))
    if effect.pin_total is not None:
        value, reason = min(effect.pin_total.replicas or 0, pol_max), Reason.OVERRIDE_PIN.value
    fixed, drained = effect.pool_constraints(previous, pol_max)
    fixed_sum = sum(fixed.values())
    if fixed_sum > value:
        # Pinned and frozen pools need at least their sum (already capped at the policy's max).
        value = fixed_sum
        reason = (Reason.OVERRIDE_FREEZE if effect.frozen_pools else Reason.OVERRIDE_PIN).value
    return fixed, drained, _Step(value, reason, Stage("overrides", value, reason, effect.describe()))


def _need(op: _Opinions, total: int, arrivals: float | None, missing: bool,
          pressure: float | None) -> leadtime.Need:
    """What the rules say the load needs now and one lead time ahead, without memory of past
    peaks (``Recommendation.present_replicas``, ``trend_replicas``), at most ``total``."""
    targets = _targets(op)
    present = max([now for now, _ in targets], default=0)
    trend = max([ahead for _, ahead in targets], default=0)
    return leadtime.Need(total=total, present=min(present, total), trend=min(trend, total), load=arrivals,
                         missing=missing, pressure=pressure)


def _targets(op: _Opinions) -> list[tuple[int, int]]:
    """(the need now, one lead time ahead) of each rule with a target opinion, without memory of
    past peaks (``Recommendation.present_replicas``, ``trend_replicas``)."""
    out = []
    for rec in op.recs:
        if rec.replicas is None or rec.opinion is not Opinion.TARGET:
            continue
        now = rec.replicas if rec.present_replicas is None else rec.present_replicas
        out.append((now, now if rec.trend_replicas is None else rec.trend_replicas))
    return out


def _warm_spot(op: _Opinions, model: ModelSpec, pools: Mapping[str, PoolSpec], states: Mapping[str, PoolState],
               spec: PolicySpec, history: History, drained: frozenset[str], total: int, now: datetime) -> bool:
    """Stage 10's warm spot node (``placement.warm_spot_at``): whether placement holds it, from the
    present need (at most ``total``) against the on-prem slots; its state goes to ``op.rule_state``."""
    at = spec.placement.warm_spot_at
    if at is None:
        return False
    targets = _targets(op)  # none: no rule can tell the need (missing data), which releases nothing
    warm, state = warm_spot(history.rule_state.get(WARM_STATE_KEY, _EMPTY_STATE),
                            present=min(max([now for now, _ in targets]), total) if targets else None,
                            slots=leadtime.onprem_room(model, pools, states, spec.placement, drained),
                            at=at, hold_s=spec.placement.warm_spot_hold_s, now_s=now.timestamp())
    if state:
        op.rule_state[WARM_STATE_KEY] = state
    return warm


def _cloud_views(model: ModelSpec, pools: Mapping[str, PoolSpec], states: Mapping[str, PoolState], spec: PolicySpec,
                 drained: frozenset[str]) -> tuple[int, int, int, float | None]:
    """(on-prem room, cloud replicas, of those ready, cloud lead time) for ``leadtime.cloud_cap``."""
    cloud, ready = leadtime.cloud_replicas(model, pools, states)
    return (leadtime.onprem_room(model, pools, states, spec.placement, drained), cloud, ready,
            leadtime.cloud_lead_time_s(model, pools, spec.placement, drained))


def _lead_time(prev: _Step, op: _Opinions, model: ModelSpec, pools: Mapping[str, PoolSpec], signals: ModelSignals,
               spec: PolicySpec, history: History, fixed: Mapping[str, int], drained: frozenset[str],
               arrivals: float | None, pressure: float | None, lo: int, pinned_total: bool,
               now: datetime) -> tuple[int | None, _Step]:
    """Stage 9: (the cloud ceiling for placement, the step): the total less what the cloud may
    not hold (``controller.core.leadtime``), never below the min ``lo`` (bounds and floors beat
    it); its state goes to ``op.rule_state``."""
    value, rules = prev.value, spec.lead_time
    if fixed or pinned_total:
        # pins beat lead-time economics, as they beat bounds: place what the operator pinned
        # (the burst history is kept as it was)
        op.rule_state[leadtime.STATE_KEY] = history.rule_state.get(leadtime.STATE_KEY, _EMPTY_STATE)
        return None, _Step(value, prev.reason, Stage("lead-time", value, prev.reason, "pinned: not applied"))
    old_state = history.rule_state.get(leadtime.STATE_KEY, _EMPTY_STATE)
    if not rules.enabled:  # nothing to size: the need and the cloud's views go unread
        cap = leadtime.off(old_state)
        op.rule_state[leadtime.STATE_KEY] = cap.state
        return None, _Step(value, prev.reason, Stage("lead-time", value, prev.reason, cap.message))
    missing = bool(op.missing or signals.degraded) and spec.missing_data.on_missing is OnMissing.HOLD
    onprem, cloud, ready, lead_s = _cloud_views(model, pools, signals.pools, spec, drained)
    cap = leadtime.cloud_cap(old_state, _need(op, value, arrivals, missing, pressure), now_s=now.timestamp(),
                             onprem=onprem, cloud=cloud, cloud_ready=ready, lead_s=lead_s, rules=rules)
    op.rule_state[leadtime.STATE_KEY] = cap.state
    max_cloud = cap.max_cloud if cap.max_cloud is None else max(cap.max_cloud, lo - onprem)
    if max_cloud is None or value <= onprem + max_cloud:
        return max_cloud, _Step(value, prev.reason, Stage("lead-time", value, prev.reason, cap.message))
    placed = onprem + max_cloud
    code = cap.reason or Reason.CLOUD_NOT_NEEDED.value
    return max_cloud, _Step(placed, code, Stage("lead-time", placed, code, f"{value} -> {placed}: {cap.message}"))


def _window_held(total: int, asked: int, recommendations: tuple[tuple[datetime, int], ...], now: datetime,
                 spec: PolicySpec, lo: int, fixed: Mapping[str, int], effect: OverrideEffect) -> int:
    """Replicas of ``total`` that only the scale-down memory holds (stabilization window, rate
    limit): above the most the rules asked within the cloud's short window
    (``spec.lead_time.cloud_scale_down_s``: ``asked`` now, the missing-data stage's value, and the
    kept ``recommendations``; raised to the min ``lo``). Placement keeps them where they are but
    buys no cloud replica for them. None under an operator's pins."""
    if fixed or effect.pin_total is not None:
        return 0
    cutoff = now - timedelta(seconds=spec.lead_time.cloud_scale_down_s)
    for at, value in reversed(recommendations):  # oldest first: the recent ones are at the end
        if at <= cutoff:
            break
        asked = max(asked, value)
    return max(0, total - max(asked, lo))


def _cost_cap(budget: Budget, rate: float | None, lo: int, total: int, fill: Callable[..., PlacementResult]) -> _Cap:
    """Stage 11, first half: the ceiling placement works within, at the fresh output token
    ``rate``. ``fill(total=, max_cost_per_hour_usd=)`` places like the placement stage will."""
    hard, per_million = budget.max_cost_per_hour_usd, budget.max_cost_per_million_tokens_usd
    if per_million is None:
        return _Cap(hard, _BUDGET_CAP_REACHED, "")
    if rate is None or rate <= 0:
        # Cost per token is undefined without a token rate: the ceiling cannot be computed.
        return _Cap(hard, _BUDGET_CAP_REACHED,
                    f"cost-per-token cap ${per_million:g}/M ignored: output token rate unknown")
    token_cap = hourly_cost_at_usd(per_million, rate)
    note = f"${per_million:g}/M tokens at {rate:g} tok/s = ${token_cap:.2f}/h"
    if hard is not None and token_cap >= hard:
        return _Cap(hard, _BUDGET_CAP_REACHED, note)
    # Cost per token is an efficiency ceiling, not a spending one: at low traffic it would
    # otherwise starve the fleet below min_replicas (even to zero). It limits scale-out only; the
    # hard max_cost_per_hour_usd still beats min_replicas.
    floor_usd = fill(total=min(lo, total), max_cost_per_hour_usd=hard).cost_per_hour_usd
    if token_cap < floor_usd:
        note += f", raised to ${floor_usd:.2f}/h (the cost of min_replicas {lo})"
        token_cap = floor_usd
    return _Cap(token_cap, Reason.COST_PER_TOKEN_CAP_REACHED.value, note)


def _placement(prev: _Step, result: PlacementResult, current: int, previous: Mapping[str, int],
               fixed: Mapping[str, int]) -> _Step:
    """Stage 10: replicas per pool. The total's reason stays unless placement limited it, or only
    the placement moved (then the placement event is the story). ``current``: the replicas
    without the spares, as the placement's total without its own."""
    placed, reason = result.total, prev.reason
    moved_only = placed - result.spare == current and result.replicas != previous
    code = reason
    if result.capacity_limited:
        reason = code = _CAPACITY_EXHAUSTED
    elif result.reason != _BUDGET_CAP_REACHED and result.reason != _PLACED:
        code = result.reason
        if moved_only:
            reason = result.reason
    elif fixed and moved_only:
        reason = code = Reason.OVERRIDE_PIN.value
    return _Step(placed, reason, Stage("placement", placed, code, result.message()))


def _budget(prev: _Step, result: PlacementResult, cap: _Cap, total: int, lo: int) -> _Step:
    """Stage 11, second half: what the cost ceiling did to the placement."""
    placed, note = prev.value, (f"; {cap.note}" if cap.note else "")
    if cap.usd is None:
        return _Step(placed, prev.reason, Stage("budget", placed, prev.reason,
                                                f"${result.cost_per_hour_usd:.2f}/h, no cap{note}"))
    if not result.budget_limited:
        return _Step(placed, prev.reason, Stage(
            "budget", placed, prev.reason,
            f"${result.cost_per_hour_usd:.2f}/h <= cap ${cap.usd:.2f}/h ({_WITHIN_BUDGET}){note}"))
    msg = f"cap ${cap.usd:.2f}/h reached: ${result.cost_per_hour_usd:.2f}/h for {placed} of {total} replicas"
    if result.budget_removed:
        msg += f", removed {result.budget_removed}"
    if placed < lo:
        msg += f"; the budget beats min_replicas {lo}"
    return _Step(placed, cap.reason, Stage("budget", placed, cap.reason, msg + note))


def _outcome(prev: _Step, result: PlacementResult, effect: OverrideEffect, paused: bool, current: int,
             previous: dict[str, int], frozen_cost: Callable[[], float]) -> _Outcome:
    """Stage 12: whether to actuate. A freeze keeps the placement as it is (the trace above shows
    what it would have done); ``paused`` decides without acting."""
    placed, placement = prev.value, result.replicas
    if effect.freeze is not None:
        stage = Stage("outcome", current, Reason.OVERRIDE_FREEZE.value,
                      f"frozen by override #{effect.freeze.id}: would place {placed}, keeping {current}")
        reason = Reason.PAUSED.value if paused else Reason.OVERRIDE_FREEZE.value
        return _Outcome(dict(previous), current, reason, False, frozen_cost(), 0, stage)
    if paused:
        stage = Stage("outcome", placed, Reason.PAUSED.value, "paused: decided, not acting")
        return _Outcome(placement, placed, Reason.PAUSED.value, False, result.cost_per_hour_usd,
                        result.interrupted_replaced, stage)
    if placement != previous:
        stage = Stage("outcome", placed, _SCALED, f"{current} -> {placed}")
    else:
        stage = Stage("outcome", placed, _UNCHANGED, f"unchanged at {placed}")
    return _Outcome(placement, placed, prev.reason, True, result.cost_per_hour_usd, result.interrupted_replaced,
                    stage)


def _scale_events(events: tuple[ScaleEvent, ...], spec: PolicySpec, result: PlacementResult, out: _Outcome,
                  history: History, rule_state: dict[str, Mapping[str, Any]], current: int, now: datetime) -> tuple[ScaleEvent, ...]:
    """The rate-limit history with this decision's step, the spares left out (the spot hedge's and
    the fallback return's: they are no demand), and the spares recorded in ``rule_state`` for the
    next tick (kept as they were when not acting). No entry while there is nothing to record and
    the hedge is off: the common case stays as it was."""
    held = history.rule_state.get(SPARE_STATE_KEY)
    if not out.actuate:
        if held is not None or spec.placement.spot_hedge > 0:
            rule_state[SPARE_STATE_KEY] = spare_state(held_spare(history.rule_state),
                                                       held_spare(history.rule_state, "return"))
    elif result.spare or held is not None or spec.placement.spot_hedge > 0:
        rule_state[SPARE_STATE_KEY] = spare_state(result.spare, result.return_spare)
    demand = out.replicas - (result.spare if out.actuate else 0)
    if out.actuate and demand != current:
        return events + (ScaleEvent(now, current, demand),)
    return events


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
    spec, states = policy.spec, signals.pools
    previous, unknown = _observed(model, states)
    if unknown:
        return _not_observed(model, pools, states, policy, history, previous, unknown, now)
    observed = sum(previous.values())
    spare = held_spare(history.rule_state)  # spares (spot hedge, fallback return) are no demand:
    current = observed - spare if spare < observed else 0  # the rules and safeguards see the rest
    fresh, ready, pressure = _observe(model, signals, spec, now)
    learned = _capacity(model, pools, signals, previous, policy, history, now, fresh, ready, pressure)
    op = _opinions(policy, history, partial(
        PolicyContext, model=model, signals=signals, now=now, current_replicas=current,
        ready_replicas=ready, capacity=None if learned is None else learned.capacity,
        slo=policy.slo_targets, max_signal_age_s=spec.missing_data.max_signal_age_s))
    if learned is not None:
        op.rule_state[learned_capacity.STATE_KEY] = learned.state
    recommended = _recommend(op, current, learned)
    combined = _combine(op, recommended, current)
    tolerated = _tolerance(combined, current, spec.behavior)
    guarded = _missing_data(tolerated, op.missing, signals, current, spec.missing_data)
    recommendations, stabilized = _stabilize(guarded, current, history, now, spec.behavior, policy.keep_s[0])
    events, limited = _rate_limit(stabilized, current, history, now, spec.behavior, policy.keep_s[1])
    effect = resolve(overrides, model=model, now=now)
    lo, bounded = _bounds(limited, effect, op.floor, spec.bounds)
    fixed, drained, overridden = _overrides(bounded, effect, previous, spec.bounds.max_replicas)
    max_cloud, timed = _lead_time(overridden, op, model, pools, signals, spec, history, fixed, drained,
                                  fresh.arrivals, pressure.value, lo, effect.pin_total is not None, now)
    fill = partial(place, model=model, pools=pools, states=states, placement=spec.placement, drained=drained,
                   pinned=fixed, max_total=effect.bounds_for(spec.bounds.min_replicas, spec.bounds.max_replicas)[1],
                   max_cloud=max_cloud, returning=held_spare(history.rule_state, "return") if spare else 0,
                   window_held=_window_held(timed.value, guarded.value, recommendations, now, spec, lo, fixed, effect),
                   warm_spot=_warm_spot(op, model, pools, states, spec, history, drained, timed.value, now))
    cap = _cost_cap(spec.budget, fresh.output_tokens, lo, timed.value, fill)
    result = fill(total=timed.value, max_cost_per_hour_usd=cap.usd)
    placed = _placement(timed, result, current, previous, fixed)
    budgeted = _budget(placed, result, cap, timed.value, lo)
    out = _outcome(budgeted, result, effect, paused, observed, previous,
                   partial(placement_cost, model, pools, states, previous))
    events = _scale_events(events, spec, result, out, history, op.rule_state, current, now)
    return Decision(
        model=model.name, at=now, current_replicas=observed, replicas=out.replicas, placement=out.placement,
        previous_placement=previous, recommendations=op.recs,
        trace=(recommended.stage, combined.stage, tolerated.stage, guarded.stage, stabilized.stage, limited.stage,
               bounded.stage, overridden.stage, timed.stage, placed.stage, budgeted.stage, out.stage),
        reason=out.reason, actuate=out.actuate, cost_per_hour_usd=out.cost_per_hour_usd,
        policy_version=policy.version,
        history=History(recommendations=recommendations, scale_events=events, rule_state=op.rule_state),
        interrupted_replaced=out.interrupted_replaced,
    )
