"""Triton adapter: replica readiness and a fallback load signal straight from the servers.

Why it exists: Prometheus is one more thing that can fail, and an autoscaler that goes blind
when it does cannot scale up during the very incident that needs it. Triton's own HTTP API
(``tritonclient.http``) answers two questions without Prometheus:

- **Is a replica ready?** Only when its server is live, the server is ready *and* the model is
  ready. A pod whose process is up but whose engine is still loading is not capacity.
- **How loaded is the model?** The statistics extension reports cumulative queue time, compute
  time and success counts per model. Deltas between two reads give the mean number of waiting
  requests (Little's law: queue-time accrued per second of wall time), the mean request latency
  and the request rate. These are *estimates*: the latency is a mean, not a p99, and every sample
  says so in its reason.

``CombinedMetricsSource`` puts the two together: Prometheus first, Triton for any signal
Prometheus could not give, and the model is marked degraded (with the reason) while that lasts so
``/v1/status`` and ``/readyz`` can show it. It never raises for missing data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Mapping, Protocol, Sequence

import tritonclient.http as triton_http  # type: ignore[import-untyped]
from tritonclient.utils import InferenceServerException  # type: ignore[import-untyped]

from controller.core.model import ModelSignals, ModelSpec, Sample
from controller.protocols import EvaluatesQueries, MeasuresPower

log = logging.getLogger("tidegate.providers.triton")

# Codes (the part of ``Sample.reason`` before ``:``), in the style of ``providers.prometheus``.
NO_BASELINE = "NoBaseline"
COUNTER_RESET = "CounterReset"
TRITON_UNREACHABLE = "TritonUnreachable"
NO_REPLICAS = "NoReplicas"
NO_REQUESTS = "NoRequests"
PARTIAL = "Partial"
ESTIMATED = "TritonStatistics"
AVERAGE_NOT_P99 = "AverageNotP99"


@dataclass(frozen=True, slots=True)
class TritonReplica:
    """One Triton server (a pod) serving a model in a pool. ``url`` is Triton's HTTP endpoint
    (``host:port``, no scheme); ``triton_model`` the model name inside Triton when it differs from
    the bundle name (a TensorRT-LLM ensemble's ``tensorrt_llm``)."""

    url: str
    pool: str
    triton_model: str | None = None


@dataclass(frozen=True, slots=True)
class ReplicaHealth:
    live: bool
    ready: bool
    model_ready: bool
    reason: str | None = None

    @property
    def serving(self) -> bool:
        """Counts as a ready replica: live, ready and the model loaded."""
        return self.live and self.ready and self.model_ready


ReplicaMap = Mapping[str, Sequence[TritonReplica]]
"""Bundle (model) name -> its replicas; in the daemon, built from the pods the Kubernetes provider
lists per pool Deployment."""


@dataclass(frozen=True, slots=True)
class _Stats:
    at: datetime
    success_count: int
    success_ns: int
    queue_ns: int
    compute_infer_ns: int


class TritonFallback:
    """Reads Triton's readiness and statistics APIs directly, per replica.

    ``replicas`` is a mapping or a callable returning one (called every tick, so replicas can
    come and go). ``observe`` returns ``queue_depth``, ``p99_latency_ms`` (a mean, reason
    ``AverageNotP99``) and ``request_rate_per_s`` per model; deltas are taken between this call
    and the previous one for the same replica, so the first call only sets the baseline (and a call
within ``min_interval_s`` of it reports no baseline and keeps it). Time
    comes in as ``now``; nothing here reads the clock.
    """

    def __init__(self, replicas: ReplicaMap | Callable[[], ReplicaMap], *, timeout_s: float = 1.0,
                 max_interval_s: float = 120.0, min_interval_s: float = 0.25,
                 client_factory: Callable[[str, float], Any] | None = None) -> None:
        self._replicas = replicas
        self.timeout_s = timeout_s
        self.max_interval_s = max_interval_s
        """A baseline older than this is too old to take a meaningful delta against."""
        self.min_interval_s = min_interval_s
        """A read this soon after the baseline is no interval: the reads' own latency (``now`` is
        taken before them) would dominate the rates, so the baseline is kept for the next read."""
        self._client_factory = client_factory or _default_client
        self._clients: dict[str, Any] = {}
        self._prev: dict[tuple[str, str], _Stats] = {}

    def replicas(self) -> ReplicaMap:
        return self._replicas() if callable(self._replicas) else self._replicas

    def close(self) -> None:
        for c in self._clients.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing a dead connection must not fail the caller
                pass
        self._clients.clear()

    def _client(self, url: str) -> Any:
        c = self._clients.get(url)
        if c is None:
            c = self._clients[url] = self._client_factory(url, self.timeout_s)
        return c

    def _drop(self, url: str) -> None:
        c = self._clients.pop(url, None)
        if c is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass

    # ---- readiness

    def health(self, replica: TritonReplica, model: str) -> ReplicaHealth:
        name = replica.triton_model or model
        c = self._client(replica.url)
        try:
            live = bool(c.is_server_live())
            ready = live and bool(c.is_server_ready())
            model_ready = ready and bool(c.is_model_ready(name))
        except (InferenceServerException, OSError, ConnectionError) as e:
            self._drop(replica.url)
            return ReplicaHealth(False, False, False, f"{TRITON_UNREACHABLE}: {replica.url}: {e}")
        except Exception as e:  # noqa: BLE001 - geventhttpclient raises assorted socket errors
            self._drop(replica.url)
            return ReplicaHealth(False, False, False, f"{TRITON_UNREACHABLE}: {replica.url}: {type(e).__name__}: {e}")
        if not live:
            return ReplicaHealth(False, False, False, f"NotLive: {replica.url}")
        if not ready:
            return ReplicaHealth(True, False, False, f"NotReady: {replica.url} server not ready")
        if not model_ready:
            return ReplicaHealth(True, True, False, f"ModelNotReady: {replica.url} model {name} not ready")
        return ReplicaHealth(True, True, True)

    def ready_replicas(self, model: str) -> dict[str, int]:
        """Pool -> replicas of ``model`` that are live, ready and have the model ready."""
        out: dict[str, int] = {}
        for r in self.replicas().get(model, ()):
            out.setdefault(r.pool, 0)
            if self.health(r, model).serving:
                out[r.pool] += 1
        return out

    # ---- statistics

    def _read(self, replica: TritonReplica, model: str, now: datetime) -> _Stats | str:
        name = replica.triton_model or model
        try:
            body = self._client(replica.url).get_inference_statistics(model_name=name)
        except Exception as e:  # noqa: BLE001 - see health(): socket errors come in many types
            self._drop(replica.url)
            return f"{TRITON_UNREACHABLE}: {replica.url}: {type(e).__name__}: {e}"
        try:
            stats = [m for m in body["model_stats"] if m.get("name") == name]
            success = queue = infer = 0
            count = 0
            for m in stats:  # one entry per loaded version: add them up
                inf = m["inference_stats"]
                count += int(inf["success"]["count"])
                success += int(inf["success"]["ns"])
                queue += int(inf["queue"]["ns"])
                infer += int(inf["compute_infer"]["ns"])
        except (KeyError, TypeError, ValueError) as e:
            return f"BadResponse: {replica.url}: statistics for {name}: {e}"
        if not stats:
            return f"NoData: {replica.url} has no statistics for {name}"
        return _Stats(now, count, success, queue, infer)

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        reps = self.replicas()
        out: dict[str, ModelSignals] = {}
        for m in models:
            queue_sum = 0.0
            rate_sum = 0.0
            lat_weighted = 0.0
            lat_count = 0
            used: list[str] = []
            problems: list[str] = []
            replicas = list(reps.get(m.name, ()))
            for r in replicas:
                cur = self._read(r, m.name, now)
                if isinstance(cur, str):
                    problems.append(cur)
                    self._prev.pop((r.url, m.name), None)
                    continue
                prev = self._prev.get((r.url, m.name))
                if prev is not None and 0 < (cur.at - prev.at).total_seconds() < self.min_interval_s:
                    problems.append(f"{NO_BASELINE}: {r.url}: {(cur.at - prev.at).total_seconds():.2f}s since the "
                                    f"baseline, under {self.min_interval_s:g}s; it stays the baseline")
                    continue
                self._prev[(r.url, m.name)] = cur
                if prev is None:
                    problems.append(f"{NO_BASELINE}: {r.url}: first statistics read; deltas need two")
                    continue
                dt = (cur.at - prev.at).total_seconds()
                if dt <= 0 or dt > self.max_interval_s:
                    problems.append(f"{NO_BASELINE}: {r.url}: {dt:.1f}s since the previous read")
                    continue
                d_count = cur.success_count - prev.success_count
                d_success = cur.success_ns - prev.success_ns
                d_queue = cur.queue_ns - prev.queue_ns
                if d_count < 0 or d_success < 0 or d_queue < 0:
                    # the server restarted: its counters began again; this read is the new baseline
                    problems.append(f"{COUNTER_RESET}: {r.url}: statistics went backwards (restart?)")
                    continue
                used.append(r.url)
                queue_sum += d_queue / (dt * 1e9)
                rate_sum += d_count / dt
                if d_count > 0:
                    lat_weighted += d_success / 1e6
                    lat_count += d_count
            for gone in [k for k in self._prev if k[1] == m.name and k[0] not in {r.url for r in replicas}]:
                del self._prev[gone]
            out[m.name] = self._signals(m.name, now, replicas, used, problems, queue_sum, rate_sum, lat_weighted, lat_count)
        return out

    def _signals(self, model: str, now: datetime, replicas: Sequence[TritonReplica], used: Sequence[str],
                 problems: Sequence[str], queue_sum: float, rate_sum: float, lat_ms_total: float,
                 lat_count: int) -> ModelSignals:
        if not replicas:
            miss = Sample.missing(f"{NO_REPLICAS}: no Triton replicas known for {model}")
            return ModelSignals(model=model, at=now, queue_depth=miss, p99_latency_ms=miss, request_rate_per_s=miss)
        if not used:
            why = "; ".join(problems) if problems else f"{NO_REPLICAS}: {model}"
            if len(problems) > 1:
                codes = sorted({p.split(":", 1)[0] for p in problems})
                why = f"{codes[0] if len(codes) == 1 else TRITON_UNREACHABLE}: " + "; ".join(problems)
            miss = Sample.missing(why[:500])
            return ModelSignals(model=model, at=now, queue_depth=miss, p99_latency_ms=miss, request_rate_per_s=miss)
        partial = ""
        if problems:
            # Some replicas could not be read: sums cover the others only (a lower bound).
            partial = f"{PARTIAL}: {len(used)} of {len(replicas)} replicas read; " + "; ".join(problems)[:300] + "; "
        queue = Sample(queue_sum, now, partial or
                       f"{ESTIMATED}: mean waiting requests from Triton queue time (Little's law) over {len(used)} replicas")
        rate = Sample(rate_sum, now, partial or None)
        if lat_count > 0:
            lat = Sample(lat_ms_total / lat_count, now,
                         f"{AVERAGE_NOT_P99}: mean request latency from Triton statistics; "
                         f"{partial}no percentile is available without Prometheus")
        else:
            lat = Sample.missing(f"{NO_REQUESTS}: {model} completed no requests since the previous read; latency undefined", now)
        return ModelSignals(model=model, at=now, queue_depth=queue, p99_latency_ms=lat, request_rate_per_s=rate)


def _default_client(url: str, timeout_s: float) -> Any:
    return triton_http.InferenceServerClient(url, connection_timeout=timeout_s, network_timeout=timeout_s)


class _Source(Protocol):
    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]: ...


FILLABLE = ("queue_depth", "p99_latency_ms", "request_rate_per_s")
CRITICAL = ("queue_depth", "p99_latency_ms")


class CombinedMetricsSource:
    """Prometheus first; Triton's statistics for the signals Prometheus could not give.

    The fallback is read every tick, not only when Prometheus fails, so that its deltas have a
    baseline at the moment they are needed (scale-up keeps working from the first blind tick).
    ``degraded`` maps a model to the reason while any of its ``critical`` signals is missing from
    the primary source; an idle model (``NoRequests``) is not degraded.
    """

    def __init__(self, primary: _Source, fallback: _Source, *, fill: Sequence[str] = FILLABLE,
                 critical: Sequence[str] = CRITICAL) -> None:
        self.primary = primary
        self.fallback = fallback
        self.fill = tuple(fill)
        self.critical = tuple(critical)
        self._degraded: dict[str, str] = {}

    @property
    def degraded(self) -> dict[str, str]:
        return dict(self._degraded)

    def set_queries(self, queries: Mapping[str, Sequence[str]]) -> None:
        """PromQL for the rules that ask for it, evaluated by the primary source (Triton has no PromQL)."""
        if isinstance(self.primary, EvaluatesQueries):
            self.primary.set_queries(queries)

    def power_kw(self, model: str) -> Mapping[str, Sample]:
        """GPU power by pool from the primary source (Triton has no energy reading)."""
        return self.primary.power_kw(model) if isinstance(self.primary, MeasuresPower) else {}

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        prim = self.primary.observe(models, now)
        try:
            fb = self.fallback.observe(models, now)
        except Exception as e:  # noqa: BLE001 - a broken fallback must not take the primary down
            log.warning("fallback_failed error=%s", e, extra={"event": "fallback_failed", "error": str(e)})
            fb = {}
        out: dict[str, ModelSignals] = {}
        for m in models:
            p = prim.get(m.name) or ModelSignals(model=m.name, at=now)
            f = fb.get(m.name)
            changes: dict[str, Sample] = {}
            missing: list[str] = []
            filled: list[str] = []
            for sig in self.fill:
                ps: Sample = getattr(p, sig)
                if ps.value is not None or _code(ps) == NO_REQUESTS:
                    continue
                fs: Sample | None = getattr(f, sig) if f is not None else None
                if fs is not None and fs.value is not None:
                    changes[sig] = Sample(fs.value, fs.at, f"{fs.reason or ESTIMATED} (Prometheus: {_code(ps)})")
                    filled.append(sig)
            for sig in self.critical:
                ps = getattr(p, sig)
                if ps.value is None and _code(ps) != NO_REQUESTS:
                    missing.append(f"{sig}: {ps.reason}")
            out[m.name] = p.replace_samples(**changes) if changes else p
            before = self._degraded.get(m.name)
            if missing:
                reason = "PrometheusUnavailable: " + "; ".join(missing)[:400]
                reason += f"; filled from Triton statistics: {', '.join(filled)}" if filled else "; Triton fallback had no data either"
                self._degraded[m.name] = reason
                if before is None:
                    log.warning("model_degraded model=%s reason=%s", m.name, reason,
                                extra={"event": "model_degraded", "model": m.name, "reason": reason})
            elif before is not None:
                del self._degraded[m.name]
                log.info("model_recovered model=%s was=%s", m.name, before,
                         extra={"event": "model_recovered", "model": m.name, "was": before})
        return out


def _code(s: Sample) -> str | None:
    return None if s.reason is None else s.reason.split(":", 1)[0]
