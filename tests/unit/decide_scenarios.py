"""Seeded, deterministic scenarios for ``decide``: the input side of the golden regression test.

``scenario(seed)`` draws one fleet, one policy (every built-in kind, plus a scripted kind that can
raise or return nonsense), overrides, a budget, spot pools with notices and live prices, and
signals that are present, missing, stale, NaN, partial or degraded, then runs ``TICKS`` decisions
in a row, each tick's history and placement feeding the next. ``record(decision)`` is the compact,
JSON-able form kept in ``golden/decide.jsonl.gz`` (one line per scenario): decisions, traces (stage
names, reason codes, messages) and recommendations. ``python -m tests.unit.decide_scenarios --write``
rewrites that file from the current code.

Plain ``random.Random(seed)``, not hypothesis: the same seed must draw the same scenario on every
machine and every hypothesis version, or the golden file would not be reproducible.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Literal

from controller.core.model import (
    Decision,
    History,
    ModelSignals,
    ModelSpec,
    Override,
    OverrideKind,
    PoolSpec,
    PoolState,
    Recommendation,
    ReplicaCapacity,
    Sample,
    Tier,
)
from controller.core.policy import EffectivePolicy
from controller.core.reasons import Reason
from controller.core.signals import model_signal_names
from controller.core.spec import PolicySpec
from policies.base import PolicyContext, PolicyKind, Registry
from policies.forecast import Forecast
from policies.queue_depth import QueueDepth
from policies.schedule import Schedule
from policies.slo_guard import SloGuard
from policies.target_utilization import TargetUtilization
from tests.unit.test_pipeline import Fixed

START = datetime(2025, 3, 3, 7, 50, tzinfo=timezone.utc)
TICKS = 4
GPUS = ("A100", "H100", "L4")
SAMPLES = tuple(n for n in model_signal_names() if n not in ("p99_ttft_ms", "arrival_rate_per_s"))
"""The signals drawn at random (p99_ttft_ms and arrival_rate_per_s, added later, are left missing so
that the random stream, and with it every earlier scenario, stays as it was: a missing arrival rate
reads as the completions, which is what every stage read before it)."""


class Scripted(Fixed):
    """``Fixed`` (a target or a floor, or no opinion for lack of data) that can also raise or
    return nonsense, which the pipeline must turn into no opinion."""

    name = "scripted"

    class Params(Fixed.Params):
        mode: Literal["ok", "raise", "not-a-recommendation", "negative"] = "ok"

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        mode = getattr(self.params, "mode", "ok")
        if mode == "raise":
            raise RuntimeError("kaput")
        if mode == "not-a-recommendation":
            return "nine"  # type: ignore[return-value]
        if mode == "negative":
            return Recommendation(self.rule, self.name, -3, Reason.QUEUE_ABOVE_TARGET.value)
        return super().recommend(ctx)


REGISTRY = Registry([SloGuard, TargetUtilization, QueueDepth, Schedule, Forecast, Scripted])


@dataclass(frozen=True)
class Tick:
    """The arguments of one ``decide`` call, minus the history (chained from the previous tick)."""

    signals: ModelSignals
    overrides: tuple[Override, ...]
    now: datetime
    paused: bool


@dataclass(frozen=True)
class Scenario:
    model: ModelSpec
    pools: dict[str, PoolSpec]
    policy: EffectivePolicy
    ticks: tuple[Tick, ...]
    history: History

    def run(self, decide: Callable[..., Decision]) -> list[Decision]:
        """Every tick through ``decide``, each one's history handed to the next."""
        out: list[Decision] = []
        history = self.history
        for t in self.ticks:
            d = decide(model=self.model, pools=self.pools, signals=t.signals, policy=self.policy,
                       history=history, overrides=t.overrides, now=t.now, paused=t.paused)
            out.append(d)
            history = d.history
        return out


_ONPREM, _AWS_SPOT, _GCP_SPOT = (Tier.ONPREM, "onprem"), (Tier.SPOT, "aws"), (Tier.SPOT, "gcp")
_AWS_OD, _GCP_OD = (Tier.ONDEMAND, "aws"), (Tier.ONDEMAND, "gcp")


def _pools(r: random.Random, tp: int, gpus: tuple[str, ...]) -> dict[str, PoolSpec]:
    kinds = ([_ONPREM] * r.choice((0, 1, 1, 2))
             + [r.choice((_AWS_SPOT, _GCP_SPOT)) for _ in range(r.randint(0, 3))]
             + [r.choice((_AWS_OD, _GCP_OD)) for _ in range(r.randint(0, 2))])
    if not kinds:
        kinds = [_AWS_SPOT]
    out: dict[str, PoolSpec] = {}
    for i, (tier, provider) in enumerate(kinds):
        odd = r.random() < 0.1  # now and then a pool that cannot host the model
        gpu = r.choice(GPUS if odd else gpus)
        per_node = r.choice((1, 2, 4, 8) if odd else tuple(g for g in (1, 2, 4, 8) if g >= tp))
        # the names the golden file was written with (the older kind: onprem, aws-spot...)
        name = f"p{i}-{tier.value if tier is Tier.ONPREM else f'{provider}-{tier.value}'}"
        out[name] = PoolSpec(name, tier, provider, gpu, per_node, r.randint(0, 6),
                             r.randint(0 if tier is Tier.ONPREM else 1, 60) / 2, priority=r.randint(0, 1))
    return out


def _rule(r: random.Random, i: int) -> PolicyKind:
    kind = r.choice(("slo-guard", "target-utilization", "queue-depth", "schedule", "forecast", "scripted",
                     "scripted"))
    params: dict[str, Any]
    if kind == "slo-guard":
        params = {"capacity_fraction": r.choice((0.5, 0.8, 1.0)), "scale_down_below_ratio": r.choice((0.3, 0.5)),
                  "gpu_utilization_target_pct": r.choice((None, 60, 80)),
                  "p99_latency_ms": r.choice((None, 2000, 4000))}
    elif kind == "target-utilization":
        params = {"signal": r.choice(SAMPLES[:7]), "target": r.choice((5, 50, 70, 400)),
                  "target_type": r.choice(("average", "total")), "tolerance": r.choice((0.0, 0.1))}
    elif kind == "queue-depth":
        params = {"target_per_replica": r.choice((2, 4, 8)), "activation_threshold": r.choice((0, 1)),
                  "missing_as_zero": r.random() < 0.3}
    elif kind == "schedule":
        params = {"windows": [{"cron": r.choice(("*/10 * * * *", "0 8 * * mon-fri", "30 7 * * *")),
                               "duration_s": r.choice((120, 900, 3600)), "min_replicas": r.randint(0, 12),
                               "timezone": r.choice(("UTC", "Europe/Paris"))}]}
    elif kind == "forecast":
        params = {"lead_time_s": r.choice((0, 300, 600)), "burst_window_s": r.choice((0, 300, 900)),
                  "burst_hold_s": r.choice((None, 60)), "history_s": 900, "headroom": r.choice((1.0, 1.2)),
                  "max_replicas": r.choice((None, 8))}
    else:
        params = {"replicas": r.randint(0, 30), "floor": r.random() < 0.25, "missing": r.random() < 0.2,
                  "mode": r.choice(("ok",) * 8 + ("raise", "not-a-recommendation", "negative"))}
    return REGISTRY.build(kind, params, rule=f"r{i}-{kind}")


def _behavior(r: random.Random) -> dict[str, Any]:
    choice = r.randint(0, 3)
    if choice == 0:
        return {}
    if choice == 1:
        return {"tolerance": 0, "scale_up": {"policies": []}, "scale_down": {"stabilization_s": 0, "policies": []}}
    return {
        "tolerance": r.choice((0.0, 0.1, 0.3)),
        "scale_up": {"stabilization_s": r.choice((0, 60)), "select": r.choice(("max", "min", "disabled")),
                     "policies": [{"type": "percent", "value": 100, "period_s": 15},
                                  {"type": "replicas", "value": r.randint(1, 4), "period_s": 60}],
                     "cooldown_s": r.choice((0, 30))},
        "scale_down": {"stabilization_s": r.choice((0, 60, 300)), "select": r.choice(("max", "min")),
                       "policies": [{"type": "percent", "value": 50, "period_s": 60}],
                       "cooldown_s": r.choice((0, 120))},
    }


def _policy(r: random.Random) -> EffectivePolicy:
    lo = r.randint(0, 6)
    budget: dict[str, float] = {}
    if r.random() < 0.5:
        budget["max_cost_per_hour_usd"] = r.randint(1, 200) / 2
    if r.random() < 0.4:
        budget["max_cost_per_million_tokens_usd"] = r.randint(1, 40) / 4
    doc = {
        "model": "m",
        "bounds": {"min_replicas": lo, "max_replicas": r.randint(max(lo, 1), 30)},
        "slo": {"p99_latency_ms": r.choice((None, 3000)), "queue_depth_per_replica": r.choice((None, 4)),
                "ttft_p99_ms": r.choice((None, 1500))},
        "behavior": _behavior(r),
        "placement": {"spot_spread_min_pools": r.randint(1, 3), "allow_on_demand": r.random() < 0.7,
                      "max_recent_interruptions": r.randint(0, 4)},
        "budget": budget,
        "missing_data": {"on_missing": r.choice(("hold", "hold", "ignore")),
                         "max_signal_age_s": r.choice((30, 60, 300))},
    }
    rules = tuple(_rule(r, i) for i in range(r.choice((0, 1, 1, 2, 2, 3))))
    return EffectivePolicy("m", PolicySpec.model_validate(doc), rules, f"v{r.randint(0, 9)}")


def _sample(r: random.Random, name: str, now: datetime, scale: float) -> Sample:
    roll = r.random()
    if roll < 0.12:
        return Sample.missing(r.choice(("NoData", "HTTP 503")), now)
    if roll < 0.18:
        return Sample(scale * r.random(), now - timedelta(seconds=r.choice((120, 600))))
    if roll < 0.21:
        return Sample(float("nan"), now, "NaN")
    value = round(scale * r.random(), 3)
    if roll < 0.25:
        return Sample(value, now - timedelta(seconds=5), "Partial: 1 of 2 pools")
    return Sample(value, now - timedelta(seconds=r.randint(0, 20)))


_SCALES = {"queue_depth": 60.0, "p99_latency_ms": 8000.0, "gpu_utilization_pct": 100.0,
           "request_rate_per_s": 30.0, "output_tokens_per_s": 12000.0, "input_tokens_per_s": 40000.0,
           "kv_cache_utilization_pct": 100.0, "cost_per_million_tokens_usd": 20.0}


def _state(r: random.Random, spec: PoolSpec, replicas: int | None, now: datetime) -> PoolState:
    spot = spec.tier.is_spot
    if replicas is not None and r.random() < 0.3:
        replicas = max(0, replicas + r.randint(-2, 2))  # the cluster moved under us
    if r.random() < 0.03:
        replicas = None  # not observed yet
    ready = None if replicas is None or r.random() < 0.15 else r.randint(0, replicas)
    available = r.random() > 0.15
    return PoolState(
        pool=spec.name, replicas=replicas, ready_replicas=ready, available=available,
        unavailable_reason=None if available else r.choice((None, "Unschedulable")),
        interrupted_replicas=r.choice((0, 0, 0, 1, 2)) if spot else 0,
        recent_interruptions=r.randint(0, 5) if spot else 0,
        price_per_node_hour_usd=r.choice((None, r.randint(1, 80) / 2)) if spot else None, at=now)


def _overrides(r: random.Random, model: ModelSpec, now: datetime) -> tuple[Override, ...]:
    out: list[Override] = []
    for i in range(r.choice((0, 0, 0, 1, 1, 2, 3))):
        kind = r.choice(tuple(OverrideKind))
        pool = r.choice((None, None, "nowhere") + model.pools) if model.pools else None
        out.append(Override(
            id=i + 1, kind=kind, model=r.choice(("m",) * 9 + ("other",)), pool=pool,
            replicas=r.choice((None, r.randint(0, 12), r.randint(0, 12))),
            min_replicas=r.choice((None, r.randint(0, 8))), max_replicas=r.choice((None, r.randint(1, 20))),
            expires_at=r.choice((None, now + timedelta(minutes=5), now - timedelta(seconds=1))),
            created_at=r.choice((None, now - timedelta(minutes=r.randint(1, 60)))), reason="golden"))
    return tuple(out)


def scenario(seed: int) -> Scenario:
    r = random.Random(seed)
    tp = r.choice((1, 1, 2, 4))
    gpus = tuple(r.sample(GPUS, r.randint(1, 3)))
    pools = _pools(r, tp, gpus)
    model = ModelSpec(name="m", tp_degree=tp, quantization="fp8", gpu_types=gpus, cold_start_s=120,
                      capacity={g: ReplicaCapacity(r.choice((400.0, 1000.0)), r.choice((1.0, 4.0)))
                                for g in (gpus if r.random() < 0.9 else ())},
                      pools=tuple(pools))
    policy = _policy(r)
    now = START + timedelta(minutes=r.randint(0, 60 * 24 * 7))
    history = History(
        recommendations=tuple((now - timedelta(seconds=s), r.randint(0, 30))
                              for s in sorted(r.sample(range(1, 400), r.randint(0, 4)), reverse=True)),
    )
    placement = {n: r.randint(0, 8) if r.random() < 0.7 else 0 for n in pools}
    ticks: list[Tick] = []
    for _ in range(TICKS):
        states = {n: _state(r, spec, placement[n], now) for n, spec in pools.items()}
        samples = {name: _sample(r, name, now, _SCALES[name]) for name in SAMPLES}
        signals = ModelSignals("m", now, pools=states, degraded=r.choice((None,) * 9 + ("PrometheusUnavailable",)),
                               **samples)
        ticks.append(Tick(signals, _overrides(r, model, now), now, r.random() < 0.1))
        # The next tick sees a placement near what this one could have decided: the scenario is
        # drawn before any decision so that it is the same for every implementation of ``decide``.
        placement = {n: max(0, (v or 0) + r.randint(-1, 2)) for n, v in
                     ((n, s.replicas) for n, s in states.items())}
        now = now + timedelta(seconds=r.choice((15, 30, 60, 120)))
    return Scenario(model, pools, policy, tuple(ticks), history)


def record(d: Decision) -> list[Any]:
    """The compact, JSON-able form of one decision (floats as ``repr`` so equality is exact; history
    timestamps left out: each is one of the ticks' ``now``)."""
    return [
        d.current_replicas, d.replicas, [d.placement[n] for n in d.placement], d.reason, d.actuate,
        repr(d.cost_per_hour_usd), d.interrupted_replaced, d.policy_version,
        [[s.name, s.replicas, s.reason, s.message] for s in d.trace],
        # Each rule's reason and message are in the ``recommend`` stage's message already.
        [[r.rule, r.replicas, r.opinion.value, r.missing_data] for r in d.recommendations],
        [v for _, v in d.history.recommendations],
        [[e.from_replicas, e.to_replicas] for e in d.history.scale_events],
    ]


def records(seed: int, decide: Callable[..., Decision]) -> list[list[Any]]:
    return [record(d) for d in scenario(seed).run(decide)]



GOLDEN = Path(__file__).parent / "golden" / "decide.jsonl.gz"
"""One line per seed: the compact JSON of its ``TICKS`` decisions (gzip: ~460 kB of text)."""
SEEDS = range(200)


def golden_lines(decide: Callable[..., Decision]) -> list[str]:
    return [json.dumps(records(seed, decide), separators=(",", ":")) for seed in SEEDS]


def write_golden(decide: Callable[..., Decision] | None = None) -> None:
    """Rewrite the golden file from ``decide`` (default: the current one). Only when a change of
    behaviour is intended, and say so in the commit: the file is what proves refactorings change
    nothing."""
    if decide is None:
        from controller.core.pipeline import decide

    GOLDEN.parent.mkdir(exist_ok=True)
    data = "".join(line + "\n" for line in golden_lines(decide)).encode()
    GOLDEN.write_bytes(gzip.compress(data, mtime=0))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.unit.decide_scenarios --write   (rewrites " + str(GOLDEN) + ")")
    write_golden()
