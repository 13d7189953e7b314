"""Lead-time economics: cloud capacity is bought for the demand at its ready time, and goes first.

Why: a cloud replica ordered now serves only after its pool's provisioning delay plus the model's
cold start (the *lead time*: 6-8 minutes on the example fleet). Ordered at the start of a burst
shorter than that, it arrives after the burst and is paid for nothing; held as long as on-prem
capacity (the burst memory and the scale-down window), it is paid for at a tenth of the load. This
module decides, for one tick, how many replicas the cloud tiers (spot and on-demand) may hold; the
pipeline's ``lead-time`` stage applies it and placement keeps within it
(``controller.core.placement.place``'s ``max_cloud``):

* **Ordering.** New cloud replicas are ordered only when the demand at their ready time is expected
  to need them: the present need beyond what the on-prem pools hold has lasted long enough that
  the burst is expected to outlast the lead time (:func:`survival`: from the durations of past
  bursts, with the burst's own age as the prior: a burst ``a`` seconds old is taken to last
  another ``a``, so with no history and ``min_survival`` at its default 0.3 nothing is ordered
  before a burst is 3/7 of a lead time old), or
  the arrivals (``arrival_rate_per_s``: the completions plus the requests piling up) have risen
  steadily over the last lead time and the rules' trend expects the need beyond on-prem
  (:func:`rising`: a step or a spike is not a trend). Cloud is also ordered, whatever the
  burst's age, when the SLO is missed now (the pipeline's pressure, ``Need.pressure``, at or
  above 1) while the present need exceeds on-prem:
  the miss is certain, the burst's end is not (:func:`_why_missing`); and ahead of a burst expected
  from the past gaps between bursts, from one lead time plus the cloud window before it until its
  expected end (:func:`_why_recurring`: the rules' memory of past peaks may then hold cloud).
  Otherwise the burst is served from on-prem spare (``BurstShorterThanLeadTime``).
* **Scale-in by tier.** Cloud replicas stay while the present need (or a steady rise) needs them,
  and go once it has fit without them for ``spec.lead_time.cloud_scale_down_s`` (short, 60 s by
  default: ``CloudReleased``), or, when past bursts came in trains with gaps shorter than the lead
  time, for the median gap (:meth:`_Bursts.hold_s`); on-prem keeps the policy's long scale-down
  window and burst memory. Cloud ordered for an SLO miss is not released before it could have
  served: it stays (while the total asks for it) for one lead time plus the window after the last
  miss, as an order cancelled before it is ready leaves the next spike of a train with nothing on
  its way. While a burst runs (until the need has fit on-prem for the window) its ready cloud
  replicas stay through a shorter dip.
  Placement removes cloud replicas that are not ready yet first: an order that is still
  provisioning is cancelled before a replica that serves.
* **Missing data** never releases: while a rule has no opinion for lack of data (and the policy
  holds on missing data) the cloud replicas stay.

The present need and the trend come from the rules: ``Recommendation.present_replicas`` (the need
of the load seen now, without anticipation or memory of past peaks) and
``Recommendation.trend_replicas`` (the need the rule's trend expects one lead time ahead, without
memory); a reactive rule's ``replicas`` is both.

The state is plain JSON in the history's rule state under :data:`STATE_KEY`: the start of the
current burst and when the need last exceeded on-prem, the durations of past bursts and the gaps
between them, the recent need beyond on-prem (the scale-down window's memory), the arrival samples
of the last lead time, and when cloud was last ordered for a miss.
Nothing here reads the clock.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Collection, Mapping, NamedTuple, Sequence

from controller.core.model import ModelSpec, PoolSpec, PoolState, fast_init
from controller.core.reasons import Reason
from controller.core.spec import LeadTime
from controller.core.spec import Placement as PlacementSpec

STATE_KEY = "@lead-time"
"""Where the state lives in ``History.rule_state`` (``@``: reserved for tidegate's own state)."""

RISE_MARGIN = 0.05
"""A steady rise: the load at each of three points over the last lead time (its start, middle and
now) is at least 5 % above the one before. A Poisson rate of a few requests per second over a
minute wanders by less; a step shows as a flat first half."""

LOAD_SAMPLE_S = 15.0
"""Load samples for :func:`rising` are kept at least this far apart (the daemon ticks every few
seconds; three points over minutes need no more)."""


def pool_lead_time_s(spec: PoolSpec, model: ModelSpec) -> float:
    """Seconds from ordering a replica on ``spec`` until it serves: the pool's provisioning delay
    (no node to order on-prem) plus the model's cold start."""
    delay = 0.0 if spec.tier.is_onprem else spec.provisioning_delay_s
    return delay + model.cold_start_s


def _usable(name: str, spec: PoolSpec | None, model: ModelSpec, placement: PlacementSpec,
            drained: Collection[str]) -> bool:
    if spec is None or name in drained or spec.replicas_per_node(model) <= 0:
        return False
    if placement.pools is not None and name not in placement.pools:
        return False
    return not (spec.tier.is_ondemand and not placement.allow_on_demand)


def cloud_lead_time_s(model: ModelSpec, pools: Mapping[str, PoolSpec], placement: PlacementSpec,
                      drained: Collection[str] = ()) -> float | None:
    """The lead time of the cloud capacity a burst would buy: the slowest usable cloud pool's (a
    burst buys over several pools, spot spread; the purchase serves in full when the slowest is
    ready). ``None`` when the model can use no cloud pool."""
    leads = [pool_lead_time_s(spec, model) for name in model.pools
             if (spec := pools.get(name)) is not None and not spec.tier.is_onprem
             and _usable(name, spec, model, placement, drained)]
    return max(leads) if leads else None


def onprem_room(model: ModelSpec, pools: Mapping[str, PoolSpec], states: Mapping[str, PoolState],
                placement: PlacementSpec, drained: Collection[str] = ()) -> int:
    """Replicas the usable, available on-prem pools hold at most (whole replicas on whole nodes,
    within the provider's own node bound)."""
    room = 0
    for name in model.pools:
        spec = pools.get(name)
        if spec is None or not spec.tier.is_onprem or not _usable(name, spec, model, placement, drained):
            continue
        st = states.get(name)
        if st is not None and not st.available:
            continue
        nodes = spec.max_nodes if st is None or st.max_nodes is None else min(spec.max_nodes, max(0, st.max_nodes))
        room += nodes * spec.replicas_per_node(model)
    return room


def cloud_replicas(model: ModelSpec, pools: Mapping[str, PoolSpec], states: Mapping[str, PoolState]
                   ) -> tuple[int, int]:
    """(replicas, ready replicas) on the model's cloud pools now (unknown readiness: none ready)."""
    total = ready = 0
    for name in model.pools:
        spec, st = pools.get(name), states.get(name)
        if spec is None or spec.tier.is_onprem or st is None or st.replicas is None:
            continue
        total += max(0, st.replicas)
        ready += min(max(0, st.replicas), max(0, st.ready_replicas or 0))
    return total, ready


def survival(age_s: float, lead_s: float, bursts: Sequence[float]) -> float:
    """Probability that a burst ``age_s`` old still runs ``lead_s`` from now.

    The share of past bursts that lasted at least ``age_s + lead_s`` among those that lasted at
    least ``age_s``, with one more observation from the prior: a burst lasts about as long again
    as it has lasted (``age / (age + lead)``: a power-law survival, the least informed guess that
    still lets a long burst justify capacity). With no past burst the prior alone decides, so a
    burst younger than the lead time never reaches 0.5."""
    prior = age_s / (age_s + lead_s) if age_s + lead_s > 0 else 1.0
    lasted = sum(1 for d in bursts if d >= age_s)
    beyond = sum(1 for d in bursts if d >= age_s + lead_s)
    return (beyond + prior) / (lasted + 1)


def rising(loads: Sequence[tuple[float, float]], now_s: float, lead_s: float) -> bool:
    """Whether the load has risen steadily over the last ``lead_s``: the history covers it, and
    the load at its start, its middle and now each exceed the one before by :data:`RISE_MARGIN`.
    A step (flat, then high) or a spike that has passed is not a trend."""
    if not loads or lead_s <= 0 or now_s - loads[0][0] < lead_s:
        return False  # no trend before the history covers the window
    times = [t for t, _ in loads]
    points = [loads[min(bisect_left(times, now_s - back), len(loads) - 1)][1] for back in (lead_s, lead_s / 2)]
    points.append(loads[-1][1])
    return all(b > 0 and b >= a * (1 + RISE_MARGIN) and b > a for a, b in zip(points, points[1:]))


@fast_init
@dataclass(frozen=True, slots=True)
class Need:
    """What the rules say the load needs, in replicas, and whether they all had data."""

    total: int
    """The total decided so far (after bounds and overrides: the rules' sizing with trend and
    memory of past peaks)."""
    present: int
    """The need of the load seen now (no anticipation, no memory)."""
    trend: int
    """The need the rules' trend expects one lead time ahead (no memory)."""
    load: float | None
    """The arrivals, requests/s (``arrival_rate_per_s``, or the completions where it is missing),
    for :func:`rising`; ``None`` when unknown. Requests as they are, not in replicas of a
    capacity: the capacity for the observed token mix moves with the load while the replicas
    saturate, and would hide the rise."""
    missing: bool
    """A rule had no opinion for lack of data and the policy holds on missing data."""
    pressure: float | None = None
    """How close the ready replicas are to the SLO now (1 = at it, above: missing it; the
    pipeline's pressure signal); ``None`` when unknown."""


class CloudCap(NamedTuple):
    """This tick's verdict: the cloud ceiling (``None``: no ceiling), why it cuts, and the state."""

    max_cloud: int | None
    reason: str | None
    """``BurstShorterThanLeadTime``, ``CloudReleased`` or ``CloudNotNeeded`` when the ceiling holds
    the cloud below what the total would put there; ``None`` otherwise."""
    message: str
    state: dict[str, Any]


def _floats(raw: Any) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in raw or ())
    except (TypeError, ValueError):
        return ()  # a malformed state starts afresh, never fatal


def _pairs(raw: Any) -> list[tuple[float, float]]:
    try:
        return [(float(t), float(v)) for t, v in raw or ()]
    except (TypeError, ValueError):
        return []


def _opt(raw: Any) -> float | None:
    return raw if isinstance(raw, (int, float)) and math.isfinite(raw) else None


@dataclass(slots=True)
class _Bursts:
    """The burst bookkeeping read from and written back to the state (private, mutable)."""

    since: float | None
    last_over: float | None
    durations: tuple[float, ...]
    gaps: tuple[float, ...]
    recent: list[tuple[float, float]]
    loads: list[tuple[float, float]]
    missed: float | None = None
    """When cloud was last ordered for an SLO miss (:func:`_why_missing`)."""

    @classmethod
    def read(cls, state: Mapping[str, Any]) -> "_Bursts":
        return cls(_opt(state.get("since")), _opt(state.get("last_over")), _floats(state.get("bursts")), _floats(state.get("gaps")),
                   _pairs(state.get("recent")), _pairs(state.get("loads")), _opt(state.get("missed")))

    def hold_s(self, window_s: float, lead_s: float) -> float:
        """How long cloud replicas outlive the need for them: ``window_s``, or when past bursts
        came in trains with gaps shorter than the lead time (a replica released in such a gap
        cannot be back for the next burst), the median gap."""
        if not self.gaps:
            return window_s
        gap = sorted(self.gaps)[len(self.gaps) // 2]
        return max(window_s, gap) if gap < lead_s else window_s

    def expected_s(self) -> float | None:
        """When the next burst is expected: the end of the last one plus the median of the past
        gaps between bursts (``None`` while a burst runs or before a gap is known)."""
        if self.since is not None or self.last_over is None or not self.gaps:
            return None
        return self.last_over + sorted(self.gaps)[len(self.gaps) // 2]

    def observe(self, now_s: float, over: bool, hold_s: float, keep: int) -> None:
        """A burst starts when the present need first exceeds on-prem and ends once it has fit
        on-prem for ``hold_s`` (a shorter dip does not split it); the gap before it is kept."""
        if over:
            if self.since is None:
                self.since = now_s
                if self.last_over is not None:
                    self.gaps = (self.gaps + (now_s - self.last_over,))[-keep:] if keep else ()
            self.last_over = now_s
        elif self.since is not None and self.last_over is not None and now_s - self.last_over >= hold_s:
            self.durations = (self.durations + (self.last_over - self.since,))[-keep:] if keep else ()
            self.since = None

    def remember(self, now_s: float, beyond: int, window_s: float, arrivals: float | None, lead_s: float) -> int:
        """Record the need beyond on-prem and the arrivals; the most beyond on-prem in the window."""
        self.recent = [(t, v) for t, v in self.recent if now_s - t < window_s] + [(now_s, float(beyond))]
        if arrivals is not None and (not self.loads or now_s - self.loads[-1][0] >= LOAD_SAMPLE_S):
            self.loads.append((now_s, arrivals))
        # the oldest sample at least lead_s old stays: rising() needs one there
        k = bisect_left([t for t, _ in self.loads], now_s - lead_s)
        self.loads = self.loads[max(0, k - 1):]
        return int(max(v for _, v in self.recent))

    def state(self) -> dict[str, Any]:
        return {"since": self.since, "last_over": self.last_over, "bursts": self.durations, "gaps": self.gaps,
                "recent": tuple(self.recent), "loads": tuple(self.loads), "missed": self.missed}


def off(state: Mapping[str, Any]) -> CloudCap:
    """The verdict while lead-time economics is off: no ceiling, the state kept as it was."""
    return CloudCap(None, None, "off", dict(state))


def cloud_cap(state: Mapping[str, Any], need: Need, *, now_s: float, onprem: int, cloud: int, cloud_ready: int,
              lead_s: float | None, rules: LeadTime) -> CloudCap:
    """How many replicas the cloud pools may hold this tick (the module docstring's rules).

    ``onprem``: the replicas the on-prem pools hold at most; ``cloud``, ``cloud_ready``: the
    replicas on cloud pools now, and of those the ready ones; ``lead_s``: the cloud lead time
    (``None``: no cloud pool, no ceiling)."""
    if not rules.enabled:
        return off(state)
    if lead_s is None:
        return CloudCap(None, None, "no cloud pool", dict(state))
    b = _Bursts.read(state)
    window = b.hold_s(rules.cloud_scale_down_s, lead_s)
    in_burst = need.present > onprem
    b.observe(now_s, in_burst, window, rules.burst_history)
    steady, keep = _expected(b, need, now_s, onprem, window, lead_s)
    missing_now = _why_missing(in_burst, need, onprem)
    keep = _held(b, need, keep, bool(missing_now), now_s, cloud, cloud_ready, lead_s + window)
    wanted = max(0, need.total - onprem)
    age = 0.0 if b.since is None else now_s - b.since
    p = survival(age, lead_s, b.durations) if in_burst else 0.0
    why = _why_order(in_burst, p, age, lead_s, len(b.durations), steady, need.trend, onprem, rules) \
        or missing_now or _why_recurring(b.expected_s(), now_s, lead_s + window, b.durations)
    if why:
        cap = max(wanted, min(cloud, keep))
        return CloudCap(cap, None, f"cloud up to {cap}: {why}", b.state())
    cap = min(cloud, keep)
    if wanted <= cap:
        return CloudCap(cap, None, f"cloud {cloud} ({cloud_ready} ready), need beyond on-prem {onprem}: {wanted}",
                        b.state())
    if in_burst:
        return CloudCap(cap, Reason.BURST_SHORTER_THAN_LEAD_TIME.value,
                        f"burst {age:.0f}s old, P(still on in {lead_s:.0f}s lead time) = {p:.2f} < "
                        f"{rules.min_survival:g} from {len(b.durations)} past burst(s): serving it from on-prem "
                        f"({onprem}), not ordering {wanted - cap} cloud replica(s); keeping {cap} of {cloud} cloud",
                        b.state())
    return _released(need, cap, cloud, onprem, window, b.state())


def _expected(b: _Bursts, need: Need, now_s: float, onprem: int, window: float, lead_s: float) -> tuple[bool, int]:
    """(whether the arrivals rise steadily over the lead time, the cloud replicas the expected need
    beyond on-prem asked for within the window): the present need, or the trend's when steady."""
    arrivals = need.load
    steady = rising(b.loads + ([(now_s, arrivals)] if arrivals is not None else []), now_s, lead_s)
    expected = max(need.present, need.trend) if steady else need.present
    return steady, b.remember(now_s, max(0, min(expected, need.total) - onprem), window, arrivals, lead_s)


def _held(b: _Bursts, need: Need, keep: int, missed_now: bool, now_s: float, cloud: int, cloud_ready: int,
          miss_hold_s: float) -> int:
    """The cloud replicas kept whatever the need says: all of them on missing data (it never
    releases capacity) and for ``miss_hold_s`` after an SLO miss (an order made for a miss is not
    cancelled before it serves); the ready ones while a burst runs (a dip shorter than the window)."""
    if need.missing:
        keep = max(keep, cloud)
    if missed_now:
        b.missed = now_s
    if b.missed is not None and now_s - b.missed < miss_hold_s:
        return max(keep, cloud)
    if b.since is not None:
        return max(keep, cloud_ready)
    return keep


def _why_order(in_burst: bool, p: float, age: float, lead_s: float, n_bursts: int, steady: bool, trend: int,
               onprem: int, rules: LeadTime) -> str:
    """Why new cloud replicas may be ordered now ("" when they may not)."""
    if in_burst and p >= rules.min_survival:
        return (f"burst {age:.0f}s old, P(still on in {lead_s:.0f}s) = {p:.2f} >= {rules.min_survival:g}"
                f" from {n_bursts} past burst(s)")
    if steady and trend > onprem:
        return f"load rising steadily over {lead_s:.0f}s, trend needs {trend} > on-prem {onprem}"
    return ""


def _why_missing(in_burst: bool, need: Need, onprem: int) -> str:
    """Why cloud may be ordered although the burst may end before it serves: the SLO is missed now
    and on-prem cannot hold the present need. A miss now is certain, the burst's end is not ("" when
    the SLO is kept or on-prem holds the need)."""
    if in_burst and need.pressure is not None and need.pressure >= 1.0:
        return f"SLO missed now (pressure {need.pressure:.2f}) and the need {need.present} exceeds on-prem {onprem}"
    return ""


def _why_recurring(expected_s: float | None, now_s: float, ahead_s: float, durations: Sequence[float]) -> str:
    """Why cloud may be ordered (or kept) before a burst: past bursts came after gaps like this one
    and the next is expected within ``ahead_s`` (the lead time plus the cloud window: a replica
    released that close to it would be ordered again at once) ("" otherwise). The capacity is held
    until the expected burst should have ended (the median past duration after its expected
    start)."""
    if expected_s is None:
        return ""
    last = sorted(durations)[len(durations) // 2] if durations else 0.0
    if expected_s - ahead_s <= now_s <= expected_s + last:
        return f"a burst is expected in {max(0.0, expected_s - now_s):.0f}s (past gaps between bursts)"
    return ""


def _released(need: Need, cap: int, cloud: int, onprem: int, window: float, state: dict[str, Any]) -> CloudCap:
    """No burst: cloud replicas beyond the present need go (``CloudReleased``), and none is ordered
    for a total that is memory or an unsteady trend (``CloudNotNeeded``)."""
    if cap < cloud:
        return CloudCap(cap, Reason.CLOUD_RELEASED.value,
                        f"need {need.present}, on-prem {onprem}: at most {cap} needed beyond it over the last "
                        f"{window:g}s: releasing {cloud - cap} of {cloud} cloud replica(s) (not ready first)", state)
    return CloudCap(cap, Reason.CLOUD_NOT_NEEDED.value,
                    f"need {need.present} fits on-prem ({onprem}); the total {need.total} beyond it is memory of "
                    "past peaks or a trend that is not steady: no cloud replica ordered for it", state)
