"""How one replica serves requests: continuous (in-flight) batching, as TensorRT-LLM does it.

A replica holds up to ``max_batch`` requests at once and reserves KV cache for each request's prompt
plus output when it admits it (TensorRT-LLM's default ``GUARANTEED_NO_EVICT`` capacity scheduler);
requests beyond that wait in the gateway's queue. Admitted requests first go through the *context*
(prefill) phase, then generate one token per iteration in the *generation* (decode) phase:

- a decode iteration over a batch of ``B`` sequences takes
  ``decode_fixed_ms + decode_ms_per_seq * B + decode_ms_per_context_token * sum(context)``
  (weights are read once per iteration; each sequence adds its own work and KV reads);
- a prefill phase runs the waiting prompts (up to ``max_num_tokens`` per iteration, chunked beyond
  it) inside ``n`` iterations that also advance every decoding sequence by one token each; its cost
  grows with the prompt: ``prefill_ms_per_token * P + prefill_ms_per_token_sq * P**2`` per prompt
  on top of the iterations' decode part. Decoding sequences therefore slow down while prompts are
  being prefilled, which is what stretches the time per output token under load.

Two ways to run it, sharing the parameters:

- ``Replica``: event-driven, request by request. Between events every decoding sequence advances at
  the same rate, so the replica keeps one *virtual token clock* ``v`` and a heap of the ``v`` at which
  each sequence finishes; an event costs O(log n), whatever the number of tokens.
- ``steady_state``: the fluid (mean-value) model for long rate series: per-replica batch size by
  Little's law, prefill queueing as an M/G/1 queue, time per output token from the batch, all as
  numpy over a grid of token-count quantiles (``TokenDistribution.quantile_grid``).

Parameters per (model bundle, GPU type) live in a profile YAML (``profiles/``) that cites the
published measurements they were calibrated from; ``offline_throughput`` replays the publication's
own benchmark (all requests queued at once, fixed input/output lengths) so a unit test checks the
fit against the published numbers.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

INF = math.inf
PROFILES_DIR = Path(__file__).parent / "profiles"


SLO_ATTAINMENT = 0.99
"""Capacity "at the SLO" is the rate at which this share of requests meets both targets."""

ATTAINABLE_MARGIN = 0.01
"""Where the SLO is out of reach for some requests whatever the fleet (their prefill alone outlasts
the TTFT target), capacity at the SLO is sized this far below the share an idle replica attains:
the point the 99 % target leaves below 100 %."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PublishedPoint(_Strict):
    """One published throughput measurement the parameters were fitted to."""

    input_tokens: int = Field(gt=0)
    output_tokens: int = Field(gt=0)
    output_tokens_per_s: float = Field(gt=0, description="Published total output throughput of one replica, tokens/s.")


class ReplicaProfile(_Strict):
    """Service-time parameters of one replica of a model bundle on one GPU type."""

    tp_degree: int = Field(ge=1, description="GPUs per replica (tensor parallel degree).")
    prefill_ms_per_token: float = Field(gt=0, description="Prefill compute per prompt token, ms.")
    prefill_ms_per_token_sq: float = Field(0.0, ge=0, description="Quadratic (attention) prefill term per prompt token squared, ms.")
    decode_fixed_ms: float = Field(gt=0, description="Fixed part of one decode iteration (weight reads, launch overhead), ms.")
    decode_ms_per_seq: float = Field(ge=0, description="Per sequence in the batch, per iteration, ms.")
    decode_ms_per_context_token: float = Field(0.0, ge=0, description="Per token of context held by the batch, per iteration (KV reads), ms.")
    max_batch: int = Field(gt=0, description="Engine max_batch_size: most requests in flight on one replica.")
    kv_cache_tokens: int = Field(gt=0, description="KV cache capacity, tokens (prompt + output reserved per admitted request).")
    max_num_tokens: int = Field(8192, gt=0, description="Most prompt tokens per iteration; longer prefills are chunked.")
    benchmark_max_batch: int | None = Field(None, gt=0, description="Batch limit the published offline benchmark ran with (defaults to max_batch).")
    benchmark_max_num_tokens: int = Field(8192, gt=0, description="Prompt tokens per iteration in the published benchmark (TensorRT-LLM's default 8192).")
    published: tuple[PublishedPoint, ...] = Field((), description="Published throughputs this profile was fitted to.")
    source: str = Field("", description="Where the published numbers come from.")

    def prefill_s(self, prompt_tokens: float) -> float:
        return (self.prefill_ms_per_token * prompt_tokens + self.prefill_ms_per_token_sq * prompt_tokens * prompt_tokens) / 1000.0

    def iteration_s(self, batch: float, context_tokens: float) -> float:
        return (self.decode_fixed_ms + self.decode_ms_per_seq * batch + self.decode_ms_per_context_token * context_tokens) / 1000.0


class ServiceProfile(_Strict):
    """A profile file: ``kind: ServiceProfile``, one model bundle, one entry per GPU type."""

    apiVersion: str = "tidegate/v1"
    kind: str = Field("ServiceProfile", pattern="^ServiceProfile$")
    model: str
    quantization: str
    gpus: dict[str, ReplicaProfile] = Field(min_length=1)
    notes: str = ""

    def for_gpu(self, gpu_type: str) -> ReplicaProfile:
        try:
            return self.gpus[gpu_type]
        except KeyError:
            raise KeyError(f"service profile {self.model!r} has no entry for GPU type {gpu_type!r} (has {sorted(self.gpus)})") from None


def load_profile(path: str | Path) -> ServiceProfile:
    with Path(path).open() as f:
        data = yaml.safe_load(f)
    return ServiceProfile.model_validate(data)


def default_profile_path(model: str) -> Path | None:
    """The shipped profile for a model bundle name (``profiles/<model>.yaml``), if there is one."""
    p = PROFILES_DIR / f"{model}.yaml"
    return p if p.exists() else None


# ---------------------------------------------------------------------------------------------
# Event-driven replica (request by request)
# ---------------------------------------------------------------------------------------------


class RequestBook:
    """Per-request inputs and outcomes, as flat Python lists (fast scalar access in the hot loop)."""

    __slots__ = ("arrival_s", "prompt", "output", "first_token_s", "done_s", "retries")

    def __init__(self, arrival_s: Sequence[float], prompt: Sequence[int], output: Sequence[int]) -> None:
        self.arrival_s = list(map(float, arrival_s))
        self.prompt = list(map(int, prompt))
        self.output = list(map(int, output))
        n = len(self.arrival_s)
        self.first_token_s = [INF] * n
        self.done_s = [INF] * n
        self.retries = [0] * n


class Replica:
    """One serving replica, event-driven. The engine calls ``admit`` when it routes a request here,
    asks ``next_event_s`` when to come back, and calls ``on_event`` at that time."""

    __slots__ = (
        "prof", "book", "pending", "epoch_reqs", "epoch_start", "epoch_end", "epoch_iters",
        "v", "t", "rate", "heap", "batch", "sum_ctx", "kv_used", "slots", "busy_s", "tokens_out",
        "version",
    )

    def __init__(self, prof: ReplicaProfile, book: RequestBook, now_s: float) -> None:
        self.prof = prof
        self.book = book
        self.pending: deque[int] = deque()
        self.epoch_reqs: list[int] = []
        self.epoch_start = now_s
        self.epoch_end = INF
        self.epoch_iters = 0
        self.v = 0.0
        self.t = now_s
        self.rate = 0.0
        self.heap: list[tuple[float, int]] = []
        self.batch = 0
        self.sum_ctx = 0.0
        self.kv_used = 0
        self.slots = 0
        self.busy_s = 0.0
        self.tokens_out = 0
        self.version = 0

    # -- state --------------------------------------------------------------------------------
    def has_room(self, req: int) -> bool:
        b = self.book
        return self.slots < self.prof.max_batch and self.kv_used + b.prompt[req] + b.output[req] <= self.prof.kv_cache_tokens

    def free_slots(self) -> int:
        return self.prof.max_batch - self.slots

    def _advance(self, now_s: float) -> None:
        dt = now_s - self.t
        if dt > 0.0:
            if self.rate > 0.0:
                self.v += dt * self.rate
                self.busy_s += dt
            self.t = now_s

    def _set_rate(self) -> None:
        if self.epoch_end < INF:
            self.rate = self.epoch_iters / (self.epoch_end - self.epoch_start)
        elif self.batch:
            p = self.prof
            self.rate = 1000.0 / (p.decode_fixed_ms + p.decode_ms_per_seq * self.batch + p.decode_ms_per_context_token * self.sum_ctx)
        else:
            self.rate = 0.0

    def _start_epoch(self, now_s: float) -> None:
        p = self.prof
        b = self.book
        reqs = [self.pending.popleft()]
        tokens = b.prompt[reqs[0]]
        while self.pending and tokens + b.prompt[self.pending[0]] <= p.max_num_tokens:
            r = self.pending.popleft()
            reqs.append(r)
            tokens += b.prompt[r]
        iters = max(1, -(-tokens // p.max_num_tokens))
        work_ms = 0.0
        for r in reqs:
            pr = b.prompt[r]
            work_ms += p.prefill_ms_per_token * pr + p.prefill_ms_per_token_sq * pr * pr
        it_ms = p.decode_fixed_ms + p.decode_ms_per_seq * self.batch + p.decode_ms_per_context_token * self.sum_ctx
        self.epoch_reqs = reqs
        self.epoch_iters = iters
        self.epoch_start = now_s
        self.epoch_end = now_s + (iters * it_ms + work_ms) / 1000.0

    def admit(self, req: int, now_s: float) -> None:
        self._advance(now_s)
        b = self.book
        self.kv_used += b.prompt[req] + b.output[req]
        self.slots += 1
        self.pending.append(req)
        if self.epoch_end == INF:
            self._start_epoch(now_s)
            self._set_rate()

    def next_event_s(self) -> float:
        t = self.epoch_end
        if self.heap and self.rate > 0.0:
            tc = self.t + (self.heap[0][0] - self.v) / self.rate
            if tc < t:
                t = tc
        return t

    def _release(self, req: int) -> None:
        b = self.book
        self.kv_used -= b.prompt[req] + b.output[req]
        self.slots -= 1

    def on_event(self, now_s: float, done: list[int]) -> None:
        """Process everything due at ``now_s``; finished requests are appended to ``done``."""
        self._advance(now_s)
        b = self.book
        if self.epoch_end <= now_s + 1e-9:
            for r in self.epoch_reqs:
                b.first_token_s[r] = now_s
                out = b.output[r]
                if out <= 1:
                    b.done_s[r] = now_s
                    self.tokens_out += 1
                    self._release(r)
                    done.append(r)
                else:
                    heapq.heappush(self.heap, (self.v + (out - 1), r))
                    self.batch += 1
                    self.sum_ctx += b.prompt[r] + 0.5 * out
            self.epoch_reqs = []
            self.epoch_end = INF
            if self.pending:
                self._start_epoch(now_s)
        heap = self.heap
        limit = self.v + 1e-6
        while heap and heap[0][0] <= limit:
            _, r = heapq.heappop(heap)
            b.done_s[r] = now_s
            self.batch -= 1
            out = b.output[r]
            self.sum_ctx -= b.prompt[r] + 0.5 * out
            self.tokens_out += out
            self._release(r)
            done.append(r)
        if not heap:
            self.sum_ctx = 0.0  # no drift from float sums when the batch empties
        self._set_rate()

    def kill(self, now_s: float) -> list[int]:
        """The replica vanishes (node interrupted): return every request it held, in FIFO order of
        admission as far as known (epoch, decoding, pending)."""
        self._advance(now_s)
        lost = list(self.epoch_reqs) + [r for _, r in sorted(self.heap)] + list(self.pending)
        self.epoch_reqs = []
        self.heap = []
        self.pending.clear()
        self.epoch_end = INF
        self.batch = 0
        self.sum_ctx = 0.0
        self.kv_used = 0
        self.slots = 0
        self.rate = 0.0
        return lost

    @property
    def in_flight(self) -> int:
        return self.slots

    @property
    def waiting(self) -> int:
        """Admitted but not yet prefilled (what Triton reports as pending)."""
        return len(self.pending)


BENCHMARK_REQUESTS = {(128, 128): 30000, (128, 2048): 3000, (128, 4096): 1500, (500, 2000): 3000,
                      (1000, 1000): 3000, (1000, 2000): 1500, (2048, 128): 3000, (2048, 2048): 1500,
                      (5000, 500): 1500, (20000, 2000): 1000}
"""Requests per (input, output) length in the published benchmark ("$num_requests" table)."""


def offline_throughput(prof: ReplicaProfile, input_tokens: int, output_tokens: int, requests: int | None = None) -> float:
    """Output tokens/s of one replica when ``requests`` identical requests are all queued at t=0:
    the method of TensorRT-LLM's published throughput tables (``trtllm-bench throughput``), with
    the publication's request count for that length pair by default."""
    if requests is None:
        requests = BENCHMARK_REQUESTS.get((input_tokens, output_tokens), 1500)
    max_batch = prof.benchmark_max_batch or prof.max_batch
    bench = prof.model_copy(update={"max_batch": max_batch, "max_num_tokens": prof.benchmark_max_num_tokens})
    book = RequestBook([0.0] * requests, [input_tokens] * requests, [output_tokens] * requests)
    rep = Replica(bench, book, 0.0)
    nxt = 0
    now = 0.0
    done: list[int] = []
    while nxt < requests and rep.has_room(nxt):
        rep.admit(nxt, now)
        nxt += 1
    finished = 0
    while finished < requests:
        now = rep.next_event_s()
        if now == INF:
            raise RuntimeError("replica stalled")
        done.clear()
        rep.on_event(now, done)
        finished += len(done)
        while nxt < requests and rep.has_room(nxt):
            rep.admit(nxt, now)
            nxt += 1
    return requests * output_tokens / now


# ---------------------------------------------------------------------------------------------
# Fluid (mean-value) model
# ---------------------------------------------------------------------------------------------

# Tail probabilities at which the waiting-time distribution is sampled (bucket mid-points) and the
# weight of each bucket: dense near the tail so p99 is resolved.
_TAIL_EDGES = np.array([0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0])
TAIL_U = (_TAIL_EDGES[:-1] + _TAIL_EDGES[1:]) / 2.0
TAIL_W = np.diff(_TAIL_EDGES)


@dataclass(frozen=True)
class TokenGrid:
    """Equally weighted (prompt, output) points standing for the workload's token mix."""

    prompt: np.ndarray
    output: np.ndarray

    @property
    def mean_prompt(self) -> float:
        return float(self.prompt.mean())

    @property
    def mean_output(self) -> float:
        return float(self.output.mean())


@dataclass(frozen=True)
class SteadyState:
    """One replica at a given arrival rate, in the fluid model."""

    rate_per_s: float
    saturated: bool
    batch: float
    """Mean requests decoding."""
    prefill_util: float
    """Share of time spent in prefill work."""
    tpot_s: float
    mean_wait_s: float
    """Mean wait before a request's prefill starts (M/G/1 on the prefill phases)."""
    wait_scale_s: float
    """Scale of the exponential tail of that wait: P(W > w) = wait_prob * exp(-w / wait_scale_s)."""
    wait_prob: float
    service_s: np.ndarray
    """Per grid point: own prefill phase duration, s."""
    busy_frac: float
    kv_frac: float


def prefill_wait(rate_per_s: float, es: float, es2: float, replicas: int = 1,
                 shared_queue: bool = False) -> tuple[float, float]:
    """(probability that a request waits before its prefill starts, mean wait in s) at ``rate_per_s``
    per replica, with prefill phases of mean ``es`` and second moment ``es2`` seconds, for one of
    ``replicas`` replicas that share the arrivals.

    Why the replica count matters: the gateway sends each request to the least-loaded replica, so
    a request waits only when every replica is busy, and that probability falls steeply with the
    count. Where one prefill takes most of the TTFT target (prompts of several thousand tokens),
    any wait misses it, so a replica in a pool sustains far more at the SLO than a lone one: on
    4-12k-token prompts (mean prefill 0.6 s, TTFT 1.5 s) a lone H100 replica keeps 99 % of
    requests within the SLO up to ~0.11 req/s, one of four ~0.55 req/s, one of sixteen ~0.86 req/s
    (measured request by request: ``Replica`` behind the gateway's least-loaded routing, Poisson
    arrivals, rate bisected for 99 %; ``tests/unit/test_simulator_service.py`` checks four).

    - The gateway (``shared_queue`` false): a request waits with Erlang's C probability that all
      ``replicas`` are busy (offered load ``replicas x rate x es``); it is then committed to one
      replica and waits as behind that replica's own queue (the M/G/1 wait given a wait,
      ``es2 / (2 es (1 - rho))``). Against those request-by-request figures its rate at the SLO
      is 4-21 % low on those prompts (1 to 16 replicas) and 20-25 % low on the Azure code
      trace's mix (4 to 16): conservative.
    - ``shared_queue``: one queue for all replicas, the next prefill on the first replica free
      (M/G/c, the Lee-Longton approximation ``C / (c mu - lambda) x (1 + cs^2) / 2``): no routing
      waits less, so it rates a replica above what the gateway gets (the relaxed bound's case).

    With one replica both are the M/G/1 (Pollaczek-Khinchine) values: ``rho`` and
    ``rate x es2 / (2 (1 - rho))``."""
    if rate_per_s <= 0 or es <= 0:
        return 0.0, 0.0
    rho = min(rate_per_s * es, 0.999)
    c = max(1, int(replicas))
    a = c * rho
    b = 1.0  # Erlang B by its recursion (stable for any c), then C from B
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    wait_prob = b / (1.0 - rho * (1.0 - b))
    if shared_queue:
        scv = max(es2 / (es * es) - 1.0, 0.0)
        return wait_prob, wait_prob * es / (c * (1.0 - rho)) * (1.0 + scv) / 2.0
    return wait_prob, wait_prob * es2 / (2.0 * es * (1.0 - rho))


class FluidReplicaModel:
    """Fluid-model formulas for one (profile, token mix): steady state at a rate, the largest rate
    one replica sustains, and the largest rate at which it still meets an SLO."""

    def __init__(self, prof: ReplicaProfile, grid: TokenGrid) -> None:
        self.prof = prof
        self.grid = grid
        p = grid.prompt
        o = grid.output
        self.prefill_work_s = (prof.prefill_ms_per_token * p + prof.prefill_ms_per_token_sq * p * p) / 1000.0
        # chunked prefill: a prompt takes ceil(P / max_num_tokens) iterations, each with a decode step
        self.prefill_iters = np.maximum(1.0, np.ceil(p / prof.max_num_tokens))
        self.mean_out = float(o.mean())
        # context held by a decoding sequence, weighted by how long it stays (its output length)
        self.ctx = float((o * (p + 0.5 * o)).sum() / max(o.sum(), 1e-9))
        self.kv_per_req = float((p + o).mean())
        self.max_rate_per_s = self._max_rate()
        self._at_slo: dict[tuple[float, float, float, int, bool], float] = {}
        """``rate_at_slo``'s answers: a pure function of the profile and mix (models of one world
        that share this fluid model ask it once)."""

    def _decode(self, r: float) -> tuple[float, float, float] | None:
        """(batch, prefill util, TPOT s) at rate ``r``, or None when the replica cannot keep up."""
        prof = self.prof
        rho = r * float(self.prefill_work_s.mean())
        per_seq_s = (prof.decode_ms_per_seq + prof.decode_ms_per_context_token * self.ctx) / 1000.0
        d0 = prof.decode_fixed_ms / 1000.0
        denom = (1.0 - rho) - r * self.mean_out * per_seq_s
        if rho >= 0.999 or denom <= 1e-9:
            return None
        batch = r * self.mean_out * d0 / denom
        cap = min(prof.max_batch, prof.kv_cache_tokens / max(self.kv_per_req, 1.0))
        if batch > cap:
            return None
        tpot = (d0 + per_seq_s * batch) / (1.0 - rho)
        return batch, rho, tpot

    def _max_rate(self) -> float:
        lo, hi = 0.0, 1.0
        while self._decode(hi) is not None and hi < 1e6:
            lo, hi = hi, hi * 2
        for _ in range(50):
            mid = (lo + hi) / 2
            if self._decode(mid) is None:
                hi = mid
            else:
                lo = mid
        return lo

    def steady(self, r: float, replicas: int = 1, shared_queue: bool = False) -> SteadyState:
        """The replica at arrival rate ``r`` (capped at its maximum: the excess is the caller's
        backlog), one of ``replicas`` that share the arrivals (the wait before prefill:
        :func:`prefill_wait`)."""
        prof = self.prof
        saturated = r >= self.max_rate_per_s * 0.999
        r_eff = min(r, self.max_rate_per_s * 0.999)
        dec = self._decode(r_eff) if r_eff > 0 else (0.0, 0.0, prof.iteration_s(0, 0))
        assert dec is not None
        batch, rho, tpot = dec
        it_s = prof.iteration_s(batch, batch * self.ctx)
        service = self.prefill_work_s + self.prefill_iters * it_s
        es = float(service.mean())
        es2 = float((service * service).mean())
        rho_q = min(r_eff * es, 0.999)
        wait_prob, mean_wait = prefill_wait(r_eff, es, es2, replicas, shared_queue)
        scale = mean_wait / wait_prob if wait_prob > 1e-12 else 0.0
        busy = 1.0 - math.exp(-(batch + rho_q)) if r_eff > 0 else 0.0
        kv = min(1.0, batch * self.kv_per_req / prof.kv_cache_tokens)
        return SteadyState(r_eff, saturated, batch, rho, tpot, mean_wait, scale, wait_prob, service, busy, kv)

    def attainment(self, st: SteadyState, ttft_s: float, tpot_s: float, extra_wait_s: float = 0.0) -> float:
        """Share of requests meeting both targets at steady state ``st`` (plus a fixed extra wait,
        e.g. a backlog in the gateway)."""
        slack = ttft_s - extra_wait_s - st.service_s
        if st.wait_prob <= 0 or st.wait_scale_s <= 0:
            ok = (slack >= 0).astype(np.float64)
        else:
            ok = np.where(slack >= 0, 1.0 - st.wait_prob * np.exp(-np.maximum(slack, 0) / st.wait_scale_s), 0.0)
        tpot_ok = 1.0 if st.tpot_s <= tpot_s else 0.0
        single = self.grid.output <= 1  # one-token answers have no TPOT
        return float(np.where(single, ok, ok * tpot_ok).mean())

    def idle_attainment(self, ttft_s: float, tpot_s: float) -> float:
        """Share of requests meeting both targets on an idle replica: the most any number of
        replicas attains (a prompt whose prefill alone outlasts the TTFT target misses anyway)."""
        return self.attainment(self.steady(1e-9), ttft_s, tpot_s)

    def attainable(self, ttft_s: float, tpot_s: float, attainment: float = SLO_ATTAINMENT) -> float:
        """The attainment capacity is sized at: ``attainment``, or :data:`ATTAINABLE_MARGIN` below
        :meth:`idle_attainment` where an idle replica attains less (0 or less: nothing to size by)."""
        best = self.idle_attainment(ttft_s, tpot_s)
        return attainment if best >= attainment else best - ATTAINABLE_MARGIN

    def rate_at_slo(self, ttft_s: float, tpot_s: float, attainment: float = SLO_ATTAINMENT, replicas: int = 1,
                    shared_queue: bool = False) -> float:
        """Largest per-replica request rate at which at least ``attainment`` of requests meet both
        targets, for one of ``replicas`` replicas sharing the arrivals (a pool sustains more per
        replica than a lone one: :func:`prefill_wait`). Where even an idle replica attains less
        than ``attainment`` (prompts whose prefill alone outlasts the TTFT target), the rate at
        what :meth:`attainable` allows; 0 where that is nothing."""
        key = (ttft_s, tpot_s, attainment, replicas, shared_queue)
        found = self._at_slo.get(key)
        if found is None:
            found = self._at_slo[key] = self._rate_at_slo(ttft_s, tpot_s, attainment, replicas, shared_queue)
        return found

    def _rate_at_slo(self, ttft_s: float, tpot_s: float, attainment: float, replicas: int,
                     shared_queue: bool) -> float:
        attainment = self.attainable(ttft_s, tpot_s, attainment)
        if attainment <= 0:
            return 0.0

        def ok(r: float) -> bool:
            return self.attainment(self.steady(r, replicas, shared_queue), ttft_s, tpot_s) >= attainment

        if not ok(1e-9):
            return 0.0
        lo, hi = 0.0, self.max_rate_per_s * 0.999
        if ok(hi):
            return hi
        for _ in range(40):
            mid = (lo + hi) / 2
            if ok(mid):
                lo = mid
            else:
                hi = mid
        return lo


def profile_summary(prof: ReplicaProfile) -> dict[str, Any]:
    """Published vs modelled throughput for each calibration point (for docs and tests)."""
    rows = []
    for pt in prof.published:
        model = offline_throughput(prof, pt.input_tokens, pt.output_tokens)
        rows.append({"isl": pt.input_tokens, "osl": pt.output_tokens, "published": pt.output_tokens_per_s,
                     "model": round(model, 1), "ratio": round(model / pt.output_tokens_per_s, 3)})
    return {"points": rows}
