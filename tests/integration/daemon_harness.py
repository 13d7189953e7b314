"""Builds a real daemon (real config, policies, SQLite or PostgreSQL decision log, simulated fleet)
on a manual clock, for tests that drive ticks themselves instead of waiting on a scheduler."""

from __future__ import annotations

import textwrap
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from controller.config import DaemonConfig
from controller.daemon import Daemon, TickReport
from controller.db.migrate import upgrade
from controller.db.repo import Repository
from controller.demo import demo_config_path
from policies.base import Registry
from providers.clock import ManualClock
from providers.sim import build_simulated_providers

START = datetime(2026, 11, 2, 0, 0, tzinfo=timezone.utc)

DEFAULT_POLICY = textwrap.dedent("""\
    apiVersion: tidegate/v1
    kind: ScalingPolicy
    metadata: {name: llama3-70b-slo}
    spec:
      model: llama3-70b-fp8
      bounds: {min_replicas: 2, max_replicas: 24}
      slo: {p99_latency_ms: 6000, queue_depth_per_replica: 4}
      rules:
        - kind: slo-guard
      behavior:
        scale_down: {stabilization_s: 300}
      placement: {spot_spread_min_pools: 2}
      budget: {max_cost_per_hour_usd: 400}
    """)


def demo_config_dict() -> dict[str, Any]:
    return yaml.safe_load(demo_config_path().read_text())


@dataclass
class Harness:
    daemon: Daemon
    clock: ManualClock
    repo: Repository
    sim: Any
    config: DaemonConfig
    policies_dir: Path

    def close(self) -> None:
        self.repo.close()

    def run(self, seconds: float, step_s: float | None = None) -> list[TickReport]:
        """Tick every ``step_s`` (default: the configured interval) for ``seconds`` of daemon time."""
        step = step_s or self.config.loop.interval_s
        reports = []
        end = self.clock.now().timestamp() + seconds
        while self.clock.now().timestamp() < end - 1e-9:
            self.clock.advance(step)
            reports.append(self.daemon.tick())
        return reports


def build_harness(tmp_path: Path, *, db_url: str | None = None, policy: str = DEFAULT_POLICY,
                  config_updates: dict[str, Any] | None = None, dry_run: bool = False,
                  start: datetime = START, repo: Repository | None = None,
                  pool_wrappers: dict[str, Any] | None = None) -> Harness:
    raw = demo_config_dict()
    policies_dir = tmp_path / "policies"
    policies_dir.mkdir(exist_ok=True)
    if policy and not (policies_dir / "policy.yaml").exists():
        (policies_dir / "policy.yaml").write_text(policy)
    raw["policies_dir"] = str(policies_dir)
    raw["database"] = {"url": db_url or f"sqlite:///{tmp_path / 'tidegate.db'}"}
    raw["dry_run"] = dry_run
    for key, value in (config_updates or {}).items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key].update(value)
        else:
            raw[key] = value
    cfg = DaemonConfig.model_validate(raw)
    upgrade(cfg.database.url)
    repo = repo or Repository(cfg.database.url)
    clock = ManualClock(start)
    sim = build_simulated_providers(cfg, clock)
    pools = dict(sim.pools)
    for name, wrap in (pool_wrappers or {}).items():
        pools[name] = wrap(pools[name])
    daemon = Daemon(cfg, clock=clock, metrics_source=sim.metrics, pool_providers=pools,
                    price_source=sim.prices, repo=repo, registry=Registry.from_entry_points())
    daemon.reload_policies()
    return Harness(daemon=daemon, clock=clock, repo=repo, sim=sim, config=cfg, policies_dir=policies_dir)


@contextmanager
def serving(h: Harness, tokens: dict[str, str]) -> Iterator[str]:
    """``h``'s daemon behind its admin API on a real uvicorn on 127.0.0.1 (a free port); yields the
    base URL. ``tokens``: the environment the tokens come from (``TIDEGATE_ADMIN_TOKENS``...)."""
    from controller.auth import TokenAuth
    from controller.runtime import Runtime

    rt = Runtime(daemon=h.daemon, auth=TokenAuth.from_config(h.config.api, tokens))
    rt.serve_api("127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{rt.api_port}"
    finally:
        rt.stop()


@pytest.fixture
def make_harness() -> Iterator[Callable[..., Harness]]:
    """``build_harness`` whose repositories are closed after the test (no leaked connections)."""
    made: list[Harness] = []

    def make(*args: Any, **kwargs: Any) -> Harness:
        h = build_harness(*args, **kwargs)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()
