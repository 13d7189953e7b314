"""Synthetic request load for the simulator: a pure, seeded function of time.

The shape is what LLM serving sees in production, reduced to three knobs: a smooth diurnal cycle
between a trough and a peak, plus random bursts (a launch, a batch job, a retry storm) that multiply
the load for a while. Because the load is a function of time alone (not of how often it is sampled),
the same seed gives the same requests whether the daemon ticks every second or every minute, which
is what makes simulator runs comparable between policies.

Time is ``t_s``: seconds since the simulated world's epoch (the curve starts at its trough there).

- Diurnal: a raised cosine, ``base + (peak - base) * (1 - cos(2 pi t / period)) / 2``.
- Bursts: a Poisson process of start times with mean gap ``burst_every_s``; while at least one burst
  is running (``burst_duration_s`` from its start) the load is multiplied by ``burst_factor``
  (overlapping bursts do not compound). Start times are drawn per fixed window of time from a
  generator seeded by ``(seed, stream, window index)``, so any instant can be evaluated without
  replaying the past, and the windows together form one Poisson process.
- ``arrivals(t0_s, t1_s)`` integrates the rate exactly (closed form), so the queueing model that
  integrates between observations loses nothing to sampling.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from controller.config import SimulatedProviders

_TWO_PI = 2.0 * math.pi
_BURSTS_PER_WINDOW = 4.0
"""Mean bursts per generation window: small windows keep look-ups cheap, and the window length has
no effect on the process's statistics."""
_CACHE_MAX = 4096


@dataclass(frozen=True, slots=True)
class LoadShape:
    """The knobs of the curve, in requests per second and seconds."""

    base_requests_per_s: float
    peak_requests_per_s: float
    period_s: float
    burst_every_s: float = 0.0
    """Mean seconds between burst starts (0: no bursts)."""
    burst_factor: float = 1.0
    burst_duration_s: float = 120.0

    @staticmethod
    def from_config(cfg: SimulatedProviders) -> "LoadShape":
        return LoadShape(
            base_requests_per_s=cfg.base_requests_per_s, peak_requests_per_s=cfg.peak_requests_per_s,
            period_s=cfg.period_s, burst_every_s=cfg.burst_every_s, burst_factor=cfg.burst_factor,
            burst_duration_s=cfg.burst_duration_s,
        )


class LoadCurve:
    """Requests per second of one load stream (one model) as a pure function of ``t_s``."""

    __slots__ = ("shape", "seed", "stream", "_window_s", "_cache")

    def __init__(self, shape: LoadShape, seed: int, stream: str = "") -> None:
        if shape.period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {shape.period_s}")
        if min(shape.base_requests_per_s, shape.peak_requests_per_s) < 0:
            raise ValueError(
                f"load must be >= 0, got base {shape.base_requests_per_s} and peak {shape.peak_requests_per_s}")
        self.shape = shape
        self.seed = seed
        self.stream = stream
        self._window_s = shape.burst_every_s * _BURSTS_PER_WINDOW if shape.burst_every_s > 0 else 0.0
        # Memo of burst start times per window: a pure function's cache, bounded.
        self._cache: dict[int, tuple[float, ...]] = {}

    @property
    def max_requests_per_s(self) -> float:
        """Upper bound of the rate at any time (peak of the cycle inside a burst)."""
        s = self.shape
        top = max(s.base_requests_per_s, s.peak_requests_per_s)
        return top * (s.burst_factor if self._window_s > 0 else 1.0)

    # -- diurnal part -----------------------------------------------------------------------------

    def diurnal_requests_per_s(self, t_s: float) -> float:
        s = self.shape
        swing = s.peak_requests_per_s - s.base_requests_per_s
        return s.base_requests_per_s + swing * (1.0 - math.cos(_TWO_PI * t_s / s.period_s)) / 2.0

    def _diurnal_integral(self, t_s: float) -> float:
        """Antiderivative of the diurnal rate (requests), zero at t = 0."""
        s = self.shape
        swing = s.peak_requests_per_s - s.base_requests_per_s
        omega = _TWO_PI / s.period_s
        return s.base_requests_per_s * t_s + swing / 2.0 * (t_s - math.sin(omega * t_s) / omega)

    # -- bursts -----------------------------------------------------------------------------------

    def _starts_in_window(self, k: int) -> tuple[float, ...]:
        starts = self._cache.get(k)
        if starts is None:
            # A string seed is hashed with SHA-512 by ``random``: stable across runs and processes
            # (unlike ``hash()``), and independent between windows and streams.
            rng = random.Random(f"tidegate-load/{self.seed}/{self.stream}/{k}")
            w0 = k * self._window_s
            out: list[float] = []
            offset = rng.expovariate(1.0 / self.shape.burst_every_s)
            while offset < self._window_s:
                out.append(w0 + offset)
                offset += rng.expovariate(1.0 / self.shape.burst_every_s)
            starts = tuple(out)
            if len(self._cache) >= _CACHE_MAX:
                self._cache.clear()
            self._cache[k] = starts
        return starts

    def bursts_overlapping(self, t0_s: float, t1_s: float) -> list[tuple[float, float]]:
        """Merged (start, end) intervals of burst time that overlap ``[t0_s, t1_s]``, sorted."""
        if self._window_s <= 0 or t1_s < t0_s:
            return []
        dur = self.shape.burst_duration_s
        first = math.floor((t0_s - dur) / self._window_s)
        last = math.floor(t1_s / self._window_s)
        raw = [
            (st, st + dur)
            for k in range(first, last + 1)
            for st in self._starts_in_window(k)
            if st <= t1_s and st + dur > t0_s
        ]
        raw.sort()
        merged: list[tuple[float, float]] = []
        for a, b in raw:
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged

    def in_burst(self, t_s: float) -> bool:
        return any(a <= t_s < b for a, b in self.bursts_overlapping(t_s, t_s))

    # -- the load ---------------------------------------------------------------------------------

    def requests_per_s(self, t_s: float) -> float:
        rate = self.diurnal_requests_per_s(t_s)
        return rate * self.shape.burst_factor if self.in_burst(t_s) else rate

    def arrivals(self, t0_s: float, t1_s: float) -> float:
        """Expected requests arriving in ``[t0_s, t1_s]`` (the exact integral of the rate)."""
        if t1_s <= t0_s:
            return 0.0
        total = self._diurnal_integral(t1_s) - self._diurnal_integral(t0_s)
        extra = self.shape.burst_factor - 1.0
        if extra > 0:
            for a, b in self.bursts_overlapping(t0_s, t1_s):
                lo, hi = max(a, t0_s), min(b, t1_s)
                if hi > lo:
                    total += extra * (self._diurnal_integral(hi) - self._diurnal_integral(lo))
        # Rounding in the closed form can leave -1e-15 for a zero-rate stretch: never negative.
        return max(total, 0.0)
