"""Spot behaviour for the simulator: interruptions and capacity shortages, replayed or drawn.

Real traces (read where they lie, never copied):

- SpotServe (ASPLOS'24, Apache-2.0) ``trace_full/g4dn.csv`` (``time_ms,add|remove,node``) and the
  ``trace_seg/*.txt`` JSON-lines segments (``[time_ms, "add"|"remove"|"DONE", {"nodes": [...]}]``):
  AWS g4dn spot instances joining and being preempted. The count of live instances over time, as a
  fraction of the most ever alive, is the pool's available capacity; a drop is a preemption.
- SkyPilot spot traces (Wu et al., "Can't Be Late", NSDI'24) ``{"metadata": {"gap_seconds": N},
  "data": [count, ...]}``: every ``gap_seconds`` the number of instances available (probing
  launches). Files under ``preemption/`` count instances that survived: a drop is a preemption.
  Files under ``availability/`` say whether a *launch* would succeed: they gate launches only.

A trace is mapped onto a pool by scale: a fraction ``f(t)`` (count / the trace's maximum) of
``scale_nodes`` nodes (default the pool's ``max_nodes``) may exist at ``t``. Launches fail while the
pool already holds that many; when a preemption trace drops below the nodes alive, the excess nodes
(newest first, ties broken by a seeded draw) get an interruption notice and vanish after the cloud's
notice period: two minutes on AWS, thirty seconds on GCP. The trace starts, by default, at its first
point with capacity (so a run does not begin inside an outage) and wraps around at its end.

Without a trace, interruptions can be drawn at a rate (per node-hour, exponential node lifetimes,
seeded per pool) and unavailability windows given explicitly (launches fail inside them).
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEFAULT_NOTICE_S = 120.0
"""Notice for a pool whose provider states none (e.g. an on-prem pool given capacity windows).
Each provider states its own (``providers.registry``: aws 120 s, gcp 30 s)."""


@dataclass(frozen=True)
class SpotTrace:
    """Available capacity as a step function of time: ``fraction[i]`` holds from ``times_s[i]``."""

    name: str
    times_s: np.ndarray
    fraction: np.ndarray
    period_s: float
    """Length of the trace; it wraps around after this."""
    preempts: bool
    """True when drops are preemptions of running instances (else they only block launches)."""

    def __post_init__(self) -> None:
        if len(self.times_s) == 0 or len(self.times_s) != len(self.fraction):
            raise ValueError(f"spot trace {self.name}: needs at least one point")
        if self.period_s <= 0:
            raise ValueError(f"spot trace {self.name}: period must be > 0")

    def fraction_at(self, t_s: float) -> float:
        tt = t_s % self.period_s
        i = int(np.searchsorted(self.times_s, tt, side="right")) - 1
        return float(self.fraction[max(i, 0)])

    def next_change_after(self, t_s: float) -> float:
        """The first time strictly after ``t_s`` at which the fraction may change."""
        base = math.floor(t_s / self.period_s) * self.period_s
        tt = t_s - base
        i = int(np.searchsorted(self.times_s, tt, side="right"))
        if i < len(self.times_s):
            return base + float(self.times_s[i])
        return base + self.period_s + float(self.times_s[0]) if self.times_s[0] > 0 else base + self.period_s

    def rolled(self, offset_s: float) -> "SpotTrace":
        """The same trace started ``offset_s`` seconds in (wrapping)."""
        off = offset_s % self.period_s
        if off == 0:
            return self
        t = (self.times_s - off) % self.period_s
        # the point in force at the new origin
        f0 = self.fraction_at(off)
        order = np.argsort(t, kind="stable")
        t, f = t[order], self.fraction[order]
        keep = t > 0
        return SpotTrace(self.name, np.concatenate([[0.0], t[keep]]), np.concatenate([[f0], f[keep]]),
                         self.period_s, self.preempts)

    def start_at_first_capacity(self) -> "SpotTrace":
        nz = np.nonzero(self.fraction > 0)[0]
        if len(nz) == 0 or self.times_s[nz[0]] == 0:
            return self
        return self.rolled(float(self.times_s[nz[0]]))

    @property
    def mean_fraction(self) -> float:
        dur = np.diff(np.concatenate([self.times_s, [self.period_s]]))
        return float((dur * self.fraction).sum() / self.period_s)

    def drops(self) -> int:
        return int((np.diff(self.fraction) < 0).sum())


def _compress(times: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    keep = np.concatenate([[True], values[1:] != values[:-1]])
    return times[keep], values[keep]


def read_skypilot_trace(path: str | Path, preempts: bool | None = None) -> SpotTrace:
    """A SkyPilot spot trace JSON; ``preempts`` defaults to whether the path has ``preemption``."""
    path = Path(path)
    doc = json.loads(path.read_text())
    try:
        gap = float(doc["metadata"]["gap_seconds"])
        data = np.asarray(doc["data"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a SkyPilot spot trace ({{metadata: {{gap_seconds}}, data: [...]}}): {e}") from e
    if len(data) == 0 or gap <= 0:
        raise ValueError(f"{path}: empty trace or gap_seconds <= 0")
    top = data.max()
    frac = data / top if top > 0 else data
    times = np.arange(len(data)) * gap
    times, frac = _compress(times, frac)
    if preempts is None:
        preempts = "preemption" in path.parts
    return SpotTrace(path.stem, times, frac, len(data) * gap, preempts)


def _from_events(name: str, events: list[tuple[float, str, list[str]]], end_s: float | None) -> SpotTrace:
    alive: set[str] = set()
    times: list[float] = [0.0]
    counts: list[int] = [0]
    for t, ev, nodes in sorted(events, key=lambda e: e[0]):
        if ev == "add":
            alive.update(nodes)
        elif ev == "remove":
            alive.difference_update(nodes)
        else:
            continue
        if t == times[-1]:
            counts[-1] = len(alive)
        else:
            times.append(t)
            counts.append(len(alive))
    c = np.asarray(counts, dtype=np.float64)
    top = c.max()
    frac = c / top if top > 0 else c
    t_arr, frac = _compress(np.asarray(times), frac)
    period = end_s if end_s is not None else float(t_arr[-1]) + 60.0
    return SpotTrace(name, t_arr, frac, max(period, float(t_arr[-1]) + 1e-3), True)


def read_spotserve_trace(path: str | Path) -> SpotTrace:
    """SpotServe's ``g4dn.csv`` (``time_ms,add|remove,node``) or a ``trace_seg`` JSON-lines file."""
    path = Path(path)
    events: list[tuple[float, str, list[str]]] = []
    end_s: float | None = None
    text = path.read_text()
    if path.suffix == ".csv":
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            parts = [x.strip() for x in line.split(",")]
            try:
                events.append((float(parts[0]) / 1000.0, parts[1], [parts[2]]))
            except (IndexError, ValueError) as e:
                raise ValueError(f"{path}:{lineno}: expected time_ms,add|remove,node: {line!r}") from e
    else:
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                t_ms, ev, body = json.loads(line)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: expected [time_ms, event, {{nodes: [...]}}]: {line!r}") from e
            if ev == "DONE":
                end_s = float(t_ms) / 1000.0
                continue
            events.append((float(t_ms) / 1000.0, str(ev), list(body.get("nodes", []))))
    if not events:
        raise ValueError(f"{path}: no add/remove events")
    return _from_events(path.stem, events, end_s)


def load_spot_trace(path: str | Path) -> SpotTrace:
    """Any of the supported formats, by extension and content."""
    path = Path(path)
    if path.suffix == ".json":
        return read_skypilot_trace(path)
    return read_spotserve_trace(path)


@dataclass
class SpotModel:
    """Spot behaviour of one pool during one run."""

    notice_s: float = DEFAULT_NOTICE_S
    """Seconds between an interruption notice and the node's loss (the pool provider's)."""
    trace: SpotTrace | None = None
    scale_nodes: int = 1
    """Nodes that fraction 1.0 of the trace stands for."""
    interruptions_per_node_hour: float = 0.0
    """Drawn interruptions (exponential node lifetimes); used with or without a trace."""
    unavailable_windows: tuple[tuple[float, float], ...] = ()
    """(start_s, end_s) intervals during which launches fail."""
    seed: int = 0
    pool: str = ""
    _rng_made: np.random.Generator | None = field(default=None, init=False, repr=False)

    @property
    def _rng(self) -> np.random.Generator:
        """The pool's own draws, made at the first (a pool that never draws, as in the daemon's
        world of a thousand models, holds no generator; the draws are the same either way)."""
        if self._rng_made is None:
            self._rng_made = np.random.default_rng([self.seed, zlib.crc32(self.pool.encode())])
        return self._rng_made

    def capacity_nodes(self, t_s: float) -> int | None:
        """Nodes the cloud will let this pool hold at ``t_s`` (``None``: no limit)."""
        for a, b in self.unavailable_windows:
            if a <= t_s < b:
                return 0
        if self.trace is None:
            return None
        return int(math.floor(self.trace.fraction_at(t_s) * self.scale_nodes + 1e-9))

    def limit_reason(self, t_s: float) -> str:
        for a, b in self.unavailable_windows:
            if a <= t_s < b:
                return f"capacity unavailable window {a:.0f}-{b:.0f}s"
        if self.trace is not None:
            return f"spot trace {self.trace.name}: {self.capacity_nodes(t_s)} node(s) available"
        return "no capacity"

    def next_change_after(self, t_s: float) -> float:
        """Next time the capacity may change (trace steps and window edges)."""
        nxt = math.inf
        for a, b in self.unavailable_windows:
            if a > t_s:
                nxt = min(nxt, a)
            if b > t_s:
                nxt = min(nxt, b)
        if self.trace is not None:
            nxt = min(nxt, self.trace.next_change_after(t_s))
        return nxt

    @property
    def trace_preempts(self) -> bool:
        return self.trace is not None and self.trace.preempts

    def draw_lifetime_s(self) -> float:
        """Seconds until a new node gets an interruption notice (drawn; ``inf`` without a rate)."""
        if self.interruptions_per_node_hour <= 0:
            return math.inf
        return float(self._rng.exponential(3600.0 / self.interruptions_per_node_hour))

    def tie_break(self, n: int) -> np.ndarray:
        return self._rng.random(n)
