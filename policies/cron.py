"""A small 5-field cron parser and a fast "most recent fire time" search, for schedule windows.

Why our own rather than ``croniter`` (which installs fine): the ``schedule`` policy kind needs
only one question answered, every tick and millions of times in the simulator: *did this
expression fire within the last ``duration`` before ``now``?* That is answered by one backward
search from ``now`` (``CronExpr.last_fire``) that skips whole days and months, never a
minute-by-minute scan. Measured against croniter 7.0.0 by ``python bench/cron_parser.py`` (1,000
expressions, seed 0, one machine): parsing 10.6x faster (13.8 against 146.9 microseconds), the
previous fire 13.3x faster (4.2 against 56.4 microseconds, croniter reusing one iterator), the
next fire on par (49.5 against 51.0). On 10,000 (expression, instant) pairs, in UTC and in
Europe/Berlin, the previous and next fires agree everywhere except on two constructs where croniter
departs from Vixie cron and this parser does not: a range with equal bounds (``17-17``, which
croniter reads as ``*``) and a day field that holds a ``*`` without being just ``*`` (``*/2``,
``1,*/8``), where croniter picks "both day fields" or "either" otherwise than Vixie's rule below.

Syntax (``man 5 crontab``): ``minute hour day-of-month month day-of-week``; each field is ``*`` or a
comma list of ``N``, ``N-M``, ``*/S``, ``N-M/S`` or ``N/S`` (``N`` to the field's maximum, step
``S``). Months take ``jan``..``dec`` and days of week ``sun``..``sat`` (case-insensitive);
day-of-week ``0`` and ``7`` are both Sunday. The macros ``@yearly``, ``@annually``, ``@monthly``,
``@weekly``, ``@daily``, ``@midnight`` and ``@hourly`` are accepted.

Day matching follows Vixie cron: when both day-of-month and day-of-week are restricted (their field
does not start with ``*``; only the first character counts, as in Vixie's ``entry.c``) a day
matches if *either* matches; otherwise both must.

Time zones: an expression is evaluated on the wall clock of a zone (``zoneinfo``). A wall time that
is skipped by a daylight-saving jump fires at the jump (the first instant after the gap); a wall
time that occurs twice fires on its first occurrence. This keeps fire instants in the same order as
wall times, which the backward search relies on.

Pure: no clock reads; ``now`` is always an argument.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone, tzinfo
from functools import lru_cache

from controller.errors import CronError  # re-exported: raised here

__all__ = ["CronError", "CronExpr", "parse_cron", "to_instant"]

MONTH_NAMES = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
DAY_NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# (field name, lowest value, highest value, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int] | None], ...] = (
    ("minute", 0, 59, None),
    ("hour", 0, 23, None),
    ("day-of-month", 1, 31, None),
    ("month", 1, 12, MONTH_NAMES),
    ("day-of-week", 0, 7, DAY_NAMES),
)

# Search limit when no ``after`` is given: longer than the longest gap between two fires of a
# valid expression ("0 0 29 2 *" skips 2100: 8 years; "0 0 */30 2 mon" waits up to 12 years for a
# Monday the 1st of February).
_MAX_SEARCH = timedelta(days=366 * 30)
_ONE_DAY = timedelta(days=1)
_ONE_MINUTE = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed expression: the allowed values of each field, sorted, plus bit masks for O(1)
    membership tests."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days_of_month: tuple[int, ...]
    months: tuple[int, ...]
    days_of_week: tuple[int, ...]
    """0 = Sunday .. 6 = Saturday (7 is folded into 0 at parse)."""
    dom_restricted: bool
    """The day-of-month field does not start with ``*`` (Vixie cron's rule for OR vs AND)."""
    dow_restricted: bool
    _dom_mask: int
    _month_mask: int
    _dow_mask: int

    def __str__(self) -> str:
        return self.expression

    # --- matching -------------------------------------------------------------------------------

    def matches_day(self, d: date) -> bool:
        if not (self._month_mask >> d.month) & 1:
            return False
        dom_ok = bool((self._dom_mask >> d.day) & 1)
        # date.weekday(): Monday = 0; cron: Sunday = 0.
        dow_ok = bool((self._dow_mask >> ((d.weekday() + 1) % 7)) & 1)
        if self.dom_restricted and self.dow_restricted:
            return dom_ok or dow_ok
        return dom_ok and dow_ok

    def matches(self, wall: datetime) -> bool:
        """Whether the expression fires at this wall-clock minute (seconds are ignored)."""
        return (
            wall.minute in self.minutes
            and wall.hour in self.hours
            and self.matches_day(wall.date())
        )

    # --- searching ------------------------------------------------------------------------------

    def _latest_time_at_or_before(self, hour: int, minute: int) -> tuple[int, int] | None:
        i = bisect_left(self.hours, hour)
        if i < len(self.hours) and self.hours[i] == hour:
            j = bisect_right(self.minutes, minute) - 1
            if j >= 0:
                return hour, self.minutes[j]
        if i > 0:
            return self.hours[i - 1], self.minutes[-1]
        return None

    def prev_wall(self, bound: datetime, lower: datetime) -> datetime | None:
        """The latest matching wall-clock minute ``<= bound`` (naive datetimes), or ``None`` if
        there is none on or after ``lower``'s day.

        Cost: one look at ``bound``'s day, then one step per earlier day (whole months that cannot
        match are skipped in one step), so a search spans at most the days back to ``lower``.
        """
        d = bound.date()
        if self.matches_day(d):
            hm = self._latest_time_at_or_before(bound.hour, bound.minute)
            if hm is not None:
                return datetime(d.year, d.month, d.day, hm[0], hm[1])
        low = lower.date()
        last_h, last_m = self.hours[-1], self.minutes[-1]
        try:
            d -= _ONE_DAY
            while d >= low:
                if not (self._month_mask >> d.month) & 1:
                    # The whole month cannot match: jump to the last day of the previous one.
                    d = d.replace(day=1) - _ONE_DAY
                    continue
                if self.matches_day(d):
                    return datetime(d.year, d.month, d.day, last_h, last_m)
                d -= _ONE_DAY
        except OverflowError:  # before year 1
            return None
        return None

    def last_fire(self, now: datetime, tz: tzinfo = timezone.utc,
                  after: datetime | None = None) -> datetime | None:
        """The most recent fire instant ``<= now`` (aware, in UTC), evaluated on ``tz``'s wall
        clock; ``None`` if there is none, or none strictly after ``after`` when given.

        ``now`` and ``after`` should be aware; naive values are taken as UTC.
        """
        now = _aware(now)
        local = now.astimezone(tz)
        bound = local.replace(tzinfo=None, second=0, microsecond=0, fold=0)
        if local.fold:
            # ``now`` is in the second pass of a repeated hour: the first pass of wall times up to
            # one overlap later has already happened, so search from there (then filter below).
            first, second = local.replace(fold=0).utcoffset(), local.utcoffset()
            if first is not None and second is not None and first > second:
                bound += first - second
        if after is not None:
            after = _aware(after)
            # One day of slack covers any UTC offset change between ``after`` and its wall time.
            lower = after.astimezone(tz).replace(tzinfo=None) - _ONE_DAY
        else:
            lower = bound - _MAX_SEARCH
        wall = self.prev_wall(bound, lower)
        while wall is not None:
            instant = to_instant(wall, tz)
            if instant <= now:
                if after is not None and instant <= after:
                    return None
                return instant
            wall = self.prev_wall(wall - _ONE_MINUTE, lower)
        return None

    def next_fire(self, now: datetime, tz: tzinfo = timezone.utc,
                  horizon: timedelta = _MAX_SEARCH) -> datetime | None:
        """The first fire instant strictly after ``now`` within ``horizon`` (aware, UTC).

        Used for messages and tests, not on the hot path: it walks forward day by day.
        """
        now = _aware(now)
        local = now.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0, fold=0)
        d = local.date()
        end = (local + horizon).date()
        while d <= end:
            if self.matches_day(d):
                for h in self.hours:
                    for m in self.minutes:
                        instant = to_instant(datetime(d.year, d.month, d.day, h, m), tz)
                        if instant > now:
                            return instant
            d += _ONE_DAY
        return None


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def to_instant(wall: datetime, tz: tzinfo) -> datetime:
    """The UTC instant of a naive wall-clock time in ``tz``: the first occurrence of a repeated
    wall time, and the end of the gap for a skipped one (so the mapping never goes backwards)."""
    if tz is timezone.utc:
        return wall.replace(tzinfo=timezone.utc)
    instant = wall.replace(tzinfo=tz, fold=0).astimezone(timezone.utc)
    if instant.astimezone(tz).replace(tzinfo=None) == wall:
        return instant
    # ``wall`` does not exist (a daylight-saving gap): the first existing minute after it. Gaps
    # are at most a few hours, and this branch runs about once a year per window.
    probe = wall
    for _ in range(24 * 60):
        probe += _ONE_MINUTE
        candidate = probe.replace(tzinfo=tz, fold=0).astimezone(timezone.utc)
        if candidate.astimezone(tz).replace(tzinfo=None) == probe:
            return candidate
    return instant  # pragma: no cover - no real zone has a gap of a day


def _parse_number(token: str, fname: str, lo: int, hi: int, names: dict[str, int] | None,
                  expr: str) -> int:
    key = token.lower()
    if names is not None and key in names:
        return names[key]
    if not token.isdigit():
        allowed = f" or a name ({', '.join(names)})" if names else ""
        raise CronError(f"cron {expr!r}: {fname} field: {token!r} is not a number{allowed}")
    value = int(token)
    if not lo <= value <= hi:
        raise CronError(f"cron {expr!r}: {fname} field: {value} is out of range {lo}-{hi}")
    return value


def _parse_field(text: str, fname: str, lo: int, hi: int, names: dict[str, int] | None,
                 expr: str) -> set[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(f"cron {expr!r}: {fname} field: empty list item in {text!r}")
        base, _, step_text = item.partition("/")
        step = 1
        if "/" in item:
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"cron {expr!r}: {fname} field: step {step_text!r} in {item!r} "
                                "must be a whole number of at least 1")
            step = int(step_text)
        if base == "*":
            start, end = lo, hi
        elif "-" in base:
            a, _, b = base.partition("-")
            start = _parse_number(a, fname, lo, hi, names, expr)
            end = _parse_number(b, fname, lo, hi, names, expr)
            if start > end:
                raise CronError(f"cron {expr!r}: {fname} field: range {base!r} runs backwards "
                                f"({start} > {end})")
        else:
            start = _parse_number(base, fname, lo, hi, names, expr)
            # "N/S" means N to the maximum in steps of S; a bare "N" is just N.
            end = hi if "/" in item else start
        values.update(range(start, end + 1, step))
    return values


def _mask(values: set[int]) -> int:
    m = 0
    for v in values:
        m |= 1 << v
    return m


@lru_cache(maxsize=1024)
def parse_cron(expression: str) -> CronExpr:
    """Parse a 5-field expression (or a macro); raise ``CronError`` naming the bad field.

    Cached: the same expression string returns the same immutable ``CronExpr``.
    """
    text = " ".join(expression.split())
    text = MACROS.get(text.lower(), text)
    parts = text.split(" ") if text else []
    if len(parts) != 5:
        raise CronError(
            f"cron {expression!r}: expected 5 fields (minute hour day-of-month month day-of-week) "
            f"or a macro ({', '.join(sorted(set(MACROS)))}), got {len(parts)} field(s)")
    sets = [
        _parse_field(part, fname, lo, hi, names, expression)
        for part, (fname, lo, hi, names) in zip(parts, _FIELDS)
    ]
    minutes, hours, doms, months, dows = sets
    if 7 in dows:  # 7 is Sunday too
        dows = (dows - {7}) | {0}
    dom_restricted = not parts[2].startswith("*")
    dow_restricted = not parts[4].startswith("*")
    if not (dom_restricted and dow_restricted):
        # Only day-of-month decides which days match (day-of-week either matches every week or is
        # ANDed): reject day/month pairs that never occur, such as "0 0 30 2 *".
        longest = {m: calendar.monthrange(2000, m)[1] for m in months}  # 2000: a leap year
        if not any(d <= longest[m] for m in months for d in doms):
            raise CronError(f"cron {expression!r}: never fires (day-of-month {sorted(doms)} does "
                            f"not occur in month(s) {sorted(months)})")
    return CronExpr(
        expression=expression,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days_of_month=tuple(sorted(doms)),
        months=tuple(sorted(months)),
        days_of_week=tuple(sorted(dows)),
        dom_restricted=dom_restricted,
        dow_restricted=dow_restricted,
        _dom_mask=_mask(doms),
        _month_mask=_mask(months),
        _dow_mask=_mask(dows),
    )
