"""Why the DCGM exporter's ServiceMonitor needs ``honorLabels: true`` (README, "What the cluster
needs"; the chart's ``dcgmServiceMonitor``): scraped the way the Prometheus Operator scrapes it (the
target carries the exporter pod's own ``namespace`` and ``pod``), the exporter's per-GPU
``namespace``/``pod`` labels survive only with honor_labels, and the daemon's GPU-utilization
signal, which joins DCGM to Triton on (namespace, pod), is there with it and missing without it.

A real Prometheus scrapes a Triton and a DCGM exporter speaking their exact metric text
(``tests.integration.exporters``); the daemon's Prometheus source reads the signal."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import httpx
import pytest

from controller.core.model import ModelSpec, ReplicaCapacity
from tests.integration.exporters import DcgmExporter, GpuState, LocalPrometheus, Ramp, ScrapeTarget, TritonExporter
from providers.prometheus import PrometheusMetricsSource, PromQueries
from tests.integration.conftest import prometheus_binary_or_skip

MODEL = "llama-dcgm"
OPERATOR_TARGET_LABELS = {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7xk2p"}
"""What a ServiceMonitor's target carries for the exporter's own pod."""


@pytest.mark.parametrize("honor_labels", [True, False])
def test_gpu_utilization_joins_only_when_dcgm_labels_are_honored(honor_labels: bool) -> None:
    binary = prometheus_binary_or_skip()
    triton, dcgm = TritonExporter(), DcgmExporter()
    served = triton.set_model(MODEL, pending=1)
    triton.add_load(Ramp(served, "success", 5.0))
    dcgm.gpus = [GpuState(0, pod="triton-0", namespace="serving", container="triton", util_pct=65.0)]
    triton.start()
    dcgm.start()
    prom = LocalPrometheus([
        ScrapeTarget("triton", triton.address, {"pool": "onprem", "namespace": "serving", "pod": "triton-0"}),
        ScrapeTarget("dcgm", dcgm.address, OPERATOR_TARGET_LABELS, honor_labels=honor_labels),
    ], scrape_interval_s=1.0, binary=binary)
    try:
        prom.start()
        prom.wait_for("count(up == 1) == 2", timeout_s=30)
        prom.wait_for("count(DCGM_FI_DEV_GPU_UTIL) > 0 and count(nv_inference_request_success) > 0", timeout_s=30)
        series = httpx.get(f"{prom.url}/api/v1/series", params={"match[]": "DCGM_FI_DEV_GPU_UTIL"}, timeout=5).json()["data"]
        (labels,) = series
        spec = ModelSpec(name=MODEL, tp_degree=1, quantization="fp8", gpu_types=("A100",), cold_start_s=60,
                         capacity={"A100": ReplicaCapacity(1000, 2)}, pools=("onprem",))
        with PrometheusMetricsSource(prom.url, PromQueries(rate_window="5s")) as src:
            deadline = time.monotonic() + 15
            while True:
                util = src.observe([spec], datetime.now(timezone.utc))[MODEL].gpu_utilization_pct
                if util.value is not None or time.monotonic() > deadline or not honor_labels:
                    break
                time.sleep(0.2)
    finally:
        prom.close()
        triton.stop()
        dcgm.stop()
    if honor_labels:
        assert (labels["namespace"], labels["pod"]) == ("serving", "triton-0")
        assert util.value == pytest.approx(65.0)
    else:
        # the target's labels win; the GPU's pod is only in exported_*
        assert (labels["namespace"], labels["pod"]) == ("gpu-operator", "nvidia-dcgm-exporter-7xk2p")
        assert (labels["exported_namespace"], labels["exported_pod"]) == ("serving", "triton-0")
        # both exporters' series are there (waited for above): the join itself finds nothing
        assert util.value is None and "NoData" in (util.reason or ""), util
