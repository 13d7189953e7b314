"""The ``forecast`` policy kind: sizing from trend and recent peaks, explicit state threaded from
tick to tick by timestamp, missing data, and properties (monotone in load, never below the latest
need, deterministic)."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from controller.core.model import ModelSignals, ModelSpec, Recommendation, ReplicaCapacity, Sample
from controller.core.reasons import Reason
from policies.base import PolicyContext, Registry
from policies.forecast import COLUMNS, Forecast, RunningWindow, fold_peaks, forecast_rate, trend_slope

UTC = timezone.utc
T0 = datetime(2024, 9, 9, 12, 0, tzinfo=UTC)
CAP = ReplicaCapacity(output_tokens_per_s=100.0, requests_per_s=2.0)
MODEL = ModelSpec(name="m", tp_degree=2, quantization="fp8", gpu_types=("H100",), cold_start_s=180,
                  capacity={"H100": CAP}, pools=("onprem",))


def build(**params: Any) -> Forecast:
    kind = Registry.from_entry_points().build("forecast", params)
    assert isinstance(kind, Forecast)
    return kind


def ctx(now: datetime, req: float | None, tok: float | None = 0.0, state: Any = None, current: int = 4,
        capacity: ReplicaCapacity | None = CAP, age_s: float = 5.0) -> PolicyContext:
    def s(v: float | None) -> Sample:
        return Sample.missing("NoData", now) if v is None else Sample(v, now - timedelta(seconds=age_s))
    sig = ModelSignals(model="m", at=now, request_rate_per_s=s(req), output_tokens_per_s=s(tok))
    return PolicyContext(model=MODEL, signals=sig, now=now, current_replicas=current, ready_replicas=current,
                         capacity=capacity, max_signal_age_s=60, state=state or {})


def run(kind: Forecast, rates: list[float], step_s: float = 15.0, tok: list[float] | None = None,
        current: int = 4) -> Recommendation:
    """Feed ``rates`` one per ``step_s`` through the state, as the pipeline does; the last result."""
    state: Any = {}
    rec: Recommendation | None = None
    for i, r in enumerate(rates):
        rec = kind.recommend(ctx(T0 + timedelta(seconds=i * step_s), r, tok[i] if tok else 0.0, state, current))
        state = rec.state
    assert rec is not None
    return rec


@pytest.mark.parametrize("rates, params, expected, reason", [
    # flat 4 req/s, capacity 2 x 0.8 = 1.6 per replica: ceil(4 / 1.6) = 3
    ([4.0] * 20, {}, 3, Reason.BELOW_TARGETS),
    # headroom 1.5: ceil(6 / 1.6) = 4 = current
    ([4.0] * 20, {"headroom": 1.5}, 4, Reason.WITHIN_TARGETS),
    # a spike 2 minutes ago is still within the burst window: sized for it
    ([4.0] * 10 + [16.0] + [4.0] * 8, {}, 10, Reason.THROUGHPUT_ABOVE_CAPACITY),
    # ... but not once it left a 60 s window
    ([4.0] * 10 + [16.0] + [4.0] * 8, {"burst_window_s": 60}, 3, Reason.BELOW_TARGETS),
    # a ramp of 0.1 req/s per 15 s over 5 minutes: slope 1/150 per s, 480 s ahead -> 3.9 + 3.2
    ([2.0 + 0.1 * i for i in range(20)], {"burst_window_s": 0, "trend_window_s": 240},
     math.ceil((3.9 + 480 / 150) / 1.6), Reason.THROUGHPUT_ABOVE_CAPACITY),
    # ... but while the history (285 s) covers only part of the trend window (600 s), over that
    # share of the lead only: 3.9 + 3.2 x 285 / 600
    ([2.0 + 0.1 * i for i in range(20)], {"burst_window_s": 0}, math.ceil((3.9 + 3.2 * 285 / 600) / 1.6),
     Reason.WITHIN_TARGETS),
    # a falling ramp is not extrapolated down: the latest rate (burst window 0) sizes it
    ([6.0 - 0.2 * i for i in range(20)], {"burst_window_s": 0}, math.ceil(2.2 / 1.6), Reason.BELOW_TARGETS),
    # idle: zero rate -> 0 replicas (the bounds stage applies min_replicas)
    ([0.0] * 5, {}, 0, Reason.BELOW_TARGETS),
])
def test_sizing(rates: list[float], params: dict[str, Any], expected: int, reason: Reason) -> None:
    rec = run(build(**params), rates)
    assert rec.replicas == expected, rec.message
    assert rec.reason == reason.value
    assert not rec.missing_data


def test_output_tokens_can_decide() -> None:
    # 1 req/s needs 1 replica; 400 tok/s needs ceil(400 / 80) = 5
    rec = run(build(), [1.0] * 4, tok=[400.0] * 4)
    assert rec.replicas == 5 and "output_tokens decides" in rec.message
    only_req = run(build(signals=("requests",)), [1.0] * 4, tok=[400.0] * 4)
    assert only_req.replicas == 1


def _drain(kind: Forecast, arrivals: bool) -> Recommendation:
    """Ten minutes at 4 req/s and 200 tok/s (50 tokens a request), during which one minute of
    a backlog draining completes twice that while the arrivals stay at 4 req/s; the arrival rate
    given or not."""
    state: Any = {}
    rec: Recommendation | None = None
    for i in range(40):
        now = T0 + timedelta(seconds=i * 15.0)
        done = 8.0 if 10 <= i < 14 else 4.0
        samples = {"request_rate_per_s": Sample(done, now), "output_tokens_per_s": Sample(50.0 * done, now)}
        if arrivals:
            samples["arrival_rate_per_s"] = Sample(4.0, now)
        sig = ModelSignals(model="m", at=now, samples=samples)
        rec = kind.recommend(PolicyContext(model=MODEL, signals=sig, now=now, current_replicas=4, ready_replicas=4,
                                           capacity=CAP, max_signal_age_s=60, state=state))
        state = rec.state
    assert rec is not None
    return rec


def test_a_draining_backlog_is_no_burst_to_remember() -> None:
    """A backlog draining completes more than arrives; the burst memory keeps the arrivals (and
    the tokens they bring: tokens per completed request times the arrivals), not what drained."""
    kept = _drain(build(), arrivals=True)
    assert kept.replicas == math.ceil(4.0 / 1.6), kept.message  # 4 req/s, 200 tok/s: 3 replicas
    # without the arrival rate (a backend without the queue series) the completions are all it has
    assert _drain(build(), arrivals=False).replicas == math.ceil(8.0 / 1.6)


def test_state_is_keyed_by_observation_time_not_ticks() -> None:
    kind = build()
    a = kind.recommend(ctx(T0, 4.0))
    # the same observation seen again (no new scrape): not a second sample
    b = kind.recommend(ctx(T0 + timedelta(seconds=5), 4.0, age_s=10.0, state=a.state))
    assert len(b.state["samples"]) == 1
    c = kind.recommend(ctx(T0 + timedelta(seconds=15), 5.0, state=b.state))
    assert len(c.state["samples"]) == 2
    # the state survives a JSON round trip (a persisted history after a restart)
    d = kind.recommend(ctx(T0 + timedelta(seconds=30), 5.0, state=json.loads(json.dumps(c.state))))
    assert len(d.state["samples"]) == 3


def test_history_is_pruned_and_a_long_gap_starts_afresh() -> None:
    kind = build(history_s=300, burst_window_s=300, trend_window_s=300)
    rec = run(kind, [20.0] + [1.0] * 30)  # 30 x 15 s = 450 s later the spike is gone
    assert rec.replicas == 1
    assert all(T0.timestamp() + 450 - 300 <= s[0] for s in rec.state["samples"] + rec.state["peaks"])
    later = kind.recommend(ctx(T0 + timedelta(hours=3), 1.0, state=run(kind, [20.0] * 3).state))
    assert later.replicas == 1 and len(later.state["samples"]) == 1


@pytest.mark.parametrize("req, capacity, reason", [
    (None, CAP, Reason.METRIC_MISSING),
    (4.0, None, Reason.METRIC_MISSING),
])
def test_missing_is_no_opinion_and_keeps_history(req: float | None, capacity: ReplicaCapacity | None,
                                                 reason: Reason) -> None:
    kind = build(signals=("requests",))
    prior = run(kind, [4.0, 8.0])
    rec = kind.recommend(ctx(T0 + timedelta(seconds=30), req, state=prior.state, capacity=capacity))
    assert rec.replicas is None and rec.missing_data and rec.reason == reason.value
    assert rec.state["samples"] == prior.state["samples"]


def test_stale_rate_is_missing() -> None:
    rec = build(signals=("requests",)).recommend(ctx(T0, 4.0, age_s=600))
    assert rec.replicas is None and rec.missing_data and rec.reason == Reason.METRIC_STALE.value


def test_params_are_validated() -> None:
    with pytest.raises(ValidationError):
        build(headroom=0.5)
    with pytest.raises(ValidationError):
        build(lead_s=10)  # unknown key
    for name, field in Forecast.Params.model_fields.items():
        assert field.description, name


def test_a_past_peak_is_held_then_fades() -> None:
    pts = [(0.0, 10.0), (900.0, 1.0)]
    # held in full within burst_hold_s, then linearly faded: at 900 s of a 600 s hold and a 1200 s
    # window it weighs (1 - 300 / 600) = 0.5
    assert forecast_rate(pts, 500.0, 0.0, 60.0, 1200.0, 600.0)[2] == pytest.approx(10.0)
    assert forecast_rate(pts, 900.0, 0.0, 60.0, 1200.0, 600.0)[2] == pytest.approx(5.0)
    assert forecast_rate(pts, 900.0, 0.0, 60.0, 1200.0, None)[2] == pytest.approx(10.0)
    assert forecast_rate(pts, 1300.0, 0.0, 60.0, 1200.0, 600.0)[2] == pytest.approx(1.0)
    faded = run(build(burst_window_s=1200, burst_hold_s=600, trend_window_s=60), [16.0] + [1.0] * 60)
    held = run(build(burst_window_s=1200, trend_window_s=60), [16.0] + [1.0] * 60)
    assert faded.replicas is not None and held.replicas is not None
    assert faded.replicas < held.replicas == 10  # 900 s after the spike


def test_a_spike_is_held_for_the_window_and_a_slope_goes_with_it() -> None:
    # burst_fall_to: a peak the load fell away from (to 0.7 of it within 2 minutes) is a spike and
    # is held for the window; one it slid down from is a slope, and only the last two minutes count
    params = {"burst_window_s": 600, "trend_window_s": 120, "burst_fall_to": 0.7, "burst_fall_s": 120}
    cliff = [16.0] * 4 + [1.0] * 30  # 7.5 minutes after the cliff
    slope = [16.0 * 0.98 ** i for i in range(41)]  # 2 % down every 15 s: -17 % in 2 minutes
    assert run(build(**params), cliff).replicas == math.ceil(16.0 / 1.6)
    # the latest two minutes count (the oldest of them: 16 x 0.98^32 = 8.4 req/s), not the peak
    released = run(build(**params), slope)
    young = 16.0 * 0.98 ** 32
    assert released.replicas == math.ceil(young / 1.6) == 6, released.message
    assert "spikes: fell to 0.7 within 120s" in released.message
    # without it, both hold the 16 req/s peak of the window
    plain = {k: v for k, v in params.items() if not k.startswith("burst_fall")}
    assert run(build(**plain), cliff).replicas == run(build(**plain), slope).replicas == 10
    # the reference computation agrees: a cliff counts, a slope does not, the young part does
    pts = [(15.0 * i, v) for i, v in enumerate(slope)]
    assert forecast_rate(pts, pts[-1][0], 0.0, 120.0, 600.0, None, None, 0.7, 120.0)[2] == pytest.approx(young)
    pts = [(15.0 * i, v) for i, v in enumerate(cliff)]
    assert forecast_rate(pts, pts[-1][0], 0.0, 120.0, 600.0, None, None, 0.7, 120.0)[2] == 16.0


def test_trend_slope_and_forecast_rate() -> None:
    assert trend_slope([]) == 0.0 and trend_slope([(0.0, 1.0)]) == 0.0
    assert trend_slope([(0.0, 1.0), (10.0, 3.0), (20.0, 5.0)]) == pytest.approx(0.2)
    f, trend, burst = forecast_rate([(0.0, 1.0), (60.0, 2.0)], 60.0, 60.0, 600.0, 0.0)
    assert trend == pytest.approx(3.0) and burst == 2.0 and f == pytest.approx(3.0)


def _trend(rec: Recommendation) -> float:
    """The requests trend the rule's message reports."""
    part = rec.message.split("requests: ", 1)[1]
    return float(part.split("trend ", 1)[1].split(",", 1)[0])


def test_a_step_that_is_over_is_not_a_trend() -> None:
    # 3 req/s for ten minutes, then 52 from one tick to the next, held five minutes (a square wave's
    # busy phase, a lasting step): the window's slope would project ~100 req/s one lead time on
    # and order cloud for it; the load stopped rising minutes ago, so the forecast stays at 52.
    rates = [3.0] * 40 + [52.0] * 20
    kind = build(burst_window_s=0, signals=("requests",))
    rec = run(kind, rates)
    assert _trend(rec) == pytest.approx(52.0), rec.message
    assert rec.replicas == math.ceil(52.0 / 1.6)
    off = run(build(burst_window_s=0, signals=("requests",), trend_confirm_s=0), rates)
    assert _trend(off) > 90.0, off.message  # the step's artifact, without the check
    # within trend_confirm_s of the step the rise still counts (too soon to tell a step from a ramp)
    early = run(kind, [3.0] * 40 + [52.0] * 8)
    assert _trend(early) > 60.0, early.message


def test_a_rising_ramp_keeps_its_trend_and_one_that_levelled_off_does_not() -> None:
    # a ramp of 0.1 req/s every 15 s with +-3 % noise for ten minutes: the recent rise keeps pace
    # with the slope (noise and all), so the slope is extrapolated as without the check
    noisy = [(2.0 + 0.1 * i) * (1.0 + 0.03 * (-1) ** i) for i in range(40)]
    on = run(build(burst_window_s=0, signals=("requests",)), noisy)
    off = run(build(burst_window_s=0, signals=("requests",), trend_confirm_s=0), noisy)
    assert _trend(on) == _trend(off) and _trend(on) > noisy[-1] + 2.0
    # the same ramp for six minutes, then flat for four: the rise is over, the level is forecast
    levelled = [2.0 + 0.1 * min(i, 24) for i in range(40)]
    rec = run(build(burst_window_s=0, signals=("requests",)), levelled)
    assert _trend(rec) == pytest.approx(levelled[-1]), rec.message
    assert _trend(run(build(burst_window_s=0, signals=("requests",), trend_confirm_s=0), levelled)) > levelled[-1] + 1.0


rates_st = st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(rates=rates_st, factor=st.floats(min_value=1.0, max_value=10.0))
def test_more_load_never_fewer_replicas(rates: list[float], factor: float) -> None:
    kind = build(signals=("requests",))
    lo = run(kind, rates)
    hi = run(kind, [r * factor for r in rates])
    assert lo.replicas is not None and hi.replicas is not None
    assert hi.replicas >= lo.replicas


@settings(max_examples=60, deadline=None)
@given(rates=rates_st, headroom=st.floats(min_value=1.0, max_value=3.0))
def test_never_below_what_the_latest_rate_needs(rates: list[float], headroom: float) -> None:
    kind = build(signals=("requests",), headroom=headroom)
    rec = run(kind, rates)
    assert rec.replicas is not None
    assert rec.replicas >= math.ceil(rates[-1] * headroom / (CAP.requests_per_s * 0.8) - 1e-9)
    assert rec.replicas == run(kind, rates).replicas  # pure: same inputs, same answer
    assert len(rec.state["samples"]) <= len(rates)


def test_max_replicas_caps_the_rule() -> None:
    spike = [1.0] * 4 + [40.0] + [1.0] * 4  # 40 req/s needs ceil(40 / 1.6) = 25
    assert run(build(), spike).replicas == 25
    capped = run(build(max_replicas=8), spike)
    assert capped.replicas == 8 and "capped at max_replicas 8" in capped.message
    assert run(build(max_replicas=8), [1.0] * 4).replicas == 1  # below the cap: untouched


def test_hours_of_history_stay_small_and_survive_json() -> None:
    # 9 hours of samples every 15 s (2160 observations) with a 9-hour burst window: the spike of
    # hour one still decides at the end, while the state holds the trend window at full
    # resolution and a coarse peak history (buckets of 32400 / 240 = 135 s) beyond it.
    kind = build(burst_window_s=32400, history_s=32400, trend_window_s=600, signals=("requests",))
    state: Any = {}
    rec: Recommendation | None = None
    for i in range(2160):
        rate = 30.0 if i == 240 else 1.0 + (i % 7) * 0.1  # one spike an hour in, a ripple around it
        rec = kind.recommend(ctx(T0 + timedelta(seconds=15 * i), rate, state=state))
        state = json.loads(json.dumps(rec.state)) if i % 500 == 0 else rec.state
    assert rec is not None
    assert rec.replicas == math.ceil(30.0 / 1.6)
    assert len(rec.state["samples"]) <= 600 / 15 + 1
    assert len(rec.state["peaks"]) <= 8  # the spike, then a short staircase of the ripple


@settings(max_examples=200, deadline=None)
@given(data=st.data(),
       vals=st.lists(st.tuples(st.floats(min_value=0.1, max_value=60.0),
                               st.floats(min_value=0.0, max_value=100.0)), min_size=1, max_size=60))
def test_folded_peaks_bound_the_full_history(data: st.DataObject, vals: list[tuple[float, float]]) -> None:
    # Samples at increasing times; the burst allowance from the folded history is never below the
    # one from the full history (no peak is lost), exact without buckets, and with buckets of b
    # seconds never above the full history's as seen b seconds earlier (a peak is held at most
    # one bucket longer), for any window and hold.
    t, pts = 0.0, []
    for dt, v in vals:
        t += dt
        pts.append((t, v))
    now = t + data.draw(st.floats(min_value=0.0, max_value=300.0))
    window = data.draw(st.floats(min_value=1.0, max_value=2000.0))
    hold = data.draw(st.one_of(st.none(), st.floats(min_value=0.0, max_value=2000.0)))
    bucket = data.draw(st.sampled_from([0.0, 5.0, 30.0, 120.0]))

    def burst(points: list[tuple[float, float]], at: float) -> float:
        return forecast_rate(points, at, 0.0, 1.0, window, hold)[2]

    # as in recommend(): the older samples are folded, the latest observation stays as it is
    folded = [(ft, fr) for ft, fr, _ in fold_peaks([], [(pt, pv, None) for pt, pv in pts[:-1]], bucket)]
    got = burst(folded + pts[-1:], now)
    full = burst(pts, now)
    assert got >= full - 1e-9
    if bucket == 0.0:
        assert got == pytest.approx(full)
    else:
        assert got <= burst(pts, now - bucket) + 1e-9
    assert len(folded) <= max(len(pts) - 1, 0)
    assert [x[0] for x in folded] == sorted(x[0] for x in folded)


@settings(max_examples=150, deadline=None)
@given(data=st.data(),
       steps=st.lists(st.tuples(st.sampled_from([5.0, 15.0, 15.0, 30.0, 61.0, 400.0]),
                                st.one_of(st.none(), st.floats(min_value=0.0, max_value=50.0)),
                                st.one_of(st.none(), st.floats(min_value=0.0, max_value=5000.0))),
                      min_size=1, max_size=120))
def test_running_sums_equal_the_recomputed_window(data: st.DataObject,
                                                  steps: list[tuple[float, float | None, float | None]]) -> None:
    # The rates fed tick by tick (gaps, missing rates, JSON round trips of the state): at every
    # tick the forecast from the running sums kept in the state is the one recomputed from the
    # whole window (forecast_rate over the peaks and samples), for either rate.
    trend = data.draw(st.sampled_from([60.0, 120.0, 300.0, 600.0]))
    window = data.draw(st.sampled_from([0.0, 300.0, 900.0, 3600.0]))
    hold = data.draw(st.one_of(st.none(), st.sampled_from([0.0, 300.0, 600.0, 3600.0])))
    lead = data.draw(st.sampled_from([0.0, 480.0]))
    fall_to = data.draw(st.sampled_from([None, 0.5, 0.9]))
    fall_s = data.draw(st.sampled_from([0.0, 60.0, 120.0, 400.0]))
    confirm = data.draw(st.sampled_from([0.0, 30.0, 180.0, 400.0]))
    kind = build(trend_window_s=trend, burst_window_s=window, burst_hold_s=hold, lead_time_s=lead,
                 history_s=data.draw(st.sampled_from([300.0, 1800.0])), burst_fall_to=fall_to, burst_fall_s=fall_s,
                 trend_confirm_s=confirm)
    state: Any = {}
    now = T0
    compared = 0
    for dt, req, tok in steps:
        now += timedelta(seconds=dt)
        rec = kind.recommend(ctx(now, req, tok, state))
        state = json.loads(json.dumps(rec.state)) if data.draw(st.booleans()) else rec.state
        samples, peaks = list(rec.state["samples"]), list(rec.state["peaks"])
        running = RunningWindow.load(rec.state, samples)
        assert running.state(samples) == rec.state["running"]  # the state's sums describe its samples
        since = -math.inf if peaks else (samples[0][0] if samples else now.timestamp())
        for name, col in COLUMNS:
            got = running.forecast(name, col, samples, peaks, now.timestamp(), lead, trend, window, hold, since,
                                   fall_to, fall_s, confirm)
            pts = [(s[0], v) for s in peaks + samples if (v := s[col]) is not None]
            if fall_to is not None and pts:
                # spikes only: never more than every peak, never less than the latest rate
                plain = forecast_rate(pts, now.timestamp(), lead, trend, window, hold, since)[2]
                spiky = forecast_rate(pts, now.timestamp(), lead, trend, window, hold, since, fall_to, fall_s)[2]
                assert pts[-1][1] - 1e-9 <= spiky <= plain + 1e-9
            if got is None:
                continue  # a configuration the sums cannot answer: recomputed in recommend()
            want = forecast_rate(pts, now.timestamp(), lead, trend, window, hold, since, fall_to, fall_s, confirm)
            assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
            compared += 1
    # where the fine samples are the trend window at full weight, a tick with a rate is answered
    # from the sums (not left to the recomputation)
    if trend >= 120 and window >= trend and (hold is None or hold >= trend) and steps[-1][1] is not None:
        assert compared


def test_a_state_without_running_sums_is_recomputed() -> None:
    # a state written before the running sums existed (or edited by hand) decides as before
    kind = build()
    full = run(kind, [2.0 + 0.1 * i for i in range(40)])
    old = {"samples": full.state["samples"], "peaks": full.state["peaks"]}
    later = T0 + timedelta(seconds=40 * 15)
    a = kind.recommend(ctx(later, 6.0, state=full.state))
    b = kind.recommend(ctx(later, 6.0, state=old))
    assert (a.replicas, a.message) == (b.replicas, b.message)
    assert a.state["running"]["count"] == b.state["running"]["count"] == len(a.state["samples"])
