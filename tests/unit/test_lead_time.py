"""Lead-time economics through ``decide``: what a fleet owner sees of cloud capacity around bursts.

A small world drives ``decide`` every 15 s: an on-prem pool holding 8 replicas (ready at once: its
node is there), a spot pool and an on-demand pool whose replicas serve 300 s (provisioning) + 180 s
(cold start) = 480 s after they are ordered, the default ``slo-guard`` sizing 1 req/s per replica,
and a request rate given as a function of time. Scaling a pool down removes its newest replicas
first, as Kubernetes removes pending pods first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable

from controller.core import leadtime
from controller.core.model import (
    Decision,
    History,
    ModelSignals,
    ModelSpec,
    PoolSpec,
    PoolState,
    ReplicaCapacity,
    Sample,
    Tier,
)
from controller.core.pipeline import decide
from controller.core.placement import place
from controller.core.policy import EffectivePolicy
from controller.core.reasons import Reason
from controller.core.spec import PolicySpec
from policies.base import Registry

T0 = datetime(2025, 6, 2, 8, 0, tzinfo=timezone.utc)
TICK_S = 15.0
LEAD_S = 300.0 + 180.0
POOLS = {
    "onprem": PoolSpec("onprem", Tier.ONPREM, "onprem", "H100", 8, 1, 16.0),
    "spot": PoolSpec("spot", Tier.SPOT, "aws", "H100", 8, 4, 25.0, provisioning_delay_s=300),
    "od": PoolSpec("od", Tier.ONDEMAND, "aws", "H100", 8, 4, 98.0, provisioning_delay_s=300),
}
MODEL = ModelSpec(name="m", tp_degree=1, quantization="fp8", gpu_types=("H100",), cold_start_s=180,
                  capacity={"H100": ReplicaCapacity(1000.0, 1.0)}, pools=tuple(POOLS))
CLOUD = ("spot", "od")


def policy(slo: dict[str, float] | None = None, **lead_time: object) -> EffectivePolicy:
    doc = {"model": "m", "bounds": {"min_replicas": 2, "max_replicas": 32}, "slo": slo or {},
           "rules": [{"kind": "slo-guard", "params": {"capacity_fraction": 1.0}}],
           "capacity": {"learn": False}, "lead_time": {"enabled": True, **lead_time}}
    spec = PolicySpec.model_validate(doc)
    reg = Registry.from_entry_points()
    return EffectivePolicy("m", spec, tuple(reg.build(r.kind, r.params, r.name) for r in spec.rules), "v")


@dataclass
class World:
    """Replicas per pool with the time each was ordered; a cloud replica serves ``LEAD_S`` later."""

    ordered: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in POOLS})

    def states(self, now_s: float) -> dict[str, PoolState]:
        out = {}
        for name, times in self.ordered.items():
            lead = 0.0 if name == "onprem" else LEAD_S
            out[name] = PoolState(name, len(times), ready_replicas=sum(1 for t in times if now_s - t >= lead))
        return out

    def apply(self, placement: dict[str, int], now_s: float) -> None:
        for name, n in placement.items():
            times = self.ordered[name]
            times.sort()
            if n < len(times):
                del times[n:]  # the newest (not ready) go first
            else:
                times.extend([now_s] * (n - len(times)))


def run(rate: Callable[[float], float | None], minutes: float, pol: EffectivePolicy | None = None,
        world: World | None = None, queue: Callable[[float], float] = lambda t: 0.0,
        ) -> list[tuple[float, Decision, dict[str, PoolState]]]:
    """(seconds since T0, decision, pool states it saw) every tick for ``minutes``; a rate of
    ``None`` is a missing sample; ``queue``: the requests waiting."""
    pol = pol or policy()
    world = world or World({"onprem": [-1e9, -1e9], "spot": [], "od": []})
    history = History()
    out = []
    for i in range(int(minutes * 60 / TICK_S)):
        t = i * TICK_S
        now = T0 + timedelta(seconds=t)
        states = world.states(t)
        r = rate(t)
        sig = ModelSignals("m", now, pools=states,
                           request_rate_per_s=Sample(r, now) if r is not None else Sample.missing("NoData", now),
                           output_tokens_per_s=Sample(0.0, now), queue_depth=Sample(queue(t), now))
        d = decide(model=MODEL, pools=POOLS, signals=sig, policy=pol, history=history, overrides=(), now=now)
        history = d.history
        world.apply(dict(d.placement), t)
        out.append((t, d, states))
    return out


def cloud(d: Decision) -> int:
    return sum(d.placement[n] for n in CLOUD)


def burst(start_min: float, end_min: float, low: float = 2.0, high: float = 12.0) -> Callable[[float], float]:
    return lambda t: high if start_min * 60 <= t < end_min * 60 else low


def test_a_burst_shorter_than_the_cloud_lead_time_buys_no_cloud_replica() -> None:
    # 12 replicas' load for 3 minutes (lead time 8; with no history the default min_survival 0.3
    # orders once a burst is 3/7 of it, 206 s, old): on-prem spare takes what it can (8)
    ticks = run(burst(20, 23), 45)
    assert max(cloud(d) for _, d, _ in ticks) == 0
    during = [d for t, d, _ in ticks if 21 * 60 <= t < 23 * 60]
    assert all(d.placement["onprem"] == 8 for d in during)
    assert all(d.stage("lead-time").reason == Reason.BURST_SHORTER_THAN_LEAD_TIME.value for d in during)
    assert "serving it from on-prem" in during[0].stage("lead-time").message


def test_a_long_burst_buys_cloud_and_releases_it_within_the_cloud_window_after_it() -> None:
    window_s = 60.0
    ticks = run(burst(20, 50), 70, policy(cloud_scale_down_s=window_s))
    bought = [t for t, d, _ in ticks if cloud(d) > 0]
    # once the burst is 3/7 of a lead time old (seen from the tick after it starts)
    assert bought and bought[0] <= 20 * 60 + LEAD_S * 3 / 7 + 2 * TICK_S
    # cloud replicas served during the burst (ordered in time for part of it)
    assert any(sum(s[n].ready_replicas or 0 for n in CLOUD) >= 4 for t, _, s in ticks if t < 50 * 60)
    end = 50 * 60
    after = [(t, d) for t, d, _ in ticks if t >= end + window_s + 2 * TICK_S]
    assert all(cloud(d) == 0 for _, d in after)
    released = [d for t, d, _ in ticks if end <= t < end + window_s + 2 * TICK_S and cloud(d) == 0]
    assert released and released[0].stage("lead-time").reason == Reason.CLOUD_RELEASED.value
    # on-prem keeps the long scale-down window (300 s stabilization by default): still above the
    # 2 replicas the load needs a few minutes after the burst
    assert all(d.placement["onprem"] > 2 for t, d in after if t < end + 240)


def test_not_ready_cloud_replicas_are_cancelled_when_demand_falls() -> None:
    # a burst of 10 minutes: cloud is ordered once it is 206 s old and cancelled at its end,
    # before it was ever ready
    ticks = run(burst(20, 30), 45)
    assert max(cloud(d) for _, d, _ in ticks) > 0
    assert all(sum(s[n].ready_replicas or 0 for n in CLOUD) == 0 for _, _, s in ticks)
    assert all(cloud(d) == 0 for t, d, _ in ticks if t >= 30 * 60 + 60 + 2 * TICK_S)


def test_past_bursts_teach_how_long_bursts_last() -> None:
    # after two 20-minute bursts, the third is expected to outlast the lead time at once
    rate = lambda t: 12.0 if any(s * 60 <= t < (s + 20) * 60 for s in (10, 50, 90)) else 2.0  # noqa: E731
    ticks = run(rate, 115)
    first = min(t for t, d, _ in ticks if t >= 90 * 60 and cloud(d) > 0)
    assert first <= 90 * 60 + 2 * TICK_S
    # the third has ended too by the last tick: three durations remembered, each about 20 minutes
    seen = ticks[-1][1].history.rule_state[leadtime.STATE_KEY]["bursts"]
    assert len(seen) == 3 and all(19 * 60 <= d <= 21 * 60 for d in seen)


def test_a_steady_rise_orders_cloud_before_the_load_exceeds_on_prem() -> None:
    # a ramp of one replica's load a minute, from 2: the forecast-free slo-guard sees only the
    # present, so the trend here is the present need; cloud follows once the rise is steady
    ticks = run(lambda t: 2.0 + t / 60.0, 20)
    first = min(t for t, d, _ in ticks if cloud(d) > 0)
    assert first < (8 - 2) * 60 + LEAD_S * 3 / 7  # sooner than the survival rule alone would allow


def test_disabled_places_the_total_as_before() -> None:
    ticks = run(burst(20, 25), 30, policy(enabled=False))
    assert max(cloud(d) for _, d, _ in ticks) > 0


def test_placement_cancels_not_ready_cloud_replicas_before_ready_ones() -> None:
    states = {"onprem": PoolState("onprem", 8, 8), "spot": PoolState("spot", 4, 0), "od": PoolState("od", 4, 4)}
    r = place(model=MODEL, pools=POOLS, states=states, total=13)
    # three fewer: the four spot replicas still starting go before any on-demand one that serves
    assert r.replicas == {"onprem": 8, "spot": 1, "od": 4}
    capped = place(model=MODEL, pools=POOLS, states=states, total=16, max_cloud=4)
    assert capped.replicas == {"onprem": 8, "spot": 0, "od": 4}
    assert any(code == Reason.CLOUD_RELEASED.value for code, _ in capped.events)


def test_survival_from_past_bursts_with_the_age_as_prior() -> None:
    assert leadtime.survival(0.0, 480.0, ()) == 0.0
    assert leadtime.survival(480.0, 480.0, ()) == 0.5
    # two past bursts of 20 minutes: a new one is expected to outlast 8 minutes from the start
    assert leadtime.survival(0.0, 480.0, (1200.0, 1200.0)) >= 2 / 3
    # past bursts of 3 minutes: one 4 minutes old is no evidence beyond the prior
    assert leadtime.survival(240.0, 480.0, (180.0, 180.0)) < 0.5


def test_rising_needs_a_steady_rise_over_the_whole_lead_time() -> None:
    ramp = [(t, 2.0 + t / 60.0) for t in range(0, 601, 15)]
    assert leadtime.rising(ramp, 600.0, 480.0)
    step = [(t, 2.0 if t < 500 else 12.0) for t in range(0, 601, 15)]
    assert not leadtime.rising(step, 600.0, 480.0)
    # no trend before the history covers the lead time
    assert not leadtime.rising(ramp[-10:], 600.0, 480.0)


def test_spikes_in_a_train_keep_their_cloud_replicas_through_the_gaps() -> None:
    # a long burst teaches that bursts last (cloud bought), then 2-minute spikes every 5 minutes:
    # gaps of 3 minutes are shorter than the 8-minute lead time, so once two gaps are known the
    # cloud replicas stay through them instead of going after 60 s and coming back too late
    def rate(t: float) -> float:
        m = t / 60
        if 10 <= m < 40:
            return 12.0
        return 12.0 if m >= 40 and (m - 40) % 5 >= 3 else 2.0
    ticks = run(rate, 80)
    late = [(t, d) for t, d, _ in ticks if 60 * 60 <= t < 80 * 60]
    assert all(cloud(d) > 0 for _, d in late)
    gaps = ticks[-1][1].history.rule_state[leadtime.STATE_KEY]["gaps"]
    assert gaps and all(gap < LEAD_S for gap in gaps)


def test_missing_data_never_releases_cloud_replicas() -> None:
    # the request rate goes missing as the long burst ends: the cloud replicas stay
    ticks = run(lambda t: 12.0 if t < 50 * 60 else None, 60)
    assert all(cloud(d) > 0 for t, d, _ in ticks if 50 * 60 <= t < 60 * 60)


def test_an_operator_pin_beats_lead_time_economics() -> None:
    from controller.core.model import Override, OverrideKind

    world = World({"onprem": [-1e9, -1e9], "spot": [], "od": []})
    now = T0
    sig = ModelSignals("m", now, pools=world.states(0.0), request_rate_per_s=Sample(2.0, now),
                       output_tokens_per_s=Sample(0.0, now), queue_depth=Sample(0.0, now))
    pin = Override(1, OverrideKind.PIN, "m", replicas=12)
    d = decide(model=MODEL, pools=POOLS, signals=sig, policy=policy(), history=History(), overrides=(pin,), now=now)
    assert d.replicas == 12 and cloud(d) == 4


MISS_SLO = {"queue_depth_per_replica": 2.0}
"""The SLO the miss tests hold: 2 waiting requests per ready replica."""


def test_an_slo_miss_with_on_prem_full_orders_cloud_even_for_a_young_burst() -> None:
    # the 3-minute burst of the first test, but now requests queue (5 per ready replica, the SLO
    # says 2): the miss is certain now, the burst's end is not, so cloud is ordered at once
    queue = lambda t: 40.0 if 20 * 60 <= t < 23 * 60 else 0.0  # noqa: E731
    ticks = run(burst(20, 23), 45, policy(MISS_SLO), queue=queue)
    first = min(t for t, d, _ in ticks if cloud(d) > 0)
    assert 20 * 60 <= first <= 20 * 60 + 2 * TICK_S
    assert "SLO missed now" in next(d for t, d, _ in ticks if t == first).stage("lead-time").message
    # the same burst kept within the SLO buys nothing (the first test), nor does a queue within it
    calm = run(burst(20, 23), 45, policy(MISS_SLO), queue=lambda t: 8.0 if 20 * 60 <= t < 23 * 60 else 0.0)
    assert max(cloud(d) for _, d, _ in calm) == 0


def test_cloud_ordered_for_a_miss_is_not_cancelled_when_the_burst_ends() -> None:
    # a 3-minute burst missing the SLO: what it ordered stays while the rules' total still asks for
    # it (their scale-down stabilization, 300 s by default), not only the 60 s cloud window (the
    # next spike of a train would find nothing on its way); it goes with the total
    queue = lambda t: 40.0 if 20 * 60 <= t < 23 * 60 else 0.0  # noqa: E731
    ticks = run(burst(20, 23), 45, policy(MISS_SLO, cloud_scale_down_s=60), queue=queue)
    assert all(cloud(d) > 0 for t, d, _ in ticks if 21 * 60 <= t < 27 * 60)
    cuts = {Reason.CLOUD_RELEASED.value, Reason.CLOUD_NOT_NEEDED.value}
    assert all(d.stage("lead-time").reason not in cuts for t, d, _ in ticks if 23 * 60 <= t < 27 * 60)
    assert all(cloud(d) == 0 for t, d, _ in ticks if t >= 29 * 60)


def test_a_burst_expected_from_past_gaps_keeps_the_cloud_its_memory_asks_for() -> None:
    # bursts came 10 minutes apart (longer than the 8-minute lead time); the last ended 2 minutes
    # ago. The rules' memory of the peak still asks for 12 replicas, the load now needs 2: the 4
    # cloud replicas stay, since the next burst is expected within a lead time and the window
    # (without a known gap they would go)
    rules = policy().spec.lead_time
    now = 10_000.0
    need = leadtime.Need(total=12, present=2, trend=2, load=2.0, missing=False)
    seen = {"last_over": now - 120.0, "bursts": (600.0, 600.0), "gaps": (600.0, 600.0)}
    kept = leadtime.cloud_cap(seen, need, now_s=now, onprem=8, cloud=4, cloud_ready=4, lead_s=LEAD_S, rules=rules)
    assert kept.max_cloud == 4 and "a burst is expected in 480s" in kept.message
    first = leadtime.cloud_cap({**seen, "gaps": ()}, need, now_s=now, onprem=8, cloud=4, cloud_ready=4,
                               lead_s=LEAD_S, rules=rules)
    assert first.max_cloud == 0 and first.reason == Reason.CLOUD_RELEASED.value
    # long after the expected burst should have come and gone, nothing is kept for it
    late = leadtime.cloud_cap({**seen, "last_over": now - 2400.0}, need, now_s=now, onprem=8, cloud=4,
                              cloud_ready=4, lead_s=LEAD_S, rules=rules)
    assert late.max_cloud == 0


def test_a_dip_shorter_than_the_window_keeps_the_ready_cloud_replicas_of_a_running_burst() -> None:
    # a long burst, easing (the rules' memory still holds the peak's replicas, on cloud) and dipping
    # to what on-prem holds for 30 s before it comes back: the ready cloud replicas stay
    def rate(t: float) -> float:
        m = t / 60
        return 12.0 if 10 <= m < 30 or m >= 32.5 else 9.0 if 30 <= m < 32 else 8.0 if 32 <= m < 32.5 else 2.0
    ticks = run(rate, 40)
    ready_before = min(sum(s[n].ready_replicas or 0 for n in CLOUD) for t, _, s in ticks if 31 * 60 <= t < 32 * 60)
    assert ready_before >= 3
    assert all(cloud(d) >= ready_before for t, d, _ in ticks if 32 * 60 <= t < 33 * 60)
