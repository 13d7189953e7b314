"""Seeded adversarial workloads: the shapes a policy tuned on two traces has never seen.

Why: tidegate's policy and fleet were tuned on the Azure code hour and the Functions rate series;
a yardstick that only replays those cannot tell a policy that generalizes from one that fits them.
Each generator here draws a request trace (Poisson arrivals at a piecewise rate, token counts from
a distribution of its own) from a seed, so a run is repeatable and the shapes are not the shared
traces':

``flash-crowd``      a quiet base, then ten times the load within a minute, fading over 15 minutes;
                     (every trace lasts an hour; ``idle-burst``, ``step-up`` and ``diurnal`` an hour and a half)
``idle-burst``       an hour of near silence, then a 10-minute step burst, then silence again;
``sawtooth``         load ramps from low to high over 10 minutes and drops at once, three times;
``slow-ramp``        a one-hour ramp from a trickle to the peak and back;
``spot-reclaim``     a steady peak during which the whole of the cheapest spot pool is reclaimed
                     (its spot trace drops to zero capacity at the peak for 20 minutes);
``long-prompts``     prompts of 4-12k tokens with answers of 5-40 tokens (prefill bound);
``long-answers``     prompts of 50-400 tokens with answers of 400-1,500 tokens (decode bound);
``steady``           the same load for the whole hour (a fleet that starts small must catch up once,
                     then hold the right size);
``step-up``          a third of the peak for 30 minutes, the peak for 30, a third again for 30
                     (a lasting step, not a spike: an hour and a half);
``diurnal``          a conversation-like day compressed into an hour and a half: a quarter of the
                     peak rising smoothly to it and back, with slow random swells, prompts of
                     100-3,000 tokens and answers of 50-800, and the shared Azure traces' real spot
                     interruptions on the spot pools (a whole GCP pool reclaimed ~46 minutes in);
``square-wave``      five minutes at the peak, five at a twentieth of it, six times over, with the
                     same real spot interruptions (each gap is shorter than a cloud replica's lead
                     time, provisioning plus cold start, 6-8 minutes: what the fleet holds through
                     a gap, and what it orders late);
``bursty``           arrivals in bursts (gamma inter-arrival times, coefficient of variation 3, as
                     BurstGPT reports for conversation services) at 0.4 of the peak's mean for 30
                     minutes, then 0.7, with the same real spot interruptions.

Rates are in units of the peak: the benchmark scales every trace so its busiest minute needs
``peak_replicas`` replicas (``scenario.build_scenario``'s ``peak_replicas``), like the shared ones.
``python -m controller.sim.adversarial --out DIR`` writes them as Azure-format CSVs, for
``bench/decision_quality.py --trace`` or ``tidegate simulate --trace``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from controller.sim.workload import RequestTrace

BASE_RATE_PER_S = 20.0
"""Arrival rate of the peak before scaling (the benchmark rescales to its peak replicas)."""


@dataclass(frozen=True)
class Adversary:
    """One adversarial workload: its requests, and for ``spot-reclaim`` the window ``(start_s,
    end_s)`` during which a whole spot pool has no capacity (:func:`write_reclaim_csv`)."""

    name: str
    trace: RequestTrace
    reclaim_s: tuple[float, float] | None = None
    shared_spot: bool = False
    """Replay the shared Azure traces' spot interruptions on the spot pools (where present)."""


def _arrivals(rate: Callable[[np.ndarray], np.ndarray], end_s: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals at ``rate(t)`` (per second, given on a 1 s grid) over ``[0, end_s)``."""
    t = np.arange(int(end_s), dtype=np.float64)
    counts = rng.poisson(np.maximum(rate(t), 0.0))
    n = int(counts.sum())
    out = np.repeat(t, counts) + rng.random(n)
    out.sort(kind="stable")
    return out


def _tokens(n: int, rng: np.random.Generator, prompt: tuple[float, float], output: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """Log-uniform token counts in the given ranges (prompt, output)."""
    p = np.exp(rng.uniform(np.log(prompt[0]), np.log(prompt[1]), n)).astype(np.int64)
    o = np.exp(rng.uniform(np.log(output[0]), np.log(output[1]), n)).astype(np.int64)
    return np.maximum(p, 1), np.maximum(o, 1)


CODE_LIKE = ((300.0, 6000.0), (5.0, 120.0))
"""Token ranges of the default mix (a coding assistant: long prompts, short answers)."""


def _make(name: str, rate: Callable[[np.ndarray], np.ndarray], end_s: float, seed: int,
          tokens: tuple[tuple[float, float], tuple[float, float]] = CODE_LIKE) -> RequestTrace:
    rng = np.random.default_rng([seed, sum(name.encode())])
    t = _arrivals(rate, end_s, rng)
    p, o = _tokens(len(t), rng, *tokens)
    return RequestTrace(name, t, p, o)


def flash_crowd(seed: int) -> Adversary:
    def rate(t: np.ndarray) -> np.ndarray:
        base = 0.1 * BASE_RATE_PER_S
        t0 = 900.0
        rise = np.clip((t - t0) / 60.0, 0.0, 1.0)
        fade = np.exp(-np.maximum(t - t0 - 60.0, 0.0) / 900.0)
        return base + (BASE_RATE_PER_S - base) * rise * fade
    return Adversary("flash-crowd", _make("flash-crowd", rate, 3600.0, seed))


def idle_burst(seed: int) -> Adversary:
    def rate(t: np.ndarray) -> np.ndarray:
        return np.where((t >= 3600.0) & (t < 4200.0), BASE_RATE_PER_S, 0.002 * BASE_RATE_PER_S)
    return Adversary("idle-burst", _make("idle-burst", rate, 5400.0, seed))


def sawtooth(seed: int) -> Adversary:
    def rate(t: np.ndarray) -> np.ndarray:
        phase = (t % 1200.0) / 600.0
        return BASE_RATE_PER_S * np.where(phase < 1.0, 0.1 + 0.9 * phase, 0.1)
    return Adversary("sawtooth", _make("sawtooth", rate, 3600.0, seed))


def slow_ramp(seed: int) -> Adversary:
    def rate(t: np.ndarray) -> np.ndarray:
        return BASE_RATE_PER_S * (0.05 + 0.95 * np.sin(np.pi * np.clip(t / 3600.0, 0.0, 1.0)))
    return Adversary("slow-ramp", _make("slow-ramp", rate, 3600.0, seed))


def spot_reclaim(seed: int) -> Adversary:
    def rate(t: np.ndarray) -> np.ndarray:
        return BASE_RATE_PER_S * np.clip(0.2 + 0.8 * t / 900.0, 0.2, 1.0)
    # the whole pool is reclaimed 20 minutes in (at the peak) and comes back 20 minutes later
    return Adversary("spot-reclaim", _make("spot-reclaim", rate, 3600.0, seed), (1200.0, 2400.0))


def long_prompts(seed: int) -> Adversary:
    def rate(t: np.ndarray) -> np.ndarray:
        return BASE_RATE_PER_S * (0.5 + 0.5 * np.sin(2 * np.pi * t / 3600.0) ** 2)
    return Adversary("long-prompts", _make("long-prompts", rate, 3600.0, seed, ((4000.0, 12000.0), (5.0, 40.0))))


def long_answers(seed: int) -> Adversary:
    def rate(t: np.ndarray) -> np.ndarray:
        return BASE_RATE_PER_S * (0.5 + 0.5 * np.sin(2 * np.pi * t / 3600.0) ** 2)
    return Adversary("long-answers", _make("long-answers", rate, 3600.0, seed, ((50.0, 400.0), (400.0, 1500.0))))


def steady(seed: int) -> Adversary:
    def rate(t: np.ndarray) -> np.ndarray:
        return np.full_like(t, BASE_RATE_PER_S)
    return Adversary("steady", _make("steady", rate, 3600.0, seed))


def step_up(seed: int) -> Adversary:
    def rate(t: np.ndarray) -> np.ndarray:
        return BASE_RATE_PER_S * np.where((t >= 1800.0) & (t < 3600.0), 1.0, 1.0 / 3.0)
    return Adversary("step-up", _make("step-up", rate, 5400.0, seed))


CHAT_LIKE = ((100.0, 3000.0), (50.0, 800.0))
"""Token ranges of a conversation service: shorter prompts, longer answers than the code mix."""


def diurnal(seed: int) -> Adversary:
    end_s = 5400.0
    rng = np.random.default_rng([seed, sum(b"diurnal-swells")])
    # slow swells: white noise smoothed over five minutes, about +-10 % of the peak
    swell = np.convolve(rng.normal(0.0, 1.0, int(end_s)), np.ones(300) / 300.0, mode="same") * 1.6

    def rate(t: np.ndarray) -> np.ndarray:
        base = 0.25 + 0.75 * np.sin(np.pi * t / end_s) ** 2
        return BASE_RATE_PER_S * np.clip(base + 0.1 * swell[t.astype(np.int64)], 0.05, None)
    return Adversary("diurnal", _make("diurnal", rate, end_s, seed, CHAT_LIKE), shared_spot=True)


def square_wave(seed: int) -> Adversary:
    def rate(t: np.ndarray) -> np.ndarray:
        return BASE_RATE_PER_S * np.where((t % 600.0) < 300.0, 1.0, 0.05)
    return Adversary("square-wave", _make("square-wave", rate, 3600.0, seed), shared_spot=True)


def bursty(seed: int) -> Adversary:
    rng = np.random.default_rng([seed, sum(b"bursty")])
    cv2 = 9.0  # squared coefficient of variation of the gaps: gamma shape 1/9
    out: list[float] = []
    t = 0.0
    while t < 3600.0:
        mean_rate = BASE_RATE_PER_S * (0.4 if t < 1800.0 else 0.7)
        t += float(rng.gamma(1.0 / cv2, cv2 / mean_rate))
        out.append(t)
    arrival = np.array([x for x in out if x < 3600.0])
    p, o = _tokens(len(arrival), rng, (300.0, 6000.0), (5.0, 300.0))
    return Adversary("bursty", RequestTrace("bursty", arrival, p, o), shared_spot=True)


ADVERSARIES: dict[str, Callable[[int], Adversary]] = {
    "flash-crowd": flash_crowd, "idle-burst": idle_burst, "sawtooth": sawtooth, "slow-ramp": slow_ramp,
    "spot-reclaim": spot_reclaim, "long-prompts": long_prompts, "long-answers": long_answers,
    "steady": steady, "step-up": step_up, "diurnal": diurnal, "square-wave": square_wave, "bursty": bursty,
}


def write_azure_csv(trace: RequestTrace, path: Path, origin: str = "2024-01-01T00:00:00") -> Path:
    """``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps from ``origin`` (UTC)."""
    base = np.datetime64(origin, "us")
    stamps = base + (trace.arrival_s * 1e6).astype("timedelta64[us]")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"{str(s).replace('T', ' ')},{int(p)},{int(o)}"
              for s, p, o in zip(stamps, trace.prompt_tokens, trace.output_tokens)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_reclaim_csv(path: Path, start_s: float, end_s: float, nodes: int = 8) -> Path:
    """A SpotServe-format spot trace (``time_ms,add|remove,node``): ``nodes`` instances from t = 0,
    all preempted at ``start_s``, back at ``end_s`` (``--spot POOL=PATH``)."""
    lines = [f"0,add,n{i}" for i in range(nodes)]
    lines += [f"{int(start_s * 1000)},remove,n{i}" for i in range(nodes)]
    lines += [f"{int(end_s * 1000)},add,n{i}" for i in range(nodes)]
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write the seeded adversarial traces as Azure-format CSVs.")
    ap.add_argument("--out", required=True, help="directory to write <name>.csv into")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, make in ADVERSARIES.items():
        adv = make(args.seed)
        write_azure_csv(adv.trace, out / f"{name}.csv")
        print(f"{out / (name + '.csv')}: {len(adv.trace)} requests over {adv.trace.duration_s / 3600:.2f} h")
        if adv.reclaim_s is not None:
            spot = write_reclaim_csv(out / f"{name}-spot.csv", *adv.reclaim_s)
            print(f"{spot}: replay it on a spot pool (--spot POOL={spot})")
        elif adv.shared_spot:
            print(f"  with the shared Azure spot traces on the spot pools (bench/decision_quality.py --trace "
                  f"replays them; tidegate simulate: --spot POOL=PATH)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
