"""The spot hedge (``placement.spot_hedge``): spare replicas sized from each spot pool's observed
interruptions, held away from the interrupted pools (on-prem room, then spot pools never
interrupted, then on-demand), so that a whole-pool reclaim is absorbed by replicas already
serving."""

from __future__ import annotations

from dataclasses import replace

from controller.core.model import History, PoolState
from controller.core.placement import SPARE_STATE_KEY
from controller.core.reasons import Reason
from controller.core.spec import Placement
from tests.unit import test_pipeline as tp
from tests.unit.test_placement import STD, run

HEDGE = Placement(spot_hedge=1.0, spot_spread_min_pools=1)


def test_an_interrupted_pool_gets_spare_a_pool_never_interrupted_gets_none() -> None:
    # spot-a lost 4 nodes (of 1 replica each) within the window; spot-b was never interrupted
    res = run(STD, {"onprem": 2, "spot-a": 2, "spot-b": 2}, 6, spec=HEDGE,
              extra={"spot_a": {"recent_interruptions": 4}})
    # spare for spot-a's 2 replicas at risk only (not for spot-b's), placed on the pool never interrupted
    assert res.hedge_spare == 2
    assert res.replicas == {"onprem": 2, "spot-a": 2, "spot-b": 4, "od": 0}
    assert res.reason == Reason.SPOT_HEDGE.value
    code, msg = next(e for e in res.events if e[0] == Reason.SPOT_HEDGE.value)
    assert "2 spare for 2 replicas at risk (spot-a 2; x1)" in msg and "spot-b" not in msg.split(":")[1]
    # nothing interrupted: no spare, the placement of the hedge-less policy
    calm = run(STD, {"onprem": 2, "spot-a": 2, "spot-b": 2}, 6, spec=HEDGE)
    assert calm.hedge_spare == 0 and calm.replicas == run(STD, {"onprem": 2, "spot-a": 2, "spot-b": 2}, 6).replicas
    assert all(code != Reason.SPOT_HEDGE.value for code, _ in calm.events)


def test_spare_is_sized_from_the_observed_rate() -> None:
    # one interrupted node of one replica: one replica at risk, hedged x2 -> 2 spares, never more
    # than the pool holds
    one = run(STD, {"onprem": 2, "spot-a": 3}, 5, spec=Placement(spot_hedge=2.0),
              extra={"spot_a": {"recent_interruptions": 1}})
    assert one.hedge_spare == 2
    many = run(STD, {"onprem": 2, "spot-a": 3}, 5, spec=Placement(spot_hedge=0.5),
               extra={"spot_a": {"recent_interruptions": 3}})
    assert many.hedge_spare == 2  # ceil(0.5 x 3)


def test_spares_go_on_prem_first_then_on_demand_never_to_an_interrupted_pool() -> None:
    # on-prem has room (2 free), spot-a holds 4 at risk, spot-b was interrupted too (holds none):
    # the 4 spares go 2 on-prem, then 2 on-demand; no spare on either spot pool
    res = run(STD, {"spot-a": 4}, 4, spec=HEDGE,
              extra={"spot_a": {"recent_interruptions": 4}, "spot_b": {"recent_interruptions": 1}})
    assert res.replicas == {"onprem": 2, "spot-a": 4, "spot-b": 0, "od": 2}
    assert res.hedge_spare == 4
    msg = next(m for c, m in res.events if c == Reason.SPOT_HEDGE.value)
    assert "added 2 on-prem, 2 on-demand" in msg
    # on-demand not allowed and no other room: the spares that find no place are said so
    tight = run(STD, {"spot-a": 4}, 4, spec=Placement(spot_hedge=1.0, allow_on_demand=False, spot_spread_min_pools=1),
                extra={"spot_a": {"recent_interruptions": 4}, "spot_b": {"recent_interruptions": 1}})
    assert tight.hedge_spare == 2 and "2 more found no room or budget" in " ".join(m for _, m in tight.events)


def test_the_budget_and_max_total_bound_the_spares() -> None:
    # od costs 10/h per replica: a cap leaving room for one
    capped = run(STD, {"spot-a": 4}, 4, spec=HEDGE, cap=4 * 2.0 + 2 * 4.0 + 10.0,
                 extra={"spot_a": {"recent_interruptions": 4}, "spot_b": {"recent_interruptions": 1}})
    assert capped.replicas["od"] == 1 and capped.cost_per_hour_usd <= 4 * 2.0 + 2 * 4.0 + 10.0
    bounded = run(STD, {"spot-a": 4}, 4, spec=HEDGE, max_total=5,
                  extra={"spot_a": {"recent_interruptions": 4}})
    assert bounded.hedge_spare == 1 and sum(bounded.replicas.values()) == 5


def _observed(d, interrupted: dict[str, int] | None = None, recent: dict[str, int] | None = None):
    """The signals of the next tick: the decided placement running, with notices and interruptions."""
    sig = tp.signals(d.placement)
    pools = {n: replace(s, interrupted_replicas=(interrupted or {}).get(n, 0),
                        recent_interruptions=(recent or {}).get(n, 0)) for n, s in sig.pools.items()}
    return replace(sig, pools=pools)


def test_a_whole_pool_reclaim_is_absorbed_by_the_spares() -> None:
    # 8 replicas: on-prem's 4 and 4 on the cheapest spot pool (spot-b), which has been losing
    # nodes (4 interruptions in the window). With the hedge, 4 spares run on the pool never
    # interrupted; when spot-b is then reclaimed whole, the total is still served by replicas
    # already running: nothing new to wait for.
    def ticks(hedge: float) -> tuple[object, object]:
        pol = tp.policy(tp.fixed(8), placement={"spot_hedge": hedge, "spot_spread_min_pools": 1})
        start = PoolState("spot-b", 4, ready_replicas=4, recent_interruptions=4)
        sig = tp.signals({"onprem": 4, "spot-b": 4})
        sig = replace(sig, pools={**sig.pools, "spot-b": start})
        first = tp.decide(model=tp.MODEL, pools=tp.POOLS, signals=sig, policy=pol, history=History(),
                          overrides=(), now=tp.NOW, paused=False)
        # the pool is reclaimed whole: every replica on it has a notice
        sig2 = _observed(first, interrupted={"spot-b": 4}, recent={"spot-b": 8})
        second = tp.decide(model=tp.MODEL, pools=tp.POOLS, signals=sig2, policy=pol, history=first.history,
                           overrides=(), now=tp.NOW, paused=False)
        return first, second

    first, second = ticks(1.0)
    assert first.placement == {"onprem": 4, "spot-a": 4, "spot-b": 4, "od": 0} and first.replicas == 12
    assert first.history.rule_state[SPARE_STATE_KEY] == {"spare": 4}
    assert any(s.reason == Reason.SPOT_HEDGE.value for s in first.trace)
    # after the reclaim: the 8 the policy asks for, all already running (no replica ordered)
    assert second.replicas == 8 and second.placement == {"onprem": 4, "spot-a": 4, "spot-b": 0, "od": 0}
    assert all(second.placement[p] <= first.placement[p] for p in second.placement)
    # without the hedge the same reclaim orders 4 new replicas, which serve only after their start
    plain_first, plain_second = ticks(0.0)
    assert plain_first.replicas == 8
    assert sum(max(0, plain_second.placement[p] - plain_first.placement[p]) for p in plain_second.placement) == 4


def test_spares_are_not_demand_the_total_does_not_ratchet() -> None:
    # the rules and safeguards see the replicas without the spares: tick after tick (with a hold
    # on missing data, which keeps at least the current replicas) the hedge holds, never grows
    pol = tp.policy(tp.fixed(8), tp.fixed(rule="gone", missing=True),
                    placement={"spot_hedge": 1.0, "spot_spread_min_pools": 1})
    d = tp.run(pol, {"onprem": 4, "spot-b": 4})
    recent = {"spot-b": 4}
    totals = []
    for _ in range(5):
        d = tp.decide(model=tp.MODEL, pools=tp.POOLS, signals=_observed(d, recent=recent), policy=pol,
                      history=d.history, overrides=(), now=tp.NOW, paused=False)
        totals.append(d.replicas)
    assert totals == [12] * 5
    assert d.placement["spot-b"] == 4 and d.history.rule_state[SPARE_STATE_KEY] == {"spare": 4}
