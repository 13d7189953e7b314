"""Fit a mix-free capacity (prefill and decode tokens/s per replica at the SLO) to a service profile.

Why: a fleet file states one replica's capacity once for every workload; ``controller.core.capacity``
turns ``prefill_tokens_per_s`` and ``decode_tokens_per_s`` into the capacity for whatever token mix
is observed (``P / prefill + O / decode`` replica-seconds per request) and corrects it online. This
prints the least-squares fit (on 1 / requests per second) of those two numbers to the simulator's
fluid model (``FluidReplicaModel.rate_at_slo``) over eight mixes with exponentially distributed
lengths, and how far the fit is from the model at each mix:

    python bench/fit_capacity.py [--profile controller/sim/profiles/llama3-70b-fp8.yaml] [--ttft-ms 1500] [--tpot-ms 100]
        [--replicas N]

``--replicas N``: fit what one replica sustains as one of ``N`` behind the gateway
(``service.prefill_wait``; the default 1, a lone replica, is what the example fleet states).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.sim.service import FluidReplicaModel, TokenGrid, load_profile  # noqa: E402

MIXES = ((2047, 28), (1000, 250), (500, 500), (200, 1000), (4000, 50), (128, 128), (1500, 100), (3000, 300))
"""(mean prompt, mean output) tokens: the Azure code trace's mix and a spread around it."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=str(Path(__file__).resolve().parents[1] / "controller/sim/profiles/llama3-70b-fp8.yaml"))
    ap.add_argument("--ttft-ms", type=float, default=1500.0)
    ap.add_argument("--tpot-ms", type=float, default=100.0)
    ap.add_argument("--replicas", type=int, default=1, help="one of N replicas behind the gateway (default 1: alone)")
    args = ap.parse_args(argv)
    prof = load_profile(args.profile)
    for gpu, pr in prof.gpus.items():
        rows = []
        for p_mean, o_mean in MIXES:
            rng = np.random.default_rng(0)
            p = np.maximum(1, rng.exponential(p_mean, 200))
            o = np.maximum(1, rng.exponential(o_mean, 200))
            p *= p_mean / p.mean()
            o *= o_mean / o.mean()
            rows.append((p_mean, o_mean, FluidReplicaModel(pr, TokenGrid(p, o)).rate_at_slo(
                args.ttft_ms / 1000, args.tpot_ms / 1000, replicas=args.replicas)))
        a = np.array([[pm * r, om * r] for pm, om, r in rows])
        x, *_ = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)
        print(f"{gpu}: prefill_tokens_per_s {1 / x[0]:.0f}, decode_tokens_per_s {1 / x[1]:.0f}")
        for pm, om, r in rows:
            fit = 1 / (pm * x[0] + om * x[1])
            print(f"  {pm:>5}/{om:<5} model {r:7.3f} req/s, fit {fit:7.3f} req/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
