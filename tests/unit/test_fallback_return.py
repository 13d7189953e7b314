"""The fallback return (``placement.return_from_fallback``, SkyServe's dynamic fallback): on-demand
replicas go back to cheaper capacity make before break. Replacements are ordered above the total
on pools that take replicas again, the on-demand replicas serve on, and the same number goes once
the replacements serve; only in steps that empty whole on-demand nodes for less than they cost,
within the budget, ``max_total`` and the lead-time cloud ceiling.

A fleet like the benchmark's, at TP 2: an on-prem node of 4 replicas ($16/h), GCP spot nodes of
one replica ($7.50/h), AWS spot nodes of 4 ($25.30/h), AWS on-demand nodes of 4 ($84.80/h)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.model import History, PoolState
from controller.core.placement import SPARE_STATE_KEY, PlacementResult, place
from controller.core.pricing import placement_cost
from controller.core.reasons import Reason
from controller.core.spec import Placement
from controller.sim.baselines import TidegateController
from controller.sim.engine import simulate
from controller.sim.spot import SpotModel, SpotTrace
from tests.unit import simulator_fixtures as F
from tests.unit import test_pipeline as tp
from tests.unit.test_placement import AWS_OD, AWS_SPOT, GCP_SPOT, ONPREM, fleet, model_for, pool, states

FLEET = fleet(
    pool("onprem", ONPREM, 16.0, gpus=8, nodes=1),
    pool("gcp-spot", GCP_SPOT, 7.5, gpus=2, nodes=8),
    pool("aws-od", AWS_OD, 84.8, gpus=8, nodes=4),
)
ONE = Placement(spot_spread_min_pools=1)
FALLBACK = Reason.FALLBACK_RETURN.value


def run(current: dict[str, int], total: int, *, pools=FLEET, spec: Placement = ONE, ready: dict[str, int] | None = None,
        extra: dict | None = None, **kw) -> PlacementResult:
    """``place`` at TP 2 with ``current`` replicas, all ready unless ``ready`` says otherwise."""
    extra = {k.replace("-", "_"): v for k, v in (extra or {}).items()}
    for name, n in (ready or {}).items():
        extra.setdefault(name.replace("-", "_"), {})["ready_replicas"] = n
    sts = states({n: current.get(n, 0) for n in pools}, **extra)
    return place(model=model_for(pools, tp=2), pools=pools, states=sts, total=total, placement=spec, **kw)


def events(res: PlacementResult) -> list[str]:
    return [msg for code, msg in res.events if code == FALLBACK]


# -- place: ordering, releasing ----------------------------------------------------------------------

def test_replacements_are_ordered_on_spot_above_the_total_and_on_demand_keeps_serving() -> None:
    res = run({"onprem": 4, "aws-od": 4}, 8)
    assert res.replicas == {"onprem": 4, "gcp-spot": 4, "aws-od": 4}
    assert (res.return_spare, res.spare, res.total) == (4, 4, 12)
    assert res.reason == FALLBACK
    # 4 GCP nodes ($30/h) for the on-demand node ($84.80/h)
    assert events(res) == ["fallback return: 4 replacements ordered on gcp-spot for aws-od "
                           "(saves $54.80/h once ready: $84.80/h of on-demand for $30.00/h)"]
    # off: the on-demand replicas stay where they are
    off = run({"onprem": 4, "aws-od": 4}, 8, spec=Placement(spot_spread_min_pools=1, return_from_fallback=False))
    assert off.replicas == {"onprem": 4, "gcp-spot": 0, "aws-od": 4} and off.return_spare == 0 and not events(off)


def test_while_the_replacements_start_the_placement_holds_them_and_the_on_demand_replicas() -> None:
    # the next decision: the replacements are there, not ready; nothing serving is removed
    res = run({"onprem": 4, "gcp-spot": 4, "aws-od": 4}, 8, ready={"gcp-spot": 0}, returning=4)
    assert res.replicas == {"onprem": 4, "gcp-spot": 4, "aws-od": 4} and res.return_spare == 4
    assert res.return_released == 0 and not any("released" in m for m in events(res))


def test_replacements_ready_release_as_many_on_demand_and_the_total_is_the_demand_again() -> None:
    res = run({"onprem": 4, "gcp-spot": 4, "aws-od": 4}, 8, returning=4)
    assert res.replicas == {"onprem": 4, "gcp-spot": 4, "aws-od": 0}
    assert (res.return_spare, res.return_released, res.total) == (0, 4, 8)
    assert events(res) == ["fallback return: released 4 on aws-od (replacements ready)"]
    assert res.reason == FALLBACK
    # half of them ready: two on-demand replicas go, two more replacements are held for the rest
    half = run({"onprem": 4, "gcp-spot": 4, "aws-od": 4}, 8, ready={"gcp-spot": 2}, returning=4)
    assert half.replicas == {"onprem": 4, "gcp-spot": 4, "aws-od": 2}
    assert (half.return_released, half.return_spare) == (2, 2)
    # the demand fell by 4 while nothing was ready: the replacements are cancelled, the 4
    # on-demand replicas that go are no release, and the 4 left get replacements again
    fell = run({"onprem": 4, "gcp-spot": 4, "aws-od": 8}, 8, ready={"gcp-spot": 0}, returning=4)
    assert fell.replicas == {"onprem": 4, "gcp-spot": 4, "aws-od": 4} and fell.return_released == 0


def test_an_on_demand_pool_still_starting_replicas_is_left_alone() -> None:
    # they were just ordered because the cheaper pools could not take them (a spot pool whose
    # launches fail reads available again at once): no replacements until they serve
    res = run({"onprem": 4, "aws-od": 4}, 8, ready={"aws-od": 3})
    assert res.replicas == {"onprem": 4, "gcp-spot": 0, "aws-od": 4} and res.return_spare == 0


def test_a_spot_pool_still_starting_replicas_is_no_target() -> None:
    # an order beyond what the cloud has left would mark it unavailable, and its replicas still
    # starting (for the demand) would be dropped with the replacements
    res = run({"onprem": 4, "gcp-spot": 2, "aws-od": 4}, 10, ready={"gcp-spot": 1})
    assert res.replicas == {"onprem": 4, "gcp-spot": 2, "aws-od": 4} and res.return_spare == 0
    # once they serve, the pool takes replacements
    assert run({"onprem": 4, "gcp-spot": 2, "aws-od": 4}, 10).return_spare == 4


def test_replacements_that_can_no_longer_start_leave_the_serving_on_demand_replicas_alone() -> None:
    # the spot pool turned unavailable (its launches failed): its replacements, not ready, go;
    # the on-demand replicas serve on, none is ordered again
    res = run({"onprem": 4, "gcp-spot": 4, "aws-od": 4}, 8, ready={"gcp-spot": 0}, returning=4,
              extra={"gcp-spot": {"available": False}})
    assert res.replicas == {"onprem": 4, "gcp-spot": 0, "aws-od": 4}
    assert (res.return_spare, res.return_released) == (0, 0)


# -- place: only when it saves money -----------------------------------------------------------------

def test_no_saving_no_migration() -> None:
    # a new spot node costs more than the on-demand node it would empty
    dear = fleet(pool("spot", AWS_SPOT, 90.0, gpus=8, nodes=2), pool("od", AWS_OD, 84.8, gpus=8, nodes=2))
    assert run({"od": 4}, 4, pools=dear).return_spare == 0
    # four one-replica nodes at $25 each ($100/h) for an $84.80 node: dearer by whole nodes
    small = fleet(pool("spot", GCP_SPOT, 25.0, gpus=2, nodes=8), pool("od", AWS_OD, 84.8, gpus=8, nodes=2))
    assert run({"od": 4}, 4, pools=small).return_spare == 0
    # room for 3 of the node's 4: the node would not empty, nothing is saved
    tight = fleet(pool("spot", GCP_SPOT, 7.5, gpus=2, nodes=3), pool("od", AWS_OD, 84.8, gpus=8, nodes=2))
    assert run({"od": 4}, 4, pools=tight).return_spare == 0


def test_steps_empty_whole_nodes_fewest_held_first_and_free_slots_cost_nothing() -> None:
    # 6 on-demand replicas on two nodes (4 + 2), spot room for 3: the node holding 2 empties
    # (2 replacements), the full one would need 4
    pools = fleet(pool("spot", GCP_SPOT, 7.5, gpus=2, nodes=3), pool("od", AWS_OD, 84.8, gpus=8, nodes=2))
    res = run({"od": 6}, 6, pools=pools)
    assert res.replicas == {"spot": 2, "od": 6} and res.return_spare == 2
    # a replica on a node already paid for is free: an on-prem node with one replica has 3 free
    # slots, where the on-demand pool's last replica moves at no cost even at a steep on-prem price
    dear_onprem = fleet(pool("onprem", ONPREM, 500.0, gpus=8, nodes=1), pool("od", AWS_OD, 84.8, gpus=8, nodes=2))
    res = run({"onprem": 1, "od": 1}, 2, pools=dear_onprem)
    assert res.replicas == {"onprem": 2, "od": 1} and "for $0.00/h" in events(res)[0]


def test_the_budget_must_hold_the_overlap() -> None:
    now = placement_cost(model_for(FLEET, tp=2), FLEET, {}, {"onprem": 4, "aws-od": 4})  # $100.80/h
    assert run({"onprem": 4, "aws-od": 4}, 8, max_cost_per_hour_usd=now + 29.0).return_spare == 0
    fits = run({"onprem": 4, "aws-od": 4}, 8, max_cost_per_hour_usd=now + 30.0)
    assert fits.return_spare == 4 and fits.cost_per_hour_usd <= now + 30.0 + 1e-9


# -- place: targets, pins, bounds ----------------------------------------------------------------------

@pytest.mark.parametrize("why, extra, kw", [
    ("interruption notices", {"gcp-spot": {"interrupted_replicas": 1}}, {}),
    ("over max_recent_interruptions", {"gcp-spot": {"recent_interruptions": 4}}, {}),
    ("unavailable", {"gcp-spot": {"available": False}}, {}),
    ("drained", {}, {"drained": {"gcp-spot"}}),
    ("pinned", {}, {"pinned": {"gcp-spot": 1}}),
])
def test_a_pool_that_takes_no_new_replicas_is_no_target(why: str, extra: dict, kw: dict) -> None:
    res = run({"onprem": 4, "gcp-spot": 1, "aws-od": 4}, 9, extra=extra, **kw)
    # (a replica that has to leave gcp-spot goes to on-demand: the only pool with room left)
    assert res.replicas["gcp-spot"] <= 1 and res.return_spare == 0, why


def test_recently_interrupted_but_within_the_limit_is_a_target_unless_the_hedge_avoids_it() -> None:
    recent = {"gcp-spot": {"recent_interruptions": 3}}
    assert run({"onprem": 4, "aws-od": 4}, 8, extra=recent).return_spare == 4
    hedged = run({"onprem": 4, "aws-od": 4}, 8, extra=recent, spec=Placement(spot_spread_min_pools=1, spot_hedge=1.0))
    assert hedged.replicas["gcp-spot"] == 0 and hedged.return_spare == 0


def test_a_pinned_on_demand_pool_is_neither_trimmed_nor_replaced() -> None:
    res = run({"onprem": 4, "aws-od": 4}, 8, pinned={"aws-od": 4})
    assert res.replicas == {"onprem": 4, "gcp-spot": 0, "aws-od": 4} and res.return_spare == 0
    # pinned with replacements ready elsewhere: still not trimmed
    held = run({"onprem": 4, "gcp-spot": 4, "aws-od": 4}, 8, pinned={"aws-od": 4}, returning=4)
    assert held.replicas["aws-od"] == 4 and held.return_released == 0


def test_max_total_and_the_cloud_ceiling_bound_the_overlap() -> None:
    at_max = run({"onprem": 4, "aws-od": 4}, 8, max_total=8)
    assert at_max.return_spare == 0 and at_max.replicas["aws-od"] == 4
    assert run({"onprem": 4, "aws-od": 4}, 8, max_total=11).return_spare == 0  # a node needs 4
    assert run({"onprem": 4, "aws-od": 4}, 8, max_total=12).return_spare == 4
    # lead-time economics: the cloud pools hold at most max_cloud, replacements included
    assert run({"onprem": 4, "aws-od": 4}, 8, max_cloud=4).return_spare == 0
    # on-prem room is not cloud: replacements there fit under the ceiling
    room = fleet(pool("onprem", ONPREM, 16.0, gpus=8, nodes=2), pool("aws-od", AWS_OD, 84.8, gpus=8, nodes=4))
    res = run({"onprem": 4, "aws-od": 4}, 8, pools=room, max_cloud=4)
    assert res.replicas == {"onprem": 8, "aws-od": 4} and res.return_spare == 4


# -- property: make before break, within the cap ------------------------------------------------------

@st.composite
def worlds(draw: st.DrawFn):
    """A fleet whose total sits on on-demand, spot pools with room, a cap the start fits, and the
    readiness draws of a few decisions (which not-ready replicas become ready before each)."""
    per_node = draw(st.sampled_from([1, 2, 4]))
    pools = fleet(
        pool("onprem", ONPREM, draw(st.integers(0, 40)) / 2, gpus=2 * draw(st.sampled_from([1, 2, 4])),
             nodes=draw(st.integers(0, 1))),
        pool("spot-a", AWS_SPOT, draw(st.integers(1, 60)) / 2, gpus=2 * draw(st.sampled_from([1, 2, 4])),
             nodes=draw(st.integers(0, 4))),
        pool("spot-b", GCP_SPOT, draw(st.integers(1, 60)) / 2, gpus=2 * draw(st.sampled_from([1, 4])),
             nodes=draw(st.integers(0, 4))),
        pool("od-a", AWS_OD, draw(st.integers(20, 200)) / 2, gpus=2 * per_node, nodes=4),
        pool("od-b", AWS_OD, draw(st.integers(20, 200)) / 2, gpus=2 * per_node, nodes=4),
    )
    on_a = draw(st.integers(0, 4 * per_node))
    start = {"od-a": on_a, "od-b": draw(st.integers(1 if on_a == 0 else 0, 4 * per_node))}
    cost = placement_cost(model_for(pools, tp=2), pools, {}, start)
    cap = None if draw(st.booleans()) else cost + draw(st.integers(0, 200)) / 2
    spec = Placement(spot_spread_min_pools=draw(st.integers(1, 2)))
    # per decision, per pool: whether its replicas still starting are ready by then
    steps = draw(st.lists(st.lists(st.booleans(), min_size=len(pools), max_size=len(pools)), min_size=2, max_size=6))
    return pools, start, cap, spec, draw(st.integers(0, 8)), steps


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_prop_on_demand_goes_only_for_replacements_that_serve_and_the_cap_holds(world) -> None:
    pools, start, cap, spec, headroom, steps = world
    total = sum(start.values())
    model = model_for(pools, tp=2)
    replicas = {n: start.get(n, 0) for n in pools}
    ready = dict(replicas)
    returning = 0
    for became_ready in steps:
        ready = {n: replicas[n] if now else ready[n] for n, now in zip(pools, became_ready)}
        sts = {n: PoolState(n, replicas[n], ready_replicas=ready[n]) for n in pools}
        res = place(model=model, pools=pools, states=sts, total=total, placement=spec, max_cost_per_hour_usd=cap,
                    max_total=total + headroom, returning=returning)
        if cap is not None:
            assert res.cost_per_hour_usd <= cap + 1e-6
        assert res.total <= total + headroom and res.total - res.spare == total
        # what serves after the decision (a pool that shrinks drops its replicas still starting
        # first): a serving on-demand replica goes only for cheaper replicas that already serve
        kept = {n: min(ready[n], res.replicas[n]) for n in pools}
        od_gone = sum(ready[n] - kept[n] for n in ("od-a", "od-b"))
        if od_gone:
            assert sum(ready.values()) - od_gone >= total, (total, returning, replicas, ready, res.replicas)
            assert res.return_released == od_gone
        # nothing else that serves goes either, but for step 5's spread repair (one spot replica
        # moved to an empty spot pool, serving or not: placement's own rule, older than this one)
        moved = sum(1 for _, msg in res.events if msg.startswith("spot spread: moved"))
        assert sum(kept.values()) + moved >= min(total, sum(ready.values())), (replicas, ready, res.replicas)
        ready, replicas, returning = kept, dict(res.replicas), res.return_spare


# -- the pipeline: replacements are no demand -----------------------------------------------------------

def test_the_rules_see_the_replicas_without_the_replacements() -> None:
    # 4 on-prem + 2 on-demand serve the 6 the rule asks; spot-a has room: 2 replacements ordered.
    # A rule missing data with a hold keeps at least the current replicas: were the replacements
    # read as demand, the total would ratchet up tick after tick.
    pol = tp.policy(tp.fixed(6), tp.fixed(rule="gone", missing=True), tp.Spy(tp.Spy.Params(), "spy"),
                    placement={"spot_spread_min_pools": 1})
    d = tp.run(pol, {"onprem": 4, "od": 2})
    assert d.placement == {"onprem": 4, "spot-a": 0, "spot-b": 2, "od": 2} and d.replicas == 8
    assert d.history.rule_state[SPARE_STATE_KEY] == {"spare": 2, "return": 2}
    assert d.history.scale_events == ()  # the demand did not change
    totals, seen = [], []
    for _ in range(4):  # the replacements start and start...
        sig = tp.signals(d.placement)
        sig = replace(sig, pools={**sig.pools, "spot-b": PoolState("spot-b", 2, ready_replicas=0)})
        d = tp.decide(model=tp.MODEL, pools=tp.POOLS, signals=sig, policy=pol, history=d.history, overrides=(),
                      now=tp.NOW, paused=False)
        totals.append(d.replicas)
        seen.append(next(r.message for r in d.recommendations if r.rule == "spy").split()[0])
    assert totals == [8] * 4 and seen == ["current=6"] * 4 and d.history.scale_events == ()
    assert tp.stage(d, "tolerance").replicas == 6 and tp.stage(d, "stabilize").replicas == 6
    # ... and serve: the on-demand replicas go, the total is the demand again
    d = tp.decide(model=tp.MODEL, pools=tp.POOLS, signals=tp.signals(d.placement), policy=pol, history=d.history,
                  overrides=(), now=tp.NOW, paused=False)
    assert d.placement == {"onprem": 4, "spot-a": 0, "spot-b": 2, "od": 0} and d.replicas == 6
    assert d.history.rule_state[SPARE_STATE_KEY] == {"spare": 0}
    assert tp.stage(d, "placement").reason == FALLBACK and "released 2 on od" in tp.stage(d, "placement").message
    # nothing held any more: the next decision records no spares and changes nothing
    d = tp.decide(model=tp.MODEL, pools=tp.POOLS, signals=tp.signals(d.placement), policy=pol, history=d.history,
                  overrides=(), now=tp.NOW, paused=False)
    assert d.placement == {"onprem": 4, "spot-a": 0, "spot-b": 2, "od": 0} and d.history.scale_events == ()


def test_no_spares_no_state_entry() -> None:
    """Without spares the decision's state is as it was before the fallback return existed."""
    d = tp.run(tp.policy(tp.fixed(3)), {"onprem": 3})
    assert SPARE_STATE_KEY not in d.history.rule_state


# -- the simulator: a spot pool reclaimed, then back ---------------------------------------------------

RECLAIM_S, BACK_S = 600.0, 1500.0


def _reclaim_run(on: bool):
    trace = SpotTrace("reclaim", np.array([0.0, RECLAIM_S, BACK_S]), np.array([1.0, 0.0, 1.0]), 100_000.0, True)
    spot = {"aws-spot": SpotModel(notice_s=120.0, trace=trace, scale_nodes=2, pool="aws-spot", seed=1)}
    pools = {k: v for k, v in F.pools().items() if k in ("onprem", "aws-spot", "aws-od")}
    pol = F.policy(min_replicas=1)
    pol = replace(pol, spec=pol.spec.model_copy(update={"placement": Placement(return_from_fallback=on)}))
    work = F.rate_series([F.rate_at_slo() * 6.0] * 50)
    return simulate(F.setup(work, pool_specs=pools, spot=spot, mode="fluid", seed=2), TidegateController(pol)), pools


def test_simulated_reclaim_on_demand_released_once_spot_is_back_and_the_slo_holds() -> None:
    on, pools = _reclaim_run(True)
    off, _ = _reclaim_run(False)
    t = np.asarray(on.timeline["t_s"])
    od_on = np.asarray(on.timeline["desired:aws-od"])
    od_off = np.asarray(off.timeline["desired:aws-od"])
    # the reclaim pushed replicas to on-demand, in both runs
    assert od_on[(t > RECLAIM_S + 200) & (t < BACK_S)].min() > 0 and od_off[(t > RECLAIM_S + 200) & (t < BACK_S)].min() > 0
    # back: released within provisioning + cold start + a minute of spot capacity returning
    spot = pools["aws-spot"]
    by = BACK_S + spot.provisioning_delay_s + F.model().cold_start_s + 60.0
    assert (od_on[t >= by] == 0).all()
    assert od_off[t >= by].max() > 0  # without it the on-demand replicas stay
    # make before break: serving replicas never dip below the demand's while moving back
    ready = sum(np.asarray(on.timeline[f"ready:{p}"]) for p in pools)
    ready_off = sum(np.asarray(off.timeline[f"ready:{p}"]) for p in pools)
    window = (t >= BACK_S) & (t < by)
    assert ready[window].min() >= ready_off[window].min()
    assert on.summary["slo_attainment"] >= off.summary["slo_attainment"] - 1e-4
    assert on.summary["cost_by_pool_usd"]["aws-od"] < off.summary["cost_by_pool_usd"]["aws-od"]
    assert on.summary["cost_usd"] < off.summary["cost_usd"]
