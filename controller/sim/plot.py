"""Timeline plots of simulation runs (PNG, matplotlib's Agg backend: no display needed).

One figure per run, four panels sharing the time axis: the load (arrivals per second), replicas
stacked by pool (ready, with the desired total as a line), cost per hour, and p99 time to first
token and end-to-end latency against the TTFT target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

_POOL_COLORS = {"onprem": "#4c72b0", "spot": "#55a868", "ondemand": "#c44e52"}


def timeline_png(timeline: Mapping[str, Any], path: str | Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    t = np.asarray(timeline["t_s"], dtype=float)
    span = t[-1] if len(t) else 0.0
    scale, unit = (3600.0, "h") if span > 3 * 3600 else (60.0, "min")
    x = t / scale
    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True, constrained_layout=True)
    fig.suptitle(title)

    ax = axes[0]
    ax.plot(x, np.asarray(timeline["arrivals_per_s"], dtype=float), color="#333333", lw=0.8)
    ax.set_ylabel("arrivals / s")

    ax = axes[1]
    pools: Mapping[str, Mapping[str, str]] = timeline.get("pools", {})
    stacks, labels, colors = [], [], []
    shades: dict[str, int] = {}
    for name, meta in pools.items():
        key = f"ready:{name}"
        if key not in timeline:
            continue
        stacks.append(np.asarray(timeline[key], dtype=float))
        labels.append(name)
        kind = meta.get("tier", "")
        base = _POOL_COLORS.get(kind, "#999999")
        n = shades.get(kind, 0)
        shades[kind] = n + 1
        colors.append(_shade(base, n))
    if stacks:
        ax.stackplot(x, *stacks, labels=labels, colors=colors, step="post", alpha=0.9)
        desired = np.sum([np.asarray(timeline[f"desired:{n}"], dtype=float) for n in pools if f"desired:{n}" in timeline], axis=0)
        ax.step(x, desired, where="post", color="black", lw=0.8, label="desired")
        ax.legend(loc="upper left", fontsize=7, ncol=4)
    ax.set_ylabel("replicas (ready)")

    ax = axes[2]
    ax.step(x, np.asarray(timeline["cost_per_hour_usd"], dtype=float), where="post", color="#8172b2", lw=0.9)
    ax.set_ylabel("cost $/h")

    ax = axes[3]
    p99 = np.asarray([np.nan if v is None else v for v in timeline.get("p99_ttft_s", [])], dtype=float)
    p99e = np.asarray([np.nan if v is None else v for v in timeline.get("p99_e2e_s", [])], dtype=float)
    if len(p99) == len(x):
        ax.plot(x, p99, color="#dd8452", lw=0.9, label="p99 TTFT")
    if len(p99e) == len(x):
        ax.plot(x, p99e, color="#937860", lw=0.6, alpha=0.7, label="p99 end-to-end")
    slo = timeline.get("slo", {})
    if slo.get("ttft_s"):
        ax.axhline(slo["ttft_s"], color="red", ls="--", lw=0.8, label="TTFT target")
    ax.set_yscale("log")
    ax.set_ylabel("latency s")
    ax.legend(loc="upper left", fontsize=7)
    ax.set_xlabel(f"time ({unit})")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _shade(hex_color: str, n: int) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    f = 1.0 - 0.18 * n
    return "#{:02x}{:02x}{:02x}".format(*(max(0, min(255, int(c * f))) for c in (r, g, b)))
