"""Simulated live spot prices: a slow, seeded, mean-reverting walk around the static price.

Real spot prices move in steps, a few times a day, within a band around a typical level; the
placement stage must cope with a spot pool that is sometimes cheaper and sometimes dearer than it
was. The walk here is an AR(1) process on the log of the price, one step every ``step_s``, so it
wanders but always comes back towards the pool's static price (the config's typical spot price).
It is a pure function of (seed, pool name, time), memoized step by step.
"""

from __future__ import annotations

import math
import random

_PERSISTENCE = 0.98
"""AR(1) coefficient per step: with 5-minute steps the walk forgets its past in a few hours."""
_STATIONARY_SD = 0.12
"""Standard deviation of log(price / static price) in the long run (~12 %)."""
_MAX_LOG_DEVIATION = 0.45
"""Clamp: the price stays within about 0.64x-1.57x of the static price."""


class SpotPriceWalk:
    """Price per node-hour of one spot pool as a function of ``t_s`` (seconds since the epoch)."""

    __slots__ = ("static_price_usd", "step_s", "_rng", "_log_dev")

    def __init__(self, static_price_usd: float, seed: int, pool: str, step_s: float = 300.0) -> None:
        if step_s <= 0:
            raise ValueError(f"step_s must be > 0, got {step_s}")
        self.static_price_usd = static_price_usd
        self.step_s = step_s
        self._rng = random.Random(f"tidegate-spot-price/{seed}/{pool}")
        self._log_dev: list[float] = [0.0]

    def price_usd(self, t_s: float) -> float:
        """Price per node-hour at ``t_s``; constant within a step, equal to the static price before
        the epoch. Rounded to 1e-4 USD like the providers' price APIs."""
        k = max(0, int(math.floor(t_s / self.step_s)))
        innovation_sd = _STATIONARY_SD * math.sqrt(1.0 - _PERSISTENCE**2)
        while len(self._log_dev) <= k:
            x = _PERSISTENCE * self._log_dev[-1] + self._rng.gauss(0.0, innovation_sd)
            self._log_dev.append(min(_MAX_LOG_DEVIATION, max(-_MAX_LOG_DEVIATION, x)))
        return round(self.static_price_usd * math.exp(self._log_dev[k]), 4)
