"""The cron parser and its backward search, checked against tables and a brute-force minute scan."""

from __future__ import annotations

import calendar
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.cron import CronError, CronExpr, parse_cron, to_instant

UTC = timezone.utc
PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# --- parsing ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("expr", "field", "expected"),
    [
        ("*/15 * * * *", "minutes", (0, 15, 30, 45)),
        ("5,10-12 * * * *", "minutes", (5, 10, 11, 12)),
        ("10-30/10 * * * *", "minutes", (10, 20, 30)),
        ("50/4 * * * *", "minutes", (50, 54, 58)),
        ("0 */6 * * *", "hours", (0, 6, 12, 18)),
        ("0 17-17 * * *", "hours", (17,)),  # equal bounds: that hour (croniter 7 reads it as '*')
        ("0 17-17/3 * * *", "hours", (17,)),
        ("0 0 1,15 * *", "days_of_month", (1, 15)),
        ("0 0 * jan,JUL-sep *", "months", (1, 7, 8, 9)),
        ("0 0 * */4 *", "months", (1, 5, 9)),
        ("0 8 * * mon-fri", "days_of_week", (1, 2, 3, 4, 5)),
        ("0 8 * * 1-5", "days_of_week", (1, 2, 3, 4, 5)),
        ("0 8 * * 5-7", "days_of_week", (0, 5, 6)),  # 7 is Sunday
        ("0 8 * * SUN,7", "days_of_week", (0,)),
        ("@hourly", "minutes", (0,)),
        ("@daily", "hours", (0,)),
        ("@weekly", "days_of_week", (0,)),
        ("  0   8 *  * 1  ", "hours", (8,)),
    ],
)
def test_fields_parse_to_the_expected_values(expr: str, field: str, expected: tuple[int, ...]) -> None:
    assert getattr(parse_cron(expr), field) == expected


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        ("0 8 * *", "expected 5 fields"),
        ("0 8 * * * *", "got 6 field(s)"),
        ("", "got 0 field(s)"),
        ("60 * * * *", "minute field: 60 is out of range 0-59"),
        ("0 24 * * *", "hour field: 24 is out of range 0-23"),
        ("0 0 0 * *", "day-of-month field: 0 is out of range 1-31"),
        ("0 0 * 13 *", "month field: 13 is out of range 1-12"),
        ("0 0 * * 8", "day-of-week field: 8 is out of range 0-7"),
        ("0 0 * foo *", "month field: 'foo' is not a number or a name (jan,"),
        ("0 0 * * funday", "day-of-week field: 'funday' is not a number or a name (sun,"),
        ("30-10 * * * *", "range '30-10' runs backwards (30 > 10)"),
        ("*/0 * * * *", "step '0' in '*/0' must be a whole number of at least 1"),
        ("*/x * * * *", "step 'x'"),
        ("1,,2 * * * *", "empty list item"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("@fortnightly", "expected 5 fields"),
    ],
)
def test_bad_expressions_say_which_field_and_why(expr: str, needle: str) -> None:
    with pytest.raises(CronError) as info:
        parse_cron(expr)
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)  # pydantic turns it into a field error


def test_feb_29_is_valid_and_found_across_leap_years() -> None:
    expr = parse_cron("0 12 29 feb *")
    assert expr.last_fire(utc(2023, 6, 1)) == utc(2020, 2, 29, 12)
    assert expr.last_fire(utc(2104, 3, 1)) == utc(2104, 2, 29, 12)  # 2100 is not a leap year
    assert expr.last_fire(utc(2103, 3, 1)) == utc(2096, 2, 29, 12)


# --- day matching (Vixie cron's OR rule) ----------------------------------------------------------

@pytest.mark.parametrize(
    ("expr", "day", "fires"),
    [
        # both restricted: the 13th OR any Friday
        ("0 0 13 * fri", datetime(2024, 9, 13), True),   # Friday the 13th
        ("0 0 13 * fri", datetime(2024, 9, 6), True),    # a Friday
        ("0 0 13 * fri", datetime(2024, 8, 13), True),   # a Tuesday the 13th
        ("0 0 13 * fri", datetime(2024, 8, 14), False),
        # day-of-month starts with '*': it counts as unrestricted, so both must match (AND)
        ("0 0 */2 * fri", datetime(2024, 9, 13), True),  # odd day and Friday
        ("0 0 */2 * fri", datetime(2024, 9, 6), False),  # Friday but even day
        ("0 0 */2 * fri", datetime(2024, 9, 7), False),  # odd day, Saturday
        # only the first character counts (Vixie's entry.c): '1,*/2' is restricted, so OR
        ("0 0 1,*/2 * fri", datetime(2024, 9, 6), True),  # Friday but even day
        ("0 0 1,*/2 * fri", datetime(2024, 9, 7), True),  # odd day, Saturday
        ("0 0 * * 0", datetime(2024, 9, 8), True),       # Sunday as 0
        ("0 0 * * 7", datetime(2024, 9, 8), True),       # Sunday as 7
        ("0 0 1 * *", datetime(2024, 9, 1), True),
        ("0 0 1 * *", datetime(2024, 9, 2), False),
        ("0 0 * feb *", datetime(2024, 9, 2), False),
    ],
)
def test_day_of_month_and_day_of_week_follow_vixie_cron(expr: str, day: datetime, fires: bool) -> None:
    assert parse_cron(expr).matches_day(day.date()) is fires


# --- the backward search --------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("expr", "now", "expected"),
    [
        ("0 8 * * mon-fri", utc(2024, 9, 9, 9, 30), utc(2024, 9, 9, 8)),    # Monday, same day
        ("0 8 * * mon-fri", utc(2024, 9, 9, 8, 0), utc(2024, 9, 9, 8)),     # exactly at the fire
        ("0 8 * * mon-fri", utc(2024, 9, 9, 7, 59), utc(2024, 9, 6, 8)),    # back to Friday
        ("0 8 * * mon-fri", utc(2024, 9, 8, 23, 0), utc(2024, 9, 6, 8)),    # Sunday
        ("*/15 * * * *", utc(2024, 1, 1, 0, 14, 59), utc(2024, 1, 1, 0, 0)),
        ("*/15 * * * *", utc(2024, 1, 1, 0, 0, 1), utc(2024, 1, 1, 0, 0)),
        ("59 23 31 12 *", utc(2024, 6, 1), utc(2023, 12, 31, 23, 59)),
        ("0 0 1 jan,jul *", utc(2024, 6, 30), utc(2024, 1, 1)),
        ("30 2 * * *", utc(2024, 1, 1, 0, 0), utc(2023, 12, 31, 2, 30)),
        ("@monthly", utc(2024, 3, 15, 12), utc(2024, 3, 1)),
    ],
)
def test_last_fire_in_utc(expr: str, now: datetime, expected: datetime) -> None:
    assert parse_cron(expr).last_fire(now) == expected


def test_last_fire_respects_the_after_limit() -> None:
    expr = parse_cron("0 8 * * mon-fri")
    now = utc(2024, 9, 9, 17, 59)
    assert expr.last_fire(now, after=now - timedelta(hours=10)) == utc(2024, 9, 9, 8)
    assert expr.last_fire(now, after=utc(2024, 9, 9, 8)) is None  # exclusive
    assert expr.last_fire(utc(2024, 9, 8, 12), after=utc(2024, 9, 7)) is None


def test_naive_now_is_utc() -> None:
    expr = parse_cron("0 8 * * *")
    assert expr.last_fire(datetime(2024, 9, 9, 9)) == utc(2024, 9, 9, 8)


def test_time_zone_wall_clock_winter_and_summer() -> None:
    expr = parse_cron("0 8 * * *")
    assert expr.last_fire(utc(2024, 1, 15, 12), PARIS) == utc(2024, 1, 15, 7)   # CET, UTC+1
    assert expr.last_fire(utc(2024, 7, 15, 12), PARIS) == utc(2024, 7, 15, 6)   # CEST, UTC+2
    assert expr.last_fire(utc(2024, 7, 15, 6, 30), PARIS) == utc(2024, 7, 15, 6)
    assert expr.last_fire(utc(2024, 7, 15, 5, 59), PARIS) == utc(2024, 7, 14, 6)


def test_skipped_wall_time_fires_at_the_jump() -> None:
    # Paris, 2024-03-31: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 does not exist.
    expr = parse_cron("30 2 * * *")
    assert to_instant(datetime(2024, 3, 31, 2, 30), PARIS) == utc(2024, 3, 31, 1, 0)
    assert expr.last_fire(utc(2024, 3, 31, 1, 0), PARIS) == utc(2024, 3, 31, 1, 0)
    assert expr.last_fire(utc(2024, 3, 31, 0, 59), PARIS) == utc(2024, 3, 30, 1, 30)
    # a 03:15 fire on the same day comes after the jump
    assert parse_cron("15 3 * * *").last_fire(utc(2024, 3, 31, 1, 20), PARIS) == utc(2024, 3, 31, 1, 15)


def test_repeated_wall_time_fires_on_its_first_occurrence() -> None:
    # Paris, 2024-10-27: 03:00 CEST falls back to 02:00 CET; 02:30 happens at 00:30 and 01:30 UTC.
    expr = parse_cron("30 2 * * *")
    assert expr.last_fire(utc(2024, 10, 27, 0, 45), PARIS) == utc(2024, 10, 27, 0, 30)
    # during the second pass of the hour the first-pass fire is still the latest one
    assert expr.last_fire(utc(2024, 10, 27, 1, 45), PARIS) == utc(2024, 10, 27, 0, 30)
    # 02:45 wall fired in the first pass (00:45 UTC): at 01:35 UTC (02:35, second pass) it counts
    assert parse_cron("45 2 * * *").last_fire(utc(2024, 10, 27, 1, 35), PARIS) == utc(2024, 10, 27, 0, 45)


def test_next_fire() -> None:
    expr = parse_cron("0 8 * * mon-fri")
    assert expr.next_fire(utc(2024, 9, 6, 8, 0)) == utc(2024, 9, 9, 8)
    assert expr.next_fire(utc(2024, 9, 6, 7, 0), PARIS) == utc(2024, 9, 9, 6)


def test_parse_is_cached_and_immutable() -> None:
    a = parse_cron("0 8 * * 1-5")
    assert parse_cron("0 8 * * 1-5") is a
    with pytest.raises(AttributeError):
        a.minutes = (1,)  # type: ignore[misc]


# --- properties: random expressions vs an independent expansion and a brute-force scan -------------

FIELDS = (  # name, lo, hi, names
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("dom", 1, 31, None),
    ("month", 1, 12, [m.lower() for m in calendar.month_abbr[1:]]),
    ("dow", 0, 7, ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]),
)


@st.composite
def cron_field(draw: st.DrawFn, lo: int, hi: int, names: list[str] | None) -> tuple[str, set[int], bool]:
    """(text, values it means, starts with '*'), built independently of the parser."""
    def num(v: int) -> str:
        if names is not None and v - lo < len(names) and draw(st.booleans()):
            return names[v - lo].upper() if draw(st.booleans()) else names[v - lo]
        return str(v)

    items, values = [], set()
    for _ in range(draw(st.integers(1, 3))):
        shape = draw(st.sampled_from(["star", "star_step", "single", "range", "range_step", "start_step"]))
        a = draw(st.integers(lo, hi))
        b = draw(st.integers(a, hi))
        s = draw(st.integers(1, max(1, hi - lo)))
        if shape == "star":
            items.append("*")
            values |= set(range(lo, hi + 1))
        elif shape == "star_step":
            items.append(f"*/{s}")
            values |= set(range(lo, hi + 1, s))
        elif shape == "single":
            items.append(num(a))
            values.add(a)
        elif shape == "range":
            items.append(f"{num(a)}-{num(b)}")
            values |= set(range(a, b + 1))
        elif shape == "range_step":
            items.append(f"{num(a)}-{num(b)}/{s}")
            values |= set(range(a, b + 1, s))
        else:
            items.append(f"{num(a)}/{s}")
            values |= set(range(a, hi + 1, s))
    return ",".join(items), values, items[0].startswith("*")


@st.composite
def cron_expr(draw: st.DrawFn, dense: bool = False) -> tuple[str, list[set[int]], bool, bool]:
    texts, sets, stars = [], [], []
    for i, (_, lo, hi, names) in enumerate(FIELDS):
        if dense and i >= 2 and draw(st.integers(0, 3)) > 0:
            texts.append("*")  # keep most day fields open so that fires are common
            sets.append(set(range(lo, hi + 1)))
            stars.append(True)
            continue
        text, values, star = draw(cron_field(lo, hi, names))
        texts.append(text)
        sets.append(values)
        stars.append(star)
    dows = sets[4]
    if 7 in dows:
        sets[4] = (dows - {7}) | {0}
    return " ".join(texts), sets, not stars[2], not stars[4]


def _can_fire(sets: list[set[int]], dom_r: bool, dow_r: bool) -> bool:
    if dom_r and dow_r:
        return True
    return any(d <= calendar.monthrange(2000, m)[1] for m in sets[3] for d in sets[2])


@settings(max_examples=100, deadline=None)
@given(cron_expr())
def test_parser_agrees_with_an_independent_expansion(case: tuple[str, list[set[int]], bool, bool]) -> None:
    text, sets, dom_r, dow_r = case
    if not _can_fire(sets, dom_r, dow_r):
        with pytest.raises(CronError, match="never fires"):
            parse_cron(text)
        return
    expr = parse_cron(text)
    assert [set(expr.minutes), set(expr.hours), set(expr.days_of_month), set(expr.months),
            set(expr.days_of_week)] == sets
    assert (expr.dom_restricted, expr.dow_restricted) == (dom_r, dow_r)


def _brute_last_fire(expr: CronExpr, now: datetime, after: datetime, tz: ZoneInfo | timezone) -> datetime | None:
    """Every wall-clock minute around the range, mapped to its instant: the latest in (after, now]."""
    wall = (after.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0) - timedelta(hours=3))
    end = now.astimezone(tz).replace(tzinfo=None) + timedelta(hours=3)
    best = None
    while wall <= end:
        if (wall.minute in expr.minutes and wall.hour in expr.hours and wall.month in expr.months
                and expr.matches_day(wall.date())):
            t = to_instant(wall, tz)
            if after < t <= now and (best is None or t > best):
                best = t
        wall += timedelta(minutes=1)
    return best


instants = st.datetimes(min_value=datetime(2023, 1, 1), max_value=datetime(2026, 12, 31),
                        timezones=st.just(UTC))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cron_expr(dense=True), instants, st.integers(1, 3 * 24 * 60),
       st.sampled_from([UTC, PARIS, NEW_YORK]))
def test_last_fire_matches_a_brute_force_minute_scan(
    case: tuple[str, list[set[int]], bool, bool], now: datetime, window_min: int,
    tz: ZoneInfo | timezone,
) -> None:
    text, sets, dom_r, dow_r = case
    if not _can_fire(sets, dom_r, dow_r):
        return
    expr = parse_cron(text)
    after = now - timedelta(minutes=window_min)
    expected = _brute_last_fire(expr, now, after, tz)
    assert expr.last_fire(now, tz, after=after) == expected
    if expected is not None:
        # without a limit the search finds the same latest fire
        assert expr.last_fire(now, tz) == expected


# DST transition days, where a random instant rarely lands.
DST_DAYS = [utc(2024, 3, 31), utc(2024, 10, 27), utc(2024, 3, 10), utc(2024, 11, 3)]


@settings(max_examples=80, deadline=None)
@given(cron_expr(dense=True), st.sampled_from(DST_DAYS), st.integers(0, 36 * 60),
       st.integers(1, 6 * 60), st.sampled_from([PARIS, NEW_YORK]))
def test_last_fire_matches_brute_force_around_dst_changes(
    case: tuple[str, list[set[int]], bool, bool], day: datetime, offset_min: int, window_min: int,
    tz: ZoneInfo,
) -> None:
    text, sets, dom_r, dow_r = case
    if not _can_fire(sets, dom_r, dow_r):
        return
    expr = parse_cron(text)
    now = day + timedelta(minutes=offset_min)
    after = now - timedelta(minutes=window_min)
    assert expr.last_fire(now, tz, after=after) == _brute_last_fire(expr, now, after, tz)


@settings(max_examples=100, deadline=None)
@given(st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2030, 1, 1)),
       st.sampled_from([PARIS, NEW_YORK, UTC]))
def test_to_instant_never_goes_backwards(wall: datetime, tz: ZoneInfo | timezone) -> None:
    wall = wall.replace(second=0, microsecond=0)
    a, b = to_instant(wall, tz), to_instant(wall + timedelta(minutes=1), tz)
    assert a <= b
    # an existing wall time maps to an instant that shows that wall time
    local = a.astimezone(tz).replace(tzinfo=None)
    assert local >= wall
