"""Learned capacity (``controller.core.capacity``): the pure pieces, then the behaviour a user
depends on, through ``tidegate simulate``'s public entry point: a capacity profile wrong by 2 x in
either direction is corrected from what the replicas sustain, and the fleet ends up the size the
right profile gives. Both start cold (one replica facing the full rate, the simulator's equal
terms); the pessimistic one warm as well."""

from __future__ import annotations

import json
from dataclasses import replace
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.capacity import (
    FAR_PROBE_MIN_REPLICAS,
    FLOOR_CAP,
    FLOOR_RISE_PER_MIN,
    PROBE_MIN_REPLICAS,
    Mix,
    Observed,
    for_mix,
    gpu_scales,
    learn,
    learn_by_gpu,
    learned_scale,
    load_units_by_gpu,
    smoothed_mix,
    weighted,
)
from controller.core.model import ReplicaCapacity
from controller.core.spec import CapacityLearning
from controller.sim.cli import simulate_main

CFG = CapacityLearning(probe_per_min=0.15)
CAP = ReplicaCapacity(100.0, 2.0, prefill_tokens_per_s=7000.0, decode_tokens_per_s=9000.0)


def obs(t: float, load: float, ready: int, pressure: float | None, settled: bool = True) -> Observed:
    return Observed(now_s=t, load_units=load, ready=ready, settled=settled, pressure=pressure)


# ------------------------------------------------------------------------------------------ pure


@given(st.floats(1, 20000), st.floats(1, 5000), st.floats(0.25, 4))
def test_capacity_for_a_mix_costs_prompt_over_prefill_plus_output_over_decode(p: float, o: float, scale: float) -> None:
    cap = for_mix(CAP, Mix(p, o), scale)
    assert cap.requests_per_s == pytest.approx(scale / (p / 7000.0 + o / 9000.0))
    assert cap.output_tokens_per_s == pytest.approx(cap.requests_per_s * o)
    # a longer prompt never buys more requests per second
    assert for_mix(CAP, Mix(p * 2, o), scale).requests_per_s < cap.requests_per_s


def test_a_fixed_capacity_only_scales() -> None:
    fixed = ReplicaCapacity(69.0, 2.47)
    assert for_mix(fixed, Mix(5000, 500)) == fixed
    assert for_mix(fixed, Mix(5000, 500), 0.5) == ReplicaCapacity(34.5, 1.235)


@given(st.floats(0.3, 3.5), st.floats(0.05, 5), st.floats(1.0, 10))
def test_pressure_only_lowers_and_never_below_the_load_it_was_seen_at(scale0: float, u: float, p: float) -> None:
    state = {"scale": scale0, "t": 0.0, "q": p}
    scale, _, new = learn(state, obs(60.0, u * 8, 8, p), CFG, 0.8)
    if u >= CFG.burst_share * 0.8 * scale0:
        assert min(scale0, u) - 1e-9 <= scale <= scale0 + 1e-9
        assert new["hi"] == pytest.approx(u)
    else:  # a burst: far below the planned load, no evidence
        assert scale == scale0


@given(st.floats(0.3, 3.5), st.floats(0.01, 8), st.floats(0, 0.5), st.floats(1, 300))
def test_calm_raises_at_most_probe_per_min(scale0: float, u: float, p: float, dt: float) -> None:
    state = {"scale": scale0, "t": 0.0, "q": p}
    scale, _, _ = learn(state, obs(dt, u * 8, 8, p), CFG, 0.8)
    assert scale0 - 1e-9 <= scale <= min(CFG.max_scale, scale0 * (1 + CFG.probe_per_min * dt / 60.0)) + 1e-9


@given(st.floats(0.3, 3.5), st.floats(0.01, 8), st.floats(1, 300))
def test_without_a_probe_the_profile_is_the_most_a_replica_is_trusted_with(scale0: float, u: float, dt: float) -> None:
    cfg = CapacityLearning()  # probe_per_min 0, the default
    scale, _, _ = learn({"scale": scale0, "t": 0.0, "q": 0.1}, obs(dt, u * 8, 8, 0.1), cfg, 0.8)
    assert scale0 - 1e-9 <= scale <= max(scale0, 1.0) + 1e-9
    if scale0 < 1.0 and u > scale0:  # a value learned below the profile recovers toward it
        assert scale > scale0


def test_no_probe_above_a_recent_pressure_point_nor_while_the_fleet_has_not_followed() -> None:
    base = {"scale": 1.0, "t": 0.0, "q": 0.1}
    # the fleet carries what it is planned to: probing up
    assert learn(base, obs(60.0, 0.8 * 8, 8, 0.1), CFG, 0.8)[0] > 1.0
    # pressure was seen at 1.02 x the profile a minute ago: no probe past it
    assert learn({**base, "hi": 1.02, "hi_t": 0.0}, obs(60.0, 0.8 * 8, 8, 0.1), CFG, 0.8)[0] == 1.0
    # the fleet holds many more replicas than the estimate asks for (a floor, a burst memory)
    assert learn(base, obs(60.0, 0.3 * 8, 8, 0.1), CFG, 0.8)[0] == 1.0
    # replicas still starting: no probe
    assert learn(base, obs(60.0, 0.8 * 8, 8, 0.1, settled=False), CFG, 0.8)[0] == 1.0


def _calm_for(state: dict, t: float, minutes: float, load: float, ready: int) -> tuple[float, dict, list[str]]:
    """``minutes`` of calm ticks every 5 s at ``load`` (units of the prior) over ``ready`` replicas."""
    evidence: list[str] = []
    scale = learned_scale(state, "H100", CFG) if "gpus" in state else state.get("scale", 1.0)
    for _ in range(int(minutes * 12)):
        t += 5.0
        scale, ev, state = learn(state, obs(t, load, ready, 0.1), CFG, 0.8)
        evidence.append(ev)
    return t, state, evidence


def test_a_fleet_held_far_above_its_size_teaches_nothing() -> None:
    """A fleet carrying under half its planned load (a cold start's backlog scaled it up, a burst,
    a floor) tests no estimate: however long it is held so, the estimate stays put."""
    state = {"scale": 1.0, "t": 0.0, "q": 0.1}
    t, state, evidence = _calm_for(state, 0.0, 30.0, 0.3 * 24, 24)  # 0.3 <= 0.5 x 0.8 x 1.0
    assert state["scale"] == 1.0
    assert all(e.endswith("fleet held far above its size") for e in evidence)


def test_on_a_large_fleet_the_probe_runs_one_replica_further_ahead_and_never_past_pressure() -> None:
    """Back near its size with the usual gate closed (the fleet a replica beyond the dead band
    above the estimate's size), the probe goes on one replica further ahead on a fleet of
    FAR_PROBE_MIN_REPLICAS or more: no further than that one replica, not past a recent pressure
    point, not on a small fleet."""
    step = 1 + CFG.probe_per_min * 5 / 60
    base = {"scale": 1.0, "t": 0.0, "q": 0.1}
    # 8 ready carrying what 6.99 replicas at the planned load would: the usual gate (7) is closed,
    # one replica more (6) open until the estimate would size the fleet at 6
    n, load = 8, 0.8 * 6.99
    assert learn(dict(base), obs(5.0, load, n, 0.1), CFG, 0.8)[0] == pytest.approx(step)
    _, state, evidence = _calm_for(dict(base), 0.0, 3.0, load, n)
    assert 6.99 / 6 <= state["scale"] <= 6.99 / 6 * step  # one replica further ahead, no more
    assert evidence[0].endswith("probing up one replica further ahead") and evidence[-1].endswith("replica")
    # a pressure point within memory_s bounds it as it bounds the probe
    assert learn({**base, "hi": 1.0, "hi_t": 0.0}, obs(5.0, load, n, 0.1), CFG, 0.8)[0] == 1.0
    # below FAR_PROBE_MIN_REPLICAS one more replica is too large a step
    small = FAR_PROBE_MIN_REPLICAS - 1
    assert learn(base, obs(5.0, 0.8 * (small - 1.5), small, 0.1), CFG, 0.8)[0] == 1.0


def test_a_fleet_at_its_planned_size_that_is_not_calm_takes_the_estimate_back() -> None:
    """Between calm and pressure (at least midway) while the fleet is the size the estimate asks
    for: after tau_s of it (not a burst) the estimate drops to the load it was seen at and bounds
    the probe; shorter, or below midway, or on a fleet held above its size, it stands."""
    mid = (CFG.calm_ratio + CFG.pressure_ratio) / 2 + 0.05
    state: dict[str, object] = {"scale": 1.4, "t": 0.0, "q": mid, "n": 4}
    u = 1.06  # 4 replicas at 1.06: the size 1.4 x 0.8 asks for (3 would carry 1.41 > 1.12)
    for t in range(5, 65, 5):  # first seen at 5 s
        scale, evidence, state = learn(state, obs(float(t), u * 4, 4, mid), CFG, 0.8)
        assert scale == 1.4 and "between calm and pressure" in evidence
    scale, evidence, state = learn(state, obs(5.0 + CFG.tau_s, u * 4, 4, mid), CFG, 0.8)
    assert scale == pytest.approx(u) and state["hi"] == pytest.approx(u)
    # just above calm: no evidence
    low = {"scale": 1.4, "t": 0.0, "q": CFG.calm_ratio + 0.01, "n": 4, "mid_t": -100.0}
    assert learn(low, obs(5.0, u * 4, 4, CFG.calm_ratio + 0.01), CFG, 0.8)[0] == 1.4
    # a fleet of 6 at that load is above the size 1.4 asks for: not a test of it
    held = {"scale": 1.4, "t": 0.0, "q": mid, "n": 6, "mid_t": -100.0}
    assert learn(held, obs(5.0, u * 4, 6, mid), CFG, 0.8)[0] == 1.4


def _ttft_obs(t: float, load: float, ready: int, ttft: float, queue_pressure: float = 0.05,
             prompt: float = 2000.0) -> Observed:
    return Observed(now_s=t, load_units=load, ready=ready, settled=True, pressure=queue_pressure,
                    ttft_ratio=ttft, queued=True, prompt_tokens=prompt)


def test_a_latency_floor_no_replica_removes_is_not_read_as_a_shortage() -> None:
    """Long prompts put a floor under the p99 TTFT: at every fleet size it reads 0.67 of the target
    while requests hardly wait. Read whole, that is past midway between calm and pressure, so a
    fleet at its planned size has its estimate cut to the load it carries (and cut again at each
    lower load the bigger fleet then carries: the learned capacity fell to 0.36 of the profile on
    a day of prompts up to 8,000 tokens, README "Learned capacity"). Once the floor is learned the
    same minutes are calm: the estimate is never cut and the probe raises it."""
    floor, n = 0.67, 8
    load = 0.8 * (n - 0.5)  # 8 ready at the size an estimate of 1.0 asks for: the probe's gate open
    learned: dict[str, object] = {"scale": 1.0, "t": 0.0, "n": n, "fl": floor, "tq": floor, "fl_p": 2000.0}
    bare: dict[str, object] = {"scale": 1.0, "t": 0.0, "n": n}
    probed, bare_cut = False, False
    for k in range(1, 12 * 5 + 1):  # five minutes of ticks every 5 s
        t = 5.0 * k
        scale, ev, learned = learn(learned, _ttft_obs(t, load, n, floor), CFG, 0.8)
        assert scale >= 1.0 and ev.startswith("calm")
        probed = probed or "probing up" in ev
        bare_scale, bare_ev, bare = learn(bare, Observed(now_s=t, load_units=load, ready=n, settled=True,
                                                         pressure=floor), CFG, 0.8)
        bare_cut = bare_cut or "between calm and pressure at" in bare_ev
    assert scale > 1.0 and probed
    assert bare_scale == pytest.approx(load / n) and bare_cut


def test_the_floor_is_the_lower_envelope_of_the_readings() -> None:
    """The floor starts at 0 (a reading counts whole, as without one), climbs toward readings above
    it by FLOOR_RISE_PER_MIN, never past them, and falls at once to a lower one: a backlog of a few
    minutes barely raises it, a latency that every minute shows becomes floor."""
    state: dict[str, object] = {}
    t = 0.0
    for _ in range(12 * 10):  # ten minutes of a backlog reading twice the target
        t += 5.0
        _, _, state = learn(state, _ttft_obs(t, 4.0, 8, 2.0), CFG, 0.8)
    tick = FLOOR_RISE_PER_MIN * 5.0 / 60.0  # the rise of one tick
    assert state["fl"] == pytest.approx(10 * FLOOR_RISE_PER_MIN - tick)  # the first tick has no dt
    minutes = math.ceil(0.67 / FLOOR_RISE_PER_MIN)
    for _ in range(12 * (minutes + 60)):  # then a constant 0.67, long enough to catch up
        t += 5.0
        _, _, state = learn(state, _ttft_obs(t, 4.0, 8, 0.67), CFG, 0.8)
    assert state["fl"] == pytest.approx(0.67, abs=1e-6)
    t += 5.0
    _, _, state = learn(state, _ttft_obs(t, 4.0, 8, 0.1), CFG, 0.8)
    assert state["fl"] == pytest.approx(state["tq"]) and state["fl"] < 0.67


def test_latency_above_the_floor_is_pressure_and_a_new_mix_measures_the_floor_again() -> None:
    """What lies above the floor is contention that more replicas relieve: at the target it reads 1,
    as without a floor, and the estimate is cut. A mix whose mean prompt moved by more than a
    quarter starts the floor again from 0, and a reading below the floor lowers it at once."""
    state: dict[str, object] = {"scale": 1.0, "t": 0.0, "n": 8, "fl": 0.6, "fl_p": 2000.0, "tq": 0.6}
    t = 0.0
    for _ in range(24):  # two minutes at the SLO's p99 TTFT: (1.0 - 0.6) / (1 - 0.6) = 1
        t += 5.0
        scale, ev, state = learn(state, _ttft_obs(t, 0.9 * 8, 8, 1.0), CFG, 0.8)
    assert scale < 1.0 and "pressure at" in ev
    assert state["fl"] == pytest.approx(0.6 + 2 * FLOOR_RISE_PER_MIN)  # two minutes' rise, no more
    moved = learn({"fl": 0.6, "fl_p": 2000.0, "tq": 0.6, "t": 0.0}, _ttft_obs(5.0, 4.0, 8, 0.6, prompt=2600.0), CFG, 0.8)[2]
    assert moved["fl"] == pytest.approx(FLOOR_RISE_PER_MIN * 5.0 / 60.0) and moved["fl_p"] == 2600.0  # from 0
    kept = learn({"fl": 0.6, "fl_p": 2000.0, "tq": 0.6, "t": 0.0}, _ttft_obs(5.0, 4.0, 8, 0.6, prompt=2400.0), CFG, 0.8)[2]
    assert kept["fl"] == pytest.approx(0.6, abs=1e-3) and kept["fl_p"] == 2000.0
    lower = learn({"fl": 0.6, "fl_p": 2000.0, "tq": 0.3, "t": 0.0}, _ttft_obs(5.0, 4.0, 8, 0.3), CFG, 0.8)[2]
    assert lower["fl"] == pytest.approx(0.3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 3.0), st.booleans(), st.floats(0.0, 0.9)), min_size=1, max_size=60),
       st.floats(100.0, 8000.0))
def test_the_floor_only_ever_lowers_the_pressure_below_the_target_and_stays_under_the_readings(
        readings: list[tuple[float, bool, float]], prompt: float) -> None:
    """Whatever the readings: the floor never exceeds the smoothed TTFT; below the target the
    TTFT's pressure is never more than the reading whole, at the target it is 1 where the floor is
    at most FLOOR_CAP; with no floor yet the reading counts whole."""
    state: dict[str, object] = {}
    t = 0.0
    for ttft, queued, queue_p in readings:
        t += 5.0
        o = Observed(now_s=t, load_units=4.0, ready=8, settled=True, pressure=queue_p, ttft_ratio=ttft,
                     queued=queued, prompt_tokens=prompt)
        before = dict(state)
        _, _, state = learn(state, o, CFG, 0.8)
        assert 0.0 <= state["fl"] <= state["tq"] + 1e-12
        # the TTFT's own pressure this tick: the smoothed value of a state with none before it
        unsmoothed = {k: v for k, v in before.items() if k != "q"}
        p = learn(unsmoothed, replace(o, pressure=None), CFG, 0.8)[2]["q"]
        if not queued:
            assert p is None
        else:
            assert p is not None and (ttft >= 1.0 or p <= ttft + 1e-12)
            at_target = learn(unsmoothed, replace(o, pressure=None, ttft_ratio=1.0), CFG, 0.8)[2]
            if at_target["fl"] <= FLOOR_CAP:
                assert at_target["q"] == pytest.approx(1.0)
        raw = max(queue_p, ttft if queued else 0.0)
        if raw < 1.0:
            _, _, bare = learn({}, Observed(now_s=5.0, load_units=4.0, ready=8, settled=True, pressure=queue_p,
                                            ttft_ratio=ttft, queued=queued), CFG, 0.8)
            assert bare["q"] == pytest.approx(min(raw, 2.0))  # no floor yet: the reading whole


def test_pressure_is_bounded_by_what_the_replicas_serve() -> None:
    """An overloaded replica serves less than it is offered: under pressure the estimate drops to
    the served load where that is at most the planned fraction of the offered one (a smaller gap
    is the token mix moving), to the offered load otherwise; and only once the served rate has a
    window behind it (tau_s after the first observation)."""
    state = {"scale": 1.0, "t": 0.0, "q": 1.5, "n": 4, "t0": -100.0}
    assert learn(state, obs(5.0, 4 * 1.6, 4, 1.5), CFG, 0.8)[0] == 1.0
    assert learn(state, obs(5.0, 4 * 1.6, 4, 1.5), CFG, 0.8, served_units=4 * 0.7)[0] == pytest.approx(0.7)
    assert learn(state, obs(5.0, 4 * 1.6, 4, 1.5), CFG, 0.8, served_units=4 * 1.4)[0] == 1.0  # 1.4 > 0.8 x 1.6
    assert learn(state, obs(5.0, 4 * 0.9, 4, 1.5), CFG, 0.8, served_units=4 * 1.2)[0] == pytest.approx(0.9)
    young = {**state, "t0": 0.0}
    assert learn(young, obs(5.0, 4 * 1.6, 4, 1.5), CFG, 0.8, served_units=4 * 0.7)[0] == 1.0


def test_on_a_small_fleet_the_probe_waits_for_a_step_down_to_show() -> None:
    """On fewer than FAR_PROBE_MIN_REPLICAS, tau_s after the ready count fell the smoothed pressure
    has not yet shown the fewer replicas' load: calm then does not probe further."""
    base = {"scale": 1.0, "t": 0.0, "q": 0.1, "n": 5}
    load = 0.8 * 4 * 0.99  # 4 ready at the size the estimate asks for
    assert learn(base, obs(5.0, load, 4, 0.1), CFG, 0.8)[0] == 1.0  # fell from 5: waits
    assert learn({**base, "n": 4}, obs(5.0, load, 4, 0.1), CFG, 0.8)[0] > 1.0
    assert learn({**base, "n": 4, "dn_t": 0.0}, obs(5.0 + CFG.tau_s, load, 4, 0.1), CFG, 0.8)[0] > 1.0


def test_a_cold_start_backlog_does_not_hide_the_pressure_that_follows() -> None:
    """A fleet draining the backlog of a cold start reads hundreds of times the SLO for a minute;
    the pressure of the overload after it is scaled down (three replicas at 0.7 x the profile, a
    queue growing from the SLO to four times it in a minute) still counts."""
    state: dict[str, object] = {}
    for t in range(0, 65, 5):
        _, _, state = learn(state, obs(float(t), 2.0, 6, 300.0), CFG, 0.8)
    for t in range(65, 125, 5):
        scale, evidence, state = learn(state, obs(float(t), 2.1, 3, 1.0 + (t - 65) / 20, settled=False), CFG, 0.8)
    assert scale == pytest.approx(0.7) and evidence.startswith("pressure at 0.7"), (scale, evidence)


def test_no_pressure_evidence_while_new_replicas_drain_the_backlog() -> None:
    """Within tau_s of replicas becoming ready the windowed signals still show the backlog they
    drain: the load per ready replica then understates what a replica sustains."""
    state = {"scale": 1.0, "t": 0.0, "q": 1.5, "n": 3}
    scale, evidence, state = learn(state, obs(5.0, 4.2, 6, 1.5, settled=False), CFG, 0.8)
    assert scale == 1.0 and not evidence.startswith("pressure"), evidence
    scale, evidence, _ = learn(state, obs(5.0 + CFG.tau_s, 4.2, 6, 1.5), CFG, 0.8)
    assert scale == pytest.approx(0.7) and evidence.startswith("pressure"), evidence


@given(st.dictionaries(st.sampled_from(["scale", "t", "q", "hi", "hi_t", "mix", "bank"]),
                       st.one_of(st.none(), st.text(max_size=3), st.floats(allow_nan=True), st.lists(st.floats(), max_size=4))))
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])  # a busy CI machine
def test_any_state_is_survived_and_the_scale_stays_in_bounds(state: dict[str, object]) -> None:
    scale, _, new = learn(state, obs(1000.0, 4.0, 4, 1.5), CFG, 0.8)
    assert CFG.min_scale <= scale <= CFG.max_scale
    json.dumps(new)  # plain JSON: it goes to the decision log
    smoothed_mix(state, Mix(1000, 100), 1000.0, 300.0)


def test_the_mix_is_smoothed_and_kept_through_idle_minutes() -> None:
    state = {"mix": (0.0, 1000.0, 100.0)}
    m = smoothed_mix(state, Mix(2000.0, 100.0), 300.0, 300.0)
    assert m is not None and 1000.0 < m.prompt_tokens < 2000.0
    assert smoothed_mix(state, None, 300.0, 300.0) == Mix(1000.0, 100.0)


# -------------------------------------------------------------------- the simulator's public path

RATE_PER_S, PROMPT, OUTPUT, DURATION_S = 30.0, 1000, 250, 660.0


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A steady Poisson load of one token mix, an on-prem pool, a slo-guard policy with a short
    scale-down window, and the capacity one replica really sustains for the mix
    (``tidegate simulate --print-capacity``)."""
    d = tmp_path_factory.mktemp("learn")
    rng = np.random.default_rng(1)
    trace = _write_trace(d / "steady.csv", np.sort(rng.uniform(0, DURATION_S, int(RATE_PER_S * DURATION_S))), rng)
    return {"dir": d, "trace": trace, "policy": _write_policy(d / "policy.yaml", scale_down_s=60)}


def _write_trace(path: Path, arrivals: np.ndarray, rng: np.random.Generator) -> Path:
    """An Azure-format trace of ``arrivals`` (seconds, sorted) with exponential prompt and output
    lengths of the module's means."""
    n = len(arrivals)
    p = np.maximum(1, rng.exponential(PROMPT, n)).astype(int)
    o = np.maximum(1, rng.exponential(OUTPUT, n)).astype(int)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2024-01-01 00:{int(a // 60):02d}:{a % 60:010.7f},{b},{c}" for a, b, c in zip(arrivals, p, o)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _write_policy(path: Path, *, scale_down_s: float, capacity_fraction: float = 0.8) -> Path:
    """The tests' slo-guard policy (probe 0.15 a minute) with this scale-down window."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "tidegate/v1", "kind": "ScalingPolicy", "metadata": {"name": "learn"},
        "spec": {"model": "llama3-70b-fp8", "bounds": {"min_replicas": 1, "max_replicas": 24},
                 "slo": {"ttft_p99_ms": 1500, "tpot_ms": 100, "queue_depth_per_replica": 4},
                 "behavior": {"scale_down": {"stabilization_s": scale_down_s}}, "capacity": {"probe_per_min": 0.15},
                 "rules": [{"kind": "slo-guard", "params": {"capacity_fraction": capacity_fraction}}]}}))
    return path


def _fleet(d: Path, out_tok_s: float, req_s: float) -> Path:
    path = d / f"fleet-{out_tok_s:.0f}.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "tidegate/v1", "kind": "DaemonConfig", "loop": {"interval_s": 5},
        "providers": {"type": "simulated", "seed": 7, "interruptions_per_node_hour": 0.0},
        "pools": [{"name": "onprem", "tier": "onprem", "provider": "onprem", "gpu_type": "H100", "gpus_per_node": 8,
                   "max_nodes": 6, "min_nodes": 6, "price_per_node_hour_usd": 16.0}],
        "models": [{"name": "llama3-70b-fp8", "tp_degree": 2, "quantization": "fp8", "gpu_types": ["H100"],
                    "cold_start_s": 60, "capacity": {"H100": {"output_tokens_per_s": out_tok_s, "requests_per_s": req_s}},
                    "deployments": {"onprem": {"namespace": "llm", "name": "llama"}}}]}))
    return path


def _run(world: dict[str, object], factor: float, capsys: pytest.CaptureFixture[str], warm: bool = False,
         policy: Path | None = None) -> tuple[dict, dict, float]:
    """One run with the profile ``factor`` x the true capacity. ``warm``: the fleet starts ready at
    the size the true capacity gives for the rate at the policy's capacity_fraction (0.8); else
    at the policy's min_replicas (1)."""
    d, trace = world["dir"], world["trace"]
    policy = policy or world["policy"]
    assert isinstance(d, Path)
    assert simulate_main(["--trace", str(trace), "--fleet", str(_fleet(d, 1, 1)), "--print-capacity"]) == 0
    row = dict(kv.split("=") for kv in capsys.readouterr().out.split("\n")[0].split())
    true_tok, true_req = float(row["output_tokens_per_s_at_slo"]), float(row["requests_per_s_at_slo"])
    out = d / f"out-{factor}-{warm}-{Path(str(policy)).stem}"
    start = ["--initial-replicas", str(math.ceil(RATE_PER_S / (0.8 * true_req)))] if warm else []
    assert simulate_main(["--trace", str(trace), "--fleet", str(_fleet(d, true_tok * factor, true_req * factor)),
                          "--policy", str(policy), "--out", str(out), "--json", "--no-progress", *start]) == 0
    capsys.readouterr()
    doc = json.loads((out / "results.json").read_text())
    timeline = doc["timelines"]["tidegate"]
    assert timeline["ready:onprem"][0] == (int(start[1]) if warm else 1)  # the start the run was given
    return doc["runs"][0]["capacity"], timeline, true_tok


def _at(log: list[list[float]], t: float) -> float:
    """The learned output tok/s per replica in force at ``t``."""
    return [row[1] for row in log if row[0] <= t][-1]


def _desired(timeline: dict, t0: float, t1: float) -> list[int]:
    return [v for t, v in zip(timeline["t_s"], timeline["desired:onprem"]) if t0 <= t <= t1]


@pytest.fixture(scope="module")
def long_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The module's world for 40 minutes: long enough for the probe to settle."""
    d = tmp_path_factory.mktemp("learn-long")
    rng = np.random.default_rng(1)
    trace = _write_trace(d / "steady.csv", np.sort(rng.uniform(0, LONG_S, int(RATE_PER_S * LONG_S))), rng)
    return {"dir": d, "trace": trace, "policy": _write_policy(d / "policy.yaml", scale_down_s=60)}


LONG_S = 2400.0


def test_capacity_fraction_moves_the_fleet_while_the_probe_runs(long_world: dict[str, object],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """With the probe on, the learner raises its estimate until the planned load shows pressure,
    whatever share of the estimate the plan is: planning at 0.5 of capacity, it ended 1.44 x the
    true capacity here and the fleet barely larger than at 0.8 (6-7 replicas against 5-6; the
    benchmark's six settings of capacity_fraction read 97.97-98.20 % on a held-out coding day).
    The learner's pressure and calm ratios now scale with the planned fraction: at 0.5 the
    estimate stays within 15 % of the true capacity and the fleet holds at least two replicas more
    than at 0.8 (warm starts, the right profile, the last five minutes of 40)."""
    d = long_world["dir"]
    assert isinstance(d, Path)
    runs: dict[float, tuple[float, list[int]]] = {}
    for fraction in (0.5, 0.8):
        policy = _write_policy(d / f"policy-{fraction}.yaml", scale_down_s=60, capacity_fraction=fraction)
        cap, timeline, true_tok = _run(long_world, 1.0, capsys, warm=True, policy=policy)
        runs[fraction] = (cap["log"][-1][1] / true_tok, _desired(timeline, LONG_S - 300, LONG_S))
    (learned, half), (_, default) = runs[0.5], runs[0.8]
    assert learned <= 1.15, runs
    assert min(half) >= max(default) + 2, runs


def test_an_optimistic_profile_is_corrected_within_ten_minutes(world: dict[str, object],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    cap, timeline, true_tok = _run(world, 2.0, capsys)
    right_cap, right_timeline, _ = _run(world, 1.0, capsys)
    assert cap["log"][0][1] == pytest.approx(2 * true_tok, rel=0.02)  # the first decision: the profile
    learned = _at(cap["log"], 600.0)
    assert abs(learned / true_tok - 1) <= 0.15, (learned, true_tok)
    right = max(_desired(right_timeline, 540, 660))
    assert all(abs(n - right) <= 1 for n in _desired(timeline, 600, 660)), (_desired(timeline, 600, 660), right)


def test_a_pessimistic_profile_is_raised_and_the_fleet_shrinks_to_the_right_size(
        world: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    """Warm start (the fleet ready at the size the true capacity gives): the upward probe (15 % a
    minute, paused while the fleet follows each step down) raises a 2 x pessimistic profile to
    within 15 % of the true capacity within 10 minutes (measured in this module's world through
    ``tidegate simulate``: within 15 % from 245 s, 1.08 x at 600 and 615 s, 1.09 x at most; at
    dde108b, before the probe was taken back when the fleet at its new size was not calm, 1.09 x at
    600 s and rising, 1.15 x at most), and the fleet is then within one replica of the right
    profile's.
    Over trace seeds 1-12: ``bench/learned_capacity.py``."""
    cap, timeline, true_tok = _run(world, 0.5, capsys, warm=True)
    right_cap, right_timeline, _ = _run(world, 1.0, capsys, warm=True)
    assert cap["log"][0][1] == pytest.approx(0.5 * true_tok, rel=0.02)
    assert 0.85 * true_tok <= _at(cap["log"], 600.0) <= 1.15 * true_tok
    right = max(_desired(right_timeline, 540, 660))
    assert all(abs(n - right) <= 1 for n in _desired(timeline, 600, 660)), (_desired(timeline, 600, 660), right)
    assert not math.isnan(cap["scale"])


def test_a_pessimistic_profile_from_a_cold_start_is_raised_within_ten_minutes(
        world: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    """From one replica the backlog of the first minute scales the fleet to its maximum, and the
    probe can only begin once that fleet has shrunk, about four minutes in. On eight replicas or
    more it then runs one replica ahead of the fleet through the scale-down windows that follow
    (``capacity.FAR_PROBE_MIN_REPLICAS``), which brings a 2 x pessimistic profile within 15 % of
    the true capacity by 10 minutes: measured in this module's world through ``tidegate
    simulate``, 0.91 x at 600 s, within 15 % from 475 s (0.90 x from 560 s at dde108b, which ran
    further ahead only on calm minutes banked while the fleet was held far above its size; 0.82 x
    at 600 s before that), and the fleet then within one replica of the right profile's."""
    cap, timeline, true_tok = _run(world, 0.5, capsys)
    right_cap, right_timeline, _ = _run(world, 1.0, capsys)
    assert cap["log"][0][1] == pytest.approx(0.5 * true_tok, rel=0.02)
    assert 0.85 * true_tok <= _at(cap["log"], 600.0) <= 1.15 * true_tok
    right = max(_desired(right_timeline, 540, 660))
    assert all(abs(n - right) <= 1 for n in _desired(timeline, 600, 660)), (_desired(timeline, 600, 660), right)


def test_an_optimistic_profile_from_a_cold_start_is_never_raised(
        world: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    """The same cold start with a 2 x optimistic profile: the learned value never rises above the
    profile, not even in the first seconds, when one replica faces the whole load and the smoothed
    pressure has not caught up with the backlog yet (calm is not read while the tick's own
    pressure is high; before, it rose to 2.08 x in the first 25 s once the simulated request rate
    stopped under-reading its first window). Measured in this module's world through ``tidegate
    simulate``: 0.68 x at 300 s, pressure bounded by what the one replica served, then within 15 %
    from 395 s, 0.89 x at 600 s; at dde108b 1.37 x at 300 s and 1.05 x from 545 s, which on trace
    seeds 2-6 stayed at 1.34-1.44 x."""
    cap, _, true_tok = _run(world, 2.0, capsys)
    assert max(row[1] for row in cap["log"]) <= 2.0 * true_tok * 1.001
    assert _at(cap["log"], 300.0) <= 1.45 * true_tok
    assert _at(cap["log"], 600.0) <= 1.15 * true_tok


def test_a_fleet_held_above_by_a_burst_does_not_learn_past_the_true_capacity(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 2 x pessimistic profile, warm, and a two-minute burst at three times the rate (minutes 5-7)
    that scales the fleet up and, with a five-minute scale-down window, holds it far above its size
    for minutes: what the learner reaches over 25 minutes stays within 15 % of the true capacity
    (measured through ``tidegate simulate`` on this test's trace, fleet and policy: at most
    1.09 x, reached after the burst, at 1485 s)."""
    rng = np.random.default_rng(1)
    dur = 1500.0
    t = np.concatenate([rng.uniform(0, dur, int(RATE_PER_S * dur)), rng.uniform(300.0, 420.0, int(60.0 * 120))])
    trace = _write_trace(tmp_path / "burst.csv", np.sort(t), rng)
    policy = _write_policy(tmp_path / "policy.yaml", scale_down_s=300)
    assert simulate_main(["--trace", str(trace), "--fleet", str(_fleet(tmp_path, 1, 1)), "--print-capacity"]) == 0
    row = dict(kv.split("=") for kv in capsys.readouterr().out.split("\n")[0].split())
    true_tok, true_req = float(row["output_tokens_per_s_at_slo"]), float(row["requests_per_s_at_slo"])
    out = tmp_path / "out"
    assert simulate_main(["--trace", str(trace), "--fleet", str(_fleet(tmp_path, true_tok * 0.5, true_req * 0.5)),
                          "--policy", str(policy), "--out", str(out), "--json", "--no-progress",
                          "--initial-replicas", str(math.ceil(RATE_PER_S / (0.8 * true_req)))]) == 0
    capsys.readouterr()
    doc = json.loads((out / "results.json").read_text())
    log = doc["runs"][0]["capacity"]["log"]
    assert max(_desired(doc["timelines"]["tidegate"], 300, 420)) >= 2 * min(_desired(doc["timelines"]["tidegate"], 0, 60))
    assert max(row[1] for row in log) <= 1.15 * true_tok, max(row[1] for row in log) / true_tok


# ------------------------------------------------------------------------ per (model, GPU type)


def _serve_alone(state: dict, gpu: str, true_scale: float, t0: float, minutes: float,
                 load_rps: float = 20.0) -> tuple[dict, float]:
    """A fleet on ``gpu`` alone, sized every 5 s from the capacity learned for it (at the planned
    0.8) with at least four replicas; a replica really sustains ``true_scale`` x its prior (2 req/s).
    Its pressure is the queue per replica (M/M/1 at the utilization the true capacity gives) over
    a target of 4, as the pipeline reads it. Returns the state and the time."""
    t = t0
    for _ in range(int(minutes * 12)):
        t += 5.0
        scale = learned_scale(state, gpu, CFG)
        n = max(4, math.ceil(load_rps / (0.8 * scale * CAP.requests_per_s)))
        rho = min(load_rps / n / (true_scale * CAP.requests_per_s), 0.99)
        units, _ = load_units_by_gpu(state, CFG, {gpu: n}, {gpu: CAP}, load_rps, None)
        _, _, state = learn_by_gpu(state, Observed(t, None, n, True, 0, rho / (1 - rho) / 4), units, CFG, 0.8)
    return state, t


def test_two_gpu_types_of_different_speeds_learn_different_capacities() -> None:
    """The same profile for both, right for H200, twice too optimistic for H100: what the fleet
    learns while H100 serves does not change H200's capacity, and back on H100 it starts from
    what it learned there (one scale per model would carry each GPU type's into the other). In
    this queue model the learner settles where the queue starts to build (the pressure ratio,
    0.75, is reached at ~75 % of a replica's maximum): 70-100 % of the true capacity."""
    state, t = _serve_alone({}, "H100", 0.5, 0.0, 10.0)
    h100 = learned_scale(state, "H100", CFG)
    assert 0.35 <= h100 <= 0.5, h100
    assert learned_scale(state, "H200", CFG) == 1.0  # never served: its profile
    state, t = _serve_alone(state, "H200", 1.0, t, 10.0)
    h200 = learned_scale(state, "H200", CFG)
    assert 0.7 <= h200 <= 1.0, h200
    assert learned_scale(state, "H100", CFG) == pytest.approx(h100)  # no H100 ready: nothing learned about it
    state, _ = _serve_alone(state, "H100", 0.5, t, 10.0)
    assert 0.35 <= learned_scale(state, "H100", CFG) <= 0.5
    # a placement on both is sized with each GPU type's own capacity, weighted by its replicas
    caps = {g: for_mix(CAP, None, learned_scale(state, g, CFG)) for g in ("H100", "H200")}
    both = weighted(caps, {"H100": 4.0, "H200": 4.0})
    assert both.requests_per_s == pytest.approx((caps["H100"].requests_per_s + caps["H200"].requests_per_s) / 2)
    assert caps["H200"].requests_per_s > 1.5 * caps["H100"].requests_per_s
    # /v1/status shows each GPU type's correction
    assert gpu_scales(state) == {g: pytest.approx(learned_scale(state, g, CFG)) for g in ("H100", "H200")}


def test_a_gpu_type_with_few_replicas_beside_another_does_not_probe() -> None:
    """The pressure is the fleet's: one H200 replica beside nine H100 ones barely shows in it, so
    calm minutes say nothing of what H200 sustains. A GPU type probes up only with
    PROBE_MIN_REPLICAS ready replicas of its own while others serve too (it still comes back to its
    profile, and falls with the fleet). Probing on the fleet's calm, with H100 held under the load
    it saw pressure at, H200 rose from 1.43 to the 4.0 cap in 25 minutes on a day of long prompts
    (bench/day_traces.py --training); on a conversation day a fleet sized with such a scale dropped
    every cloud replica in one tick and ordered them back within four."""
    state: dict = {"t": 0.0, "q": 0.2, "n": 10,
                   "gpus": {"H100": {"scale": 0.76, "hi": 0.77, "hi_t": 0.0}, "H200": {"scale": 1.43, "hi": None, "hi_t": None}}}
    priors = {"H100": CAP, "H200": CAP}
    t = 0.0
    for _ in range(25 * 12):
        t += 5.0
        s100, s200 = learned_scale(state, "H100", CFG), learned_scale(state, "H200", CFG)
        ready = {"H100": max(1, math.ceil((13.0 / (0.8 * CAP.requests_per_s) - s200) / s100)), "H200": 1}
        units, _ = load_units_by_gpu(state, CFG, ready, priors, 13.0, None)
        scales, evidence, state = learn_by_gpu(state, Observed(t, None, sum(ready.values()), True, 0, 0.2), units,
                                               CFG, 0.8, None, ready)
    assert scales["H200"] == pytest.approx(1.43) and "too few H200 replicas to probe" in evidence, (scales, evidence)
    # with PROBE_MIN_REPLICAS of its own it probes as the fleet does
    ready = {"H100": 6, "H200": PROBE_MIN_REPLICAS}
    state = {"t": 0.0, "q": 0.2, "n": 10, "gpus": {"H100": {"scale": 1.0, "hi": None, "hi_t": None},
                                                     "H200": {"scale": 1.0, "hi": None, "hi_t": None}}}
    units, _ = load_units_by_gpu(state, CFG, ready, priors, 0.8 * 2.0 * 9.6, None)
    scales, _, _ = learn_by_gpu(state, Observed(5.0, None, 10, True, 0, 0.2), units, CFG, 0.8, None, ready)
    assert scales["H200"] > 1.0 and scales["H100"] > 1.0


def test_a_state_from_before_the_per_gpu_learner_applies_to_every_gpu_type() -> None:
    old = {"scale": 0.6, "t": 0.0, "q": 0.1}
    assert learned_scale(old, "H100", CFG) == learned_scale(old, "H200", CFG) == 0.6
    units, _ = load_units_by_gpu(old, CFG, {"H100": 4}, {"H100": CAP}, 4.0, None)
    scales, _, new = learn_by_gpu(old, Observed(5.0, None, 4, True, 0, 0.6), units, CFG, 0.8)
    assert set(new["gpus"]) == {"H100"} and new["gpus"]["H100"]["scale"] == scales["H100"]
    assert scales["H100"] == pytest.approx(0.6, rel=0.05)  # it went on from the model's old scale
    assert learned_scale(new, "H200", CFG) == 1.0  # from now on each GPU type keeps its own
