"""What the simulated world shows a controller: every ``scrape_interval_s`` a Prometheus-like
scrape turns the service's state into the signal table's samples (queue depth, GPU and KV-cache
utilization over the interval, request and token rates and p99 latency over ``rate_window_s``),
and the pools' states as their providers report them."""

from __future__ import annotations

import math
from bisect import bisect_left
from datetime import datetime

import numpy as np

from controller.core.model import ModelSignals, PoolState, Sample
from controller.core.signals import model_signal_names
from controller.sim.control import Observation
from controller.sim.nodes import INF, P_PENDING, P_READY, P_STARTING, _Pool
from controller.sim.serving import Serving
from controller.sim.state import _NOT_SCRAPED, EV_SCRAPE
from controller.sim.stats import ZERO_HIST, hist_quantile, percentile


class Scraping(Serving):
    """Signals (the last scrape) and pool states, as the metrics and pool providers answer."""

    def _do_scrape(self) -> None:
        now = self.now
        win = self.opt.rate_window_s
        s: dict[str, float | None] = {}
        # gauges
        if self.mode == "requests":
            waiting = len(self.queue) + sum(p.replica.waiting for p in self.ready_pods if p.replica is not None)
            s["queue_depth"] = float(waiting)
            self.scrape_pending = float(len(self.queue) + sum(p.replica.in_flight for p in self.ready_pods
                                                              if p.replica is not None))
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
            e2e = self.recent_e2e
            while e2e and e2e[0][0] < now - win:
                e2e.popleft()
            if e2e:
                vals = np.fromiter((x[1] for x in e2e), dtype=np.float64, count=len(e2e))
                s["p99_latency_ms"] = percentile(vals, 99) * 1000.0
            else:
                s["p99_latency_ms"] = None
            ttft = self.recent_ttft
            while ttft and ttft[0][0] < now - win:
                ttft.popleft()
            s["p99_ttft_ms"] = (percentile(np.fromiter((x[1] for x in ttft), dtype=np.float64, count=len(ttft)), 99)
                                * 1000.0 if ttft else None)
        else:
            s["queue_depth"] = float(self.fluid_queue)
            self.scrape_pending = float(self.fluid_queue + self.fluid_in_flight)
            s["gpu_utilization_pct"] = None if math.isnan(self.fluid_util) else self.fluid_util
            s["kv_cache_utilization_pct"] = None if math.isnan(self.fluid_kv) else self.fluid_kv
            p99s = self.fluid_p99
            while p99s and p99s[0][0] < now - win:
                p99s.popleft()
            s["p99_latency_ms"] = max(x[1] for x in p99s) * 1000.0 if p99s else None
            h_ttft = self.scrape_hist_ttft + self._fluid_hist(self.scrape_w, 4)
            s["p99_ttft_ms"] = hist_quantile(h_ttft, 0.99) * 1000.0 if h_ttft.sum() > 0 else None
            self.scrape_hist_ttft = ZERO_HIST
            self.scrape_w = {}
        # counters -> rates over the window, as Prometheus's rate() reads Triton's counters: the
        # requests that completed (nv_inference_request_success) and the output and prompt tokens
        # they carried (the TensorRT-LLM backend observes nv_llm_output_token_len and
        # nv_llm_input_token_len with its base metrics once a request's last response is final:
        # model_instance_state.cc, WaitForResponse), so all rise while a backlog drains and stop
        # rising while the replicas saturate (the queue shows the overload). One log for all, so
        # tokens per request are those of the same requests; in the world's first window they
        # divide by the time it has run (their counters start with the world). The request rate
        # used to count arrivals: while a backlog drained, output tokens per request read nearly
        # twice the trace's; prompt tokens counted at admission read 2.35-2.5 x the trace's per
        # request in a cold start's first minute.
        done = float(self.completed) if self.mode == "requests" else self.fluid_served
        queued = self.scrape_pending or 0.0  # waiting or in flight: in the system
        log = self.token_log
        log.append((now, done, self.cum_out_tokens, self.cum_in_tokens, queued))
        while len(log) > 1 and log[0][0] < now - win - 1e-9:
            log.popleft()
        t0, done0, out0, in0, queued0 = log[0]
        span = now - t0
        if span > 0:
            s["request_rate_per_s"] = served = (done - done0) / span
            # what arrived: served plus what the requests in the system (waiting or in flight)
            # grew by over the same window (the signal's PromQL takes their least-squares slope)
            s["arrival_rate_per_s"] = max(0.0, served + (queued - queued0) / span)
            s["output_tokens_per_s"] = (self.cum_out_tokens - out0) / span
            s["input_tokens_per_s"] = (self.cum_in_tokens - in0) / span
        else:
            s["request_rate_per_s"] = s["arrival_rate_per_s"] = None
            s["output_tokens_per_s"] = s["input_tokens_per_s"] = None
        self.scrape_at = now
        at = self._dt(now)
        samples = {k: (Sample(float(v), at) if v is not None else Sample(None, at, "NoData")) for k, v in s.items()}
        self.scrape_samples = {n: samples.get(n, _NOT_SCRAPED) for n in model_signal_names()}
        self._push(now + self.opt.scrape_interval_s, EV_SCRAPE)


    def _pool_state(self, pool: _Pool, at: datetime) -> tuple[PoolState, int]:
        """The pool's state as its provider reports it, and its Pending pods."""
        now = self.now
        w = self.opt.interruption_window_s
        if pool.notices and pool.notices[0] < now - w:
            del pool.notices[:bisect_left(pool.notices, now - w)]
        if pool.may_reopen(now):
            pool.blocked = False
            self.version += 1
        ready = noticed = pending = starting = 0
        for p in pool.pods:  # one pass: this runs at every tick while a spot pool is blocked
            state = p.state
            if state == P_READY:
                ready += 1
            elif state == P_PENDING:
                pending += 1
            elif state == P_STARTING:  # on a node that is up, loading the engine
                starting += 1
            else:
                continue
            node = p.node
            if node is not None and node.noticed:
                noticed += 1
        nodes = pool.node_count()
        return PoolState(
            pool=pool.name, replicas=pool.desired, ready_replicas=ready, nodes=nodes,
            available=not pool.blocked, unavailable_reason=pool.blocked_reason if pool.blocked else None,
            interrupted_replicas=noticed, recent_interruptions=len(pool.notices),
            price_per_node_hour_usd=self._live_price(pool.name, now),
            at=at, scheduled_replicas=ready + starting), pending


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
        for walk in self.setup.spot_prices.values():  # a live price holds until its next step
            self.obs_expiry = min(self.obs_expiry, (math.floor(now / walk.step_s) + 1) * walk.step_s)
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
                           pending_by_pool=pending, ready_by_pool=ready, desired_by_pool=desired,
                           pending_requests=self.scrape_pending)

