"""preStop hook of the Triton pods: wait until in-flight requests are done, then let Kubernetes stop
the pod.

Kubernetes takes a terminating pod out of the Service's endpoints while this runs, so no new
requests arrive; what is left is the requests already queued or generating. Triton's own SIGTERM
handling would wait only --exit-timeout-secs and then cut streams, and mpirun (PID 1) relays
signals to the ranks without waiting for requests, so this hook does the waiting: it polls the
local metrics endpoint until nothing is pending (nv_inference_pending_request_count) or active in
the TensorRT-LLM executor (nv_trt_llm_request_metrics{request_type="active"}) for two polls in a
row, or until --timeout-s (sized per pool below the spot interruption notice and under the pod's
terminationGracePeriodSeconds).

Runs in the Triton image with only the standard library. Exits 0 in every case: a preStop hook
that fails only delays termination.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import urllib.request

PENDING = re.compile(r'^nv_inference_pending_request_count\{[^}]*\}\s+([0-9.eE+-]+)', re.M)
ACTIVE = re.compile(r'^nv_trt_llm_request_metrics\{[^}]*request_type="active"[^}]*\}\s+([0-9.eE+-]+)', re.M)


def in_flight(metrics_text: str) -> float:
    """Requests queued in Triton plus requests the TensorRT-LLM executor is generating."""
    return sum(float(v) for v in PENDING.findall(metrics_text)) + sum(float(v) for v in ACTIVE.findall(metrics_text))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8002/metrics")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--poll-s", type=float, default=1.0)
    ap.add_argument("--endpoint-grace-s", type=float, default=3.0,
                    help="first wait for load balancers to drop the endpoint")
    args = ap.parse_args()
    deadline = time.monotonic() + args.timeout_s
    time.sleep(min(args.endpoint_grace_s, args.timeout_s))
    idle_polls = 0
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(args.url, timeout=2) as resp:
                n = in_flight(resp.read().decode())
        except OSError as e:  # server already gone or not serving metrics: nothing to wait for
            print(f"drain: metrics unavailable ({e}); stopping", file=sys.stderr)
            return 0
        idle_polls = idle_polls + 1 if n == 0 else 0
        if idle_polls >= 2:
            print("drain: no request in flight; stopping", file=sys.stderr)
            return 0
        time.sleep(args.poll_s)
    print(f"drain: {args.timeout_s:.0f} s elapsed with requests still in flight; stopping anyway", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
