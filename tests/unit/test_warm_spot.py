"""The warm spot node (``placement.warm_spot_at``): while the load now fills most of the on-prem
slots, one spare replica holds a spot node, so that a step beyond on-prem is served from that
node's free slots after the cold start alone instead of a new node's provisioning plus the cold
start."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.core.model import Decision, History, PoolSpec, Tier
from controller.core.pipeline import decide
from controller.core.placement import SPARE_STATE_KEY, WARM_STATE_KEY, warm_spot
from controller.core.policy import EffectivePolicy
from controller.core.spec import SLO, Bounds, Budget, CapacityLearning, Placement, PolicySpec, RuleSpec
from controller.sim.baselines import TidegateController
from controller.sim.engine import simulate
from policies.base import Registry
from tests.unit import simulator_fixtures as F
from tests.unit import test_pipeline as tp
from tests.unit.test_placement import AWS_SPOT, GCP_SPOT, ONPREM, fleet, pool, run

# two on-prem nodes of 4 slots, a spot pool of 4-slot nodes, a cheaper spot pool of 1-slot nodes
FLEET = fleet(pool("onprem", ONPREM, 16.0, gpus=4, nodes=2), pool("spot", AWS_SPOT, 20.0, gpus=4, nodes=3),
              pool("gcp", GCP_SPOT, 4.0, gpus=1, nodes=6))
WARM = {"warm_spot": True}


def test_one_spare_holds_the_spot_pool_with_the_most_slots_per_node() -> None:
    off = run(FLEET, {}, 7)
    on = run(FLEET, {}, 7, **WARM)
    assert off.replicas == {"onprem": 7, "spot": 0, "gcp": 0} and off.spare == 0
    # the 4-slot pool, not the cheaper 1-slot one: its 3 free slots are what a step gets fast
    assert on.replicas == {"onprem": 7, "spot": 1, "gcp": 0}
    assert on.warm_spare == 1 and on.spare == 1 and on.total == 8
    assert on.cost_per_hour_usd == off.cost_per_hour_usd + 20.0
    assert ("Placed", "warm spot node: 1 on spot (spare; a step beyond on-prem gets its 3 free slots after the "
                      "cold start alone)") in on.events
    # spread over one pool, step 4 fills the cheapest alone, whose nodes hold one replica: a warm
    # node there has no free slot, one on the other pool would not get the step's replicas: none
    one = run(FLEET, {}, 7, spec=Placement(spot_spread_min_pools=1), **WARM)
    assert one.replicas == {"onprem": 7, "spot": 0, "gcp": 0} and one.warm_spare == 0
    assert ("Placed", "warm spot node: none (no spot pool among the 1 a scale-up fills first takes replicas on "
                      "nodes of more than one within the budget)") in one.events
    # with paid slots too: the on-prem node's free slot and the warm node, each a spare
    both = run(FLEET, {}, 7, spec=Placement(fill_paid_nodes=True), **WARM)
    assert both.replicas == {"onprem": 8, "spot": 1, "gcp": 0} and both.paid_spare == 1 and both.warm_spare == 1
    assert both.spare == 2


def test_no_spare_where_spot_already_holds_replicas() -> None:
    # the total spills to spot: those replicas hold spot nodes already
    res = run(FLEET, {}, 11, **WARM)
    assert res.replicas["onprem"] == 8 and res.replicas["spot"] + res.replicas["gcp"] == 3
    assert res.warm_spare == 0
    # the spare is held tick after tick: the previous one is trimmed as excess and placed again
    again = run(FLEET, {"onprem": 7, "spot": 1}, 7, **WARM)
    assert again.replicas == {"onprem": 7, "spot": 1, "gcp": 0} and again.warm_spare == 1


def test_bounds_the_cloud_ceiling_the_budget_and_unavailable_pools_stop_it() -> None:
    full = run(FLEET, {}, 7, max_total=7, **WARM)
    assert full.replicas["spot"] == full.replicas["gcp"] == 0 and full.warm_spare == 0
    assert ("Placed", "warm spot node: none (max_replicas or the cloud ceiling reached)") in full.events
    assert run(FLEET, {}, 7, max_cloud=0, **WARM).warm_spare == 0
    # $32/h on-prem: the $20 node fits under $52, not under $51 (the 1-slot pool is no warm node)
    assert run(FLEET, {}, 7, cap=52.0, **WARM).replicas == {"onprem": 7, "spot": 1, "gcp": 0}
    tight = run(FLEET, {}, 7, cap=51.0, **WARM)
    assert tight.replicas == {"onprem": 7, "spot": 0, "gcp": 0} and tight.cost_per_hour_usd <= 51.0
    # the 4-slot pool unavailable (capacity gone) or drained: no warm node (the other's nodes hold one)
    gone = run(FLEET, {}, 7, extra={"spot": {"available": False}}, **WARM)
    assert gone.replicas == {"onprem": 7, "spot": 0, "gcp": 0} and gone.warm_spare == 0
    drained = run(FLEET, {}, 7, drained=("spot",), **WARM)
    assert drained.replicas == {"onprem": 7, "spot": 0, "gcp": 0} and drained.warm_spare == 0
    # two pools of 4-slot nodes: the cheaper when one is drained, the other when it is not
    four = fleet(pool("onprem", ONPREM, 16.0, gpus=4, nodes=2), pool("a", AWS_SPOT, 20.0, gpus=4, nodes=3),
                 pool("b", GCP_SPOT, 16.0, gpus=4, nodes=3))
    assert run(four, {}, 7, **WARM).replicas == {"onprem": 7, "a": 0, "b": 1}
    assert run(four, {}, 7, drained=("b",), **WARM).replicas == {"onprem": 7, "a": 1, "b": 0}


@settings(max_examples=150, deadline=None)
@given(current=st.fixed_dictionaries({"onprem": st.integers(0, 8), "spot": st.integers(0, 12), "gcp": st.integers(0, 6)}),
       total=st.integers(0, 20), max_total=st.one_of(st.none(), st.integers(0, 20)),
       cap=st.one_of(st.none(), st.floats(10.0, 200.0)))
def test_at_most_one_spare_on_spot_only_when_spot_is_empty_and_within_every_bound(
        current: dict[str, int], total: int, max_total: int | None, cap: float | None) -> None:
    off = run(FLEET, current, total, max_total=max_total, cap=cap)
    on = run(FLEET, current, total, max_total=max_total, cap=cap, **WARM)
    assert on.replicas["onprem"] == off.replicas["onprem"]
    spot_off, spot_on = off.replicas["spot"] + off.replicas["gcp"], on.replicas["spot"] + on.replicas["gcp"]
    assert spot_on - spot_off == on.warm_spare in (0, 1)
    if on.warm_spare:
        assert spot_off == 0 and on.replicas["gcp"] == 0  # never the pool of 1-replica nodes
        assert max_total is None or on.total <= max_total
        assert cap is None or on.cost_per_hour_usd <= cap + 1e-9


def test_held_while_the_need_reaches_the_share_and_for_the_hold_after() -> None:
    args = {"slots": 8, "at": 0.75, "hold_s": 600.0}
    assert warm_spot({}, present=5, now_s=0.0, **args) == (False, {})
    assert warm_spot({}, present=6, now_s=0.0, **args) == (True, {"until": 600.0})
    # the need falls: held until the hold has run out, then released with no state left
    assert warm_spot({"until": 600.0}, present=2, now_s=599.0, **args) == (True, {"until": 600.0})
    assert warm_spot({"until": 600.0}, present=2, now_s=600.0, **args) == (False, {})
    # reaching it again moves the end
    assert warm_spot({"until": 600.0}, present=7, now_s=300.0, **args) == (True, {"until": 900.0})
    # no on-prem slots: never (the node is for steps beyond on-prem); a broken state reads as none
    assert warm_spot({}, present=30, now_s=0.0, slots=0, at=0.75, hold_s=600.0) == (False, {})
    for bad in ("soon", math.nan, math.inf, None):
        assert warm_spot({"until": bad}, present=0, now_s=0.0, **args) == (False, {})
    # no rule can tell the need (missing data): a held node stays past its end, none is started
    assert warm_spot({"until": 600.0}, present=None, now_s=5000.0, **args) == (True, {"until": 600.0})
    assert warm_spot({}, present=None, now_s=0.0, **args) == (False, {})
    # the first need known after decides
    assert warm_spot({"until": 600.0}, present=2, now_s=5005.0, **args) == (False, {})


# the pipeline tests' fleet with spot-a on nodes of 4 replicas (its own nodes hold one)
POOLS4 = {**tp.POOLS, "spot-a": PoolSpec("spot-a", Tier.SPOT, "aws", "A100", 4, 6, 8.0)}


def _decide(pol: EffectivePolicy, placement: dict[str, int] | None = None, history: History | None = None,
            now=tp.NOW) -> Decision:  # type: ignore[no-untyped-def]
    return decide(model=tp.MODEL, pools=POOLS4, signals=tp.signals(placement, now), policy=pol,
                  history=history or History(), overrides=(), now=now)


def test_the_pipeline_holds_it_as_no_demand_and_lets_it_go_after_the_hold() -> None:
    # one on-prem node of 4 slots. A rule asks 3 (0.75 of 4): 3 on-prem and one warm spare on
    # spot-a; a second rule with missing data holds the current replicas, which would ratchet to
    # 4 if the spare were read as demand
    place = {"warm_spot_at": 0.75, "warm_spot_hold_s": 600}
    pol = tp.policy(tp.fixed(3), tp.fixed(rule="gone", missing=True), placement=place)
    d = _decide(pol)
    assert d.placement == {"onprem": 3, "spot-a": 1, "spot-b": 0, "od": 0}
    assert d.history.rule_state[WARM_STATE_KEY] == {"until": tp.NOW.timestamp() + 600}
    assert d.history.rule_state[SPARE_STATE_KEY] == {"spare": 1}
    assert any("warm spot node: 1 on spot-a" in s.message for s in d.trace)
    for _ in range(3):
        d = _decide(pol, d.placement, history=d.history)
        assert d.recommendations[0].replicas == 3 and d.placement["spot-a"] == 1 and sum(d.placement.values()) == 4
    # the need falls to 1: the node stays for the hold, then goes
    low = tp.policy(tp.fixed(1), placement=place)
    for seconds, held in ((300, True), (599, True), (601, False)):
        d = _decide(low, d.placement, history=d.history, now=tp.NOW + timedelta(seconds=seconds))
        assert d.placement["spot-a"] == (1 if held else 0), seconds
    assert WARM_STATE_KEY not in d.history.rule_state and sum(d.placement.values()) == 1
    # missing data releases nothing: held, then the rules' inputs go missing past the hold's end
    d = _decide(pol)
    blind = tp.policy(tp.fixed(rule="gone", missing=True), placement=place)
    for seconds in (300, 900, 3600):
        d = _decide(blind, d.placement, history=d.history, now=tp.NOW + timedelta(seconds=seconds))
        assert d.placement["spot-a"] == 1, seconds
    # the need beyond on-prem: the step's replicas go to spot-a, whose node the spare kept
    up = _decide(tp.policy(tp.fixed(6), placement=place), {"onprem": 3, "spot-a": 1})
    assert up.placement["onprem"] == 4 and up.placement["spot-a"] >= 1 and sum(up.placement.values()) == 6
    # off (the default): no state, no spare
    plain = _decide(tp.policy(tp.fixed(3)))
    assert sum(plain.placement.values()) == 3 and WARM_STATE_KEY not in plain.history.rule_state


def _policy(warm: float | None) -> EffectivePolicy:
    params = {"capacity_fraction": 0.8, "gpu_utilization_target_pct": None}
    spec = PolicySpec(model="llama3-70b-fp8", bounds=Bounds(min_replicas=2, max_replicas=16),
                      slo=SLO(ttft_p99_ms=1500, tpot_ms=100, p99_latency_ms=20000, queue_depth_per_replica=4),
                      rules=(RuleSpec(kind="slo-guard", params=params),), budget=Budget(),
                      capacity=CapacityLearning(learn=False), placement=Placement(warm_spot_at=0.75))
    if warm is None:
        spec = spec.model_copy(update={"placement": Placement()})
    rule = Registry.from_entry_points().build("slo-guard", params)
    return EffectivePolicy(model="llama3-70b-fp8", spec=spec, rules=(rule,), version="test")


def test_a_step_beyond_on_prem_is_served_a_provisioning_delay_sooner() -> None:
    # one on-prem node (4 replicas), a spot pool of 4-slot nodes that take 300 s to provision, a
    # 180 s cold start. 20 minutes at 3.2 replicas' load (the need fills 3 of 4 slots), then twice
    # that: with the warm node, its 3 free slots serve 180 s after the step (cold start); without,
    # the first spot replicas serve 480 s after it (a new node, then the cold start)
    fixture = F.pools()
    pools = {"onprem": fixture["onprem"], "aws-spot": replace(fixture["aws-spot"], provisioning_delay_s=300.0)}
    r = F.rate_at_slo() * 0.8
    step_s, end_s = 1200.0, 2400.0
    work = F.step_trace(step_s, end_s, 3.2 * r, 6.4 * r, seed=4)
    runs = {}
    for warm in (None, 0.75):
        res = simulate(F.setup(work, pool_specs=pools, mode="fluid", seed=2, cold_start_s=180.0,
                               duration_s=end_s, initial_replicas=3), TidegateController(_policy(warm)))
        tl = res.timeline
        ready = [a + b for a, b in zip(tl["ready:onprem"], tl["ready:aws-spot"])]
        first = next(t for t, n in zip(tl["t_s"], ready) if t > step_s and n >= 6)
        spot_before = max(n for t, n in zip(tl["t_s"], tl["ready:aws-spot"]) if step_s - 300 < t < step_s)
        runs[warm] = (first - step_s, spot_before, res.summary["slo_attainment"], res.summary["cost_usd"])
    (late, cold_spot, cold_att, cold_cost), (soon, warm_spot_ready, warm_att, warm_cost) = runs[None], runs[0.75]
    assert cold_spot == 0 and warm_spot_ready == 1  # the warm node serves one replica before the step
    assert soon <= 180.0 + 60.0 < 300.0 + 180.0 <= late
    assert warm_att > cold_att
    assert warm_cost > cold_cost  # the node is paid for the 20 minutes before the step


def test_a_percent_for_the_share_is_rejected_with_its_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from controller.policyfile import load_policy_files
    from tests.unit.test_policyfile import MODELS, policy

    f = tmp_path / "warm.yaml"
    f.write_text(policy(body="placement:\n  warm_spot_at: 75\n"))
    result = load_policy_files([f], Registry.from_entry_points(), known_models=MODELS)
    (err,) = result.errors
    assert (err.path, err.line) == ("spec.placement.warm_spot_at", 8), err
    assert "less than or equal to 1" in err.message and result.policies == {}
    f.write_text(policy(body="placement:\n  warm_spot_at: 0.75\n  warm_spot_hold_s: 300\n"))
    ok = load_policy_files([f], Registry.from_entry_points(), known_models=MODELS)
    assert ok.errors == () and ok.policies["llama3-70b-fp8"].spec.placement.warm_spot_at == 0.75
