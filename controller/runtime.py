"""Assembly: from a config file to a running daemon with its API server.

Kept apart from ``controller.daemon`` so that the daemon takes its providers as arguments (tests and
the simulator pass their own) while ``tidegate run`` / ``tidegate demo`` get them built from config.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from controller.auth import TokenAuth
from controller.config import DaemonConfig, SimulatedProviders
from controller.daemon import Daemon
from controller.db.migrate import upgrade
from controller.db.repo import Repository
from controller.metrics import DaemonMetrics
from controller.protocols import Clock
from policies.base import Registry

logger = logging.getLogger("tidegate.runtime")


class ConfigError(Exception):
    """A config file that cannot be used, with every problem listed."""


def load_config(path: Path) -> DaemonConfig:
    """Read and validate a daemon config; relative paths resolve against the file's folder.
    ``TIDEGATE_DATABASE_URL`` overrides ``database.url`` (so a Secret can carry it)."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    env_url = os.environ.get("TIDEGATE_DATABASE_URL")
    if env_url:
        raw.setdefault("database", {})["url"] = env_url
    try:
        cfg = DaemonConfig.model_validate(raw)
    except ValidationError as e:
        lines = [f"{path}: {'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in e.errors()]
        raise ConfigError("\n".join(lines)) from e
    base = Path(path).resolve().parent
    from controller.bundle import BundleError, check_daemon_config

    try:
        check_daemon_config(cfg, Path(path))  # a model's bundle manifest must agree with its entry
    except BundleError as e:
        raise ConfigError(f"{path}: {e}") from e
    updates: dict[str, Any] = {}
    if not cfg.policies_dir.is_absolute():
        updates["policies_dir"] = base / cfg.policies_dir
    url = cfg.database.url
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
        rel = url[len("sqlite:///"):]
        updates["database"] = cfg.database.model_copy(update={"url": f"sqlite:///{(base / rel).resolve()}"})
    return cfg.model_copy(update=updates) if updates else cfg


@dataclass
class Runtime:
    daemon: Daemon
    auth: TokenAuth
    server: Any = None
    thread: threading.Thread | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def api_port(self) -> int | None:
        if self.server is None or not self.server.servers:
            return None
        return self.server.servers[0].sockets[0].getsockname()[1]

    def serve_api(self, host: str, port: int) -> None:
        """Run uvicorn in a background thread; returns once it listens."""
        import uvicorn

        from controller.api import create_app

        app = create_app(self.daemon, self.auth, self.daemon.config.api)
        cfg = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(cfg)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, name="tidegate-api", daemon=True)
        self.thread.start()
        started = threading.Event()
        # uvicorn sets .started once bound; wait on it without a fixed sleep
        for _ in range(1000):
            if self.server.started:
                started.set()
                break
            if not self.thread.is_alive():
                raise RuntimeError(f"admin API failed to start on {host}:{port}")
            started.wait(0.01)
        if not started.is_set():
            raise RuntimeError(f"admin API did not start on {host}:{port} within 10 s")

    def stop(self, close_repo: bool = True) -> None:
        self.daemon.stop()
        if self.server is not None:
            self.server.should_exit = True
            if self.thread is not None:
                self.thread.join(timeout=10)
        real = self.extras.get("real")
        if real is not None:
            real.close()  # hands leadership over at once instead of after the lease runs out
        if close_repo:
            self.daemon.repo.close()


def build_runtime(cfg: DaemonConfig, *, clock: Clock | None = None, dry_run: bool | None = None,
                  registry: Registry | None = None, environ: dict[str, str] | None = None) -> Runtime:
    """Migrate the database, build providers from the config and the daemon around them."""
    upgrade(cfg.database.url)
    repo = Repository(cfg.database.url)
    registry = registry or Registry.from_entry_points()
    metrics = DaemonMetrics()
    extras: dict[str, Any] = {}
    if isinstance(cfg.providers, SimulatedProviders):
        from providers.clock import AcceleratedClock
        from providers.sim import build_simulated_providers

        clock = clock or AcceleratedClock(cfg.providers.speedup)
        sim = build_simulated_providers(cfg, clock)
        daemon = Daemon(cfg, clock=clock, metrics_source=sim.metrics, pool_providers=sim.pools,
                        price_source=sim.prices, repo=repo, registry=registry, dry_run=dry_run,
                        metrics=metrics)
        extras["sim"] = sim
    else:
        from providers.real import build_real_providers

        from providers.clock import SystemClock

        clock = clock or SystemClock()
        real = build_real_providers(cfg, clock, dry_run=dry_run)
        daemon = Daemon(cfg, clock=clock, metrics_source=real.metrics, pool_providers=real.pools,
                        price_source=real.prices, repo=repo, registry=registry, dry_run=dry_run,
                        metrics=metrics, is_leader=real.is_leader)
        for func, seconds, job_id in real.jobs:  # e.g. the spot price refresh; run from daemon.start()
            daemon.add_job(func, seconds, job_id)
        extras["real"] = real
    auth = TokenAuth.from_config(cfg.api, environ)
    return Runtime(daemon=daemon, auth=auth, extras=extras)
