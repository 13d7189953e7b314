"""Latency statistics of the simulator: an exact, fast percentile and log-spaced histograms."""

from __future__ import annotations

import math

import numpy as np

# latency histograms (fluid mode and timelines): log-spaced seconds
HIST_LO_S, HIST_HI_S, HIST_BINS = 1e-3, 1e5, 320
_HIST_EDGES = np.logspace(math.log10(HIST_LO_S), math.log10(HIST_HI_S), HIST_BINS + 1)
HIST_MID_S = np.sqrt(_HIST_EDGES[:-1] * _HIST_EDGES[1:])
_LOG_LO = math.log10(HIST_LO_S)
_BINS_PER_DECADE = HIST_BINS / (math.log10(HIST_HI_S) - _LOG_LO)

ZERO_HIST = np.zeros(HIST_BINS)
ZERO_HIST.flags.writeable = False
"""The empty histogram, shared (read-only): a model's histograms start as it and are allocated by
:func:`hist_add` when something is first added (2.5 KB each, six a model: 15 MB of a
1,000-model world that mostly serves without queueing)."""


def hist_add(h: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``h + x``: added in place into ``h``, or a new array when ``h`` is :data:`ZERO_HIST`."""
    if h is ZERO_HIST:
        return x.copy()
    h += x
    return h


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
