"""Timeline plots of simulation runs (PNG, matplotlib's Agg backend: no display needed).

One figure per run, four panels sharing the time axis: the load (arrivals per second), replicas
stacked by pool (ready, with the desired total as a dashed line), cost per hour, and p99 time to
first token and end-to-end latency against the TTFT target.

Made to be read: every legend sits to the right of its panel, never over the data; each pool has
its own colour from the colour-blind-safe palette (``controller.palette``, shared with the status
page and the bench charts), the same colour for the same pool in every figure of one fleet; and
the runs of several controllers on one trace are drawn on the same axes (:func:`shared_limits`),
so their PNGs compare side by side. Other charts use :data:`PALETTE`, :func:`series_colours` and
:func:`legend_outside` from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from controller.palette import GRID, INK, MUTED, OKABE_ITO, TARGET, pool_colours, pool_order, series_colours

PALETTE = OKABE_ITO
"""The series colours (Okabe-Ito), for any chart of a run; re-exported with :func:`series_colours`."""

__all__ = ["PALETTE", "Limits", "legend_outside", "series_colours", "shared_limits", "timeline_figure", "timeline_png"]


@dataclass(frozen=True)
class Limits:
    """Axis ranges shared by the figures of several runs on one trace (0 is every lower bound but
    latency's, which is drawn on a log scale)."""

    t_max_s: float
    arrivals_max: float
    replicas_max: float
    cost_max: float
    latency_min_s: float
    latency_max_s: float


def _values(timeline: Mapping[str, Any], key: str) -> np.ndarray:
    return np.asarray([np.nan if v is None else v for v in timeline.get(key, [])], dtype=float)


def _max(*arrays: np.ndarray) -> float:
    finite = [a[np.isfinite(a)] for a in arrays]
    return max((float(a.max()) for a in finite if a.size), default=0.0)


def _replicas(timeline: Mapping[str, Any], prefix: str) -> np.ndarray:
    rows = [_values(timeline, f"{prefix}:{p}") for p in timeline.get("pools", {}) if f"{prefix}:{p}" in timeline]
    return np.sum(rows, axis=0) if rows else np.zeros(0)


def limits_of(timeline: Mapping[str, Any]) -> Limits:
    lat = np.concatenate([_values(timeline, "p99_ttft_s"), _values(timeline, "p99_e2e_s")])
    lat = lat[np.isfinite(lat) & (lat > 0)]
    target = (timeline.get("slo") or {}).get("ttft_s")
    lows = [float(lat.min())] if lat.size else []
    highs = [float(lat.max())] if lat.size else []
    if target:
        lows.append(float(target))
        highs.append(float(target))
    t = _values(timeline, "t_s")
    return Limits(
        t_max_s=float(t[-1]) if t.size else 0.0,
        arrivals_max=_max(_values(timeline, "arrivals_per_s")),
        replicas_max=_max(_replicas(timeline, "ready"), _replicas(timeline, "desired")),
        cost_max=_max(_values(timeline, "cost_per_hour_usd")),
        latency_min_s=min(lows, default=0.1),
        latency_max_s=max(highs, default=1.0),
    )


def shared_limits(timelines: Iterable[Mapping[str, Any]]) -> Limits | None:
    """The ranges that hold every one of ``timelines`` (``None`` for none): pass them to
    :func:`timeline_png` for each, and the figures share their axes."""
    each = [limits_of(t) for t in timelines]
    if not each:
        return None
    return Limits(*(max(getattr(lim, f) for lim in each) if f != "latency_min_s" else min(lim.latency_min_s for lim in each)
                    for f in Limits.__dataclass_fields__))


def legend_outside(ax: Any, **kwargs: Any) -> Any:
    """The axes' legend to the right of the plot area, off the data (constrained layout makes room)."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, frameon=False, **kwargs)


def timeline_png(timeline: Mapping[str, Any], path: str | Path, title: str, *, limits: Limits | None = None) -> Path:
    """Write the run's figure to ``path`` (PNG); ``limits``: shared axes (:func:`shared_limits`)."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig = timeline_figure(timeline, title, limits=limits)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def timeline_figure(timeline: Mapping[str, Any], title: str, *, limits: Limits | None = None) -> Any:
    """The run's figure (a matplotlib ``Figure``; the caller closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lim = limits or limits_of(timeline)
    t = _values(timeline, "t_s")
    scale, unit = (3600.0, "h") if lim.t_max_s > 3 * 3600 else (60.0, "min")
    x = t / scale
    fig, axes = plt.subplots(4, 1, figsize=(12, 10), sharex=True, layout="constrained")
    fig.suptitle(title)
    for ax in axes:
        ax.grid(True, color=GRID, lw=0.6)
        ax.set_axisbelow(True)
    axes[-1].set_xlim(0, lim.t_max_s / scale if lim.t_max_s else None)

    ax = axes[0]
    ax.plot(x, _values(timeline, "arrivals_per_s"), color=INK, lw=0.8, label="arrivals")
    ax.set_ylim(0, lim.arrivals_max * 1.05 or 1)
    ax.set_ylabel("arrivals / s")
    legend_outside(ax)

    _replica_panel(axes[1], timeline, x, lim)

    ax = axes[2]
    ax.step(x, _values(timeline, "cost_per_hour_usd"), where="post", color=INK, lw=1.0, label="cost")
    ax.set_ylim(0, lim.cost_max * 1.05 or 1)
    ax.set_ylabel("cost $/h")
    legend_outside(ax)

    ax = axes[3]
    for key, label, colour, lw in (("p99_ttft_s", "p99 TTFT", OKABE_ITO[0], 1.0),
                                   ("p99_e2e_s", "p99 end-to-end", MUTED, 0.7)):
        values = _values(timeline, key)
        if len(values) == len(x):
            ax.plot(x, values, color=colour, lw=lw, label=label)
    target = (timeline.get("slo") or {}).get("ttft_s")
    if target:
        ax.axhline(target, color=TARGET, ls="--", lw=1.0, label="TTFT target")
    ax.set_yscale("log")
    ax.set_ylim(lim.latency_min_s / 1.5, lim.latency_max_s * 1.5)
    ax.set_ylabel("latency s")
    legend_outside(ax)
    ax.set_xlabel(f"time ({unit})")
    return fig


def _replica_panel(ax: Any, timeline: Mapping[str, Any], x: np.ndarray, lim: Limits) -> None:
    """Ready replicas stacked by pool in tier order (only pools that held any), desired total dashed."""
    pools: Mapping[str, Mapping[str, str]] = timeline.get("pools", {})
    tiers = {name: str(meta.get("tier", "")) for name, meta in pools.items()}
    colours = pool_colours(tiers)  # over all pools: one pool keeps its colour whichever pools a run used
    stacks, labels, colors = [], [], []
    for name in pool_order(tiers):
        ready = _values(timeline, f"ready:{name}")
        if not ready.size or not np.nanmax(ready, initial=0) > 0:
            continue
        stacks.append(np.nan_to_num(ready))
        labels.append(f"{name} ({tiers[name]})")
        colors.append(colours[name])
    if stacks:
        ax.stackplot(x, *stacks, labels=labels, colors=colors, step="post", alpha=0.9, lw=0)
    desired = _replicas(timeline, "desired")
    if desired.size == x.size and x.size:
        ax.step(x, desired, where="post", color=INK, lw=1.0, ls="--", label="desired (total)")
    ax.set_ylim(0, lim.replicas_max * 1.05 or 1)
    ax.set_ylabel("replicas (ready)")
    legend_outside(ax)
