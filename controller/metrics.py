"""The daemon's own Prometheus metrics, in one registry value (no global default registry).

Metric names here are a public interface: the Grafana dashboard and the alert rules in ``deploy/``
use them, and a test cross-checks that every name they query exists.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DaemonMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.ticks = Counter("tidegate_ticks", "Ticks run, by result (ok, error, skipped).", ["result"], registry=r)
        self.tick_duration = Histogram(
            "tidegate_tick_duration_seconds", "Wall time of one tick over all models.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.last_success = Gauge(
            "tidegate_last_successful_tick_timestamp_seconds",
            "Unix time (daemon clock) of the last tick that completed for every model.", registry=r)
        self.decisions = Counter("tidegate_decisions", "Decisions recorded, by model and reason code.", ["model", "reason"], registry=r)
        self.actions = Counter("tidegate_actions", "Provider calls, by pool, call and status.", ["pool", "call", "status"], registry=r)
        self.replicas = Gauge("tidegate_replicas", "Replicas per model and pool; state is desired (decided) or current or ready (observed).", ["model", "pool", "state"], registry=r)
        self.desired_total = Gauge("tidegate_desired_replicas", "Decided total replicas per model.", ["model"], registry=r)
        self.cost_per_hour = Gauge("tidegate_cost_per_hour_usd", "Cost per hour of the decided placement, per model and pool.", ["model", "pool"], registry=r)
        self.cost_per_mtok = Gauge("tidegate_cost_per_million_tokens_usd", "Cost per million output tokens per model: the cost per hour of the replicas the pools hold over the observed output token rate (the figure the cost-per-token cap compares).", ["model"], registry=r)
        self.budget_cap = Gauge("tidegate_budget_max_cost_per_hour_usd", "The policy's cost ceiling per hour per model (absent when none).", ["model"], registry=r)
        self.p99_latency = Gauge("tidegate_signal_p99_latency_ms", "Observed p99 latency per model, milliseconds.", ["model"], registry=r)
        self.slo_p99 = Gauge("tidegate_slo_p99_latency_ms", "The policy's p99 latency target per model, milliseconds.", ["model"], registry=r)
        self.queue_depth = Gauge("tidegate_signal_queue_depth", "Observed waiting requests per model.", ["model"], registry=r)
        self.signal_missing = Gauge("tidegate_signal_missing", "1 while a signal is missing or stale for a model (absent for one its source does not measure by design: NotConfigured, NotSimulated).", ["model", "signal"], registry=r)
        self.pool_available = Gauge("tidegate_pool_available", "1 while a pool accepts new replicas of a model, 0 while marked unavailable.", ["model", "pool"], registry=r)
        self.interruptions = Counter("tidegate_spot_interruptions", "Replicas replaced because of spot interruption notices, by pool.", ["pool"], registry=r)
        self.overrides_active = Gauge("tidegate_overrides_active", "Active operator overrides per model.", ["model"], registry=r)
        self.policy_reload_errors = Counter("tidegate_policy_reload_errors", "Policy files rejected at load or reload.", registry=r)
        self.policy_info = Gauge("tidegate_policy_info", "1 for the policy version in force per model.", ["model", "version"], registry=r)
        self.paused = Gauge("tidegate_paused", "1 while actuation is paused by an operator.", registry=r)
        self.leader = Gauge("tidegate_leader", "1 while this daemon instance actuates (leader).", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
