"""Reaction time: from a load step at Triton to the scale-up decision, in seconds.

Why: the whole point of reading Triton's queue through Prometheus every few seconds is to react
before users feel it. This harness measures the delay end to end through the real pieces: a
real Prometheus scraping Triton's ``/metrics`` every ``--scrape-interval-s``, the real
``PrometheusMetricsSource`` read every ``--tick-s``, and a decider. It prints each trial beside
the scrape and tick intervals and the target (one scrape interval + one tick + 1 s).

Load comes from the exporter's queueing model (``--load model``, default: Triton's exact metric
text, no Triton needed) or from a real Triton (``--load triton``: pytriton's bundled tritonserver on
CPU serving a model that takes ``SERVICE_S`` per request, driven by client threads).

The decider is pluggable: ``--decider module:factory`` names a callable
``factory(model: ModelSpec) -> decide(signals: ModelSignals, now: datetime) -> bool`` (True: the
decision is a scale-up); the daemon's pipeline plugs in there. The built-in stand-in scales up when
the queue per replica or the p99 passes a threshold, as a queue-depth / SLO policy would.

    python bench/reaction_time.py --trials 5 --scrape-interval-s 1 --tick-s 1
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import random
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.core.model import ModelSignals, ModelSpec, ReplicaCapacity  # noqa: E402
from providers.exporters import (  # noqa: E402
    LoadModel,
    LocalPrometheus,
    ScrapeTarget,
    TritonExporter,
    TritonModelState,
    free_port,
    ld_library_path_with_libpython,
)
from providers.prometheus import PrometheusMetricsSource, PromQueries  # noqa: E402

MODEL = "bench-llm"
SERVICE_S = 0.02
"""Real-Triton mode: seconds each request holds the single model instance (50 requests/s)."""

Decide = Callable[[ModelSignals, datetime], bool]


def threshold_decider(queue_per_replica: float = 4.0, p99_ms: float = 500.0, replicas: int = 1) -> Callable[[ModelSpec], Decide]:
    """The stand-in decision: scale up when waiting requests per replica or p99 pass a target."""
    def factory(model: ModelSpec) -> Decide:
        def decide(s: ModelSignals, now: datetime) -> bool:
            q, lat = s.queue_depth.value, s.p99_latency_ms.value
            return (q is not None and q / replicas > queue_per_replica) or (lat is not None and lat > p99_ms)
        return decide
    return factory


def load_decider(spec: str) -> Callable[[ModelSpec], Decide]:
    mod, _, attr = spec.partition(":")
    factory: Callable[[ModelSpec], Decide] = getattr(importlib.import_module(mod), attr)
    return factory


class LoadDriver:
    """Switches load between a low and a high level; ``step_up`` returns the moment it did."""

    def start(self, stack: ExitStack) -> str:
        raise NotImplementedError

    def step_up(self) -> float:
        raise NotImplementedError

    def step_down(self) -> None:
        raise NotImplementedError


class ModelLoad(LoadDriver):
    """Triton's metric text from the fluid queueing model: 1 replica, 20 req/s capacity."""

    def __init__(self) -> None:
        self.load = LoadModel(triton=TritonModelState(), replicas=1, service_per_s=20.0, arrival_per_s=4.0)
        self.exporter = TritonExporter({MODEL: self.load.triton})
        self.exporter.add_load(self.load)

    def start(self, stack: ExitStack) -> str:
        self.exporter.start()
        stack.callback(self.exporter.stop)
        return self.exporter.address

    def step_up(self) -> float:
        with self.exporter.lock:
            self.load.advance(time.monotonic())
            self.load.arrival_per_s = 60.0  # 3x capacity
            return time.monotonic()

    def step_down(self) -> None:
        with self.exporter.lock:
            self.load.advance(time.monotonic())
            self.load.arrival_per_s = 4.0
            self.load.backlog = 0.0


class TritonLoad(LoadDriver):
    """A real tritonserver (pytriton) and client threads."""

    def __init__(self, clients: int = 8) -> None:
        self.clients = clients
        self.stop_event: threading.Event | None = None
        self.threads: list[threading.Thread] = []
        self.http = ""

    def start(self, stack: ExitStack) -> str:
        import os

        import numpy as np
        from pytriton.model_config import ModelConfig, Tensor  # type: ignore[import-untyped]
        from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig  # type: ignore[import-untyped]

        def infer(requests: list[Any]) -> list[dict[str, Any]]:
            time.sleep(SERVICE_S * len(requests))
            return [{"y": r["x"] * 2} for r in requests]

        http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
        os.environ["LD_LIBRARY_PATH"] = ld_library_path_with_libpython()
        import tempfile
        ws = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pytriton-"))
        triton = Triton(config=TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                                            metrics_config=["summary_latencies=true"], exit_timeout_secs=2),
                        workspace=f"{ws}/ws", security_config=TritonSecurityConfig(restricted_endpoints=[]))
        triton.__enter__()
        stack.callback(triton.stop)
        triton.bind(model_name=MODEL, infer_func=infer, inputs=[Tensor(name="x", dtype=np.float32, shape=(1,))],
                    outputs=[Tensor(name="y", dtype=np.float32, shape=(1,))], config=ModelConfig(batching=False))
        self.http = f"127.0.0.1:{http_port}"
        stack.callback(self.step_down)
        return f"127.0.0.1:{metrics_port}"

    def step_up(self) -> float:
        import numpy as np
        import tritonclient.http as th  # type: ignore[import-untyped]

        self.stop_event = ev = threading.Event()

        def run() -> None:
            c = th.InferenceServerClient(self.http, network_timeout=30)
            inp = th.InferInput("x", [1], "FP32")
            inp.set_data_from_numpy(np.ones((1,), np.float32))
            try:
                while not ev.is_set():
                    c.infer(MODEL, [inp])
            finally:
                c.close()

        t0 = time.monotonic()
        self.threads = [threading.Thread(target=run, daemon=True) for _ in range(self.clients)]
        for t in self.threads:
            t.start()
        return t0

    def step_down(self) -> None:
        if self.stop_event is not None:
            self.stop_event.set()
        for t in self.threads:
            t.join(timeout=10)
        self.threads = []


@dataclass
class Trial:
    reaction_s: float
    ticks: int
    queue_depth: float | None
    p99_latency_ms: float | None


def run(args: argparse.Namespace) -> dict[str, Any]:
    spec = ModelSpec(MODEL, 1, "none", ("cpu",), 5, {"cpu": ReplicaCapacity(100, 20)}, ("cpu",))
    factory = load_decider(args.decider) if args.decider else threshold_decider(args.queue_per_replica, args.p99_ms)
    decide = factory(spec)
    driver: LoadDriver = TritonLoad() if args.load == "triton" else ModelLoad()
    rng = random.Random(args.seed)
    trials: list[Trial] = []
    with ExitStack() as stack:
        address = driver.start(stack)
        prom = LocalPrometheus([ScrapeTarget("triton", address, {"pool": "cpu", "namespace": "bench", "pod": "triton-0"})],
                               scrape_interval_s=args.scrape_interval_s)
        stack.callback(prom.close)
        prom.start()
        prom.wait_for(f'nv_inference_pending_request_count{{model="{MODEL}"}}', timeout_s=30)
        # only the signals a scale-up decision reads (the model serves no tokens, has no GPU)
        queries = PromQueries(rate_window=f"{max(int(4 * args.scrape_interval_s), 2)}s", gpu_utilization_pct=None,
                              output_tokens_per_s=None, input_tokens_per_s=None, kv_cache_utilization_pct=None,
                              gpu_power_kw=None)
        src = PrometheusMetricsSource(prom.url, queries, timeout_s=max(args.tick_s, 1.0))
        stack.callback(src.close)

        def tick() -> ModelSignals:
            return src.observe([spec], datetime.now(timezone.utc))[MODEL]

        next_tick = time.monotonic()

        def wait_tick() -> None:
            nonlocal next_tick
            next_tick += args.tick_s
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_tick = time.monotonic()  # a slow tick: do not try to catch up

        for _ in range(args.trials):
            # calm: the decider must see no reason to scale for two ticks in a row
            calm = 0
            deadline = time.monotonic() + 60
            while calm < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError("load did not calm down within 60 s")
                s = tick()
                calm = calm + 1 if s.queue_depth.value is not None and not decide(s, datetime.now(timezone.utc)) else 0
                wait_tick()
            # step at a random phase of the tick and scrape cycles
            time.sleep(rng.uniform(0, args.tick_s))
            t0 = driver.step_up()
            ticks = 0
            while True:
                wait_tick()
                s = tick()
                ticks += 1
                if decide(s, datetime.now(timezone.utc)):
                    trials.append(Trial(time.monotonic() - t0, ticks, s.queue_depth.value, s.p99_latency_ms.value))
                    break
                if time.monotonic() - t0 > 60:
                    raise RuntimeError("no scale-up decision within 60 s of the load step")
            driver.step_down()

    target = args.scrape_interval_s + args.tick_s + 1.0
    times = [t.reaction_s for t in trials]
    return {
        "load": args.load, "scrape_interval_s": args.scrape_interval_s, "tick_s": args.tick_s, "target_s": target,
        "trials": [t.__dict__ for t in trials], "median_s": statistics.median(times), "max_s": max(times),
        "pass": max(times) <= target,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--load", choices=("model", "triton"), default="model", help="exporter queueing model or a real Triton (pytriton)")
    p.add_argument("--scrape-interval-s", type=float, default=1.0)
    p.add_argument("--tick-s", type=float, default=1.0, help="seconds between observe+decide ticks")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--decider", default="", help="module:factory returning decide(signals, now) -> bool (default: thresholds)")
    p.add_argument("--queue-per-replica", type=float, default=4.0, help="stand-in decider: waiting requests per replica")
    p.add_argument("--p99-ms", type=float, default=500.0, help="stand-in decider: p99 latency target, ms")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--verbose", action="store_true", help="show the metrics source's log lines")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(name)s %(message)s")
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"reaction time, load step at Triton -> scale-up decision ({result['load']} load)")
        print(f"scrape interval {result['scrape_interval_s']:g} s, tick {result['tick_s']:g} s, "
              f"target <= {result['target_s']:g} s (one scrape + one tick + 1 s)")
        for i, t in enumerate(result["trials"], 1):
            print(f"  trial {i}: {t['reaction_s']:.2f} s after {t['ticks']} tick(s)"
                  f" (queue_depth={t['queue_depth']}, p99_ms={t['p99_latency_ms']})")
        print(f"median {result['median_s']:.2f} s, max {result['max_s']:.2f} s: {'PASS' if result['pass'] else 'FAIL'}")
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
