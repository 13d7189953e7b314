"""tidegate's own cron parser (``policies.cron``) against ``croniter``: speed and agreement.

Why: the ``schedule`` policy kind asks one question every tick (and for every decision of a
simulated week): *did this expression fire within the last ``duration`` before ``now``?* It uses
its own parser and a backward search (``CronExpr.last_fire``). This measures whether that is worth
keeping over the widely used ``croniter`` (``pip install croniter``), on the same expressions:

- parse: ``parse_cron`` (its cache bypassed) against building a ``croniter``;
- the hot path: parse once, then ``last_fire(now)`` against ``set_current(now)`` + ``get_prev()``
  on one ``croniter`` per expression, over many instants;
- ``next_fire(now)`` against ``get_next()``;
- agreement: previous and next fire times of both on many generated expressions and instants, in
  UTC and in a zone with daylight-saving time (``Europe/Berlin``), with the first few
  disagreements printed.

    python bench/cron_parser.py [--expressions 1000] [--instants 10] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from importlib.metadata import version
import sys
import time
from datetime import datetime, timezone, tzinfo
from pathlib import Path
from typing import Any, Callable
from zoneinfo import ZoneInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from policies.cron import CronError, CronExpr, parse_cron  # noqa: E402

try:
    from croniter import croniter
except ImportError:  # pragma: no cover - the message is the point
    sys.exit("bench/cron_parser.py compares with croniter: pip install croniter")

FIXED = (
    "* * * * *", "*/5 * * * *", "0 * * * *", "30 8 * * 1-5", "0 9-17/2 * * mon-fri", "15 3 1 * *",
    "0 0 1 1 *", "0 0 29 2 *", "0 12 13 * fri", "*/15 6-22 * 3-10 *", "5,35 */3 1-15 * 0,6",
    "@daily", "@weekly", "@hourly",
)
# (lo, hi, names) per field, as both parsers accept them
_FIELDS = ((0, 59, None), (0, 23, None), (1, 28, None), (1, 12, ("jan", "jun", "dec")), (0, 6, ("sun", "wed", "sat")))


def random_field(rng: random.Random, lo: int, hi: int, names: tuple[str, ...] | None) -> str:
    """One field of the syntax both accept: ``*``, ``*/S``, ``N``, ``N-M``, ``N-M/S`` or a list."""
    def item() -> str:
        kind = rng.random()
        if kind < 0.15:
            return f"*/{rng.randint(2, max(2, (hi - lo) // 2))}"
        a = rng.randint(lo, hi)
        if kind < 0.5:
            return str(a)
        b = rng.randint(a, hi)
        if kind < 0.8:
            return f"{a}-{b}"
        return f"{a}-{b}/{rng.randint(1, max(1, b - a))}"

    r = rng.random()
    if r < 0.35:
        return "*"
    if names and r < 0.4:
        return rng.choice(names)
    return ",".join(item() for _ in range(rng.choice((1, 1, 2, 3))))


def random_expression(rng: random.Random) -> str:
    return " ".join(random_field(rng, lo, hi, names) for lo, hi, names in _FIELDS)


def expressions(n: int, rng: random.Random) -> list[str]:
    out = list(FIXED)
    while len(out) < n:
        e = random_expression(rng)
        try:
            parse_cron.__wrapped__(e)
        except CronError:
            continue
        out.append(e)
    return out[:n]


def instants(n: int, rng: random.Random) -> list[datetime]:
    """Instants spread over 2024-2026, never on a whole minute (both then agree on "previous":
    ``get_prev`` is strictly before its start, ``last_fire`` at or before ``now``)."""
    start = datetime(2024, 1, 1, tzinfo=timezone.utc).timestamp()
    span = 3 * 365 * 86400
    out = []
    for _ in range(n):
        t = start + rng.uniform(0, span)
        if t % 60 == 0:
            t += 17
        out.append(datetime.fromtimestamp(t, timezone.utc))
    return out


def timed(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Best of ``repeat`` wall times of ``fn()``, seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def ours_prev(c: CronExpr, t: datetime, tz: tzinfo) -> datetime | None:
    return c.last_fire(t, tz)


def theirs_prev(e: str, t: datetime, tz: tzinfo) -> datetime:
    return croniter(e, t.astimezone(tz)).get_prev(datetime).astimezone(timezone.utc)


def theirs_next(e: str, t: datetime, tz: tzinfo) -> datetime:
    return croniter(e, t.astimezone(tz)).get_next(datetime).astimezone(timezone.utc)


def _prev(it: croniter, t: datetime) -> datetime:
    it.set_current(t, force=True)
    return it.get_prev(datetime)


def _next(it: croniter, t: datetime) -> datetime:
    it.set_current(t, force=True)
    return it.get_next(datetime)


def speed(exprs: list[str], times: list[datetime]) -> dict[str, dict[str, float]]:
    """Microseconds per call, each side on the same work."""
    parsed = [parse_cron.__wrapped__(e) for e in exprs]
    iters = [croniter(e, times[0]) for e in exprs]  # parsed once too: set_current() moves the start
    n_parse = len(exprs)
    n_calls = len(exprs) * len(times)
    utc = timezone.utc
    work = {
        "parse": (lambda: [parse_cron.__wrapped__(e) for e in exprs],
                  lambda: [croniter(e, times[0]) for e in exprs], n_parse),
        "last fire (hot path)": (lambda: [c.last_fire(t, utc) for c in parsed for t in times],
                                 lambda: [_prev(it, t) for it in iters for t in times], n_calls),
        "next fire": (lambda: [c.next_fire(t, utc) for c in parsed for t in times],
                      lambda: [_next(it, t) for it in iters for t in times], n_calls),
    }
    out = {}
    for name, (ours, theirs, n) in work.items():
        a, b = timed(ours), timed(theirs)
        out[name] = {"tidegate_us": a / n * 1e6, "croniter_us": b / n * 1e6, "croniter_over_tidegate": b / a}
    return out


_SAME_BOUNDS = re.compile(r"(?<!\d)(\d+)-\1(?!\d)")


def known_difference(e: str) -> str | None:
    """Why the two may differ on ``e`` by design or by a known croniter bug, else ``None``:

    - ``N-N``: croniter 7 reads a range whose bounds are equal (``17-17``) as ``*``;
    - ``*`` inside a day field that is not just ``*`` (``*/8``, ``1,*/8``): Vixie cron (and
      ``policies.cron``) decides between "both day fields must match" and "either may" by the
      field's first character only (``entry.c``: ``if (ch == '*') e->flags |= DOM_STAR``);
      croniter decides otherwise for such fields.
    """
    if _SAME_BOUNDS.search(e):
        return "N-N range"
    fields = e.split()
    if len(fields) == 5 and any("*" in f and f != "*" for f in (fields[2], fields[4])):
        return "* in a day field"
    return None


def agreement(exprs: list[str], times: list[datetime], tz: tzinfo) -> dict[str, Any]:
    """Pairs (expression, instant) where the previous or next fire differ, by known cause; the
    first few unexplained ones as examples."""
    checked: dict[str, int] = {}
    differ: dict[str, int] = {}
    examples: list[str] = []
    for e in exprs:
        c = parse_cron.__wrapped__(e)
        cause = known_difference(e) or "unexplained"
        for t in times:
            checked[cause] = checked.get(cause, 0) + 1
            ours = (c.last_fire(t, tz), c.next_fire(t, tz))
            theirs = (theirs_prev(e, t, tz), theirs_next(e, t, tz))
            if ours != theirs:
                differ[cause] = differ.get(cause, 0) + 1
                if cause == "unexplained" and len(examples) < 5:
                    examples.append(f"{e!r} at {t.isoformat()}: tidegate prev/next {ours[0]} / {ours[1]}, "
                                    f"croniter {theirs[0]} / {theirs[1]}")
    return {"zone": str(tz), "checked": checked, "differ": differ, "examples": examples}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--expressions", type=int, default=1000, help="expressions (the fixed ones, then generated)")
    p.add_argument("--instants", type=int, default=10, help="instants per expression")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    exprs = expressions(args.expressions, rng)
    times = instants(args.instants, rng)
    speed_exprs = exprs[: min(len(exprs), 300)]
    result = {
        "croniter": version("croniter"),
        "expressions": len(exprs), "instants": len(times),
        "speed": speed(speed_exprs, times),
        "agreement": [agreement(exprs, times, timezone.utc), agreement(exprs, times, ZoneInfo("Europe/Berlin"))],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"croniter {result['croniter']}; {len(exprs)} expressions x {len(times)} instants (seed {args.seed})")
    print(f"speed on {len(speed_exprs)} expressions, microseconds per call (best of 3):")
    print(f"  {'':<22} {'tidegate':>10} {'croniter':>10} {'croniter / tidegate':>20}")
    for name, s in result["speed"].items():
        print(f"  {name:<22} {s['tidegate_us']:>10.1f} {s['croniter_us']:>10.1f} {s['croniter_over_tidegate']:>19.1f}x")
    for a in result["agreement"]:
        print(f"agreement in {a['zone']}: (expression, instant) pairs whose previous or next fire differs")
        for cause, n in sorted(a["checked"].items()):
            print(f"  {cause:<17} {a['differ'].get(cause, 0):>6} of {n}")
        for line in a["examples"]:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
