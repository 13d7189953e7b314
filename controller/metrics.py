"""The daemon's own Prometheus metrics, in one registry value (no global default registry).

Metric names here are a public interface: the Grafana dashboard and the alert rules in ``deploy/``
use them, and a test cross-checks that every name they query exists.

Two kinds of families. The daemon-wide ones (ticks, tick duration, actions per pool, leader...)
are ``prometheus_client`` metrics. The per-model ones (replicas, cost, signals, decisions...) are
:class:`ModelFamily` values: with a thousand models they hold tens of thousands of series, and
``prometheus_client`` formats every series again at every scrape (0.3-0.46 s and 2.9 MB at 1,000
models, issue 13). A :class:`ModelFamily` keeps each model's lines as text and formats them again
only when one of that model's values changed; a scrape joins the cached text. Each label set's
child is created once and reused (``labels()`` returns the same child), and ``forget(model)``
drops a model's series (a model another replica now acts on, or one removed from the config).
"""

from __future__ import annotations

import threading
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class _Child:
    """One series of a :class:`ModelFamily` (one label set)."""

    __slots__ = ("_family", "_model", "_key", "value", "present")

    def __init__(self, family: "ModelFamily", model: str, key: tuple[str, ...]) -> None:
        self._family, self._model, self._key = family, model, key
        self.value = 0.0
        self.present = False
        """Exposed: set or incremented since it was made (or removed)."""

    def set(self, value: float) -> None:
        value = float(value)
        if value != self.value or not self.present:
            self._family._update(self._model, self, value)

    def inc(self, amount: float = 1.0) -> None:
        self._family._update(self._model, self, self.value + float(amount))


_ABSENT = _Child.__new__(_Child)
_ABSENT.present = False


class ModelFamily:
    """A gauge or counter family whose first label is ``model``, exposed from cached text."""

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...], *, counter: bool = False) -> None:
        assert labelnames[0] == "model", labelnames
        self.name, self.documentation, self.labelnames, self.counter = name, documentation, labelnames, counter
        self.sample_name = f"{name}_total" if counter else name
        self._lock = threading.Lock()
        self._children: dict[str, dict[tuple[str, ...], _Child]] = {}
        """Per model: its children by label values, created once by ``labels()``; a child is
        exposed once set or incremented (``present``)."""
        self._text: dict[str, bytes] = {}
        """Per model: its exposed series as text, rebuilt when one of them changed (``_dirty``)."""
        self._dirty: set[str] = set()

    def labels(self, *values: str, **kw: str) -> _Child:
        key = tuple(values) if values else tuple(str(kw[n]) for n in self.labelnames)
        child = self._children.get(key[0], {}).get(key)
        if child is None:
            with self._lock:
                child = self._children.setdefault(key[0], {}).setdefault(key, _Child(self, key[0], key))
        return child

    def _update(self, model: str, child: _Child, value: float) -> None:
        with self._lock:
            child.value = value
            child.present = True
            self._children.setdefault(model, {})[child._key] = child  # again after remove()
            self._dirty.add(model)

    def remove(self, *values: str) -> None:
        """Stop exposing one series (``KeyError`` when it is not exposed, as ``prometheus_client``)."""
        key = tuple(values)
        with self._lock:
            series = self._children.get(key[0], {})
            if not series.get(key, _ABSENT).present:
                raise KeyError(key)
            series.pop(key).present = False
            self._dirty.add(key[0])

    def forget(self, model: str) -> None:
        """Drop every series of ``model``."""
        with self._lock:
            for child in self._children.pop(model, {}).values():
                child.present = False
            self._text.pop(model, None)
            self._dirty.discard(model)

    def models(self) -> set[str]:
        return {m for m, series in self._children.items() if any(c.present for c in series.values())}

    def _exposed(self, model: str) -> Iterator[tuple[tuple[str, ...], _Child]]:
        return ((k, c) for k, c in self._children.get(model, {}).items() if c.present)

    def _model_text(self, model: str) -> bytes:
        lines = []
        for key, child in self._exposed(model):
            labels = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(self.labelnames, key))
            lines.append(f"{self.sample_name}{{{labels}}} {floatToGoString(child.value)}\n")
        return "".join(lines).encode()

    def render(self) -> bytes:
        """The family's exposition text: the changed models' text rebuilt, then joined (not kept
        whole: a second copy of every model's text, 2.9 MB at 1,000 models)."""
        with self._lock:
            for model in self._dirty:
                text = self._model_text(model)
                if text:
                    self._text[model] = text
                else:
                    self._text.pop(model, None)
            self._dirty.clear()
            kind = "counter" if self.counter else "gauge"
            head = (f"# HELP {self.sample_name} {self.documentation}\n"
                    f"# TYPE {self.sample_name} {kind}\n").encode()
            return head + b"".join(self._text.values())

    def collect(self) -> Iterator[Metric]:
        """The family as ``prometheus_client`` metric objects (for ``registry.collect()``)."""
        fam: Metric
        if self.counter:
            fam = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        else:
            fam = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        with self._lock:
            for model in self._children:
                for key, child in self._exposed(model):
                    fam.add_metric(list(key), child.value)
        yield fam


class _ModelFamilies:
    """The per-model families as one collector of the full registry."""

    def __init__(self, families: list[ModelFamily]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for f in self.families:
            yield from f.collect()


class _Core:
    """The families of the core registry, as one collector of the full registry (a family
    registered there later is listed too)."""

    def __init__(self, core: CollectorRegistry) -> None:
        self.core = core

    def collect(self) -> Iterator[Metric]:
        yield from self.core.collect()


class DaemonMetrics:
    def __init__(self) -> None:
        r = self._core = CollectorRegistry(auto_describe=True)
        self.ticks = Counter("tidegate_ticks", "Ticks run, by result (ok, error, skipped).", ["result"], registry=r)
        self.tick_duration = Histogram(
            "tidegate_tick_duration_seconds", "Wall time of one tick over all models.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.last_success = Gauge(
            "tidegate_last_successful_tick_timestamp_seconds",
            "Unix time (daemon clock) of the last tick that completed for every model.", registry=r)
        self.actions = Counter("tidegate_actions", "Provider calls, by pool, call and status.", ["pool", "call", "status"], registry=r)
        self.interruptions = Counter("tidegate_spot_interruptions", "Replicas replaced because of spot interruption notices, by pool.", ["pool"], registry=r)
        self.policy_reload_errors = Counter("tidegate_policy_reload_errors", "Policy files rejected at load or reload.", registry=r)
        self.paused = Gauge("tidegate_paused", "1 while actuation is paused by an operator.", registry=r)
        self.leader = Gauge("tidegate_leader", "1 while this daemon instance actuates (leader, or holder of at least one bucket when sharded).", registry=r)
        self.journal_bytes = Gauge("tidegate_journal_bytes", "Bytes in the local journal waiting to be replayed into the decision log (intents written while the database was away); 0 when none waits.", registry=r)
        self.buckets_held = Gauge("tidegate_buckets_held", "Buckets (model shards) this daemon holds and acts on; with leader_election.buckets 1, 1 on the leader.", registry=r)

        def fam(name: str, doc: str, *labels: str, counter: bool = False) -> ModelFamily:
            return ModelFamily(name, doc, ("model", *labels), counter=counter)

        self.decisions = fam("tidegate_decisions", "Decisions recorded, by model and reason code.", "reason", counter=True)
        self.replicas = fam("tidegate_replicas", "Replicas per model and pool; state is desired (decided) or current or ready (observed).", "pool", "state")
        self.desired_total = fam("tidegate_desired_replicas", "Decided total replicas per model.")
        self.cost_per_hour = fam("tidegate_cost_per_hour_usd", "Cost per hour of the decided placement, per model and pool.", "pool")
        self.cost_per_mtok = fam("tidegate_cost_per_million_tokens_usd", "Cost per million output tokens per model: the cost per hour of the replicas the pools hold over the observed output token rate (the figure the cost-per-token cap compares).")
        self.budget_cap = fam("tidegate_budget_max_cost_per_hour_usd", "The policy's cost ceiling per hour per model (absent when none).")
        self.p99_latency = fam("tidegate_signal_p99_latency_ms", "Observed p99 latency per model, milliseconds.")
        self.slo_p99 = fam("tidegate_slo_p99_latency_ms", "The policy's p99 latency target per model, milliseconds.")
        self.queue_depth = fam("tidegate_signal_queue_depth", "Observed waiting requests per model.")
        self.signal_missing = fam("tidegate_signal_missing", "1 while a signal is missing or stale for a model (absent for one its source does not measure by design: NotConfigured, NotSimulated).", "signal")
        self.pool_available = fam("tidegate_pool_available", "1 while a pool accepts new replicas of a model, 0 while marked unavailable.", "pool")
        self.overrides_active = fam("tidegate_overrides_active", "Active operator overrides per model.")
        self.policy_info = fam("tidegate_policy_info", "1 for the policy version in force per model.", "version")
        self.model_families = [
            self.decisions, self.replicas, self.desired_total, self.cost_per_hour, self.cost_per_mtok, self.budget_cap,
            self.p99_latency, self.slo_p99, self.queue_depth, self.signal_missing, self.pool_available,
            self.overrides_active, self.policy_info]
        self.registry = CollectorRegistry(auto_describe=True)
        """Every family (``registry.collect()``); ``render()`` reads the cached text instead."""
        self.registry.register(_Core(r))  # type: ignore[arg-type]
        self.registry.register(_ModelFamilies(self.model_families))  # type: ignore[arg-type]

    @property
    def core(self) -> CollectorRegistry:
        """Where families defined outside this class register (``providers.kubeobjects``): scraped
        by ``render()`` and listed by ``registry`` with the rest."""
        return self._core

    def forget_model(self, model: str) -> None:
        """Stop exposing every series of ``model`` (policy versions stay: they describe the files)."""
        for f in self.model_families:
            if f is not self.policy_info:
                f.forget(model)

    def render(self) -> bytes:
        return generate_latest(self._core) + b"".join(f.render() for f in self.model_families)
