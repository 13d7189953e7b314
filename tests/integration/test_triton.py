"""The Triton adapter against a real Triton server (the one bundled in nvidia-pytriton, on CPU):
readiness, the statistics fallback under load, and Prometheus scraping Triton's real /metrics
being killed and coming back while the combined source keeps the queue signal alive."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np
import pytest

from controller.core.model import ModelSignals, ModelSpec, ReplicaCapacity
from tests.integration.exporters import LocalPrometheus, ScrapeTarget, free_port, ld_library_path_with_libpython
from providers.prometheus import PrometheusMetricsSource, PromQueries, reason_code
from providers.triton import CombinedMetricsSource, TritonFallback, TritonReplica
from tests.integration.conftest import prometheus_binary_or_skip
from tests.integration.loopback import LoopbackServer

MODEL = "tiny-llm"
SERVICE_S = 0.02
"""Each request holds the single model instance this long: capacity 50 requests/s, so a handful
of concurrent clients builds a queue in Triton's scheduler."""
CLIENTS = 8


def now() -> datetime:
    return datetime.now(timezone.utc)


def spec(name: str = MODEL) -> ModelSpec:
    return ModelSpec(name=name, tp_degree=1, quantization="none", gpu_types=("cpu",), cold_start_s=5,
                     capacity={"cpu": ReplicaCapacity(100, 1 / SERVICE_S)}, pools=("cpu",))


@dataclass
class TritonServer:
    http: str
    metrics: str


def _infer(requests: list[Any]) -> list[dict[str, np.ndarray]]:
    time.sleep(SERVICE_S * len(requests))
    return [{"y": r["x"] * 2} for r in requests]


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver (pytriton's bundled build) serving ``tiny-llm`` on free ports, with
    summary latencies on and the statistics endpoint unrestricted."""
    try:
        from pytriton.model_config import ModelConfig, Tensor
        from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
    except ImportError as e:
        pytest.skip(f"nvidia-pytriton is not installed (pip install nvidia-pytriton): {e}")
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    config = TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                          metrics_config=["summary_latencies=true"], exit_on_error=True, log_verbose=0,
                          exit_timeout_secs=2)
    with pytest.MonkeyPatch.context() as mp:
        # pytriton's tritonserver loads libpython of the running interpreter; without this it
        # picks another build and the Python backend stub fails to start
        mp.setenv("LD_LIBRARY_PATH", ld_library_path_with_libpython())
        # an explicit workspace: pytriton's default one is a TemporaryDirectory left to the
        # garbage collector (a ResourceWarning, an error under filterwarnings=error)
        triton = Triton(config=config, workspace=str(tmp_path_factory.mktemp("pytriton") / "ws"),
                        security_config=TritonSecurityConfig(restricted_endpoints=[]))
        try:
            triton.__enter__()
            triton.bind(model_name=MODEL, infer_func=_infer,
                        inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
                        outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))],
                        config=ModelConfig(batching=False))
        except Exception as e:  # noqa: BLE001 - any start-up failure means "cannot run here"
            triton.stop()
            first = (str(e).strip().splitlines() or [""])[0][:300]
            pytest.skip(f"pytriton's tritonserver cannot run on this machine: {type(e).__name__}: {first}")
    try:
        yield TritonServer(http=f"127.0.0.1:{http_port}", metrics=f"127.0.0.1:{metrics_port}")
    finally:
        triton.stop()


class Load:
    """``CLIENTS`` threads sending requests back to back until stopped."""

    def __init__(self, url: str) -> None:
        import tritonclient.http as th

        self.stop_event = threading.Event()
        self.done = 0
        self.errors: list[str] = []

        def run() -> None:
            client = th.InferenceServerClient(url, network_timeout=30)
            inp = th.InferInput("x", [1], "FP32")
            inp.set_data_from_numpy(np.ones((1,), np.float32))
            try:
                while not self.stop_event.is_set():
                    client.infer(MODEL, [inp])
                    self.done += 1
            except Exception as e:  # noqa: BLE001 - reported by the test
                self.errors.append(f"{type(e).__name__}: {e}")
            finally:
                client.close()

        self.threads = [threading.Thread(target=run, daemon=True) for _ in range(CLIENTS)]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=10)
        assert not self.errors, self.errors


def wait_until(read: Callable[[], Any], ok: Callable[[Any], bool], timeout_s: float = 20.0, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    value = read()
    while not ok(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s; last: {value}")
        time.sleep(every_s)
        value = read()
    return value


class NotReadyTriton:
    """A real HTTP server speaking KServe v2 health: live, but not ready (a server still loading)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200 if self.path == "/v2/health/live" else 400)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_replica_counts_ready_only_when_live_ready_and_model_ready(triton_server: TritonServer) -> None:
    not_ready = NotReadyTriton()
    dead = f"127.0.0.1:{free_port()}"
    replicas = {MODEL: [
        TritonReplica(triton_server.http, "cpu"),
        TritonReplica(triton_server.http, "cpu", triton_model="not-loaded"),
        TritonReplica(not_ready.url, "cpu"),
        TritonReplica(dead, "spot"),
    ]}
    fb = TritonFallback(replicas, timeout_s=1.0)
    try:
        health = [fb.health(r, MODEL) for r in replicas[MODEL]]
        assert health[0].serving and health[0].reason is None
        assert (health[1].live, health[1].ready, health[1].model_ready) == (True, True, False)
        assert health[1].reason is not None and health[1].reason.startswith("ModelNotReady")
        assert (health[2].live, health[2].ready, health[2].serving) == (True, False, False)
        assert health[2].reason is not None and health[2].reason.startswith("NotReady")
        assert not health[3].live and health[3].reason is not None and health[3].reason.startswith("TritonUnreachable")
        assert fb.ready_replicas(MODEL) == {"cpu": 1, "spot": 0}
    finally:
        fb.close()
        not_ready.close()


def test_statistics_fallback_sees_queue_and_latency_rise_under_load(triton_server: TritonServer) -> None:
    fb = TritonFallback({MODEL: [TritonReplica(triton_server.http, "cpu")]})
    try:
        first = fb.observe([spec()], now())[MODEL]
        assert first.queue_depth.value is None and reason_code(first.queue_depth) == "NoBaseline"
        time.sleep(0.3)  # an interval to take deltas over (no requests in it)
        idle = fb.observe([spec()], now())[MODEL]
        assert idle.queue_depth.value == 0.0 and idle.request_rate_per_s.value == 0.0
        assert reason_code(idle.p99_latency_ms) == "NoRequests"

        load = Load(triton_server.http)
        try:
            time.sleep(0.5)  # let the queue form, then measure one interval under load
            fb.observe([spec()], now())
            busy: ModelSignals = wait_until(lambda: fb.observe([spec()], now())[MODEL],
                                            lambda s: (s.queue_depth.value or 0) > 2, timeout_s=15, every_s=1.0)
        finally:
            load.stop()
    finally:
        fb.close()
    assert busy.queue_depth.value is not None and busy.queue_depth.value > 2  # of 8 clients, most wait
    assert reason_code(busy.queue_depth) == "TritonStatistics"
    lat = busy.p99_latency_ms
    assert lat.value is not None and lat.value > 3 * SERVICE_S * 1000  # queueing, not just service
    assert reason_code(lat) == "AverageNotP99"
    assert busy.request_rate_per_s.value is not None
    assert 0.3 / SERVICE_S < busy.request_rate_per_s.value < 1.2 / SERVICE_S


def test_a_statistics_read_too_soon_after_the_baseline_keeps_it(triton_server: TritonServer) -> None:
    """Rates over a few milliseconds are the reads' own latency, not load (CI once saw 1,344
    req/s from a server that serves 50): such a read reports no baseline and keeps the old one,
    and the next read takes its deltas over the whole interval."""
    fb = TritonFallback({MODEL: [TritonReplica(triton_server.http, "cpu")]})
    try:
        t0 = now()
        fb.observe([spec()], t0)
        soon = fb.observe([spec()], t0 + timedelta(milliseconds=10))[MODEL]
        assert soon.request_rate_per_s.value is None and reason_code(soon.request_rate_per_s) == "NoBaseline"
        assert "stays the baseline" in (soon.request_rate_per_s.reason or "")
        later = fb.observe([spec()], t0 + timedelta(seconds=1))[MODEL]
        assert later.request_rate_per_s.value is not None and later.request_rate_per_s.value < 1.2 / SERVICE_S
    finally:
        fb.close()


def test_prometheus_on_real_triton_killed_falls_back_to_triton_and_recovers(triton_server: TritonServer) -> None:
    prom = LocalPrometheus([ScrapeTarget("triton", triton_server.metrics,
                                         {"pool": "cpu", "namespace": "serving", "pod": "pytriton-0"})],
                           binary=prometheus_binary_or_skip())
    primary = PrometheusMetricsSource(prom.url, PromQueries(rate_window="5s"), timeout_s=1.0)
    fallback = TritonFallback({MODEL: [TritonReplica(triton_server.http, "cpu")]})
    src = CombinedMetricsSource(primary, fallback)
    load: Load | None = None
    try:
        prom.start()
        prom.wait_for('up{job="triton"} == 1', timeout_s=20)
        idle = wait_until(lambda: src.observe([spec()], now())[MODEL], lambda s: s.queue_depth.value is not None)
        assert idle.queue_depth.value == 0.0 and src.degraded == {}

        load = Load(triton_server.http)
        # Prometheus sees Triton's real pending count and summary p99 rise
        busy = wait_until(lambda: src.observe([spec()], now())[MODEL],
                          lambda s: (s.queue_depth.value or 0) >= 2 and (s.p99_latency_ms.value or 0) > 3 * SERVICE_S * 1000)
        assert busy.queue_depth.reason is None and busy.p99_latency_ms.reason is None  # a real p99
        assert src.degraded == {}

        prom.stop()
        blind = wait_until(lambda: src.observe([spec()], now())[MODEL],
                           lambda s: (s.queue_depth.value or 0) > 1, timeout_s=10, every_s=1.0)
        assert reason_code(blind.queue_depth) == "TritonStatistics"
        assert "ConnectionRefused" in (blind.queue_depth.reason or "")
        assert reason_code(blind.p99_latency_ms) == "AverageNotP99"
        assert MODEL in src.degraded and src.degraded[MODEL].startswith("PrometheusUnavailable")
        assert blind.gpu_utilization_pct.value is None  # nothing to fill it from: still missing

        prom.start()
        back = wait_until(lambda: src.observe([spec()], now())[MODEL],
                          lambda s: s.queue_depth.reason is None and s.queue_depth.value is not None)
        assert src.degraded == {}
        assert back.queue_depth.value is not None and back.queue_depth.value >= 0
    finally:
        if load is not None:
            load.stop()
        fallback.close()
        primary.close()
        prom.close()


def test_combined_with_both_sources_down_is_degraded_and_missing_never_zero() -> None:
    """No Triton installed needed: nothing listens on either port."""
    primary = PrometheusMetricsSource(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    fallback = TritonFallback({MODEL: [TritonReplica(f"127.0.0.1:{free_port()}", "cpu")]}, timeout_s=0.5)
    src = CombinedMetricsSource(primary, fallback)
    try:
        for _ in range(2):  # the second tick has a baseline attempt behind it, still nothing
            s = src.observe([spec()], now())[MODEL]
            assert s.queue_depth.value is None and s.p99_latency_ms.value is None
            assert reason_code(s.queue_depth) == "ConnectionRefused"
        assert src.degraded[MODEL].startswith("PrometheusUnavailable")
        assert src.degraded[MODEL].endswith("Triton fallback had no data either")
        assert fallback.ready_replicas(MODEL) == {"cpu": 0}
    finally:
        fallback.close()
        primary.close()
