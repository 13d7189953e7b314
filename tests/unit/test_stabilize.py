"""HPA safeguards, table-driven: tolerance, stabilization windows, rate limits, cooldowns, pruning.

Cases follow the HPA's documented behaviour (kubernetes.io "Horizontal Pod Autoscaling",
"Scaling policies" and "Stabilization window") with explicit timestamps, never tick counts.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Literal

import pytest

from controller.core import stabilize as stab
from controller.core.model import ScaleEvent
from controller.core.reasons import Reason
from controller.core.spec import Behavior, RateLimit, RateLimitType, ScalingRules

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def pods(value: int, period_s: float) -> RateLimit:
    return RateLimit(type=RateLimitType.REPLICAS, value=value, period_s=period_s)


def pct(value: int, period_s: float) -> RateLimit:
    return RateLimit(type=RateLimitType.PERCENT, value=value, period_s=period_s)


def rules(*policies: RateLimit, select: Literal["max", "min", "disabled"] = "max", cooldown_s: float = 0, window_s: float = 0) -> ScalingRules:
    return ScalingRules(policies=policies, select=select, cooldown_s=cooldown_s, stabilization_s=window_s)


def ev(seconds_ago: float, frm: int, to: int) -> ScaleEvent:
    return ScaleEvent(ago(seconds_ago), frm, to)


@pytest.mark.parametrize(
    ("desired", "current", "tol", "expected", "reason"),
    [
        (10, 10, 0.1, 10, None),
        (11, 10, 0.1, 10, Reason.WITHIN_TOLERANCE),  # |1| <= 1.0
        (9, 10, 0.1, 10, Reason.WITHIN_TOLERANCE),
        (12, 10, 0.1, 12, None),  # |2| > 1.0
        (8, 10, 0.1, 8, None),
        (21, 20, 0.0, 21, None),  # no dead band
        (1, 0, 0.5, 1, None),  # from zero the band is empty
        (3, 4, 0.25, 4, Reason.WITHIN_TOLERANCE),  # boundary: |1| <= 1.0 is inside
    ],
)
def test_tolerance(desired, current, tol, expected, reason) -> None:
    step = stab.tolerance(desired, current, tol)
    assert step.replicas == expected
    assert step.reason == (reason.value if reason else None)


@pytest.mark.parametrize(
    ("desired", "current", "history", "up_s", "down_s", "expected", "reason"),
    [
        # scale-down: the highest recommendation of the last 300 s wins
        (3, 8, [(200, 8), (100, 6)], 0, 300, 8, Reason.SCALE_DOWN_STABILIZED),
        (3, 10, [(200, 8), (100, 6)], 0, 300, 8, Reason.SCALE_DOWN_STABILIZED),
        # older than the window: ignored (400 s ago with a 300 s window)
        (3, 10, [(400, 10), (100, 4)], 0, 300, 4, Reason.SCALE_DOWN_STABILIZED),
        # exactly window-old is outside (HPA: timestamp.After(cutoff))
        (3, 10, [(300, 9)], 0, 300, 3, None),
        (3, 10, [(299.5, 9)], 0, 300, 9, Reason.SCALE_DOWN_STABILIZED),
        # scale-up: the lowest recommendation of the last 60 s wins
        (10, 3, [(30, 4)], 60, 300, 4, Reason.SCALE_UP_STABILIZED),
        (10, 3, [(90, 4)], 60, 300, 10, None),
        (10, 3, [(60, 4)], 60, 300, 10, None),  # exactly window-old: outside
        # the window never pushes below current when going up
        (10, 5, [(30, 2)], 60, 0, 5, Reason.SCALE_UP_STABILIZED),
        # no windows: the desired value passes
        (2, 9, [(10, 9)], 0, 0, 2, None),
        (9, 2, [(10, 2)], 0, 0, 9, None),
        # a flapping signal inside the window holds the current replicas
        (4, 6, [(50, 8), (40, 4), (30, 8)], 0, 120, 6, Reason.SCALE_DOWN_STABILIZED),
    ],
)
def test_stabilize(desired, current, history, up_s, down_s, expected, reason) -> None:
    recs = tuple((ago(s), v) for s, v in sorted(history, key=lambda h: -h[0]))
    step = stab.stabilize(desired, current, NOW, recs, up_window_s=up_s, down_window_s=down_s)
    assert step.replicas == expected
    assert step.reason == (reason.value if reason else None)


def test_stabilize_is_about_time_not_ticks() -> None:
    # Same recommendations, 1 s apart or 100 s apart: only their age matters.
    dense = tuple((ago(s), 9) for s in range(60, 0, -1))
    sparse = ((ago(250), 9),)
    for recs in (dense, sparse):
        step = stab.stabilize(2, 9, NOW, recs, up_window_s=0, down_window_s=300)
        assert step.replicas == 9
    step = stab.stabilize(2, 9, NOW + timedelta(seconds=300), sparse, up_window_s=0, down_window_s=300)
    assert step.replicas == 2


@pytest.mark.parametrize(
    ("current", "events", "rules_", "expected"),
    [
        # HPA default scale-up: max(100 %, 4 pods) per 15 s
        (5, [], rules(pct(100, 15), pods(4, 15)), 10),
        (1, [], rules(pct(100, 15), pods(4, 15)), 5),
        (1, [], rules(pct(100, 15), pods(4, 15), select="min"), 2),
        # relative to the count at the start of the period: 5 -> 10 happened 30 s ago
        (10, [ev(30, 5, 10)], rules(pods(4, 60), pct(100, 60)), 10),
        (10, [ev(61, 5, 10)], rules(pods(4, 60), pct(100, 60)), 20),
        (10, [ev(30, 5, 10)], rules(pods(4, 60), pct(100, 60), select="min"), 10),
        # a scale-down inside the period frees room: start was 12
        (10, [ev(30, 12, 10)], rules(pods(4, 60)), 16),
        # percent rounds up (HPA): 3 * 1.1 = 3.3 -> 4
        (3, [], rules(pct(10, 60)), 4),
        # no policies: no limit; disabled: no scale-up at all
        (3, [], rules(), None),
        (3, [], rules(pods(4, 15), select="disabled"), 3),
    ],
)
def test_scale_up_limit(current, events, rules_, expected) -> None:
    assert stab.scale_up_limit(current, NOW, tuple(events), rules_) == expected


@pytest.mark.parametrize(
    ("current", "events", "rules_", "expected"),
    [
        # HPA default scale-down: 100 % per 15 s
        (10, [], rules(pct(100, 15)), 0),
        # 1 pod per 60 s; one pod was removed 30 s ago: start was 5, no more now
        (5, [], rules(pods(1, 60)), 4),
        (4, [ev(30, 5, 4)], rules(pods(1, 60)), 4),
        (4, [ev(61, 5, 4)], rules(pods(1, 60)), 3),
        # percent truncates (HPA): 5 * 0.9 = 4.5 -> 4
        (10, [], rules(pct(10, 60)), 9),
        (5, [], rules(pct(10, 60)), 4),
        # max picks the biggest change, min the smallest
        (10, [], rules(pods(1, 60), pct(50, 60)), 5),
        (10, [], rules(pods(1, 60), pct(50, 60), select="min"), 9),
        (10, [], rules(pct(50, 60), select="disabled"), 10),
        (10, [], rules(), None),
    ],
)
def test_scale_down_limit(current, events, rules_, expected) -> None:
    assert stab.scale_down_limit(current, NOW, tuple(events), rules_) == expected


@pytest.mark.parametrize(
    ("desired", "current", "events", "up", "down", "expected", "reason"),
    [
        (20, 5, [], rules(pods(4, 60)), rules(), 9, Reason.SCALE_UP_LIMITED),
        (2, 10, [], rules(), rules(pods(3, 60)), 7, Reason.SCALE_DOWN_LIMITED),
        (6, 5, [], rules(pods(4, 60)), rules(), 6, None),
        # cooldowns: since the last event in the same direction, by timestamps
        (8, 5, [ev(100, 3, 5)], rules(cooldown_s=120), rules(), 5, Reason.SCALE_UP_COOLDOWN),
        (8, 5, [ev(130, 3, 5)], rules(cooldown_s=120), rules(), 8, None),
        # a scale-down event does not start the scale-up cooldown
        (8, 5, [ev(10, 7, 5)], rules(cooldown_s=120), rules(), 8, None),
        (2, 5, [ev(10, 7, 5)], rules(), rules(cooldown_s=60), 5, Reason.SCALE_DOWN_COOLDOWN),
        (2, 5, [ev(60, 7, 5)], rules(), rules(cooldown_s=60), 2, None),
        (2, 5, [ev(10, 3, 5)], rules(), rules(cooldown_s=60), 2, None),
        (5, 5, [ev(1, 3, 5)], rules(cooldown_s=600), rules(cooldown_s=600), 5, None),
        # disabled direction
        (9, 5, [], rules(select="disabled"), rules(), 5, Reason.SCALE_UP_LIMITED),
    ],
)
def test_rate_limit(desired, current, events, up, down, expected, reason) -> None:
    step = stab.rate_limit(desired, current, NOW, tuple(events), up=up, down=down)
    assert step.replicas == expected
    assert step.reason == (reason.value if reason else None)


def test_keep_seconds_and_pruning() -> None:
    behavior = Behavior(
        scale_up=rules(pods(4, 60), window_s=30, cooldown_s=90),
        scale_down=rules(pct(10, 600), window_s=300),
    )
    assert stab.keep_seconds(behavior) == (300, 600)
    recs = ((ago(400), 1), (ago(300), 2), (ago(299), 3), (ago(0), 4))
    assert stab.prune_recommendations(recs, NOW, 300) == recs[2:]
    events = (ev(700, 1, 2), ev(600, 2, 3), ev(10, 3, 4))
    assert stab.prune_events(events, NOW, 600) == events[2:]
    assert stab.prune_events(events, NOW, 0) == ()
