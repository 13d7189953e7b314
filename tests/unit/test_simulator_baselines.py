"""Baselines reproduce their documented algorithms and delays (HPA sync, KEDA polling, SkyServe's
upscale delay), the recorded-schedule replay, and the HPA arithmetic table-driven."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from controller.sim.baselines import (
    BASELINES,
    BaselineSettings,
    HpaAlgorithm,
    HpaController,
    KedaController,
    SkyServeController,
    _forward_max,
    expand_baselines,
    make_controller,
    read_schedule,
)
from controller.sim.engine import simulate
from tests.unit import simulator_fixtures as F

STEP_T0 = 600.001  # just after a tick of every controller (600 is a multiple of 5, 15, 20 and 30)


def _first_increase(actions: list[tuple[float, str, int, int]], after: float) -> float:
    return min(t for t, _, a, b in actions if t >= after and b > a)


def _step_setup(before: float, after: float, end: float = 1500.0):
    r = F.rate_at_slo()
    return F.setup(F.step_trace(STEP_T0, end, before * r, after * r, seed=11), mode="requests", seed=1)


def test_hpa_scales_no_sooner_than_its_sync_period() -> None:
    su = _step_setup(0.3, 6.0)
    res = simulate(su, HpaController(min_replicas=1, max_replicas=16))
    t_up = _first_increase(res.actions, STEP_T0)
    assert t_up >= 615.0 - 1e-9
    assert t_up % 15.0 == pytest.approx(0.0, abs=1e-6)
    # and it does scale up within a few syncs
    assert t_up <= STEP_T0 + 60


def test_keda_activates_no_sooner_than_its_polling_interval() -> None:
    su = _step_setup(0.0, 4.0)
    ctrl = KedaController(min_replicas=0, max_replicas=16, threshold=5.0)
    res = simulate(su, ctrl)
    assert not [a for a in res.actions if a[0] < STEP_T0]  # idle at zero before the step
    t_up = _first_increase(res.actions, STEP_T0)
    assert t_up >= 630.0 - 1e-9
    assert t_up % 30.0 == pytest.approx(0.0, abs=1e-6)


def test_keda_scales_to_zero_after_the_cooldown() -> None:
    r = F.rate_at_slo()
    # one replica at most and twice its load: the queue stays active until the load stops at 300 s
    su = F.setup(F.step_trace(300.0, 1800.0, 2.0 * r, 0.0, seed=3), mode="requests", duration_s=1800.0)
    res = simulate(su, KedaController(min_replicas=0, max_replicas=1, threshold=5.0))
    downs = [t for t, _, a, b in res.actions if b == 0 and a > 0]
    assert downs, res.actions
    # deactivation waits cooldownPeriod (300 s) after the last poll that saw a queue, and happens at a poll
    assert min(downs) >= 300.0 + 300.0
    assert min(downs) % 30.0 == pytest.approx(0.0, abs=1e-6)


def test_skyserve_waits_its_upscale_delay() -> None:
    su = _step_setup(0.5, 6.0, end=1800.0)
    ctrl = SkyServeController(min_replicas=1, max_replicas=16, target_qps_per_replica=F.rate_at_slo())
    res = simulate(su, ctrl)
    t_up = _first_increase(res.actions, STEP_T0)
    # 15 consecutive 20 s decisions that want more (upscale_counter >= 300 / 20): the first one that
    # sees the step is at 620, the 15th at 900
    assert t_up >= STEP_T0 + 300.0 - 20.0
    assert t_up == pytest.approx(900.0)


def test_skyserve_dynamic_ondemand_fallback_covers_unready_spot() -> None:
    su = _step_setup(0.5, 9.0, end=1800.0)
    res = simulate(su, SkyServeController(min_replicas=1, max_replicas=16, target_qps_per_replica=F.rate_at_slo()))
    od = [b for t, pool, a, b in res.actions if pool == "aws-od" and b > a]
    assert od, "spot replicas still starting are covered by on-demand"
    assert any(pool == "aws-od" and b < a for _, pool, a, b in res.actions), "and released once spot is ready"


@pytest.mark.parametrize("current, ready, unready, value, target, want", [
    (4, 4, 0, 70.0, 70.0, 4),    # at target
    (4, 4, 0, 75.0, 70.0, 4),    # within tolerance 0.1
    (4, 4, 0, 100.0, 70.0, 6),   # ceil(4 * 100 / 70) = 6
    (4, 4, 0, 20.0, 70.0, 2),    # scale down: ceil(4 * 20 / 70)
    (6, 4, 2, 100.0, 70.0, 6),   # not-ready pods count as 0 % on scale-up: 400 / (70 * 6) < 1 -> keep
    (6, 4, 2, 140.0, 70.0, 8),   # 560 / 420 = 1.33 -> ceil(1.33 * 6) = 8
    (4, 0, 4, 90.0, 70.0, 4),    # no metrics: keep
])
def test_hpa_replica_calculator(current: int, ready: int, unready: int, value: float, target: float, want: int) -> None:
    assert HpaAlgorithm.pods_metric_replicas(current, ready, unready, value, target, 0.1) == want


def test_hpa_behavior_defaults() -> None:
    hpa = HpaAlgorithm(min_replicas=1, max_replicas=100)
    # scale-up limited to max(current + 4, 2 x current) per 15 s
    assert hpa.normalize(0.0, 2, 50) == 6
    assert hpa.normalize(15.1, 6, 50) == 12
    # scale-down waits for the 300 s stabilization window (max of recent recommendations)
    hpa2 = HpaAlgorithm(min_replicas=1, max_replicas=100)
    assert hpa2.normalize(0.0, 10, 10) == 10
    assert hpa2.normalize(100.0, 10, 3) == 10
    assert hpa2.normalize(299.0, 10, 3) == 10
    assert hpa2.normalize(301.0, 10, 3) == 3


def test_external_average_value() -> None:
    assert HpaAlgorithm.external_average_replicas(2, 300.0, 50.0, 0.1) == 6
    assert HpaAlgorithm.external_average_replicas(6, 310.0, 50.0, 0.1) == 6  # within tolerance
    assert HpaAlgorithm.external_average_replicas(0, 120.0, 50.0, 0.1) == 3


def test_schedule_replay_total_and_per_pool(tmp_path: Path) -> None:
    total = tmp_path / "total.csv"
    total.write_text("t_s,target_replicas\n0,2\n300,6\n900,3\n")
    su = F.setup(F.rate_series([F.rate_at_slo() * 2.0] * 20), mode="fluid")
    res = simulate(su, make_controller(f"schedule:{total}", su, None, BaselineSettings()))
    t = np.asarray(res.timeline["t_s"])
    desired = sum(np.asarray(res.timeline[f"desired:{p}"]) for p in su.model.pools)
    assert set(desired[(t >= 310) & (t < 900)]) == {6}
    assert set(desired[t >= 910]) == {3}
    per_pool = tmp_path / "pools.csv"
    per_pool.write_text("t_s,onprem,aws-od\n0,1,0\n600,1,2\n")
    res2 = simulate(su, make_controller(f"schedule:{per_pool}", su, None, BaselineSettings()))
    assert ("aws-od" in {p for _, p, _, b in res2.actions if b == 2})
    bad = tmp_path / "bad.csv"
    bad.write_text("t_s,nowhere\n0,1\n")
    with pytest.raises(ValueError, match="not pools of the model"):
        read_schedule(bad, su.model.pools)


def test_expand_baselines() -> None:
    assert expand_baselines("all") == list(BASELINES)
    assert expand_baselines("hpa,oracle,hpa") == ["hpa", "oracle"]
    assert expand_baselines("none") == []
    assert expand_baselines("schedule:x.csv") == ["schedule:x.csv"]
    with pytest.raises(ValueError, match="unknown baseline"):
        expand_baselines("kubeflow")


def test_forward_max() -> None:
    x = np.array([0, 3, 1, 0, 0, 5, 0, 2])
    assert _forward_max(x, 0).tolist() == x.tolist()
    assert _forward_max(x, 2).tolist() == [3, 3, 1, 5, 5, 5, 2, 2]
