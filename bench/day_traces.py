"""Day-long request traces with heavy-tailed token mixes, for a held-out check of a policy change.

Why: the adversarial traces of ``bench/decision_quality.py`` last an hour or two and draw their
token counts log-uniformly within fixed ranges; the Azure code hour is one real mix. Real services
run for days and their prompt lengths have long tails (the 2024 Azure week traces: prompts of tens
of thousands of tokens among mostly short ones). A tail of long prompts puts a floor under the p99
time to first token that no number of replicas removes, which the learned capacity must not read
as a shortage. Each trace here is a request trace in the Azure format (``--format azure``, stamps
as the 2024 traces write them), from a seeded generator, with a diurnal rate (a night at a fifth of
the day's peak) and minute-scale swells:

* ``code-day``: a coding assistant: prompts log-normal around 1,500 tokens (sigma 1.0, up to
  16,000), answers around 20 tokens (sigma 1.0, up to 1,000);
* ``chat-day``: a conversation service: prompts around 800 tokens (sigma 0.9, up to 8,000),
  answers around 180 (sigma 0.8, up to 2,000);
* ``rag-day``: retrieval-augmented answers: prompts around 4,000 tokens (sigma 0.5, up to
  12,000), answers around 120 (sigma 0.7, up to 1,500), with a lunch dip between two peaks.

The rates are in arbitrary units: ``decision_quality.py`` scales every trace so its busiest minute
needs ``--peak-replicas`` replicas (16 by default).

``--training`` writes instead ``day2024.csv``, the day the learned capacity's latency floor was
made on (README, "A latency floor under the p99 TTFT"): a sinusoidal day around 28 requests/s
(+-60 %), prompts log-uniform from 50 to 8,000 tokens and answers from 1 to 300, seed 1.

    python bench/day_traces.py DIR [--seed 5] [--hours 24]
    python bench/day_traces.py DIR --training
    python bench/decision_quality.py --trace DIR/code-day.csv --default-only [--policy P] [--seed N]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NamedTuple

import numpy as np

ORIGIN = np.datetime64("2024-05-10T00:00:00", "us")
"""Midnight of the first day (UTC); the stamps carry ``+00:00`` as the 2024 Azure traces do."""

PEAK_PER_S = 20.0
"""Arrivals per second at the busiest hour before the benchmark rescales them."""


class Mix(NamedTuple):
    """Log-normal token counts: median and sigma of the prompt, the same of the answer, and caps."""

    prompt_median: float
    prompt_sigma: float
    prompt_max: int
    output_median: float
    output_sigma: float
    output_max: int


MIXES: dict[str, Mix] = {
    "code-day": Mix(1500.0, 1.0, 16000, 20.0, 1.0, 1000),
    "chat-day": Mix(800.0, 0.9, 8000, 180.0, 0.8, 2000),
    "rag-day": Mix(4000.0, 0.5, 12000, 120.0, 0.7, 1500),
}


def rate(name: str, t_s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Arrivals per second at each second ``t_s``: a night at a fifth of the peak, the peak in the
    afternoon (``rag-day``: two peaks around a lunch dip), times slow swells (about +-10 %,
    smoothed over ten minutes)."""
    hour = (t_s / 3600.0) % 24.0
    day = 0.2 + 0.8 * np.clip(np.sin(np.pi * (hour - 6.0) / 16.0), 0.0, None) ** 2  # 06:00-22:00
    if name == "rag-day":
        day = day * (1.0 - 0.35 * np.exp(-((hour - 12.5) / 0.8) ** 2))
    noise = rng.normal(0.0, 1.0, len(t_s) // 600 + 2)
    swell = 1.0 + 0.1 * np.interp(t_s / 600.0, np.arange(len(noise)), noise)
    return PEAK_PER_S * day * np.clip(swell, 0.5, None)


def trace(name: str, seed: int, hours: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival seconds, prompt tokens, output tokens) of one trace, sorted by arrival."""
    rng = np.random.default_rng([seed, sum(name.encode())])
    t = np.arange(int(hours * 3600.0), dtype=np.float64)
    counts = rng.poisson(rate(name, t, rng))
    arrival = np.repeat(t, counts) + rng.random(int(counts.sum()))
    arrival.sort()
    m = MIXES[name]
    n = len(arrival)
    prompt = np.clip(np.rint(m.prompt_median * np.exp(m.prompt_sigma * rng.standard_normal(n))), 1, m.prompt_max)
    output = np.clip(np.rint(m.output_median * np.exp(m.output_sigma * rng.standard_normal(n))), 1, m.output_max)
    return arrival, prompt.astype(np.int64), output.astype(np.int64)


def training_day() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival seconds, prompt tokens, output tokens) of ``day2024``, the training day."""
    rng = np.random.default_rng(1)
    t = np.arange(86400)
    counts = rng.poisson(28 * (1 + 0.6 * np.sin(2 * np.pi * (t / 86400 - 0.3))))
    arrival = np.repeat(t, counts) + rng.random(counts.sum())
    arrival.sort()
    n = len(arrival)
    prompt = np.exp(rng.uniform(np.log(50), np.log(8000), n)).astype(int)
    output = np.exp(rng.uniform(np.log(1), np.log(300), n)).astype(int)
    return arrival, prompt, output


def write(path: Path, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray) -> Path:
    """The Azure format with the 2024 traces' stamps (``2024-05-10 00:00:00.009930+00:00``)."""
    stamps = np.datetime_as_string(ORIGIN + (arrival * 1e6).astype("timedelta64[us]"), unit="us")
    with path.open("w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        f.writelines(f"{s[:10]} {s[11:]}+00:00,{p},{o}\n" for s, p, o in zip(stamps, prompt, output))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="where to write the CSV files")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--hours", type=float, default=24.0, help="length of each trace (default: a day)")
    ap.add_argument("--training", action="store_true", help="write day2024.csv, the training day, instead")
    args = ap.parse_args(argv)
    args.folder.mkdir(parents=True, exist_ok=True)
    if args.training:
        print(write(args.folder / "day2024.csv", *training_day()))
        return 0
    for path in write_all(args.folder, args.seed, args.hours):
        print(path)
    return 0


def write_all(folder: Path, seed: int = 5, hours: float = 24.0) -> list[Path]:
    """Every mix's trace as ``folder/<name>.csv`` (the folder exists)."""
    return [write(folder / f"{name}.csv", *trace(name, seed, hours)) for name in MIXES]


if __name__ == "__main__":
    raise SystemExit(main())
