"""Durations and instants as people type them on a command line or in a query string: ``90s``,
``30m``, ``2h``, ``7d``, ``1w``; ``now``; ISO-8601 with a timezone; or a duration ago."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration_s(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``7d``, ``1w`` -> seconds (> 0); ``ValueError`` otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"expected a duration like 90s, 30m, 2h or 7d, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def parse_when(text: str, now: datetime) -> datetime:
    """ISO-8601 with a timezone, ``now``, or a duration ago (``6h``: six hours before ``now``);
    ``ValueError`` with what to type otherwise."""
    if text == "now":
        return now
    try:
        seconds = parse_duration_s(text)
    except ValueError:
        pass
    else:
        try:
            return now - timedelta(seconds=seconds)
        except OverflowError:
            raise ValueError(f"{text!r} reaches back before the year 1; give a shorter duration") from None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use ISO-8601 (2026-11-02T09:00:00Z), now, "
                         "or a duration ago (6h)") from None
    if at.tzinfo is None:
        raise ValueError(f"{text!r} has no timezone: add Z or +00:00")
    try:
        at.astimezone(now.tzinfo)
    except OverflowError:
        raise ValueError(f"{text!r} is out of range once converted to UTC") from None
    return at
