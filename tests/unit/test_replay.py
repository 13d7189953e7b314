"""``controller.replay.replay`` is pure and adds up what it shows: hypothesis over synthetic logs
(the demo fleet, random load, random tick spacing)."""

from __future__ import annotations

from dataclasses import replace as with_
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.model import ModelSignals, PoolState, Sample
from controller.core.pricing import placement_cost
from controller.replay import LoggedTick, alternative_policy, replay, shortfall
from controller.runtime import load_config
from controller.demo import demo_config_path
from policies.base import Registry

POLICY_TEXT = """\
apiVersion: tidegate/v1
kind: ScalingPolicy
metadata: {name: tight}
spec:
  model: llama3-70b-fp8
  bounds: {min_replicas: 2, max_replicas: 10}
  slo: {p99_latency_ms: 6000, queue_depth_per_replica: 4}
  rules:
    - kind: slo-guard
"""

CFG = load_config(demo_config_path())
MODELS, POOLS = CFG.model_specs(), CFG.pool_specs()
MODEL = MODELS["llama3-70b-fp8"]
POLICY = alternative_policy("p.yaml", POLICY_TEXT, Registry.from_entry_points(), MODELS, None)
T0 = datetime(2026, 11, 2, tzinfo=timezone.utc)


def _tick(i: int, at: datetime, tokens: float | None, placement: dict[str, int]) -> LoggedTick:
    samples = {"output_tokens_per_s": Sample(tokens, at), "request_rate_per_s": Sample(None if tokens is None else tokens / 250, at),
               "p99_latency_ms": Sample(3000.0, at), "queue_depth": Sample(1.0, at)}
    pools = {p: PoolState(pool=p, replicas=placement.get(p, 0), ready_replicas=placement.get(p, 0), at=at)
             for p in MODEL.pools}
    sig = ModelSignals(model=MODEL.name, at=at, samples=samples, pools=pools, degraded=None)
    return LoggedTick(id=i + 1, at=at, signals=sig, placement=placement,
                      cost_per_hour_usd=placement_cost(MODEL, POOLS, pools, placement), reason="Logged", trace=[])


@st.composite
def logs(draw: st.DrawFn) -> list[LoggedTick]:
    n = draw(st.integers(1, 40))
    steps = draw(st.lists(st.integers(1, 120), min_size=n, max_size=n))
    loads = draw(st.lists(st.one_of(st.none(), st.floats(0, 12000)), min_size=n, max_size=n))
    onprem = draw(st.lists(st.integers(0, 8), min_size=n, max_size=n))
    at, out = T0, []
    for i in range(n):
        at += timedelta(seconds=steps[i])
        out.append(_tick(i, at, loads[i], {p: (onprem[i] if p == "onprem-h100" else 0) for p in MODEL.pools}))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs())
def test_replay_is_pure_and_adds_up(ticks: list[LoggedTick]) -> None:
    first = replay(ticks, model=MODEL, pools=POOLS, policy=POLICY)
    assert replay(list(ticks), model=MODEL, pools=POOLS, policy=POLICY) == first
    dts = [(b.at - a.at).total_seconds() for a, b in zip(ticks, ticks[1:])]
    dts.append(dts[-1] if dts else 0.0)
    under = sum(dt for t, dt in zip(ticks, dts) if shortfall(MODEL, POOLS, t.placement, t.signals) is not None)
    assert first["decided"]["under_capacity_s"] == under
    assert first["decided"]["cost_usd"] == round(sum(t.cost_per_hour_usd * dt / 3600 for t, dt in zip(ticks, dts)), 4)
    for side in ("decided", "replayed"):
        runs = first[side]["under_capacity"]
        assert sum(r["seconds"] for r in runs) == first[side]["under_capacity_s"]
        assert all(a["to"] < b["from"] for a, b in zip(runs, runs[1:]))  # separate runs, in order
    assert all(sum(s["replayed"].values()) <= 10 for s in first["series"])
    assert first["differing_ticks"] == sum(s["decided"] != s["replayed"] for s in first["series"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), logs())
def test_coarse_ticks_from_rollups_are_said_and_cover_their_hours(hours: int, full: list[LoggedTick]) -> None:
    coarse = [with_(t, at=T0 + timedelta(hours=k), coarser=True)
              for k, t in enumerate(_tick(100 + k, T0, 3000.0 * (k + 1), {"onprem-h100": k + 1}) for k in range(hours))]
    start = T0 + timedelta(hours=hours)
    full = [with_(t, at=start + (t.at - T0)) for t in full]
    first = replay(coarse + full, model=MODEL, pools=POOLS, policy=POLICY)
    assert replay(coarse + full, model=MODEL, pools=POOLS, policy=POLICY) == first
    assert first["coarser"] == {"hours": hours, "from": T0.isoformat(), "to": full[0].at.isoformat(),
                                "note": f"{hours} h of hourly rollups: one tick per hour from its mean signals and "
                                        f"replicas per pool, no traces"}
    assert [bool(s.get("coarser")) for s in first["series"]] == [True] * hours + [False] * len(full)
    alone = replay(coarse, model=MODEL, pools=POOLS, policy=POLICY)  # the last coarse tick: the rest of its hour
    assert alone["to"] == (T0 + timedelta(hours=hours - 1)).isoformat()
    assert alone["coarser"]["to"] == start.isoformat()
    assert alone["decided"]["cost_usd"] == round(sum(t.cost_per_hour_usd for t in coarse), 4)
    assert replay(full, model=MODEL, pools=POOLS, policy=POLICY)["coarser"] is None


def test_under_capacity_is_judged_with_the_learned_capacity_the_log_recorded() -> None:
    """A placement that the configured profile says is enough falls short when the decision's
    learner had found the replicas carry half of it; a row without learner state (or a malformed
    one) is judged by the profile."""
    from controller.replay import learned_from

    cap = MODEL.capacity[POOLS["onprem-h100"].gpu_type]
    placement = {p: (4 if p == "onprem-h100" else 0) for p in MODEL.pools}
    at = T0 + timedelta(seconds=5)
    tick = _tick(0, at, 0.75 * 4 * cap.output_tokens_per_s, placement)  # 75 % of what the profile gives
    assert shortfall(MODEL, POOLS, placement, tick.signals) is None
    halved = learned_from({"@capacity": {"scale": 0.5, "mix": None}})
    assert halved == (0.5, None)
    short = shortfall(MODEL, POOLS, placement, tick.signals, halved)
    assert short is not None and short["had_output_tokens_per_s"] == 0.5 * 4 * cap.output_tokens_per_s
    assert learned_from({}) is None and learned_from({"@capacity": {"scale": "x"}}) is None
    assert learned_from({"@capacity": {"scale": -1}}) is None
    # in a replay both sides are judged with it
    later = _tick(1, at + timedelta(seconds=5), 0.75 * 4 * cap.output_tokens_per_s, placement)
    log = [with_(tick, learned=halved), with_(later, learned=halved)]
    # two ticks of 5 s each (the last stands for as long as the one before)
    assert replay(log, model=MODEL, pools=POOLS, policy=POLICY)["decided"]["under_capacity_s"] == 10.0
    assert replay([tick, later], model=MODEL, pools=POOLS, policy=POLICY)["decided"]["under_capacity_s"] == 0.0
