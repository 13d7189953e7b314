"""``forecast``: order capacity one lead time ahead of the load, not after it arrives.

Why: a new cloud replica serves only after node provisioning plus cold start (3-8 minutes on the
example fleet). A reactive rule (slo-guard, HPA, KEDA) orders it when the load is already there,
so every ramp and every repeated spike is served short-handed for that long. This kind keeps a
short history of the observed request and output-token rates in its explicit state and sizes the
fleet for the load expected ``lead_time_s`` from now:

* **trend**: the least-squares slope of the rate over the last ``trend_window_s``, extrapolated
  ``lead_time_s`` ahead from the latest rate (rising trends only: capacity can be released at once,
  so a falling trend is never anticipated). A step is not a trend: the window's slope goes on
  projecting a rise that is over for as long as the step stays in the window (a load that jumped
  from 3 to 52 requests/s and stayed there read a trend of 103 five minutes later). So where the
  rise over the last ``trend_confirm_s`` is under a quarter of the slope's pace
  (:data:`STEP_PACE`), that recent pace is extrapolated instead (:func:`confirmed_slope`);
* **burst allowance**: the highest rate seen over the last ``burst_window_s``; a load that spiked
  within that window is likely to spike again (bursty LLM traffic comes in trains), and a replica
  released between two spikes would not be back in time for the next one. With ``burst_hold_s`` a
  past peak counts in full for that long and then fades linearly to nothing at the window's end
  (a spike ten minutes old is a better omen than one fifty minutes old). With ``burst_fall_to`` a
  past rate counts only where the load fell away from it, to at most that fraction of it within
  ``burst_fall_s`` and no higher since (a spike: trains of bursts repeat), or while it is within
  ``burst_fall_s`` of the latest observation. A rate the load slid down from gradually is a slope, not a burst: its
  capacity goes with the slope instead of being held for the window (:func:`spikes`);

forecast = max(trend, burst) x ``headroom``; replicas = ceil(forecast / (per-replica capacity at the
SLO x ``capacity_fraction``)) for requests and for output tokens, the larger of the two. ``headroom``
covers what a one-minute rate cannot show: arrivals within the minute are not even (sub-minute
bursts), and a queue that builds inside a minute misses the TTFT target.

State (``Recommendation.state``): ``{"samples": ((t_s, requests_per_s, output_tokens_per_s), ...),
"peaks": (...)}`` (until the history covers ``trend_window_s``, i.e. while there are no peaks yet
and the oldest sample is younger than that, the trend is extrapolated over the covered share of
the lead only) with ``t_s`` the sample's own timestamp (epoch seconds, from the observation,
never a tick count). ``samples`` holds one entry per new observation over the trend window (at
least two minutes); older observations fold into ``peaks``, a running-maximum history in buckets of
``history / 240`` (at least 15 s) from which entries that can no longer decide the burst allowance
are dropped (:func:`fold_peaks`), so a window of hours stays a few entries long. Both are pruned to
``history_s`` and are plain JSON, so the history survives a restart when it is persisted; a gap
longer than ``history_s`` simply starts afresh. ``running`` holds the least-squares sums and the
sliding maximum of each rate over ``samples`` (:class:`RunningWindow`): a tick adds its new sample
and subtracts the ones folded away instead of recomputing the window, and gives the same forecast
as the recomputation (a property test holds it to that); sums that do not match the samples are
recomputed from them.

Missing or stale rates: no opinion, flagged ``missing_data`` (the pipeline then holds), and the
history is kept as it was. Without a capacity profile there is nothing to size with: no opinion.
"""

from __future__ import annotations

import functools
import math
import operator
from bisect import bisect_left, bisect_right
from typing import Any, NamedTuple, Sequence

from pydantic import Field

from controller.core.model import Recommendation
from controller.core.reasons import Reason
from controller.core.spec import MAX_REPLICAS, MAX_WINDOW_S
from policies.base import PolicyContext, PolicyKind, StrictParams
from policies.target_utilization import ceil_replicas

FINE_MIN_S = 120.0
"""Samples younger than this (or the trend window, if longer) are kept one per observation."""
PEAK_BUCKETS = 240
PEAK_BUCKET_MIN_S = 15.0
"""Older samples fold into buckets of ``max(15 s, history / 240)`` (see :func:`fold_peaks`)."""

SIGNAL_OF = {"requests": "request_rate_per_s", "output_tokens": "output_tokens_per_s"}
"""The observed signal each forecast rate reads, as served; sized as the load offered
(:meth:`PolicyContext.offered`)."""

Sample3 = tuple[float, float | None, float | None]
"""(t_s, requests_per_s, output_tokens_per_s); a rate is ``None`` when it was missing."""


def trend_slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope (units per second) of ``(t_s, value)`` points; 0 for fewer than two
    distinct times."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den <= 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in points) / den


def spikes(points: Sequence[tuple[float, float]], fall_to: float, fall_s: float) -> list[bool]:
    """Per point of ``points`` (sorted by time): whether the burst allowance may count it under
    ``burst_fall_to``: every rate observed more than ``fall_s`` after it is at most ``fall_to``
    times it (the load fell away from it and stayed down), or none has been yet (it is within
    ``fall_s`` of the latest observation: too young to tell a spike from a slope). One backward
    pass for the suffix maxima, one forward pass with a second index for the first point past
    ``t + fall_s``."""
    n = len(points)
    suffix = [0.0] * (n + 1)
    top = -math.inf
    for i in range(n - 1, -1, -1):
        v = points[i][1]
        if v > top:
            top = v
        suffix[i] = top
    suffix[n] = -math.inf
    out: list[bool] = []
    j = 0
    for t, v in points:
        while j < n and points[j][0] <= t + fall_s:
            j += 1
        out.append(j == n or suffix[j] <= fall_to * v)
    return out


STEP_PACE = 0.25
"""The rise over the last ``trend_confirm_s`` must keep at least this share of the window's slope
for the slope to be extrapolated; below it the rise is over (a step, or a ramp that levelled off)
and the recent pace is extrapolated instead. A share, not a strict comparison: on a steady ramp the
recent pace scatters around the slope, and taking the lesser of the two would cut every ramp's
forecast by its noise."""


def confirmed_slope(slope: float, latest_t: float, latest: float, ago: tuple[float, float] | None) -> float:
    """``slope``, or the pace of the rise since ``ago`` (``(t_s, rate)``: the latest observation at
    least ``trend_confirm_s`` before ``latest_t`` within the trend window; ``None``: too short a
    history to tell) where that is under :data:`STEP_PACE` of it (at least 0)."""
    if slope <= 0 or ago is None or latest_t <= ago[0]:
        return slope
    recent = (latest - ago[1]) / (latest_t - ago[0])
    return slope if recent >= STEP_PACE * slope else max(0.0, recent)


def forecast_rate(points: Sequence[tuple[float, float]], now_s: float, lead_s: float, trend_window_s: float,
                  burst_window_s: float, burst_hold_s: float | None = None,
                  history_start_s: float | None = None, fall_to: float | None = None,
                  fall_s: float = 0.0, confirm_s: float = 0.0) -> tuple[float, float, float]:
    """(forecast, trend part, burst part) of a rate ``lead_s`` after ``now_s`` from ``points``
    (sorted by time, the last one the latest observation); with ``fall_to`` the burst part
    counts the points :func:`spikes` keeps (and the latest rate). Until the history (observed since
    ``history_start_s``) covers the trend window, the trend is extrapolated over the covered share
    of the lead only: at start-up a few points of a ramp are little evidence, and extrapolating
    them over the full lead held 20 replicas for a 2-replica load. (No trend at all until the
    window is covered was tried and measured worse: ``bench/decision_quality.py --quick --cases
    azure-code-0-30min,sawtooth``, training rows, 82.02 % $119.19 and 99.35 % $119.20 against
    87.23 % $121.85 and 99.97 % $118.15 with the share.) With ``confirm_s`` (shorter than the trend
    window) the slope is :func:`confirmed_slope`'s."""
    if not points:
        return 0.0, 0.0, 0.0
    latest = points[-1][1]
    # one pass (this runs every tick): least squares on times relative to now (no cancellation
    # on epoch seconds squared) over the trend window, max over the burst window
    n = 0
    st = sv = stt = stv = 0.0
    first_t = math.inf
    burst = latest
    t_trend, t_burst = now_s - trend_window_s, now_s - burst_window_s
    hold = burst_window_s if burst_hold_s is None else min(burst_hold_s, burst_window_s)
    fade = burst_window_s - hold
    counted = None if fall_to is None else spikes(points, fall_to, fall_s)
    for i, (t, v) in enumerate(points):
        if t >= t_burst and (counted is None or counted[i]):
            age = now_s - t
            w = v if age <= hold or fade <= 0 else v * (1.0 - (age - hold) / fade)
            if w > burst:
                burst = w
        if t >= t_trend:
            x = t - now_s
            n += 1
            st += x
            sv += v
            stt += x * x
            stv += x * v
            first_t = min(first_t, t)
    slope = 0.0
    # the part of the trend window the history covers: a trend seen over a fraction of the
    # window is extrapolated over that fraction of the lead only
    covered = 1.0 if history_start_s is None else min(1.0, max(0.0, (now_s - history_start_s) / trend_window_s))
    if covered > 0 and n >= 2 and points[-1][0] - first_t >= 30.0:
        den = n * stt - st * st
        if den > 0:
            slope = (n * stv - st * sv) / den
    if 0.0 < confirm_s < trend_window_s and slope > 0:
        latest_t = points[-1][0]
        slope = confirmed_slope(slope, latest_t, latest, _sample_before(points, 1, latest_t - confirm_s, t_trend))
    trend = max(0.0, latest + max(0.0, slope) * lead_s * covered)
    return max(trend, burst), trend, burst


def _load_samples(state: Any, key: str = "samples") -> list[Sample3]:
    """One list of the history from ``ctx.state`` (tolerant of a JSON round trip: lists for
    tuples)."""
    raw = state.get(key, ()) if hasattr(state, "get") else ()
    if isinstance(raw, tuple):
        return list(raw)  # as this kind wrote it (tuples: not round-tripped through JSON)
    out: list[Sample3] = []
    for item in raw or ():
        try:
            t, r, o = item
            out.append((float(t), None if r is None else float(r), None if o is None else float(o)))
        except (TypeError, ValueError):
            continue  # a malformed entry is dropped, never fatal
    out.sort(key=lambda x: x[0])
    return out


def _within(items: list[Sample3], lo: float, hi: float) -> list[Sample3]:
    """The time-ordered ``items`` with ``lo <= t_s <= hi`` (the list itself when all are)."""
    if items and items[0][0] >= lo and items[-1][0] <= hi:
        return items
    return [x for x in items if lo <= x[0] <= hi]


def _covers(a: float | None, b: float | None) -> bool:
    """``a`` is at least ``b`` (a missing value covers only a missing one)."""
    return b is None or (a is not None and a >= b)


def fold_peaks(peaks: list[Sample3], older: Sequence[Sample3], bucket_s: float) -> list[Sample3]:
    """Fold samples (time-ordered, all newer than ``peaks``) into the coarse peak history.

    Only the burst allowance reads samples older than the trend window, and it takes a max of
    ``value x weight(age)`` with a weight that never grows with age. So (a) samples within one
    ``bucket_s`` bucket merge into (latest time, max of each rate), which holds a peak at most one
    bucket longer than it was seen, and (b) an older entry that a newer one matches or exceeds on
    both rates can never decide again and is dropped, as in a sliding-window maximum. The history
    then stays a few entries long over a window of hours, however often the daemon ticks.
    """
    for t, r, o in older:
        if peaks and bucket_s > 0 and math.floor(peaks[-1][0] / bucket_s) == math.floor(t / bucket_s):
            pt, pr, po = peaks.pop()
            r = pr if r is None else (r if pr is None else max(r, pr))
            o = po if o is None else (o if po is None else max(o, po))
            t = max(t, pt)
        while peaks and _covers(r, peaks[-1][1]) and _covers(o, peaks[-1][2]):
            peaks.pop()
        peaks.append((t, r, o))
    return peaks


_time_of = operator.itemgetter(0)
"""A sample's time (C-level: it keys a binary search every tick)."""

COLUMNS = (("requests", 1), ("output_tokens", 2))
"""The two forecast rates and their column in a ``Sample3``."""


def _add(sums: list[float], x: float, v: float, sign: float) -> None:
    """Add (``sign`` 1) or remove (-1) the point ``(x, v)`` from least-squares sums
    ``[n, sum x, sum v, sum x^2, sum x v]``."""
    sums[0] += sign
    sums[1] += sign * x
    sums[2] += sign * v
    sums[3] += sign * x * x
    sums[4] += sign * x * v


def _push_max(maxima: list[tuple[float, float]], t: float, v: float) -> None:
    """Append ``(t, v)`` to a sliding-window maximum (values decreasing from the front): the
    front is the window's maximum, the back its latest point."""
    while maxima and maxima[-1][1] <= v:
        maxima.pop()
    maxima.append((t, v))


def _first_spike(maxima: Sequence[tuple[float, float]], fall_to: float, fall_s: float) -> float:
    """The highest rate of a sliding-window maximum (``RunningWindow.maxima``: values falling
    from the front, the back the latest sample) that :func:`spikes` counts. The highest rate seen
    after any time is the first entry past it, so the walk needs no other sample; it stops at the
    first entry counted (a sample left out of the maxima is at most an entry at or after it, which
    is then counted too: ``fall_to`` is below 1). The latest sample is always counted."""
    n = len(maxima)
    j = 0
    for t, v in maxima:
        while j < n and maxima[j][0] <= t + fall_s:
            j += 1
        if j == n or maxima[j][1] <= fall_to * v:
            return v
    return maxima[-1][1]


def _sample_before(samples: Sequence[tuple[Any, ...]], col: int, t_s: float,
                   lo_s: float) -> tuple[float, float] | None:
    """``(t_s, rate)`` of the last of the time-ordered ``samples`` (``Sample3``, or ``(t_s, rate)``
    points with ``col`` 1) with rate ``col`` at or before ``t_s`` and not before ``lo_s``; ``None``
    where there is none."""
    k = bisect_right(samples, t_s, key=_time_of)
    while k > 0:
        k -= 1
        item = samples[k]
        if item[0] < lo_s:
            return None
        v = item[col]
        if v is not None:
            return item[0], v
    return None


class RunningWindow:
    """Running sums of the fine samples, so a tick costs O(1) instead of a pass over the window.

    Per rate: the least-squares sums ``[n, sum x, sum v, sum x^2, sum x v]`` of the samples with
    that rate (``x = t_s - origin``: small numbers, no cancellation on epoch seconds squared) and
    their sliding-window maximum ``((t_s, value), ...)`` (decreasing values; the front is the
    maximum, the back the latest point). A sample joining the window is added, one folded out of
    it subtracted. The sums describe exactly the ``samples`` of the same state: ``count`` and
    ``span`` (first and last ``t_s``) say which, and a state whose sums do not match its samples
    (an older tidegate's, a hand-edited one, a gap that pruned the window) is recomputed from the
    samples. So is one whose ``origin`` is older than a trend window before its first sample,
    which also bounds the rounding that adding and subtracting accumulates.
    """

    __slots__ = ("origin", "sums", "maxima")

    def __init__(self, origin: float, sums: dict[str, list[float]], maxima: dict[str, list[tuple[float, float]]]) -> None:
        self.origin = origin
        self.sums = sums
        self.maxima = maxima

    @classmethod
    def of(cls, samples: Sequence[Sample3]) -> "RunningWindow":
        """The sums recomputed from ``samples`` (time-ordered)."""
        w = cls(samples[0][0] if samples else 0.0, {}, {})
        for name, col in COLUMNS:
            sums: list[float] = [0.0] * 5
            maxima: list[tuple[float, float]] = []
            for item in samples:
                v = item[col]
                if v is not None:
                    _add(sums, item[0] - w.origin, v, 1.0)
                    _push_max(maxima, item[0], v)
            w.sums[name], w.maxima[name] = sums, maxima
        return w

    @classmethod
    def load(cls, state: Any, samples: Sequence[Sample3]) -> "RunningWindow":
        """The running sums from ``state`` if they describe ``samples``, else recomputed."""
        raw: Any = state.get("running") if hasattr(state, "get") else None
        try:
            if raw["count"] == len(samples) and samples and tuple(raw["span"]) == (samples[0][0], samples[-1][0]):
                own = isinstance(raw["requests"]["sums"], tuple)  # as this kind wrote it: no JSON round trip
                sums: dict[str, list[float]] = {}
                maxima: dict[str, list[tuple[float, float]]] = {}
                for n, _ in COLUMNS:
                    part = raw[n]
                    if own:
                        sums[n], maxima[n] = list(part["sums"]), list(part["max"])
                    else:
                        sums[n] = [float(x) for x in part["sums"]]
                        maxima[n] = [(float(t), float(v)) for t, v in part["max"]]
                    if len(sums[n]) != 5:
                        break
                else:
                    return cls(float(raw["origin"]), sums, maxima)
        except (KeyError, TypeError, ValueError):
            pass  # absent or malformed: recomputed below, never fatal
        return cls.of(samples)

    def add(self, item: Sample3) -> None:
        for name, col in COLUMNS:
            v = item[col]
            if v is not None:
                _add(self.sums[name], item[0] - self.origin, v, 1.0)
                _push_max(self.maxima[name], item[0], v)

    def remove(self, items: Sequence[Sample3], before_s: float) -> None:
        """Subtract ``items`` (the oldest samples, all older than ``before_s``) from the window."""
        for name, col in COLUMNS:
            sums = self.sums[name]
            for item in items:
                v = item[col]
                if v is not None:
                    _add(sums, item[0] - self.origin, v, -1.0)
            maxima = self.maxima[name]
            k = 0
            while k < len(maxima) and maxima[k][0] < before_s:
                k += 1
            if k:
                del maxima[:k]

    def state(self, samples: Sequence[Sample3]) -> dict[str, Any]:
        out: dict[str, Any] = {"origin": self.origin, "count": len(samples),
                               "span": (samples[0][0], samples[-1][0]) if samples else ()}
        for name, _ in COLUMNS:
            out[name] = {"sums": tuple(self.sums[name]), "max": tuple(self.maxima[name])}
        return out

    def forecast(self, name: str, col: int, samples: Sequence[Sample3], peaks: Sequence[Sample3], now_s: float,
                 lead_s: float, trend_window_s: float, burst_window_s: float, burst_hold_s: float | None,
                 history_start_s: float, fall_to: float | None = None,
                 fall_s: float = 0.0, confirm_s: float = 0.0) -> tuple[float, float, float] | None:
        """What :func:`forecast_rate` gives on the peaks and samples of rate ``name``, from the
        running sums; ``None`` where they cannot tell (then recompute): no sample of that rate,
        or a configuration where the fine samples are not exactly the trend window at full weight
        (a trend window under two minutes, a burst window or hold shorter than the trend window),
        or, with ``fall_to``, a peak older than the fine samples within the burst window."""
        maxima = self.maxima[name]
        hold = burst_window_s if burst_hold_s is None else min(burst_hold_s, burst_window_s)
        if not maxima or trend_window_s < FINE_MIN_S or hold < trend_window_s:
            return None
        if peaks and peaks[-1][0] >= now_s - trend_window_s:
            return None  # a clock that went back: the peaks reach into the trend window
        latest_t, latest = maxima[-1]
        t_burst = now_s - burst_window_s
        if fall_to is None:
            burst = maxima[0][1]  # every fine sample is within the hold: full weight
        elif peaks and peaks[-1][0] >= t_burst and any(item[0] >= t_burst and item[col] is not None for item in peaks):
            return None  # time-ordered: none within the window unless the latest is
        else:
            burst = _first_spike(maxima, fall_to, fall_s)
        fade = burst_window_s - hold
        for item in peaks:
            v = item[col]
            # a peak no higher than the burst so far cannot raise it (its weight is at most 1): the
            # common case, skipped before the weight is computed
            if v is None or 0.0 <= v <= burst:
                continue
            t = item[0]
            if t < t_burst:
                continue
            age = now_s - t
            w = v if age <= hold or fade <= 0 else v * (1.0 - (age - hold) / fade)
            if w > burst:
                burst = w
        n, sx, sv, sxx, sxv = self.sums[name]
        for item in samples:  # the first sample with this rate (there is one: ``maxima`` is not empty)
            if item[col] is not None:
                first_t = item[0]
                break
        slope = 0.0
        # over the covered share of the lead only, as forecast_rate
        covered = min(1.0, max(0.0, (now_s - history_start_s) / trend_window_s))
        if covered > 0 and n >= 1.5 and latest_t - first_t >= 30.0:
            den = n * sxx - sx * sx
            if den > 0:
                slope = (n * sxv - sx * sv) / den
        if 0.0 < confirm_s < trend_window_s and slope > 0:
            slope = confirmed_slope(slope, latest_t, latest,
                                    _sample_before(samples, col, latest_t - confirm_s, now_s - trend_window_s))
        trend = max(0.0, latest + max(0.0, slope) * lead_s * covered)
        return max(trend, burst), trend, burst


class _Fixed(NamedTuple):
    """What a rule's params fix for every tick (computed once per rule: the params are frozen)."""

    keep_s: float
    """History kept, seconds: never prune what a window needs."""
    fine_s: float
    """Samples younger than this are kept one per observation (``FINE_MIN_S`` or the trend window)."""
    bucket_s: float
    """Older samples fold into peaks of this bucket (:func:`fold_peaks`)."""
    wanted: tuple[str, ...]
    """The rates to forecast, in ``SIGNAL_OF`` order."""
    texts: tuple[str, str, str, str]
    """``lead_time_s``, ``burst_window_s`` (with its unit and ``burst_fall_to``), ``headroom`` and
    ``capacity_fraction`` as the message writes them (``:g``)."""


class Forecast(PolicyKind):
    """Replicas for the load one lead time ahead: rising trend and recent bursts, times headroom."""

    name = "forecast"
    description = ("Forecast the request and token rates one lead time (provisioning + cold start) "
                   "ahead from a short history (rising trend, recent peak, headroom) and size "
                   "replicas from the per-replica capacity.")

    class Params(StrictParams):
        lead_time_s: float = Field(
            480, ge=0, le=MAX_WINDOW_S,
            description="How far ahead to size the fleet, seconds: node provisioning plus cold "
                        "start of the slowest pool the policy bursts to (e.g. 300 + 180).",
        )
        trend_window_s: float = Field(
            600, gt=0, le=MAX_WINDOW_S,
            description="Window of the least-squares trend, seconds; only a rising trend is "
                        "extrapolated.",
        )
        trend_confirm_s: float = Field(
            180, ge=0, le=MAX_WINDOW_S,
            description="The trend is extrapolated only while the load still rises: where the "
                        "rise over the last trend_confirm_s seconds is under a quarter of the "
                        "trend's pace (a step that is over, which the window's slope would go on "
                        "projecting while the step stays in the window), that recent pace is "
                        "extrapolated instead. 0, or not shorter than trend_window_s: off.",
        )
        burst_hold_s: float | None = Field(
            None, ge=0, le=MAX_WINDOW_S,
            description="Hold a past peak in full for this long, seconds, then fade it linearly "
                        "to nothing at burst_window_s (null: hold it for the whole window).",
        )
        burst_fall_to: float | None = Field(
            None, gt=0, lt=1,
            description="Count a past peak toward the burst allowance only where the load fell to "
                        "at most this fraction of it within burst_fall_s and stayed there (a spike: "
                        "trains of bursts repeat), or while the latest observation is within "
                        "burst_fall_s of it (too young to tell); a peak "
                        "the load slid down from gradually is a slope, and its capacity goes with "
                        "it (null: every peak in the window counts).",
        )
        burst_fall_s: float = Field(
            120, ge=0, le=MAX_WINDOW_S,
            description="With burst_fall_to: how soon after a peak the load must have fallen for "
                        "the peak to count as a spike, seconds.",
        )
        burst_window_s: float = Field(
            900, ge=0, le=MAX_WINDOW_S,
            description="Keep capacity for the highest rate seen within this window, seconds "
                        "(recurring spikes; also a scale-down delay sized to the lead time).",
        )
        history_s: float = Field(
            1800, gt=0, le=MAX_WINDOW_S,
            description="How much history the state keeps, seconds (the larger window if that is "
                        "longer).",
        )
        headroom: float = Field(
            1.0, ge=1, le=100,
            description="Multiplier on the forecast rate for what a one-minute rate hides "
                        "(sub-minute bursts, queueing within the TTFT target).",
        )
        capacity_fraction: float = Field(
            0.8, gt=0, le=1,
            description="Plan replicas at this fraction of their throughput at the SLO (the "
                        "model's capacity profile).",
        )
        max_replicas: int | None = Field(
            None, ge=1, le=MAX_REPLICAS,
            description="Never ask for more than this many replicas (null: no cap). A second "
                        "forecast rule with a long burst window capped at the cheap (on-prem) "
                        "capacity keeps that capacity warm between spikes hours apart without "
                        "holding cloud replicas as long.",
        )
        signals: tuple[str, ...] = Field(
            ("requests", "output_tokens"),
            description="Rates to forecast: requests (request_rate_per_s vs capacity "
                        "requests_per_s) and/or output_tokens (output_tokens_per_s vs capacity "
                        "output_tokens_per_s); the larger need wins.",
        )

    params: Params

    @functools.cached_property
    def _fixed(self) -> _Fixed:
        p = self.params
        keep_s = max(p.history_s, p.burst_window_s, p.trend_window_s)
        return _Fixed(keep_s, max(p.trend_window_s, FINE_MIN_S), max(PEAK_BUCKET_MIN_S, keep_s / PEAK_BUCKETS),
                      tuple(s for s in SIGNAL_OF if s in p.signals),
                      (f"{p.lead_time_s:g}", _window_text(p.burst_window_s, p.burst_fall_to, p.burst_fall_s),
                       f"{p.headroom:g}", f"{p.capacity_fraction:g}"))

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        p = self.params
        cap = ctx.capacity
        now_s = ctx.now.timestamp()
        keep_s, fine_s, bucket_s, wanted, (lead_text, window_text, headroom_text, fraction_text) = self._fixed
        lo = now_s - keep_s
        loaded = _load_samples(ctx.state)
        samples = _within(loaded, lo, now_s)
        peaks = _within(_load_samples(ctx.state, "peaks"), lo, now_s)
        # a window pruned here (a gap, a clock that went back) no longer matches its sums
        running = RunningWindow.load(ctx.state if samples is loaded else {}, samples)
        if cap is None:
            return Recommendation(rule=self.rule, kind=self.name, replicas=None, reason=Reason.METRIC_MISSING.value,
                                  message="no capacity profile for the model: nothing to size with",
                                  missing_data=True, state=self._state(samples, peaks, running))
        per_replica = {"requests": cap.requests_per_s, "output_tokens": cap.output_tokens_per_s}
        values: dict[str, float | None] = {}
        missing: list[tuple[str, str]] = []
        stamp: float | None = None
        for sub in wanted:
            name = SIGNAL_OF[sub]
            sample = ctx.signals.sample(name)
            v = sample.fresh(ctx.now, ctx.max_signal_age_s)  # ctx.fresh(name), the sample read once
            values[sub] = v
            if v is None:
                missing.append(ctx.why_missing(name, sample))
            else:
                at = sample.at.timestamp()  # type: ignore[union-attr]  # a fresh sample has a time
                stamp = at if stamp is None or at > stamp else stamp
        # the load offered, not what was served: the completions run ahead of the arrivals while
        # a backlog drains (a peak that was never load, which the burst memory would keep for
        # its window) and behind them while the replicas saturate
        for sub, v in values.items():
            if v is not None:
                values[sub] = ctx.offered(SIGNAL_OF[sub], v)
        if stamp is not None and (not samples or stamp > samples[-1][0]):
            new = (stamp, values.get("requests"), values.get("output_tokens"))
            samples.append(new)
            running.add(new)
        # full resolution where the trend reads it, a coarse running peak history beyond
        fine_from = now_s - fine_s
        if samples and samples[0][0] < fine_from:
            k = bisect_left(samples, fine_from, key=_time_of)
            peaks = fold_peaks(peaks, samples[:k], bucket_s)
            running.remove(samples[:k], fine_from)
            samples = samples[k:]
        if not samples or samples[0][0] - running.origin > p.trend_window_s:
            running = RunningWindow.of(samples)  # re-anchored: bounded numbers, bounded rounding
        state = self._state(samples, peaks, running)
        # the history began with the oldest sample kept; anything folded into peaks is older than
        # the fine window, so the history then covers the trend window
        since = -math.inf if peaks else (samples[0][0] if samples else now_s)
        if stamp is None:  # no rate selected, or none fresh
            why = "; ".join(m for _, m in missing) or "no signal selected"
            return Recommendation(rule=self.rule, kind=self.name, replicas=None,
                                  reason=missing[0][0] if missing else Reason.METRIC_MISSING.value,
                                  message=f"no rate to forecast: {why}", missing_data=True, state=state)
        best: tuple[int, str] | None = None
        present = ahead = 0  # the need now and the trend's, without the burst memory (lead-time economics)
        parts: list[str] = []
        for sub in wanted:
            if values[sub] is None or per_replica[sub] <= 0:
                continue
            col = 1 if sub == "requests" else 2
            got = running.forecast(sub, col, samples, peaks, now_s, p.lead_time_s, p.trend_window_s,
                                   p.burst_window_s, p.burst_hold_s, since, p.burst_fall_to, p.burst_fall_s,
                                   p.trend_confirm_s)
            if got is None:
                pts = [(s[0], v) for s in peaks if (v := s[col]) is not None]
                pts += [(s[0], v) for s in samples if (v := s[col]) is not None]
                got = forecast_rate(pts, now_s, p.lead_time_s, p.trend_window_s, p.burst_window_s,
                                    p.burst_hold_s, since, p.burst_fall_to, p.burst_fall_s, p.trend_confirm_s)
            f, trend, burst = got
            need = f * p.headroom
            planned = per_replica[sub] * p.capacity_fraction
            n = ceil_replicas(need / planned)
            if need > 0:
                n = max(n, 1)
            present = max(present, _replicas(values[sub] or 0.0, p.headroom, planned))
            ahead = max(ahead, _replicas(trend, p.headroom, planned))
            parts.append(f"{sub}: now {values[sub]:.4g}, trend {trend:.4g}, peak {burst:.4g} in "
                         f"{window_text} -> {f:.4g} x {headroom_text} / ({per_replica[sub]:g} x "
                         f"{fraction_text}) = {n}")
            if best is None or n > best[0]:
                best = (n, sub)
        if missing:
            parts.append("no opinion: " + "; ".join(m for _, m in missing))
        if best is None:
            return Recommendation(rule=self.rule, kind=self.name, replicas=None, reason=Reason.METRIC_MISSING.value,
                                  message="; ".join(parts) or "no usable capacity", missing_data=True, state=state)
        replicas, decider = best
        if p.max_replicas is not None and replicas > p.max_replicas:
            parts.append(f"capped at max_replicas {p.max_replicas}")
            replicas = p.max_replicas
        present, ahead = min(present, replicas), min(ahead, replicas)
        current = ctx.current_replicas
        if replicas > current:
            reason = Reason.THROUGHPUT_ABOVE_CAPACITY
        elif replicas == current:
            reason = Reason.WITHIN_TARGETS
        else:
            reason = Reason.BELOW_TARGETS
        return Recommendation(rule=self.rule, kind=self.name, replicas=replicas, reason=reason.value,
                              message=f"forecast {lead_text}s ahead, {decider} decides {replicas} "
                                      f"(current {current}): " + "; ".join(parts),
                              missing_data=bool(missing), state=state, present_replicas=present,
                              trend_replicas=ahead)

    @staticmethod
    def _state(samples: list[Sample3], peaks: list[Sample3], running: RunningWindow) -> dict[str, Any]:
        return {"samples": tuple(samples), "peaks": tuple(peaks), "running": running.state(samples)}


def _window_text(window_s: float, fall_to: float | None, fall_s: float) -> str:
    """The burst window as the message writes it: ``600s``, or with ``burst_fall_to``
    ``600s (spikes: fell to 0.7 within 120s)``."""
    if fall_to is None:
        return f"{window_s:g}s"
    return f"{window_s:g}s (spikes: fell to {fall_to:g} within {fall_s:g}s)"


def _replicas(rate: float, headroom: float, planned: float) -> int:
    """Replicas for ``rate`` at ``planned`` per replica (at least one for any load)."""
    n = ceil_replicas(rate * headroom / planned)
    return max(n, 1) if rate > 0 else n
