"""``bench/day_traces.py``: the held-out day traces are what its docstring (and the README's check of
the latency floor) says they are, seeded, and the simulator's Azure reader takes the files it writes
(stamps with the 2024 traces' UTC offset)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from controller.sim.workload import read_azure_trace
from tests.unit.bench_scripts import load


def _module() -> ModuleType:
    return load("day_traces")


@pytest.mark.parametrize("name, prompt_median, prompt_max, output_median", [
    ("code-day", 1500, 16000, 20), ("chat-day", 800, 8000, 180), ("rag-day", 4000, 12000, 120),
])
def test_each_day_has_its_mix_and_a_night_at_a_fifth_of_the_peak(name: str, prompt_median: int, prompt_max: int,
                                                                 output_median: int) -> None:
    mod = _module()
    t, p, o = mod.trace(name, 5, 24.0)
    assert np.all(np.diff(t) >= 0) and 0 <= t[0] and t[-1] < 24 * 3600
    assert np.median(p) == pytest.approx(prompt_median, rel=0.05) and p.max() == prompt_max
    assert np.median(o) == pytest.approx(output_median, rel=0.06) and p.min() >= 1 and o.min() >= 1
    # a long tail of prompts: the 99th percentile far above the median
    assert np.percentile(p, 99) > 3 * prompt_median or np.percentile(p, 99) == prompt_max
    hourly = np.bincount((t // 3600).astype(int), minlength=24)
    night, peak = hourly[1:5].mean(), hourly.max()
    assert 0.12 < night / peak < 0.3
    if name == "rag-day":  # the lunch dip between two peaks
        assert hourly[12] < 0.85 * max(hourly[10], hourly[15])
    again = mod.trace(name, 5, 24.0)
    assert np.array_equal(t, again[0]) and np.array_equal(p, again[1])
    assert not np.array_equal(t[:1000], mod.trace(name, 6, 24.0)[0][:1000])


def test_the_files_read_as_azure_traces_with_utc_offsets(tmp_path: Path) -> None:
    mod = _module()
    assert mod.main([str(tmp_path), "--hours", "0.05"]) == 0
    for name in mod.MIXES:
        path = tmp_path / f"{name}.csv"
        stamp = path.read_text().splitlines()[1].split(",")[0]
        assert stamp.startswith("2024-05-10 00:0") and stamp.endswith("+00:00")  # as the 2024 traces write it
        t, p, o = mod.trace(name, 5, 0.05)
        back = read_azure_trace(path)
        assert np.allclose(back.arrival_s, t - t[0], atol=2e-6)
        assert np.array_equal(back.prompt_tokens, p) and np.array_equal(back.output_tokens, np.maximum(o, 1))


def test_the_training_day_is_the_one_the_readme_describes() -> None:
    """``--training``: a sinusoidal day around 28 requests/s (+-60 %), prompts log-uniform from 50
    to 8,000 tokens, answers from 1 to 300, seed 1 (2,418,824 requests)."""
    t, p, o = _module().training_day()
    assert len(t) == 2_418_824 and t[-1] < 86400
    assert 50 <= p.min() and p.max() < 8000 and 1 <= o.min() and o.max() < 300
    hourly = np.bincount((t // 3600).astype(int), minlength=24) / 3600.0
    assert 28 * 0.35 < hourly.min() < 28 * 0.45 and 28 * 1.55 < hourly.max() < 28 * 1.65
