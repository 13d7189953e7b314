"""The shared safeguards of Kubernetes' HPA, as pure functions over timestamps.

Every policy kind gets the same treatment around its raw opinion (``controller.core.pipeline``
calls these in order): a tolerance dead band, stabilization windows, rate limits and cooldowns.
They live apart from the pipeline so that they can be tested table-driven against the HPA's own
examples (``pkg/controller/podautoscaler/horizontal.go``: ``stabilizeRecommendationWithBehaviors``,
``calculateScaleUpLimitWithScalingRules``, ``calculateScaleDownLimitWithBehaviors``) and reused by
the simulator.

Time is data: windows, periods and cooldowns compare the timestamps stored in ``History`` with the
``now`` passed in. Nothing here counts ticks or reads the clock. Histories are kept in
chronological order (the pipeline appends; a restart rebuilds them from the decision log in order),
which lets pruning and window scans start with a binary search.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_right
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Sequence

from controller.core.model import ScaleEvent, fast_init
from controller.core.reasons import Reason
from controller.core.spec import Behavior, RateLimitType, ScalingRules


@fast_init
@dataclass(frozen=True, slots=True)
class Step:
    """What one safeguard did: the replicas after it, and why, when it changed them."""

    replicas: int
    reason: str | None
    """A ``Reason`` code when this step changed (or held) the value; ``None`` when it let it pass."""
    message: str


_rec_at = operator.itemgetter(0)
"""A recommendation's time (C-level: it keys the binary searches every decision makes)."""


def _event_at(event: ScaleEvent) -> datetime:
    return event.at


def tolerance(desired: int, current: int, tolerance_frac: float) -> Step:
    """HPA's dead band: ignore a change within ``tolerance_frac`` of the current replicas.

    With ``current == 0`` the band is empty, so scaling from zero always passes.
    """
    if desired == current:
        return Step(desired, None, f"no change from current {current}")
    band = tolerance_frac * current
    delta = abs(desired - current)
    if delta <= band:
        return Step(
            current, Reason.WITHIN_TOLERANCE.value,
            f"|{desired} - {current}| = {delta} <= {tolerance_frac:g} x {current} = {band:g}: keep {current}",
        )
    return Step(desired, None, f"|{desired} - {current}| = {delta} > {tolerance_frac:g} x {current} = {band:g}")


def stabilize(
    desired: int,
    current: int,
    now: datetime,
    recommendations: Sequence[tuple[datetime, int]],
    *,
    up_window_s: float,
    down_window_s: float,
) -> Step:
    """HPA ``stabilizeRecommendationWithBehaviors``.

    Scale-up goes no higher than the *lowest* recommendation of the last ``up_window_s`` seconds,
    scale-down no lower than the *highest* of the last ``down_window_s`` seconds (``desired``
    itself counts as the newest recommendation). A recommendation exactly ``window`` seconds old is
    outside the window, as in the HPA (``timestamp.After(cutoff)``).
    """
    up_cutoff = now - timedelta(seconds=up_window_s)
    down_cutoff = now - timedelta(seconds=down_window_s)
    up_rec = desired
    down_rec = desired
    start = bisect_right(recommendations, min(up_cutoff, down_cutoff), key=_rec_at)
    for at, value in recommendations[start:]:
        if value < up_rec and at > up_cutoff:
            up_rec = value
        if value > down_rec and at > down_cutoff:
            down_rec = value
    result = current
    if result < up_rec:
        result = up_rec
    if result > down_rec:
        result = down_rec
    if result == desired:
        return Step(desired, None, f"windows up {up_window_s:g}s / down {down_window_s:g}s allow {desired}")
    if result < desired:
        return Step(
            result, Reason.SCALE_UP_STABILIZED.value,
            f"wanted {desired}; lowest recommendation in the last {up_window_s:g}s is {up_rec}: {result}",
        )
    return Step(
        result, Reason.SCALE_DOWN_STABILIZED.value,
        f"wanted {desired}; highest recommendation in the last {down_window_s:g}s is {down_rec}: {result}",
    )


def _changes_in_period(events: Sequence[ScaleEvent], now: datetime, period_s: float) -> tuple[int, int]:
    """(replicas added, replicas removed) by events younger than ``period_s`` (HPA
    ``getReplicasChangePerPeriod``, once per direction)."""
    cutoff = now - timedelta(seconds=period_s)
    added = removed = 0
    for i in range(bisect_right(events, cutoff, key=_event_at), len(events)):
        change = events[i].to_replicas - events[i].from_replicas
        if change > 0:
            added += change
        else:
            removed -= change
    return added, removed


def scale_up_limit(current: int, now: datetime, events: Sequence[ScaleEvent], rules: ScalingRules) -> int | None:
    """Most replicas the scale-up rate limits allow now; ``None`` when no limit is configured.

    HPA semantics: each policy allows ``value`` replicas (or ``value`` percent, rounded up) more
    than the replica count at the *start* of its period, i.e. current minus what was added plus
    what was removed within the period. ``select`` picks the most permissive (``max``) or the
    strictest (``min``) policy, or forbids scaling up (``disabled``). Never below ``current``.
    """
    if rules.select == "disabled":
        return current
    if not rules.policies:
        return None
    pick = max if rules.select == "max" else min
    result: int | None = None
    for policy in rules.policies:
        added, removed = _changes_in_period(events, now, policy.period_s)
        start = current - added + removed
        if policy.type is RateLimitType.REPLICAS:
            proposed = start + policy.value
        else:
            # Rounded up, as in the HPA: otherwise a small deployment could never grow.
            proposed = math.ceil(start * (1 + policy.value / 100))
        result = proposed if result is None else pick(result, proposed)
    assert result is not None
    return max(result, current)


def scale_down_limit(current: int, now: datetime, events: Sequence[ScaleEvent], rules: ScalingRules) -> int | None:
    """Fewest replicas the scale-down rate limits allow now; ``None`` when no limit is configured.

    HPA semantics, mirrored: ``value`` replicas (or percent, rounded down as the HPA truncates)
    fewer than at the start of the period; ``max`` picks the policy allowing the biggest change
    (the fewest replicas), ``min`` the smallest change. Never above ``current``.
    """
    if rules.select == "disabled":
        return current
    if not rules.policies:
        return None
    pick = min if rules.select == "max" else max
    result: int | None = None
    for policy in rules.policies:
        added, removed = _changes_in_period(events, now, policy.period_s)
        start = current - added + removed
        if policy.type is RateLimitType.REPLICAS:
            proposed = start - policy.value
        else:
            proposed = int(start * (1 - policy.value / 100))
        result = proposed if result is None else pick(result, proposed)
    assert result is not None
    return min(result, current)


def _last_event(events: Sequence[ScaleEvent], up: bool) -> ScaleEvent | None:
    for i in range(len(events) - 1, -1, -1):
        ev = events[i]
        if (ev.to_replicas > ev.from_replicas) == up and ev.to_replicas != ev.from_replicas:
            return ev
    return None


def rate_limit(
    desired: int,
    current: int,
    now: datetime,
    events: Sequence[ScaleEvent],
    *,
    up: ScalingRules,
    down: ScalingRules,
) -> Step:
    """Cooldowns, then HPA rate limits, in the direction of the change.

    A cooldown holds the current replicas while the last scaling event in the same direction is
    younger than ``cooldown_s``; otherwise the rate limit of that direction clamps the change.
    """
    if desired == current:
        return Step(desired, None, f"no change from current {current}")
    rising = desired > current
    rules = up if rising else down
    return _cooldown(desired, current, now, events, rules, rising) or _limit(desired, current, now, events, rules,
                                                                              rising)


_DIRECTIONS = {
    True: ("scale-up", Reason.SCALE_UP_COOLDOWN.value, Reason.SCALE_UP_LIMITED.value),
    False: ("scale-down", Reason.SCALE_DOWN_COOLDOWN.value, Reason.SCALE_DOWN_LIMITED.value),
}
"""Per direction (rising?): its name in messages, its cooldown reason, its rate-limit reason."""


def _cooldown(desired: int, current: int, now: datetime, events: Sequence[ScaleEvent], rules: ScalingRules,
              rising: bool) -> Step | None:
    """Hold ``current`` while the last change in the same direction is younger than the cooldown."""
    last = _last_event(events, up=rising)
    if last is None or rules.cooldown_s <= 0:
        return None
    age_s = (now - last.at).total_seconds()
    if age_s >= rules.cooldown_s:
        return None
    word, code, _ = _DIRECTIONS[rising]
    return Step(current, code,
                f"wanted {desired}; last {word} {age_s:g}s ago < cooldown {rules.cooldown_s:g}s: keep {current}")


def _limit(desired: int, current: int, now: datetime, events: Sequence[ScaleEvent], rules: ScalingRules,
           rising: bool) -> Step:
    """Clamp the change to the direction's rate limit (none with no policies)."""
    word, _, code = _DIRECTIONS[rising]
    if rising:
        limit = scale_up_limit(current, now, events, rules)
        beyond = limit is not None and desired > limit
    else:
        limit = scale_down_limit(current, now, events, rules)
        beyond = limit is not None and desired < limit
    if limit is None or not beyond:
        return Step(desired, None, f"{word} to {desired} within rate limits")
    why = f"{word} disabled" if rules.select == "disabled" else f"rate limits ({rules.select}) allow {limit}"
    return Step(limit, code, f"wanted {desired}; {why}: {limit}")


def keep_seconds(behavior: Behavior) -> tuple[float, float]:
    """How long ``History`` must remember (recommendations, scale events), seconds: the longest
    stabilization window, and the longest rate-limit period or cooldown."""
    up, down = behavior.scale_up, behavior.scale_down
    rec_keep = max(up.stabilization_s, down.stabilization_s)
    ev_keep = max(up.cooldown_s, down.cooldown_s)
    for policy in up.policies:
        ev_keep = max(ev_keep, policy.period_s)
    for policy in down.policies:
        ev_keep = max(ev_keep, policy.period_s)
    return rec_keep, ev_keep


def prune_recommendations(
    recommendations: tuple[tuple[datetime, int], ...], now: datetime, keep_s: float
) -> tuple[tuple[datetime, int], ...]:
    """Drop recommendations at least ``keep_s`` seconds old (no window can see them any more)."""
    start = bisect_right(recommendations, now - timedelta(seconds=keep_s), key=_rec_at)
    return recommendations[start:] if start else recommendations


def prune_events(events: tuple[ScaleEvent, ...], now: datetime, keep_s: float) -> tuple[ScaleEvent, ...]:
    """Drop scale events at least ``keep_s`` seconds old (no period or cooldown can see them)."""
    start = bisect_right(events, now - timedelta(seconds=keep_s), key=_event_at)
    return events[start:] if start else events
