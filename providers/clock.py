"""The daemon's clocks: one protocol (``controller.protocols.Clock``), three ways to tell time.

Decision code never reads the clock; the daemon reads one of these once per tick and passes the
result down as ``now``. Swapping the clock is how the same loop runs live (``SystemClock``), as a
demo that compresses a day into minutes (``AcceleratedClock``), and in tests and the simulator,
where time moves only when told to (``ManualClock``). Every clock returns timezone-aware UTC.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Callable


def _require_aware(t: datetime, what: str) -> datetime:
    """Naive datetimes are ambiguous (local? UTC?); refuse them instead of guessing."""
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {t.isoformat()}")
    return t.astimezone(timezone.utc)


class SystemClock:
    """The real wall clock, in UTC."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)


class AcceleratedClock:
    """Simulated time that runs ``speedup`` times faster than wall time from the clock's creation.

    ``now() = start + (wall elapsed since creation) * speedup``. Wall time is read from a monotonic
    source (``time.monotonic`` by default), so NTP steps of the system clock do not make simulated
    time jump; tests inject ``wall`` to check the arithmetic without sleeping.
    """

    def __init__(
        self,
        speedup: float,
        start: datetime | None = None,
        *,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        if not speedup > 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self._speedup = float(speedup)
        self._wall = wall
        self._wall_start_s = wall()
        self._start = _require_aware(start, "start") if start is not None else datetime.now(timezone.utc)

    @property
    def speedup(self) -> float:
        """Simulated seconds per wall second."""
        return self._speedup

    @property
    def start(self) -> datetime:
        """Simulated time at the clock's creation."""
        return self._start

    def now(self) -> datetime:
        elapsed_wall_s = self._wall() - self._wall_start_s
        return self._start + timedelta(seconds=elapsed_wall_s * self._speedup)

    def wall_seconds_for(self, sim_seconds: float) -> float:
        """Wall seconds that pass while ``sim_seconds`` of simulated time pass (e.g. to turn a
        5 s tick interval into the scheduler's wall interval)."""
        return sim_seconds / self._speedup

    def sim_seconds_for(self, wall_seconds: float) -> float:
        """Simulated seconds that pass during ``wall_seconds`` of wall time."""
        return wall_seconds * self._speedup


class ManualClock:
    """A clock that moves only when told to: for tests and the offline simulator."""

    def __init__(self, start: datetime) -> None:
        self._now = _require_aware(start, "start")

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> datetime:
        """Move forward by ``seconds`` (>= 0) and return the new time."""
        if seconds < 0:
            raise ValueError(f"advance() takes seconds >= 0, got {seconds}; use set() to go back")
        self._now = self._now + timedelta(seconds=seconds)
        return self._now

    def set(self, t: datetime) -> datetime:
        """Jump to ``t``. Going backwards is allowed on purpose: it lets tests check that callers
        cope with a clock step (the simulated world itself never runs backwards)."""
        self._now = _require_aware(t, "t")
        return self._now
