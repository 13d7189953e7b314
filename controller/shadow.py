"""The shadow report: what tidegate would have done beside what the current autoscaler did.

A model in shadow mode (``spec.mode: shadow``, or the daemon's ``mode: shadow``) records one
decision per tick with outcome ``skipped`` and the detail ``controller.controller.SHADOW_DETAIL``: its placement is what tidegate would have run, its
signals hold what actually ran (each pool's replicas as observed from its Deployment) and the load.
Over a window, per model:

- ``window_s``: the time the shadow decisions cover (each stands until the next; the last as long
  as the one before);
- ``actual_cost`` / ``shadow_cost``: USD over the window, each placement priced by
  ``controller.core.pricing.placement_cost`` with the pool states (live prices) of the tick;
- ``saving`` = actual - shadow, ``saving_pct`` = 100 x saving / actual (``None`` when nothing ran);
- ``under_capacity_s``: time tidegate's placement would have served less than the load used
  (``controller.replay.shortfall``: the configured per-replica capacity against the recorded
  output tokens/s and requests/s);
- ``misses_covered_s``: time the current autoscaler missed the p99 latency SLO while tidegate's
  placement would have had more capacity than what ran and enough for the load.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Mapping

from controller.controller import SHADOW_DETAIL
from controller.core.model import ModelSpec, PoolSpec
from controller.core.pricing import placement_cost
from controller.replay import LoggedTick, placement_capacity, shortfall, step_s, ticks_from_rows

FIELDS = ("window_s", "actual_cost", "shadow_cost", "saving", "saving_pct", "under_capacity_s", "misses_covered_s")
"""The figures per model, in this order (``GET /v1/shadow``, ``tidegate report --shadow``)."""


def _actual(tick: LoggedTick) -> dict[str, int]:
    return {p: st.replicas or 0 for p, st in tick.signals.pools.items()}


def summarize(ticks: list[LoggedTick], model: ModelSpec, pools: Mapping[str, PoolSpec],
              p99_target_ms: float | None) -> dict[str, Any]:
    """The figures of ``FIELDS`` for one model's shadow decisions, oldest first."""
    window = actual = shadow = under = covered = 0.0
    for i, t in enumerate(ticks):
        dt, ran = step_s(ticks, i), _actual(t)
        window += dt
        actual += placement_cost(model, pools, t.signals.pools, ran) * dt / 3600
        shadow += placement_cost(model, pools, t.signals.pools, t.placement) * dt / 3600
        if shortfall(model, pools, t.placement, t.signals, t.learned) is not None:
            under += dt
        elif _missed(t, p99_target_ms) and _tokens(model, pools, t.placement) > _tokens(model, pools, ran):
            covered += dt
    saving = actual - shadow
    return {"window_s": window, "actual_cost": round(actual, 4), "shadow_cost": round(shadow, 4),
            "saving": round(saving, 4), "saving_pct": round(100 * saving / actual, 2) if actual > 0 else None,
            "under_capacity_s": under, "misses_covered_s": covered}


def _tokens(model: ModelSpec, pools: Mapping[str, PoolSpec], placement: Mapping[str, int]) -> float:
    return placement_capacity(model, pools, placement)[0]


def _missed(tick: LoggedTick, p99_target_ms: float | None) -> bool:
    p99 = tick.signals.p99_latency_ms.value
    return p99_target_ms is not None and p99 is not None and p99 > p99_target_ms


def report(repo: Any, *, models: Mapping[str, ModelSpec], pools: Mapping[str, PoolSpec],
           p99_targets: Mapping[str, float | None], since: datetime, until: datetime) -> dict[str, Any]:
    """Per model with shadow decisions in ``[since, until)``: its figures (``FIELDS``)."""
    out: dict[str, Any] = {}
    for name, model in models.items():
        rows: Iterable[Mapping[str, Any]] = (r for r in repo.decisions_between(name, since, until)
                                             if r["outcome"] == "skipped" and r["outcome_detail"] == SHADOW_DETAIL)
        ticks = ticks_from_rows(rows)
        if ticks:
            out[name] = summarize(ticks, model, pools, p99_targets.get(name))
    return out


def sentence(model: str, figures: Mapping[str, Any]) -> str:
    """``over 7.0 days tidegate would have cost $X less (-Y %), with Z minutes of lower capacity
    than needed``, and the misses it would have covered."""
    w = figures["window_s"]
    span = (f"{w / 86400:.1f} days" if w >= 86400 else f"{w / 3600:.1f} hours" if w >= 3600
            else f"{w / 60:.0f} minutes")
    saving, pct = figures["saving"], figures["saving_pct"]
    cost = (f"${saving:,.2f} less" if saving >= 0 else f"${-saving:,.2f} more") + (
        f" ({-pct:+.1f} %)" if pct is not None else "")
    return (f"{model}: over {span} tidegate would have cost {cost}, with {figures['under_capacity_s'] / 60:.1f} "
            f"minutes of lower capacity than needed; it would have covered {figures['misses_covered_s'] / 60:.1f} "
            "minutes of the current autoscaler's p99 SLO misses")
