"""The colours every chart of tidegate draws with: the status page (/ui), the simulator's PNGs
(controller/sim/plot.py) and the bench charts.

Series colours are the Okabe-Ito palette (Okabe & Ito, "Color Universal Design", 2008): eight
colours that stay distinct under the common colour-vision deficiencies (protanopia, deuteranopia,
tritanopia) and in greyscale print by lightness. Yellow is last: it is hard to read on white.
Pools get their colours in a stable order (tier, then the configured order), so one pool has the
same colour in every chart of one fleet. No plotting library is imported here: the daemon uses it.
"""

from __future__ import annotations

from typing import Iterable

from controller.core.model import Tier

OKABE_ITO: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
"""Blue, orange, bluish green, vermillion, reddish purple, sky blue, black, yellow."""

INK = "#222222"
"""Single-series lines (load, cost) and text."""
MUTED = "#999999"
"""A secondary series drawn beside a coloured one (end-to-end latency beside TTFT)."""
TARGET = "#D55E00"
"""Targets and limits drawn against a series (the SLO line): vermillion, dashed where drawn."""
GRID = "#dddddd"

TIER_ORDER: tuple[str, ...] = tuple(t.value for t in Tier)
"""Placement's order of preference (the Tier enum's order); stacks are drawn bottom-up in it."""


def series_colours(names: Iterable[str]) -> dict[str, str]:
    """A colour per name, in the order given (cycling after eight)."""
    return {name: OKABE_ITO[i % len(OKABE_ITO)] for i, name in enumerate(names)}


def pool_order(tiers: dict[str, str]) -> list[str]:
    """Pool names sorted by tier (:data:`TIER_ORDER`, then unknown tiers), keeping the given
    order within a tier. ``tiers``: pool name -> tier name."""
    rank = {t: i for i, t in enumerate(TIER_ORDER)}
    return sorted(tiers, key=lambda name: rank.get(tiers[name], len(rank)))


def pool_colours(tiers: dict[str, str]) -> dict[str, str]:
    """A distinct colour per pool, assigned in :func:`pool_order`."""
    return series_colours(pool_order(tiers))
