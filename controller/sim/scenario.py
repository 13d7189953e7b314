"""Assemble a simulation from files: fleet (a ``DaemonConfig``), policy, service profile, workload,
spot behaviour. The simulator and the daemon share the fleet format, so an operator points
``tidegate simulate`` at the config the daemon runs with.

Paths to the shared data (``../shared/data``) are looked up relative to the repository root and the
current directory; nothing is copied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterable

import numpy as np
import yaml

from controller.config import DaemonConfig, SimulatedProviders
from controller.core.model import ModelSpec, PoolSpec
from controller.core.policy import EffectivePolicy
from controller.errors import ScenarioError  # re-exported: raised here
from controller.sim.engine import DEFAULT_EPOCH, EngineOptions, SimSetup, SloTargets
from controller.sim.service import SLO_ATTAINMENT, ReplicaProfile, default_profile_path, load_profile
from controller.sim.spot import DEFAULT_NOTICE_S, SpotModel, SpotTrace, load_spot_trace
from controller.sim.workload import (
    RateSeries,
    RequestTrace,
    TokenDistribution,
    Workload,
    peak_rate_per_s,
    read_azure_trace,
    read_rate_series,
)
from providers.registry import ProviderRegistry, installed

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
DEFAULT_TOKEN_TRACE = SHARED_DATA / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
EXAMPLES = Path(__file__).parent / "examples"
DEFAULT_TTFT_MS = 2000.0
DEFAULT_TPOT_MS = 100.0
"""SLO targets when the policy file states none: 2 s to first token, 100 ms per output token (at
least 10 tokens/s per user, faster than reading)."""


def load_fleet(path: str | Path, model: str | None = None) -> tuple[DaemonConfig, ModelSpec, dict[str, PoolSpec]]:
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ScenarioError(f"{path}: cannot read the fleet file: {e}") from e
    try:
        cfg = DaemonConfig.model_validate(doc)
    except Exception as e:  # pydantic ValidationError: show it as is
        raise ScenarioError(f"{path}: not a valid DaemonConfig:\n{e}") from e
    models = cfg.model_specs()
    if model is None:
        spec = next(iter(models.values()))
    else:
        if model not in models:
            raise ScenarioError(f"{path}: no model {model!r} (models: {sorted(models)})")
        spec = models[model]
    return cfg, spec, cfg.pool_specs()


def load_policy(path: str | Path, model: str) -> EffectivePolicy:
    from controller.policyfile import load_policy_files
    from policies.base import Registry

    res = load_policy_files([str(path)], Registry.from_entry_points())
    if res.errors:
        raise ScenarioError("policy file errors:\n" + "\n".join(f"  {e}" for e in res.errors))
    pol = res.policies.get(model)
    if pol is None:
        raise ScenarioError(f"{path}: no policy for model {model!r} (policies for: {sorted(res.policies)})")
    return pol


def load_profiles(model: ModelSpec, path: str | Path | None) -> dict[str, ReplicaProfile]:
    p = Path(path) if path is not None else default_profile_path(model.name)
    if p is None:
        raise ScenarioError(f"no service profile for model {model.name!r}: pass --profile PATH "
                            f"(shipped: {sorted(x.stem for x in (Path(__file__).parent / 'profiles').glob('*.yaml'))})")
    prof = load_profile(p)
    out: dict[str, ReplicaProfile] = {}
    for gpu in model.gpu_types:
        if gpu in prof.gpus:
            pr = prof.gpus[gpu]
            if pr.tp_degree != model.tp_degree:
                raise ScenarioError(f"profile {p} has TP {pr.tp_degree} for {gpu}, the model bundle TP {model.tp_degree}")
            out[gpu] = pr
    return out


def load_workload(path: str | Path, fmt: str, token_trace: str | Path | None = None, rate_bin_s: float = 60.0,
                  trace_start: datetime | None = None) -> Workload:
    path = Path(path)
    if not path.exists():
        raise ScenarioError(f"trace {path} does not exist")
    if fmt == "azure":
        start = None
        if trace_start is not None:
            start = np.datetime64(trace_start.astimezone(timezone.utc).replace(tzinfo=None), "ns")
        try:
            return read_azure_trace(path, start=start)
        except ValueError as e:
            raise ScenarioError(f"--trace-start: {e}" if trace_start is not None else str(e)) from e
    if trace_start is not None:
        raise ScenarioError(f"--trace-start applies to request traces (--format azure); the rate series {path} "
                            "keeps its leading bins as they are: drop the option")
    if fmt == "rate":
        tok_path = Path(token_trace) if token_trace is not None else DEFAULT_TOKEN_TRACE
        if not tok_path.exists():
            raise ScenarioError(f"a rate series needs token counts from a request trace: pass --token-trace PATH "
                                f"(default {DEFAULT_TOKEN_TRACE} is absent)")
        tokens: TokenDistribution = read_azure_trace(tok_path).tokens()
        return read_rate_series(path, tokens, bin_s=rate_bin_s)
    raise ScenarioError(f"unknown trace format {fmt!r} (azure, rate)")


def parse_spot_args(specs: Iterable[str], windows: Iterable[str], pools: dict[str, PoolSpec], model: ModelSpec,
                    seed: int, default_rate: float = 0.0,
                    providers: ProviderRegistry | None = None) -> dict[str, SpotModel]:
    """``POOL=PATH[@offset_s]`` or ``POOL=rate:X`` (interruptions per node-hour); windows
    ``POOL=START:END`` (seconds). Spot pools without a spec get ``default_rate``. Each pool's
    interruption notice is its provider's (``providers``: the installed ones by default)."""
    providers = providers or installed()
    traces: dict[str, tuple[SpotTrace | None, float]] = {}
    for s in specs:
        if "=" not in s:
            raise ScenarioError(f"--spot {s!r}: expected POOL=PATH[@offset_s] or POOL=rate:X")
        pool, what = s.split("=", 1)
        if pool not in pools:
            raise ScenarioError(f"--spot {s!r}: no pool {pool!r} (pools: {sorted(pools)})")
        if what.startswith("rate:"):
            try:
                traces[pool] = (None, float(what[5:]))
            except ValueError as e:
                raise ScenarioError(f"--spot {s!r}: bad rate") from e
            continue
        offset: float | None = None
        if "@" in what:
            what, off = what.rsplit("@", 1)
            offset = float(off)
        try:
            tr = load_spot_trace(what)
        except (OSError, ValueError) as e:
            raise ScenarioError(f"--spot {s!r}: {e}") from e
        traces[pool] = (tr.rolled(offset) if offset is not None else tr.start_at_first_capacity(), 0.0)
    wins: dict[str, list[tuple[float, float]]] = {}
    for w in windows:
        try:
            pool, span = w.split("=", 1)
            a, b = span.split(":", 1)
            wins.setdefault(pool, []).append((float(a), float(b)))
        except ValueError as e:
            raise ScenarioError(f"--unavailable {w!r}: expected POOL=START_S:END_S") from e
        if pool not in pools:
            raise ScenarioError(f"--unavailable {w!r}: no pool {pool!r}")
    out: dict[str, SpotModel] = {}
    for name in model.pools:
        spec = pools[name]
        if not spec.tier.is_spot and name not in wins:
            continue
        tr_rate: tuple[SpotTrace | None, float] = traces.get(name, (None, default_rate if spec.tier.is_spot else 0.0))
        notice_s = providers.notice_s(spec.provider)
        out[name] = SpotModel(notice_s=DEFAULT_NOTICE_S if notice_s is None else notice_s, trace=tr_rate[0],
                              scale_nodes=spec.max_nodes,
                              interruptions_per_node_hour=tr_rate[1], unavailable_windows=tuple(wins.get(name, ())),
                              seed=seed, pool=name)
    return out


@dataclass
class Scenario:
    """The inputs of a comparison: one setup, the policy, and how the load was scaled."""

    setup: SimSetup
    policy: EffectivePolicy | None
    cfg: DaemonConfig
    load_factor: float = 1.0
    notes: list[str] = field(default_factory=list)


def slo_from_policy(policy: EffectivePolicy | None, ttft_ms: float | None, tpot_ms: float | None) -> SloTargets:
    slo = policy.spec.slo if policy is not None else None
    ttft = ttft_ms if ttft_ms is not None else (slo.ttft_p99_ms if slo is not None and slo.ttft_p99_ms else DEFAULT_TTFT_MS)
    tpot = tpot_ms if tpot_ms is not None else (slo.tpot_ms if slo is not None and slo.tpot_ms else DEFAULT_TPOT_MS)
    return SloTargets(ttft / 1000.0, tpot / 1000.0)


def build_scenario(*, fleet: str | Path, trace: str | Path, fmt: str, policy: str | Path | None = None,
                   model: str | None = None, profile: str | Path | None = None, token_trace: str | Path | None = None,
                   rate_bin_s: float = 60.0, time_scale: float = 1.0, load_scale: float | None = None,
                   peak_replicas: float | None = None, duration_s: float | None = None, seed: int = 0,
                   spot: Iterable[str] = (), unavailable: Iterable[str] = (), ttft_ms: float | None = None,
                   tpot_ms: float | None = None, start: datetime | None = None,
                   options: EngineOptions | None = None, trace_start: datetime | None = None,
                   window_s: tuple[float, float] | None = None) -> Scenario:
    """``trace_start``: t = 0 of a request trace (default its first request). ``window_s``: simulate
    only ``[a, b)`` of the trace with t = 0 at ``a``, after the load is scaled, so the load factor of
    ``peak_replicas`` is the whole trace's and every window of it shares it."""
    cfg, mspec, pools = load_fleet(fleet, model)
    pol = load_policy(policy, mspec.name) if policy is not None else None
    profiles = load_profiles(mspec, profile)
    work = load_workload(trace, fmt, token_trace, rate_bin_s, trace_start)
    notes: list[str] = []
    if time_scale != 1.0:
        work = work.time_scale(time_scale)
    if duration_s is not None:
        work = work.head(duration_s)
    slo = slo_from_policy(pol, ttft_ms, tpot_ms)
    default_rate = cfg.providers.interruptions_per_node_hour if isinstance(cfg.providers, SimulatedProviders) else 0.0
    spot_models = parse_spot_args(spot, unavailable, pools, mspec, seed, default_rate)
    setup = SimSetup(model=mspec, pools=pools, profiles=profiles, workload=work, slo=slo, spot=spot_models,
                     seed=seed, epoch=start or DEFAULT_EPOCH, options=options or EngineOptions())
    factor = 1.0
    if peak_replicas is not None and load_scale is not None:
        raise ScenarioError("give --load-scale or --peak-replicas, not both")
    if peak_replicas is not None:
        if not peak_replicas > 0:
            raise ScenarioError(f"--peak-replicas must be > 0, got {peak_replicas:g}")
        if pol is not None and peak_replicas > pol.spec.bounds.max_replicas:
            notes.append(f"the busiest minute needs {peak_replicas:g} replicas and the policy allows at most "
                         f"{pol.spec.bounds.max_replicas} (bounds.max_replicas): no controller keeps the SLO there")
        ref = setup.reference_gpu()
        per = setup.rate_at_slo(ref)
        # "The peak" is the busiest one-minute rate: the per-replica rate at the SLO is a sustained
        # rate, a minute is the finest bin the rate series have (so both formats scale alike), and
        # it is what a one-minute rate() in Prometheus shows an autoscaler. Sub-minute bursts on
        # top of it are part of the workload, not of the scaling: on the Azure code hour they reach
        # ~3x the scaled peak for seconds, and the oracle needs up to 3x the replicas (48 of the
        # fleet's 72 for --peak-replicas 16) to serve them inside the TTFT target.
        peak = peak_rate_per_s(work, 60.0)
        fluid = setup.fluid_model(ref)
        best, sized = fluid.idle_attainment(slo.ttft_s, slo.tpot_s), fluid.attainable(slo.ttft_s, slo.tpot_s)
        if per <= 0:
            raise ScenarioError(
                f"cannot scale to {peak_replicas:g} replicas: only {100 * best:.1f} % of this trace's requests "
                f"meet the SLO (TTFT {1000 * slo.ttft_s:g} ms, TPOT {1000 * slo.tpot_s:g} ms) even on an idle "
                f"{ref} replica (a prefill alone outlasts the TTFT target, or a decode step the TPOT target): "
                "nothing to size a replica by; raise --ttft-ms (or --tpot-ms) to a target the model can meet")
        if peak <= 0:
            raise ScenarioError(f"cannot scale to {peak_replicas:g} replicas: the trace has no requests")
        if sized < SLO_ATTAINMENT:
            notes.append(f"only {100 * best:.1f} % of the requests meet the SLO even on an idle {ref} replica "
                         "(a prefill alone outlasts the TTFT target, or a decode step the TPOT target): "
                         f"capacity at the SLO is sized at {100 * sized:.1f} %; "
                         f"no controller can reach {100 * best:.1f} %")
        factor = peak_replicas * per / peak
        notes.append(f"load x{factor:.3f}: peak {peak:.2f} req/s (1-min) -> {peak * factor:.2f} req/s = "
                     f"{peak_replicas:g} x {per:.2f} req/s per {ref} replica at the SLO")
    elif load_scale is not None:
        factor = load_scale
    if factor != 1.0:
        rng = np.random.default_rng([seed, 0x10AD])
        work = work.load_scale(factor, rng) if isinstance(work, RequestTrace) else work.load_scale(factor)
        setup = SimSetup(model=mspec, pools=pools, profiles=profiles, workload=work, slo=slo, spot=spot_models,
                         seed=seed, epoch=start or DEFAULT_EPOCH, options=options or EngineOptions(), grid=setup.grid)
    if window_s is not None:
        a, b = window_s
        if not 0 <= a < b:
            raise ScenarioError(f"window [{a}, {b}) s: expected 0 <= start < end")
        setup = SimSetup(model=mspec, pools=pools, profiles=profiles, workload=work.window(a, b), slo=slo,
                         spot=spot_models, seed=seed, epoch=(start or DEFAULT_EPOCH) + timedelta(seconds=a),
                         options=options or EngineOptions(), grid=setup.grid, duration_s=b - a)
        notes.append(f"window [{a:g}, {b:g}) s of the trace, t = 0 at {a:g} s")
    return Scenario(setup, pol, cfg, factor, notes)


def capacity_table(setup: SimSetup) -> list[dict[str, float | str]]:
    """Per GPU type: what one replica sustains for this workload's token mix (max, and at the SLO)."""
    rows: list[dict[str, float | str]] = []
    assert setup.grid is not None
    for gpu in sorted({setup.pools[n].gpu_type for n in setup.model.pools}):
        m = setup.fluid_model(gpu)
        r = setup.rate_at_slo(gpu)
        rows.append({"gpu_type": gpu, "max_requests_per_s": round(m.max_rate_per_s, 3),
                     "requests_per_s_at_slo": round(r, 3),
                     "output_tokens_per_s_at_slo": round(r * setup.grid.mean_output, 1),
                     "mean_prompt_tokens": round(setup.grid.mean_prompt, 1),
                     "mean_output_tokens": round(setup.grid.mean_output, 1)})
    return rows


def parse_start(text: str | None) -> datetime | None:
    if text is None:
        return None
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt


def span_hours(w: Workload) -> float:
    return w.duration_s / 3600.0 if not math.isnan(w.duration_s) else 0.0


__all__ = ["Scenario", "ScenarioError", "build_scenario", "capacity_table", "load_fleet", "load_policy",
           "load_profiles", "load_workload", "parse_spot_args", "slo_from_policy", "SHARED_DATA", "EXAMPLES",
           "RateSeries"]
