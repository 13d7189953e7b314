"""Scale-in placement speed: the exact split against the greedy one, on large spot fleets.

Why: a scale-in empties the nodes that save the most (``controller.core.placement``); the exact
search over the splits grows with the square of the replicas taken, so above ``EXACT_SCALE_IN``
replicas in a tier the greedy split takes over. This prints, per fleet size, the milliseconds of
``place()`` (the least of five), of the exact search alone on the same pools, their ratio, and the
cost per hour each leaves.

    python bench/scale_in.py [--replicas 32 100 1000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.core import placement as pl  # noqa: E402
from controller.core.model import ModelSpec, PoolSpec, PoolState, ReplicaCapacity, Tier  # noqa: E402
from controller.core.spec import Placement  # noqa: E402


def _fleet(n: int) -> tuple[ModelSpec, dict[str, PoolSpec], dict[str, PoolState]]:
    pools = {f"spot-{i}": PoolSpec(name=f"spot-{i}", tier=Tier.SPOT, provider="aws", gpu_type="H100", gpus_per_node=8,
                                   max_nodes=10_000, price_per_node_hour_usd=24.0 + i) for i in range(4)}
    model = ModelSpec(name="m", tp_degree=2, quantization="fp8", gpu_types=("H100",), cold_start_s=180,
                      capacity={"H100": ReplicaCapacity(100.0, 2.0)}, pools=tuple(pools))
    held = [n // 4 + (i + 1) for i in range(4)]  # partly filled last nodes
    states = {name: PoolState(pool=name, replicas=r, ready_replicas=r) for name, r in zip(pools, held)}
    return model, pools, states


def _best_ms(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return 1000 * best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[32, 100, 1000])
    args = ap.parse_args(argv)
    print(f"scale-in of half the replicas over 4 spot pools (exact up to {pl.EXACT_SCALE_IN} in a tier)")
    print(f"{'replicas':>8} {'place() ms':>11} {'exact ms':>9} {'exact/place':>11} {'$/h place':>10} {'$/h exact':>10}")
    for n in args.replicas:
        model, pools, states = _fleet(n)
        total = sum(s.replicas or 0 for s in states.values())
        res = pl.place(model=model, pools=pools, states=states, total=total - total // 2,
                       placement=Placement(spot_spread_min_pools=1))
        t_place = _best_ms(lambda: pl.place(model=model, pools=pools, states=states, total=total - total // 2,
                                            placement=Placement(spot_spread_min_pools=1)))

        def exact() -> list[pl._Pool]:
            views = [pl._Pool(name, pools[name], states[name], model) for name in pools]
            for v in views:
                v.replicas = states[v.name].replicas or 0
            for v, k in zip(views, pl._cheapest_split(views, total // 2)):
                v.replicas -= k
            return views

        t_exact = _best_ms(exact, repeat=1 if n > 200 else 5)
        cost_exact = sum(v.cost() for v in exact())
        print(f"{total:>8} {t_place:>11.2f} {t_exact:>9.1f} {t_exact / t_place:>11.0f} "
              f"{res.cost_per_hour_usd:>10.2f} {cost_exact:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
