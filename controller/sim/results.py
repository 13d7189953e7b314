"""What a run of the simulated world leaves: the timeline (a point every ``record_s``) and the
summary figures (attainment, latency percentiles, cost, GPU-hours, actions, interruptions)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller.core.pricing import usd_per_million_tokens
from controller.sim.nodes import P_READY
from controller.sim.scrape import Scraping
from controller.sim.state import EV_RECORD
from controller.sim.stats import ZERO_HIST, hist_quantile, percentile


@dataclass
class RunResult:
    """One run: the summary figures, the timeline, and what the run was."""

    controller: str
    summary: dict[str, Any]
    timeline: dict[str, Any]
    wall_s: float
    actions: list[tuple[float, str, int, int]] = field(default_factory=list)
    """(time s, pool, from, to) of every scaling action."""

    def undone_scale_downs(self, within_s: float = 60.0) -> int:
        """Pool scale-downs undone within ``within_s`` seconds: a pool's replicas fall and its
        next action, that soon, raises them again (churn: nodes released and ordered back)."""
        down_at: dict[str, float] = {}
        n = 0
        for t, pool, before, after in self.actions:
            if after < before:
                down_at[pool] = t
            elif after > before and pool in down_at and t - down_at.pop(pool) <= within_s:
                n += 1
        return n


class Reporting(Scraping):
    """The timeline and the summary of a run."""

    def _record(self) -> None:
        now = self.now
        tl = self.tl
        tl["t_s"].append(now)
        tl["arrivals_per_s"].append(self.rec_arrivals / self.record_s)
        self.rec_arrivals = 0.0
        tl["cost_per_hour_usd"].append(self.cost_per_hour())
        for name, sample in self.scrape_samples.items():
            tl[name].append(sample.value)
        for name, pool in self.pools.items():
            tl[f"desired:{name}"].append(pool.desired)
            tl[f"ready:{name}"].append(sum(1 for p in pool.pods if p.state == P_READY))
            tl[f"nodes:{name}"].append(pool.node_count())
        if self.mode == "fluid":
            tl["p99_e2e_s"].append(hist_quantile(self.rec_hist_e2e + self._fluid_hist(self.rec_w, 5), 0.99))
            tl["p99_ttft_s"].append(hist_quantile(self.rec_hist_ttft + self._fluid_hist(self.rec_w, 4), 0.99))
            self.rec_hist_e2e = ZERO_HIST
            self.rec_hist_ttft = ZERO_HIST
            self.rec_w = {}
        if now + self.record_s <= self.end_s:
            self._push(now + self.record_s, EV_RECORD)


    def _finish(self) -> tuple[dict[str, Any], dict[str, Any]]:
        if not self.opt.run_stats:
            raise RuntimeError("this run kept no latency statistics (EngineOptions.run_stats=False): no summary")
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

