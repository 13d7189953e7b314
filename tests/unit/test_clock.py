"""The clocks: protocol conformance, accelerated-clock arithmetic (with an injected wall source, no
sleeping) and the manual clock's moves."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, strategies as st

from controller.protocols import Clock
from providers.clock import AcceleratedClock, ManualClock, SystemClock

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


class FakeWall:
    """A monotonic wall source the test moves by hand."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.s = start_s

    def __call__(self) -> float:
        return self.s


@pytest.mark.parametrize("clock", [SystemClock(), AcceleratedClock(60), ManualClock(T0)])
def test_every_clock_is_a_protocol_clock_returning_aware_utc(clock: Clock) -> None:
    assert isinstance(clock, Clock)
    now = clock.now()
    assert now.tzinfo is not None
    assert now.utcoffset() == timedelta(0)


def test_system_clock_reads_the_wall_clock() -> None:
    before = datetime.now(timezone.utc)
    now = SystemClock().now()
    after = datetime.now(timezone.utc)
    assert before <= now <= after


@pytest.mark.parametrize(
    ("speedup", "wall_elapsed_s", "sim_elapsed_s"),
    [(60, 0.0, 0.0), (60, 1.0, 60.0), (60, 2.5, 150.0), (1, 10.0, 10.0), (0.5, 10.0, 5.0), (3600, 24.0, 86400.0)],
)
def test_accelerated_clock_runs_speedup_times_faster(speedup: float, wall_elapsed_s: float, sim_elapsed_s: float) -> None:
    wall = FakeWall()
    clock = AcceleratedClock(speedup, start=T0, wall=wall)
    assert clock.now() == T0
    wall.s += wall_elapsed_s
    assert clock.now() == T0 + timedelta(seconds=sim_elapsed_s)
    assert clock.sim_seconds_for(wall_elapsed_s) == pytest.approx(sim_elapsed_s)
    assert clock.speedup == speedup
    assert clock.start == T0


@given(
    speedup=st.floats(min_value=0.01, max_value=10_000, allow_nan=False),
    sim_s=st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
def test_wall_seconds_for_inverts_the_clock(speedup: float, sim_s: float) -> None:
    """Sleeping wall_seconds_for(x) wall seconds advances the clock by x simulated seconds."""
    wall = FakeWall()
    clock = AcceleratedClock(speedup, start=T0, wall=wall)
    wall.s += clock.wall_seconds_for(sim_s)
    elapsed = (clock.now() - T0).total_seconds()
    assert elapsed == pytest.approx(sim_s, rel=1e-9, abs=1e-5)


def test_accelerated_clock_tick_interval_example() -> None:
    """The scheduler case: a 5 s tick at the demo's 60x is a wall interval of 1/12 s."""
    assert AcceleratedClock(60, start=T0).wall_seconds_for(5) == pytest.approx(5 / 60)


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_accelerated_clock_rejects_non_positive_speedup(bad: float) -> None:
    with pytest.raises(ValueError, match="speedup"):
        AcceleratedClock(bad)


def test_clocks_reject_naive_start() -> None:
    naive = datetime(2025, 1, 1)
    with pytest.raises(ValueError, match="timezone-aware"):
        AcceleratedClock(2, start=naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        ManualClock(naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        ManualClock(T0).set(naive)


def test_start_in_another_zone_is_normalised_to_utc() -> None:
    plus2 = timezone(timedelta(hours=2))
    clock = ManualClock(datetime(2025, 3, 1, 14, 0, tzinfo=plus2))
    assert clock.now() == T0
    assert clock.now().utcoffset() == timedelta(0)


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(T0)
    assert clock.now() == clock.now() == T0
    assert clock.advance(5) == T0 + timedelta(seconds=5)
    assert clock.advance(0.25) == T0 + timedelta(seconds=5.25)
    assert clock.now() == T0 + timedelta(seconds=5.25)
    later = T0 + timedelta(hours=1)
    assert clock.set(later) == later and clock.now() == later
    # Going back is allowed through set() (to test callers against clock steps) ...
    assert clock.set(T0) == T0
    # ... but advance() only goes forward.
    with pytest.raises(ValueError, match=">= 0"):
        clock.advance(-1)
    assert clock.now() == T0
