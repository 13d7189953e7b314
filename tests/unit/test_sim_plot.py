"""The simulator's timeline figures read well: legends beside the panels (never over the data),
one distinct colour-blind-safe colour per pool in tier order, and the same axes for every
controller run on one trace."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

pytest.importorskip("matplotlib")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from controller.palette import OKABE_ITO, pool_colours  # noqa: E402
from controller.sim.plot import limits_of, shared_limits, timeline_figure  # noqa: E402

POOLS = {"onprem-h100": {"tier": "onprem"}, "gcp-spot-a3": {"tier": "spot"}, "aws-od-p5": {"tier": "ondemand"},
         "aws-spot-p5": {"tier": "spot"}}


def _timeline(peak: int, n: int = 60, latency_s: float = 0.8) -> dict[str, Any]:
    t = [i * 60.0 for i in range(n)]
    ready = {"onprem-h100": [min(4, peak)] * n, "aws-spot-p5": [max(0, peak - 4) if n // 3 < i < 2 * n // 3 else 0 for i in range(n)],
             "gcp-spot-a3": [1 if i == n // 2 else 0 for i in range(n)], "aws-od-p5": [0] * n}
    out: dict[str, Any] = {"t_s": t, "arrivals_per_s": [peak * 2.0] * n, "cost_per_hour_usd": [10.0 * peak] * n,
                           "p99_ttft_s": [latency_s] * n, "p99_e2e_s": [None] + [latency_s * 5] * (n - 1),
                           "pools": POOLS, "slo": {"ttft_s": 1.5}}
    for pool, series in ready.items():
        out[f"ready:{pool}"] = series
        out[f"desired:{pool}"] = series
    return out


@pytest.fixture
def figure() -> Iterator[Any]:
    fig = timeline_figure(_timeline(8), "test run")
    fig.canvas.draw()
    yield fig
    plt.close(fig)


def test_every_legend_sits_beside_its_panel_not_over_the_data(figure: Any) -> None:
    renderer = figure.canvas.get_renderer()
    panels = [ax for ax in figure.axes if ax.get_legend() is not None]
    assert len(panels) == 4
    for ax in panels:
        legend = ax.get_legend().get_window_extent(renderer)
        plot_area = ax.get_window_extent(renderer)
        assert legend.x0 >= plot_area.x1, f"the legend of {ax.get_ylabel()!r} overlaps its plot"
        assert legend.x1 <= figure.bbox.x1 + 1, "the legend is cut off by the figure's edge"


def test_each_pool_that_held_replicas_has_its_own_palette_colour_in_tier_order(figure: Any) -> None:
    replicas = next(ax for ax in figure.axes if ax.get_ylabel() == "replicas (ready)")
    handles, labels = replicas.get_legend_handles_labels()
    stacked = {label.split(" ")[0]: to_hex(h.get_facecolor()) for h, label in zip(handles, labels) if "desired" not in label}
    # aws-od-p5 never held a replica: not drawn, not in the legend
    assert list(stacked) == ["onprem-h100", "gcp-spot-a3", "aws-spot-p5"]
    expected = pool_colours({p: m["tier"] for p, m in POOLS.items()})
    assert stacked == {p: expected[p].lower() for p in stacked}
    assert len(set(stacked.values())) == len(stacked) and set(stacked.values()) <= {c.lower() for c in OKABE_ITO}


def test_runs_on_one_trace_share_their_axes() -> None:
    small, big = _timeline(5, latency_s=0.2), _timeline(12, latency_s=3.0)
    limits = shared_limits([small, big])
    assert limits is not None
    assert limits.replicas_max == limits_of(big).replicas_max == 4 + 8 + 1  # onprem, spot, the one gcp replica
    assert limits.latency_min_s == 0.2 and limits.latency_max_s == 15.0
    figs = [timeline_figure(t, name, limits=limits) for name, t in (("small", small), ("big", big))]
    try:
        ranges = [[ax.get_ylim() for ax in f.axes] + [f.axes[-1].get_xlim()] for f in figs]
        assert ranges[0] == ranges[1]
    finally:
        for f in figs:
            plt.close(f)
    assert shared_limits([]) is None
