"""Assembly: from a config file to a running daemon with its API server.

Kept apart from ``controller.daemon`` so that the daemon takes its providers as arguments (tests and
the simulator pass their own) while ``tidegate run`` / ``tidegate demo`` get them built from config.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import re
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from controller.auth import TokenAuth
from controller.config import DaemonConfig, RealProviders, SimulatedProviders
from controller.core.spec import interned
from controller.daemon import Daemon
from controller.db.preflight import connect_problem, database_errors, upgrade_apart, url_problem
from controller.db.repo import Repository
from controller.errors import AddressUnavailable, ConfigError  # re-exported: raised here
from controller.metrics import DaemonMetrics
from controller.protocols import Clock
from policies.base import Registry

logger = logging.getLogger("tidegate.runtime")


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: any free one), ready for uvicorn to listen on;
    :class:`AddressUnavailable` when it cannot be bound."""
    fix = "choose another api.port (0 picks a free one)"
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise AddressUnavailable(f"cannot serve the admin API on {host}:{port}: {e.strerror}; "
                                 "set api.host to an address of this machine (e.g. 127.0.0.1 or 0.0.0.0)",
                                 in_use=False) from e
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio does: TIME_WAIT is no obstacle
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        in_use = e.errno == errno.EADDRINUSE
        hint = f"stop the process that listens there or {fix}" if in_use else \
            f"set api.host to an address of this machine or {fix}"
        raise AddressUnavailable(f"cannot serve the admin API on {host}:{port}: {e.strerror or e}; {hint}",
                                 in_use=in_use) from e
    return sock


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
        cfg = interned(DaemonConfig.model_validate(raw))
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


def preflight(cfg: DaemonConfig, *, connect: bool = False) -> list[str]:
    """What ``tidegate run`` needs from a valid config, beyond its schema: one line per problem
    (what, which field, how to fix). ``connect``: also reach the database and Prometheus, as the
    daemon's first minute would. ``tidegate config validate`` and :func:`build_runtime` both ask."""
    problems = []
    if not cfg.policies_dir.is_dir():
        what = "is not a folder" if cfg.policies_dir.exists() else "does not exist"
        problems.append(f"policies_dir {cfg.policies_dir} {what}; create it and put the ScalingPolicy files there, "
                        "or set policies_dir to the folder that holds them")
    db = (connect_problem if connect else url_problem)(cfg.database.url, _database_source())
    if db is not None:
        problems.append(db)
    journal = cfg.database.journal_path
    if journal is not None and not Path(journal).parent.is_dir():
        problems.append(f"database.journal_path {journal}: folder {Path(journal).parent} does not exist; create it "
                        "(the chart mounts journalVolume there) or set database.journal_path to null (no journal)")
    for field_name, src in (("api.admin_tokens.file", cfg.api.admin_tokens), ("api.viewer_tokens.file", cfg.api.viewer_tokens)):
        if src.file is not None and not Path(src.file).is_file():
            problems.append(f"{field_name} {src.file} does not exist; create it (one token per line) or remove {field_name}")
    if isinstance(cfg.providers, RealProviders):
        prom = cfg.providers.settings.prometheus
        if prom is None:
            problems.append("providers.settings.prometheus is missing: providers.type real reads its signals from "
                            "Prometheus; add providers.settings.prometheus.url (e.g. http://prometheus.monitoring:9090)")
        kubeconfig = cfg.providers.settings.kubernetes.kubeconfig
        if kubeconfig is not None and not Path(kubeconfig).expanduser().is_file():
            problems.append(f"providers.settings.kubernetes.kubeconfig {kubeconfig} does not exist; "
                            "point it at a kubeconfig file, or unset it to use KUBECONFIG, ~/.kube/config or the pod's service account")
        if prom is not None and connect:
            problem = prometheus_problem(prom.url, prom.timeout_s)
            if problem is not None:
                problems.append(problem)
    return problems


def policy_problems(cfg: DaemonConfig, registry: Registry | None = None) -> list[str]:
    """The policies ``run`` would load from ``policies_dir``: each rejected file's problems and each
    model left without a valid policy (the daemon starts, but cannot decide for that model until a
    valid one appears). For ``tidegate config validate``; ``run`` itself starts regardless."""
    if not cfg.policies_dir.is_dir():
        return []  # preflight says so
    from controller.policyfile import PolicyStore

    store = PolicyStore(registry or Registry.from_entry_points(), known_models={m.name for m in cfg.models})
    report = store.reload(cfg.policies_dir)
    problems = [str(e) for e in report.errors]
    in_force = store.policies()
    problems += [f"model {m.name!r} has no valid ScalingPolicy in policies_dir {cfg.policies_dir}: the daemon would "
                 f"not decide for it; add a policy file with spec.model: {m.name} (`tidegate policy validate FILE` checks it)"
                 for m in cfg.models if m.name not in in_force]
    return problems


def _database_source() -> str:
    return "TIDEGATE_DATABASE_URL" if os.environ.get("TIDEGATE_DATABASE_URL") else "database.url"


def prometheus_problem(url: str, timeout_s: float) -> str | None:
    """Why Prometheus's HTTP API at ``url`` does not answer a query (``vector(1)``); ``None`` when it does."""
    from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
    from requests import JSONDecodeError, RequestException
    from urllib3.util.retry import Retry

    where = f"Prometheus at {url} (providers.settings.prometheus.url)"
    try:
        PrometheusConnect(url, retry=Retry(total=0), timeout=timeout_s).custom_query("vector(1)")  # type: ignore[arg-type]
    except PrometheusApiClientException as e:  # its text carries the whole response body: keep the status
        status = re.search(r"HTTP Status Code \d+", str(e))
        return (f"{where} answered the query vector(1) with {status.group(0) if status else _first_line(e)}; "
                "check that url is Prometheus's HTTP API (e.g. http://prometheus.monitoring:9090)")
    except (JSONDecodeError, KeyError, TypeError) as e:  # an answer, but not Prometheus's JSON
        return f"{where} did not answer as Prometheus does ({_first_line(e)}); check that url is Prometheus's HTTP API"
    except RequestException as e:
        return f"{where} cannot be reached ({_os_reason(e)}); start it or fix providers.settings.prometheus.url"
    return None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _os_reason(e: BaseException) -> str:
    """The operating system's words (e.g. "Connection refused") inside a client library's chain of errors."""
    seen: set[int] = set()
    todo: list[BaseException] = [e]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.strerror:
            return x.strerror
        todo += [a for a in x.args if isinstance(a, BaseException)]
        todo += [c for c in (x.__cause__, x.__context__) if c is not None]
        reason = getattr(x, "reason", None)
        if isinstance(reason, BaseException):
            todo.append(reason)
    return _first_line(e)


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
        """Run uvicorn in a background thread; returns once it listens. The socket is bound here,
        before uvicorn starts, so a taken address raises :class:`AddressInUse` in the caller."""
        import uvicorn

        from controller.api import create_app

        sock = bind_socket(host, port)
        app = create_app(self.daemon, self.auth, self.daemon.config.api)
        cfg = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(cfg)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, name="tidegate-api",
                                       daemon=True)
        self.thread.start()
        started = threading.Event()
        # uvicorn sets .started once serving; wait on it without a fixed sleep
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
        if self.daemon.elector is not None:
            self.daemon.elector.release()  # hand leadership over at once, not after the lease runs out
        real = self.extras.get("real")
        if real is not None:
            real.close()
        if close_repo:
            self.daemon.repo.close()


def _no_credentials(e: Exception, prefix: str = "") -> str:
    return (f"{prefix}providers.settings.kubernetes: cannot load credentials for the cluster ({_first_line(e)}); "
            "set providers.settings.kubernetes.kubeconfig (and context) or host, or run in a cluster")


GC_THRESHOLDS = (10_000, 20, 10)
"""The cyclic collector's thresholds in the daemon's process (CPython's are 700, 10, 10). A tick at
1,000 models allocates some 560,000 container objects that live until the tick ends: with the
default, the youngest generation is collected ~800 times a tick and the middle one ~70 times,
~0.2 s of a ~0.7 CPU s tick; with these, ~9 and ~0.4 times, ~0.06-0.08 s (``gc.callbacks`` over 10
ticks of ``bench/control_plane.py``'s 1,000-model SQLite fleet, this 2-core machine). Reference
counting frees nearly everything a tick makes; the collector only finds cycles, a little later.
``gc.freeze()`` after start was measured too and gained nothing beside these."""


def tune_gc() -> None:
    """Set :data:`GC_THRESHOLDS` (called by :func:`build_runtime`: the daemon's process)."""
    gc.set_threshold(*GC_THRESHOLDS)


class _NeverRaised(Exception):
    """Raised by nothing: what :func:`_kube_config_error` names while kubernetes is not loaded."""


def _kube_config_error() -> type[Exception]:
    """The kubernetes client's ``ConfigException`` (no kubeconfig, no service account) once the
    client is loaded: an ``except`` clause evaluates this when an exception passes, and only code
    that loaded the client raises it. A daemon on simulated providers with no Lease never loads
    the client (about 17 MB of resident memory)."""
    module = sys.modules.get("kubernetes.config.config_exception")
    return module.ConfigException if module is not None else _NeverRaised


def build_runtime(cfg: DaemonConfig, *, clock: Clock | None = None, dry_run: bool | None = None,
                  registry: Registry | None = None, environ: dict[str, str] | None = None,
                  election_clock: Clock | None = None) -> Runtime:
    """Check what the config needs (:func:`preflight`), migrate the database, build providers from
    the config and the daemon around them. Raises a :class:`~controller.errors.UserError` with one
    line per problem for what a person must fix (a missing folder, an unreachable database...).

    ``clock`` is the daemon's (default: the wall clock, or the accelerated one of the simulated
    providers). ``election_clock`` is the Lease's: the wall clock by default, never the
    accelerated one, because the Lease's times are compared across processes; tests that drive
    ``clock`` by hand pass the same one here to control expiry too."""
    problems = preflight(cfg)
    if problems:
        raise ConfigError("\n".join(problems))
    cfg = interned(cfg)  # a thousand models' entries share their equal parts (capacities, settings)
    with database_errors(cfg.database.url, _database_source()):
        upgrade_apart(cfg.database.url, _database_source())
        repo = Repository(cfg.database.url)
    registry = registry or Registry.from_entry_points()
    metrics = DaemonMetrics()
    extras: dict[str, Any] = {}
    from providers.clock import SystemClock
    from providers.leader import build_elector
    from providers.kubernetes import KubernetesSettings

    kube = cfg.providers.settings.kubernetes if isinstance(cfg.providers, RealProviders) else KubernetesSettings()
    if isinstance(cfg.providers, SimulatedProviders):
        from providers.clock import AcceleratedClock
        from providers.sim import build_simulated_providers

        clock = clock or AcceleratedClock(cfg.providers.speedup)
        sim = build_simulated_providers(cfg, clock)
        sources: tuple[Any, Any, Any] = (sim.metrics, sim.pools, sim.prices)
        extras["sim"] = sim
        api_client = kube.api_client
    else:
        from providers.wiring import build_real_providers

        clock = clock or SystemClock()
        try:
            real = build_real_providers(cfg, clock, dry_run=dry_run)
        except ValueError as e:  # settings that cannot run (documented by build_real_providers)
            repo.close()
            raise ConfigError(str(e)) from e
        except _kube_config_error() as e:  # no kubeconfig, no in-cluster service account
            repo.close()
            raise ConfigError(_no_credentials(e)) from e
        sources = (real.metrics, real.pools, real.prices)
        extras["real"] = real
        api_client = lambda: real.api_client  # noqa: E731 - one client for the pools and the Lease
    try:
        elector = build_elector(cfg.leader_election, database_url=cfg.database.url, api_client=api_client,
                                clock=election_clock or SystemClock(), environ=environ)
    except _kube_config_error() as e:  # a Lease backend with no kubeconfig and no service account
        repo.close()
        raise ConfigError(_no_credentials(e, "leader_election: backend lease needs the cluster; ")) from e
    daemon = Daemon(cfg, clock=clock, metrics_source=sources[0], pool_providers=sources[1],
                    price_source=sources[2], repo=repo, registry=registry, dry_run=dry_run,
                    metrics=metrics, elector=elector)
    if isinstance(cfg.providers, RealProviders) and cfg.providers.settings.kubernetes_objects.enabled:
        from providers.kubeobjects import attach  # ScalingPolicy objects, status, Events, no fights

        extras["kube_objects"] = attach(daemon, extras["real"].api_client, cfg.providers.settings.kubernetes_objects)
    for func, seconds, job_id in getattr(extras.get("real"), "jobs", ()):  # e.g. the spot price refresh
        daemon.add_job(func, seconds, job_id)  # run from daemon.start()
    retention = cfg.database.retention
    if retention.enabled:
        from controller.db.retention import retention_job

        daemon.add_job(retention_job(repo, clock, retention), retention.interval_s, "retention")
    auth = TokenAuth.from_config(cfg.api, environ)
    tune_gc()
    return Runtime(daemon=daemon, auth=auth, extras=extras)
