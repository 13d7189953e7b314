"""Kubernetes API requests per tick: what the daemon asks of the API server for N models x 3 pools.

Why: the API server is shared by the whole cluster, and an autoscaler that reads each model's
objects in each pool every 5 s makes thousands of requests a second at a thousand models. This runs
the daemon as ``tidegate run`` builds it (``tests.integration.kube_fleet``: SQLite decision log,
scripted load, ``onprem`` and two ``cluster-autoscaler`` pools) against kmock on 127.0.0.1 and
counts, at the peer, the requests the daemon's own client made in each tick:

- ``steady``: ticks where nothing changes (every model holds its one on-prem replica): the reads;
- ``scale``: one tick where every model grows to two replicas: the reads and the patches.

Per fleet size it prints the requests of each kind (``list``, ``get``, ``patch``...) per tick (the
steady figure is the median over ``--ticks``), and the tick's wall and CPU seconds (medians over
the steady ticks; CPU is the ticking thread's own, ``time.thread_time``, so kmock's serving in its
own thread is not counted; wall includes kmock's answers).

    python bench/kube_calls.py [--models 10 50] [--namespaces 1] [--ticks 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.kube_fleet import KubeFleet  # noqa: E402
from tests.integration.peers import KubePeer, KubeRequest  # noqa: E402
from tests.rbac import request_attributes  # noqa: E402


def _verbs(requests: list[KubeRequest]) -> Counter[str]:
    out: Counter[str] = Counter()
    for r in requests:
        attrs = request_attributes(r.method, r.path, r.query)
        out[attrs.verb if attrs is not None else "other"] += 1
    return out


def run(kube: KubePeer, models: int, namespaces: int, ticks: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        fleet = KubeFleet(kube, Path(tmp), models=models, namespaces=namespaces)
        try:
            fleet.tick(queue=1)  # the first tick rebuilds history: not measured
            counts, walls, cpus = [], [], []
            verbs: Counter[str] = Counter()
            for _ in range(ticks):
                wall, cpu = time.perf_counter(), time.thread_time()
                report, requests = fleet.tick(queue=1)
                walls.append(time.perf_counter() - wall)
                cpus.append(time.thread_time() - cpu)
                assert report.ok, report.errors
                counts.append(len(requests))
                verbs = _verbs(requests)
            report, scale = fleet.tick(queue=2)
            assert report.ok, report.errors
        finally:
            fleet.close()
    return {"models": models, "pools": 3, "namespaces": namespaces,
            "steady_requests": statistics.median(counts), "steady_by_verb": dict(sorted(verbs.items())),
            "scale_requests": len(scale), "scale_by_verb": dict(sorted(_verbs(scale).items())),
            "tick_wall_s": round(statistics.median(walls), 4), "tick_cpu_s": round(statistics.median(cpus), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--namespaces", type=int, default=1)
    ap.add_argument("--ticks", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    kube = KubePeer().start()
    try:
        rows = [run(kube, n, args.namespaces, args.ticks) for n in args.models]
    finally:
        kube.stop()
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(f"{r['models']} models x {r['pools']} pools, {r['namespaces']} namespace(s): "
              f"steady tick {r['steady_requests']:g} requests {r['steady_by_verb']}, "
              f"scale tick {r['scale_requests']} {r['scale_by_verb']}; "
              f"tick wall {r['tick_wall_s']:.3f} s, CPU {r['tick_cpu_s']:.3f} s")


if __name__ == "__main__":
    main()
