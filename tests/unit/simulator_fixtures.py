"""Small, self-contained simulator scenarios for the ``test_simulator_*`` tests (no shared data).

A fleet of one on-prem node (4 replicas of a TP=2 model on 8 H100), two spot pools and one
on-demand pool, the shipped llama3-70b-fp8 service profile, a fixed token mix, and rate series
built from a list of per-minute rates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from controller.core.model import ModelSpec, Tier, PoolSpec, ReplicaCapacity
from controller.core.policy import EffectivePolicy
from controller.core.spec import SLO, Bounds, Budget, CapacityLearning, PolicySpec, RuleSpec
from controller.sim.engine import EngineOptions, SimSetup, SloTargets
from controller.sim.service import PROFILES_DIR, FluidReplicaModel, TokenGrid, load_profile
from controller.sim.spot import SpotModel
from controller.sim.workload import RateSeries, RequestTrace, TokenDistribution
from policies.base import Registry

PROFILE = load_profile(PROFILES_DIR / "llama3-70b-fp8.yaml")
TOKENS = TokenDistribution(np.array([400, 800, 1200, 1600, 2400, 3200]), np.array([20, 40, 60, 80, 120, 160]))
SLO_T = SloTargets(ttft_s=1.5, tpot_s=0.1)


def grid() -> TokenGrid:
    pp, oo = TOKENS.quantile_grid(6)
    return TokenGrid(pp, oo)


def rate_at_slo() -> float:
    return FluidReplicaModel(PROFILE.gpus["H100"], grid()).rate_at_slo(SLO_T.ttft_s, SLO_T.tpot_s)


def pools(onprem_nodes: int = 1) -> dict[str, PoolSpec]:
    return {
        "onprem": PoolSpec("onprem", Tier.ONPREM, "onprem", "H100", 8, onprem_nodes, 16.0),
        "aws-spot": PoolSpec("aws-spot", Tier.SPOT, "aws", "H100", 8, 2, 25.0, provisioning_delay_s=120),
        "gcp-spot": PoolSpec("gcp-spot", Tier.SPOT, "gcp", "H100", 2, 4, 7.5, provisioning_delay_s=90),
        "aws-od": PoolSpec("aws-od", Tier.ONDEMAND, "aws", "H100", 8, 2, 98.0, provisioning_delay_s=120),
    }


def model(pool_names: Sequence[str] = ("onprem", "aws-spot", "gcp-spot", "aws-od"), cold_start_s: float = 60.0) -> ModelSpec:
    r = rate_at_slo()
    return ModelSpec(name="llama3-70b-fp8", tp_degree=2, quantization="fp8", gpu_types=("H100",),
                     cold_start_s=cold_start_s,
                     capacity={"H100": ReplicaCapacity(output_tokens_per_s=r * float(TOKENS.mean_output), requests_per_s=r)},
                     pools=tuple(pool_names))


def rate_series(per_minute_rates_per_s: Sequence[float], bin_s: float = 60.0) -> RateSeries:
    return RateSeries("test", bin_s, np.asarray(per_minute_rates_per_s, dtype=float), TOKENS)


def step_trace(t0_s: float, end_s: float, rate_before: float, rate_after: float, seed: int = 1) -> RequestTrace:
    """Poisson arrivals at ``rate_before`` until ``t0_s``, then ``rate_after`` (tokens from TOKENS)."""
    rng = np.random.default_rng(seed)
    parts = []
    for a, b, r in ((0.0, t0_s, rate_before), (t0_s, end_s, rate_after)):
        n = rng.poisson(r * (b - a))
        parts.append(np.sort(a + rng.random(n) * (b - a)))
    t = np.concatenate(parts)
    p, o = TOKENS.sample(len(t), rng)
    return RequestTrace("step", t, p, o)


def long_prompt_trace(rate_per_s: float, seconds: float, seed: int = 3) -> RequestTrace:
    """Poisson arrivals of 4-12k-token prompts with 5-40-token answers (log-uniform, like the
    ``long-prompts`` adversarial trace): prefill bound, one prompt takes 0.3-1.2 s of a 1.5 s TTFT."""
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(rate_per_s * seconds))
    t = np.sort(rng.random(n) * seconds)
    p = np.exp(rng.uniform(np.log(4000.0), np.log(12000.0), n)).astype(np.int64)
    o = np.exp(rng.uniform(np.log(5.0), np.log(40.0), n)).astype(np.int64)
    return RequestTrace("long-prompts", t, p, o)


def setup(workload: RateSeries | RequestTrace, *, pool_specs: dict[str, PoolSpec] | None = None,
          spot: dict[str, SpotModel] | None = None, seed: int = 0, mode: str = "auto",
          duration_s: float | None = None, cold_start_s: float = 60.0, own_mix: bool = False,
          **opts: object) -> SimSetup:
    """``own_mix``: the fluid model's token mix from ``workload`` (default: TOKENS's)."""
    ps = pool_specs or pools()
    return SimSetup(model=model(tuple(ps), cold_start_s), pools=ps, profiles={"H100": PROFILE.gpus["H100"]},
                    workload=workload, slo=SLO_T, spot=spot or {}, seed=seed,
                    options=EngineOptions(mode=mode, progress=False, **opts),  # type: ignore[arg-type]
                    duration_s=duration_s, grid=None if own_mix else grid())


def policy(min_replicas: int = 1, max_replicas: int = 16, learn: bool = True, **slo_guard: object) -> EffectivePolicy:
    reg = Registry.from_entry_points()
    # GPU utilization (DCGM_FI_DEV_GPU_UTIL, time with a kernel running) reads ~100 % whenever a
    # continuous-batching replica holds any request, so it cannot size an LLM fleet: off.
    params = {"capacity_fraction": 0.8, "gpu_utilization_target_pct": None, **slo_guard}
    spec = PolicySpec(model="llama3-70b-fp8", bounds=Bounds(min_replicas=min_replicas, max_replicas=max_replicas),
                      slo=SLO(ttft_p99_ms=1500, tpot_ms=100, p99_latency_ms=20000, queue_depth_per_replica=4),
                      rules=(RuleSpec(kind="slo-guard", params=params),), budget=Budget(),
                      capacity=CapacityLearning(learn=learn))
    rule = reg.build("slo-guard", params)
    return EffectivePolicy(model="llama3-70b-fp8", spec=spec, rules=(rule,), version="test")


def write_azure_csv(path: Path, trace: RequestTrace) -> Path:
    base = np.datetime64("2023-11-16T18:00:00.0000000")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for t, p, o in zip(trace.arrival_s, trace.prompt_tokens, trace.output_tokens):
        ts = base + np.timedelta64(int(round(t * 1e7)) * 100, "ns")
        s = str(ts).replace("T", " ")
        lines.append(f"{s}0,{int(p)},{int(o)}")
    path.write_text("\n".join(lines) + "\n")
    return path
