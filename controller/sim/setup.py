"""What one run of the simulated world is made of, as values: the model, its pools, service
profiles, workload, SLO, spot behaviour, live prices, seed, epoch and the engine's knobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

import numpy as np

from controller.core.model import ModelSpec, PoolSpec
from controller.sim.prices import SpotPriceWalk
from controller.sim.service import FluidReplicaModel, ReplicaProfile, SteadyState, TokenGrid
from controller.sim.spot import SpotModel
from controller.sim.workload import RateSeries, RequestTrace, Workload
from providers.cloudpool import CloudPoolSettings

FluidEntry = tuple[SteadyState, float, float, float, np.ndarray, np.ndarray, np.ndarray, float]
"""One replica's steady state at a rate: state, attainment (both / TTFT / TPOT), TTFT, e2e and TPOT
histogram shapes, p99 e2e (``serving.Serving._fluid_entry``)."""

DEFAULT_EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)
"""Simulated time 0 when the workload has no date of its own (a Monday, 00:00 UTC)."""


@dataclass(frozen=True)
class SloTargets:
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class EngineOptions:
    """Knobs of the simulated world (seconds unless named otherwise)."""

    mode: Literal["auto", "requests", "fluid"] = "auto"
    max_requests: int = 2_000_000
    """``auto`` replays rate series request by request only below this many expected requests."""
    scrape_interval_s: float = 15.0
    """Prometheus scrape interval: how old the signals controllers see can be."""
    rate_window_s: float = 60.0
    """Window of rate() and histogram_quantile() over the scraped series."""
    request_timeout_s: float = 60.0
    """A request waiting this long in the gateway queue is dropped (a client timeout)."""
    fluid_step_s: float = 5.0
    record_points: int = 1500
    """Timeline resolution: about this many points over the run."""
    run_stats: bool = True
    """Keep the whole run's latency histograms (the summary's attainment and percentiles, the
    timeline's p99s). ``False`` for the daemon's world, which is only observed through its scrapes:
    five 2.5 KB histograms a model it would never read. A run without them has no summary."""
    onprem_cost: Literal["used", "always"] = "used"
    ca_scan_interval_s: float = 10.0
    """cluster-autoscaler --scan-interval default."""
    ca_unneeded_s: float = 600.0
    """cluster-autoscaler --scale-down-unneeded-time default (10 min)."""
    ca_backoff_s: float = 300.0
    """cluster-autoscaler --initial-node-group-backoff-duration default (5 min) after a failed scale-up."""
    capacity_unavailable_s: float = CloudPoolSettings.model_fields["capacity_unavailable_s"].default
    """A spot launch that finds no capacity marks the pool unavailable for this long (then until the
    capacity is back), as the AWS and GCP pools' ``capacity_unavailable_s`` and Karpenter's
    ``launch_failure_unavailable_s`` do (both 180 s by default). Cleared as soon as the capacity came
    back, a pool whose capacity covered only part of an order was offered again at the next
    decision, ordered again past it, and marked again: the desired count of the pool flipped every
    tick."""
    drain_s: float = 600.0
    interruption_window_s: float = 3600.0
    progress: bool | None = None
    """Show a progress bar (tqdm) on stderr; ``None``: only for runs longer than a few seconds."""
    initial_replicas: int | None = None
    """Equal terms: every controller starts from this many replicas on the on-prem pools (filled in
    the model's pool order), ready at t = 0, as a Deployment at its minimum would be (pass the
    policy's ``min_replicas``). ``None``: each controller's own ``initial`` fleet, sized for the
    busiest minute of the first ten minutes."""


@dataclass
class SimSetup:
    """Everything one run needs, as values."""

    model: ModelSpec
    pools: dict[str, PoolSpec]
    profiles: dict[str, ReplicaProfile]
    """Per GPU type."""
    workload: Workload
    slo: SloTargets
    spot: dict[str, SpotModel] = field(default_factory=dict)
    seed: int = 0
    epoch: datetime = DEFAULT_EPOCH
    options: EngineOptions = field(default_factory=EngineOptions)
    duration_s: float | None = None
    """Simulated span (default: the workload's)."""
    grid: TokenGrid | None = None
    """Token mix for the fluid model and capacity figures (default: from the workload)."""
    spot_prices: dict[str, SpotPriceWalk] = field(default_factory=dict)
    """Live spot prices per pool (the pool states report them and billing uses them); pools
    without one bill and report their static price."""
    _fluid: dict[str, FluidReplicaModel] = field(default_factory=dict, repr=False)
    _pooled: dict[tuple[str, int, bool], float] = field(default_factory=dict, repr=False)
    _fluid_entries: dict[tuple[str, int | None], FluidEntry] = field(default_factory=dict, repr=False)
    """The fluid service's steady states and latency shapes per (GPU type, rate on its grid): a
    memo of the fluid models and the SLO, shared by every run of this setup (and by the models of
    one world that share their fluid models: ``world.Shared``)."""

    def __post_init__(self) -> None:
        for name in self.model.pools:
            if name not in self.pools:
                raise ValueError(f"model {self.model.name} has a deployment in pool {name!r}, which the fleet lacks")
        for name in self.model.pools:
            gpu = self.pools[name].gpu_type
            if gpu not in self.profiles:
                raise ValueError(f"no service profile for GPU type {gpu!r} (pool {name}); have {sorted(self.profiles)}")
        if self.grid is None:
            tokens = self.workload.tokens if isinstance(self.workload, RateSeries) else self.workload.tokens()
            pp, oo = tokens.quantile_grid(64)
            self.grid = TokenGrid(pp, oo)

    @property
    def span_s(self) -> float:
        if self.duration_s is not None:
            return self.duration_s
        return self.workload.duration_s

    def fluid_model(self, gpu: str) -> FluidReplicaModel:
        m = self._fluid.get(gpu)
        if m is None:
            assert self.grid is not None
            m = FluidReplicaModel(self.profiles[gpu], self.grid)
            self._fluid[gpu] = m
        return m

    def rate_at_slo(self, gpu: str) -> float:
        """Requests/s one replica on ``gpu`` sustains at the SLO (99 % attainment) for this mix."""
        return self.fluid_model(gpu).rate_at_slo(self.slo.ttft_s, self.slo.tpot_s)

    def pool_rate_at_slo(self, gpu: str, replicas: int, shared_queue: bool = False) -> float:
        """Requests/s one replica on ``gpu`` sustains at the SLO as one of ``replicas`` serving
        together behind the gateway (``service.prefill_wait``); ``shared_queue``: with one queue
        for all, the most any routing gets. Memoized."""
        key = (gpu, int(replicas), shared_queue)
        r = self._pooled.get(key)
        if r is None:
            r = self.fluid_model(gpu).rate_at_slo(self.slo.ttft_s, self.slo.tpot_s, replicas=int(replicas),
                                                  shared_queue=shared_queue)
            self._pooled[key] = r
        return r

    def engine_mode(self) -> Literal["requests", "fluid"]:
        """How the engine serves this run: request by request (``service.Replica`` behind the
        gateway) or as flows (``service.FluidReplicaModel``, each replica on its own)."""
        mode = self.options.mode
        if mode != "auto":
            return mode
        w = self.workload
        if isinstance(w, RequestTrace):
            return "requests" if len(w) <= self.options.max_requests else "fluid"
        return "requests" if w.head(self.span_s).expected_requests <= self.options.max_requests else "fluid"

    def reference_gpu(self) -> str:
        """The GPU type of the first on-prem pool (else of the model's first pool): what "N
        replicas" means when scaling load to a peak and in the demand models."""
        pools = self.model_pools()
        return next((p.gpu_type for p in pools if p.tier.is_onprem), pools[0].gpu_type)

    def model_pools(self) -> list[PoolSpec]:
        return [self.pools[n] for n in self.model.pools]
