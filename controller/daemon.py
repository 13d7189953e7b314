"""The daemon: a ``controller.controller.Controller`` run on a schedule, with an API around it.

The tick itself (observe -> decide -> act -> record for every model, history rebuilt from the
decision log on start) is the ``Controller``'s, the same one the simulator runs. This module adds
what a long-running process needs around it: the tick schedule and the policy watcher (APScheduler),
leader election (only the leader ticks), backoff after failed ticks, pause/resume, the Prometheus
metrics and the decision log lines of each decision (``controller.metrics_export``), ``/v1/status``'s
snapshot (``controller.status``) and ``/readyz``'s readiness with the last error of each component.

Threads: the tick runs on an APScheduler job (max one instance, coalesced) and is additionally
guarded by a lock so a manual ``tick()`` (tests, ``POST`` paths) never overlaps it. The admin API
reads snapshots (``status()``) under the same lock's protection of the small shared dicts (the
controller updates its per-model state under that lock too).
"""

from __future__ import annotations

import logging
import random
import threading
import time as _wall
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from controller.config import DaemonConfig
from controller.core.spec import Mode
from controller.controller import Controller, TickReport
from controller.core.model import Action, Decision, ModelSignals, ModelSpec, PoolSpec
from controller.core.pricing import OnPremCost
from controller.db.journal import Journal
from controller.db.recorder import UNAVAILABLE, RepositoryRecorder, database_words
from controller.db.repo import Repository
from controller.logs import log
from controller.metrics import DaemonMetrics
from controller.metrics_export import MetricsExport
from controller.policyfile import PolicyLimits, PolicyStore
from controller.shards import models_in
from controller.status import status_json
from controller.protocols import Clock, LeaderElector, ShardElector, MetricsSource, PoolProvider, PriceSource, degraded_models
from policies.base import Registry

logger = logging.getLogger("tidegate.daemon")

_Version = tuple[str, str, list[Any], str]
"""A policy version for the decision log: (model, version, sources, content)."""

READY_SLACK_WALL_S = 2.0
"""Scheduling slack readiness allows on top of three tick intervals, wall seconds (a tick that
starts late on a busy node must not flap the pod out of its Service)."""


@dataclass
class Health:
    """One component's last outcome: a provider, the leader lock or the database."""

    ok: bool = True
    last_error: str | None = None
    last_error_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "last_error": self.last_error,
                "last_error_at": self.last_error_at.isoformat() if self.last_error_at else None}


class _DaemonListener:
    """What a tick reports, turned into the daemon's health, metrics, logs and ``on_decision``."""

    def __init__(self, daemon: "Daemon") -> None:
        self.daemon = daemon

    def component(self, name: str, error: str | None, now: datetime) -> None:
        self.daemon._note(name, error, now)

    def actions(self, actions: Sequence[Action]) -> None:
        self.daemon.export.actions(actions)

    def decided(self, decision: Decision, signals: ModelSignals, outcome: str) -> None:
        self.daemon.export.decided(decision, signals, outcome)
        if self.daemon.on_decision is not None:
            self.daemon.on_decision(decision, signals)


class Daemon:
    """One daemon instance. Build it with providers; ``start()`` schedules ticks; ``stop()`` ends."""

    def __init__(
        self,
        config: DaemonConfig,
        *,
        clock: Clock,
        metrics_source: MetricsSource,
        pool_providers: Mapping[str, PoolProvider],
        repo: Repository,
        registry: Registry,
        price_source: PriceSource | None = None,
        policies_dir: Path | None = None,
        dry_run: bool | None = None,
        metrics: DaemonMetrics | None = None,
        elector: LeaderElector | ShardElector | None = None,
        on_decision: Callable[[Decision, ModelSignals], None] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.repo = repo
        self.registry = registry
        self.metrics = metrics or DaemonMetrics()
        self.elector = elector
        """Leader election (``None``: this daemon always acts) or, a ``ShardElector``, the buckets
        of models this replica acts on; asked before every tick."""
        self.owned: frozenset[str] | None = None
        """Sharded: the models of the buckets held at the last tick (``None``: not sharded)."""
        self._acted: dict[str, dict[str, int]] = {}
        self._acted_after: int | None = None
        self.on_decision = on_decision
        self.models: dict[str, ModelSpec] = config.model_specs()
        self.pools: dict[str, PoolSpec] = config.pool_specs()
        self.policies_dir = policies_dir or config.policies_dir
        self.policy_store = PolicyStore(registry, known_models=set(self.models),
                                        limits=PolicyLimits(max_file_bytes=config.policy_max_file_bytes))
        self._unrecorded_versions: dict[tuple[str, str], tuple[_Version, datetime]] = {}
        """Policy versions put in force while the database was away, keyed by (model, version),
        with the time they came into force: every reload tries to record them first."""

        self.export = MetricsExport(self.metrics, self.models, self.pools, self.policy_store.get)
        """Each decision's metrics and log line (``controller.metrics_export``)."""
        self._tick_lock = threading.Lock()
        self._ping_lock = threading.Lock()
        self._state_lock = threading.RLock()
        oc = config.onprem_cost
        jp = config.database.journal_path
        self.recorder = RepositoryRecorder(repo, None if jp is None else Journal(jp))
        self.controller = Controller(
            models=self.models, pools=self.pools, clock=clock, metrics_source=metrics_source,
            pool_providers=pool_providers, price_source=price_source, recorder=self.recorder,
            policies=self.policy_store.policies, dry_run=config.dry_run if dry_run is None else dry_run,
            onprem_cost=None if oc is None else OnPremCost(oc.capital_usd_per_gpu_hour, oc.energy_usd_per_kwh,
                                                           oc.pue, oc.assumed_gpu_power_kw),
            listener=_DaemonListener(self), state_lock=self._state_lock, shadow_all=config.mode is Mode.SHADOW,
        )
        """Observe, decide, act and record: the tick itself. The daemon schedules it, elects, backs
        off, and exports what it did."""
        self.paused = False
        self.standby = False
        self.last_success_at: datetime | None = None
        self.last_tick_at: datetime | None = None
        self.last_errors: dict[str, str] = {}
        self.consecutive_failures = 0
        self.backoff_until: datetime | None = None
        self._rng = random.Random(0)
        self._scheduler: Any = None
        self._jobs: list[tuple[Callable[[], Any], float, str]] = []
        """Provider jobs added before ``start()``, scheduled by it."""
        self.health: dict[str, Health] = {}
        """Per component (``metrics``, ``prices``, ``pool/NAME``, ``leader``, ``database``): the
        last outcome and the last error with its time (daemon clock), shown by ``/readyz``."""

    # the providers and dry-run live on the controller; tests and assembly code swap them here
    @property
    def metrics_source(self) -> MetricsSource:
        return self.controller.metrics_source

    @metrics_source.setter
    def metrics_source(self, value: MetricsSource) -> None:
        self.controller.metrics_source = value

    @property
    def pool_providers(self) -> dict[str, PoolProvider]:
        return self.controller.pool_providers

    @pool_providers.setter
    def pool_providers(self, value: Mapping[str, PoolProvider]) -> None:
        self.controller.pool_providers = dict(value)

    @property
    def price_source(self) -> PriceSource | None:
        return self.controller.price_source

    @price_source.setter
    def price_source(self, value: PriceSource | None) -> None:
        self.controller.price_source = value

    @property
    def dry_run(self) -> bool:
        return self.controller.dry_run

    # ------------------------------------------------------------------ policies
    def reload_policies(self, author: str = "daemon") -> dict[str, Any]:
        """Re-read the policies directory; new versions are stored with their hash, a bad file is
        rejected (logged, visible in ``/v1/policies``) and the last good version stays in force.

        A version put in force while the database is away stays in force; it is kept here and
        recorded, with the time it came into force, by the first reload that reaches the database
        again (the periodic one, ``loop.policy_reload_s``, or ``POST /v1/policies/reload``). That
        reload's caller still sees the database's error (the API answers 503)."""
        report = self.policy_store.reload(self.policies_dir)
        now = self.clock.now()
        new_versions = list(getattr(report, "new_versions", []) or [])
        for model, version, sources, content in new_versions:
            self.metrics.policy_info.labels(model=model, version=version).set(1)
            log(logger, logging.INFO, "policy version in force", model=model, version=version,
                sources=",".join(map(str, sources)), author=author)
        for err in getattr(report, "errors", []) or []:
            self.metrics.policy_reload_errors.inc()
            log(logger, logging.ERROR, "policy file rejected; last good version stays in force",
                file=str(err.file), line=err.line, path=err.path, error=err.message)
        with self._state_lock:
            for model, version, sources, content in new_versions:
                self._unrecorded_versions.setdefault((model, version), ((model, version, list(sources), content), now))
            waiting = dict(self._unrecorded_versions)
        self._record_versions(waiting)
        return self.policy_store.status()

    def _record_versions(self, waiting: dict[tuple[str, str], tuple[_Version, datetime]]) -> None:
        """Record the versions waiting, each at the time it came into force (one transaction per
        such time: a reload's versions share one); what went in leaves the waiting list."""
        by_time: dict[datetime, list[tuple[tuple[str, str], _Version]]] = {}
        for key, (item, at) in waiting.items():
            by_time.setdefault(at, []).append((key, item))
        for at in sorted(by_time):
            keyed = by_time[at]
            try:
                self.repo.record_policy_versions([item for _, item in keyed], at)
            except UNAVAILABLE as e:
                with self._state_lock:
                    n = len(self._unrecorded_versions)
                log(logger, logging.WARNING, "policy versions in force but not recorded; the next reload retries",
                    versions=n, error=database_words(e))
                raise
            with self._state_lock:
                for key, _ in keyed:
                    self._unrecorded_versions.pop(key, None)

    # ------------------------------------------------------------------ health
    def _note(self, component: str, error: str | None, now: datetime, *, critical: bool = False) -> None:
        """Record a component's outcome. ``critical`` components (the leader lock, the database)
        decide readiness: their failure and recovery are logged here, at WARNING and INFO."""
        if error is not None:
            error = " ".join(error.split())  # libpq's messages span lines; logs and probes want one
        with self._state_lock:
            h = self.health.setdefault(component, Health())
            was_ok, old = h.ok, h.last_error
            h.ok = error is None
            if error is not None:
                h.last_error, h.last_error_at = error, now
        if critical and error is not None and (was_ok or error != old):
            log(logger, logging.WARNING, f"{component} unreachable; this daemon is unready", error=error)
        elif critical and error is None and not was_ok:
            log(logger, logging.INFO, f"{component} reachable again", component=component)

    def _shard(self, now: datetime, elector: ShardElector) -> frozenset[str]:
        """The models of the buckets this replica holds now. Models gained get their history
        rebuilt from the log (another replica decided them until now); models lost are forgotten
        (their state and their series: another replica exports them now)."""
        try:
            held = elector.acquire_buckets()
            error = elector.check_error
        except Exception as e:  # noqa: BLE001 - an elector should not raise; never trust it
            held, error = frozenset(), f"{type(e).__name__}: {e}"
        self._note("leader", error, now, critical=True)
        owned = frozenset(models_in(held, self.models, elector.buckets))
        before = self.owned or frozenset()
        gained, lost = owned - before, before - owned
        if gained or lost:
            log(logger, logging.INFO, "buckets changed", identity=elector.identity, buckets=",".join(map(str, sorted(held))),
                models=len(owned), gained=len(gained), lost=len(lost))
        self.controller.forget(lost)
        for name in lost:
            self.metrics.forget_model(name)
        self.controller.forget_history(gained)
        self.owned = owned
        self.metrics.buckets_held.set(len(held))
        return owned

    def _others(self, owned: frozenset[str]) -> dict[str, dict[str, int]]:
        """The latest acted-on placements of the models other replicas act on, read incrementally
        from the decision log (their nodes share the pools' node groups with ours)."""
        for decision_id, model, placement in self.repo.acted_placements(self._acted_after):
            self._acted[model] = placement
            self._acted_after = decision_id
        return {m: p for m, p in self._acted.items() if m not in owned and m in self.models}

    def _leader(self, now: datetime) -> bool:
        """Ask the elector; a check that cannot be made means: do not act, and be unready."""
        if self.elector is None or isinstance(self.elector, ShardElector):
            return True
        try:
            leader = bool(self.elector.try_acquire())
            error = self.elector.check_error
        except Exception as e:  # noqa: BLE001 - an elector should not raise; never trust it
            leader, error = False, f"{type(e).__name__}: {e}"
        self._note("leader", error, now, critical=True)
        return leader

    def _rate(self) -> float:
        """Daemon-clock seconds per wall second: the demo's speedup, 1 for the wall clock."""
        return float(getattr(self.clock, "speedup", 1.0))

    def tick(self) -> TickReport:
        """One pass over all models. Never overlaps itself; one model's failure spares the others."""
        if not self._tick_lock.acquire(blocking=False):
            self.metrics.ticks.labels(result="skipped").inc()
            return TickReport(at=self.clock.now(), skipped="previous tick still running")
        started = _wall.perf_counter()
        try:
            return self._tick_locked()
        finally:
            self.metrics.tick_duration.observe(_wall.perf_counter() - started)
            self._tick_lock.release()

    def _tick_locked(self) -> TickReport:
        now = self.clock.now()
        if self.backoff_until is not None and now < self.backoff_until:
            self.metrics.ticks.labels(result="skipped").inc()
            return TickReport(at=now, skipped=f"backing off until {self.backoff_until.isoformat()}")
        if isinstance(self.elector, ShardElector):
            return self._sharded_tick(now, self.elector)
        if not self._leader(now):
            # Followers observe nothing and act on nothing: one daemon decides at a time.
            self.standby = True
            self.metrics.leader.set(0)
            self.metrics.ticks.labels(result="skipped").inc()
            return TickReport(at=now, skipped="not the leader")
        self.metrics.leader.set(1)
        if self.standby:
            # just took over: the leader before us may have decided since we last read the log
            self.standby = False
            self.controller.forget_history()
        report = self.controller.tick(now, paused=self.paused)
        if report.journaled and not report.behind_replay:
            self._note("database", "decisions journaled locally: the database refused them", now, critical=True)
        self._finish_tick(report, now, report.transient_failures)
        return report

    def _sharded_tick(self, now: datetime, elector: ShardElector) -> TickReport:
        owned = self._shard(now, elector)
        if not owned:
            self.standby = True
            self.metrics.leader.set(0)
            self.metrics.ticks.labels(result="skipped").inc()
            return TickReport(at=now, skipped="holds no bucket")
        self.standby = False
        self.metrics.leader.set(1)
        report = self.controller.tick(now, paused=self.paused, models=owned, others=self._others(owned))
        self._finish_tick(report, now, report.transient_failures)
        return report

    def journal_status(self) -> dict[str, Any] | None:
        """The local journal (``None``: none configured): its path, the bytes waiting in it to be
        replayed into the decision log, the decisions among them not in the log yet and the
        outcomes, when the oldest of those decisions was made (daemon clock), whether a replay is
        under way (a slice a tick), and why the database refused the last write (``None``: it
        took the last one)."""
        rec = self.recorder
        journal = rec.journal
        if journal is None:
            return None
        since = journal.since()
        return {"path": str(journal.path), "bytes": journal.size(), "decisions": rec.waiting(),
                "outcomes": journal.outcomes(), "since": None if since is None else since.isoformat(),
                "replaying": rec.replaying, "database_error": rec.refused}

    def _finish_tick(self, report: TickReport, now: datetime, transient_failures: int) -> None:
        journal = self.recorder.journal
        self.metrics.journal_bytes.set(0 if journal is None else journal.size())
        with self._state_lock:
            self.last_tick_at = now
            self.last_errors = dict(report.errors)
            if report.ok:
                self.last_success_at = now
                self.consecutive_failures = 0
                self.backoff_until = None
                self.metrics.last_success.set(now.timestamp())
                self.metrics.ticks.labels(result="ok").inc()
                return
            self.consecutive_failures += 1
            self.metrics.ticks.labels(result="error").inc()
            if transient_failures or len(report.errors) == len(self.models if self.owned is None else self.owned):
                # exponential backoff with full jitter, in daemon-clock seconds
                base = self.config.loop.interval_s * (2 ** min(self.consecutive_failures, 10))
                delay = min(self.config.loop.backoff_max_s, base) * (0.5 + self._rng.random() / 2)
                self.backoff_until = now + timedelta(seconds=delay)
                log(logger, logging.WARNING, "tick failed; backing off", failures=self.consecutive_failures,
                    backoff_s=round(delay, 1), errors=report.errors)

    # ------------------------------------------------------------------ operator controls
    def pause(self, author: str, reason: str = "") -> bool:
        """Stop acting (decisions go on, recorded as ``paused``). Takes effect whether or not the
        database answers (stopping must work while it is away); returns whether the audit row was
        written (``False``: the database is unavailable, and the log line has the entry)."""
        with self._state_lock:
            self.paused = True
        self.metrics.paused.set(1)
        return self._audit(author, "pause", reason)

    def resume(self, author: str, reason: str = "") -> bool:
        """Act again; as :meth:`pause`."""
        with self._state_lock:
            self.paused = False
        self.metrics.paused.set(0)
        return self._audit(author, "resume", reason)

    def _audit(self, author: str, action: str, reason: str) -> bool:
        try:
            self.repo.audit(author, action, "daemon", {"reason": reason}, self.clock.now())
            return True
        except UNAVAILABLE as e:
            log(logger, logging.WARNING, "audit not written: the database is unavailable", author=author,
                action=action, reason=reason, error=database_words(e))
            return False

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready when the database answers, the leader lock could be checked, and (for the
        leader) the first complete observation is done and the last successful tick is recent:
        three tick intervals plus ``READY_SLACK_WALL_S`` of scheduling slack, both on the daemon's
        clock, the one the tick schedule runs on. ``reasons`` says why not; ``providers`` holds
        each component's last error and when (daemon clock)."""
        now = self.clock.now()
        # one ping at a time: probes that arrive while one hangs (a database host that went
        # silent) answer from its last outcome instead of piling up threads behind it
        if self._ping_lock.acquire(blocking=False):
            try:
                self._note("database", self._database_error(), now, critical=True)
            finally:
                self._ping_lock.release()
        with self._state_lock:
            last = self.last_success_at
            detail: dict[str, Any] = {
                "last_successful_tick": last.isoformat() if last else None,
                "last_tick": self.last_tick_at.isoformat() if self.last_tick_at else None,
                "consecutive_failures": self.consecutive_failures,
                "observed_models": sorted(self.controller.observed_once),
                "errors": dict(self.last_errors),
                "paused": self.paused,
                "dry_run": self.dry_run,
                "degraded": dict(degraded_models(self.metrics_source)),
                "providers": {name: h.to_json() for name, h in sorted(self.health.items())},
            }
            database, leader = self.health.get("database", Health()), self.health.get("leader", Health())
        detail["role"] = "standby" if self.standby else "leader"
        detail["election"] = None if self.elector is None else {
            "identity": self.elector.identity, "backend": type(self.elector).__name__}
        if isinstance(self.elector, ShardElector):
            detail["election"]["buckets"] = self.elector.buckets
            detail["owned_models"] = len(self.owned or ())
        reasons: list[str] = []
        if not database.ok:
            reasons.append(f"database unreachable: {database.last_error}")
        if not leader.ok:
            reasons.append(f"leader lock unreachable: {leader.last_error}")
        if not self.standby:
            # a healthy standby is ready (so a PodDisruptionBudget counts it); it takes over on loss
            # of the leader and then has to observe before acting, like any fresh start
            reasons.extend(self._tick_reasons(now, last))
        detail["reasons"] = reasons
        return not reasons, detail

    def _tick_reasons(self, now: datetime, last: datetime | None) -> list[str]:
        limit_s = 3 * self.config.loop.interval_s + READY_SLACK_WALL_S * self._rate()
        out = []
        if last is None:
            out.append("no successful tick yet")
        elif (now - last).total_seconds() > limit_s:
            out.append(f"last successful tick {(now - last).total_seconds():.0f} s ago (limit {limit_s:.0f} s, daemon clock)")
        if self.consecutive_failures >= self.config.loop.ready_after_failed_ticks:
            out.append(f"{self.consecutive_failures} consecutive failed ticks")
        mine = set(self.models) if self.owned is None else self.owned
        unobserved = (set(self.policy_store.policies()) & mine) - self.controller.observed_once
        if unobserved:
            out.append(f"not observed yet: {', '.join(sorted(unobserved))}")
        return out

    def _database_error(self) -> str | None:
        try:
            self.repo.ping()
        except Exception as e:  # noqa: BLE001 - any failure to answer is the reason shown
            return f"{type(e).__name__}: {getattr(e, 'orig', None) or e}"  # the driver's words, not SQLAlchemy's wrapping
        return None

    def status(self) -> dict[str, Any]:
        """``/v1/status``'s body (``controller.status``)."""
        now = self.clock.now()
        try:
            overrides = self.repo.active_overrides(now)
        except UNAVAILABLE:
            # the database is away: the status answers all the same (the page's journal flag needs
            # it then most), with the overrides in force for the ticks (the last read)
            overrides = self.controller.overrides_in_force(now)
        policies = self.policy_store.policies()
        degraded = dict(degraded_models(self.metrics_source))
        ctl = self.controller
        with self._state_lock:
            return status_json(now=now, paused=self.paused, dry_run=self.dry_run, models=self.models, pools=self.pools,
                               decisions=ctl.last_decisions, signals=ctl.last_signals,
                               decision_ids=ctl.last_decision_ids, policies=policies, overrides=overrides,
                               degraded=degraded, journal=self.journal_status())

    # ------------------------------------------------------------------ scheduling
    def start(self, wall_interval_s: float | None = None, policy_reload_s: float | None = None) -> None:
        """Schedule the tick (max one instance, coalesced) and the policy watcher. The tick runs
        every ``loop.interval_s`` of the daemon's clock unless ``wall_interval_s`` says otherwise."""
        from apscheduler.schedulers.background import BackgroundScheduler

        self.reload_policies()
        # one clock: ticks come every interval_s of the daemon's clock, which for the demo's
        # accelerated clock is interval_s / speedup wall seconds (readiness measures the same clock)
        interval = wall_interval_s if wall_interval_s is not None else self.config.loop.interval_s / self._rate()
        sched = BackgroundScheduler(timezone="UTC")
        sched.add_job(self._safe_tick, "interval", seconds=interval, id="tick", max_instances=1,
                      coalesce=True, misfire_grace_time=None, next_run_time=datetime.now().astimezone())
        sched.add_job(self._safe_reload, "interval", seconds=policy_reload_s or self.config.loop.policy_reload_s,
                      id="policy-reload", max_instances=1, coalesce=True)
        sched.start()
        self._scheduler = sched
        for func, seconds, job_id in self._jobs:
            self._schedule_job(func, seconds, job_id)

    def add_job(self, func: Callable[[], Any], seconds: float, job_id: str) -> None:
        """Extra periodic work from providers (e.g. spot price refresh) on the same scheduler: run
        once at once, then every ``seconds`` (wall clock). Jobs added before ``start()`` are kept
        and scheduled by it, so assembly code can add them while building the daemon."""
        if self._scheduler is None:
            self._jobs.append((func, seconds, job_id))
            return
        self._schedule_job(func, seconds, job_id)

    def _schedule_job(self, func: Callable[[], Any], seconds: float, job_id: str) -> None:
        # first run now: a cache (spot prices) should not wait a whole period to be filled
        self._scheduler.add_job(func, "interval", seconds=seconds, id=job_id, max_instances=1, coalesce=True,
                                next_run_time=datetime.now().astimezone())

    def _safe_tick(self) -> None:
        try:
            self.tick()
        except Exception:  # noqa: BLE001 - the scheduler must keep running
            logger.exception("tick crashed")
            self.metrics.ticks.labels(result="error").inc()

    def _safe_reload(self) -> None:
        try:
            self.reload_policies()
        except UNAVAILABLE:
            pass  # logged by reload_policies, in one line: the database is away, not a crash
        except Exception:  # noqa: BLE001
            logger.exception("policy reload crashed")

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
