"""``schedule``: warm pools on a calendar (a replica floor inside cron windows).

Cold starts of a large TP model take minutes, so known peaks (office hours, a nightly batch) are
better met by replicas that are already up. A window opens at each fire time of its cron expression
(on its time zone's wall clock) and stays open ``duration_s`` seconds; inside any open window the
rule returns a *floor* (``Opinion.FLOOR``): the largest ``min_replicas`` of the open windows, which
the pipeline applies at the bounds stage, outside stabilization. Outside every window it has no
opinion, and that is not missing data.

"Is a window open now" is one backward cron search per window (``CronExpr.last_fire`` with a lower
limit of ``now - duration``), so the cost per tick does not grow with the window's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from controller.core.model import Opinion, Recommendation
from controller.core.reasons import Reason
from controller.core.spec import MAX_REPLICAS, MAX_WINDOW_S
from policies.base import PolicyContext, PolicyKind, StrictParams
from policies.cron import CronError, CronExpr, parse_cron


def _zone(key: str) -> ZoneInfo:
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ValueError(f"unknown time zone {key!r} (use an IANA name such as "
                         "'UTC' or 'Europe/Paris')") from e


class Window(StrictParams):
    """One recurring window with its replica floor."""

    name: str | None = Field(None, description="Label shown in traces (default: the cron expression).")
    cron: str = Field(
        description="When the window opens: 5-field cron (minute hour day-of-month month "
                    "day-of-week), e.g. '0 8 * * 1-5' for 08:00 on weekdays; names (mon, jan), "
                    "lists, ranges, steps and @daily-style macros are accepted.",
    )
    duration_s: float = Field(gt=0, le=MAX_WINDOW_S, description="How long the window stays open after each opening, seconds.")
    min_replicas: int = Field(ge=0, le=MAX_REPLICAS, description="Replica floor (total across pools) while the window is open.")
    timezone: str = Field("UTC", description="IANA time zone whose wall clock the cron expression follows, e.g. Europe/Paris.")

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, v: str) -> str:
        try:
            parse_cron(v)
        except CronError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("timezone")
    @classmethod
    def _valid_zone(cls, v: str) -> str:
        _zone(v)
        return v


@dataclass(frozen=True, slots=True)
class _Compiled:
    label: str
    cron: CronExpr
    zone: ZoneInfo
    duration: timedelta
    min_replicas: int


class Schedule(PolicyKind):
    """Replica floor inside cron windows (warm pools for known peaks)."""

    name = "schedule"
    description = "Replica floor inside recurring cron windows (warm pools for known peaks)."

    class Params(StrictParams):
        windows: tuple[Window, ...] = Field(
            min_length=1,
            description="Windows; when several are open the largest min_replicas applies.",
        )

    params: Params

    def __init__(self, params: StrictParams, rule: str | None = None) -> None:
        super().__init__(params, rule)
        # Parse once per rule instance, not per tick (parse_cron is cached as well).
        self._windows = tuple(
            _Compiled(w.name or w.cron, parse_cron(w.cron), _zone(w.timezone),
                      timedelta(seconds=w.duration_s), w.min_replicas)
            for w in self.params.windows
        )

    def open_windows(self, now: datetime) -> list[tuple[str, datetime, datetime, int]]:
        """``(label, opened_at, closes_at, min_replicas)`` for each window open at ``now``."""
        if now.tzinfo is None:
            now = now.replace(tzinfo=timezone.utc)
        found = []
        for w in self._windows:
            opened = w.cron.last_fire(now, w.zone, after=now - w.duration)
            if opened is not None:
                found.append((w.label, opened, opened + w.duration, w.min_replicas))
        return found

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        active = self.open_windows(ctx.now)
        if not active:
            return Recommendation(
                rule=self.rule, kind=self.name, replicas=None, reason=Reason.OUTSIDE_SCHEDULE.value,
                message=f"outside all {len(self._windows)} schedule window(s)",
                opinion=Opinion.FLOOR,
            )
        floor = max(a[3] for a in active)
        described = ", ".join(
            f"{label!r} open {opened.isoformat()} until {closes.isoformat()} (floor {m})"
            for label, opened, closes, m in active
        )
        return Recommendation(
            rule=self.rule, kind=self.name, replicas=floor, reason=Reason.SCHEDULE_WINDOW.value,
            message=f"floor {floor}: {described}", opinion=Opinion.FLOOR,
        )
