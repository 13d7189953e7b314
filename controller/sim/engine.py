"""The simulator's event loop: a workload, a fleet of pools, and one controller, on a simulated clock.

What the world does, in the order a replica lives through it:

- A controller sets the desired replicas of each pool at its own interval: the daemon's
  ``controller.controller.Controller`` over this module's providers (``SimClock``, ``SimMetrics``,
  one ``SimPool`` per pool, a ``MemoryRecorder``), deciding with tidegate's ``decide`` or with a
  baseline's decision function (``Baseline``). Pods are created Pending and bound to ready nodes with free GPUs (TP GPUs per pod,
  never across nodes, fullest node first); a bound pod becomes ready ``cold_start_s`` later.
- Nodes: on-prem pools own ``max_nodes`` nodes from the start. Cloud nodes are ordered either by
  the controller itself (``node_mode = "direct"``: tidegate and SkyServe resize node groups to
  the nodes the controller's ``scale`` asks for and release empty nodes at once) or by an emulated Kubernetes cluster-autoscaler (``"autoscaler"``:
  every ``ca_scan_interval_s`` it orders nodes for Pending pods and removes nodes empty for
  ``ca_unneeded_s``, the cluster-autoscaler defaults 10 s and 10 min). A node is schedulable
  ``provisioning_delay_s`` after it is ordered; on spot, the order fails while the spot model
  says the pool is out of capacity, and the pool reads as unavailable until capacity returns.
- Spot interruptions (``spot.SpotModel``): a notice, then the node vanishes ``notice_s`` later
  (AWS 120 s, GCP 30 s). Its pods' requests go back to the front of the gateway queue (the client
  retries) and the pods are recreated Pending in the same pool, as a Deployment does.
- Scale-in removes Pending pods first, then pods on noticed nodes, then starting ones (newest
  first), then ready pods on the emptiest nodes; ready pods drain (finish what they hold) first.

Requests: in *request* mode every request is routed from a FIFO gateway queue to the least-loaded
ready replica with room (``service.Replica``: continuous batching, KV reservation); a request that
waits longer than ``request_timeout_s`` in the gateway is dropped. In *fluid* mode (long rate
series) the same replicas are served as flows every ``fluid_step_s`` with ``service.FluidReplicaModel``
and the gateway backlog is a FIFO of per-step buckets. ``mode="auto"`` replays request traces
request by request and switches rate series to fluid when they would hold too many requests.

Observations: every ``scrape_interval_s`` a Prometheus-like scrape records the gauges (queue depth,
GPU utilization over the interval, request and token rates and p99 latency over the last
``rate_window_s``); controllers see the last scrape (as the daemon reads Prometheus) plus the live
pool state (as it reads Kubernetes and the clouds). Everything random is seeded: a run is a pure
function of its inputs and seed.

Cost: cloud nodes are billed from order to release (provisioning included); on-prem nodes at their
amortized price while they hold a pod (``onprem_cost="used"``) or all the time (``"always"``).
Controllers see the cost per million tokens the daemon shows: the Controller prices it
(``controller.core.pricing``) from the pools' replicas and the scraped token rate, with the function
the budget prices placements with. Billing stops at the end of the workload; requests still in
flight then are served to completion (up to ``drain_s``) for the latency figures.
"""

from __future__ import annotations

import heapq
import math
import time as _wall
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence

import numpy as np

from controller.controller import Controller, DecisionFunction
from controller.core.model import (
    Action,
    ActionStatus,
    Decision,
    History,
    ModelSignals,
    ModelSpec,
    Override,
    PoolSpec,
    PoolState,
    Sample,
)
from controller.core.policy import EffectivePolicy
from controller.core.pricing import S_PER_HOUR, pool_price, usd_per_million_tokens
from controller.core.signals import model_signal_names
from controller.sim.service import (
    TAIL_U,
    TAIL_W,
    FluidReplicaModel,
    Replica,
    ReplicaProfile,
    RequestBook,
    SteadyState,
    TokenGrid,
)
from controller.sim.spot import SpotModel
from controller.sim.workload import RateSeries, RequestTrace, Workload

INF = math.inf
DEFAULT_EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)
"""Simulated time 0 when the workload has no date of its own (a Monday, 00:00 UTC)."""

# pod states
P_PENDING, P_STARTING, P_READY, P_DRAINING, P_GONE = range(5)
# node states
N_PROV, N_READY, N_GONE = range(3)
# event kinds
EV_CTRL, EV_SCRAPE, EV_RECORD, EV_NODE_READY, EV_POD_READY, EV_NOTICE, EV_NODE_GONE, EV_CAP, EV_CA, \
    EV_REPLICA, EV_FLUID, EV_END = range(12)

# latency histograms (fluid mode and timelines): log-spaced seconds
HIST_LO_S, HIST_HI_S, HIST_BINS = 1e-3, 1e5, 320
_HIST_EDGES = np.logspace(math.log10(HIST_LO_S), math.log10(HIST_HI_S), HIST_BINS + 1)
HIST_MID_S = np.sqrt(_HIST_EDGES[:-1] * _HIST_EDGES[1:])
_LOG_LO = math.log10(HIST_LO_S)
_BINS_PER_DECADE = HIST_BINS / (math.log10(HIST_HI_S) - _LOG_LO)


_NOT_SCRAPED = Sample.missing("NotScrapedYet")


def percentile(values: np.ndarray, q: float) -> float:
    """``np.percentile(values, q)`` (its default linear method) for a non-empty 1-D float array
    without NaN, bit for bit, 8 to 20 times faster (50 to 3,000 values; 1.7-5.7 us against 34-46
    us on the 2-core development machine): the scrape takes one per interval and the
    timeline one per point, and numpy's general machinery (axes, methods, NaN checks) costs far
    more than the partition itself. Same index, weight and interpolation arithmetic as numpy 1.26's
    ``_quantile`` / ``_lerp``; ``tests/unit/test_simulator_engine.py`` holds them equal."""
    n = len(values)
    v = (n - 1) * (q / 100.0)
    if v >= n - 1:
        return float(values.max())
    i = math.floor(v)
    g = v - i
    part = np.partition(values, (i, i + 1))
    a, b = part[i], part[i + 1]
    d = b - a
    return float(b - d * (1 - g)) if g >= 0.5 else float(a + d * g)


def hist_index(values_s: np.ndarray) -> np.ndarray:
    idx = ((np.log10(np.maximum(values_s, HIST_LO_S)) - _LOG_LO) * _BINS_PER_DECADE).astype(np.int64)
    return np.clip(idx, 0, HIST_BINS - 1)


def hist_quantile(hist: np.ndarray, q: float) -> float:
    total = hist.sum()
    if total <= 0:
        return math.nan
    c = np.cumsum(hist)
    i = int(np.searchsorted(c, q * total, side="left"))
    return float(HIST_MID_S[min(i, HIST_BINS - 1)])


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
    onprem_cost: Literal["used", "always"] = "used"
    ca_scan_interval_s: float = 10.0
    """cluster-autoscaler --scan-interval default."""
    ca_unneeded_s: float = 600.0
    """cluster-autoscaler --scale-down-unneeded-time default (10 min)."""
    ca_backoff_s: float = 300.0
    """cluster-autoscaler --initial-node-group-backoff-duration default (5 min) after a failed scale-up."""
    drain_s: float = 600.0
    interruption_window_s: float = 3600.0
    progress: bool | None = None
    """Show a progress bar (tqdm) on stderr; ``None``: only for runs longer than a few seconds."""


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
    _fluid: dict[str, FluidReplicaModel] = field(default_factory=dict, repr=False)

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

    def model_pools(self) -> list[PoolSpec]:
        return [self.pools[n] for n in self.model.pools]


@dataclass(frozen=True)
class Observation:
    """What a controller sees at a tick."""

    now_s: float
    at: datetime
    signals: ModelSignals
    """The last scrape's samples and the live pool states (as ``decide`` takes them)."""
    requests_in_window: int
    """Requests that arrived in the last ``rate_window_s`` (a load balancer's own count)."""
    pending_by_pool: Mapping[str, int]
    ready_by_pool: Mapping[str, int]
    desired_by_pool: Mapping[str, int]


class Autoscaler(Protocol):
    """A scaling algorithm under test: tidegate's pipeline or a baseline. It runs as a
    ``controller.controller.Controller`` over the simulation's providers (``controller()``), the
    same tick the daemon runs."""

    name: str
    interval_s: float
    node_mode: Literal["direct", "autoscaler"]

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        """Replicas per pool at time 0 (ready from the start: the fleet was already running).
        ``need`` is what the first minutes of load require at the SLO."""
        ...

    def controller(self, sim: "Simulation") -> Controller:
        """The tick, over ``sim``'s clock, metrics, pool providers and recorder (after ``initial``)."""
        ...


class Baseline:
    """A baseline is a decision function of what it can see (``decide(now_s, obs)``: desired
    replicas per pool, or ``None`` to leave everything as it is), run by the same ``Controller``
    as tidegate. Subclasses set ``name``, ``interval_s``, ``node_mode`` and write ``initial`` and
    ``decide``."""

    name: str
    interval_s: float
    node_mode: Literal["direct", "autoscaler"]

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        raise NotImplementedError

    def decide(self, now_s: float, obs: Observation) -> Mapping[str, int] | None:
        raise NotImplementedError

    def controller(self, sim: "Simulation") -> Controller:
        model = sim.model
        return sim.controller_for(model, {n: sim.setup.pools[n] for n in model.pools},
                                  _BaselineDecision(self, sim), policy=None)


class _BaselineDecision:
    """A baseline's ``decide(now_s, obs)`` as a ``DecisionFunction``: the placement it returns
    becomes a ``Decision`` (``actuate`` unless it returned ``None``)."""

    def __init__(self, baseline: Baseline, sim: "Simulation") -> None:
        self.baseline = baseline
        self.sim = sim
        self.reason = f"Baseline:{baseline.name}"

    def __call__(self, *, model: ModelSpec, signals: ModelSignals, history: History, now: datetime,
                 **_: object) -> Decision:
        obs = self.sim.observation(signals)
        placement = self.baseline.decide(obs.now_s, obs)
        previous = dict(obs.desired_by_pool)
        placed = previous if placement is None else {n: int(v) for n, v in placement.items()}
        return Decision(model=model.name, at=now, current_replicas=sum(previous.values()),
                        replicas=sum(placed.values()), placement=placed, previous_placement=previous,
                        recommendations=(), trace=(), reason=self.reason, actuate=placement is not None,
                        cost_per_hour_usd=0.0, history=history)


class SimClock:
    """The simulated clock as the ``Clock`` protocol."""

    def __init__(self, sim: "Simulation") -> None:
        self.sim = sim

    def now(self) -> datetime:
        return self.sim._dt(self.sim.now)


class SimMetrics:
    """The simulated Prometheus as a ``MetricsSource``: the last scrape's samples."""

    def __init__(self, sim: "Simulation") -> None:
        self.sim = sim

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        sig = self.sim.signals()
        return {m.name: sig for m in models if m.name == sig.model}


class SimPool:
    """One simulated pool as a ``PoolProvider``: its live state, and ``scale`` setting the desired
    replicas (and, for controllers that manage nodes, the nodes to hold)."""

    def __init__(self, sim: "Simulation", pool: PoolSpec) -> None:
        self.sim = sim
        self.pool = pool

    def state(self, model: ModelSpec, now: datetime) -> PoolState:
        return self.sim._pool_views(now)[0][self.pool.name]

    def scale(self, model: ModelSpec, replicas: int, nodes: int, now: datetime) -> Sequence[Action]:
        before = self.sim.scale_pool(self.pool.name, replicas, nodes)
        if before is None:
            return ()
        return (Action(provider="simulated", call="scale", pool=self.pool.name, model=model.name,
                       arguments={"replicas": replicas, "nodes": nodes, "from": before}, status=ActionStatus.OK),)


class MemoryRecorder:
    """The simulator's ``Recorder``: no overrides, an empty history at start, and counts of what
    was decided (``reasons``) instead of a decision log."""

    def __init__(self) -> None:
        self.decisions = 0
        self.reasons: dict[str, int] = {}

    def history(self, model: str, now: datetime, horizon_s: float) -> History:
        return History()

    def overrides(self, model: str, now: datetime) -> Sequence[Override]:
        return ()

    def decision(self, decision: Decision, signals: ModelSignals, dry_run: bool) -> int:
        self.decisions += 1
        self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        return self.decisions

    def outcome(self, decision_id: int, actions: Sequence[Action], outcome: str, detail: str | None) -> None:
        return None


class _Node:
    __slots__ = ("id", "pool", "state", "launched_s", "ready_s", "noticed", "gpus_used", "pods", "empty_since")

    def __init__(self, nid: int, pool: "_Pool", launched_s: float, ready_s: float, state: int) -> None:
        self.id = nid
        self.pool = pool
        self.state = state
        self.launched_s = launched_s
        self.ready_s = ready_s
        self.noticed = False
        self.gpus_used = 0
        self.pods: list[_Pod] = []
        self.empty_since = launched_s


class _Pod:
    __slots__ = ("id", "pool", "node", "state", "created_s", "ready_s", "replica", "gpu")

    def __init__(self, pid: int, pool: "_Pool", created_s: float) -> None:
        self.id = pid
        self.pool = pool
        self.node: _Node | None = None
        self.state = P_PENDING
        self.created_s = created_s
        self.ready_s = INF
        self.replica: Replica | None = None
        self.gpu = pool.spec.gpu_type


class _Pool:
    __slots__ = ("spec", "name", "onprem", "spot_pool", "tp", "per_node", "nodes", "pods", "desired", "spot",
                 "blocked", "blocked_reason", "backoff_until", "notices", "bill_n", "bill_t", "cost_usd",
                 "node_s", "launch_failures", "interrupted_nodes", "killed_pods", "want_nodes")

    def __init__(self, spec: PoolSpec, model: ModelSpec, spot: SpotModel | None) -> None:
        self.spec = spec
        self.name = spec.name
        self.onprem = spec.tier.is_onprem
        self.spot_pool = spec.tier.is_spot
        self.tp = model.tp_degree
        self.per_node = spec.replicas_per_node(model)
        self.nodes: list[_Node] = []
        self.pods: list[_Pod] = []
        self.desired = 0
        self.want_nodes = 0
        """Nodes the controller asked this pool to hold (``node_mode="direct"``)."""
        self.spot = spot
        self.blocked = False
        self.blocked_reason = ""
        self.backoff_until = -INF
        self.notices: deque[float] = deque()
        self.bill_n = 0
        self.bill_t = 0.0
        self.cost_usd = 0.0
        self.node_s = 0.0
        self.launch_failures = 0
        self.interrupted_nodes = 0
        self.killed_pods = 0

    def alive_nodes(self) -> list[_Node]:
        return [n for n in self.nodes if n.state != N_GONE]


@dataclass
class RunResult:
    """One run: the summary figures, the timeline, and what the run was."""

    controller: str
    summary: dict[str, Any]
    timeline: dict[str, Any]
    wall_s: float
    actions: list[tuple[float, str, int, int]] = field(default_factory=list)
    """(time s, pool, from, to) of every scaling action."""


class Simulation:
    """One controller, one workload, one fleet. ``run()`` once."""

    def __init__(self, setup: SimSetup, autoscaler: Autoscaler) -> None:
        self.setup = setup
        self.ctrl = autoscaler
        self.opt = setup.options
        self.model = setup.model
        self.end_s = float(setup.span_s)
        self.rng = np.random.default_rng([setup.seed, 0x51D])
        self.pools: dict[str, _Pool] = {}
        for name in self.model.pools:
            self.pools[name] = _Pool(setup.pools[name], self.model, setup.spot.get(name))
        # the providers a Controller sees (built in _start, after the autoscaler's initial fleet)
        self.clock = SimClock(self)
        self.metrics = SimMetrics(self)
        self.pool_providers = {name: SimPool(self, setup.pools[name]) for name in self.model.pools}
        self.recorder = MemoryRecorder()
        self.controller: Controller | None = None
        self._actuated = False
        self.heap: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.now = 0.0
        self.node_ids = 0
        self.pod_ids = 0
        self.ready_pods: list[_Pod] = []
        self.actions = 0
        self.action_log: list[tuple[float, str, int, int]] = []
        """(time, pool, from, to) of every change of a pool's desired replicas by the controller."""
        self.decisions = 0
        self.decisions_changed = 0
        self.controller_errors: list[str] = []
        self.version = 0
        """Bumped on every change of pods, nodes or pool availability: observations and
        reconciliation are recomputed only when it moved."""
        self.obs_version = -1
        self.obs_cache: tuple[dict[str, PoolState], dict[str, int], dict[str, int], dict[str, int]] | None = None
        self.obs_expiry = INF
        self.obs_at_s = -INF
        self.applied_version = -1
        self.scrape_samples: dict[str, Sample] = dict.fromkeys(model_signal_names(), _NOT_SCRAPED)
        """Every signal of the table: the last scrape's sample, or ``NotScrapedYet``."""
        self.killed_requests = 0
        self.mode = self._pick_mode()
        # workload as requests or flows
        self.book: RequestBook | None = None
        self.n_req = 0
        self.next_req = 0
        self.queue: deque[int] = deque()
        self.dropped = 0.0
        self.completed = 0
        self.cum_out_tokens = 0.0
        self.cum_in_tokens = 0.0
        self.recent_e2e: deque[tuple[float, float]] = deque()
        if self.mode == "requests":
            trace = setup.workload if isinstance(setup.workload, RequestTrace) else setup.workload.to_requests(
                np.random.default_rng([setup.seed, 0xA11]))
            trace = trace.head(self.end_s)
            self.trace: RequestTrace | None = trace
            self.book = RequestBook(trace.arrival_s.tolist(), trace.prompt_tokens.tolist(), trace.output_tokens.tolist())
            self.n_req = len(trace)
            self.arrivals = trace.arrival_s
        else:
            self.trace = None
            self.arrivals = np.empty(0)
        # fluid state
        self.backlog: deque[list[float]] = deque()
        self.fluid_arrived = 0.0
        self.fluid_served = 0.0
        self.fluid_ok = 0.0
        self.fluid_ok_ttft = 0.0
        self.fluid_ok_tpot = 0.0
        self.fluid_retried = 0.0
        self.fluid_hist_ttft = np.zeros(HIST_BINS)
        self.fluid_hist_e2e = np.zeros(HIST_BINS)
        self.fluid_hist_tpot = np.zeros(HIST_BINS)
        self.fluid_cache: dict[tuple[str, int | None], tuple[SteadyState, float, float, float, np.ndarray, np.ndarray, np.ndarray, float]] = {}
        self.fluid_groups: dict[str, tuple[float, SteadyState]] = {}
        self.fluid_queue = 0.0
        self.fluid_util = math.nan
        self.fluid_kv = math.nan
        self.fluid_p99: deque[tuple[float, float]] = deque()
        self.fluid_arrivals_log: deque[tuple[float, float]] = deque()
        self.fluid_log_sum = 0.0
        self.fluid_w: dict[tuple[str, int | None], float] = {}
        self.rec_w: dict[tuple[str, int | None], float] = {}
        self.fluid_gpu: dict[str, tuple[FluidReplicaModel, float, float]] = {}
        grid = setup.grid
        assert grid is not None
        self.mean_out = grid.mean_output
        self.mean_prompt = grid.mean_prompt
        if self.mode == "fluid":
            self._fluid_rate = self._make_fluid_rate()
            for gpu in {setup.pools[n].gpu_type for n in self.model.pools}:
                fmod = setup.fluid_model(gpu)
                self.fluid_gpu[gpu] = (fmod, fmod.max_rate_per_s * 0.999, fmod.mean_out)
        # metrics scrape state
        self.scrape: dict[str, float | None] = {}
        self.scrape_at = -INF
        self.scrape_busy: dict[int, float] = {}
        self.token_log: deque[tuple[float, float, float]] = deque()
        # timeline
        self.record_s = max(self.opt.scrape_interval_s, self._nice_interval(self.end_s / max(self.opt.record_points, 1)))
        self.tl: dict[str, list[Any]] = {"t_s": [], "arrivals_per_s": [], "cost_per_hour_usd": [], "queue_depth": [],
                                          "gpu_util_pct": [], "p99_e2e_s": [], "p99_ttft_s": []}
        for name in self.pools:
            self.tl[f"desired:{name}"] = []
            self.tl[f"ready:{name}"] = []
            self.tl[f"nodes:{name}"] = []
        self.rec_arrivals = 0.0
        self.rec_hist_ttft = np.zeros(HIST_BINS)
        self.rec_hist_e2e = np.zeros(HIST_BINS)
        self.progress: Any = None

    # ------------------------------------------------------------------ setup helpers
    def _pick_mode(self) -> str:
        mode = self.opt.mode
        if mode != "auto":
            return mode
        w = self.setup.workload
        if isinstance(w, RequestTrace):
            return "requests" if len(w) <= self.opt.max_requests else "fluid"
        return "requests" if w.head(self.end_s).expected_requests <= self.opt.max_requests else "fluid"

    @staticmethod
    def _nice_interval(x: float) -> float:
        for v in (15, 30, 60, 120, 300, 600, 900, 1800, 3600):
            if x <= v:
                return float(v)
        return 3600.0 * math.ceil(x / 3600.0)

    def _make_fluid_rate(self) -> Callable[[float], float]:
        w = self.setup.workload
        step = self.opt.fluid_step_s
        if isinstance(w, RateSeries):
            rates, bin_s = w.rate_per_s, w.bin_s

            def rate(t: float) -> float:
                i = int(t // bin_s)
                return float(rates[i]) if 0 <= i < len(rates) else 0.0
            return rate
        n = max(1, int(math.ceil(self.end_s / step)))
        counts = np.bincount(np.minimum((w.arrival_s / step).astype(np.int64), n - 1), minlength=n) / step

        def rate_t(t: float) -> float:
            i = int(t // step)
            return float(counts[i]) if 0 <= i < len(counts) else 0.0
        return rate_t

    def _dt(self, t_s: float) -> datetime:
        return self.setup.epoch + timedelta(seconds=t_s)

    def _push(self, t: float, kind: int, obj: Any = None, ver: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj, ver))

    # ------------------------------------------------------------------ billing
    def _billable(self, pool: _Pool) -> int:
        if pool.onprem:
            if self.opt.onprem_cost == "always":
                return pool.spec.max_nodes
            return sum(1 for n in pool.nodes if n.state != N_GONE and n.pods)
        return sum(1 for n in pool.nodes if n.state != N_GONE)

    def _bill(self, pool: _Pool) -> None:
        t = min(self.now, self.end_s)
        if t > pool.bill_t:
            dt = t - pool.bill_t
            pool.node_s += pool.bill_n * dt
            pool.cost_usd += pool.bill_n * dt * pool_price(pool.spec, None) / S_PER_HOUR
            pool.bill_t = t
        pool.bill_n = self._billable(pool)

    def cost_per_hour(self) -> float:
        return sum(p.bill_n * pool_price(p.spec, None) for p in self.pools.values())

    # ------------------------------------------------------------------ nodes and pods
    def _new_node(self, pool: _Pool, ready_s: float, state: int) -> _Node:
        self.version += 1
        self.node_ids += 1
        node = _Node(self.node_ids, pool, self.now, ready_s, state)
        pool.nodes.append(node)
        if state == N_PROV:
            self._push(ready_s, EV_NODE_READY, node)
        if pool.spot is not None and pool.spot_pool:
            life = pool.spot.draw_lifetime_s()
            if life < INF:
                self._push(self.now + life, EV_NOTICE, node)
        return node

    def _launch(self, pool: _Pool, count: int) -> int:
        """Order ``count`` nodes; returns how many the cloud accepted."""
        if count <= 0 or pool.onprem:
            return 0
        self.version += 1
        self._bill(pool)
        alive = [n for n in pool.nodes if n.state != N_GONE]
        room = pool.spec.max_nodes - len(alive)
        want = min(count, max(0, room))
        launched = 0
        if pool.spot is not None:
            cap = pool.spot.capacity_nodes(self.now)
            if cap is not None:
                live = sum(1 for n in alive if not n.noticed)
                allowed = max(0, cap - live)
                if allowed < want:
                    pool.launch_failures += want - allowed
                    pool.blocked = True
                    pool.blocked_reason = pool.spot.limit_reason(self.now)
                    want = allowed
        for _ in range(want):
            self._new_node(pool, self.now + pool.spec.provisioning_delay_s, N_PROV)
            launched += 1
        if launched and pool.blocked and launched == count:
            pool.blocked = False
        self._bill(pool)
        return launched

    def _release_node(self, node: _Node) -> None:
        self.version += 1
        pool = node.pool
        self._bill(pool)
        node.state = N_GONE
        for pod in list(node.pods):
            self._kill_pod(pod, recreate=False)
        pool.nodes.remove(node)
        self._bill(pool)

    def _bind(self, pool: _Pool) -> None:
        pending = [p for p in pool.pods if p.state == P_PENDING]
        if not pending:
            return
        tp = pool.tp
        cap = pool.spec.gpus_per_node
        nodes = [n for n in pool.nodes if n.state == N_READY and not n.noticed and cap - n.gpus_used >= tp]
        if not nodes:
            return
        changed = False
        cold = self.model.cold_start_s
        for pod in pending:
            best: _Node | None = None
            for n in nodes:
                if cap - n.gpus_used >= tp and (best is None or n.gpus_used > best.gpus_used):
                    best = n
            if best is None:
                break
            if not best.pods:
                changed = True
            self.version += 1
            best.gpus_used += tp
            best.pods.append(pod)
            pod.node = best
            pod.state = P_STARTING
            pod.ready_s = self.now + cold
            self._push(pod.ready_s, EV_POD_READY, pod)
        if changed and pool.onprem:
            self._bill(pool)

    def _pod_ready(self, pod: _Pod) -> None:
        self.version += 1
        if pod.state != P_STARTING:
            return
        pod.state = P_READY
        if self.mode == "requests":
            assert self.book is not None
            pod.replica = Replica(self.setup.profiles[pod.gpu], self.book, self.now)
        self.ready_pods.append(pod)
        if self.mode == "requests":
            self._dispatch()

    def _unbind(self, pod: _Pod) -> None:
        self.version += 1
        node = pod.node
        if node is None:
            return
        node.gpus_used -= pod.pool.tp
        node.pods.remove(pod)
        pod.node = None
        if not node.pods:
            node.empty_since = self.now
            if pod.pool.onprem:
                self._bill(pod.pool)

    def _requeue(self, reqs: list[int]) -> None:
        if not reqs:
            return
        assert self.book is not None
        book = self.book
        for r in reqs:
            book.retries[r] += 1
            book.first_token_s[r] = INF
        reqs.sort(key=lambda r: book.arrival_s[r])
        self.queue.extendleft(reversed(reqs))
        self.killed_requests += len(reqs)

    def _kill_pod(self, pod: _Pod, recreate: bool) -> None:
        """The pod's node vanished (or was released): its requests go back to the gateway."""
        self.version += 1
        if pod.state == P_GONE:
            return
        was_serving = pod.state in (P_READY, P_DRAINING)
        if pod.state in (P_READY, P_DRAINING, P_STARTING):
            pod.pool.killed_pods += 1
        if was_serving:
            if pod in self.ready_pods:
                self.ready_pods.remove(pod)
            if pod.replica is not None:
                self._requeue(pod.replica.kill(self.now))
                pod.replica = None
            elif self.mode == "fluid":
                self._fluid_lost(pod)
        self._unbind(pod)
        if recreate and pod.state != P_DRAINING:
            pod.state = P_PENDING
            pod.ready_s = INF
        else:
            pod.state = P_GONE
            pod.pool.pods.remove(pod)

    def _remove_pod(self, pod: _Pod) -> None:
        """Scale-in of one pod: Pending/starting ones go at once, ready ones drain first."""
        self.version += 1
        if pod.state == P_READY:
            self.ready_pods.remove(pod)
            if self.mode == "requests" and pod.replica is not None and pod.replica.in_flight > 0:
                pod.state = P_DRAINING
                return
        pod.state = P_GONE
        self._unbind(pod)
        pod.pool.pods.remove(pod)

    def _pod_drained(self, pod: _Pod) -> None:
        self.version += 1
        pool = pod.pool
        pod.state = P_GONE
        pod.replica = None
        self._unbind(pod)
        pool.pods.remove(pod)
        if self.ctrl.node_mode == "direct":
            self._reconcile_nodes(pool)

    def _set_desired(self, pool: _Pool, n: int) -> None:
        self.version += 1
        n = max(0, int(n))
        active = [p for p in pool.pods if p.state in (P_PENDING, P_STARTING, P_READY)]
        pool.desired = n
        if n > len(active):
            for _ in range(n - len(active)):
                self.pod_ids += 1
                pool.pods.append(_Pod(self.pod_ids, pool, self.now))
        elif n < len(active):
            k = len(active) - n
            for _ in range(k):
                victim = min(active, key=self._removal_key)
                active.remove(victim)
                self._remove_pod(victim)

    @staticmethod
    def _removal_key(p: _Pod) -> tuple[float, float, float]:
        if p.state == P_PENDING:
            return (0, -p.created_s, 0)
        if p.node is not None and p.node.noticed:
            return (1, -p.created_s, 0)
        if p.state == P_STARTING:
            return (2, -p.created_s, 0)
        active_on_node = sum(1 for q in p.node.pods if q.state in (P_STARTING, P_READY)) if p.node else 0
        held = p.replica.in_flight if p.replica is not None else 0
        return (3, active_on_node, held - p.created_s * 1e-9)

    def _reconcile_nodes(self, pool: _Pool) -> None:
        """Direct node management: hold the nodes the controller asked for (``nodes`` of its last
        ``scale``: every model's placement in this pool, at least ``min_nodes``) live; release
        empty surplus."""
        if pool.onprem:
            return
        need = pool.want_nodes
        live = [n for n in pool.nodes if n.state != N_GONE and not n.noticed]
        if len(live) < need:
            self._launch(pool, need - len(live))
        elif len(live) > need:
            surplus = len(live) - need
            cands = sorted((n for n in live if not n.pods),
                           key=lambda n: (n.state != N_PROV, -n.launched_s))
            for n in cands[:surplus]:
                self._release_node(n)
        # noticed nodes with nothing on them are of no use: release them now
        for n in [n for n in pool.nodes if n.noticed and n.state != N_GONE and not n.pods]:
            self._release_node(n)

    def _ca_scan(self) -> None:
        """cluster-autoscaler: order nodes for Pending pods, remove nodes empty long enough."""
        for pool in self.pools.values():
            if pool.onprem:
                continue
            pending = sum(1 for p in pool.pods if p.state == P_PENDING)
            if pending and self.now >= pool.backoff_until:
                free = 0
                for n in pool.nodes:
                    if n.state == N_PROV or (n.state == N_READY and not n.noticed):
                        free += (pool.spec.gpus_per_node - n.gpus_used) // pool.tp
                missing = pending - free
                if missing > 0 and pool.per_node > 0:
                    want = -(-missing // pool.per_node)
                    got = self._launch(pool, want)
                    if got < want:
                        pool.backoff_until = self.now + self.opt.ca_backoff_s
            for n in [n for n in pool.nodes if n.state == N_READY and not n.pods]:
                if n.noticed or self.now - n.empty_since >= self.opt.ca_unneeded_s:
                    self._release_node(n)

    # ------------------------------------------------------------------ spot
    def _notice(self, node: _Node) -> None:
        self.version += 1
        if node.state == N_GONE or node.noticed:
            return
        pool = node.pool
        node.noticed = True
        pool.notices.append(self.now)
        pool.interrupted_nodes += 1
        assert pool.spot is not None
        if node.state == N_PROV:
            # not booted yet: the launch simply fails
            self._release_node(node)
        else:
            self._push(self.now + pool.spot.notice_s, EV_NODE_GONE, node)
        if self.ctrl.node_mode == "direct":
            self._reconcile_nodes(pool)

    def _node_gone(self, node: _Node) -> None:
        self.version += 1
        if node.state == N_GONE:
            return
        pool = node.pool
        self._bill(pool)
        node.state = N_GONE
        for pod in list(node.pods):
            self._kill_pod(pod, recreate=True)
        pool.nodes.remove(node)
        self._bill(pool)
        self._bind(pool)
        if self.ctrl.node_mode == "direct":
            self._reconcile_nodes(pool)

    def _capacity_change(self, pool: _Pool) -> None:
        self.version += 1
        spot = pool.spot
        assert spot is not None
        cap = spot.capacity_nodes(self.now)
        if cap is not None and spot.trace_preempts:
            live = [n for n in pool.nodes if n.state != N_GONE and not n.noticed]
            excess = len(live) - cap
            if excess > 0:
                ties = spot.tie_break(len(live))
                order = sorted(range(len(live)), key=lambda i: (live[i].state != N_PROV, -live[i].launched_s, ties[i]))
                for i in order[:excess]:
                    self._notice(live[i])
        if pool.blocked and (cap is None or cap > sum(1 for n in pool.nodes if n.state != N_GONE and not n.noticed)):
            pool.blocked = False
            pool.backoff_until = -INF
            if self.ctrl.node_mode == "direct":
                self._reconcile_nodes(pool)
        nxt = spot.next_change_after(self.now)
        if nxt < self.end_s + self.opt.drain_s:
            self._push(nxt, EV_CAP, pool)

    # ------------------------------------------------------------------ request mode
    def _dispatch(self) -> None:
        q = self.queue
        if not q or not self.ready_pods:
            if q:
                self._drop_stale()
            return
        book = self.book
        assert book is not None
        arrival = book.arrival_s
        prompt = book.prompt
        output = book.output
        timeout = self.opt.request_timeout_s
        now = self.now
        ready = self.ready_pods
        while q:
            r = q[0]
            if now - arrival[r] > timeout:
                q.popleft()
                self.dropped += 1
                continue
            need_kv = prompt[r] + output[r]
            best = None
            best_load = 1 << 30
            for pod in ready:
                rep = pod.replica
                assert rep is not None
                s = rep.slots
                if s < best_load and s < rep.prof.max_batch and rep.kv_used + need_kv <= rep.prof.kv_cache_tokens:
                    best = pod
                    best_load = s
            if best is None:
                break
            q.popleft()
            rep = best.replica
            assert rep is not None
            rep.admit(r, now)
            self.cum_in_tokens += prompt[r]
            self._sched_replica(best)

    def _drop_stale(self) -> None:
        book = self.book
        assert book is not None
        q = self.queue
        while q and self.now - book.arrival_s[q[0]] > self.opt.request_timeout_s:
            q.popleft()
            self.dropped += 1

    def _sched_replica(self, pod: _Pod) -> None:
        rep = pod.replica
        assert rep is not None
        rep.version += 1
        t = rep.next_event_s()
        if t < INF:
            self._push(t, EV_REPLICA, pod, rep.version)

    def _replica_event(self, pod: _Pod, ver: int) -> None:
        rep = pod.replica
        if rep is None or ver != rep.version or pod.state not in (P_READY, P_DRAINING):
            return
        done: list[int] = []
        rep.on_event(self.now, done)
        if done:
            book = self.book
            assert book is not None
            now = self.now
            for r in done:
                self.cum_out_tokens += book.output[r]
                self.recent_e2e.append((now, now - book.arrival_s[r]))
            self.completed += len(done)
        if pod.state == P_DRAINING and rep.slots == 0:
            self._pod_drained(pod)
            return
        self._sched_replica(pod)
        if done:
            self._dispatch()

    # ------------------------------------------------------------------ fluid mode
    def _fluid_entry(self, gpu: str, r: float) -> tuple[tuple[str, int | None], tuple[SteadyState, float, float, float, np.ndarray, np.ndarray, np.ndarray, float]]:
        """Steady state of one replica at per-replica rate ``r`` (memoized on a 0.5 % grid): state,
        attainment (both / TTFT / TPOT), latency histogram shapes, p99 e2e."""
        key = (gpu, None if r <= 1e-9 else int(round(math.log(r) / 0.005)))
        hit = self.fluid_cache.get(key)
        if hit is not None:
            return key, hit
        m = self.setup.fluid_model(gpu)
        r_q = 0.0 if key[1] is None else math.exp(key[1] * 0.005)
        st = m.steady(r_q)
        entry = self._fluid_shapes(m, st, 0.0)
        self.fluid_cache[key] = entry
        return key, entry

    def _fluid_shapes(self, m: FluidReplicaModel, st: SteadyState, extra_wait_s: float) -> tuple[SteadyState, float, float, float, np.ndarray, np.ndarray, np.ndarray, float]:
        slo = self.setup.slo
        grid = m.grid
        att = m.attainment(st, slo.ttft_s, slo.tpot_s, extra_wait_s)
        att_ttft = m.attainment(st, slo.ttft_s, INF, extra_wait_s)
        att_tpot = 1.0 if st.tpot_s <= slo.tpot_s else float((grid.output <= 1).mean())
        # waiting time quantiles at the tail points: P(W > w) = p e^{-w/s}
        if st.wait_prob > 0 and st.wait_scale_s > 0:
            w = np.where(TAIL_U < st.wait_prob, st.wait_scale_s * np.log(st.wait_prob / TAIL_U), 0.0)
        else:
            w = np.zeros_like(TAIL_U)
        ttft = (st.service_s[:, None] + w[None, :] + extra_wait_s)
        weights = np.broadcast_to(TAIL_W[None, :] / len(st.service_s), ttft.shape)
        e2e = ttft + (np.maximum(grid.output, 1.0) - 1.0)[:, None] * st.tpot_s
        h_ttft = np.bincount(hist_index(ttft.ravel()), weights=weights.ravel(), minlength=HIST_BINS)
        h_e2e = np.bincount(hist_index(e2e.ravel()), weights=weights.ravel(), minlength=HIST_BINS)
        multi = grid.output > 1
        h_tpot = np.zeros(HIST_BINS)
        if multi.any():
            h_tpot[hist_index(np.array([st.tpot_s]))[0]] = float(multi.mean())
        p99 = hist_quantile(h_e2e, 0.99)
        return st, att, att_ttft, att_tpot, h_ttft, h_e2e, h_tpot, p99

    def _fluid_lost(self, pod: _Pod) -> None:
        g = self.fluid_groups.get(pod.gpu)
        if g is None:
            return
        r, st = g
        held = st.batch + r * st.mean_wait_s
        if held > 0:
            self.backlog.appendleft([self.now, held])
            self.fluid_retried += held

    def _fluid_step(self) -> None:
        step = self.opt.fluid_step_s
        now = self.now
        lam = self._fluid_rate(now)
        n_arr = float(self.rng.poisson(lam * step)) if lam > 0 and now < self.end_s else 0.0
        backlog = self.backlog
        if n_arr > 0:
            backlog.append([now, n_arr])
            self.fluid_arrived += n_arr
            self.rec_arrivals += n_arr
        self.fluid_arrivals_log.append((now, n_arr))
        self.fluid_log_sum += n_arr
        # drop what waited too long
        timeout = self.opt.request_timeout_s
        while backlog and now - backlog[0][0] > timeout:
            self.dropped += backlog.popleft()[1]
        counts: dict[str, int] = {}
        for pod in self.ready_pods:
            counts[pod.gpu] = counts.get(pod.gpu, 0) + 1
        fm = self.fluid_gpu
        cap = 0.0
        for gpu, c in counts.items():
            cap += c * fm[gpu][1]
        budget = cap * step
        chunks: list[tuple[float, float]] = []
        while backlog and budget > 1e-9:
            b = backlog[0]
            take = b[1] if b[1] < budget else budget
            chunks.append((now - b[0], take))
            budget -= take
            b[1] -= take
            if b[1] <= 1e-9:
                backlog.popleft()
        served = 0.0
        for _, part in chunks:
            served += part
        s_rate = served / step
        groups: dict[str, tuple[float, SteadyState]] = {}
        util = kv = waiting = p99 = 0.0
        n_ready = 0
        fw = self.fluid_w
        rw = self.rec_w
        for gpu, c in counts.items():
            m, rmax, mean_out = fm[gpu]
            share = rmax * c / cap if cap > 0 else 0.0
            r = s_rate * share / c
            key, entry = self._fluid_entry(gpu, r)
            st = entry[0]
            groups[gpu] = (r, st)
            util += c * st.busy_frac
            kv += c * st.kv_frac
            waiting += c * r * st.mean_wait_s
            n_ready += c
            if served <= 0:
                continue
            if entry[7] > p99:
                p99 = entry[7]
            for wait, cnt in chunks:
                k = cnt * share
                if wait <= 0.0:
                    att, att_t, att_p = entry[1], entry[2], entry[3]
                    fw[key] = fw.get(key, 0.0) + k
                    rw[key] = rw.get(key, 0.0) + k
                else:
                    _, att, att_t, att_p, h_t, h_e, h_p, _ = self._fluid_shapes(m, st, wait)
                    self.fluid_hist_ttft += k * h_t
                    self.fluid_hist_e2e += k * h_e
                    self.fluid_hist_tpot += k * h_p
                    self.rec_hist_ttft += k * h_t
                    self.rec_hist_e2e += k * h_e
                self.fluid_ok += k * att
                self.fluid_ok_ttft += k * att_t
                self.fluid_ok_tpot += k * att_p
        self.fluid_groups = groups
        self.fluid_served += served
        self.cum_out_tokens += served * self.mean_out
        self.cum_in_tokens += served * self.mean_prompt
        left = 0.0
        for b in backlog:
            left += b[1]
        self.fluid_queue = left + waiting
        self.fluid_util = 100.0 * util / n_ready if n_ready else math.nan
        self.fluid_kv = 100.0 * kv / n_ready if n_ready else math.nan
        if served > 0:
            self.fluid_p99.append((now, p99 + (chunks[0][0] if chunks[0][0] > 0 else 0.0)))
        nxt = now + step
        if (nxt < self.end_s or backlog) and nxt < self.end_s + self.opt.drain_s:
            self._push(nxt, EV_FLUID)

    def _fluid_hist(self, weights: dict[tuple[str, int | None], float], which: int) -> np.ndarray:
        """Histogram from accumulated weights per cached steady state (4: TTFT, 5: e2e, 6: TPOT)."""
        h = np.zeros(HIST_BINS)
        for key, w in weights.items():
            if w > 0:
                h += w * np.asarray(self.fluid_cache[key][which])
        return h

    # ------------------------------------------------------------------ observation
    def _do_scrape(self) -> None:
        now = self.now
        win = self.opt.rate_window_s
        s: dict[str, float | None] = {}
        # gauges
        if self.mode == "requests":
            waiting = len(self.queue) + sum(p.replica.waiting for p in self.ready_pods if p.replica is not None)
            s["queue_depth"] = float(waiting)
            busy = 0.0
            n = 0
            kv = 0.0
            dt = now - self.scrape_at if self.scrape_at > -INF else self.opt.scrape_interval_s
            new_busy: dict[int, float] = {}
            for p in self.ready_pods:
                rep = p.replica
                if rep is None:
                    continue
                rep._advance(now)
                prev = self.scrape_busy.get(p.id)
                new_busy[p.id] = rep.busy_s
                if prev is None or dt <= 0:
                    continue
                busy += min(1.0, (rep.busy_s - prev) / dt)
                kv += rep.kv_used / rep.prof.kv_cache_tokens
                n += 1
            self.scrape_busy = new_busy
            s["gpu_utilization_pct"] = 100.0 * busy / n if n else None
            s["kv_cache_utilization_pct"] = 100.0 * kv / n if n else None
            lo = bisect_left(self.arrivals, now - win, 0, self.next_req)
            s["request_rate_per_s"] = (self.next_req - lo) / win
            e2e = self.recent_e2e
            while e2e and e2e[0][0] < now - win:
                e2e.popleft()
            if e2e:
                vals = np.fromiter((x[1] for x in e2e), dtype=np.float64, count=len(e2e))
                s["p99_latency_ms"] = percentile(vals, 99) * 1000.0
            else:
                s["p99_latency_ms"] = None
        else:
            s["queue_depth"] = float(self.fluid_queue)
            s["gpu_utilization_pct"] = None if math.isnan(self.fluid_util) else self.fluid_util
            s["kv_cache_utilization_pct"] = None if math.isnan(self.fluid_kv) else self.fluid_kv
            log = self.fluid_arrivals_log
            while log and log[0][0] < now - win:
                self.fluid_log_sum -= log.popleft()[1]
            s["request_rate_per_s"] = self.fluid_log_sum / win
            p99s = self.fluid_p99
            while p99s and p99s[0][0] < now - win:
                p99s.popleft()
            s["p99_latency_ms"] = max(x[1] for x in p99s) * 1000.0 if p99s else None
        # counters -> rates over the window
        self.token_log.append((now, self.cum_out_tokens, self.cum_in_tokens))
        while len(self.token_log) > 1 and self.token_log[0][0] < now - win - 1e-9:
            self.token_log.popleft()
        t0, out0, in0 = self.token_log[0]
        span = now - t0
        if span > 0:
            s["output_tokens_per_s"] = (self.cum_out_tokens - out0) / span
            s["input_tokens_per_s"] = (self.cum_in_tokens - in0) / span
        else:
            s["output_tokens_per_s"] = s["input_tokens_per_s"] = None
        self.scrape = s
        self.scrape_at = now
        at = self._dt(now)
        samples = {k: (Sample(float(v), at) if v is not None else Sample(None, at, "NoData")) for k, v in s.items()}
        self.scrape_samples = {n: samples.get(n, _NOT_SCRAPED) for n in model_signal_names()}
        self._push(now + self.opt.scrape_interval_s, EV_SCRAPE)

    def _pool_state(self, pool: _Pool, at: datetime) -> tuple[PoolState, int]:
        """The pool's state as its provider reports it, and its Pending pods."""
        now = self.now
        w = self.opt.interruption_window_s
        while pool.notices and pool.notices[0] < now - w:
            pool.notices.popleft()
        if pool.blocked and pool.spot is not None:
            cap = pool.spot.capacity_nodes(now)
            live = sum(1 for n in pool.nodes if n.state != N_GONE and not n.noticed)
            if cap is None or cap > live:
                pool.blocked = False
                self.version += 1
        ready = noticed = pending = 0
        for p in pool.pods:  # one pass: this runs at every tick while a spot pool is blocked
            state = p.state
            if state == P_READY:
                ready += 1
            elif state == P_PENDING:
                pending += 1
            elif state != P_STARTING:
                continue
            node = p.node
            if node is not None and node.noticed:
                noticed += 1
        nodes = sum(1 for n in pool.nodes if n.state != N_GONE)
        return PoolState(
            pool=pool.name, replicas=pool.desired, ready_replicas=ready, nodes=nodes,
            available=not pool.blocked, unavailable_reason=pool.blocked_reason if pool.blocked else None,
            interrupted_replicas=noticed, recent_interruptions=len(pool.notices), price_per_node_hour_usd=None,
            at=at), pending

    def _pool_views(self, at: datetime) -> tuple[dict[str, PoolState], dict[str, int], dict[str, int], dict[str, int]]:
        """Pool states and counts, recomputed only when the fleet changed (or a recent
        interruption ages out of its window, or a pool is blocked: both depend on time)."""
        now = self.now
        if self.obs_cache is not None and self.obs_version == self.version and (
                now == self.obs_at_s  # one tick asks once per pool: the same instant, the same views
                or (now < self.obs_expiry and not any(p.blocked for p in self.pools.values()))):
            self.obs_at_s = now
            return self.obs_cache
        self.obs_at_s = now
        pools: dict[str, PoolState] = {}
        pending: dict[str, int] = {}
        for name, p in self.pools.items():
            pools[name], pending[name] = self._pool_state(p, at)
        w = self.opt.interruption_window_s
        self.obs_expiry = min((p.notices[0] + w for p in self.pools.values() if p.notices), default=INF)
        ready = {n: st.ready_replicas or 0 for n, st in pools.items()}
        desired = {n: p.desired for n, p in self.pools.items()}
        self.obs_cache = (pools, pending, ready, desired)
        self.obs_version = self.version
        return self.obs_cache

    def signals(self) -> ModelSignals:
        """The last scrape's samples as a metrics source returns them (no pool states)."""
        return ModelSignals(self.model.name, self._dt(self.now), samples=self.scrape_samples)

    def observation(self, signals: ModelSignals) -> Observation:
        """What a baseline sees: the controller's observed ``signals`` and the counts a load
        balancer and the Kubernetes API give it."""
        _, pending, ready, desired = self._pool_views(signals.at)
        win = self.opt.rate_window_s
        if self.mode == "requests":
            lo = bisect_left(self.arrivals, self.now - win, 0, self.next_req)
            n_win = self.next_req - lo
        else:
            log = self.fluid_arrivals_log
            while log and log[0][0] < self.now - win:
                self.fluid_log_sum -= log.popleft()[1]
            n_win = int(round(self.fluid_log_sum))
        return Observation(now_s=self.now, at=signals.at, signals=signals, requests_in_window=n_win,
                           pending_by_pool=pending, ready_by_pool=ready, desired_by_pool=desired)

    # ------------------------------------------------------------------ control
    def controller_for(self, model: ModelSpec, pools: Mapping[str, PoolSpec], decide: DecisionFunction,
                       policy: EffectivePolicy | None) -> Controller:
        """A ``Controller`` for ``model`` on ``pools`` over this simulation's providers."""
        policies: dict[str, EffectivePolicy] = {} if policy is None else {model.name: policy}
        return Controller(models={model.name: model}, pools=pools, clock=self.clock, metrics_source=self.metrics,
                          pool_providers={n: self.pool_providers[n] for n in model.pools}, recorder=self.recorder,
                          policies=lambda: policies, decide=decide, policy_required=policy is not None)

    def scale_pool(self, name: str, replicas: int, nodes: int) -> int | None:
        """A controller's ``scale`` of one pool: its desired replicas (clamped to what the pool
        can hold) and the nodes to hold. Returns the previous desired replicas if they changed."""
        pool = self.pools[name]
        self._actuated = True
        pool.want_nodes = nodes
        n = min(max(0, int(replicas)), pool.spec.max_nodes * pool.per_node)
        if n == pool.desired:
            return None
        before = pool.desired
        self.actions += 1
        self.action_log.append((self.now, name, before, n))
        self._set_desired(pool, n)
        return before

    def _settle(self, changed: bool) -> None:
        """After a controller scaled: nodes (direct mode), binding, dispatch."""
        if changed:
            self.decisions_changed += 1
        if not changed and self.applied_version == self.version:
            return  # nothing moved since the last reconciliation
        for pool in self.pools.values():
            if self.ctrl.node_mode == "direct":
                self._reconcile_nodes(pool)
            self._bind(pool)
        if self.mode == "requests":
            self._dispatch()
        self.applied_version = self.version

    def _tick(self) -> None:
        assert self.controller is not None
        self.decisions += 1
        actions = self.actions
        self._actuated = False
        self.controller.tick(self._dt(self.now))
        if self._actuated:
            self._settle(self.actions != actions)
        nxt = self.now + self.ctrl.interval_s
        if nxt < self.end_s:
            self._push(nxt, EV_CTRL)

    def _record(self) -> None:
        now = self.now
        tl = self.tl
        tl["t_s"].append(now)
        tl["arrivals_per_s"].append(self.rec_arrivals / self.record_s)
        self.rec_arrivals = 0.0
        tl["cost_per_hour_usd"].append(self.cost_per_hour())
        tl["queue_depth"].append(self.scrape.get("queue_depth"))
        tl["gpu_util_pct"].append(self.scrape.get("gpu_utilization_pct"))
        for name, pool in self.pools.items():
            tl[f"desired:{name}"].append(pool.desired)
            tl[f"ready:{name}"].append(sum(1 for p in pool.pods if p.state == P_READY))
            tl[f"nodes:{name}"].append(sum(1 for n in pool.nodes if n.state != N_GONE))
        if self.mode == "fluid":
            tl["p99_e2e_s"].append(hist_quantile(self.rec_hist_e2e + self._fluid_hist(self.rec_w, 5), 0.99))
            tl["p99_ttft_s"].append(hist_quantile(self.rec_hist_ttft + self._fluid_hist(self.rec_w, 4), 0.99))
            self.rec_hist_e2e[:] = 0
            self.rec_hist_ttft[:] = 0
            self.rec_w = {}
        if now + self.record_s <= self.end_s:
            self._push(now + self.record_s, EV_RECORD)

    # ------------------------------------------------------------------ run
    def _initial_need(self) -> int:
        # The run starts from a fleet sized for the busiest minute of its first ten minutes (about
        # the provisioning plus cold-start lead of a cloud replica): the fleet a well-run service
        # would have had in place when the trace begins. Every controller starts from it, so no
        # one is scored on the accident of where the trace starts (a spike three minutes in that
        # no controller could have ordered capacity for).
        w = self.setup.workload
        horizon = min(600.0, max(self.end_s, 1.0))
        if isinstance(w, RequestTrace):
            head = w.arrival_s[: int(np.searchsorted(w.arrival_s, horizon))]
            per_min = np.bincount((head // 60.0).astype(np.int64)) if len(head) else np.zeros(1)
            rate = float(per_min.max()) / min(60.0, horizon)
        else:
            rates = w.head(horizon).rate_per_s
            rate = float(rates.max()) if len(rates) else 0.0
        ref = self._reference_gpu()
        per = self.setup.rate_at_slo(ref)
        if rate <= 0:
            return 0
        return max(1, int(math.ceil(rate / per))) if per > 0 else 1

    def _reference_gpu(self) -> str:
        for spec in self.setup.model_pools():
            if spec.tier.is_onprem:
                return spec.gpu_type
        return self.setup.model_pools()[0].gpu_type

    def _start(self) -> None:
        for pool in self.pools.values():
            if pool.onprem:
                for _ in range(pool.spec.max_nodes):
                    self._new_node(pool, 0.0, N_READY)
        init = self.ctrl.initial(self.setup, self._initial_need())
        for name, n in init.items():
            if name not in self.pools:
                continue
            pool = self.pools[name]
            n = min(max(0, int(n)), pool.spec.max_nodes * pool.per_node)
            if pool.spot is not None and not pool.onprem:
                cap = pool.spot.capacity_nodes(0.0)
                if cap is not None:
                    n = min(n, cap * pool.per_node)  # the warm fleet only holds what the cloud had
            self._set_desired(pool, n)
            pool.want_nodes = max(pool.spec.nodes_for(self.model, n), pool.spec.min_nodes) if pool.per_node > 0 else 0
            if not pool.onprem and pool.per_node > 0:
                need = -(-n // pool.per_node)
                for _ in range(need):
                    self._new_node(pool, 0.0, N_READY)
            self._bind(pool)
        # the initial fleet is warm: ready at time 0
        for pool in self.pools.values():
            for pod in pool.pods:
                if pod.state == P_STARTING:
                    pod.ready_s = 0.0
                    self._pod_ready(pod)
            pool.bill_t = 0.0
            self._bill(pool)
            if pool.spot is not None and (pool.spot.trace is not None or pool.spot.unavailable_windows):
                self._push(0.0, EV_CAP, pool)
        self.controller = self.ctrl.controller(self)
        self._push(0.0, EV_SCRAPE)
        self._push(self.ctrl.interval_s, EV_CTRL)
        self._push(0.0, EV_RECORD)
        if self.ctrl.node_mode == "autoscaler":
            self._push(self.opt.ca_scan_interval_s, EV_CA)
        if self.mode == "fluid":
            self._push(0.0, EV_FLUID)

    def _want_progress(self) -> bool:
        if self.opt.progress is not None:
            return self.opt.progress
        # runs longer than a few seconds: many requests, or many decisions (a decide() is ~0.2 ms)
        return self.n_req > 200_000 or self.end_s / max(self.ctrl.interval_s, 1e-9) > 20_000

    def run(self) -> RunResult:
        wall0 = _wall.perf_counter()
        self._start()
        bar = None
        if self._want_progress():
            from tqdm import tqdm
            bar = tqdm(total=int(self.end_s), unit="sim-s", desc=self.ctrl.name, leave=False, mininterval=0.5)
        last_bar = 0
        heap = self.heap
        arrivals = self.arrivals
        n_req = self.n_req
        hard_end = self.end_s + self.opt.drain_s
        while True:
            t_arr = arrivals[self.next_req] if self.next_req < n_req else INF
            t_ev = heap[0][0] if heap else INF
            if t_arr <= t_ev:
                if t_arr == INF:
                    break
                self.now = float(t_arr)
                r = self.next_req
                self.next_req += 1
                self.rec_arrivals += 1
                self.queue.append(r)
                self._dispatch()
                continue
            if t_ev > hard_end:
                break
            t, _, kind, obj, ver = heapq.heappop(heap)
            self.now = t
            if kind == EV_REPLICA:
                self._replica_event(obj, ver)
            elif kind == EV_FLUID:
                self._fluid_step()
            elif kind == EV_SCRAPE:
                if t <= self.end_s:
                    self._do_scrape()
            elif kind == EV_CTRL:
                self._tick()
            elif kind == EV_POD_READY:
                if obj.state == P_STARTING and obj.ready_s <= t + 1e-9:
                    self._pod_ready(obj)
            elif kind == EV_NODE_READY:
                if obj.state == N_PROV:
                    self.version += 1
                    obj.state = N_READY
                    obj.empty_since = t
                    self._bind(obj.pool)
                    if self.ctrl.node_mode == "direct":
                        self._reconcile_nodes(obj.pool)
            elif kind == EV_NOTICE:
                self._notice(obj)
            elif kind == EV_NODE_GONE:
                self._node_gone(obj)
            elif kind == EV_CAP:
                self._capacity_change(obj)
            elif kind == EV_CA:
                self._ca_scan()
                if t + self.opt.ca_scan_interval_s < self.end_s:
                    self._push(t + self.opt.ca_scan_interval_s, EV_CA)
            elif kind == EV_RECORD:
                self._record()
            if bar is not None and self.now - last_bar >= 3600:
                bar.update(int(min(self.now, self.end_s)) - last_bar)
                last_bar = int(min(self.now, self.end_s))
            if self.now > self.end_s and self.mode == "requests" and not self.queue and self.completed + self.dropped >= n_req \
                    and self.next_req >= n_req:
                break
        if bar is not None:
            bar.update(max(0, int(self.end_s) - last_bar))
            bar.close()
        self.now = max(self.now, self.end_s)
        for pool in self.pools.values():
            self._bill(pool)
        summary, timeline = self._finish()
        return RunResult(self.ctrl.name, summary, timeline, _wall.perf_counter() - wall0, list(self.action_log))

    # ------------------------------------------------------------------ results
    def _finish(self) -> tuple[dict[str, Any], dict[str, Any]]:
        slo = self.setup.slo
        s: dict[str, Any] = {"controller": self.ctrl.name, "mode": self.mode, "duration_s": self.end_s}
        tl = self.tl
        if self.mode == "requests":
            book = self.book
            assert book is not None
            arr = np.asarray(book.arrival_s)
            first = np.asarray(book.first_token_s)
            done = np.asarray(book.done_s)
            out = np.asarray(book.output)
            n = len(arr)
            ok_done = np.isfinite(done)
            ttft = first - arr
            e2e = done - arr
            with np.errstate(invalid="ignore"):
                tpot = np.where(out > 1, (done - first) / np.maximum(out - 1, 1), 0.0)
            ttft_ok = ok_done & (ttft <= slo.ttft_s)
            tpot_ok = ok_done & ((out <= 1) | (tpot <= slo.tpot_s))
            both = ttft_ok & tpot_ok
            s["requests"] = int(n)
            s["completed"] = int(ok_done.sum())
            s["dropped"] = int(n - ok_done.sum())
            s["retried"] = int(np.count_nonzero(np.asarray(book.retries)))
            s["slo_attainment"] = float(both.mean()) if n else math.nan
            s["ttft_attainment"] = float(ttft_ok.mean()) if n else math.nan
            s["tpot_attainment"] = float(tpot_ok.mean()) if n else math.nan

            def pct(x: np.ndarray, q: float) -> float:
                return percentile(x, q) * 1000.0 if len(x) else math.nan
            s["ttft_p50_ms"] = pct(ttft[ok_done], 50)
            s["ttft_p99_ms"] = pct(ttft[ok_done], 99)
            s["e2e_p50_ms"] = pct(e2e[ok_done], 50)
            s["e2e_p99_ms"] = pct(e2e[ok_done], 99)
            multi = ok_done & (out > 1)
            s["tpot_p50_ms"] = pct(tpot[multi], 50)
            s["tpot_p99_ms"] = pct(tpot[multi], 99)
            s["output_tokens"] = float(out[ok_done].sum())
            # per-record p99s from completions
            t_rec = np.asarray(tl["t_s"])
            p99_e2e = [math.nan] * len(t_rec)
            p99_ttft = [math.nan] * len(t_rec)
            if len(t_rec) and ok_done.any():
                idx = np.searchsorted(t_rec, done[ok_done], side="right") - 1
                e_ok, f_ok = e2e[ok_done], ttft[ok_done]
                order = np.argsort(idx, kind="stable")
                idx_s, e_s, f_s = idx[order], e_ok[order], f_ok[order]
                bounds = np.searchsorted(idx_s, np.arange(len(t_rec) + 1))
                for i in range(len(t_rec)):
                    a, b = bounds[i], bounds[i + 1]
                    if b > a:
                        p99_e2e[i] = percentile(e_s[a:b], 99)
                        p99_ttft[i] = percentile(f_s[a:b], 99)
            tl["p99_e2e_s"] = p99_e2e
            tl["p99_ttft_s"] = p99_ttft
        else:
            n_arr = self.fluid_arrived
            dropped = self.dropped + sum(b[1] for b in self.backlog)
            s["requests"] = int(round(n_arr))
            s["completed"] = int(round(self.fluid_served))
            s["dropped"] = int(round(dropped))
            s["retried"] = int(round(self.fluid_retried))
            s["slo_attainment"] = self.fluid_ok / n_arr if n_arr else math.nan
            s["ttft_attainment"] = self.fluid_ok_ttft / n_arr if n_arr else math.nan
            s["tpot_attainment"] = self.fluid_ok_tpot / n_arr if n_arr else math.nan
            h_ttft = self.fluid_hist_ttft + self._fluid_hist(self.fluid_w, 4)
            h_e2e = self.fluid_hist_e2e + self._fluid_hist(self.fluid_w, 5)
            h_tpot = self.fluid_hist_tpot + self._fluid_hist(self.fluid_w, 6)
            s["ttft_p50_ms"] = hist_quantile(h_ttft, 0.5) * 1000.0
            s["ttft_p99_ms"] = hist_quantile(h_ttft, 0.99) * 1000.0
            s["e2e_p50_ms"] = hist_quantile(h_e2e, 0.5) * 1000.0
            s["e2e_p99_ms"] = hist_quantile(h_e2e, 0.99) * 1000.0
            s["tpot_p50_ms"] = hist_quantile(h_tpot, 0.5) * 1000.0
            s["tpot_p99_ms"] = hist_quantile(h_tpot, 0.99) * 1000.0
            s["output_tokens"] = float(self.cum_out_tokens)
        cost = sum(p.cost_usd for p in self.pools.values())
        s["cost_usd"] = cost
        s["cost_per_million_output_tokens_usd"] = (usd_per_million_tokens(cost, s["output_tokens"]) if s["output_tokens"]
                                                    else math.nan)
        gpu_h = {name: p.node_s * p.spec.gpus_per_node / 3600.0 for name, p in self.pools.items()}
        s["gpu_hours_by_pool"] = gpu_h
        total_gpu_h = sum(gpu_h.values())
        spot_h = sum(h for name, h in gpu_h.items() if self.pools[name].spot_pool)
        od_h = sum(h for name, h in gpu_h.items() if self.pools[name].spec.tier.is_ondemand)
        s["gpu_hours"] = total_gpu_h
        s["spot_share"] = spot_h / total_gpu_h if total_gpu_h else 0.0
        s["ondemand_share"] = od_h / total_gpu_h if total_gpu_h else 0.0
        s["cost_by_pool_usd"] = {name: p.cost_usd for name, p in self.pools.items()}
        s["scaling_actions"] = self.actions
        s["decisions"] = self.decisions
        s["decisions_changed"] = self.decisions_changed
        s["interruptions"] = sum(p.interrupted_nodes for p in self.pools.values())
        s["replicas_interrupted"] = sum(p.killed_pods for p in self.pools.values())
        s["launch_failures"] = sum(p.launch_failures for p in self.pools.values())
        s["requests_retried_after_interruption"] = int(self.killed_requests) if self.mode == "requests" else s["retried"]
        if self.controller_errors:
            s["controller_errors"] = self.controller_errors[:20]
        timeline: dict[str, Any] = dict(tl)
        timeline["record_s"] = self.record_s
        timeline["pools"] = {name: {"tier": p.spec.tier.value, "provider": p.spec.provider, "gpu_type": p.spec.gpu_type} for name, p in self.pools.items()}
        timeline["slo"] = {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}
        return s, timeline


def simulate(setup: SimSetup, autoscaler: Autoscaler) -> RunResult:
    """Run ``autoscaler`` on ``setup`` once."""
    return Simulation(setup, autoscaler).run()
