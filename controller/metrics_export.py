"""What each decision shows outside the decision log: the daemon's per-model Prometheus series and
the ``decision`` log line.

Split out of ``controller.daemon`` (issue 11: the daemon is scheduling and readiness around a
``Controller``). The per-model families are ``controller.metrics.ModelFamily`` values: each label
set's child is looked up once and kept, and a scrape formats only the models whose values changed
since the last one.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Mapping, Sequence

from controller.core.model import Action, Decision, ModelSignals, ModelSpec, PoolSpec
from controller.core.policy import EffectivePolicy
from controller.core.pricing import pool_cost_per_hour_usd
from controller.core.signals import NOT_MEASURED_REASONS
from controller.logs import log
from controller.metrics import DaemonMetrics

logger = logging.getLogger("tidegate.daemon")


class MetricsExport:
    """Turns decisions and provider calls into the daemon's metrics and decision log lines.

    ``policy`` looks up the policy in force for a model (budget and SLO gauges)."""

    def __init__(self, metrics: DaemonMetrics, models: Mapping[str, ModelSpec], pools: Mapping[str, PoolSpec],
                 policy: Callable[[str], EffectivePolicy | None]) -> None:
        self.metrics = metrics
        self.models = models
        self.pools = pools
        self.policy = policy
        self._action_children: dict[tuple[str, str, str], Any] = {}
        """``tidegate_actions`` children by (pool, call, status): a label set's child is kept."""
        self._series: dict[str, _Series] = {}
        """Each model's per-model children (``_Series``), made at its first decision."""

    def actions(self, actions: Sequence[Action]) -> None:
        counts: dict[tuple[str, str, str], int] = {}
        for a in actions:
            key = (a.pool, a.call, a.status.value)
            counts[key] = counts.get(key, 0) + 1
        for key, n in counts.items():
            child = self._action_children.get(key)
            if child is None:  # prometheus_client's labels() validates and locks: once per label set
                child = self._action_children[key] = self.metrics.actions.labels(*key)
            child.inc(n)

    def decided(self, d: Decision, sig: ModelSignals, outcome: str) -> None:
        m = self.metrics
        series = self._series.get(d.model)
        if series is None:
            series = self._series[d.model] = _Series(m, d.model, self.models[d.model].pools)
        series.decision(d.reason).inc()
        series.desired_total.set(d.replicas)
        model = self.models[d.model]
        for pool_name in model.pools:
            self._pool(d, sig, model, pool_name, series.pools[pool_name])
        if d.interrupted_replaced:
            for pool_name in model.pools:
                st = sig.pools.get(pool_name)
                if st is not None and st.interrupted_replicas:
                    m.interruptions.labels(pool=pool_name).inc(st.interrupted_replicas)
        self._signals(d.model, sig, series)
        pol = self.policy(d.model)
        if pol is not None:
            if pol.spec.budget.max_cost_per_hour_usd is not None:
                series.budget_cap.set(pol.spec.budget.max_cost_per_hour_usd)
            if pol.spec.slo.p99_latency_ms is not None:
                series.slo_p99.set(pol.spec.slo.p99_latency_ms)
        log_decision(d, outcome)

    def _pool(self, d: Decision, sig: ModelSignals, model: ModelSpec, pool_name: str, children: tuple[Any, ...]) -> None:
        desired_c, current_c, ready_c, cost_c, available_c = children
        st = sig.pools.get(pool_name)
        desired = d.placement.get(pool_name, 0)
        desired_c.set(desired)
        if st is not None and st.replicas is not None:
            current_c.set(st.replicas)
        if st is not None and st.ready_replicas is not None:
            ready_c.set(st.ready_replicas)
        cost_c.set(pool_cost_per_hour_usd(model, self.pools[pool_name], st, desired))
        available_c.set(1 if (st is None or st.available) else 0)

    def _signals(self, model: str, sig: ModelSignals, series: "_Series") -> None:
        m = self.metrics
        cpt = sig.cost_per_million_tokens_usd.value
        if cpt is not None:
            series.cost_per_mtok.set(cpt)
        if sig.p99_latency_ms.value is not None:
            series.p99.set(sig.p99_latency_ms.value)
        if sig.queue_depth.value is not None:
            series.queue.set(sig.queue_depth.value)
        for s, sample in sig.samples.items():
            if sample.value is None and (sample.reason or "").split(":")[0] in NOT_MEASURED_REASONS:
                with contextlib.suppress(KeyError):  # not measured by design: nothing to page about
                    m.signal_missing.remove(model, s)
            else:
                series.missing(s).set(0 if sample.value is not None else 1)


class _Series:
    """One model's children of the per-model families, looked up once (``labels()`` builds a key
    and looks it up in two dicts: 40-odd times a decision). A child outlives ``forget_model``
    and ``remove``: setting it exposes its series again, as a new child would."""

    __slots__ = ("_metrics", "_model", "_decisions", "_missing", "desired_total", "pools", "cost_per_mtok",
                 "p99", "queue", "budget_cap", "slo_p99")

    def __init__(self, m: DaemonMetrics, model: str, pools: Sequence[str]) -> None:
        self._metrics, self._model = m, model
        self._decisions: dict[str, Any] = {}
        self._missing: dict[str, Any] = {}
        self.desired_total = m.desired_total.labels(model)
        self.pools = {p: (m.replicas.labels(model, p, "desired"), m.replicas.labels(model, p, "current"),
                          m.replicas.labels(model, p, "ready"), m.cost_per_hour.labels(model, p),
                          m.pool_available.labels(model, p)) for p in pools}
        self.cost_per_mtok = m.cost_per_mtok.labels(model)
        self.p99 = m.p99_latency.labels(model)
        self.queue = m.queue_depth.labels(model)
        self.budget_cap = m.budget_cap.labels(model)
        self.slo_p99 = m.slo_p99.labels(model)

    def decision(self, reason: str) -> Any:
        child = self._decisions.get(reason)
        if child is None:
            child = self._decisions[reason] = self._metrics.decisions.labels(self._model, reason)
        return child

    def missing(self, signal: str) -> Any:
        child = self._missing.get(signal)
        if child is None:
            child = self._missing[signal] = self._metrics.signal_missing.labels(self._model, signal)
        return child


def log_decision(d: Decision, outcome: str) -> None:
    """The ``decision`` log line: INFO for a change, DEBUG otherwise (skipped ones not at all)."""
    level = logging.INFO if d.changed else logging.DEBUG
    if (d.changed or outcome not in ("skipped",)) and logger.isEnabledFor(level):
        log(logger, level, "decision",
            model=d.model, replicas=d.replicas, current=d.current_replicas,
            placement=",".join(f"{p}={n}" for p, n in sorted(d.placement.items())),
            reason=d.reason, outcome=outcome, cost_per_hour_usd=round(d.cost_per_hour_usd, 2))
