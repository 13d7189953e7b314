"""Placement: table-driven cases for each rule, and hypothesis properties over random fleets."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.core.model import ModelSpec, Tier, PoolSpec, PoolState, ReplicaCapacity
from controller.core.placement import EXACT_SCALE_IN, PlacementResult, place, preferred_pool
from controller.core.pricing import placement_cost, pool_price
from controller.core.reasons import Reason
from controller.core.spec import Placement

ONPREM, AWS_SPOT, GCP_SPOT, AWS_OD = (Tier.ONPREM, "onprem"), (Tier.SPOT, "aws"), (Tier.SPOT, "gcp"), (Tier.ONDEMAND, "aws")


def model_for(pools: dict[str, PoolSpec], tp: int = 1, gpus: tuple[str, ...] = ("A100",)) -> ModelSpec:
    return ModelSpec(name="m", tp_degree=tp, quantization="fp8", gpu_types=gpus, cold_start_s=60,
                     capacity={g: ReplicaCapacity(1000.0, 2.0) for g in gpus}, pools=tuple(pools))


def pool(name: str, kind: tuple[Tier, str], price: float, *, gpus: int = 1, nodes: int = 4, gpu: str = "A100",
         priority: int = 0) -> PoolSpec:
    return PoolSpec(name=name, tier=kind[0], provider=kind[1], gpu_type=gpu, gpus_per_node=gpus, max_nodes=nodes,
                    price_per_node_hour_usd=price, priority=priority)


def fleet(*specs: PoolSpec) -> dict[str, PoolSpec]:
    return {p.name: p for p in specs}


def states(current: dict[str, int], **extra: dict) -> dict[str, PoolState]:
    out = {}
    for name, replicas in current.items():
        kw = {"ready_replicas": replicas, **extra.get(name.replace("-", "_"), {})}
        out[name] = PoolState(pool=name, replicas=replicas, **kw)
    return out


STD = fleet(
    pool("onprem", ONPREM, 4.0, nodes=2),
    pool("spot-a", AWS_SPOT, 2.0),
    pool("spot-b", GCP_SPOT, 3.0),
    pool("od", AWS_OD, 10.0),
)


def run(pools: dict[str, PoolSpec], current: dict[str, int], total: int, *, tp: int = 1,
        spec: Placement | None = None, cap: float | None = None, extra: dict | None = None, **kw):
    model = model_for(pools, tp=tp)
    sts = states({n: current.get(n, 0) for n in pools}, **(extra or {}))
    return place(model=model, pools=pools, states=sts, total=total, placement=spec or Placement(),
                 max_cost_per_hour_usd=cap, **kw)


# -- table-driven cases ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("current", "total", "spec", "expected", "reason"),
    [
        # on-prem first, then spot spread over the two cheapest, on-demand last
        ({}, 2, Placement(), {"onprem": 2, "spot-a": 0, "spot-b": 0, "od": 0}, Reason.PLACED),
        ({}, 3, Placement(), {"onprem": 2, "spot-a": 1, "spot-b": 0, "od": 0}, Reason.PLACED),
        ({}, 6, Placement(), {"onprem": 2, "spot-a": 2, "spot-b": 2, "od": 0}, Reason.PLACED),
        # spread disabled (1 pool): cheapest spot takes everything it can
        ({}, 6, Placement(spot_spread_min_pools=1), {"onprem": 2, "spot-a": 4, "spot-b": 0, "od": 0}, Reason.PLACED),
        # spot full: on-demand fallback
        ({}, 11, Placement(), {"onprem": 2, "spot-a": 4, "spot-b": 4, "od": 1}, Reason.ON_DEMAND_FALLBACK),
        # on-demand not allowed: capacity exhausted
        ({}, 11, Placement(allow_on_demand=False), {"onprem": 2, "spot-a": 4, "spot-b": 4, "od": 0},
         Reason.CAPACITY_EXHAUSTED),
        # everything full
        ({}, 20, Placement(), {"onprem": 2, "spot-a": 4, "spot-b": 4, "od": 4}, Reason.CAPACITY_EXHAUSTED),
        # scale-in: on-demand first, then the dearer spot, on-prem last
        ({"onprem": 2, "spot-a": 2, "spot-b": 2, "od": 2}, 5, Placement(),
         {"onprem": 2, "spot-a": 2, "spot-b": 1, "od": 0}, Reason.PLACED),
        ({"onprem": 2, "spot-a": 2, "spot-b": 2, "od": 2}, 1, Placement(),
         {"onprem": 1, "spot-a": 0, "spot-b": 0, "od": 0}, Reason.PLACED),
        # no change keeps the current placement even if it is not the cheapest (no churn)...
        ({"onprem": 0, "spot-a": 0, "spot-b": 1, "od": 1}, 2, Placement(return_from_fallback=False),
         {"onprem": 0, "spot-a": 0, "spot-b": 1, "od": 1}, Reason.PLACED),
        # ... but for an on-demand replica: a replacement on-prem ($4 node for the $10 one), above
        # the total, the on-demand replica serving on until it is ready (the fallback return)
        ({"onprem": 0, "spot-a": 0, "spot-b": 1, "od": 1}, 2, Placement(),
         {"onprem": 1, "spot-a": 0, "spot-b": 1, "od": 1}, Reason.FALLBACK_RETURN),
        # policy restricts pools: replicas outside move in
        ({"od": 2}, 2, Placement(pools=("onprem", "spot-a")),
         {"onprem": 2, "spot-a": 0, "spot-b": 0, "od": 0}, Reason.POOL_UNAVAILABLE),
    ],
)
def test_place_table(current, total, spec, expected, reason) -> None:
    res = run(STD, current, total, spec=spec)
    assert res.replicas == expected
    assert res.reason == reason.value
    assert res.cost_per_hour_usd == pytest.approx(placement_cost(model_for(STD), STD, {}, expected))


def test_tp_packing_and_cost_by_whole_nodes() -> None:
    # 8-GPU nodes at TP 4: 2 replicas per node; 3 replicas need 2 nodes.
    pools = fleet(pool("onprem", ONPREM, 0.0, gpus=8, nodes=1), pool("spot", AWS_SPOT, 20.0, gpus=8, nodes=3))
    res = run(pools, {}, 5, tp=4)
    assert res.replicas == {"onprem": 2, "spot": 3}
    assert res.cost_per_hour_usd == pytest.approx(2 * 20.0)
    # a pool with fewer GPUs per node than TP cannot host a replica at all
    small = fleet(pool("l4", AWS_SPOT, 1.0, gpus=2, nodes=10), pool("big", GCP_SPOT, 50.0, gpus=8, nodes=1))
    res = run(small, {"l4": 3}, 3, tp=4)
    assert res.replicas == {"l4": 0, "big": 2}
    assert res.capacity_limited and res.reason == Reason.CAPACITY_EXHAUSTED.value


def test_wrong_gpu_type_is_unusable() -> None:
    pools = fleet(pool("h100", AWS_SPOT, 1.0, gpu="H100"), pool("a100", GCP_SPOT, 9.0))
    model = model_for(pools, gpus=("A100",))
    res = place(model=model, pools=pools, states=states({"h100": 2, "a100": 0}), total=2)
    assert res.replicas == {"h100": 0, "a100": 2}
    assert res.reason == Reason.POOL_UNAVAILABLE.value


def test_interrupted_replicas_are_replaced_elsewhere_now() -> None:
    res = run(STD, {"onprem": 2, "spot-a": 3, "spot-b": 1}, 6,
              extra={"spot_a": {"interrupted_replicas": 2}})
    assert res.interrupted_removed == 2
    assert res.interrupted_replaced == 2
    # the interrupted pool takes no new replicas this tick: they go to the other spot pool
    assert res.replicas == {"onprem": 2, "spot-a": 1, "spot-b": 3, "od": 0}
    assert res.reason == Reason.SPOT_INTERRUPTED.value


def test_interrupted_not_replaced_when_total_drops() -> None:
    res = run(STD, {"onprem": 2, "spot-a": 2}, 3, extra={"spot_a": {"interrupted_replicas": 1}})
    assert res.replicas == {"onprem": 2, "spot-a": 1, "spot-b": 0, "od": 0}
    assert (res.interrupted_removed, res.interrupted_replaced) == (1, 0)


def test_unavailable_pool_keeps_ready_and_gets_no_new() -> None:
    res = run(STD, {"onprem": 2, "spot-a": 3}, 6,
              extra={"spot_a": {"available": False, "ready_replicas": 1, "unavailable_reason": "unschedulable"}})
    assert res.replicas == {"onprem": 2, "spot-a": 1, "spot-b": 3, "od": 0}
    assert res.reason == Reason.SPOT_POOL_UNAVAILABLE.value
    assert any("unschedulable" in msg for _, msg in res.events)


def test_unavailable_pool_with_unknown_readiness_keeps_its_replicas() -> None:
    res = run(STD, {"onprem": 2, "spot-a": 3}, 5, spec=Placement(spot_spread_min_pools=1),
              extra={"spot_a": {"available": False, "ready_replicas": None}})
    assert res.replicas == {"onprem": 2, "spot-a": 3, "spot-b": 0, "od": 0}


def test_unavailable_pool_keeps_the_replicas_starting_on_nodes_that_launched() -> None:
    # An order of 4 on spot-a: the capacity ran out after two nodes launched. 1 replica serves,
    # 1 loads its engine on the second node, 2 wait for nodes that will not come: those 2 move.
    part = {"available": False, "ready_replicas": 1, "scheduled_replicas": 2, "unavailable_reason": "capacity"}
    res = run(STD, {"onprem": 2, "spot-a": 4}, 6, extra={"spot_a": part})
    assert res.replicas == {"onprem": 2, "spot-a": 2, "spot-b": 2, "od": 0}
    assert any("keeps 2 of 4 (1 starting on nodes that are up), no new" in msg for _, msg in res.events)
    # without the count (a provider that cannot tell) only the ready one stays, as before
    blind = run(STD, {"onprem": 2, "spot-a": 4}, 6, extra={"spot_a": {**part, "scheduled_replicas": None}})
    assert blind.replicas == {"onprem": 2, "spot-a": 1, "spot-b": 3, "od": 0}
    # a replica starting on a node under an interruption notice does not stay
    noticed = run(STD, {"onprem": 2, "spot-a": 4}, 6, extra={"spot_a": {**part, "interrupted_replicas": 1}})
    assert noticed.replicas["spot-a"] == 1 and noticed.interrupted_removed == 1
    # never more than the pool holds now: a stale count above the replicas keeps them all, no more
    stale = run(STD, {"onprem": 2, "spot-a": 2}, 6, extra={"spot_a": {**part, "scheduled_replicas": 5}})
    assert stale.replicas["spot-a"] == 2


def test_spot_pool_with_too_many_recent_interruptions_is_avoided() -> None:
    spec = Placement(max_recent_interruptions=2)
    res = run(STD, {"onprem": 2}, 4, spec=spec, extra={"spot_a": {"recent_interruptions": 3}})
    assert res.replicas == {"onprem": 2, "spot-a": 0, "spot-b": 2, "od": 0}
    assert any(code == Reason.SPOT_POOL_UNAVAILABLE.value for code, _ in res.events)
    at_limit = run(STD, {"onprem": 2}, 4, spec=spec, extra={"spot_a": {"recent_interruptions": 2}})
    assert at_limit.replicas == {"onprem": 2, "spot-a": 1, "spot-b": 1, "od": 0}


def test_live_spot_price_reorders_pools() -> None:
    res = run(STD, {"onprem": 2}, 3, spec=Placement(spot_spread_min_pools=1),
              extra={"spot_a": {"price_per_node_hour_usd": 7.5}})
    assert res.replicas == {"onprem": 2, "spot-a": 0, "spot-b": 1, "od": 0}
    assert pool_price(STD["spot-a"], PoolState("spot-a", 0, price_per_node_hour_usd=7.5)) == 7.5
    assert pool_price(STD["spot-a"], PoolState("spot-a", 0)) == 2.0


def test_drained_pool_empties_and_its_replicas_move() -> None:
    res = run(STD, {"onprem": 2, "spot-a": 2, "spot-b": 2}, 6, drained={"spot-a"})
    assert res.replicas["spot-a"] == 0
    assert res.total == 6
    assert res.reason == Reason.OVERRIDE_DRAIN.value


def test_pinned_pool_is_exact_and_the_rest_goes_elsewhere() -> None:
    res = run(STD, {"onprem": 2, "spot-a": 2}, 5, pinned={"od": 3})
    assert res.replicas == {"onprem": 2, "spot-a": 0, "spot-b": 0, "od": 3}
    # pins beyond capacity are capped
    res = run(STD, {}, 2, pinned={"od": 9})
    assert res.replicas["od"] == 4


def test_spread_repair_moves_one_replica() -> None:
    # Everything on spot-b (kept from before): spot-a is open, so one replica moves there.
    res = run(STD, {"onprem": 2, "spot-b": 3}, 5)
    assert res.replicas == {"onprem": 2, "spot-a": 1, "spot-b": 2, "od": 0}
    assert res.total == 5


def test_budget_stops_additions_before_the_cap() -> None:
    # onprem 2 x $4 = $8, spot-a $2 each: cap $13 leaves room for 2 spot replicas, not 3.
    res = run(STD, {}, 8, cap=13.0)
    assert res.total == 4 and res.cost_per_hour_usd <= 13.0
    assert res.budget_limited and res.reason == Reason.BUDGET_CAP_REACHED.value


def test_budget_trims_cloud_before_onprem() -> None:
    res = run(STD, {"onprem": 2, "spot-a": 2, "od": 2}, 6, cap=9.0)
    assert res.replicas == {"onprem": 2, "spot-a": 0, "spot-b": 0, "od": 0}
    assert res.budget_removed == 4
    # only when the cloud is empty does the budget take on-prem replicas
    res = run(STD, {"onprem": 2, "spot-a": 2}, 4, cap=5.0)
    assert res.replicas == {"onprem": 1, "spot-a": 0, "spot-b": 0, "od": 0}


def test_budget_prefers_cheaper_pool_when_preferred_node_does_not_fit() -> None:
    # The on-prem node costs $30 (8 replicas): over the $10 cap; two $4 spot nodes fit.
    pools = fleet(pool("onprem", ONPREM, 30.0, gpus=8, nodes=1), pool("spot", AWS_SPOT, 4.0, nodes=4))
    res = run(pools, {}, 3, cap=10.0)
    assert res.replicas == {"onprem": 0, "spot": 2}
    assert res.budget_limited


def test_preferred_pool() -> None:
    model = model_for(STD)
    assert preferred_pool(model, STD, {}) == "onprem"
    no_onprem = {k: v for k, v in STD.items() if k != "onprem"}
    assert preferred_pool(model_for(no_onprem), no_onprem, {}) == "spot-a"
    assert preferred_pool(model_for(no_onprem), no_onprem,
                          {"spot-a": PoolState("spot-a", 0, price_per_node_hour_usd=99.0)}) == "spot-b"


# -- properties -----------------------------------------------------------------------------------

GPU_TYPES = ("A100", "H100", "L4")


@dataclass
class Scenario:
    model: ModelSpec
    pools: dict[str, PoolSpec]
    states: dict[str, PoolState]
    spec: Placement
    total: int
    cap: float | None


@st.composite
def scenarios(draw: st.DrawFn, with_cap: bool | None = None, min_spread: int = 1) -> Scenario:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    model_gpus = tuple(draw(st.lists(st.sampled_from(GPU_TYPES), min_size=1, max_size=3, unique=True)))
    kinds = ([ONPREM] * draw(st.sampled_from([0, 1, 1, 2])) + [draw(st.sampled_from([AWS_SPOT, GCP_SPOT]))
             for _ in range(draw(st.integers(2, 4)))] + [AWS_OD] * draw(st.integers(0, 2)))
    pools: dict[str, PoolSpec] = {}
    sts: dict[str, PoolState] = {}
    for i, kind in enumerate(kinds):
        name = f"p{i}-{kind[1]}-{kind[0].value}"
        # Mostly pools that can host the model; now and then a GPU type or node size that cannot.
        odd = draw(st.integers(0, 9)) == 0
        gpu = draw(st.sampled_from(GPU_TYPES if odd else model_gpus))
        gpus_per_node = draw(st.sampled_from([1, 2, 4, 8] if odd else [g for g in (1, 2, 4, 8) if g >= tp]))
        spec = PoolSpec(
            name=name, tier=kind[0], provider=kind[1], gpu_type=gpu, gpus_per_node=gpus_per_node,
            max_nodes=draw(st.integers(0, 6)),
            price_per_node_hour_usd=draw(st.integers(0 if kind is ONPREM else 1, 60)) / 2,
            priority=draw(st.integers(0, 1)),
        )
        pools[name] = spec
        replicas = draw(st.integers(0, 8)) if draw(st.integers(0, 2)) else 0
        spot = kind[0].is_spot
        sts[name] = PoolState(
            pool=name, replicas=replicas,
            ready_replicas=draw(st.one_of(st.none(), st.integers(0, replicas))),
            available=draw(st.integers(0, 4)) > 0,
            interrupted_replicas=draw(st.integers(0, 2)) if spot else 0,
            recent_interruptions=draw(st.integers(0, 5)) if spot else 0,
            price_per_node_hour_usd=draw(st.one_of(st.none(), st.integers(1, 80).map(lambda c: c / 2)))
            if spot else None,
        )
    model = ModelSpec(name="m", tp_degree=tp, quantization="fp8", gpu_types=model_gpus, cold_start_s=60,
                      capacity={g: ReplicaCapacity(100.0, 1.0) for g in model_gpus}, pools=tuple(pools))
    placement = Placement.model_validate({
        "spot_spread_min_pools": draw(st.integers(min_spread, 3)), "allow_on_demand": draw(st.booleans()),
        "max_recent_interruptions": draw(st.integers(0, 4))})
    if with_cap is None:
        with_cap = draw(st.booleans())
    cap = draw(st.integers(1, 400)) / 2 if with_cap else None
    return Scenario(model, pools, sts, placement, draw(st.integers(0, 30)), cap)


def _place(sc: Scenario):
    return place(model=sc.model, pools=sc.pools, states=sc.states, total=sc.total, placement=sc.spec,
                 max_cost_per_hour_usd=sc.cap)


def _accepts(sc: Scenario, name: str) -> bool:
    """A pool that may take new replicas, derived from the inputs (the documented rules)."""
    spec, state = sc.pools[name], sc.states[name]
    per_node = spec.replicas_per_node(sc.model)
    return (per_node > 0 and spec.max_nodes > 0 and state.available
            and not (spec.tier.is_spot and state.recent_interruptions > sc.spec.max_recent_interruptions)
            and not (state.interrupted_replicas > 0 and (state.replicas or 0) > 0))


def check_capacity_packing_budget_and_cost(sc: Scenario, res: PlacementResult) -> None:
    assert set(res.replicas) == set(sc.pools)
    for name, replicas in res.replicas.items():
        spec = sc.pools[name]
        assert replicas >= 0
        # never more GPUs than the pool has, and whole replicas packed on whole nodes
        assert replicas * sc.model.tp_degree <= spec.max_nodes * spec.gpus_per_node
        assert replicas <= spec.max_nodes * (spec.gpus_per_node // sc.model.tp_degree)
        if spec.gpu_type not in sc.model.gpu_types:
            assert replicas == 0
    assert res.cost_per_hour_usd == pytest.approx(placement_cost(sc.model, sc.pools, sc.states, res.replicas))
    if sc.cap is not None:
        assert res.cost_per_hour_usd <= sc.cap + 1e-6
    # the fallback return's replacements are spares above the total (on-demand replicas they
    # replace serve on until they are ready)
    assert res.total - res.spare <= sc.total
    if not res.capacity_limited and not res.budget_limited:
        assert res.total - res.spare == sc.total


def check_scale_in_never_takes_onprem_before_cloud(sc: Scenario, res: PlacementResult) -> None:
    cloud = sum(v for n, v in res.replicas.items() if not sc.pools[n].tier.is_onprem)
    for name, spec in sc.pools.items():
        if not spec.tier.is_onprem or not sc.states[name].available:
            continue
        per_node = spec.replicas_per_node(sc.model)
        if per_node == 0:
            continue
        baseline = min(sc.states[name].replicas or 0, spec.max_nodes * per_node)
        if res.replicas[name] < baseline:
            assert cloud == 0, (name, baseline, res.replicas)


def check_onprem_filled_before_cloud_is_added(sc: Scenario, res: PlacementResult) -> None:
    cloud_now = sum(v for n, v in res.replicas.items() if not sc.pools[n].tier.is_onprem)
    cloud_before = sum(sc.states[n].replicas or 0 for n in sc.pools if not sc.pools[n].tier.is_onprem)
    if cloud_now <= cloud_before:
        return
    for name, spec in sc.pools.items():
        if not spec.tier.is_onprem or not _accepts(sc, name):
            continue
        room = spec.max_replicas(sc.model) - res.replicas[name]
        if room > 0:
            # only the budget may have stopped on-prem: one more replica there would cross the cap
            assert sc.cap is not None, (name, res.replicas)
            bigger = dict(res.replicas, **{name: res.replicas[name] + 1})
            assert placement_cost(sc.model, sc.pools, sc.states, bigger) > sc.cap


def check_spot_spread(sc: Scenario, res: PlacementResult) -> None:
    if sc.cap is not None:
        return  # a budget may forbid the extra node a spread needs
    spot = [n for n, s in sc.pools.items() if s.tier.is_spot]
    on_spot = sum(res.replicas[n] for n in spot)
    k = sc.spec.spot_spread_min_pools
    holding = [n for n in spot if res.replicas[n] > 0]
    possible = {n for n in spot if _accepts(sc, n)} | set(holding)
    if on_spot >= 2 and len(possible) >= 2:
        assert len(holding) >= min(k, on_spot, len(possible)), res.replicas


# One generated scenario is checked against every property: generation dominates the run time.
def check_all(sc: Scenario) -> None:
    res = _place(sc)
    check_capacity_packing_budget_and_cost(sc, res)
    check_scale_in_never_takes_onprem_before_cloud(sc, res)
    check_onprem_filled_before_cloud_is_added(sc, res)
    check_spot_spread(sc, res)
    assert _place(sc) == res  # deterministic


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_prop_placement_invariants(sc: Scenario) -> None:
    check_all(sc)


# Without a budget and with a spread asked for, so the spread property is exercised often.
@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(with_cap=False, min_spread=2))
def test_prop_placement_invariants_spread(sc: Scenario) -> None:
    check_all(sc)


def test_placement_says_why_each_pool_got_what_it_got() -> None:
    """The reasons name the order and the replica-hour prices that set it, the full pools, and
    on-demand left out; the placement stage's message carries them into the decision log."""
    pools = fleet(pool("onprem", ONPREM, 4.0, nodes=1), pool("aws-spot", AWS_SPOT, 3.79),
                  pool("gcp-spot", GCP_SPOT, 3.75), pool("od", AWS_OD, 10.0))
    r = run(pools, {}, 3, spec=Placement(spot_spread_min_pools=1, allow_on_demand=False))
    assert r.replicas == {"onprem": 1, "aws-spot": 0, "gcp-spot": 2, "od": 0}
    assert r.why == ("gcp-spot before aws-spot: $3.75 vs $3.79 per replica-hour", "onprem full: 1 of 1",
                     "on-demand pools left out: the policy does not allow on-demand")
    assert "why: gcp-spot before aws-spot: $3.75 vs $3.79 per replica-hour" in r.message()
    # equal prices: the priority orders them, and the reason says so
    tied = fleet(pool("a", AWS_SPOT, 2.0, priority=1), pool("b", GCP_SPOT, 2.0, priority=0))
    assert run(tied, {}, 1, spec=Placement(spot_spread_min_pools=1)).why == (
        "b before a: same $2.00 per replica-hour, priority 0 vs 1",)


# -- scale-in empties nodes -------------------------------------------------------------------------

def test_scale_in_takes_the_replica_alone_on_a_node_before_one_off_a_full_node() -> None:
    # spot-a: $26 nodes of 4 ($6.50 a replica-hour), one full node. spot-b: $24 nodes of 4 ($6 a
    # replica-hour), 5 replicas: a full node and one replica alone on a second. Dearest replica-hour
    # first would take one of spot-a's four and save nothing; taking spot-b's lone replica saves $24.
    pools = fleet(pool("spot-a", AWS_SPOT, 26.0, gpus=8, nodes=3), pool("spot-b", GCP_SPOT, 24.0, gpus=8, nodes=3))
    res = run(pools, {"spot-a": 4, "spot-b": 5}, 8, tp=2, spec=Placement(spot_spread_min_pools=1))
    assert res.replicas == {"spot-a": 4, "spot-b": 4}
    assert res.cost_per_hour_usd == pytest.approx(26.0 + 24.0)
    # with nothing to empty, the dearest replica-hour still goes first
    res = run(pools, {"spot-a": 4, "spot-b": 4}, 7, tp=2, spec=Placement(spot_spread_min_pools=1))
    assert res.replicas == {"spot-a": 3, "spot-b": 4}


@st.composite
def scale_ins(draw: st.DrawFn, max_nodes: int = 4, large: bool = False) -> tuple[dict[str, PoolSpec], dict[str, int], int]:
    """Spot pools only, every replica ready and every pool available (so nothing but the scale-in
    acts), and a total below what they hold: by at most ``EXACT_SCALE_IN`` replicas, or
    (``large``) by more."""
    pools: dict[str, PoolSpec] = {}
    current: dict[str, int] = {}
    for i in range(draw(st.integers(2, 4))):
        spec = pool(f"spot-{i}", AWS_SPOT, draw(st.integers(1, 60)) / 2, gpus=draw(st.sampled_from([1, 2, 4, 8])),
                    nodes=draw(st.integers(1, max_nodes)))
        pools[spec.name] = spec
        current[spec.name] = draw(st.integers(0, spec.gpus_per_node * spec.max_nodes))
    held = sum(current.values())
    if large:
        return pools, current, draw(st.integers(0, max(0, held - EXACT_SCALE_IN - 1)))
    return pools, current, draw(st.integers(max(0, held - EXACT_SCALE_IN), max(0, held - 1)))


def _splits(current: dict[str, int], excess: int):
    """Every way of taking ``excess`` replicas from ``current``."""
    names = list(current)

    def rec(i: int, left: int):
        if i == len(names):
            if left == 0:
                yield {}
            return
        for k in range(min(current[names[i]], left) + 1):
            for rest in rec(i + 1, left - k):
                yield {names[i]: current[names[i]] - k, **rest}

    return rec(0, excess)


@settings(max_examples=100, deadline=None)
@given(scale_ins())
def test_prop_scale_in_keeps_the_cheapest_placement_of_the_replicas_left(case) -> None:
    # Checked by brute force: of every way to take the excess off the pools as they are, none
    # costs less per hour than what placement keeps.
    pools, current, total = case
    model = model_for(pools)
    res = run(pools, current, total, spec=Placement(spot_spread_min_pools=1))
    assert sum(res.replicas.values()) == total
    assert all(res.replicas[n] <= current[n] for n in pools)  # a scale-in adds nowhere
    best = min(placement_cost(model, pools, {}, kept) for kept in _splits(current, sum(current.values()) - total))
    assert res.cost_per_hour_usd == pytest.approx(best)


def _dearest_replica_hour_first(pools: dict[str, PoolSpec], current: dict[str, int], excess: int) -> dict[str, int]:
    """The rule before nodes counted: take replicas from the dearest replica-hour first."""
    kept = dict(current)
    for name in sorted(pools, key=lambda n: (-pools[n].price_per_node_hour_usd / pools[n].gpus_per_node, n)):
        take = min(kept[name], excess)
        kept[name] -= take
        excess -= take
    return kept


@settings(max_examples=100, deadline=None)
@given(scale_ins(max_nodes=40, large=True))
def test_prop_a_large_scale_in_is_never_dearer_than_the_dearest_replica_hour_first(case) -> None:
    # Beyond EXACT_SCALE_IN the split is greedy (a knapsack): no longer the cheapest of all, but
    # never dearer than the rule it replaced, and still exactly the total.
    pools, current, total = case
    model = model_for(pools)
    res = run(pools, current, total, spec=Placement(spot_spread_min_pools=1))
    assert sum(res.replicas.values()) == total
    assert all(res.replicas[n] <= current[n] for n in pools)
    old = _dearest_replica_hour_first(pools, current, sum(current.values()) - total)
    assert res.cost_per_hour_usd <= placement_cost(model, pools, {}, old) + 1e-6


# -- the scale-down window's replicas are not bought again in the cloud --------------------------

def test_replicas_only_the_window_holds_are_not_bought_again_in_the_cloud() -> None:
    # 2 on-prem (full) and 4 on spot-a, which becomes unavailable with 1 ready: 3 are dropped. Of
    # the total 6, the window holds 4 above what the rules ask (2): nothing is bought for them.
    lost = {"spot_a": {"available": False, "ready_replicas": 1}}
    before = run(STD, {"onprem": 2, "spot-a": 4}, 6, extra=lost)
    assert before.replicas == {"onprem": 2, "spot-a": 1, "spot-b": 3, "od": 0}  # without the rule: re-bought
    held = run(STD, {"onprem": 2, "spot-a": 4}, 6, extra=lost, window_held=4)
    assert held.replicas == {"onprem": 2, "spot-a": 1, "spot-b": 0, "od": 0}
    assert held.not_replaced == 3 and held.reason == Reason.HELD_NOT_REPLACED.value
    assert not held.capacity_limited and not held.budget_limited
    assert any(code == Reason.HELD_NOT_REPLACED.value and "3 of 6" in msg for code, msg in held.events)
    # what the rules ask beyond what is kept is bought as before: 6 - 1 held = 5, 3 kept
    some = run(STD, {"onprem": 2, "spot-a": 4}, 6, extra=lost, window_held=1)
    assert some.replicas == {"onprem": 2, "spot-a": 1, "spot-b": 2, "od": 0} and some.not_replaced == 1


def test_held_replicas_take_on_prem_room_and_free_slots_on_nodes_already_paid_for() -> None:
    # on-prem room is used for them (it is there already)
    roomy = run(STD, {"onprem": 0, "spot-a": 3}, 3, extra={"spot_a": {"available": False, "ready_replicas": 0}},
                window_held=3)
    assert roomy.replicas == {"onprem": 2, "spot-a": 0, "spot-b": 0, "od": 0} and roomy.not_replaced == 1
    # two replicas a node on spot-b: the node bought for the one the rules ask holds a held one free
    pools = fleet(pool("onprem", ONPREM, 4.0, nodes=1), pool("spot-a", AWS_SPOT, 2.0), pool("spot-b", GCP_SPOT, 3.0, gpus=2))
    res = run(pools, {"onprem": 1, "spot-a": 4}, 5, extra={"spot_a": {"available": False, "ready_replicas": 1}},
              window_held=2)
    assert res.replicas == {"onprem": 1, "spot-a": 1, "spot-b": 2}
    assert res.not_replaced == 1
    assert res.cost_per_hour_usd == pytest.approx(4.0 + 2.0 + 3.0)


def test_on_demand_orders_only_the_window_holds_are_cancelled_whole_nodes_and_not_ready_only() -> None:
    # od: one replica a node, 3 placed, 1 ready; the window alone holds 2 of the total 7
    starting = {"od": {"ready_replicas": 1}}
    res = run(STD, {"onprem": 2, "spot-a": 2, "od": 3}, 7, extra=starting, window_held=2)
    assert res.replicas["od"] == 1 and res.replicas["onprem"] == 2 and res.total - res.spare == 5  # none bought for them
    assert res.not_replaced == 2 and res.reason == Reason.HELD_NOT_REPLACED.value
    assert any("2 on-demand not ready yet" in msg and "cancelled" in msg for _, msg in res.events)
    # a ready one is never cancelled, whatever the window holds
    assert run(STD, {"onprem": 2, "spot-a": 2, "od": 3}, 7, extra=starting, window_held=5).replicas["od"] == 1
    # without the window's share nothing goes
    assert run(STD, {"onprem": 2, "spot-a": 2, "od": 3}, 7, extra=starting).replicas["od"] == 3
    # spot orders stay: they serve sooner and cost less
    spot_starting = {"spot_a": {"ready_replicas": 0}}
    spot = run(STD, {"onprem": 2, "spot-a": 2}, 4, extra=spot_starting, window_held=2)
    assert spot.replicas["spot-a"] + spot.replicas["spot-b"] == 2 and spot.not_replaced == 0
    # four replicas a node: taking off a node that stays saves nothing; only a whole node goes
    pools = fleet(pool("onprem", ONPREM, 4.0, nodes=1), pool("od", AWS_OD, 40.0, gpus=4, nodes=2))
    one_ready = {"od": {"ready_replicas": 1}}
    assert run(pools, {"onprem": 1, "od": 4}, 5, extra=one_ready, window_held=3).replicas["od"] == 4
    assert run(pools, {"onprem": 1, "od": 8}, 9, extra=one_ready, window_held=5).replicas["od"] == 4
    # not while spares are held: an on-demand order may be the fallback return's or the hedge's
    assert run(STD, {"onprem": 2, "spot-a": 2, "od": 3}, 7, extra=starting, window_held=2,
               returning=1).replicas["od"] == 3


def test_a_budget_that_removed_replicas_is_the_reason_not_the_window() -> None:
    res = run(STD, {"onprem": 2, "spot-a": 4}, 6, cap=10.0, window_held=4)
    assert res.budget_limited and res.not_replaced == 0
    assert res.reason == Reason.BUDGET_CAP_REACHED.value


def test_no_cloud_to_buy_is_capacity_not_the_window() -> None:
    pools = fleet(pool("onprem", ONPREM, 4.0, nodes=2))
    res = run(pools, {"onprem": 2}, 4, window_held=2)
    assert res.capacity_limited and res.not_replaced == 0
    assert res.reason == Reason.CAPACITY_EXHAUSTED.value


@given(scenarios(), st.integers(0, 12))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_prop_held_replicas_never_add_cloud_nodes(sc: Scenario, window_held: int) -> None:
    """With ``window_held``, the cloud holds no more nodes than without it, the placement never
    costs more, on-prem is filled as before, and the total falls short of it by at most what is
    reported as not replaced."""
    # without the fallback return, which may move on-demand replicas to on-prem room once no
    # on-demand order is starting (as the window's cancellations can leave it)
    spec = sc.spec.model_copy(update={"return_from_fallback": False})
    plain = place(model=sc.model, pools=sc.pools, states=sc.states, total=sc.total, placement=spec,
                  max_cost_per_hour_usd=sc.cap)
    held = place(model=sc.model, pools=sc.pools, states=sc.states, total=sc.total, placement=spec,
                 max_cost_per_hour_usd=sc.cap, window_held=window_held)
    onprem = [n for n, p in sc.pools.items() if p.tier is Tier.ONPREM]
    if plain.budget_limited:
        # on-demand orders the window held, cancelled, free budget that the fill may spend on
        # what the rules ask (on-prem, spot): within the cap, not as before
        assert sc.cap is not None and held.cost_per_hour_usd <= sc.cap + 1e-9
    else:
        assert held.cost_per_hour_usd <= plain.cost_per_hour_usd + 1e-9
        assert [held.replicas[n] for n in onprem] == [plain.replicas[n] for n in onprem]
    assert held.not_replaced <= window_held
    assert plain.total - held.total <= held.not_replaced
