"""What a replica pays for validating every policy file (README, "Sharding"): the policy store's
first reload of N one-model files (each read, parsed, validated), and a reload with nothing changed
(each read and hashed, none parsed), medians over ``--runs`` fresh stores.

    python bench/policy_reload.py [--models 1000] [--runs 3] [--json]

Why: a sharded replica validates every file, not only its buckets'; this says what that costs at
start and at every ``loop.policy_reload_s`` check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.policyfile import PolicyStore  # noqa: E402
from policies.base import Registry  # noqa: E402

POLICY = """apiVersion: tidegate/v1
kind: ScalingPolicy
metadata: {{name: {name}}}
spec:
  model: {name}
  bounds: {{min_replicas: 1, max_replicas: 8}}
  slo: {{p99_latency_ms: 2500, queue_depth_per_replica: 4}}
  rules: [{{kind: slo-guard}}]
"""


def measure(models: int, runs: int) -> dict[str, float | int]:
    registry = Registry.from_entry_points()
    names = [f"m{i:05d}" for i in range(models)]
    first, again = [], []
    with tempfile.TemporaryDirectory(prefix="tidegate-policies-") as tmp:
        folder = Path(tmp)
        for name in names:
            (folder / f"{name}.yaml").write_text(POLICY.format(name=name))
        for _ in range(runs):
            store = PolicyStore(registry, known_models=set(names))
            t = time.perf_counter()
            report = store.reload(folder)
            first.append(time.perf_counter() - t)
            if report.errors or len(store.policies()) != models:
                raise SystemExit(f"the generated policies did not load: {report.errors[:3]}")
            t = time.perf_counter()
            store.reload(folder)
            again.append(time.perf_counter() - t)
    return {"models": models, "runs": runs, "first_reload_s": round(statistics.median(first), 3),
            "unchanged_reload_s": round(statistics.median(again), 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=int, default=1000, help="policy files, one model each (default 1000)")
    ap.add_argument("--runs", type=int, default=3, help="fresh stores measured; medians reported (default 3)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.models < 1 or args.runs < 1:
        print("policy_reload: --models and --runs must be at least 1", file=sys.stderr)
        return 2
    out = measure(args.models, args.runs)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['models']} policy files: first reload (parse and validate all) {out['first_reload_s']} s, "
              f"reload with nothing changed {out['unchanged_reload_s']} s (medians of {out['runs']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
