"""Paid slots (``placement.fill_paid_nodes``): an on-prem node is billed while it holds any replica,
so its free slots are filled as spares: more replicas serving for the same cost, never read as
demand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.model import History
from controller.core.placement import SPARE_STATE_KEY
from controller.core.pricing import placement_cost
from controller.core.spec import Placement
from tests.unit import test_pipeline as tp
from tests.unit.test_placement import AWS_SPOT, ONPREM, fleet, model_for, pool, run

# two on-prem nodes of 4 slots (8 replicas of 1 GPU), a spot pool of nodes of 4 too
FLEET = fleet(pool("onprem", ONPREM, 16.0, gpus=4, nodes=2), pool("spot", AWS_SPOT, 20.0, gpus=4, nodes=3))
ON = Placement(fill_paid_nodes=True)


def _cost(replicas: dict[str, int]) -> float:
    return placement_cost(model_for(FLEET), FLEET, {}, replicas)


def test_the_free_slots_of_a_billed_node_are_filled_at_no_cost() -> None:
    off = run(FLEET, {}, 7)
    on = run(FLEET, {}, 7, spec=ON)
    assert off.replicas == {"onprem": 7, "spot": 0} and off.paid_spare == 0
    assert on.replicas == {"onprem": 8, "spot": 0} and on.paid_spare == 1 and on.spare == 1
    assert on.cost_per_hour_usd == off.cost_per_hour_usd == _cost({"onprem": 8}) == 32.0
    assert ("Placed", "paid slots: 1 on onprem (free slots of on-prem nodes already billed; spares)") in on.events


def test_a_node_not_billed_stays_empty_and_cloud_nodes_are_not_filled() -> None:
    # 4 fill the first node exactly: the second is not billed, nothing is added
    assert run(FLEET, {}, 4, spec=ON).replicas == {"onprem": 4, "spot": 0}
    # on-prem full, 2 on a spot node of 4: the spot node's free slots stay free (on-prem only)
    res = run(FLEET, {}, 10, spec=ON)
    assert res.replicas == {"onprem": 8, "spot": 2} and res.paid_spare == 0


def test_max_total_pins_and_drains_bound_the_fill() -> None:
    assert run(FLEET, {}, 7, spec=ON, max_total=7).replicas == {"onprem": 7, "spot": 0}
    assert run(FLEET, {}, 6, spec=ON, max_total=7).replicas == {"onprem": 7, "spot": 0}
    pinned = run(FLEET, {"onprem": 5}, 5, spec=ON, pinned={"onprem": 5})
    assert pinned.replicas["onprem"] == 5 and pinned.paid_spare == 0
    drained = run(FLEET, {"onprem": 3}, 3, spec=ON, drained=("onprem",))
    assert drained.replicas["onprem"] == 0 and drained.paid_spare == 0


@settings(max_examples=150, deadline=None)
@given(current=st.fixed_dictionaries({"onprem": st.integers(0, 8), "spot": st.integers(0, 12)}),
       total=st.integers(0, 20), max_total=st.one_of(st.none(), st.integers(0, 20)))
def test_filling_never_costs_more_and_only_adds_spares_on_prem(current: dict[str, int], total: int,
                                                              max_total: int | None) -> None:
    off = run(FLEET, current, total, max_total=max_total)
    on = run(FLEET, current, total, spec=ON, max_total=max_total)
    assert on.cost_per_hour_usd == pytest.approx(off.cost_per_hour_usd)
    assert on.replicas["spot"] == off.replicas["spot"]
    assert on.replicas["onprem"] - off.replicas["onprem"] == on.paid_spare >= 0
    if max_total is not None:
        assert sum(on.replicas.values()) <= max(max_total, sum(off.replicas.values()))
    # a billed on-prem node is left with no free slot, unless max_total stops the fill
    if max_total is None or sum(on.replicas.values()) < max_total:
        assert on.replicas["onprem"] % 4 == 0


def test_the_spares_serve_and_are_no_demand_tick_after_tick() -> None:
    # the pipeline's fleet: one on-prem node of 4 slots. A rule asks 3: 4 run, the fourth a spare;
    # the next ticks (the 4 running, ready) the rules still see 3, and the total does not ratchet:
    # a rule with missing data holds the current replicas, which would be 4 (no spare left) if the
    # spare were read as demand
    pol = tp.policy(tp.fixed(3), tp.fixed(rule="gone", missing=True), placement={"fill_paid_nodes": True})
    d = tp.run(pol, {})
    assert d.placement["onprem"] == 4 and d.replicas == 4
    assert d.history.rule_state[SPARE_STATE_KEY] == {"spare": 1}
    for _ in range(4):
        d = tp.run(pol, d.placement, history=d.history)
        assert d.placement == {"onprem": 4, "spot-a": 0, "spot-b": 0, "od": 0}
        assert d.history.rule_state[SPARE_STATE_KEY] == {"spare": 1}
        assert d.recommendations[0].replicas == 3
    # when the rules ask more than the node holds, the spare becomes demand and nothing is bought
    # for the second node's sake alone: 5 asked, 4 on-prem and 1 in the cloud, no spare
    more = tp.run(tp.policy(tp.fixed(5), placement={"fill_paid_nodes": True}), d.placement, history=d.history)
    assert sum(more.placement.values()) == 5 and more.placement["onprem"] == 4
    assert more.history.rule_state[SPARE_STATE_KEY] == {"spare": 0}
    # off (the default): 3 asked, 3 run
    plain = tp.run(tp.policy(tp.fixed(3)), {}, history=History())
    assert plain.placement["onprem"] == 3 and SPARE_STATE_KEY not in plain.history.rule_state
