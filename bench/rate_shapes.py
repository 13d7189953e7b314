"""Four rate-series shapes for a held-out check of a policy change: none of the example policy's
settings was chosen on them.

Why: the adversarial traces of ``bench/decision_quality.py`` are where the policy was tuned; a
change to it is checked on shapes it has not seen. Each is a requests-per-minute series in the
format of ``../shared/data/maf_rate_series`` (``--format rate``), from a seeded generator:

* ``evening``: three hours sliding from a peak down to 15 % of it, with 8 % noise per minute;
* ``spike-train``: two hours of a low base with a two-minute spike of 7.5 x the base every eight
  minutes (a burst memory should hold the fleet between spikes);
* ``staircase``: two hours of 15-minute steps, each 75 % of the one before;
* ``swells``: four hours of a sinusoid with a 30-minute period between 300 and 2,700 a minute.

    python bench/rate_shapes.py DIR [--seed 7]
    python bench/decision_quality.py --trace DIR/evening.csv --format rate --default-only [--policy P] [--seed N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def shapes(seed: int) -> dict[str, np.ndarray]:
    """Requests per minute of each shape (floats; written as whole requests, at least 0)."""
    rng = np.random.default_rng(seed)
    m = np.arange(180)
    evening = 3000 * (0.15 + 0.85 * (1 - m / 180) ** 1.5) * (1 + 0.08 * rng.standard_normal(180))
    train = np.full(120, 400.0)
    for start in range(5, 120, 8):
        train[start:start + 2] = 3000
    train = train * (1 + 0.05 * rng.standard_normal(120))
    staircase = np.concatenate([np.full(15, 3000 * 0.75 ** k) for k in range(8)])
    swells = (1500 + 1200 * np.sin(2 * np.pi * np.arange(240) / 30)) * (1 + 0.05 * rng.standard_normal(240))
    return {"evening": evening, "spike-train": train, "staircase": staircase, "swells": swells}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="where to write the CSV files")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    args.folder.mkdir(parents=True, exist_ok=True)
    for path in write_all(args.folder, args.seed):
        print(path)
    return 0


def write_all(folder: Path, seed: int = 7) -> list[Path]:
    """Every shape as ``folder/<name>.csv`` (the folder exists)."""
    out = []
    for name, per_min in shapes(seed).items():
        lines = ["Time (min),Requests"] + [f"{i},{int(max(0.0, v))}" for i, v in enumerate(per_min)]
        path = folder / f"{name}.csv"
        path.write_text("\n".join(lines) + "\n")
        out.append(path)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
