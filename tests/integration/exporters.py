"""Loopback exporters that speak the exact metric text of Triton, the TensorRT-LLM backend and the
DCGM exporter, plus a launcher for a real local Prometheus that scrapes them.

Why this exists: the integration tests and the reaction-time benchmark (``bench/``) need a real
Prometheus scraping real ``/metrics`` endpoints, but on a CPU-only machine Triton emits neither DCGM GPU metrics nor the
TensorRT-LLM backend's ``nv_trt_llm_*`` / ``nv_llm_*`` families. These exporters serve those
families with the same names, label sets, label order and types as the real exporters, so the
PromQL in ``providers.prometheus`` is exercised against what production emits.

The exposition text is written here by hand on purpose: ``prometheus_client`` appends ``_total`` to
counters (and ``_created`` series), which Triton and DCGM do not, so a query written against it
would not match production.

Values are either set directly by tests (``exporter.set_model(...)``) or advanced on every scrape:
at a known rate (``Ramp``, ``HistogramRamp``), or by a small fluid queueing ``LoadModel``
(``bench/reaction_time.py --load model``). A test peer, not part of the installed package; the
``LoadModel`` is a third load model beside the simulated worlds and is to be replaced by the one
simulated world (issue 11).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml  # type: ignore[import-untyped]
from tests.integration.loopback import LoopbackServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Triton's default summary quantiles (``--metrics-config summary_latencies=true``).
TRITON_SUMMARY_QUANTILES = ("0.5", "0.9", "0.95", "0.99", "0.999")
# Triton's default buckets of ``nv_inference_first_response_histogram_ms``.
TRITON_FIRST_RESPONSE_BUCKETS_MS = (100.0, 500.0, 2000.0, 5000.0)
# The TensorRT-LLM backend's token-length histogram buckets (custom metrics).
TRT_LLM_TOKEN_BUCKETS = (10.0, 50.0, 100.0, 500.0, 1000.0)


# --------------------------------------------------------------------------------------------
# exposition text


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float) -> str:
    """Prometheus text format for a sample value (``NaN``, ``+Inf``, ``-Inf``, integers bare)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def format_le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else format_value(bound)


@dataclass
class Family:
    """One metric family: ``# HELP``/``# TYPE`` then its sample lines, in insertion order."""

    name: str
    type: str
    help: str
    samples: list[tuple[str, Sequence[tuple[str, str]], float]] = field(default_factory=list)

    def add(self, labels: Sequence[tuple[str, str]], value: float, suffix: str = "") -> None:
        """``labels`` keep their order: the real exporters' order is reproduced exactly."""
        self.samples.append((suffix, tuple(labels), value))

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.type}"]
        for suffix, labels, value in self.samples:
            lbl = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{self.name}{suffix}{{{lbl}}} {format_value(value)}" if lbl
                         else f"{self.name}{suffix} {format_value(value)}")
        return "\n".join(lines) + "\n"


def render(families: Iterable[Family]) -> str:
    return "".join(f.render() for f in families if f.samples)


# --------------------------------------------------------------------------------------------
# state of what the exporters expose


@dataclass
class Histogram:
    """Cumulative histogram state (bucket upper bounds without ``+Inf``)."""

    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    count: float = 0.0
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0.0] * len(self.bounds)

    def observe(self, value: float, times: float = 1.0) -> None:
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += times
        self.count += times
        self.sum += value * times


@dataclass
class TritonModelState:
    """What Triton's ``/metrics`` shows for one model (version ``1``). Durations in microseconds,
    cumulative, as Triton reports them. ``summary_us`` maps a quantile (``"0.99"``) to its value;
    a missing entry renders as ``NaN``, which is what Triton shows for a summary without
    observations in its window."""

    pending: float = 0.0
    success: float = 0.0
    failure: float = 0.0
    inference_count: float = 0.0
    exec_count: float = 0.0
    request_duration_us: float = 0.0
    queue_duration_us: float = 0.0
    compute_input_duration_us: float = 0.0
    compute_infer_duration_us: float = 0.0
    compute_output_duration_us: float = 0.0
    summaries: bool = True
    """Emit ``nv_inference_*_summary_us`` (Triton with ``summary_latencies=true``)."""
    summary_us: dict[str, float] = field(default_factory=dict)
    first_response_ms: Histogram | None = None
    """``nv_inference_first_response_histogram_ms`` (decoupled models with
    ``histogram_latencies=true``); ``None``: not emitted."""


@dataclass
class TrtLlmState:
    """The TensorRT-LLM backend's families for one model (served on Triton's metrics port)."""

    waiting: float = 0.0
    scheduled: float = 0.0
    context: float = 0.0
    active: float = 0.0
    max_requests: float = 512.0
    kv_max_blocks: float = 6239.0
    kv_used_blocks: float = 0.0
    kv_tokens_per_block: float = 64.0
    emit_kv_fraction: bool = True
    """Newer backends emit ``kv_cache_block_type="fraction"``; older ones only used/free/max."""
    input_tokens: Histogram = field(default_factory=lambda: Histogram(TRT_LLM_TOKEN_BUCKETS))
    output_tokens: Histogram = field(default_factory=lambda: Histogram(TRT_LLM_TOKEN_BUCKETS))


@dataclass
class GpuState:
    """One GPU as the DCGM exporter (with Kubernetes pod mapping) shows it."""

    gpu: int
    pod: str = ""
    namespace: str = ""
    container: str = ""
    util_pct: float = 0.0
    energy_mj: float = 0.0
    """``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``: millijoules since boot (counter)."""
    model_name: str = "NVIDIA A100-SXM4-80GB"
    hostname: str = "gpu-node-0"
    uuid: str = ""

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{self.hostname}/{self.gpu}')}"


def triton_families(models: Mapping[str, TritonModelState], trtllm: Mapping[str, TrtLlmState]) -> list[Family]:
    """Triton's families in Triton's order and wording (server 2.4x/2.5x), then the TensorRT-LLM
    backend's."""
    F = Family
    success = F("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes")
    failure = F("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes")
    count = F("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)")
    execc = F("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)")
    req_d = F("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds (includes cached requests)")
    que_d = F("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds (includes cached requests)")
    cin_d = F("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input duration in microseconds (does not include cached requests)")
    cinf_d = F("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute inference duration in microseconds (does not include cached requests)")
    cout_d = F("nv_inference_compute_output_duration_us", "counter", "Cumulative inference compute output duration in microseconds (does not include cached requests)")
    pending = F("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution per-model.")
    first = F("nv_inference_first_response_histogram_ms", "histogram", "Duration from request to first response in milliseconds")
    req_s = F("nv_inference_request_summary_us", "summary", "Summary of inference request duration in microseconds (includes cached requests)")
    que_s = F("nv_inference_queue_summary_us", "summary", "Summary of inference queuing duration in microseconds (includes cached requests)")
    for name, m in models.items():
        mv = (("model", name), ("version", "1"))
        success.add(mv, m.success)
        for reason in ("OTHER", "BACKEND", "CANCELED", "REJECTED"):
            failure.add((("model", name), ("reason", reason), ("version", "1")), m.failure if reason == "OTHER" else 0.0)
        count.add(mv, m.inference_count or m.success)
        execc.add(mv, m.exec_count or m.success)
        req_d.add(mv, m.request_duration_us)
        que_d.add(mv, m.queue_duration_us)
        cin_d.add(mv, m.compute_input_duration_us)
        cinf_d.add(mv, m.compute_infer_duration_us)
        cout_d.add(mv, m.compute_output_duration_us)
        pending.add(mv, m.pending)
        if m.first_response_ms is not None:
            h = m.first_response_ms
            for b, c in zip(h.bounds, h.counts):
                first.add(mv + (("le", format_le(b)),), c, "_bucket")
            first.add(mv + (("le", "+Inf"),), h.count, "_bucket")
            first.add(mv, h.sum, "_sum")
            first.add(mv, h.count, "_count")
        if m.summaries:
            req_s.add(mv, m.success, "_count")
            req_s.add(mv, m.request_duration_us, "_sum")
            for q in TRITON_SUMMARY_QUANTILES:
                req_s.add(mv + (("quantile", q),), m.summary_us.get(q, math.nan))
            que_s.add(mv, m.success, "_count")
            que_s.add(mv, m.queue_duration_us, "_sum")
            for q in TRITON_SUMMARY_QUANTILES:
                que_s.add(mv + (("quantile", q),), math.nan)
    fams = [success, failure, count, execc, req_d, que_d, cin_d, cinf_d, cout_d, pending, first, req_s, que_s]

    reqm = F("nv_trt_llm_request_metrics", "gauge", "TRT LLM request metrics")
    kv = F("nv_trt_llm_kv_cache_block_metrics", "gauge", "TRT LLM KV cache block metrics")
    ib = F("nv_trt_llm_inflight_batcher_metrics", "gauge", "TRT LLM inflight_batcher-specific metrics")
    gen = F("nv_trt_llm_general_metrics", "gauge", "General TRT LLM metrics")
    in_len = F("nv_llm_input_token_len", "histogram", "TRT LLM response input token length")
    out_len = F("nv_llm_output_token_len", "histogram", "TRT LLM response output token length")
    for name, t in trtllm.items():
        for rtype, v in (("context", t.context), ("scheduled", t.scheduled), ("max", t.max_requests),
                         ("active", t.active), ("waiting", t.waiting)):
            reqm.add((("model", name), ("request_type", rtype), ("version", "1")), v)
        kvv = [("tokens_per", t.kv_tokens_per_block), ("used", t.kv_used_blocks),
               ("free", max(t.kv_max_blocks - t.kv_used_blocks, 0.0)), ("max", t.kv_max_blocks)]
        if t.emit_kv_fraction:
            kvv.append(("fraction", t.kv_used_blocks / t.kv_max_blocks if t.kv_max_blocks else math.nan))
        for ktype, v in kvv:
            kv.add((("kv_cache_block_type", ktype), ("model", name), ("version", "1")), v)
        for metric, v in (("micro_batch_id", 0.0), ("generation_requests", t.scheduled), ("total_context_tokens", 0.0)):
            ib.add((("inflight_batcher_specific_metric", metric), ("model", name), ("version", "1")), v)
        gen.add((("general_type", "iteration_counter"), ("model", name), ("version", "1")), 0.0)
        gen.add((("general_type", "timestamp"), ("model", name), ("version", "1")), float(int(time.time())))
        for fam, h, rtype in ((in_len, t.input_tokens, "total_input_tokens"), (out_len, t.output_tokens, "total_output_tokens")):
            base = (("model", name), ("response_metric_type", rtype), ("version", "1"))
            fam.add(base, h.count, "_count")
            fam.add(base, h.sum, "_sum")
            for b, c in zip(h.bounds, h.counts):
                fam.add(base + (("le", format_le(b)),), c, "_bucket")
            fam.add(base + (("le", "+Inf"),), h.count, "_bucket")
    return fams + [reqm, kv, ib, gen, in_len, out_len]


def dcgm_families(gpus: Sequence[GpuState], driver_version: str = "535.104.05") -> list[Family]:
    """``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` as dcgm-exporter 3.x
    with Kubernetes pod mapping writes them (help text from its default counters CSV)."""
    util = Family("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).")
    energy = Family("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).")
    for g in gpus:
        labels = (("gpu", str(g.gpu)), ("UUID", g.uuid), ("pci_bus_id", f"00000000:{g.gpu:02X}:00.0"),
                  ("device", f"nvidia{g.gpu}"), ("modelName", g.model_name), ("Hostname", g.hostname),
                  ("DCGM_FI_DRIVER_VERSION", driver_version), ("container", g.container),
                  ("namespace", g.namespace), ("pod", g.pod))
        util.add(labels, g.util_pct)
        energy.add(labels, g.energy_mj)
    return [util, energy]


# --------------------------------------------------------------------------------------------
# load model


@dataclass
class LoadModel:
    """A fluid queueing model of one Triton model's replicas on one pool, advanced by time.

    ``arrival_per_s`` is set by the caller (a load step); every ``advance(t)`` serves up to
    ``replicas * service_per_s`` requests per second, accumulates a backlog when arrivals exceed
    that, and updates the Triton / TensorRT-LLM / DCGM states the exporters render. The waiting
    queue and the p99 latency grow with load (M/M/1 per replica below saturation, plus the fluid
    backlog above it), which is all a scaling test needs from a load model.
    """

    triton: TritonModelState
    trtllm: TrtLlmState | None = None
    gpus: Sequence[GpuState] = ()
    replicas: int = 1
    service_per_s: float = 10.0
    """Requests per second one replica completes."""
    arrival_per_s: float = 0.0
    mean_input_tokens: float = 1000.0
    mean_output_tokens: float = 250.0
    idle_power_w: float = 70.0
    busy_power_w: float = 400.0
    backlog: float = 0.0
    last_t: float | None = None

    def advance(self, t: float) -> None:
        if self.last_t is None:
            self.last_t = t
        dt = max(t - self.last_t, 0.0)
        self.last_t = t
        cap_per_s = max(self.replicas, 0) * self.service_per_s
        arrived = self.arrival_per_s * dt
        served = min(self.backlog + arrived, cap_per_s * dt)
        self.backlog = max(self.backlog + arrived - served, 0.0)
        rho = min(self.arrival_per_s / cap_per_s, 1.0) if cap_per_s > 0 else 1.0
        per_replica_lq = rho * rho / (1.0 - rho) if rho < 0.99 else 98.0
        waiting = self.backlog + per_replica_lq * max(self.replicas, 1)
        service_s = 1.0 / self.service_per_s
        headroom_per_s = max(self.service_per_s - self.arrival_per_s / max(self.replicas, 1), self.service_per_s * 0.01)
        p99_s = (self.backlog / cap_per_s if cap_per_s > 0 else 60.0) + math.log(100.0) / headroom_per_s
        p50_s = (self.backlog / cap_per_s if cap_per_s > 0 else 60.0) + math.log(2.0) / headroom_per_s
        m = self.triton
        m.pending = round(waiting)
        m.success += served
        m.exec_count += served
        m.inference_count += served
        m.request_duration_us += served * (p50_s * 1.2) * 1e6
        m.queue_duration_us += served * max(p50_s * 1.2 - service_s, 0.0) * 1e6
        m.compute_infer_duration_us += served * service_s * 1e6
        m.summary_us = {"0.5": p50_s * 1e6, "0.9": p99_s * 0.5e6, "0.95": p99_s * 0.65e6,
                        "0.99": p99_s * 1e6, "0.999": p99_s * 1.5e6} if served > 0 or m.success > 0 else {}
        if m.first_response_ms is not None and served > 0:
            m.first_response_ms.observe(p50_s * 1e3, served)
        if self.trtllm is not None:
            tl = self.trtllm
            tl.waiting = m.pending
            tl.scheduled = tl.active = min(rho * self.replicas * 8, tl.max_requests)
            tl.kv_used_blocks = min(rho * 0.85 + min(self.backlog / 1000.0, 0.15), 1.0) * tl.kv_max_blocks
            if served > 0:
                tl.input_tokens.observe(self.mean_input_tokens, served)
                tl.output_tokens.observe(self.mean_output_tokens, served)
        for g in self.gpus:
            g.util_pct = round(rho * 100.0, 1)
            g.energy_mj += (self.idle_power_w + (self.busy_power_w - self.idle_power_w) * rho) * dt * 1000.0


@dataclass
class Ramp:
    """Grows ``target.<attr>`` by ``per_s`` per second of the exporter's clock: a counter with a
    known rate (tests assert ``rate()`` against it)."""

    target: Any
    attr: str
    per_s: float
    last_t: float | None = None

    def advance(self, t: float) -> None:
        if self.last_t is not None and t > self.last_t:
            setattr(self.target, self.attr, getattr(self.target, self.attr) + self.per_s * (t - self.last_t))
        self.last_t = t


@dataclass
class HistogramRamp:
    """Observes ``value`` into ``hist`` ``per_s`` times per second."""

    hist: Histogram
    value: float
    per_s: float
    last_t: float | None = None

    def advance(self, t: float) -> None:
        if self.last_t is not None and t > self.last_t:
            self.hist.observe(self.value, self.per_s * (t - self.last_t))
        self.last_t = t


# --------------------------------------------------------------------------------------------
# HTTP exporters


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def do_GET(self) -> None:  # noqa: N802 (http.server API)
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404)
            return
        body = self.server.exporter.text().encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet scrapes
        pass


class _Server(LoopbackServer):
    daemon_threads = True
    exporter: "Exporter"


class Exporter:
    """A ``/metrics`` endpoint on 127.0.0.1 in a background thread. Subclasses say what it shows;
    state changes happen under ``lock`` so a scrape never sees half an update."""

    def __init__(self, port: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.lock = threading.RLock()
        self.clock = clock
        self.loads: list[LoadModel | Ramp | HistogramRamp] = []
        """Advanced to the exporter's clock on every scrape, under ``lock``."""
        self._requested_port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def families(self) -> list[Family]:
        raise NotImplementedError

    def add_load(self, load: "LoadModel | Ramp | HistogramRamp") -> None:
        with self.lock:
            self.loads.append(load)

    def text(self) -> str:
        with self.lock:
            now = self.clock()
            for load in self.loads:
                load.advance(now)
            return render(self.families())

    @property
    def port(self) -> int:
        assert self._server is not None, "exporter not started"
        return int(self._server.server_address[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    def start(self) -> "Exporter":
        srv = _Server(("127.0.0.1", self._requested_port), _Handler)
        srv.exporter = self
        self._server = srv
        self._requested_port = self.port  # a restart comes back on the same port
        self._thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"exporter-{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "Exporter":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TritonExporter(Exporter):
    """Triton's metrics port: ``nv_inference_*`` for every model, plus the TensorRT-LLM backend's
    ``nv_trt_llm_*`` / ``nv_llm_*`` for models in ``trtllm``."""

    def __init__(self, models: Mapping[str, TritonModelState] | None = None,
                 trtllm: Mapping[str, TrtLlmState] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.models: dict[str, TritonModelState] = dict(models or {})
        self.trtllm: dict[str, TrtLlmState] = dict(trtllm or {})

    def families(self) -> list[Family]:
        return triton_families(self.models, self.trtllm)

    def set_model(self, model: str, **fields: Any) -> TritonModelState:
        with self.lock:
            st = self.models.setdefault(model, TritonModelState())
            for k, v in fields.items():
                setattr(st, k, v)
            return st

    def set_trtllm(self, model: str, **fields: Any) -> TrtLlmState:
        with self.lock:
            st = self.trtllm.setdefault(model, TrtLlmState())
            for k, v in fields.items():
                setattr(st, k, v)
            return st

    def remove_model(self, model: str) -> None:
        with self.lock:
            self.models.pop(model, None)
            self.trtllm.pop(model, None)


class DcgmExporter(Exporter):
    """dcgm-exporter: per-GPU utilization and energy, labelled with the pod using the GPU."""

    def __init__(self, gpus: Sequence[GpuState] = (), **kw: Any) -> None:
        super().__init__(**kw)
        self.gpus: list[GpuState] = list(gpus)

    def families(self) -> list[Family]:
        return dcgm_families(self.gpus)

    def set_pod(self, pod: str, **fields: Any) -> None:
        with self.lock:
            for g in self.gpus:
                if g.pod == pod:
                    for k, v in fields.items():
                        setattr(g, k, v)


# --------------------------------------------------------------------------------------------
# a real local Prometheus


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (a small race remains; callers retry)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ScrapeTarget:
    """One scrape job with one target. ``labels`` become target labels on every series (how a
    Kubernetes scrape config attaches ``pool``, ``namespace`` and ``pod``); ``honor_labels`` keeps
    the exporter's own ``namespace``/``pod`` labels (the DCGM exporter's pod mapping)."""

    job: str
    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    honor_labels: bool = False


class PrometheusUnavailable(RuntimeError):
    """The ``prometheus`` binary is missing or did not become ready in time."""


class LocalPrometheus:
    """A real ``prometheus`` process on 127.0.0.1 with its own config and data directory.

    Never the system service: tests, the demo and the benchmark each run their own process on a
    free port, poll ``/-/ready`` and then the first scraped data with deadlines, and terminate it
    (``stop``) at the end. ``start`` after ``stop`` comes back on the same port, which is how the
    "Prometheus restarts" tests work. Prometheus batches service-discovery updates every 5 s, so the
    first data arrives about 5-6 s after start whatever the scrape interval.
    """

    def __init__(self, targets: Sequence[ScrapeTarget], *, scrape_interval_s: float = 1.0,
                 port: int | None = None, data_dir: Path | None = None, binary: str | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        found = binary or shutil.which("prometheus")
        if not found:
            raise PrometheusUnavailable("the prometheus binary is not on PATH (Debian: apt-get install -y prometheus)")
        self.binary = found
        self.targets = list(targets)
        self.scrape_interval_s = scrape_interval_s
        self.port = port or free_port()
        self._own_dir = data_dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="tidegate-prom-")) if data_dir is None else data_dir
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        jobs = []
        for t in self.targets:
            job: dict[str, Any] = {
                "job_name": t.job, "scrape_interval": interval, "scrape_timeout": interval,
                "static_configs": [{"targets": [t.address], "labels": dict(t.labels)}],
            }
            if t.honor_labels:
                job["honor_labels"] = True
            jobs.append(job)
        return {"global": {"scrape_interval": interval, "evaluation_interval": interval}, "scrape_configs": jobs}

    def start(self, ready_timeout_s: float = 20.0) -> "LocalPrometheus":
        cfg = self.dir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={cfg}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
             *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.wait_ready(ready_timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise PrometheusUnavailable(f"prometheus exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise PrometheusUnavailable(f"prometheus not ready after {timeout_s}s: {self.log_tail()}")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result list (test and bench helper; the daemon uses
        ``providers.prometheus``)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
        return list(body["data"]["result"])

    def wait_for(self, promql: str, predicate: Callable[[list[dict[str, Any]]], bool] = bool,
                 timeout_s: float = 20.0) -> list[dict[str, Any]]:
        """Poll ``promql`` until ``predicate(result)`` holds, with a deadline."""
        deadline = time.monotonic() + timeout_s
        last: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                last = self.query(promql)
                if predicate(last):
                    return last
            except (urllib.error.URLError, OSError, KeyError, ValueError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{promql!r} did not satisfy the condition within {timeout_s}s; last result {last}")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after ``timeout_s``)."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __enter__(self) -> "LocalPrometheus":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def libpython_dir() -> str:
    """The running Python's lib directory: pytriton's bundled tritonserver links libpython from
    there, so it must be on ``LD_LIBRARY_PATH`` when the server starts."""
    import sysconfig

    return str(sysconfig.get_config_var("LIBDIR") or "")


def ld_library_path_with_libpython(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    parts = [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    lib = libpython_dir()
    if lib and lib not in parts:
        parts.insert(0, lib)
    return os.pathsep.join(parts)
