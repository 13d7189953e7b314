"""``tidegate simulate``: replay a trace through tidegate's policy and the baselines, side by side.

    tidegate simulate --trace ../shared/data/azure_llm_2023/AzureLLMInferenceTrace_code.csv \\
        --format azure --fleet FLEET.yaml --policy POLICY.yaml --baselines all --out DIR

prints a comparison table (``--json``: the JSON document instead) and, with ``--out DIR``, writes
``DIR/results.json`` and one ``DIR/timeline-<policy>.png`` per run. Exit status: 0 on success, 2 on
bad input (the message says which file or option and why).
"""

from __future__ import annotations

import argparse
import re
import sys
import time as _wall
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from controller.sim.baselines import BaselineSettings, expand_baselines, make_controller
from controller.sim.engine import EngineOptions, RunResult, simulate
from controller.sim.scenario import EXAMPLES, ScenarioError, build_scenario, capacity_table, parse_start

DEFAULT_FLEET = EXAMPLES / "fleet-llama3-70b.yaml"
DEFAULT_POLICY = EXAMPLES / "policy-llama3-70b.yaml"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tidegate simulate",
        description="Replay a request trace or rate series through tidegate's decision core and baselines "
                    "(seed-stack, hpa, keda, skyserve, all-on-demand, oracle, schedule:FILE) on a simulated fleet.")
    w = p.add_argument_group("workload")
    w.add_argument("--trace", required=True, help="request trace (Azure LLM CSV) or rate series (CSV: time, requests per bin)")
    w.add_argument("--format", choices=("azure", "rate"), default="azure", help="trace format (default: azure)")
    w.add_argument("--token-trace", default=None, help="Azure LLM CSV whose token counts a rate series draws from "
                   "(default: ../shared/data/azure_llm_2023/AzureLLMInferenceTrace_code.csv)")
    w.add_argument("--rate-bin-s", type=float, default=60.0, help="bin width of a rate series, seconds (default 60)")
    w.add_argument("--time-scale", type=float, default=1.0, help="multiply times by X (0.5: twice as fast) (default 1)")
    w.add_argument("--load-scale", type=float, default=None, help="multiply the load by K")
    w.add_argument("--peak-replicas", type=float, default=None,
                   help="scale the load so that its busiest minute needs N replicas (of the on-prem GPU type) at the SLO")
    w.add_argument("--duration-s", type=float, default=None, help="simulate only the first S seconds (after time scaling)")
    w.add_argument("--trace-start", default=None, metavar="ISO",
                   help="t = 0 of a request trace (ISO 8601, UTC unless it says; at or before its first request): "
                        "an idle lead before the first request is kept (default: the first request)")
    w.add_argument("--start", default=None, help="simulated date-time of t=0 (ISO 8601; default 2024-01-01T00:00Z, a Monday)")
    f = p.add_argument_group("fleet and policy")
    f.add_argument("--fleet", default=str(DEFAULT_FLEET), help="DaemonConfig YAML with pools and models (default: the example fleet)")
    f.add_argument("--model", default=None, help="model bundle to simulate (default: the fleet's first)")
    f.add_argument("--policy", default=None, help="ScalingPolicy YAML (default: controller/sim/examples/policy-llama3-70b.yaml, for the example fleet)")
    f.add_argument("--profile", default=None, help="service profile YAML (default: controller/sim/profiles/<model>.yaml)")
    f.add_argument("--ttft-ms", type=float, default=None, help="TTFT target (default: the policy's slo.ttft_p99_ms, else 2000)")
    f.add_argument("--tpot-ms", type=float, default=None, help="time-per-output-token target (default: the policy's slo.tpot_ms, else 100)")
    s = p.add_argument_group("spot")
    s.add_argument("--spot", action="append", default=[], metavar="POOL=PATH[@OFFSET_S]|POOL=rate:X",
                   help="replay a spot trace on a pool (SpotServe CSV/JSON-lines or SkyPilot JSON), or draw X interruptions per node-hour")
    s.add_argument("--unavailable", action="append", default=[], metavar="POOL=START_S:END_S",
                   help="a window during which launches in POOL fail")
    r = p.add_argument_group("run")
    r.add_argument("--baselines", default="none", help="all, none, or a comma list of seed-stack,hpa,keda,skyserve,all-on-demand,oracle,schedule:FILE")
    r.add_argument("--no-tidegate", action="store_true", help="run only the baselines")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--initial-replicas", type=int, default=None, metavar="N",
                   help="every controller starts from N replicas ready on-prem (default: the policy's min_replicas)")
    r.add_argument("--mode", choices=("auto", "requests", "fluid"), default="auto",
                   help="request by request, or fluid (long rate series); auto picks (default)")
    r.add_argument("--onprem-cost", choices=("used", "always"), default="used",
                   help="bill on-prem nodes while they hold replicas (default) or all the time")
    r.add_argument("--keda-threshold", type=float, default=50.0, help="pending requests (waiting plus in flight) per replica for the keda baseline (default 50)")
    r.add_argument("--skyserve-qps", type=float, default=None,
                   help="target_qps_per_replica for skyserve (default: the bundle's capacity requests_per_s)")
    r.add_argument("--progress", dest="progress", action="store_true", default=None, help="always show a progress bar")
    r.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=None, help="directory for results.json and timeline PNGs")
    o.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    o.add_argument("--print-capacity", action="store_true", help="print per-replica capacity for this workload and exit")
    return p


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def simulate_main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    policy_path = args.policy
    if policy_path is None and DEFAULT_POLICY.exists():
        policy_path = str(DEFAULT_POLICY)
    try:
        start = parse_start(args.start)
    except ValueError as e:
        print(f"tidegate simulate: --start: {e}", file=sys.stderr)
        return 2
    try:
        trace_start = parse_start(args.trace_start)
    except ValueError as e:
        print(f"tidegate simulate: --trace-start: {e}", file=sys.stderr)
        return 2
    if args.initial_replicas is not None and args.initial_replicas < 0:
        print(f"tidegate simulate: --initial-replicas {args.initial_replicas}: give 0 or more replicas", file=sys.stderr)
        return 2
    options = EngineOptions(mode=args.mode, onprem_cost=args.onprem_cost, progress=args.progress)
    try:
        names = ([] if args.no_tidegate else ["tidegate"]) + expand_baselines(args.baselines)
        sc = build_scenario(fleet=args.fleet, trace=args.trace, fmt=args.format, policy=policy_path, model=args.model,
                            profile=args.profile, token_trace=args.token_trace, rate_bin_s=args.rate_bin_s,
                            time_scale=args.time_scale, load_scale=args.load_scale, peak_replicas=args.peak_replicas,
                            duration_s=args.duration_s, seed=args.seed, spot=args.spot, unavailable=args.unavailable,
                            ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms, start=start or trace_start, options=options,
                            trace_start=trace_start)
        if sc.policy is not None:
            # equal terms: every controller starts from the policy's minimum, on-prem, ready
            start_n = sc.policy.spec.bounds.min_replicas if args.initial_replicas is None else args.initial_replicas
            sc.setup.options = replace(sc.setup.options, initial_replicas=start_n)
    except (ScenarioError, ValueError, OSError) as e:
        print(f"tidegate simulate: {e}", file=sys.stderr)
        return 2
    setup = sc.setup
    if args.print_capacity:
        for row in capacity_table(setup):
            print("  ".join(f"{k}={v}" for k, v in row.items()))
        return 0
    if not names:
        print("tidegate simulate: nothing to run (--no-tidegate and --baselines none)", file=sys.stderr)
        return 2
    bounds = sc.policy.spec.bounds if sc.policy is not None else None
    settings = BaselineSettings(
        min_replicas=bounds.min_replicas if bounds else 1, max_replicas=bounds.max_replicas if bounds else 10,
        keda_queue_threshold=args.keda_threshold, skyserve_target_qps=args.skyserve_qps,
        tidegate_interval_s=sc.cfg.loop.interval_s,
        max_cost_per_hour_usd=sc.policy.spec.budget.max_cost_per_hour_usd if sc.policy is not None else None)
    results: list[RunResult] = []
    wall0 = _wall.perf_counter()
    for name in names:
        try:
            ctrl = make_controller(name, setup, sc.policy, settings)
            res = simulate(setup, ctrl)
        except (ValueError, OSError) as e:
            print(f"tidegate simulate: {name}: {e}", file=sys.stderr)
            return 2
        rep = getattr(ctrl, "report", None)
        if callable(rep):
            res.summary.update(rep())
        results.append(res)
    scenario: dict[str, Any] = {
        "trace": str(args.trace), "format": args.format, "fleet": str(args.fleet), "policy": policy_path,
        "policy_version": sc.policy.version if sc.policy is not None else None,
        "model": setup.model.name, "seed": args.seed, "time_scale": args.time_scale, "load_factor": sc.load_factor,
        "duration_s": setup.span_s, "slo": {"ttft_ms": setup.slo.ttft_s * 1000, "tpot_ms": setup.slo.tpot_s * 1000},
        "spot": {n: (m.trace.name if m.trace is not None else f"rate {m.interruptions_per_node_hour}/node-h")
                 for n, m in setup.spot.items()},
        "capacity": capacity_table(setup), "notes": sc.notes, "wall_s": round(_wall.perf_counter() - wall0, 3),
    }
    from controller.sim import report

    doc = report.to_json(scenario, results)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        full = report.to_json(scenario, results, include_timeline=True)
        (out / "results.json").write_text(report.dumps(full))
        from controller.sim.plot import shared_limits, timeline_png

        limits = shared_limits(res.timeline for res in results)  # one trace: the same axes for every controller
        for res in results:
            timeline_png(res.timeline, out / f"timeline-{_safe(res.controller)}.png",
                         f"{res.controller}: {Path(args.trace).name}, {setup.model.name}", limits=limits)
    if args.json:
        print(report.dumps(doc))
    else:
        for note in sc.notes:
            print(note)
        print(f"{Path(args.trace).name}: {setup.span_s / 3600:.2f} h simulated, SLO TTFT <= {setup.slo.ttft_s * 1000:.0f} ms "
              f"and TPOT <= {setup.slo.tpot_s * 1000:.0f} ms, seed {args.seed}")
        print(report.table(doc["runs"]))
        if args.out:
            print(f"wrote {Path(args.out) / 'results.json'} and {len(results)} timeline PNG(s)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(simulate_main())
