"""``bench/rate_shapes.py``: the held-out shapes are what its docstring (and the README's check of
the burst memory for spikes) says they are, and the simulator reads the files it writes."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np

from controller.sim.workload import TokenDistribution, read_rate_series
from tests.unit.bench_scripts import load


def _module() -> ModuleType:
    return load("rate_shapes")


def test_the_shapes_are_the_ones_described() -> None:
    s = _module().shapes(7)
    evening, train, stairs, swells = s["evening"], s["spike-train"], s["staircase"], s["swells"]
    # three hours sliding from the peak to 15 % of it (8 % noise a minute): the first ten minutes
    # far above the last ten, which sit near 450 a minute
    assert len(evening) == 180
    assert evening[:10].mean() > 2500 and 350 < evening[-10:].mean() < 550
    # two hours: a two-minute spike of 7.5 x the base every eight minutes, nothing else above it
    assert len(train) == 120
    spikes = np.flatnonzero(train > 2000)
    assert list(spikes) == [m for start in range(5, 120, 8) for m in (start, start + 1) if m < 120]
    assert np.all(train[train <= 2000] < 500)
    # 15-minute steps, each 75 % of the one before
    assert len(stairs) == 120 and np.allclose(stairs[15::15] / stairs[:-15:15], 0.75)
    # four hours of swells with a 30-minute period, between about 300 and 2,700 a minute
    assert len(swells) == 240 and 200 < swells.min() < 400 and 2500 < swells.max() < 2900
    # seeded: the same series every time
    again = _module().shapes(7)
    assert all(np.array_equal(s[k], again[k]) for k in s)


def test_the_files_read_as_rate_series(tmp_path: Path) -> None:
    assert _module().main([str(tmp_path)]) == 0
    tokens = TokenDistribution(np.array([1000]), np.array([250]))
    for name, per_min in _module().shapes(7).items():
        series = read_rate_series(tmp_path / f"{name}.csv", tokens)
        assert len(series.rate_per_s) == len(per_min)
        assert np.allclose(series.rate_per_s * 60.0, np.maximum(0, per_min.astype(int)))
