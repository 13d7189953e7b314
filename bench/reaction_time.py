"""Reaction time: from a load step at Triton to the scale-up decision, in seconds.

Why: the whole point of reading Triton's queue through Prometheus every few seconds is to react
before users feel it. This harness measures the delay end to end through the real pieces: a
real Prometheus scraping Triton's ``/metrics`` every ``--scrape-interval-s``, the real
``PrometheusMetricsSource`` read every ``--tick-s``, and the daemon's real decision pipeline
(``controller.core.pipeline.decide`` with the ``slo-guard`` policy, loaded from a policy YAML
through ``controller.policyfile.load_policy_files`` exactly as the daemon loads its files). It
prints each trial beside the scrape and tick intervals and the target (one scrape interval + one
tick + 1 s), and the ratio to the target.

Load comes from a real Triton (``--load triton``, the default: pytriton's bundled tritonserver on
CPU serving a model that takes ``SERVICE_S`` per request, driven by closed-loop client threads) or
from the exporter's queueing model (``--load model``: Triton's exact metric text, no Triton
needed).

Deciders (``--decider``):

- ``pipeline`` (default): ``decide()`` on the observed signals, one pool holding one ready
  replica, the decision history carried from tick to tick (reset at each load step). A trial ends
  at the first decision whose total is above the current replicas; its reason code is reported.
  ``--policy FILE`` replaces the built-in policy (it must name model ``bench-llm``).
- ``threshold``: the stand-in used before the pipeline was wired in (queue per replica or p99 over
  a threshold); it isolates the observe path from policy logic, for comparison.
- ``module:factory``: ``factory(model: ModelSpec) -> decide(signals: ModelSignals, now) -> bool``.

    python bench/reaction_time.py --trials 5 --scrape-interval-s 1 --tick-s 1
    python bench/reaction_time.py --load model --json
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.core.model import (  # noqa: E402
    Decision,
    History,
    ModelSignals,
    ModelSpec,
    PoolSpec,
    PoolState,
    ReplicaCapacity,
    Tier,
)
from controller.core.pipeline import decide as pipeline_decide  # noqa: E402
from controller.core.policy import EffectivePolicy  # noqa: E402
from controller.policyfile import load_policy_files  # noqa: E402
from policies.base import Registry  # noqa: E402
from tests.integration.exporters import (  # noqa: E402
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
POOL = "bench-pool"
SERVICE_S = 0.02
"""Real-Triton mode: seconds each request holds the single model instance (50 requests/s)."""

DEFAULT_POLICY = f"""\
apiVersion: tidegate/v1
kind: ScalingPolicy
metadata: {{name: bench-llm-slo}}
spec:
  model: {MODEL}
  bounds: {{min_replicas: 1, max_replicas: 10}}
  # p99 above the loaded p99 of the real-Triton load (about 8 x 25 ms): Triton's summary keeps a
  # loaded p99 for a minute after the load stops, which would otherwise read as a new load step
  slo: {{p99_latency_ms: 500, queue_depth_per_replica: 4}}
  rules:
    - kind: slo-guard
      params:
        # the bench has no GPUs and serves no tokens: no DCGM, no nv_llm_output_token_len
        ignore: [utilization, output_tokens]
"""
"""The built-in policy: the default kind with the daemon's default behaviour (scale-up without
stabilization, HPA rate limits), SLO targets a load step clearly crosses."""

Decide = Callable[[ModelSignals, datetime], bool]


def threshold_decider(queue_per_replica: float = 4.0, p99_ms: float = 500.0, replicas: int = 1) -> Callable[[ModelSpec], Decide]:
    """The stand-in decision: scale up when waiting requests per replica or p99 pass a target."""
    def factory(model: ModelSpec) -> Decide:
        def decide(s: ModelSignals, now: datetime) -> bool:
            q, lat = s.queue_depth.value, s.p99_latency_ms.value
            return (q is not None and q / replicas > queue_per_replica) or (lat is not None and lat > p99_ms)
        return decide
    return factory


def load_policy(path: Path | None, model: str) -> EffectivePolicy:
    """The policy in force for ``model`` from a YAML file (default: ``DEFAULT_POLICY``), through the
    daemon's own loader (schema, kinds from the entry points, merge, version hash)."""
    with tempfile.TemporaryDirectory(prefix="bench-policy-") as tmp:
        if path is None:
            path = Path(tmp) / "bench-llm.yaml"
            path.write_text(DEFAULT_POLICY)
        result = load_policy_files(path, Registry.from_entry_points(), known_models={model})
    if not result.ok or model not in result.policies:
        problems = "; ".join(str(e) for e in result.errors) or f"no policy for model {model!r}"
        raise SystemExit(f"policy file {path}: {problems}")
    return result.policies[model]


@dataclass
class PipelineDecider:
    """The daemon's decide step on one pool: ``decide()`` with the policy, the pool's replicas as
    observed (static: the bench does not act), and the history carried between ticks as the
    daemon carries it. A scale-up is a decision, to be acted on, above the current replicas."""

    model: ModelSpec
    pool: PoolSpec
    policy: EffectivePolicy
    replicas: int = 1
    history: History = field(default_factory=History)
    last: Decision | None = None

    def reset(self) -> None:
        """Forget the decisions so far (each trial starts from a fresh history, as no scale-up
        of the previous trial was acted on)."""
        self.history = History()
        self.last = None

    def __call__(self, signals: ModelSignals, now: datetime) -> bool:
        state = PoolState(pool=self.pool.name, replicas=self.replicas, ready_replicas=self.replicas,
                          nodes=self.replicas, at=now)
        d = pipeline_decide(model=self.model, pools={self.pool.name: self.pool},
                            signals=replace(signals, pools={self.pool.name: state}), policy=self.policy,
                            history=self.history, overrides=(), now=now)
        self.history = d.history
        self.last = d
        return d.actuate and d.replicas > d.current_replicas


def pipeline_decider(policy_path: Path | None, pool: PoolSpec) -> Callable[[ModelSpec], Decide]:
    def factory(model: ModelSpec) -> Decide:
        return PipelineDecider(model, pool, load_policy(policy_path, model.name))
    return factory


def load_decider(spec: str) -> Callable[[ModelSpec], Decide]:
    mod, _, attr = spec.partition(":")
    factory: Callable[[ModelSpec], Decide] = getattr(importlib.import_module(mod), attr)
    return factory


class LoadDriver:
    """Switches load between a low and a high level; ``step_up`` returns the moment it did."""

    requests_per_s: float = 20.0
    """What one replica sustains (the model's capacity profile for the throughput rule)."""

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

    requests_per_s = 1.0 / SERVICE_S

    def __init__(self, clients: int = 8) -> None:
        self.clients = clients
        self.stop_event: threading.Event | None = None
        self.threads: list[threading.Thread] = []
        self.http = ""

    def start(self, stack: ExitStack) -> str:
        import numpy as np
        from pytriton.model_config import ModelConfig, Tensor  # type: ignore[import-untyped]
        from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig  # type: ignore[import-untyped]

        def infer(requests: list[Any]) -> list[dict[str, Any]]:
            time.sleep(SERVICE_S * len(requests))
            return [{"y": r["x"] * 2} for r in requests]

        http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
        os.environ["LD_LIBRARY_PATH"] = ld_library_path_with_libpython()
        ws = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-pytriton-"))
        # tritonserver logs to a file: its stdout would mix with the bench's (--json)
        triton = Triton(config=TritonConfig(http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
                                            metrics_config=["summary_latencies=true"], exit_timeout_secs=2,
                                            log_file=Path(ws) / "tritonserver.log"),
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
    reason: str | None = None
    """The decision's reason code (pipeline decider)."""
    replicas: int | None = None
    """The decided total (pipeline decider)."""


def run(args: argparse.Namespace) -> dict[str, Any]:
    driver: LoadDriver = TritonLoad() if args.load == "triton" else ModelLoad()
    spec = ModelSpec(MODEL, 1, "none", ("cpu",), 5, {"cpu": ReplicaCapacity(100, driver.requests_per_s)}, (POOL,))
    pool = PoolSpec(POOL, Tier.ONPREM, "onprem", "cpu", gpus_per_node=1, max_nodes=10, price_per_node_hour_usd=1.0)
    if args.decider == "pipeline":
        factory = pipeline_decider(Path(args.policy) if args.policy else None, pool)
    elif args.decider == "threshold":
        factory = threshold_decider(args.queue_per_replica, args.p99_ms)
    else:
        factory = load_decider(args.decider)
    decide = factory(spec)
    policy_version = decide.policy.version if isinstance(decide, PipelineDecider) else None
    rng = random.Random(args.seed)
    trials: list[Trial] = []
    with ExitStack() as stack:
        address = driver.start(stack)
        prom = LocalPrometheus([ScrapeTarget("triton", address, {"pool": POOL, "namespace": "bench", "pod": "triton-0"})],
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
            """Sleep until the next tick is due and schedule the one after (a slow tick does not
            make the schedule catch up)."""
            nonlocal next_tick
            delay = next_tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            next_tick = max(next_tick + args.tick_s, time.monotonic())

        for _ in range(args.trials):
            # calm: the decider must see no reason to scale for two ticks in a row
            calm = 0
            deadline = time.monotonic() + 90
            while calm < 2:
                if time.monotonic() > deadline:
                    raise RuntimeError("load did not calm down within 90 s")
                wait_tick()
                s = tick()
                calm = calm + 1 if s.queue_depth.value is not None and not decide(s, datetime.now(timezone.utc)) else 0
            reset = getattr(decide, "reset", None)
            if reset is not None:
                reset()
            # The step lands at a random phase of Prometheus's scrape cycle, and the daemon's
            # tick cycle has its own random phase against both: in production the three are
            # unrelated, and a fixed phase would measure one case (best or worst) every time.
            time.sleep(rng.uniform(0, args.scrape_interval_s))
            t0 = driver.step_up()
            next_tick = t0 + rng.uniform(0, args.tick_s)
            ticks = 0
            while True:
                wait_tick()
                s = tick()
                ticks += 1
                if decide(s, datetime.now(timezone.utc)):
                    last = decide.last if isinstance(decide, PipelineDecider) else None
                    trials.append(Trial(time.monotonic() - t0, ticks, s.queue_depth.value, s.p99_latency_ms.value,
                                        last.reason if last else None, last.replicas if last else None))
                    break
                if time.monotonic() - t0 > 60:
                    raise RuntimeError("no scale-up decision within 60 s of the load step")
            driver.step_down()

    target = args.scrape_interval_s + args.tick_s + 1.0
    times = [t.reaction_s for t in trials]
    median, worst = statistics.median(times), max(times)
    return {
        "load": args.load, "decider": args.decider, "policy_version": policy_version,
        "scrape_interval_s": args.scrape_interval_s, "tick_s": args.tick_s, "target_s": target,
        "trials": [t.__dict__ for t in trials], "median_s": median, "max_s": worst,
        "median_ratio_to_target": median / target, "max_ratio_to_target": worst / target,
        "pass": worst <= target,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--load", choices=("triton", "model"), default="triton",
                   help="a real Triton (pytriton, default) or the exporter's queueing model")
    p.add_argument("--scrape-interval-s", type=float, default=1.0)
    p.add_argument("--tick-s", type=float, default=1.0, help="seconds between observe+decide ticks")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--decider", default="pipeline",
                   help="pipeline (decide() + slo-guard, default), threshold (the stand-in), or module:factory")
    p.add_argument("--policy", default="", help="pipeline decider: a ScalingPolicy YAML for model bench-llm (default: built in)")
    p.add_argument("--queue-per-replica", type=float, default=4.0, help="threshold decider: waiting requests per replica")
    p.add_argument("--p99-ms", type=float, default=500.0, help="threshold decider: p99 latency target, ms")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--verbose", action="store_true", help="show the metrics source's log lines")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(name)s %(message)s")
    # Servers started below (tritonserver) write to file descriptor 1 whatever their log
    # settings; point it at stderr while they run so stdout carries only the report.
    sys.stdout.flush()
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        result = run(args)
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
    if args.json:
        print(json.dumps(result))
    else:
        decider = result["decider"] + (f" (decide() + policy version {result['policy_version']})"
                                        if result["policy_version"] else "")
        print(f"reaction time, load step at Triton -> first scale-up decision ({result['load']} load, {decider} decider)")
        print(f"scrape interval {result['scrape_interval_s']:g} s, tick {result['tick_s']:g} s, "
              f"target <= {result['target_s']:g} s (one scrape + one tick + 1 s)")
        for i, t in enumerate(result["trials"], 1):
            how = f", {t['reason']} -> {t['replicas']} replicas" if t["reason"] else ""
            print(f"  trial {i}: {t['reaction_s']:.2f} s after {t['ticks']} tick(s){how}"
                  f" (queue_depth={t['queue_depth']}, p99_ms={t['p99_latency_ms']})")
        print(f"median {result['median_s']:.2f} s ({result['median_ratio_to_target']:.2f} x target), "
              f"max {result['max_s']:.2f} s ({result['max_ratio_to_target']:.2f} x target): "
              f"{'PASS' if result['pass'] else 'FAIL'}")
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
