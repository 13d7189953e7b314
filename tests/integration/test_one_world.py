"""One simulated world: the same short scenario through ``tidegate demo``'s path (the simulated
providers, a ``Controller`` ticked by a clock outside the world) and through ``tidegate simulate``'s
path (``Simulation.run`` ticking its own ``Controller``) makes the same decisions for the same seed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import yaml

from controller.config import DaemonConfig
from controller.controller import Controller
from controller.core.model import Decision, ModelSpec, PoolSpec
from controller.core.pipeline import decide
from controller.core.policy import EffectivePolicy
from controller.demo import demo_config_path
from controller.sim.baselines import TidegateController
from controller.sim.engine import MemoryRecorder, SimSetup, Simulation
from controller.sim.scenario import load_policy
from controller.sim.world import initial_replicas, setup_for
from providers.clock import ManualClock
from providers.sim import build_simulated_providers

EPOCH = datetime(2026, 11, 2, tzinfo=timezone.utc)
HORIZON_S = 1800.0
MODEL = "llama3-70b-fp8"


def _config(seed: int) -> DaemonConfig:
    raw = yaml.safe_load(demo_config_path().read_text())
    # a load cycle within the scenario and frequent interruptions, so that both paths scale out,
    # meet interruptions and scale in
    raw["providers"].update(seed=seed, period_s=1200, interruptions_per_node_hour=4.0)
    return DaemonConfig.model_validate(raw)


def _policy() -> EffectivePolicy:
    return load_policy(next((demo_config_path().parent / "policies").glob("*.yaml")), MODEL)


Row = tuple[datetime, tuple[tuple[str, int], ...], str]


def _recording(rows: list[Row]) -> Any:
    def recorded(**kwargs: Any) -> Decision:
        d = decide(**kwargs)
        rows.append((d.at, tuple(sorted(d.placement.items())), d.reason))
        return d
    return recorded


def demo_path(cfg: DaemonConfig) -> list[Row]:
    clock = ManualClock(EPOCH)
    sim = build_simulated_providers(cfg, clock, horizon_s=HORIZON_S)
    model = cfg.model_specs()[MODEL]
    policy = _policy()
    rows: list[Row] = []
    ctl = Controller(models={MODEL: model}, pools={n: cfg.pool_specs()[n] for n in model.pools}, clock=clock,
                     metrics_source=sim.metrics, pool_providers=sim.pools, recorder=MemoryRecorder(),
                     policies=lambda: {MODEL: policy}, decide=_recording(rows))
    step = cfg.loop.interval_s
    while clock.now() + timedelta(seconds=step) < EPOCH + timedelta(seconds=HORIZON_S):
        ctl.tick(clock.advance(step))
    return rows


class _FromConfig(TidegateController):
    """tidegate as ``tidegate simulate`` runs it, starting from the fleet the demo's world starts
    with and recording its decisions."""

    def __init__(self, cfg: DaemonConfig, rows: list[Row]) -> None:
        super().__init__(_policy(), interval_s=cfg.loop.interval_s)
        self.cfg = cfg
        self.rows = rows

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        super().initial(setup, need)
        return initial_replicas(self.cfg, setup.model)

    def controller(self, sim: Simulation) -> Controller:
        assert self.model is not None
        return sim.controller_for(self.model, self.pools, _recording(self.rows), self.policy)


def simulate_path(cfg: DaemonConfig) -> tuple[list[Row], dict[str, Any]]:
    model: ModelSpec = cfg.model_specs()[MODEL]
    rows: list[Row] = []
    result = Simulation(setup_for(cfg, model, epoch=EPOCH, horizon_s=HORIZON_S), _FromConfig(cfg, rows)).run()
    return rows, result.summary


def test_the_demo_and_the_simulator_decide_alike_on_the_same_world() -> None:
    cfg = _config(seed=11)
    simulated, summary = simulate_path(cfg)
    driven = demo_path(cfg)
    assert len(driven) == len(simulated) == int(HORIZON_S // cfg.loop.interval_s) - 1
    assert driven == simulated
    # not a quiet run: the fleet moved beyond on-prem, and spot nodes were interrupted
    cloud: set[str] = {p for _, placement, _ in simulated for p, n in placement if n and p != "onprem-h100"}
    assert cloud, "the scenario never left on-prem"
    assert summary["interruptions"] > 0
    assert len({placement for _, placement, _ in simulated}) > 3


def test_another_seed_makes_another_world() -> None:
    assert demo_path(_config(seed=11)) != demo_path(_config(seed=12))
