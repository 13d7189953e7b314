"""Cloud API calls per tick: what the daemon asks of AWS and GCP for N models x 3 cloud pools.

Why: Auto Scaling's DescribeAutoScalingGroups has a low request rate limit, shared by everything in
the account that calls it, and an autoscaler that reads each model's node groups every 5 s sends
thousands of calls a tick at a thousand models. This runs the daemon as ``tidegate run`` builds it
(``tests.integration.cloud_fleet``: SQLite decision log, scripted load, two Auto Scaling groups in
one region, a zonal managed instance group, the SQS interruption queue) against moto behind its
recording proxy, the local compute server and kmock on 127.0.0.1, and counts the daemon's calls
where they arrive:

- ``steady``: ticks where nothing changes (every model holds its one replica on ``aws-spot``):
  the reads;
- ``scale``: one tick where every model grows to two replicas (spread over both spot pools: the
  managed instance group is resized): the reads and the writes.

Per fleet size it prints the calls of each action per tick (the steady figure is the median over
``--ticks``), and the tick's wall and CPU seconds (medians over the steady ticks; CPU is the ticking
thread's own, ``time.thread_time``, so the peers' serving in their own threads is not counted;
wall includes their answers). Kubernetes requests are ``bench/kube_calls.py``'s subject.

    python bench/cloud_calls.py [--models 10 50] [--ticks 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.cloud_fleet import CloudFleet, cloud_calls  # noqa: E402
from tests.integration.gcp_server import GcpComputeServer  # noqa: E402
from tests.integration.peers import AwsPeer, KubePeer, aws_env  # noqa: E402


def run(kube: KubePeer, aws: AwsPeer, gcp: GcpComputeServer, models: int, ticks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        fleet = CloudFleet(kube, aws, gcp, Path(tmp), models=models)
        try:
            report, _, _ = fleet.tick(queue=1)  # the first tick orders the nodes: not measured
            assert report.ok, report.errors
            fleet.catch_up()
            counts, walls, cpus = [], [], []
            calls: Counter[str] = Counter()
            for _ in range(ticks):
                wall, cpu = time.perf_counter(), time.thread_time()
                report, a, g = fleet.tick(queue=1)
                walls.append(time.perf_counter() - wall)
                cpus.append(time.thread_time() - cpu)
                assert report.ok, report.errors
                calls = cloud_calls(a, g)
                counts.append(sum(calls.values()))
            report, a, g = fleet.tick(queue=2)
            assert report.ok, report.errors
            scale = cloud_calls(a, g)
        finally:
            fleet.close()
    return {"models": models, "pools": 3,
            "steady_calls": statistics.median(counts), "steady_by_action": dict(sorted(calls.items())),
            "scale_calls": sum(scale.values()), "scale_by_action": dict(sorted(scale.items())),
            "tick_wall_s": round(statistics.median(walls), 4), "tick_cpu_s": round(statistics.median(cpus), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--ticks", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.update(aws_env())  # dummy credentials: nothing reaches for a real account
    kube, aws, gcp = KubePeer().start(), AwsPeer().start(), GcpComputeServer().start()
    try:
        rows = [run(kube, aws, gcp, n, args.ticks) for n in args.models]
    finally:
        gcp.stop()
        aws.stop()
        kube.stop()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(f"{r['models']} models x {r['pools']} cloud pools: "
              f"steady tick {r['steady_calls']:g} calls {r['steady_by_action']}, "
              f"scale tick {r['scale_calls']} {r['scale_by_action']}; "
              f"tick wall {r['tick_wall_s']:.3f} s, CPU {r['tick_cpu_s']:.3f} s")


if __name__ == "__main__":
    main()
