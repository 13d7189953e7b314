"""Workloads for the simulator: real request traces and rate series, and their rescaling.

Two shapes of traffic, both read where they lie (``../shared/data``, never copied):

- A *request trace* in the Azure LLM inference format (``TIMESTAMP,ContextTokens,GeneratedTokens``:
  the 2023 traces, Patel et al., Splitwise, ISCA'24, and the 2024 week traces, Stojkovic et al.,
  DynamoLLM, HPCA'25, whose stamps carry a UTC offset): every request with its arrival time and
  token counts, replayed request by request.
- A *rate series* (requests per minute, e.g. the Azure Functions series cleaned for SpotHedge):
  only counts per bin. Requests are drawn from it (Poisson arrivals, uniform within each bin) with
  prompt and output token counts drawn *jointly* from a request trace's empirical distribution, so
  a long diurnal curve gets realistic LLM requests. Everything random is seeded.

Both rescale: ``time_scale`` compresses or stretches time (0.5: the same requests in half the time,
twice the rate) and ``load_scale`` multiplies the load (a request trace is thinned, or each request
gets extra copies with fresh tokens, spread over the gap to its successor; a rate series is
multiplied). The CLI's
``--peak-replicas N`` picks the load factor so that the busiest minute needs N replicas.

Times are float seconds from the start of the workload (``t_s``); nothing here knows a wall clock.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class TokenDistribution:
    """Empirical joint distribution of (prompt, output) token counts, sampled with replacement."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __post_init__(self) -> None:
        if len(self.prompt_tokens) == 0 or len(self.prompt_tokens) != len(self.output_tokens):
            raise ValueError("a token distribution needs at least one (prompt, output) pair")

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` (prompt, output) pairs drawn jointly (so long prompts keep their own outputs)."""
        idx = rng.integers(0, len(self.prompt_tokens), size=n)
        return self.prompt_tokens[idx], self.output_tokens[idx]

    @property
    def mean_prompt(self) -> float:
        return float(self.prompt_tokens.mean())

    @property
    def mean_output(self) -> float:
        return float(self.output_tokens.mean())

    def quantile_grid(self, points: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """(prompt, output) pairs at ``points`` equally weighted quantiles of the prompt length,
        each with the mean output of requests in that slice: what the fluid model integrates over
        instead of individual requests."""
        order = np.argsort(self.prompt_tokens, kind="stable")
        p = self.prompt_tokens[order].astype(np.float64)
        o = self.output_tokens[order].astype(np.float64)
        edges = np.linspace(0, len(p), points + 1).astype(int)
        pp = np.empty(points)
        oo = np.empty(points)
        for i in range(points):
            a, b = edges[i], max(edges[i + 1], edges[i] + 1)
            pp[i] = p[a:b].mean()
            oo[i] = o[a:b].mean()
        return pp, oo


@dataclass(frozen=True)
class RequestTrace:
    """Requests with arrival times (seconds from the start, sorted) and token counts."""

    name: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if not (len(self.prompt_tokens) == n == len(self.output_tokens)):
            raise ValueError("arrival_s, prompt_tokens and output_tokens must have the same length")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def tokens(self) -> TokenDistribution:
        return TokenDistribution(self.prompt_tokens, self.output_tokens)

    def rate_per_s(self, bin_s: float, duration_s: float | None = None) -> np.ndarray:
        """Arrivals per second in consecutive bins of ``bin_s`` seconds."""
        end = self.duration_s if duration_s is None else duration_s
        nbins = max(1, int(math.ceil((end + 1e-9) / bin_s)))
        counts = np.bincount(np.minimum((self.arrival_s / bin_s).astype(np.int64), nbins - 1),
                             minlength=nbins)
        return counts / bin_s

    def time_scale(self, factor: float) -> "RequestTrace":
        if factor <= 0:
            raise ValueError(f"time scale must be > 0, got {factor}")
        return RequestTrace(self.name, self.arrival_s * factor, self.prompt_tokens, self.output_tokens)

    def load_scale(self, factor: float, rng: np.random.Generator, jitter_s: float = 1.0) -> "RequestTrace":
        """Thin (``factor < 1``: keep each request with that probability) or multiply (each request
        gets ``floor(factor)`` or ``ceil(factor)`` instances; the extra ones arrive uniformly between
        the original and the next request (the last: over the gap before it), or within ``jitter_s``
        of it where that gap is shorter, with tokens drawn from the trace's own distribution).

        Spreading the copies over the gap keeps the trace's rate at its own resolution: each gap
        carries ``factor`` times its requests, as ``factor`` times the users would send. Copies
        within a fixed second instead stack ``factor`` requests into each request's first second
        and leave the rest of the gap empty: on a sparse trace scaled many times (a request every
        10 s, x250 to reach a 16-replica peak) that is a burst of 250 requests a second every 10 s,
        which no fleet serves within a TTFT target, made by the scaling and not by the trace."""
        if factor <= 0:
            raise ValueError(f"load scale must be > 0, got {factor}")
        n = len(self)
        if factor < 1.0:
            keep = rng.random(n) < factor
            return RequestTrace(self.name, self.arrival_s[keep], self.prompt_tokens[keep], self.output_tokens[keep])
        whole = int(math.floor(factor))
        copies = np.full(n, whole, dtype=np.int64) + (rng.random(n) < factor - whole)
        extra = copies - 1
        src = np.repeat(np.arange(n), extra)
        gap = np.diff(self.arrival_s, append=np.nan) if n else np.zeros(0)
        if n:  # the last request has no successor: its copies take the gap before it
            gap[-1] = gap[-2] if n > 1 else jitter_s
        spread = np.maximum(gap, jitter_s)[src]
        t = np.concatenate([self.arrival_s, self.arrival_s[src] + rng.random(len(src)) * spread])
        p_new, o_new = self.tokens().sample(len(src), rng)
        p = np.concatenate([self.prompt_tokens, p_new])
        o = np.concatenate([self.output_tokens, o_new])
        order = np.argsort(t, kind="stable")
        return RequestTrace(self.name, t[order], p[order], o[order])

    def window(self, start_s: float, end_s: float) -> "RequestTrace":
        """The requests in ``[start_s, end_s)``, times from ``start_s``."""
        a, b = np.searchsorted(self.arrival_s, [start_s, end_s], side="left")
        return RequestTrace(self.name, self.arrival_s[a:b] - start_s, self.prompt_tokens[a:b], self.output_tokens[a:b])

    def head(self, duration_s: float) -> "RequestTrace":
        k = int(np.searchsorted(self.arrival_s, duration_s, side="right"))
        return RequestTrace(self.name, self.arrival_s[:k], self.prompt_tokens[:k], self.output_tokens[:k])


@dataclass(frozen=True)
class RateSeries:
    """Arrival rate in consecutive bins: ``rate_per_s[i]`` holds over ``[i*bin_s, (i+1)*bin_s)``."""

    name: str
    bin_s: float
    rate_per_s: np.ndarray
    tokens: TokenDistribution
    repeats: bool = False
    """Starts over at its end (a load curve without end, for the world the daemon drives); else
    the rate is 0 past the end."""

    @property
    def duration_s(self) -> float:
        return self.bin_s * len(self.rate_per_s)

    @property
    def expected_requests(self) -> float:
        return float(self.rate_per_s.sum() * self.bin_s)

    def rate_at(self, t_s: float) -> float:
        i = int(t_s // self.bin_s)
        if self.repeats and i >= 0:
            i %= len(self.rate_per_s)
        if i < 0 or i >= len(self.rate_per_s):
            return 0.0
        return float(self.rate_per_s[i])

    def time_scale(self, factor: float) -> "RateSeries":
        if factor <= 0:
            raise ValueError(f"time scale must be > 0, got {factor}")
        return RateSeries(self.name, self.bin_s * factor, self.rate_per_s / factor, self.tokens)

    def load_scale(self, factor: float) -> "RateSeries":
        if factor <= 0:
            raise ValueError(f"load scale must be > 0, got {factor}")
        return RateSeries(self.name, self.bin_s, self.rate_per_s * factor, self.tokens)

    def window(self, start_s: float, end_s: float) -> "RateSeries":
        """The bins in ``[start_s, end_s)`` (whole bins), times from ``start_s``."""
        a = int(start_s // self.bin_s)
        b = max(a + 1, int(math.ceil(end_s / self.bin_s - 1e-9)))
        return RateSeries(self.name, self.bin_s, self.rate_per_s[a:b], self.tokens)

    def head(self, duration_s: float) -> "RateSeries":
        k = max(1, int(math.ceil(duration_s / self.bin_s - 1e-9)))
        return RateSeries(self.name, self.bin_s, self.rate_per_s[:k], self.tokens)

    def to_requests(self, rng: np.random.Generator) -> RequestTrace:
        """Poisson arrivals per bin, uniform within the bin, tokens drawn jointly (seeded)."""
        counts = rng.poisson(self.rate_per_s * self.bin_s)
        n = int(counts.sum())
        bins = np.repeat(np.arange(len(counts)), counts)
        t = (bins + rng.random(n)) * self.bin_s
        t.sort(kind="stable")
        p, o = self.tokens.sample(n, rng)
        return RequestTrace(self.name, t, p, o)


class CurveSeries(RateSeries):
    """A ``RateSeries`` whose bins are computed when read, from ``arrivals(t0_s, t1_s)`` (a pure
    function of time: ``load.LoadCurve.arrivals``): bin ``i`` is ``arrivals(i*bin_s,
    (i+1)*bin_s) / bin_s`` over ``bins`` bins, repeated when ``repeats``. The same values as the
    series built bin by bin up front, without holding them: a world of a thousand models would
    otherwise hold (and compute at its start) a week of bins per model. ``rate_per_s`` builds the
    whole array on first use (for the simulator's oracle and statistics) and keeps it."""

    def __init__(self, name: str, bin_s: float, bins: int, arrivals: Callable[[float, float], float],
                 tokens: TokenDistribution, repeats: bool = False) -> None:
        if bins <= 0 or bin_s <= 0:
            raise ValueError(f"a curve series needs bins > 0 and bin_s > 0, got {bins} and {bin_s}")
        for k, v in (("name", name), ("bin_s", bin_s), ("tokens", tokens), ("repeats", repeats), ("bins", bins),
                     ("arrivals", arrivals), ("_full", None)):
            object.__setattr__(self, k, v)

    bins: int
    arrivals: Callable[[float, float], float]
    _full: np.ndarray | None

    def _bin(self, i: int) -> float:
        return self.arrivals(i * self.bin_s, (i + 1) * self.bin_s) / self.bin_s

    @property  # type: ignore[override]
    def rate_per_s(self) -> np.ndarray:
        if self._full is None:
            object.__setattr__(self, "_full", np.fromiter((self._bin(i) for i in range(self.bins)),
                                                          dtype=np.float64, count=self.bins))
        assert self._full is not None
        return self._full

    @property
    def duration_s(self) -> float:
        return self.bin_s * self.bins

    def rate_at(self, t_s: float) -> float:
        i = int(t_s // self.bin_s)
        if self.repeats and i >= 0:
            i %= self.bins
        if i < 0 or i >= self.bins:
            return 0.0
        return self._bin(i)

    def head(self, duration_s: float) -> RateSeries:
        k = min(self.bins, max(1, int(math.ceil(duration_s / self.bin_s - 1e-9))))
        return RateSeries(self.name, self.bin_s, np.fromiter((self._bin(i) for i in range(k)), dtype=np.float64,
                                                             count=k), self.tokens)

    def __repr__(self) -> str:
        return f"CurveSeries({self.name!r}, bin_s={self.bin_s}, bins={self.bins}, repeats={self.repeats})"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


Workload = RequestTrace | RateSeries


def _token_count(text: str) -> int:
    """A token count as a whole number; ``1619.0`` too (a CSV written through a float column)."""
    try:
        return int(text)
    except ValueError:
        value = float(text)
        if not value.is_integer():
            raise ValueError(f"token count {text.strip()!r} is not a whole number") from None
        return int(value)


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
"""The Azure LLM inference traces' header (2023 and 2024 releases alike)."""


def _split_offset(stamp: str) -> tuple[str, int]:
    """(``stamp`` without its UTC offset, the offset in minutes east of UTC). The 2024 Azure traces
    write ``2024-05-10 00:00:00.009930+00:00`` (and ``...00:00:00+00:00`` where the fraction is
    zero); ISO writers also give ``Z`` and ``+0200``. A stamp without a time of day is left as is."""
    if stamp[-1:] in ("Z", "z") and ":" in stamp:
        return stamp[:-1], 0
    n = len(stamp)
    if n > 6 and stamp[-6] in "+-" and stamp[-3] == ":":
        body, sign, hh, mm = stamp[:-6], stamp[-6], stamp[-5:-3], stamp[-2:]
    elif n > 5 and stamp[-5] in "+-":
        body, sign, hh, mm = stamp[:-5], stamp[-5], stamp[-4:-2], stamp[-2:]
    else:
        return stamp, 0
    if ":" not in body or not (hh.isdigit() and mm.isdigit()):
        return stamp, 0
    minutes = int(hh) * 60 + int(mm)
    return body, -minutes if sign == "-" else minutes


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


CHUNK_ROWS = 500_000
"""Rows read into Python lists before they become arrays: a week of the 2024 traces (17-27 million
rows) is read in chunks, so memory holds the arrays and one chunk, not a list of every row."""


class _Chunk:
    """One chunk of a trace being read: rows as Python values until :meth:`flush` makes arrays."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lines: list[int] = []
        self.stamps: list[str] = []
        self.offsets: list[int] = []  # minutes east of UTC, per row; empty while every row has none
        self.prompts: list[int] = []
        self.outputs: list[int] = []

    def add(self, path: Path, lineno: int, row: list[str]) -> None:
        try:
            stamp, offset = _split_offset(row[0].strip())
            self.stamps.append(stamp.replace(" ", "T"))
            self.prompts.append(_token_count(row[1]))
            self.outputs.append(_token_count(row[2]))
        except (IndexError, ValueError) as e:
            raise ValueError(f"{path}:{lineno}: cannot parse {row!r}: {e}") from e
        self.lines.append(lineno)
        if offset or self.offsets:
            if not self.offsets:
                self.offsets = [0] * (len(self.stamps) - 1)
            self.offsets.append(offset)
        if self.prompts[-1] < 0 or self.outputs[-1] < 0:
            raise ValueError(f"{path}:{lineno}: negative token count in {row!r}: ContextTokens and "
                             "GeneratedTokens are counts, 0 or more")

    def flush(self, path: Path, numeric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(times: seconds as float64 for a numeric column, else UTC nanoseconds as int64; prompt
        and output tokens), and the chunk emptied."""
        if numeric:
            t = _seconds(path, self.stamps, self.lines)
        else:
            ts = _datetimes(path, self.stamps, self.lines)
            if self.offsets:
                ts = ts - np.array(self.offsets, dtype="timedelta64[m]").astype("timedelta64[ns]")
            t = ts.astype(np.int64)
        out = (t, np.array(self.prompts, dtype=np.int64), np.array(self.outputs, dtype=np.int64))
        self.reset()
        return out


def read_azure_trace(path: str | Path, name: str | None = None, start: np.datetime64 | None = None) -> RequestTrace:
    """Read ``TIMESTAMP,ContextTokens,GeneratedTokens`` (the Azure LLM inference traces, 2023 and
    2024); arrival times become seconds after ``start`` (naive UTC; default: the first request,
    which drops any idle lead before it).

    TIMESTAMP is a date and time (``2023-11-16 18:17:03.9799600``, or with a UTC offset as the 2024
    traces write it, ``2024-05-10 00:00:00.009930+00:00``: an offset is applied, so stamps in
    different offsets compare as the instants they are), or a number of seconds (a trace converted
    from another format: times relative to any origin; ``start`` then does not apply). A byte-order
    mark and CRLF line ends are read as a spreadsheet writes them; rows may come in any order; a
    row that does not parse is refused with its line. Read in chunks of ``CHUNK_ROWS`` rows."""
    path = Path(path)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    chunk = _Chunk()
    numeric: bool | None = None
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip().lower() for h in header[:3]] != [c.lower() for c in AZURE_COLUMNS]:
            raise ValueError(f"{path}: expected header {','.join(AZURE_COLUMNS)}, got {header}")
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            chunk.add(path, lineno, row)
            if numeric is None:
                numeric = _is_number(chunk.stamps[0])
            if len(chunk.stamps) >= CHUNK_ROWS:
                parts.append(chunk.flush(path, numeric))
    if chunk.stamps:
        parts.append(chunk.flush(path, bool(numeric)))
    if not parts:
        raise ValueError(f"{path}: no requests")
    t_raw = np.concatenate([p[0] for p in parts])
    prompts = np.concatenate([p[1] for p in parts])
    outputs = np.concatenate([p[2] for p in parts])
    if numeric:
        if start is not None:
            raise ValueError(f"{path}: TIMESTAMP holds seconds, not dates: a trace start does not apply "
                             "(leave --trace-start out; the first request is t = 0)")
        t = t_raw - t_raw.min()
    else:
        first = t_raw.min()
        origin = first if start is None else np.datetime64(start, "ns").astype(np.int64)
        if first < origin:
            raise ValueError(f"{path}: the trace start {np.datetime64(int(origin), 'ns')} is after its first "
                             f"request {np.datetime64(int(first), 'ns')}: pass a start at or before it")
        t = (t_raw - origin) / 1e9
    order = np.argsort(t, kind="stable")
    # Zero-token outputs still cost a prefill and yield one token in practice: count them as one.
    return RequestTrace(name or path.stem, t[order], prompts[order], np.maximum(outputs, 1)[order])


def _datetimes(path: Path, stamps: list[str], lines: list[int]) -> np.ndarray:
    """The stamps (offsets removed) as naive ``datetime64[ns]``, or the line of the first refused."""
    try:
        return np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        # numpy names the value, not the line: find the first stamp it refuses (the error path only)
        for lineno, stamp in zip(lines, stamps):
            try:
                np.datetime64(stamp, "ns")
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: cannot parse the TIMESTAMP {stamp.replace('T', ' ')!r}: {e}; "
                                 "expected e.g. 2023-11-16 18:15:46.6805900, 2024-05-10 00:00:00.009930+00:00 "
                                 "or seconds") from e
        raise


def _seconds(path: Path, stamps: list[str], lines: list[int]) -> np.ndarray:
    """The stamps as seconds (a numeric TIMESTAMP column), or the line of the first that is not one."""
    try:
        t = np.array(stamps, dtype=np.float64)
    except ValueError:
        t = None
    if t is None or not np.isfinite(t).all():
        for lineno, stamp in zip(lines, stamps):
            if not _is_number(stamp) or not math.isfinite(float(stamp)):
                raise ValueError(f"{path}:{lineno}: TIMESTAMP {stamp!r} is not a number of seconds, as the "
                                 "first row's is (a column holds seconds or dates, not both)")
    assert t is not None
    return t


def read_rate_series(path: str | Path, tokens: TokenDistribution, bin_s: float = 60.0,
                     name: str | None = None) -> RateSeries:
    """Read a two-column CSV (bin index, requests in that bin), e.g. ``Time (min),Requests``; the bin
    width is ``bin_s`` seconds (60 for per-minute series). Each count goes to its bin, counted from
    the first: rows may come in any order, and a bin with no row holds no requests (an export that
    leaves out idle minutes keeps its gaps). An index that is not a whole number, a bin given twice,
    and a count that is negative or not a number are refused with their line."""
    path = Path(path)
    rows: dict[int, tuple[int, float]] = {}
    with path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or len(header) < 2:
            raise ValueError(f"{path}: expected a header with two columns (time, requests), got {header}")
        for lineno, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                at, count = float(row[0]), float(row[1])
            except (IndexError, ValueError) as e:
                raise ValueError(f"{path}:{lineno}: cannot parse {row!r}: {e}") from e
            if not math.isfinite(at) or at != round(at):
                raise ValueError(f"{path}:{lineno}: bin index {row[0]!r} is not a whole number (the first column "
                                 f"counts bins of {bin_s:g} s)")
            if not math.isfinite(count) or count < 0:
                raise ValueError(f"{path}:{lineno}: request count {row[1]!r} is not a number >= 0")
            b = int(at)
            if b in rows:
                raise ValueError(f"{path}:{lineno}: bin {b} is given twice (first on line {rows[b][0]})")
            rows[b] = (lineno, count)
    if not rows:
        raise ValueError(f"{path}: no rows")
    first = min(rows)
    c = np.zeros(max(rows) - first + 1, dtype=np.float64)
    for b, (_, count) in rows.items():
        c[b - first] = count
    return RateSeries(name or path.stem, bin_s, c / bin_s, tokens)


def peak_rate_per_s(workload: Workload, window_s: float = 60.0) -> float:
    """Highest mean arrival rate over consecutive windows of ``window_s`` seconds."""
    if isinstance(workload, RequestTrace):
        if len(workload) == 0:
            return 0.0
        return float(workload.rate_per_s(window_s).max())
    per = max(1, int(round(window_s / workload.bin_s)))
    r = workload.rate_per_s
    if per == 1:
        return float(r.max())
    k = len(r) // per
    if k == 0:
        return float(r.mean())
    return float(r[: k * per].reshape(k, per).mean(axis=1).max())


def rate_profile(workload: Workload, bin_s: float, duration_s: float) -> np.ndarray:
    """Mean arrivals per second in consecutive bins of ``bin_s`` over ``[0, duration_s)`` (what the
    oracle knows of the future)."""
    nbins = max(1, int(math.ceil(duration_s / bin_s - 1e-9)))
    if isinstance(workload, RequestTrace):
        counts = np.bincount(np.minimum((workload.arrival_s / bin_s).astype(np.int64), nbins - 1), minlength=nbins)
        return counts[:nbins] / bin_s
    edges = np.arange(nbins) * bin_s
    src = np.minimum((edges / workload.bin_s).astype(np.int64), len(workload.rate_per_s) - 1)
    # averaging when bins are coarser than the series keeps the expected request count
    if bin_s > workload.bin_s:
        per = bin_s / workload.bin_s
        cum = np.concatenate([[0.0], np.cumsum(workload.rate_per_s)])
        lo = np.clip(edges / workload.bin_s, 0, len(workload.rate_per_s))
        hi = np.clip((edges + bin_s) / workload.bin_s, 0, len(workload.rate_per_s))
        lo_i, hi_i = lo.astype(np.int64), hi.astype(np.int64)
        return (cum[hi_i] - cum[lo_i]) / per
    return workload.rate_per_s[src]


def causal_attainment_bound(workload: Workload, duration_s: float, bin_s: float = 60.0,
                            warm_s: float = 600.0, ready_after_s: float = 0.0) -> float:
    """The most a controller that cannot see the future can serve on time, on this workload's shape.

    A generous causal controller: it remembers everything and holds capacity for the busiest
    ``bin_s`` bin it has seen, forever (from the start it holds what the busiest bin of the first
    ``warm_s`` seconds needs: the simulator's warm initial fleet); capacity it orders on seeing a
    bin serves from ``ready_after_s`` after that bin's end (0: at once; the fastest cold start is
    the honest figure). In a bin busier than what it holds, it serves only what it holds, the rest
    is late. The share it serves bounds the SLO attainment of any causal controller that never
    holds more than it has seen, whatever it spends; only one that holds more than any load seen
    so far (or the oracle, which knows the future) can do better. Sub-bin bursts are not counted,
    so the true bound is lower still.
    """
    counts = rate_profile(workload, bin_s, duration_s) * bin_s
    total = float(counts.sum())
    if total <= 0:
        return 1.0
    n = len(counts)
    warm = max(1, int(math.ceil(min(warm_s, duration_s) / bin_s)))
    lag = 1 + int(math.ceil(ready_after_s / bin_s - 1e-9))  # bins between a bin and its capacity
    seen = np.maximum.accumulate(counts)
    held = np.full(n, counts[:warm].max())
    if n > lag:
        held[lag:] = np.maximum(held[lag:], seen[: n - lag])
    return float(np.minimum(counts, held).sum() / total)
