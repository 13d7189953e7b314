"""The simulated world's state: what every part of a ``Simulation`` reads and moves (the fleet,
the gateway queue and replicas, the fluid flows, the scrape, the timeline), the event heap and its
event kinds, and the helpers that set the run up. The parts are layered on it, each a small class
of its own concern: ``billing`` -> ``fleet`` -> ``serving`` -> ``scrape`` -> ``results`` ->
``engine.Simulation`` (the event loop, the controller's tick, and ``advance_to`` for a driver
outside)."""

from __future__ import annotations

import heapq
import math
from collections import deque
from datetime import datetime, timedelta
from typing import Any, Callable

import numpy as np

from controller.controller import Controller
from controller.core.model import PoolState, Sample
from controller.core.signals import model_signal_names
from controller.sim.control import Autoscaler
from controller.sim.nodes import INF, _Pod, _Pool
from controller.sim.service import FluidReplicaModel, RequestBook, SteadyState
from controller.sim.setup import FluidEntry, SimSetup
from controller.sim.stats import ZERO_HIST
from controller.sim.workload import RateSeries, RequestTrace

# event kinds
EV_CTRL, EV_SCRAPE, EV_RECORD, EV_NODE_READY, EV_POD_READY, EV_NOTICE, EV_NODE_GONE, EV_CAP, EV_CA, \
    EV_REPLICA, EV_FLUID, EV_END = range(12)

_NOT_SCRAPED = Sample.missing("NotScrapedYet")


_NONE: deque[Any] = deque(maxlen=0)
"""Stands for the request-by-request structures of a fluid run (it keeps nothing)."""


class SimState:
    """The state of one run and the event heap; the concerns sit on it (see the module)."""

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
        self.controller: Controller | None = None
        """The tick run() drives (``None``: a driver outside ticks)."""
        self._actuated = False
        self.started = False
        self._tick_at: float | None = None
        """The tick mark the world stopped at for a driver outside (``advance_to``)."""
        self._tick_actions = 0
        self.heap: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.now = 0.0
        self.node_ids = 0
        self.pod_ids = 0
        self.ready_pods: list[_Pod] = []
        self.actions = 0
        self.action_log: deque[tuple[float, str, int, int]] = deque()
        """(time, pool, from, to) of every change of a pool's desired replicas by the controller
        (the newest ``maxlen`` of them where a driver outside bounds it: ``world.World``)."""
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
        self._dt_s = math.nan  # the instant ``_dt`` converted last, and its datetime
        self._dt_at = self.setup.epoch
        self.applied_version = -1
        self.scrape_samples: dict[str, Sample] = dict.fromkeys(model_signal_names(), _NOT_SCRAPED)
        """Every signal of the table: the last scrape's sample, or ``NotScrapedYet``."""
        self.killed_requests = 0
        self.mode = self._pick_mode()
        # workload as requests or flows
        self.book: RequestBook | None = None
        self.n_req = 0
        self.next_req = 0
        self.dropped = 0.0
        self.completed = 0
        self.cum_out_tokens = 0.0
        self.cum_in_tokens = 0.0
        # request by request only: flows need no queue of request ids, nor their latencies (in
        # fluid mode they are one shared, always empty deque: an empty deque is ~700 bytes, and
        # the daemon's world holds one run per model)
        self.queue: deque[int] = deque() if self.mode == "requests" else _NONE
        self.recent_e2e: deque[tuple[float, float]] = deque() if self.mode == "requests" else _NONE
        self.recent_ttft: deque[tuple[float, float]] = deque() if self.mode == "requests" else _NONE
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
        self.fluid_hist_ttft = ZERO_HIST
        self.fluid_hist_e2e = ZERO_HIST
        self.fluid_hist_tpot = ZERO_HIST
        self.fluid_cache: dict[tuple[str, int | None], FluidEntry] = setup._fluid_entries
        self.fluid_groups: dict[str, tuple[float, SteadyState]] = {}
        self.fluid_queue = 0.0
        self.fluid_in_flight = 0.0
        self.scrape_pending: float | None = None
        """Requests waiting or in flight at the last scrape (gateway queue plus every replica's batch):
        the queue metric users give KEDA for Triton; not a signal of the table."""
        self.fluid_util = math.nan
        self.fluid_kv = math.nan
        self.fluid_p99: deque[tuple[float, float]] = deque()
        self.fluid_arrivals_log: deque[tuple[float, float]] = deque()
        self.fluid_log_sum = 0.0
        self.fluid_w: dict[tuple[str, int | None], float] = {}
        self.rec_w: dict[tuple[str, int | None], float] = {}
        self.scrape_hist_ttft = ZERO_HIST
        self.scrape_w: dict[tuple[str, int | None], float] = {}
        """Fluid mode: the TTFT distribution served since the last scrape (the p99_ttft_ms signal)."""
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
        self.scrape_at = -INF
        self.scrape_busy: dict[int, float] = {}
        self.token_log: deque[tuple[float, float, float, float, float]] = deque()
        """(scrape time, requests completed, output tokens, prompt tokens, requests waiting or in
        flight) at each scrape of the last rate window: what the rate signals read."""
        # timeline
        self.record_s = max(self.opt.scrape_interval_s, self._nice_interval(self.end_s / max(self.opt.record_points, 1)))
        self.tl: dict[str, list[Any]] = {}
        """The timeline: a point every ``record_s`` of the run's figures, every signal's last scrape
        (its name in the signal table) and each pool's desired, ready and nodes; none in a run
        without statistics (``EngineOptions.run_stats``: the daemon's world, which nobody reads
        but through its scrapes: ~40 lists a model)."""
        if self.opt.run_stats:
            self.tl.update({"t_s": [], "arrivals_per_s": [], "cost_per_hour_usd": [],
                            **{n: [] for n in model_signal_names()}, "p99_e2e_s": [], "p99_ttft_s": []})
            for name in self.pools:
                self.tl[f"desired:{name}"] = []
                self.tl[f"ready:{name}"] = []
                self.tl[f"nodes:{name}"] = []
        self.rec_arrivals = 0.0
        self.rec_hist_ttft = ZERO_HIST
        self.rec_hist_e2e = ZERO_HIST
        self.progress: Any = None


    def _pick_mode(self) -> str:
        return self.setup.engine_mode()


    @staticmethod
    def _nice_interval(x: float) -> float:
        for v in (15, 30, 60, 120, 300, 600, 900, 1800, 3600):
            if x <= v:
                return float(v)
        return 3600.0 * math.ceil(x / 3600.0)


    def _make_fluid_rate(self) -> Callable[[float], float]:
        w = self.setup.workload
        step = self.opt.fluid_step_s
        if isinstance(w, RateSeries) and w.repeats:
            return w.rate_at
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
        # a tick asks for its instant twice (the controller's ``now`` and the metrics' ``at``)
        if t_s != self._dt_s:
            self._dt_s = t_s
            self._dt_at = self.setup.epoch + timedelta(seconds=t_s)
        return self._dt_at


    def _push(self, t: float, kind: int, obj: Any = None, ver: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj, ver))

