"""The yardstick: the hindsight plan is the cheapest schedule (checked against brute force on tiny
instances), never below the relaxed bound and never dearer than a run that reaches its attainment;
no run reaches the plan's attainment for less than the bound at that attainment, which grows with
it from the floor to the full-demand bound; every controller starts from the same state; frontiers
dominate as defined; the adversarial traces are seeded; ``--trace-start`` keeps an idle lead."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.sim.adversarial import ADVERSARIES, write_azure_csv
from controller.sim.baselines import BASELINES, BaselineSettings, make_controller
from controller.sim.engine import simulate
from controller.sim.frontier import KNOBS, dominates, knob_controller
from controller.sim.hindsight import (HindsightController, PlanPool, cheapest_fill, relaxed_bound_usd, schedule,
                                      solve_plan, unserved_penalty)
from controller.sim.workload import read_azure_trace
from tests.unit import simulator_fixtures as F

# ---------------------------------------------------------------------------------------------
# the integer program against brute force
# ---------------------------------------------------------------------------------------------


def _pool(name: str, per_node: int, rps: float, usd: float, lead: int, caps: list[int], init: int = 0) -> PlanPool:
    return PlanPool(name, per_node, rps, usd, lead, np.array(caps, dtype=np.int64), init, init * per_node)


def _brute_force(pools: list[PlanPool], demand: np.ndarray, min_replicas: int, max_replicas: int,
                 budget: float | None) -> float:
    """The least cost plus unserved penalty over every schedule of serving nodes, each billed the
    way a node that serves at ``t + j`` (``j <= lead``) must already be held at ``t`` (ordered one
    lead before it serves); only initial nodes serve before their pool's first lead."""
    n = len(demand)
    penalty = unserved_penalty(pools)
    ranges = [range(int(p.cap_nodes[t]) + 1) for p in pools for t in range(n)]
    best = np.inf
    for flat in itertools.product(*ranges):
        x = np.array(flat).reshape(len(pools), n)
        cost = 0.0
        ok = True
        held = np.zeros((len(pools), n), dtype=np.int64)
        for i, p in enumerate(pools):
            for t in range(n):
                if t < p.lead and x[i, t] > p.init_nodes:
                    ok = False
                held[i, t] = max(x[i, t: min(n, t + p.lead + 1)])
                if held[i, t] > p.cap_nodes[t]:
                    ok = False
        if not ok:
            continue
        for t in range(n):
            if sum(p.per_node * held[i, t] for i, p in enumerate(pools)) > max_replicas:
                ok = False
            if sum(p.per_node * x[i, t] for i, p in enumerate(pools)) < min_replicas:
                ok = False
            if budget is not None and sum(p.usd_per_interval * held[i, t] for i, p in enumerate(pools)) > budget + 1e-9:
                ok = False
        if not ok:
            continue
        for t in range(n):
            served = sum(p.rps_per_node * x[i, t] for i, p in enumerate(pools))
            cost += penalty * max(0.0, demand[t] - served)
            cost += sum(p.usd_per_interval * held[i, t] for i, p in enumerate(pools))
        best = min(best, cost)
    return best


def _objective(pools: list[PlanPool], demand: np.ndarray, nodes: dict[str, np.ndarray], unserved: np.ndarray) -> float:
    return float(sum(p.usd_per_interval * nodes[p.name].sum() for p in pools) + unserved_penalty(pools) * unserved.sum())


@settings(max_examples=25, deadline=None)
@given(demand=st.lists(st.sampled_from([0.0, 1.0, 2.5, 4.0, 6.0]), min_size=4, max_size=4),
       lead=st.integers(1, 2), cloud_cap=st.lists(st.integers(0, 2), min_size=4, max_size=4),
       budget=st.sampled_from([None, 9.0]), max_replicas=st.sampled_from([3, 8]))
def test_the_program_finds_the_brute_force_optimum(demand: list[float], lead: int, cloud_cap: list[int],
                                                   budget: float | None, max_replicas: int) -> None:
    # on-prem: one node of two replicas, already running; cloud: a pricier node of one replica
    pools = [_pool("onprem", 2, 2.0, 1.0, 1, [1, 1, 1, 1], init=1),
             _pool("cloud", 1, 1.5, 3.0, lead, cloud_cap)]
    d = np.array(demand)
    nodes, _, unserved, status = schedule(pools, d, min_replicas=1, max_replicas=max_replicas,
                                          budget_per_interval=budget)
    assert all("Optimal" in s for s in status), status
    assert _objective(pools, d, nodes, unserved) == pytest.approx(_brute_force(pools, d, 1, max_replicas, budget),
                                                                  rel=1e-6, abs=1e-6)


def test_a_node_ordered_now_serves_one_lead_later() -> None:
    # demand only in the last interval: the cloud node is ordered exactly `lead` intervals ahead
    pools = [_pool("cloud", 1, 1.0, 1.0, 2, [1] * 5)]
    nodes, orders, unserved, _ = schedule(pools, np.array([0, 0, 0, 0, 1.0]), min_replicas=0, max_replicas=4,
                                          budget_per_interval=None)
    assert list(orders["cloud"]) == [0, 0, 1, 0, 0]
    assert list(nodes["cloud"]) == [0, 0, 1, 1, 1]
    assert unserved.sum() == pytest.approx(0.0)


# ---------------------------------------------------------------------------------------------
# the plan in the simulator: relaxed bound <= plan <= any run that reaches its attainment
# ---------------------------------------------------------------------------------------------


def _ramp(n: int, lo: float, hi: float) -> list[float]:
    r = F.rate_at_slo()
    return [r * (lo + (hi - lo) * min(1.0, 2 * i / n)) for i in range(n)]


def _planned(su, *, min_replicas: int):  # type: ignore[no-untyped-def]
    """(setup, the hindsight plan for it, the plan's run summary), with at most 16 replicas."""
    plan = solve_plan(su, min_replicas=min_replicas, max_replicas=16, max_cost_per_hour_usd=None)
    hs = simulate(su, HindsightController(min_replicas=min_replicas, max_replicas=16, max_cost_per_hour_usd=None,
                                          plan=plan)).summary
    return su, plan, hs


@pytest.fixture(scope="module")
def small_world():  # type: ignore[no-untyped-def]
    su = F.setup(F.rate_series(_ramp(40, 1.0, 6.0)), mode="fluid", seed=2, initial_replicas=2)
    plan = solve_plan(su, min_replicas=2, max_replicas=16, max_cost_per_hour_usd=None)
    return su, plan


def test_the_plan_is_never_below_the_relaxed_bound(small_world) -> None:  # type: ignore[no-untyped-def]
    su, plan = small_world
    bound = relaxed_bound_usd(su, plan, min_replicas=2)
    assert 0 < bound <= plan.cost_usd
    res = simulate(su, HindsightController(min_replicas=2, max_replicas=16, max_cost_per_hour_usd=None, plan=plan))
    assert res.summary["slo_attainment"] >= 0.97  # it serves the ramp (the demand model is not exact)
    assert res.summary["cost_usd"] >= bound
    # the simulated run costs what the plan says it costs (nodes billed from order to release)
    assert res.summary["cost_usd"] == pytest.approx(plan.cost_usd, rel=0.05)


def test_no_run_reaches_the_plans_attainment_for_less(small_world) -> None:  # type: ignore[no-untyped-def]
    su, plan = small_world
    hs = simulate(su, HindsightController(min_replicas=2, max_replicas=16, max_cost_per_hour_usd=None,
                                          plan=plan)).summary
    pol = F.policy(min_replicas=2, max_replicas=16)
    base = BaselineSettings(min_replicas=2, max_replicas=16)
    for name, (_, values) in KNOBS.items():
        for v in (values[0], values[-1]):
            s = simulate(su, knob_controller(name, v, su, pol, base)).summary
            if s["slo_attainment"] >= hs["slo_attainment"]:
                assert s["cost_usd"] >= hs["cost_usd"] * 0.98, (name, v, s["cost_usd"], hs["cost_usd"])


# ---------------------------------------------------------------------------------------------
# the relaxed bound at the plan's attainment
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def overloaded_world():  # type: ignore[no-untyped-def]
    """Five minutes at sixteen replicas' worth of load from the on-prem node's four: every run, the
    plan too, meets the SLO for the first few requests and no more (no cloud node is ready before
    the queue has grown)."""
    r = F.rate_at_slo()
    su = F.setup(F.step_trace(0.0, 300.0, 16 * r, 16 * r), mode="requests", initial_replicas=4)
    return _planned(su, min_replicas=4)


def test_at_a_low_attainment_no_run_reaches_it_for_less_than_the_bound(overloaded_world) -> None:  # type: ignore[no-untyped-def]
    su, plan, hs = overloaded_world
    a = hs["slo_attainment"]
    assert a < 0.05
    bound = relaxed_bound_usd(su, plan, min_replicas=4, attainment=a)
    full = relaxed_bound_usd(su, plan, min_replicas=4)
    assert 0 < bound <= hs["cost_usd"]
    pol = F.policy(min_replicas=4, max_replicas=16)
    base = BaselineSettings(min_replicas=4, max_replicas=16)
    reached = []
    for name, (_, values) in KNOBS.items():
        for v in (values[0], values[-1]):
            s = simulate(su, knob_controller(name, v, su, pol, base)).summary
            if s["slo_attainment"] >= a:
                reached.append((name, v, s["cost_usd"]))
                assert s["cost_usd"] >= bound - 1e-6, (name, v, s["cost_usd"], bound)
    assert reached
    # the world is the one where serving the whole demand was no bound: a run got there for less
    assert min(c for _, _, c in reached) < full, (reached, full)


def _floor_only_usd(su, plan, min_replicas: int) -> float:  # type: ignore[no-untyped-def]
    """``min_replicas`` replicas at the cheapest replica price over the span (the fixtures' pools
    hold them in every interval)."""
    per_interval = min(p.usd_per_interval / p.per_node for p in plan.pools) * min_replicas
    return per_interval * su.span_s / plan.interval_s


@pytest.mark.parametrize("world, min_replicas", [("small_world", 2), ("overloaded_world", 4)])
def test_the_bound_grows_with_the_attainment_from_the_floor_to_the_full_demand_bound(
        world: str, min_replicas: int, request: pytest.FixtureRequest) -> None:
    got = request.getfixturevalue(world)
    su, plan = got[0], got[1]
    full = relaxed_bound_usd(su, plan, min_replicas=min_replicas)
    floor = _floor_only_usd(su, plan, min_replicas)
    grid = np.linspace(0.0, 1.0, 41)
    bounds = [relaxed_bound_usd(su, plan, min_replicas=min_replicas, attainment=float(a)) for a in grid]
    assert all(b2 >= b1 - 1e-9 for b1, b2 in zip(bounds, bounds[1:])), bounds
    assert all(floor - 1e-9 <= b <= full + 1e-9 for b in bounds), (floor, full, bounds)
    # a share the floor serves by itself costs the floor and nothing more ...
    assert relaxed_bound_usd(su, plan, min_replicas=min_replicas, attainment=1e-4) == pytest.approx(floor, rel=1e-9)
    # ... and every request costs more than the floor
    assert bounds[-1] > floor * 1.01
    # without an attainment it is the full-demand bound as before
    assert relaxed_bound_usd(su, plan, min_replicas=min_replicas, attainment=None) == full


def test_near_full_attainment_the_bound_is_close_to_the_full_demand_bound(small_world) -> None:  # type: ignore[no-untyped-def]
    # the plan serves the whole ramp here: serving all of it and serving the demand are one thing
    su, plan = small_world
    assert plan.unserved_rps.sum() == pytest.approx(0.0, abs=1e-9)
    full = relaxed_bound_usd(su, plan, min_replicas=2)
    assert relaxed_bound_usd(su, plan, min_replicas=2, attainment=1.0) >= 0.98 * full
    assert relaxed_bound_usd(su, plan, min_replicas=2, attainment=0.5) < 0.8 * full


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 4), p=st.integers(1, 3), data=st.data())
def test_the_cheapest_fill_is_the_linear_programs_optimum(n: int, p: int, data: st.DataObject) -> None:
    from scipy.optimize import linprog

    price = np.array(data.draw(st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]), min_size=n * p,
                                        max_size=n * p))).reshape(n, p)
    caps = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.5, 4.0]), min_size=n * p,
                                       max_size=n * p))).reshape(n, p)
    room = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 3.0, 10.0]), min_size=n, max_size=n)))
    servable = float(np.minimum(caps.sum(axis=1), room).sum())
    amount = data.draw(st.floats(0.0, servable + 2.0))
    got = cheapest_fill(price, caps, room, amount)
    # y[i, p] >= 0 served by pool p in interval i: y <= caps, sum_p y[i] <= room[i], sum y >= amount
    a_ub = np.vstack([np.kron(np.eye(n), np.ones((1, p))), -np.ones((1, n * p))])
    b_ub = np.concatenate([room, [-min(amount, servable)]])
    lp = linprog(price.ravel(), A_ub=a_ub, b_ub=b_ub, bounds=list(zip(np.zeros(n * p), caps.ravel())))
    assert lp.status == 0
    assert got == pytest.approx(lp.fun, rel=1e-7, abs=1e-6)  # HiGHS solves to its own tolerances (1e-7)
    # more requests never cost less
    assert cheapest_fill(price, caps, room, amount + 1.0) >= got - 1e-12


# ---------------------------------------------------------------------------------------------
# equal terms
# ---------------------------------------------------------------------------------------------


def test_every_controller_starts_from_the_same_state() -> None:
    r = F.rate_at_slo()
    su = F.setup(F.rate_series([r * 8.0] * 3), mode="fluid", duration_s=120.0, initial_replicas=3)
    pol = F.policy(min_replicas=3, max_replicas=16)
    base = BaselineSettings(min_replicas=3, max_replicas=16)
    ctrls = [make_controller(n, su, pol, base) for n in ("tidegate", *BASELINES)]
    ctrls.append(HindsightController(min_replicas=3, max_replicas=16, max_cost_per_hour_usd=None))
    starts = {}
    for c in ctrls:
        tl = simulate(su, c).timeline
        starts[c.name] = {p: (tl[f"desired:{p}"][0], tl[f"ready:{p}"][0]) for p in su.model.pools}
    want = {p: ((3, 3) if p == "onprem" else (0, 0)) for p in su.model.pools}
    assert starts == dict.fromkeys(starts, want)


def test_seed_stack_stays_within_the_policys_bounds() -> None:
    r = F.rate_at_slo()
    su = F.setup(F.rate_series([r * 12.0] * 30), mode="fluid", initial_replicas=2)
    ctrl = make_controller("seed-stack", su, None, BaselineSettings(min_replicas=2, max_replicas=5,
                                                                    seed_queue_threshold=1.0))
    res = simulate(su, ctrl)
    totals = [sum(res.timeline[f"desired:{p}"][i] for p in su.model.pools) for i in range(len(res.timeline["t_s"]))]
    assert max(totals) == 5  # it does burst, and no further than max_replicas
    assert min(totals) >= 2


# ---------------------------------------------------------------------------------------------
# frontiers, adversarial traces, trace start
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ours, theirs, want", [
    ([(0.99, 10.0)], [(0.98, 12.0)], True),
    ([(0.99, 10.0)], [(0.995, 12.0)], False),           # theirs reaches more than any of ours
    ([(0.99, 13.0)], [(0.98, 12.0)], False),            # ours is dearer
    ([(0.95, 5.0), (0.999, 20.0)], [(0.97, 8.0)], False),
    ([(0.95, 5.0)], [(0.85, 1.0)], True),               # below 90 %: no operating point
    ([(0.97, 8.0)], [(0.97, 8.0)], True),               # equal is enough
])
def test_dominance(ours: list[tuple[float, float]], theirs: list[tuple[float, float]], want: bool) -> None:
    pts = lambda xs: [{"attainment": a, "cost": c} for a, c in xs]  # noqa: E731
    assert dominates(pts(ours), pts(theirs)) is want


def test_adversarial_traces_are_seeded_and_have_their_shapes() -> None:
    for name, make in ADVERSARIES.items():
        a, b, c = make(0), make(0), make(1)
        assert np.array_equal(a.trace.arrival_s, b.trace.arrival_s), name
        assert not np.array_equal(a.trace.arrival_s[:100], c.trace.arrival_s[:100]), name
    idle = ADVERSARIES["idle-burst"](0).trace
    per_min = idle.rate_per_s(60.0)
    assert per_min[:60].max() < 0.05 * per_min.max()  # an hour of near silence, then the burst
    long_p = ADVERSARIES["long-prompts"](0).trace
    long_a = ADVERSARIES["long-answers"](0).trace
    assert long_p.prompt_tokens.mean() > 20 * long_p.output_tokens.mean()
    assert long_a.output_tokens.mean() > 2 * long_a.prompt_tokens.mean()
    steady = ADVERSARIES["steady"](0).trace.rate_per_s(60.0)
    assert steady.min() > 0.8 * steady.max()  # no minute stands out: one size fits the hour
    step = ADVERSARIES["step-up"](0).trace.rate_per_s(60.0)
    low, high, after = step[1:29], step[31:59], step[61:89]
    assert high.min() > 2 * max(low.max(), after.max())  # a lasting step, then back down
    day = ADVERSARIES["diurnal"](0)
    per_min = day.trace.rate_per_s(60.0)
    peak = per_min[40:50].mean()
    assert per_min[:10].mean() < 0.5 * peak and per_min[-10:].mean() < 0.5 * peak  # up and back down
    assert day.trace.output_tokens.mean() > 0.2 * day.trace.prompt_tokens.mean()  # conversation: long answers
    burst = ADVERSARIES["bursty"](0)
    gaps = np.diff(burst.trace.arrival_s)
    assert gaps.std() / gaps.mean() > 2.5  # far burstier than Poisson (1)
    rate = burst.trace.rate_per_s(60.0)
    assert rate[30:60].mean() > 1.4 * rate[:30].mean()
    square = ADVERSARIES["square-wave"](0)
    per_min = square.trace.rate_per_s(60.0)
    busy, quiet = per_min[[m for m in range(60) if m % 10 < 5]], per_min[[m for m in range(60) if m % 10 >= 5]]
    assert busy.min() > 10 * quiet.max()  # five minutes at the peak, five at a twentieth, six times
    assert day.shared_spot and burst.shared_spot and square.shared_spot and not ADVERSARIES["steady"](0).shared_spot


def test_trace_start_keeps_the_idle_lead(tmp_path: Path) -> None:
    trace = ADVERSARIES["idle-burst"](0).trace
    late = trace.window(600.0, trace.duration_s + 1)  # the first request ~10 minutes after the origin
    path = write_azure_csv(type(late)("late", late.arrival_s + 600.0, late.prompt_tokens, late.output_tokens),
                           tmp_path / "late.csv", "2024-01-01T00:00:00")
    first = float(read_azure_trace(path).arrival_s[0])
    kept = read_azure_trace(path, start=np.datetime64("2024-01-01T00:00:00", "ns"))
    assert first == 0.0
    assert kept.arrival_s[0] >= 600.0
    with pytest.raises(ValueError, match="after its first request"):
        read_azure_trace(path, start=np.datetime64("2024-01-01T01:00:00", "ns"))


def test_every_baseline_keeps_the_policys_budget() -> None:
    r = F.rate_at_slo()
    su = F.setup(F.rate_series([r * 14.0] * 30), mode="fluid", initial_replicas=2)
    cap = 60.0  # on-prem (16/h) and a little cloud; 14 replicas' worth of load wants far more
    for name in ("hpa", "keda", "skyserve", "seed-stack"):
        base = BaselineSettings(min_replicas=2, max_replicas=16, keda_queue_threshold=2.0, seed_queue_threshold=1.0,
                                skyserve_target_qps=r, max_cost_per_hour_usd=cap)
        tl = simulate(su, make_controller(name, su, None, base)).timeline
        assert max(tl["cost_per_hour_usd"]) <= cap + 1e-6, name
        assert max(tl["cost_per_hour_usd"]) > 16.0, name  # it did scale out, up to the ceiling


# ---------------------------------------------------------------------------------------------
# long prompts: capacity as the gateway's replicas serve it
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_prompts():  # type: ignore[no-untyped-def]
    su = F.setup(F.long_prompt_trace(2.2, 1200.0), mode="requests", own_mix=True, initial_replicas=4)
    return _planned(su, min_replicas=2)


def test_long_prompts_a_pool_sustains_more_per_replica_than_a_lone_replica(long_prompts) -> None:  # type: ignore[no-untyped-def]
    su, plan, hs = long_prompts
    lone = su.rate_at_slo("H100")
    assert 2.2 / lone > 20  # lone replicas (each its own queue) would need 20+ for 2.2 req/s
    # behind the gateway the on-prem node's four and at most two more keep the SLO
    ready = sum(plan.ready_nodes[p.name] * p.per_node for p in plan.pools)
    assert ready.max() <= 6 and plan.nodes["aws-od"].max() == 0
    assert hs["slo_attainment"] >= 0.99


def test_long_prompts_the_plan_keeps_the_slo_between_the_bound_and_every_run(long_prompts) -> None:  # type: ignore[no-untyped-def]
    su, plan, hs = long_prompts
    bound = relaxed_bound_usd(su, plan, min_replicas=2)
    assert 0 < bound <= plan.cost_usd
    assert hs["slo_attainment"] >= 0.99
    assert hs["cost_usd"] == pytest.approx(plan.cost_usd, rel=0.05)
    pol = F.policy(min_replicas=2, max_replicas=16)
    base = BaselineSettings(min_replicas=2, max_replicas=16)
    reached = 0
    for name, (_, values) in KNOBS.items():
        for v in (values[0], values[-1]):
            s = simulate(su, knob_controller(name, v, su, pol, base)).summary
            if s["slo_attainment"] >= hs["slo_attainment"]:
                reached += 1
                # the bench's check (bench/decision_quality.py exits 1 when it fails) ...
                assert s["cost_usd"] >= bound - 1e-6, (name, v, s["cost_usd"], bound)
                # ... and the plan is the cheapest way there, within the demand model's slack
                assert s["cost_usd"] >= hs["cost_usd"] * 0.95, (name, v, s["cost_usd"], hs["cost_usd"])
    assert reached  # some controller does reach the plan's attainment: the checks above ran
