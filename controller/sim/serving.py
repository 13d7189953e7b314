"""The request service of the simulated world: in *request* mode every request goes from a FIFO
gateway queue to the least-loaded ready replica with room (``service.Replica``: continuous
batching, KV reservation) and times out after ``request_timeout_s`` in the queue; in *fluid* mode
the replicas serve flows every ``fluid_step_s`` (``service.FluidReplicaModel``) from a FIFO of
per-step buckets."""

from __future__ import annotations

import math

import numpy as np

from controller.sim.fleet import Fleet
from controller.sim.nodes import INF, P_DRAINING, P_READY, _Pod
from controller.sim.service import TAIL_U, TAIL_W, FluidReplicaModel, SteadyState
from controller.sim.state import EV_FLUID, EV_REPLICA
from controller.sim.stats import HIST_BINS, hist_add, hist_index, hist_quantile


class Serving(Fleet):
    """Requests (or flows) through the gateway queue and the ready replicas."""

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
            prompt = book.prompt
            for r in done:
                self.cum_out_tokens += book.output[r]
                self.cum_in_tokens += prompt[r]
                self.recent_e2e.append((now, now - book.arrival_s[r]))
                self.recent_ttft.append((now, book.first_token_s[r] - book.arrival_s[r]))
            self.completed += len(done)
        if pod.state == P_DRAINING and rep.slots == 0:
            self._pod_drained(pod)
            return
        self._sched_replica(pod)
        if done:
            self._dispatch()


    def _arrive(self, t: float) -> None:
        """The next request of the trace arrives at the gateway at ``t``."""
        self.now = t
        self.queue.append(self.next_req)
        self.next_req += 1
        self.rec_arrivals += 1
        self._dispatch()


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
        """A pod gone mid-flight: the requests it held (its batch and its waiting) go back to the
        gateway to be served again, and they count as missing the SLO, as in request mode, where a
        retried request keeps its first arrival: the credit they were given when their service
        began is taken back (at the pod's rate with no wait, the most they were credited) and
        their second service earns none. Counted twice, a fleet that loses pods often read over
        100 % attainment (a day of spot interruptions under a large HPA fleet: 100.01 %)."""
        g = self.fluid_groups.get(pod.gpu)
        if g is None:
            return
        r, st = g
        held = st.batch + r * st.mean_wait_s
        if held > 0:
            entry = self._fluid_entry(pod.gpu, r)[1]
            self.fluid_ok = max(0.0, self.fluid_ok - held * entry[1])
            self.fluid_ok_ttft = max(0.0, self.fluid_ok_ttft - held * entry[2])
            self.fluid_ok_tpot = max(0.0, self.fluid_ok_tpot - held * entry[3])
            self.backlog.appendleft([self.now, held, 0.0])
            self.fluid_retried += held


    def _fluid_step(self) -> None:
        step = self.opt.fluid_step_s
        run_stats = self.opt.run_stats
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
        chunks: list[tuple[float, float, float]] = []  # (wait, requests, SLO credit: 0 for a retry)
        while backlog and budget > 1e-9:
            b = backlog[0]
            take = b[1] if b[1] < budget else budget
            chunks.append((now - b[0], take, b[2] if len(b) > 2 else 1.0))
            budget -= take
            b[1] -= take
            if b[1] <= 1e-9:
                backlog.popleft()
        served = 0.0
        for _, part, _ in chunks:
            served += part
        s_rate = served / step
        groups: dict[str, tuple[float, SteadyState]] = {}
        util = kv = waiting = p99 = batch = 0.0
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
            batch += c * st.batch
            n_ready += c
            if served <= 0:
                continue
            if entry[7] > p99:
                p99 = entry[7]
            for wait, cnt, credit in chunks:
                k = cnt * share
                if wait <= 0.0:
                    att, att_t, att_p = entry[1], entry[2], entry[3]
                    if run_stats:
                        fw[key] = fw.get(key, 0.0) + k
                        rw[key] = rw.get(key, 0.0) + k
                    self.scrape_w[key] = self.scrape_w.get(key, 0.0) + k
                else:
                    _, att, att_t, att_p, h_t, h_e, h_p, _ = self._fluid_shapes(m, st, wait)
                    kt = k * h_t
                    self.scrape_hist_ttft = hist_add(self.scrape_hist_ttft, kt)
                    if run_stats:
                        ke = k * h_e
                        self.fluid_hist_ttft = hist_add(self.fluid_hist_ttft, kt)
                        self.fluid_hist_e2e = hist_add(self.fluid_hist_e2e, ke)
                        self.fluid_hist_tpot = hist_add(self.fluid_hist_tpot, k * h_p)
                        self.rec_hist_ttft = hist_add(self.rec_hist_ttft, kt)
                        self.rec_hist_e2e = hist_add(self.rec_hist_e2e, ke)
                if credit:
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
        self.fluid_in_flight = batch
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

