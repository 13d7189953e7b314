"""The simulated providers over the one simulated world (``controller.sim.world``: the simulator's
``Simulation``, driven from outside): protocol conformance, determinism, the load curve, node
provisioning and cold starts, interruptions, capacity windows, the service model's signals, prices,
idempotent actuation and invariants.

Everything runs on a ``ManualClock``: time moves when the test says so, nothing sleeps.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from controller.config import DaemonConfig
from controller.core.model import ActionStatus, ModelSpec, PoolState, Sample
from controller.core.pricing import with_cost
from controller.protocols import (
    MetricsSource, PermanentProviderError, PoolProvider, PriceSource, TransientProviderError,
)
from providers.registry import installed
from providers.clock import ManualClock
from controller.sim.load import LoadCurve, LoadShape
from controller.sim.prices import SpotPriceWalk
from providers.sim import CALL_RESIZE_NODE_GROUP, CALL_SCALE_DEPLOYMENT, SimProviders, build_simulated_providers

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)

A100 = {"gpu_type": "A100-80GB", "gpus_per_node": 8}
POOLS: list[dict[str, Any]] = [
    {"name": "onprem", "kind": "onprem", **A100, "max_nodes": 1, "price_per_node_hour_usd": 10.0},
    {"name": "aws-spot", "kind": "aws-spot", **A100, "max_nodes": 4, "price_per_node_hour_usd": 12.0,
     "provisioning_delay_s": 180},
    {"name": "aws-od", "kind": "aws-ondemand", **A100, "max_nodes": 4, "min_nodes": 1,
     "price_per_node_hour_usd": 32.0, "provisioning_delay_s": 120},
    {"name": "gcp-spot", "kind": "gcp-spot", "gpu_type": "L4", "gpus_per_node": 4, "max_nodes": 6,
     "price_per_node_hour_usd": 3.0, "provisioning_delay_s": 60},
]
LLAMA: dict[str, Any] = {
    "name": "llama", "tp_degree": 2, "quantization": "fp8", "gpu_types": ["A100-80GB", "L4"], "cold_start_s": 90,
    "capacity": {"A100-80GB": {"output_tokens_per_s": 1000, "requests_per_s": 3},
                 "L4": {"output_tokens_per_s": 300, "requests_per_s": 2}},
    "deployments": {p["name"]: {"name": f"llama-{p['name']}"} for p in POOLS},
}
MISTRAL: dict[str, Any] = {
    "name": "mistral", "tp_degree": 4, "quantization": "int4-awq", "gpu_types": ["A100-80GB"], "cold_start_s": 30,
    "capacity": {"A100-80GB": {"output_tokens_per_s": 2000, "requests_per_s": 6}},
    "deployments": {"onprem": {"name": "mistral-onprem"}, "aws-spot": {"name": "mistral-spot"}},
}


def make_config(models: list[dict[str, Any]] | None = None, **sim: Any) -> DaemonConfig:
    providers = {"type": "simulated", "seed": 7, "base_requests_per_s": 2.0, "peak_requests_per_s": 30.0,
                 "period_s": 3600, **sim}
    return DaemonConfig.model_validate({"providers": providers, "pools": POOLS, "models": models or [LLAMA]})


def make_world(models: list[dict[str, Any]] | None = None, **sim: Any,
               ) -> tuple[SimProviders, ManualClock, dict[str, ModelSpec]]:
    cfg = make_config(models, **sim)
    clock = ManualClock(T0)
    return build_simulated_providers(cfg, clock), clock, cfg.model_specs()


def v(sample: Sample) -> float:
    """The value of a sample that must be present."""
    assert sample.value is not None, sample
    return sample.value


def constant_load(rps: float, **more: Any) -> dict[str, Any]:
    return {"base_requests_per_s": rps, "peak_requests_per_s": rps, **more}


# -- protocols and wiring ----------------------------------------------------------------------------


def test_providers_implement_the_protocols() -> None:
    cfg = make_config()
    sp = build_simulated_providers(cfg, ManualClock(T0))
    assert isinstance(sp.metrics, MetricsSource)
    assert isinstance(sp.prices, PriceSource)
    assert set(sp.pools) == {p["name"] for p in POOLS}
    for name, provider in sp.pools.items():
        assert isinstance(provider, PoolProvider)
        assert provider.pool == cfg.pool_specs()[name]


def test_real_providers_config_is_refused() -> None:
    cfg = DaemonConfig.model_validate({"providers": {"type": "real"}, "pools": [POOLS[0]], "models": [
        {**LLAMA, "deployments": {"onprem": {"name": "x"}}}]})
    with pytest.raises(ValueError, match="simulated"):
        build_simulated_providers(cfg, ManualClock(T0))


def test_initial_world_onprem_ready_replicas_cloud_pools_at_min_nodes() -> None:
    sp, clock, specs = make_world([LLAMA, MISTRAL], initial_onprem_replicas=2)
    now = clock.now()
    st_ = {p: sp.pools[p].state(specs["llama"], now) for p in ("onprem", "aws-spot", "aws-od", "gcp-spot")}
    assert (st_["onprem"].replicas, st_["onprem"].ready_replicas) == (2, 2)
    assert (st_["aws-spot"].replicas, st_["aws-spot"].nodes) == (0, 0)
    assert (st_["aws-od"].replicas, st_["aws-od"].ready_replicas, st_["aws-od"].nodes) == (0, 0, 1)
    assert all(s.available and s.at == now for s in st_.values())
    mistral = sp.pools["onprem"].state(specs["mistral"], now)
    assert (mistral.replicas, mistral.ready_replicas) == (2, 2)


# -- load --------------------------------------------------------------------------------------------


def test_load_starts_at_the_trough_and_peaks_mid_period() -> None:
    curve = LoadCurve(LoadShape(2.0, 30.0, 3600.0), seed=1)
    assert curve.requests_per_s(0) == pytest.approx(2.0)
    assert curve.requests_per_s(1800) == pytest.approx(30.0)
    assert curve.requests_per_s(900) == pytest.approx(16.0)
    assert curve.requests_per_s(3600) == pytest.approx(2.0)
    assert curve.requests_per_s(5000) == pytest.approx(curve.requests_per_s(1400))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("t0", "t1"), [(0, 10), (100, 3700), (1234.5, 1300.25), (0, 20000), (500, 500)])
def test_arrivals_is_the_integral_of_the_rate(seed: int, t0: float, t1: float) -> None:
    curve = LoadCurve(LoadShape(2.0, 30.0, 3600.0, burst_every_s=300, burst_factor=2.0, burst_duration_s=60),
                      seed=seed)
    n = 20000
    h = (t1 - t0) / n
    # Midpoint rule: exact up to the few steps that straddle a burst edge.
    numeric = sum(curve.requests_per_s(t0 + (i + 0.5) * h) for i in range(n)) * h
    assert curve.arrivals(t0, t1) == pytest.approx(numeric, rel=2e-3, abs=1e-9)


def test_bursts_multiply_the_load_and_are_seeded() -> None:
    shape = LoadShape(10.0, 10.0, 3600.0, burst_every_s=600, burst_factor=1.5, burst_duration_s=120)
    a, b, c = LoadCurve(shape, seed=7), LoadCurve(shape, seed=7), LoadCurve(shape, seed=8)
    horizon = 600.0 * 500
    bursts = a.bursts_overlapping(0, horizon)
    assert bursts == b.bursts_overlapping(0, horizon)
    assert bursts != c.bursts_overlapping(0, horizon)
    assert LoadCurve(shape, seed=7, stream="other").bursts_overlapping(0, horizon) != bursts
    start, end = bursts[0]
    mid = (start + end) / 2
    assert a.in_burst(mid) and a.requests_per_s(mid) == pytest.approx(15.0)
    assert not a.in_burst(end) or any(s <= end < e for s, e in bursts[1:])
    # Burst time over a long horizon matches the Poisson model: the fraction of time in a burst
    # is 1 - exp(-duration / mean_gap) (~18%); the seed is fixed, so this cannot flake.
    busy = sum(min(e, horizon) - max(s, 0.0) for s, e in bursts) / horizon
    assert busy == pytest.approx(1 - math.exp(-120 / 600), abs=0.02)


def test_load_is_a_pure_function_of_time_not_of_query_order() -> None:
    shape = LoadShape(2.0, 30.0, 3600.0, burst_every_s=300, burst_factor=2.0, burst_duration_s=90)
    ts = [i * 37.3 for i in range(500)]
    forward = [LoadCurve(shape, seed=3).requests_per_s(t) for t in ts]
    backward_curve = LoadCurve(shape, seed=3)
    backward = [backward_curve.requests_per_s(t) for t in reversed(ts)][::-1]
    assert forward == backward


# -- determinism -------------------------------------------------------------------------------------


def run_scenario(seed: int) -> list[Any]:
    sp, clock, specs = make_world([LLAMA, MISTRAL], seed=seed, burst_every_s=400, burst_factor=2.0,
                                  interruptions_per_node_hour=3.0)
    llama = specs["llama"]
    record: list[Any] = []
    plan = {0: ("aws-spot", 6, 2), 60: ("gcp-spot", 4, 2), 240: ("aws-od", 3, 1), 400: ("aws-spot", 2, 1)}
    for i in range(480):
        now = clock.advance(5)
        if i in plan:
            pool, r, n = plan[i]
            sp.pools[pool].scale(llama, r, n, now)
        record.append(sp.metrics.observe(list(specs.values()), now))
        record.append([sp.pools[p].state(llama, now) for p in ("aws-spot", "gcp-spot", "aws-od")])
        record.append(sp.prices.prices(list(sp.world.pool_specs.values()), now))
    return record


def test_same_seed_same_world_different_seed_different_world() -> None:
    first, again, other = run_scenario(11), run_scenario(11), run_scenario(12)
    assert first == again
    assert first != other


def test_observing_more_often_does_not_change_the_fleet() -> None:
    """Events land at their own times: a world looked at every 5 s and one looked at every 15 min
    hold the same fleet at the hour and have seen the same load."""
    outcomes = []
    for every_s in (5, 900):
        sp, clock, specs = make_world(seed=3, burst_every_s=300, burst_factor=2.0, interruptions_per_node_hour=2.0)
        llama = specs["llama"]
        sp.pools["aws-spot"].scale(llama, 6, 2, clock.now())
        for _ in range(3600 // every_s):
            sp.metrics.observe([llama], clock.advance(every_s))
        state = sp.pools["aws-spot"].state(llama, clock.now())
        outcomes.append((state.ready_replicas, state.nodes, state.recent_interruptions, sp.world.served("llama")[0]))
    assert outcomes[0] == outcomes[1]


# -- actuation ---------------------------------------------------------------------------------------


def test_cloud_scale_out_orders_nodes_first_and_repeating_it_is_a_noop() -> None:
    sp, clock, specs = make_world()
    llama, spot = specs["llama"], sp.pools["aws-spot"]
    now = clock.advance(10)
    first = spot.scale(llama, 6, 2, now)
    assert [(a.call, a.status) for a in first] == [
        (CALL_RESIZE_NODE_GROUP, ActionStatus.OK), (CALL_SCALE_DEPLOYMENT, ActionStatus.OK)]
    assert first[0].arguments["nodes"] == 2 and first[1].arguments["replicas"] == 6
    assert all(a.pool == "aws-spot" and a.model == "llama" for a in first)
    state_after_first = spot.state(llama, now)
    signals_after_first = sp.metrics.observe([llama], now)
    second = spot.scale(llama, 6, 2, now)
    assert [(a.call, a.status) for a in second] == [
        (CALL_RESIZE_NODE_GROUP, ActionStatus.NOOP), (CALL_SCALE_DEPLOYMENT, ActionStatus.NOOP)]
    assert spot.state(llama, now) == state_after_first
    assert sp.metrics.observe([llama], now) == signals_after_first
    # Later, once everything is up, the same call is still harmless.
    later = clock.advance(1000)
    before = spot.state(llama, later)
    assert all(a.status is ActionStatus.NOOP for a in spot.scale(llama, 6, 2, later))
    assert spot.state(llama, later) == before
    assert list(sp.actions)[-2:] == list(spot.scale(llama, 6, 2, later))


def test_cloud_scale_in_removes_replicas_before_nodes_and_keeps_the_rest_serving() -> None:
    sp, clock, specs = make_world()
    llama, spot = specs["llama"], sp.pools["aws-spot"]
    spot.scale(llama, 8, 2, clock.now())
    now = clock.advance(180 + 90)
    assert spot.state(llama, now).ready_replicas == 8
    actions = spot.scale(llama, 4, 1, now)
    assert [(a.call, a.status) for a in actions] == [
        (CALL_SCALE_DEPLOYMENT, ActionStatus.OK), (CALL_RESIZE_NODE_GROUP, ActionStatus.OK)]
    state = spot.state(llama, now)
    # The emptied node was released, not a busy one: the 4 kept replicas never stopped serving.
    assert (state.replicas, state.ready_replicas, state.nodes) == (4, 4, 1)


def test_onprem_scale_makes_only_the_deployment_call() -> None:
    sp, clock, specs = make_world()
    onprem = sp.pools["onprem"]
    actions = onprem.scale(specs["llama"], 3, 1, clock.now())
    assert [(a.call, a.status) for a in actions] == [(CALL_SCALE_DEPLOYMENT, ActionStatus.OK)]
    assert [a.status for a in onprem.scale(specs["llama"], 3, 1, clock.now())] == [ActionStatus.NOOP]


def test_node_group_never_goes_below_min_nodes() -> None:
    sp, clock, specs = make_world()
    od = sp.pools["aws-od"]
    actions = od.scale(specs["llama"], 0, 0, clock.now())
    assert all(a.status is ActionStatus.NOOP for a in actions)
    resize = next(a for a in actions if a.call == CALL_RESIZE_NODE_GROUP)
    assert resize.arguments["nodes"] == 1 and resize.arguments["requested_nodes"] == 0
    assert od.state(specs["llama"], clock.advance(600)).nodes == 1


@pytest.mark.parametrize(("pool", "replicas", "nodes", "match"), [
    ("aws-spot", -1, 1, "replicas"),
    ("aws-spot", 1, 5, "max_nodes"),
    ("aws-spot", 1, -1, "nodes"),
])
def test_invalid_scale_requests_are_permanent_errors(pool: str, replicas: int, nodes: int, match: str) -> None:
    sp, clock, specs = make_world()
    with pytest.raises(PermanentProviderError, match=match):
        sp.pools[pool].scale(specs["llama"], replicas, nodes, clock.now())
    assert list(sp.actions) == []


def test_unknown_pool_or_model_is_a_permanent_error() -> None:
    sp, clock, specs = make_world([LLAMA, MISTRAL])
    with pytest.raises(PermanentProviderError, match="nosuch"):
        sp.fail_next("nosuch", TransientProviderError("x"))
    with pytest.raises(PermanentProviderError, match="no Deployment"):
        sp.pools["gcp-spot"].state(specs["mistral"], clock.now())
    with pytest.raises(PermanentProviderError, match="no Deployment"):
        sp.pools["gcp-spot"].scale(specs["mistral"], 1, 1, clock.now())


def test_injected_failure_raises_once_changes_nothing_and_is_logged() -> None:
    sp, clock, specs = make_world()
    spot, llama = sp.pools["aws-spot"], specs["llama"]
    sp.fail_next("aws-spot", TransientProviderError("throttled"), call=CALL_RESIZE_NODE_GROUP)
    with pytest.raises(TransientProviderError, match="throttled"):
        spot.scale(llama, 4, 1, clock.now())
    assert (spot.state(llama, clock.now()).replicas, spot.state(llama, clock.now()).nodes) == (0, 0)
    assert sp.actions[-1].status is ActionStatus.FAILED_TRANSIENT
    assert [a.status for a in spot.scale(llama, 4, 1, clock.now())] == [ActionStatus.OK, ActionStatus.OK]


# -- delays ------------------------------------------------------------------------------------------


def test_provisioning_delay_then_cold_start_before_ready() -> None:
    sp, clock, specs = make_world()
    llama, spot = specs["llama"], sp.pools["aws-spot"]
    start = clock.advance(30)
    spot.scale(llama, 2, 1, start)
    delay_s, cold_s = 180, 90

    def ready_at(offset_s: float) -> PoolState:
        return spot.state(llama, clock.set(start + timedelta(seconds=offset_s)))

    assert (ready_at(0).replicas, ready_at(0).ready_replicas, ready_at(0).nodes) == (2, 0, 1)
    assert ready_at(delay_s - 1).ready_replicas == 0
    assert ready_at(delay_s + cold_s - 1).ready_replicas == 0
    assert ready_at(delay_s + cold_s).ready_replicas == 2


def test_replicas_beyond_node_capacity_stay_pending_until_a_node_is_added() -> None:
    sp, clock, specs = make_world()
    llama, spot = specs["llama"], sp.pools["aws-spot"]
    spot.scale(llama, 6, 1, clock.now())          # one 8-GPU node holds 4 TP-2 replicas
    up = clock.advance(180 + 90)
    assert (spot.state(llama, up).replicas, spot.state(llama, up).ready_replicas) == (6, 4)
    assert spot.state(llama, clock.advance(3600)).ready_replicas == 4  # pending forever, not ready
    added = clock.now()
    spot.scale(llama, 6, 2, added)
    assert spot.state(llama, clock.set(added + timedelta(seconds=269))).ready_replicas == 4
    assert spot.state(llama, clock.set(added + timedelta(seconds=270))).ready_replicas == 6


def test_models_in_one_pool_hold_their_own_nodes_and_the_pool_counts_them_all() -> None:
    sp, clock, specs = make_world([LLAMA, MISTRAL])
    spot = sp.pools["aws-spot"]
    spot.scale(specs["mistral"], 1, 1, clock.now())    # 4 of a node's 8 GPUs
    spot.scale(specs["llama"], 4, 1, clock.now())      # a node of its own
    now = clock.advance(180 + 90)
    assert spot.state(specs["mistral"], now).ready_replicas == 1
    llama = spot.state(specs["llama"], now)
    assert (llama.ready_replicas, llama.nodes) == (4, 2)


def test_a_pools_node_count_follows_another_models_scale_at_the_same_instant() -> None:
    sp, clock, specs = make_world([LLAMA, MISTRAL])
    spot, now = sp.pools["aws-spot"], clock.now()
    assert spot.state(specs["llama"], now).nodes == 0
    spot.scale(specs["mistral"], 2, 1, now)  # ordered now: counted at once, in every model's view
    assert (spot.state(specs["llama"], now).nodes, spot.state(specs["mistral"], now).nodes) == (1, 1)
    spot.scale(specs["llama"], 4, 1, now)
    assert spot.state(specs["mistral"], now).nodes == 2


def test_a_large_onprem_pool_reports_every_node_and_binds_replicas_as_they_come() -> None:
    big = [{**POOLS[0], "max_nodes": 5000}, *POOLS[1:]]
    cfg = DaemonConfig.model_validate({"providers": {"type": "simulated", "seed": 7}, "pools": big,
                                       "models": [LLAMA, MISTRAL]})
    clock = ManualClock(T0)
    sp, specs = build_simulated_providers(cfg, clock), cfg.model_specs()
    onprem = sp.pools["onprem"]
    onprem.scale(specs["llama"], 9, 0, clock.now())  # 4 per 8-GPU node at TP 2: three nodes
    now = clock.advance(90)
    llama = onprem.state(specs["llama"], now)
    assert (llama.replicas, llama.ready_replicas, llama.nodes) == (9, 9, 2 * 5000)  # each model owns the pool's nodes
    # on-prem billed while they hold a pod (llama's three, mistral's one: its initial replica), and
    # llama's aws-od node group at its min_nodes
    assert sp.world.cost_per_hour_usd(now) == pytest.approx((3 + 1) * 10.0 + 32.0)


def test_capacity_shortage_fails_node_orders_and_marks_the_pool_unavailable() -> None:
    sp, clock, specs = make_world()
    llama, spot = specs["llama"], sp.pools["aws-spot"]
    sp.world.inject_capacity_shortage("aws-spot", clock.now(), 600)
    spot.scale(llama, 2, 1, clock.now())
    during = spot.state(llama, clock.advance(300))
    assert not during.available and "capacity unavailable" in (during.unavailable_reason or "")
    assert (during.nodes, during.ready_replicas) == (0, 0)
    after = spot.state(llama, clock.advance(300))
    assert after.available and after.nodes == 1 and after.ready_replicas == 0
    assert spot.state(llama, clock.advance(180 + 90)).ready_replicas == 2


def test_world_never_runs_backwards() -> None:
    sp, clock, specs = make_world()
    llama, spot = specs["llama"], sp.pools["aws-spot"]
    spot.scale(llama, 2, 1, clock.now())
    late = clock.advance(1000)
    state_late = spot.state(llama, late)
    early = clock.set(T0 + timedelta(seconds=10))
    state_early = spot.state(llama, early)
    assert state_early.ready_replicas == state_late.ready_replicas == 2
    assert state_early.at == early
    assert sp.world.time == late


# -- spot interruptions ------------------------------------------------------------------------------


def first_notice(sp: SimProviders, clock: ManualClock, llama: ModelSpec, pool: str) -> tuple[datetime, PoolState]:
    provider = sp.pools[pool]
    for _ in range(2000):
        now = clock.advance(10)
        state = provider.state(llama, now)
        if state.interrupted_replicas:
            return now, state
    raise AssertionError("no interruption notice within the horizon")


@pytest.mark.parametrize(("pool", "replicas", "nodes"), [("aws-spot", 8, 2), ("gcp-spot", 6, 3)])
def test_interruption_notice_a_replacement_then_the_replicas_move(pool: str, replicas: int, nodes: int) -> None:
    sp, clock, specs = make_world(interruptions_per_node_hour=1.0)
    llama, provider = specs["llama"], sp.pools[pool]
    provider.scale(llama, replicas, nodes, clock.now())
    up_s = sp.world.pool_specs[pool].provisioning_delay_s + llama.cold_start_s
    settled = provider.state(llama, clock.advance(up_s))
    assert (settled.ready_replicas, settled.interrupted_replicas, settled.recent_interruptions) == (replicas, 0, 0)

    noticed_at, noticed = first_notice(sp, clock, llama, pool)
    notice_s = installed().notice_s(sp.world.pool_specs[pool].provider)
    assert notice_s == {"aws-spot": 120.0, "gcp-spot": 30.0}[pool]
    assert noticed.recent_interruptions >= 1
    assert 0 < noticed.interrupted_replicas < replicas
    # During the notice the replicas still count and serve, and the node group orders a replacement.
    assert noticed.ready_replicas == replicas and noticed.nodes == nodes + 1
    # Once every noticed node is gone, the Deployment still wants all replicas; they come back on
    # the replacement after its provisioning and their cold start.
    back = provider.state(llama, clock.advance(notice_s + up_s))
    assert back.replicas == replicas and back.interrupted_replicas == 0
    assert (back.nodes, back.ready_replicas) == (nodes, replicas)


def test_an_injected_interruption_notices_the_newest_serving_node() -> None:
    sp, clock, specs = make_world()
    llama, spot = specs["llama"], sp.pools["aws-spot"]
    spot.scale(llama, 8, 2, clock.now())
    now = clock.advance(180 + 90)
    assert sp.world.interrupt("aws-spot", "llama", now)
    noticed = spot.state(llama, now)
    assert (noticed.interrupted_replicas, noticed.recent_interruptions, noticed.ready_replicas) == (4, 1, 8)
    assert not sp.world.interrupt("onprem", "llama", now) or sp.pools["onprem"].state(llama, now).recent_interruptions == 1


def test_interruptions_do_not_touch_on_demand_or_onprem() -> None:
    sp, clock, specs = make_world(interruptions_per_node_hour=50.0)
    llama = specs["llama"]
    sp.pools["aws-od"].scale(llama, 4, 1, clock.now())
    now = clock.advance(6 * 3600)
    for pool in ("aws-od", "onprem"):
        state = sp.pools[pool].state(llama, now)
        assert state.recent_interruptions == 0 and state.interrupted_replicas == 0
        assert state.ready_replicas == state.replicas


# -- the service model's signals ---------------------------------------------------------------------


def test_queue_latency_and_kv_cache_grow_above_capacity_and_recover_when_capacity_is_added() -> None:
    # 12 req/s against one on-prem replica serving at most 3 req/s
    sp, clock, specs = make_world(**constant_load(12.0))
    llama = specs["llama"]
    seen = [sp.metrics.observe([llama], clock.advance(30))["llama"] for _ in range(4)]
    queues = [v(s.queue_depth) for s in seen]
    assert all(b > a for a, b in zip(queues, queues[1:]))
    assert v(seen[-1].kv_cache_utilization_pct) > 0 and v(seen[-1].gpu_utilization_pct) > 90
    sp.pools["onprem"].scale(llama, 4, 1, clock.now())
    sp.pools["aws-od"].scale(llama, 4, 1, clock.now())     # 8 replicas: 24 req/s > 12
    later = sp.metrics.observe([llama], clock.advance(1200))["llama"]
    assert v(later.queue_depth) < queues[0]
    assert v(later.p99_latency_ms) < v(seen[-1].p99_latency_ms)
    assert v(later.output_tokens_per_s) == pytest.approx(12.0 * 250, rel=0.1)   # served what arrived
    assert v(later.input_tokens_per_s) == pytest.approx(12.0 * 1000, rel=0.1)


def test_the_world_keeps_what_its_scrapes_need_and_no_run_statistics() -> None:
    """The daemon's world is observed only through its scrapes: under a queueing load it reports
    TTFT from the scrape's histogram but never allocates the run's (five 2.5 KB arrays a model),
    and asking it for a run summary says so instead of reporting zeros."""
    from controller.sim.stats import ZERO_HIST

    sp, clock, specs = make_world(**constant_load(12.0))
    seen = [sp.metrics.observe([specs["llama"]], clock.advance(30))["llama"] for _ in range(4)]
    assert v(seen[-1].queue_depth) > 0 and v(seen[-1].p99_ttft_ms) > 0
    sim = sp.world.sims["llama"]
    run_hists = (sim.fluid_hist_ttft, sim.fluid_hist_e2e, sim.fluid_hist_tpot, sim.rec_hist_ttft, sim.rec_hist_e2e)
    assert all(h is ZERO_HIST for h in run_hists) and not sim.fluid_w and not sim.rec_w
    with pytest.raises(RuntimeError, match="run_stats"):
        sim._finish()


def test_more_ready_replicas_mean_lower_latency_and_utilization() -> None:
    results = []
    for replicas in (5, 7, 10):
        sp, clock, specs = make_world(**constant_load(12.0), initial_onprem_replicas=4)
        sp.pools["aws-od"].scale(specs["llama"], replicas - 4, 4, clock.now())
        sig = sp.metrics.observe([specs["llama"]], clock.advance(1200))["llama"]
        results.append((v(sig.p99_latency_ms), v(sig.kv_cache_utilization_pct)))
    for (p1, k1), (p2, k2) in zip(results, results[1:]):
        assert p2 < p1 and k2 < k1


def test_no_ready_replica_under_load_means_a_growing_queue_and_no_utilization() -> None:
    sp, clock, specs = make_world(**constant_load(5.0), initial_onprem_replicas=0)
    llama = specs["llama"]
    first = sp.metrics.observe([llama], clock.advance(30))["llama"]
    second = sp.metrics.observe([llama], clock.advance(30))["llama"]
    assert v(second.queue_depth) > v(first.queue_depth) > 0
    assert second.gpu_utilization_pct.value is None and second.kv_cache_utilization_pct.value is None
    assert second.output_tokens_per_s.value == 0.0
    # as Triton counts them: nothing succeeded, while the arrivals (the queue's growth) are the load
    assert second.request_rate_per_s.value == 0.0
    assert second.arrival_rate_per_s.value == pytest.approx(5.0, rel=0.3)


def test_cost_per_token_is_priced_from_the_pool_states_and_the_served_tokens() -> None:
    sp, clock, specs = make_world(**constant_load(2.0), mean_output_tokens=250, mean_input_tokens=1000)
    llama = specs["llama"]
    now = clock.advance(300)
    sig = sp.metrics.observe([llama], now)["llama"]
    # not measured (Prometheus does not either): the pricing module prices the pool states, here
    # one on-prem node at $10/h and the on-demand pool's idle minimum node at $32/h
    assert sig.cost_per_million_tokens_usd.value is None
    pools = {p: sp.pools[p].state(llama, now) for p in llama.pools}
    priced = with_cost(replace(sig, pools=pools), llama, sp.world.pool_specs, now)
    tokens_per_s = v(sig.output_tokens_per_s)
    assert tokens_per_s == pytest.approx(500.0, rel=0.2)
    assert v(priced.cost_per_million_tokens_usd) > 0


def test_metrics_gap_reads_as_missing_not_zero() -> None:
    sp, clock, specs = make_world()
    sp.world.inject_metrics_gap(T0 + timedelta(seconds=60), 30)
    during = sp.metrics.observe([specs["llama"]], clock.advance(70))["llama"]
    assert during.queue_depth.value is None and during.queue_depth.reason == "NoData"
    assert during.request_rate_per_s.value is None
    after = sp.metrics.observe([specs["llama"]], clock.advance(30))["llama"]
    assert after.request_rate_per_s.value is not None


def test_unknown_model_reads_as_missing() -> None:
    sp, clock, specs = make_world()
    ghost = ModelSpec("ghost", 1, "fp8", ("A100-80GB",), 0, {}, ())
    sig = sp.metrics.observe([ghost, specs["llama"]], clock.advance(30))
    assert sig["ghost"].p99_latency_ms.value is None and sig["ghost"].p99_latency_ms.reason == "UnknownModel"
    assert sig["llama"].request_rate_per_s.value is not None


# -- prices ------------------------------------------------------------------------------------------


def test_spot_prices_walk_around_the_static_price_deterministically() -> None:
    def week(seed: int, pool: str = "aws-spot") -> list[float]:
        walk = SpotPriceWalk(12.0, seed=seed, pool=pool)
        return [walk.price_usd(t) for t in range(0, 7 * 86400, 300)]

    series = week(7)
    assert series == week(7)
    assert series != week(8) and series != week(7, "gcp-spot")
    # Pure in time: asking out of order gives the same answers.
    backwards = SpotPriceWalk(12.0, seed=7, pool="aws-spot")
    assert [backwards.price_usd(t) for t in range(7 * 86400 - 300, -1, -300)] == series[::-1]
    assert series[0] == 12.0
    assert len(set(series)) > 100                                   # it moves ...
    assert all(12.0 * 0.6 <= p <= 12.0 * 1.6 for p in series)      # ... within a band ...
    assert sum(series) / len(series) == pytest.approx(12.0, rel=0.1)  # ... around the static price
    steps = [abs(b / a - 1) for a, b in zip(series, series[1:])]
    assert max(steps) < 0.15                                        # ... slowly


def test_price_source_pool_state_and_billing_agree_on_live_spot_prices() -> None:
    sp, clock, specs = make_world()
    sp.pools["aws-spot"].scale(specs["llama"], 4, 1, clock.now())
    now = clock.advance(5 * 3600)
    prices = sp.prices.prices(list(sp.world.pool_specs.values()), now)
    assert set(prices) == {"aws-spot", "gcp-spot"}
    for pool, price in prices.items():
        assert sp.pools[pool].state(specs["llama"], now).price_per_node_hour_usd == price
    assert sp.pools["aws-od"].state(specs["llama"], now).price_per_node_hour_usd is None
    # what the world bills per hour: the on-prem node, the on-demand minimum, the spot node live
    assert sp.world.cost_per_hour_usd(now) == pytest.approx(10.0 + 32.0 + prices["aws-spot"])


# -- invariants --------------------------------------------------------------------------------------

CLOUD_POOLS = ["aws-spot", "aws-od", "gcp-spot"]
step = st.tuples(
    st.floats(min_value=0, max_value=900, allow_nan=False),          # seconds to advance
    st.sampled_from(["onprem", *CLOUD_POOLS]),
    st.sampled_from(["llama", "mistral"]),
    st.integers(min_value=0, max_value=20),                          # replicas
    st.integers(min_value=0, max_value=6),                           # nodes
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=20), seed=st.integers(0, 3))
def test_no_negative_or_inconsistent_values_ever(steps: list[tuple[float, str, str, int, int]], seed: int) -> None:
    sp, clock, specs = make_world([LLAMA, MISTRAL], seed=seed, interruptions_per_node_hour=4.0,
                                  burst_every_s=300, burst_factor=3.0)
    for dt, pool, model, replicas, nodes in steps:
        now = clock.advance(dt)
        spec = specs[model]
        provider = sp.pools[pool]
        if pool in spec.pools:
            try:
                provider.scale(spec, replicas, min(nodes, provider.pool.max_nodes), now)
            except PermanentProviderError:
                pytest.fail("valid request refused")
        for name, sig in sp.metrics.observe(list(specs.values()), now).items():
            for sample in sig.samples.values():
                assert sample.value is None or (math.isfinite(sample.value) and sample.value >= 0), (name, sample)
            for pct in (sig.gpu_utilization_pct, sig.kv_cache_utilization_pct):
                assert pct.value is None or pct.value <= 100.0
        for pname, pspec in sp.world.pool_specs.items():
            for spec in specs.values():
                if pname not in spec.pools:
                    continue
                s = sp.pools[pname].state(spec, now)
                assert s.replicas is not None and s.ready_replicas is not None and s.nodes is not None
                assert 0 <= s.ready_replicas <= s.replicas
                assert 0 <= s.interrupted_replicas <= s.replicas
                assert s.nodes >= 0 and s.recent_interruptions >= 0
                assert s.price_per_node_hour_usd is None or s.price_per_node_hour_usd > 0
                assert s.ready_replicas * spec.tp_degree <= s.nodes * pspec.gpus_per_node
    for name in specs:
        arrived, served, retried = sp.world.served(name)
        assert 0 <= served <= arrived + retried + 1e-6


def test_the_real_metrics_sources_declare_the_optional_abilities_the_controller_uses() -> None:
    """The controller reads degradation and GPU power only through the declared protocols: a
    renamed attribute fails here instead of silently turning off the hold or the energy price."""
    from controller.protocols import MeasuresPower, ReportsDegradation, degraded_models
    from providers.prometheus import PrometheusMetricsSource
    from providers.triton import CombinedMetricsSource

    assert issubclass(PrometheusMetricsSource, MeasuresPower)
    combined = CombinedMetricsSource(object(), object())  # type: ignore[arg-type]
    assert isinstance(combined, ReportsDegradation) and isinstance(combined, MeasuresPower)
    assert degraded_models(combined) == {} and combined.power_kw("m") == {}  # a primary without power
    assert degraded_models(object()) == {}  # a source that cannot degrade never is
