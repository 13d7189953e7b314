"""PrometheusMetricsSource against a real Prometheus (scraping exporters that speak Triton's,
the TensorRT-LLM backend's and DCGM's exact metric text) and against a real local HTTP server
that answers every malformed way the source must survive."""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from controller.core.model import ModelSignals, ModelSpec, Tier, PoolSpec, ReplicaCapacity
from controller.core.pricing import OnPremCost, onprem_node_price
from tests.integration.exporters import (
    Histogram,
    HistogramRamp,
    LocalPrometheus,
    Ramp,
    ScrapeTarget,
    TRITON_FIRST_RESPONSE_BUCKETS_MS,
    TRT_LLM_TOKEN_BUCKETS,
    free_port,
)
from providers.prometheus import SIGNALS, Observation, PrometheusMetricsSource, PrometheusSettings, PromQueries, reason_code
from tests.integration.conftest import LAB_GPU_POWER_W, LAB_GPU_UTIL_PCT, MetricsLab, prometheus_binary_or_skip
from tests.integration.loopback import LoopbackServer

FAST = PromQueries(rate_window="5s")
"""Rate windows of 5 scrapes: the lab scrapes every second."""


def spec(name: str, pools: tuple[str, ...] = ("onprem", "aws-spot")) -> ModelSpec:
    return ModelSpec(name=name, tp_degree=1, quantization="fp8", gpu_types=("A100",), cold_start_s=60,
                     capacity={"A100": ReplicaCapacity(1000, 2)}, pools=pools)


def now() -> datetime:
    return datetime.now(timezone.utc)


def poll(read: Callable[[], Observation], ok: Callable[[Observation], bool], timeout_s: float = 15.0) -> Observation:
    """Observe until ``ok`` holds (Prometheus needs a scrape or a few to see a change)."""
    deadline = time.monotonic() + timeout_s
    obs = read()
    while not ok(obs):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s; last observation: {obs.models}")
        time.sleep(0.2)
        obs = read()
    return obs


# --------------------------------------------------------------------------------------------
# against a real Prometheus


def test_every_signal_per_model_and_pool_from_real_exporter_text(metrics_lab: MetricsLab) -> None:
    onprem, spot = metrics_lab.triton["onprem"], metrics_lab.triton["aws-spot"]
    m = "llama-signals"
    # onprem: TensorRT-LLM model; its in-flight batcher queue wins over Triton's pending count
    first = Histogram(TRITON_FIRST_RESPONSE_BUCKETS_MS)  # decoupled: time to first token
    a = onprem.set_model(m, pending=99, summary_us={"0.99": 250_000.0}, first_response_ms=first)
    onprem.set_trtllm(m, waiting=7, kv_used_blocks=1871.7, kv_max_blocks=6239)
    ta = onprem.trtllm[m]
    onprem.add_load(Ramp(a, "success", 10.0))
    onprem.add_load(HistogramRamp(first, 300.0, 10.0))  # all in the (100, 500] ms bucket
    onprem.add_load(HistogramRamp(ta.output_tokens, 200.0, 10.0))
    onprem.add_load(HistogramRamp(ta.input_tokens, 800.0, 10.0))
    # spot: an older backend without the KV "fraction" series
    b = spot.set_model(m, pending=99, summary_us={"0.99": 400_000.0})
    spot.set_trtllm(m, waiting=5, kv_used_blocks=3000, kv_max_blocks=6000, emit_kv_fraction=False)
    tb = spot.trtllm[m]
    spot.add_load(Ramp(b, "success", 6.0))
    spot.add_load(HistogramRamp(tb.output_tokens, 100.0, 6.0))

    def rates_settled(o: Observation) -> bool:
        # a rate() needs a full window of scrapes behind it before it reads the true slope
        s = o.models[m]
        want = {"request_rate_per_s": 16.0, "output_tokens_per_s": 10 * 200 + 6 * 100, "input_tokens_per_s": 10 * 800}
        return all(getattr(s, n).value is not None for n in SIGNALS) and all(
            abs((getattr(s, n).value or 0) - v) <= 0.05 * v for n, v in want.items())

    with PrometheusMetricsSource(metrics_lab.prometheus.url, FAST) as src:
        obs = poll(lambda: src.observe_detailed([spec(m)], now()), rates_settled)

    s = obs.models[m]
    assert s.queue_depth.value == 12.0  # 7 + 5 TensorRT-LLM waiting; Triton's 99 pending ignored
    assert s.p99_latency_ms.value == pytest.approx(400.0)  # worst pool; summaries are in us
    assert s.p99_latency_ms.reason is None
    # TTFT from the first-response histogram (only onprem emits one): histogram_quantile's interpolation
    assert s.p99_ttft_ms.value == pytest.approx(100 + 0.99 * 400, rel=0.01)
    util = [sum(LAB_GPU_UTIL_PCT["onprem"]) / 2, LAB_GPU_UTIL_PCT["aws-spot"][0]]
    assert s.gpu_utilization_pct.value == pytest.approx(sum(util) / 2)  # mean of the pools' means
    assert s.request_rate_per_s.value == pytest.approx(16.0, rel=0.05)
    assert s.arrival_rate_per_s.value == pytest.approx(16.0, rel=0.05)  # the queues hold steady
    assert s.output_tokens_per_s.value == pytest.approx(10 * 200 + 6 * 100, rel=0.05)
    # input tokens only on onprem: the spot histogram never observed anything (sum stays 0)
    assert s.input_tokens_per_s.value == pytest.approx(10 * 800, rel=0.05)
    assert s.kv_cache_utilization_pct.value == pytest.approx(50.0)  # spot's used/max beats onprem 30 %
    assert obs.pools[(m, "onprem")]["kv_cache_utilization_pct"].value == pytest.approx(30.0, abs=0.01)
    assert obs.pools[(m, "onprem")]["queue_depth"].value == 7.0
    # GPU power from the DCGM energy counter joined to each pool's pod
    assert obs.pools[(m, "onprem")]["gpu_power_kw"].value == pytest.approx(2 * LAB_GPU_POWER_W["onprem"] / 1000, rel=0.05)
    assert obs.pools[(m, "aws-spot")]["gpu_power_kw"].value == pytest.approx(LAB_GPU_POWER_W["aws-spot"] / 1000, rel=0.05)
    # the cost of the on-prem pool includes the energy DCGM reports for its pod's GPUs
    site = OnPremCost(capital_usd_per_gpu_hour=1.0, energy_usd_per_kwh=0.5)
    onprem_pool = PoolSpec("onprem", Tier.ONPREM, "onprem", "A100", gpus_per_node=8, max_nodes=2, price_per_node_hour_usd=9.0)
    power = obs.by_pool(m, "gpu_power_kw")
    price, note = onprem_node_price(onprem_pool, site, nodes=1, power_kw=power["onprem"].value)
    assert note is None and price == pytest.approx(8 * 1.0 + 2 * LAB_GPU_POWER_W["onprem"] / 1000 * 0.5, rel=0.01)
    # samples are dated by the data, which is at most a couple of scrapes old
    assert s.queue_depth.at is not None and (now() - s.queue_depth.at).total_seconds() < 5
    assert isinstance(s, ModelSignals) and s.at <= now()


class CountingSession(requests.Session):
    """The requests session the source's PrometheusConnect sends through, recording each query."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> requests.Response:
        self.queries.append((kwargs.get("params") or {}).get("query", ""))
        return super().request(method, url, *args, **kwargs)



def test_arrivals_are_the_successes_plus_the_growth_of_the_requests_in_the_system(metrics_lab: MetricsLab) -> None:
    """Triton counts a request when it succeeds: while requests pile up (waiting, or active in the
    in-flight batcher) the arrival rate reads the successes plus that growth per second, and the
    request rate the successes alone."""
    lab = metrics_lab.triton["onprem"]
    m = "llama-arrivals"
    a = lab.set_model(m)
    t = lab.set_trtllm(m, waiting=0.0, active=0.0)
    lab.add_load(Ramp(a, "success", 4.0))
    lab.add_load(Ramp(t, "waiting", 2.0))
    lab.add_load(Ramp(t, "active", 1.0))

    def settled(o: Observation) -> bool:
        s = o.models[m]
        done, arrived = s.request_rate_per_s.value, s.arrival_rate_per_s.value
        return done is not None and arrived is not None and abs(done - 4.0) <= 0.2 and abs(arrived - 7.0) <= 0.35

    with PrometheusMetricsSource(metrics_lab.prometheus.url, FAST) as src:
        obs = poll(lambda: src.observe_detailed([spec(m, ("onprem",))], now()), settled)
    s = obs.models[m]
    assert s.request_rate_per_s.value == pytest.approx(4.0, rel=0.05)
    assert s.arrival_rate_per_s.value == pytest.approx(7.0, rel=0.05)


def test_arrivals_never_read_below_zero(metrics_lab: MetricsLab) -> None:
    """Requests leaving the count faster than they succeed (a pod that goes away takes its
    requests out of the sum) would make the sum negative: the arrival rate reads 0, not less."""
    lab = metrics_lab.triton["onprem"]
    m = "llama-leaving"
    a = lab.set_model(m)
    t = lab.set_trtllm(m, waiting=100_000.0)
    lab.add_load(Ramp(a, "success", 1.0))
    lab.add_load(Ramp(t, "waiting", -5.0))

    def settled(o: Observation) -> bool:
        s = o.models[m]
        return s.request_rate_per_s.value is not None and abs(s.request_rate_per_s.value - 1.0) <= 0.1 \
            and s.arrival_rate_per_s.value is not None

    with PrometheusMetricsSource(metrics_lab.prometheus.url, FAST) as src:
        obs = poll(lambda: src.observe_detailed([spec(m, ("onprem",))], now()), settled)
    assert obs.models[m].arrival_rate_per_s.value == 0.0

def test_one_query_per_signal_kind_whatever_the_number_of_models(metrics_lab: MetricsLab) -> None:
    names = [f"count-{i}" for i in range(6)]
    for n in names:
        metrics_lab.triton["onprem"].set_model(n, pending=float(len(n)))
    session = CountingSession()
    with PrometheusMetricsSource(metrics_lab.prometheus.url, FAST, session=session) as src:
        one = src.observe_detailed([spec(names[0])], now())
        n_one = len(session.queries)
        poll(lambda: src.observe_detailed([spec(n) for n in names], now()),
             lambda o: all(o.models[n].queue_depth.value is not None for n in names))
        session.queries.clear()
        many = src.observe_detailed([spec(n) for n in names], now())
    assert n_one == one.queries == 1 + len(SIGNALS) + 1  # freshness + signals + gpu power
    assert len(session.queries) == many.queries == n_one
    assert len(set(session.queries)) == len(session.queries)
    assert all("count-" not in q for q in session.queries)  # nothing is per model


def test_counters_only_give_a_mean_marked_average_not_p99(metrics_lab: MetricsLab) -> None:
    m = "counters-only"
    st = metrics_lab.triton["onprem"].set_model(m, summaries=False)
    metrics_lab.triton["onprem"].add_load(Ramp(st, "success", 20.0))
    metrics_lab.triton["onprem"].add_load(Ramp(st, "request_duration_us", 20.0 * 35_000))  # 35 ms each
    with PrometheusMetricsSource(metrics_lab.prometheus.url, FAST) as src:
        obs = poll(lambda: src.observe_detailed([spec(m, ("onprem",))], now()),
                   lambda o: o.models[m].p99_latency_ms.value is not None)
    lat = obs.models[m].p99_latency_ms
    assert lat.value == pytest.approx(35.0, rel=0.02)
    assert reason_code(lat) == "AverageNotP99"


def test_first_response_histogram_gives_a_p99(metrics_lab: MetricsLab) -> None:
    m = "decoupled-histogram"
    h = Histogram(TRITON_FIRST_RESPONSE_BUCKETS_MS)
    st = metrics_lab.triton["onprem"].set_model(m, summaries=False, first_response_ms=h)
    metrics_lab.triton["onprem"].add_load(Ramp(st, "success", 10.0))
    metrics_lab.triton["onprem"].add_load(HistogramRamp(h, 300.0, 10.0))  # all in the (100, 500] bucket
    with PrometheusMetricsSource(metrics_lab.prometheus.url, FAST) as src:
        obs = poll(lambda: src.observe_detailed([spec(m, ("onprem",))], now()),
                   lambda o: o.models[m].p99_latency_ms.value is not None)
    lat = obs.models[m].p99_latency_ms
    assert lat.value == pytest.approx(100 + 0.99 * 400, rel=0.01)  # histogram_quantile's interpolation
    assert reason_code(lat) == "P99OfFirstResponse"


def test_idle_model_zero_queue_is_a_value_and_latency_is_no_requests(metrics_lab: MetricsLab) -> None:
    m = "idle-model"
    metrics_lab.triton["onprem"].set_model(m, pending=0, success=1234)  # Triton shows NaN quantiles
    with PrometheusMetricsSource(metrics_lab.prometheus.url, FAST) as src:
        obs = poll(lambda: src.observe_detailed([spec(m, ("onprem",))], now()),
                   lambda o: o.models[m].request_rate_per_s.value is not None)
    s = obs.models[m]
    assert s.queue_depth.value == 0.0 and s.queue_depth.reason is None  # a real zero
    assert s.request_rate_per_s.value == 0.0
    assert s.p99_latency_ms.value is None and reason_code(s.p99_latency_ms) == "NoRequests"
    assert s.kv_cache_utilization_pct.value is None and reason_code(s.kv_cache_utilization_pct) == "NoData"


def test_unknown_model_is_missing_never_zero(metrics_lab: MetricsLab) -> None:
    with PrometheusMetricsSource(metrics_lab.prometheus.url, FAST) as src:
        s = src.observe([spec("no-such-model")], now())["no-such-model"]
    for n in SIGNALS:
        smp = getattr(s, n)
        assert smp.value is None and reason_code(smp) == "NoData", n


def test_real_prometheus_errors_and_several_series_become_reasons(metrics_lab: MetricsLab) -> None:
    m = "errors-model"
    metrics_lab.triton["onprem"].set_model(m, pending=3)
    off = {n: None for n in SIGNALS if n != "queue_depth"} | {"gpu_power_kw": None, "freshness": None}
    url = metrics_lab.prometheus.url
    cases = {
        "sum by (model, pool) (": "HTTP 400",  # a parse error: Prometheus answers 400 bad_data
        # one Triton series per failure reason: four series for one (model, pool)
        "nv_inference_request_failure": "SeveralSeries",
        # many-to-many match: Prometheus answers 422 execution error
        "nv_inference_request_failure + on (model) group_left nv_inference_request_failure": "HTTP 422",
    }
    for query, code in cases.items():
        with PrometheusMetricsSource(url, PromQueries(queue_depth=query, **off)) as src:
            obs = poll(lambda: src.observe_detailed([spec(m, ("onprem",))], now()),
                       lambda o: reason_code(o.models[m].queue_depth) != "NoData")
            q = obs.models[m].queue_depth
            assert q.value is None and reason_code(q) == code, (query, q)


def test_exporter_gone_turns_missing_and_recovers(metrics_lab: MetricsLab) -> None:
    victim = metrics_lab.victim
    m = "victim-model"
    victim.set_model(m, pending=5)
    with PrometheusMetricsSource(metrics_lab.prometheus.url, FAST) as src:
        read = lambda: src.observe_detailed([spec(m, ("victim",))], now())  # noqa: E731
        poll(read, lambda o: o.models[m].queue_depth.value == 5.0)
        victim.stop()
        try:
            # the failed scrape writes staleness markers: the series disappear, they do not read 0
            gone = poll(read, lambda o: o.models[m].queue_depth.value is None)
            assert reason_code(gone.models[m].queue_depth) == "NoData"
        finally:
            victim.start()
        back = poll(read, lambda o: o.models[m].queue_depth.value == 5.0)
        assert back.models[m].queue_depth.reason is None


def test_prometheus_killed_mid_run_is_missing_with_reasons_then_recovers(metrics_lab: MetricsLab, caplog: pytest.LogCaptureFixture) -> None:
    """A Prometheus of this test's own (the shared one keeps serving the others), killed and
    started again on the same port and data directory."""
    m = "kill-model"
    metrics_lab.triton["onprem"].set_model(m, pending=4)
    prom = LocalPrometheus([ScrapeTarget("triton-onprem", metrics_lab.triton["onprem"].address,
                                         {"pool": "onprem", "namespace": "serving", "pod": "triton-onprem-0"})],
                           binary=prometheus_binary_or_skip())
    try:
        prom.start()
        with PrometheusMetricsSource(prom.url, FAST, timeout_s=1.0) as src:
            read = lambda: src.observe_detailed([spec(m, ("onprem",))], now())  # noqa: E731
            poll(read, lambda o: o.models[m].queue_depth.value == 4.0, timeout_s=20)

            prom.stop()
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="tidegate.providers.prometheus"):
                down = read()
            for n in SIGNALS:
                smp = getattr(down.models[m], n)
                assert smp.value is None and reason_code(smp) == "ConnectionRefused", (n, smp)
            assert down.queries == 1  # the first refusal stops the tick's other queries
            assert any(getattr(r, "event", None) == "signal_missing" and getattr(r, "code", None) == "ConnectionRefused"
                       for r in caplog.records)

            prom.start()
            back = poll(read, lambda o: o.models[m].queue_depth.value == 4.0, timeout_s=20)
            assert back.models[m].queue_depth.reason is None
    finally:
        prom.close()


# --------------------------------------------------------------------------------------------
# malformed answers from a real local HTTP server


class FakePrometheus:
    """A real HTTP server on 127.0.0.1 whose answer to ``/api/v1/query`` a test sets."""

    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: (certificate, key) files to serve https with."""
        self.answer: Callable[[str], tuple[int, bytes, float]] = lambda q: (200, b"{}", 0.0)
        self.queries: list[str] = []
        self.requests: list[tuple[str, dict[str, list[str]], dict[str, str]]] = []
        """(path, query parameters, headers) of every request, in arrival order."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                url = urlparse(self.path)
                params = parse_qs(url.query)
                fake.requests.append((url.path, params, dict(self.headers.items())))
                q = params.get("query", [""])[0]
                fake.queries.append(q)
                status, body, delay_s = fake.answer(q)
                if delay_s:
                    fake.release.wait(delay_s)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self.release = threading.Event()
        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(*tls)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_prom() -> Iterator[FakePrometheus]:
    f = FakePrometheus()
    try:
        yield f
    finally:
        f.close()


def vector(*series: tuple[dict[str, str], float, str]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": labels, "value": [ts, raw]} for labels, ts, raw in series]}}).encode()


QUEUE_ONLY = PromQueries(**{n: None for n in SIGNALS if n != "queue_depth"}, gpu_power_kw=None, freshness=None)
M = "llama"
LBL = {"model": M, "pool": "onprem"}


def _malformed_cases() -> list[Any]:
    t = time.time()
    err = lambda status, etype, msg: (status, json.dumps({"status": "error", "errorType": etype, "error": msg}).encode(), 0.0)  # noqa: E731
    return [
        pytest.param(lambda q: (200, vector(), 0.0), "NoData", id="empty-result"),
        pytest.param(lambda q: (200, vector((LBL | {"pod": "a"}, t, "1"), (LBL | {"pod": "b"}, t, "2")), 0.0), "SeveralSeries", id="several-series"),
        pytest.param(lambda q: (200, vector((LBL, t, "NaN")), 0.0), "NaN", id="nan"),
        pytest.param(lambda q: (200, vector((LBL, t, "+Inf")), 0.0), "Inf", id="plus-inf"),
        pytest.param(lambda q: (200, vector((LBL, t, "-Inf")), 0.0), "Inf", id="minus-inf"),
        pytest.param(lambda q: err(400, "bad_data", "parse error"), "HTTP 400", id="http-400"),
        pytest.param(lambda q: err(422, "execution", "many-to-many matching not allowed"), "HTTP 422", id="http-422"),
        pytest.param(lambda q: (500, b"internal error", 0.0), "HTTP 500", id="http-500-not-json"),
        pytest.param(lambda q: err(503, "timeout", "query timed out"), "HTTP 503", id="http-503"),
        pytest.param(lambda q: (200, b'{"status": "success", "data": ', 0.0), "InvalidJSON", id="invalid-json"),
        pytest.param(lambda q: (200, b"<html>proxy login</html>", 0.0), "InvalidJSON", id="html-200"),
        pytest.param(lambda q: (200, json.dumps({"status": "error", "error": "x"}).encode(), 0.0), "QueryError", id="error-status-200"),
        pytest.param(lambda q: (200, json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [t, "1"]}}).encode(), 0.0), "BadResponse", id="scalar-result"),
        pytest.param(lambda q: (200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": [{"metric": LBL}]}}).encode(), 0.0), "BadResponse", id="item-without-value"),
        pytest.param(lambda q: (200, vector((LBL, t, "many")), 0.0), "BadResponse", id="value-not-a-number"),
        pytest.param(lambda q: (200, vector((LBL, t - 600, "3")), 0.0), "Stale", id="stale-sample"),
        pytest.param(lambda q: (200, vector(), 5.0), "Timeout", id="timeout"),
    ]


@pytest.mark.parametrize("answer,code", _malformed_cases())
def test_malformed_answer_is_missing_with_reason_and_one_log_line(
        fake_prom: FakePrometheus, caplog: pytest.LogCaptureFixture, answer: Callable[[str], tuple[int, bytes, float]], code: str) -> None:
    fake_prom.answer = answer
    with PrometheusMetricsSource(fake_prom.url, QUEUE_ONLY, timeout_s=0.3, max_sample_age_s=30) as src:
        with caplog.at_level(logging.DEBUG, logger="tidegate.providers.prometheus"):
            s = src.observe([spec(M, ("onprem",))], now())[M]
        assert s.queue_depth.value is None
        assert reason_code(s.queue_depth) == code, s.queue_depth.reason
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        rec = warnings[0]
        assert getattr(rec, "event") == "signal_missing" and getattr(rec, "code") == code
        assert getattr(rec, "signal") == "queue_depth"
        # the same failure on the next tick is not logged again at WARNING
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="tidegate.providers.prometheus"):
            again = src.observe([spec(M, ("onprem",))], now())[M]
        assert reason_code(again.queue_depth) == code
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_queries_go_through_prometheus_connect_once_each_with_params_and_headers(fake_prom: FakePrometheus) -> None:
    """Every query is prometheus-api-client's custom_query on the session the source was given:
    the server sees the path, the PromQL, Prometheus's timeout parameter and the caller's bearer
    token, one request per query (the client's default retries of 5xx answers are off), and the
    reasons are the source's own."""
    answers = iter([(500, b"internal error", 0.0), (200, vector(), 5.0), (200, b"<html>login</html>", 0.0)])
    fake_prom.answer = lambda q: next(answers)
    session = CountingSession()
    with PrometheusMetricsSource(fake_prom.url, QUEUE_ONLY, timeout_s=0.3, session=session,
                                 headers={"Authorization": "Bearer prom-reader"}) as src:
        codes = []
        for _ in range(3):
            started = time.monotonic()
            codes.append(reason_code(src.observe([spec(M, ("onprem",))], now())[M].queue_depth))
            assert time.monotonic() - started < 2.0, codes  # no retry with backoff
    assert codes == ["HTTP 500", "Timeout", "InvalidJSON"]
    query = QUEUE_ONLY.render("queue_depth", "model", "pool")
    assert session.queries == [query] * 3
    assert len(fake_prom.requests) == 3
    for path, params, headers in fake_prom.requests:
        assert path == "/api/v1/query"
        assert params == {"query": [query], "timeout": ["0.3s"]}
        assert headers["Authorization"] == "Bearer prom-reader"
        assert headers["User-Agent"].startswith("python-requests/")  # the client's HTTP stack


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (cryptography comes with google-auth)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "prometheus.test")])
    start = datetime.now(timezone.utc) - timedelta(minutes=5)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(start + timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "prom.crt", directory / "prom.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_https_is_verified_against_the_ca_named_by_ssl_cert_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Prometheus behind a private CA: trusted through SSL_CERT_FILE, refused without it."""
    cert, key = _self_signed(tmp_path)
    for var in ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    fake = FakePrometheus(tls=(cert, key))
    try:
        fake.answer = lambda q: (200, vector((LBL, time.time(), "3")), 0.0)
        with PrometheusMetricsSource(fake.url, QUEUE_ONLY) as src:
            refused = src.observe([spec(M, ("onprem",))], now())[M].queue_depth
        assert refused.value is None and reason_code(refused) == "ConnectionError"
        assert "CERTIFICATE_VERIFY_FAILED" in (refused.reason or "")
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        with PrometheusMetricsSource(fake.url, QUEUE_ONLY) as src:
            assert src.observe([spec(M, ("onprem",))], now())[M].queue_depth.value == 3.0
    finally:
        fake.close()


def test_connection_refused_is_missing_with_reason() -> None:
    port = free_port()  # nothing listens there
    with PrometheusMetricsSource(f"http://127.0.0.1:{port}", FAST, timeout_s=0.5) as src:
        obs = src.observe_detailed([spec(M)], now())
    for n in SIGNALS:
        smp = getattr(obs.models[M], n)
        assert smp.value is None and reason_code(smp) == "ConnectionRefused"
    assert obs.queries == 1


def test_fresh_value_on_old_data_is_stale_by_the_freshness_query(fake_prom: FakePrometheus) -> None:
    """A restarted Prometheus serves its last pre-restart scrape with a fresh evaluation time: the
    freshness query dates the data itself."""
    t = time.time()
    fake_prom.answer = lambda q: (200, vector((LBL, t, str(t - 120) if "timestamp(" in q else "4")), 0.0)
    queries = PromQueries(**{n: None for n in SIGNALS if n != "queue_depth"}, gpu_power_kw=None)
    with PrometheusMetricsSource(fake_prom.url, queries, max_sample_age_s=60) as src:
        s = src.observe([spec(M, ("onprem",))], now())[M]
    assert s.queue_depth.value is None and reason_code(s.queue_depth) == "Stale"
    assert s.queue_depth.at is not None and abs(s.queue_depth.at.timestamp() - (t - 120)) < 1e-3
    # the same data with a more tolerant age is a value, dated by the data
    with PrometheusMetricsSource(fake_prom.url, queries, max_sample_age_s=300) as src:
        s = src.observe([spec(M, ("onprem",))], now())[M]
    assert s.queue_depth.value == 4.0


def test_one_bad_pool_makes_the_value_partial_not_wrong(fake_prom: FakePrometheus) -> None:
    t = time.time()
    fake_prom.answer = lambda q: (200, vector(({"model": M, "pool": "onprem"}, t, "6"),
                                              ({"model": M, "pool": "aws-spot"}, t, "NaN")), 0.0)
    with PrometheusMetricsSource(fake_prom.url, QUEUE_ONLY) as src:
        obs = src.observe_detailed([spec(M)], now())
    q = obs.models[M].queue_depth
    assert q.value == 6.0 and reason_code(q) == "Partial"
    assert "aws-spot" in (q.reason or "")
    assert reason_code(obs.pools[(M, "aws-spot")]["queue_depth"]) == "NaN"


def test_timestamps_in_the_future_are_not_stale_and_stale_uses_the_callers_now(fake_prom: FakePrometheus) -> None:
    t = time.time()
    fake_prom.answer = lambda q: (200, vector((LBL, t, "2")), 0.0)
    with PrometheusMetricsSource(fake_prom.url, QUEUE_ONLY, max_sample_age_s=10) as src:
        earlier = src.observe([spec(M, ("onprem",))], now() - timedelta(seconds=30))[M]
        later = src.observe([spec(M, ("onprem",))], now() + timedelta(seconds=30))[M]
    assert earlier.queue_depth.value == 2.0
    assert later.queue_depth.value is None and reason_code(later.queue_depth) == "Stale"
    assert math.isclose(earlier.queue_depth.at.timestamp(), t, abs_tol=1e-3)  # type: ignore[union-attr]


def test_pools_told_apart_by_another_label_from_settings(metrics_lab: MetricsLab) -> None:
    m = "by-pod-label"
    metrics_lab.triton["onprem"].set_model(m, pending=2)
    metrics_lab.triton["aws-spot"].set_model(m, pending=3)
    settings = PrometheusSettings.model_validate({
        "url": metrics_lab.prometheus.url, "pool_label": "pod", "max_sample_age_s": 20,
        "queries": {"rate_window": "5s", "kv_cache_utilization_pct": None}})
    with settings.build() as src:
        obs = poll(lambda: src.observe_detailed([spec(m)], now()), lambda o: o.models[m].queue_depth.value == 5.0)
    assert set(obs.by_pool(m, "queue_depth")) == {"triton-onprem-0", "triton-spot-0"}
    assert reason_code(obs.models[m].kv_cache_utilization_pct) == "NotConfigured"
    with pytest.raises(ValueError, match="unknown_signal"):
        PromQueries.model_validate({"unknown_signal": "up"})


def test_a_promql_rules_own_query_is_evaluated_once_per_tick_and_scales_like_keda(metrics_lab: MetricsLab) -> None:
    from controller.core.model import Sample
    from policies.base import PolicyContext, Registry

    m = "promql-rule"
    metrics_lab.triton["onprem"].set_model(m, pending=13)
    query = f'sum(nv_inference_pending_request_count{{model="{m}"}})'
    broken = 'sum(nv_inference_pending_request_count{model="no-such-model"})'
    several = f'nv_inference_pending_request_count{{model="{m}"}} or vector(1)'
    reg = Registry.from_entry_points()
    rule = reg.build("promql", {"query": query, "target_per_replica": 4}, "rps")
    session = CountingSession()
    with PrometheusMetricsSource(metrics_lab.prometheus.url, FAST, session=session) as src:
        src.set_queries({m: (*rule.queries(), broken, several), "other": rule.queries()})
        obs = poll(lambda: src.observe_detailed([spec(m, ("onprem",)), spec("other")], now()),
                   lambda o: o.models[m].query(query).value is not None)
        session.queries.clear()
        obs = src.observe_detailed([spec(m, ("onprem",)), spec("other")], now())
        evaluations = session.queries.count(query)
        # behind the Triton fallback (CombinedMetricsSource) the queries still reach Prometheus
        from providers.triton import CombinedMetricsSource

        class NoFallback:
            def observe(self, models: Any, at: datetime) -> dict[str, ModelSignals]:
                return {}

        combined = CombinedMetricsSource(src, NoFallback())
        combined.set_queries({m: (query,)})
        assert combined.observe([spec(m, ("onprem",))], now())[m].query(query).value == 13.0
    sig = obs.models[m]
    assert sig.query(query).value == 13.0
    assert evaluations == 1  # one evaluation for both models that want it
    assert obs.models["other"].query(query) == sig.query(query)
    assert sig.query(broken).value is None and reason_code(sig.query(broken)) == "NoData"
    assert sig.query(several).value is None and reason_code(sig.query(several)) == "SeveralSeries"
    # the rule on that value: KEDA's ceil(13 / 4) = 4
    t = now()
    ctx = PolicyContext(model=spec(m), signals=sig, now=t, current_replicas=2, ready_replicas=2, capacity=None,
                        max_signal_age_s=60)
    rec = rule.recommend(ctx)
    assert rec.replicas == 4 and rec.reason == "QueryAboveTarget" and not rec.missing_data
    gone = reg.build("promql", {"query": broken, "target_per_replica": 4}, "gone").recommend(ctx)
    assert gone.replicas is None and gone.missing_data and gone.reason == "MetricMissing"
    assert isinstance(sig.query("never asked"), Sample) and sig.query("never asked").value is None
