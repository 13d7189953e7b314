"""Counterfactual replay: what another policy would have decided over a window of the decision log.

``replay(ticks, model=, pools=, policy=)`` re-runs ``decide()`` (the one decision core) over the
signals the log recorded, tick by tick, and sets what it decides beside what was decided: replicas
per pool over time, cost (``controller.core.pricing``), the intervals where each side had less
capacity than the load needed, and the first decisions that differ with both traces. It is pure:
same ticks, same policy, same result; no clock, no I/O (``load_ticks`` reads the log, through
``controller.db.repo``).

How the alternative sees the world. The load signals (token and request rates) are the ones
recorded. The alternative runs its own fleet (``controller.core.virtual``, as shadow mode does):
each pool's replicas are what the alternative placed at the tick before, assumed ready at once;
where that equals what the log observed, the observed pool state is used whole, so replaying the
policy that was in force reproduces the log. Availability, spot interruptions and live prices come
from the log. The alternative starts with an empty history at
the window's start and without the overrides that were active (a replay compares policies).
Latency and queue depth were measured on the fleet that ran, not on the alternative's.

Rolled-up history. Where the retention job has pruned full decisions (``controller.db.rollup``),
the part of the window older than the oldest full decision is read from the hourly rollups: one
coarse tick per rollup hour (``LoggedTick(coarser=True)``), at the hour's start (or the window's,
if later), whose signals are the hour's mean of each measured signal and whose pools run the
hour's mean replicas per pool (rounded), at the static price, all available; what was decided
there is that mean placement at the hour's mean cost per hour, with no trace. The alternative
decides on it like on any other tick; the result's ``coarser`` says how many hours were coarse.

Capacity: a pool's replica serves the learned capacity recorded with the tick's decision (the
learner's scale and smoothed token mix, ``controller.core.capacity``, applied to
``capacity[gpu_type]`` of the model's config), or that configured profile where the log holds no
learned value (rows from before learned capacity, hourly rollups); the same estimate is used for
both sides, since it describes the replicas, not the policy. The load needed is the recorded
``output_tokens_per_s`` and ``request_rate_per_s``; an interval is under capacity when either
falls short (``CAPACITY_ESTIMATE``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from itertools import islice
from typing import Any, Iterable, Mapping, Sequence

from controller.core.capacity import STATE_KEY, Mix, for_mix, smoothed_mix
from controller.core.model import Decision, History, ModelSignals, ModelSpec, PoolSpec, PoolState, Sample
from controller.core.pipeline import decide
from controller.core.policy import EffectivePolicy
from controller.core.signals import model_signal_names
from controller.core.virtual import shadow_signals

CAPACITY_ESTIMATE = ("the learned per-replica capacity recorded with each decision (the learner's scale and token "
                     "mix applied to models[].capacity[gpu_type]), or that configured capacity where the log has "
                     "none (older rows, hourly rollups), against the recorded output_tokens_per_s and "
                     "request_rate_per_s")

MAX_TICKS = 200_000
"""Most decisions one replay reads (a week of one model at 5 s ticks is 120,960): a longer window
is refused with what to do, rather than held in memory and computed for minutes."""

ROLLUP_HOUR = timedelta(hours=1)
"""What one coarse tick (one hourly rollup) stands for at most."""

FIRST_DIFFERENCES = 3
"""How many differing decisions the result shows in full."""


@dataclass(frozen=True)
class LoggedTick:
    """One decision of the log, as a replay needs it."""

    id: int
    at: datetime
    signals: ModelSignals
    placement: Mapping[str, int]
    cost_per_hour_usd: float
    reason: str
    trace: Sequence[Mapping[str, Any]]
    coarser: bool = False
    """From an hourly rollup, not a full decision (fewer points, no trace)."""
    learned: tuple[float, Mix | None] | None = None
    """The learned capacity in force at this decision: (scale, smoothed token mix); ``None``: the
    configured profile (no learner state in the log)."""


def learned_from(rule_state: Mapping[str, Any] | None) -> tuple[float, Mix | None] | None:
    """(scale, mix) of the learner's state in a decision's rule state; ``None`` when it has none
    or it is malformed (a replay never fails on an odd row: it falls back to the profile)."""
    st = (rule_state or {}).get(STATE_KEY)
    if not isinstance(st, Mapping):
        return None
    try:
        scale = float(st["scale"])
    except (KeyError, TypeError, ValueError):
        return None
    if not 0 < scale < float("inf"):
        return None
    return scale, smoothed_mix(st, None, 0.0, 1.0)


def placement_capacity(model: ModelSpec, pools: Mapping[str, PoolSpec], placement: Mapping[str, int],
                       learned: tuple[float, Mix | None] | None = None) -> tuple[float, float]:
    """(output tokens/s, requests/s) the placement sustains at the SLO: the configured profile,
    scaled and fitted to the mix by ``learned`` (see ``LoggedTick.learned``) when given."""
    tokens = requests = 0.0
    for name, n in placement.items():
        spec = pools.get(name)
        cap = None if spec is None else model.capacity.get(spec.gpu_type)
        if cap is not None and learned is not None:
            cap = for_mix(cap, learned[1], learned[0])
        if cap is not None and n > 0:
            tokens += n * cap.output_tokens_per_s
            requests += n * cap.requests_per_s
    return tokens, requests


def shortfall(model: ModelSpec, pools: Mapping[str, PoolSpec], placement: Mapping[str, int],
              signals: ModelSignals, learned: tuple[float, Mix | None] | None = None
              ) -> dict[str, float | None] | None:
    """What the load needed and the placement had, when it had less; ``None`` when it had enough
    or the load was not measured (missing is not zero: an unknown load is no shortfall)."""
    tokens, requests = placement_capacity(model, pools, placement, learned)
    need_t, need_r = signals.output_tokens_per_s.value, signals.request_rate_per_s.value
    short_t = need_t is not None and tokens < need_t
    short_r = need_r is not None and requests < need_r
    if not (short_t or short_r):
        return None
    return {"needed_output_tokens_per_s": need_t, "had_output_tokens_per_s": tokens,
            "needed_requests_per_s": need_r, "had_requests_per_s": requests}


def step_s(ticks: Sequence[LoggedTick], i: int) -> float:
    """The interval a tick stands for: until the next one (the last: as long as the one before; a
    last coarse tick: the rest of its hour)."""
    if i + 1 < len(ticks):
        return (ticks[i + 1].at - ticks[i].at).total_seconds()
    if ticks[i].coarser:
        at = ticks[i].at
        return (at.replace(minute=0, second=0, microsecond=0) + ROLLUP_HOUR - at).total_seconds()
    return (ticks[i].at - ticks[i - 1].at).total_seconds() if i > 0 else 0.0


def _trace(stages: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"name": s.name, "replicas": s.replicas, "reason": s.reason, "message": s.message} for s in stages]


@dataclass
class _Side:
    """What one side (decided or replayed) adds up to."""

    cost_usd: float = 0.0
    under_s: float = 0.0
    intervals: list[dict[str, Any]] = field(default_factory=list)

    def add(self, at: datetime, dt: float, cost_per_hour: float, short: dict[str, float | None] | None) -> None:
        self.cost_usd += cost_per_hour * dt / 3600.0
        runs = self.intervals
        if short is None:
            if runs:
                runs[-1]["_open"] = False
            return
        self.under_s += dt
        if runs and runs[-1]["_open"]:
            runs[-1]["to"] = at.timestamp() + dt
            runs[-1]["seconds"] += dt
        else:
            runs.append({"from": at.timestamp(), "to": at.timestamp() + dt, "seconds": dt, "_open": True, **short})

    def out(self) -> dict[str, Any]:
        runs = [{k: (datetime.fromtimestamp(v, tz=timezone.utc).isoformat() if k in ("from", "to") else v)
                 for k, v in r.items() if k != "_open"} for r in self.intervals]
        return {"cost_usd": round(self.cost_usd, 4), "under_capacity_s": self.under_s, "under_capacity": runs}


def _alt_decide(tick: LoggedTick, model: ModelSpec, pools: Mapping[str, PoolSpec], policy: EffectivePolicy,
                history: History, mine: Mapping[str, int] | None) -> Decision:
    return decide(model=model, pools=pools, signals=shadow_signals(tick.signals, mine), policy=policy, history=history, overrides=(),
                  now=tick.at)


def _coarser(ticks: Sequence[LoggedTick]) -> dict[str, Any] | None:
    """How much of the replay came from hourly rollups (``None``: none of it)."""
    coarse = [i for i, t in enumerate(ticks) if t.coarser]
    if not coarse:
        return None
    end = ticks[coarse[-1]].at + timedelta(seconds=step_s(ticks, coarse[-1]))
    return {"hours": len(coarse), "from": ticks[coarse[0]].at.isoformat(), "to": end.isoformat(),
            "note": f"{len(coarse)} h of hourly rollups: one tick per hour from its mean signals and replicas "
                    f"per pool, no traces"}


def replay(ticks: Sequence[LoggedTick], *, model: ModelSpec, pools: Mapping[str, PoolSpec],
           policy: EffectivePolicy, first_differences: int = FIRST_DIFFERENCES) -> dict[str, Any]:
    """The replay of ``ticks`` (oldest first, one model) under ``policy``, beside what was decided."""
    history, mine = History(), None
    decided, replayed = _Side(), _Side()
    series: list[dict[str, Any]] = []
    differ: list[dict[str, Any]] = []
    for i, tick in enumerate(ticks):
        d = _alt_decide(tick, model, pools, policy, history, mine)
        history, dt = d.history, step_s(ticks, i)
        mine = dict(d.placement)
        decided.add(tick.at, dt, tick.cost_per_hour_usd, shortfall(model, pools, tick.placement, tick.signals, tick.learned))
        replayed.add(tick.at, dt, d.cost_per_hour_usd, shortfall(model, pools, d.placement, tick.signals, tick.learned))
        series.append({"at": tick.at.isoformat(), "decided": dict(tick.placement), "replayed": mine,
                       **({"coarser": True} if tick.coarser else {})})
        if dict(tick.placement) != mine and len(differ) < first_differences:
            differ.append({"id": tick.id, "at": tick.at.isoformat(),
                           "decided": {"placement": dict(tick.placement), "reason": tick.reason,
                                       "trace": list(tick.trace)},
                           "replayed": {"placement": mine, "reason": d.reason, "trace": _trace(d.trace)}})
    return {
        "model": model.name, "policy_version": policy.version, "ticks": len(ticks),
        "from": ticks[0].at.isoformat() if ticks else None, "to": ticks[-1].at.isoformat() if ticks else None,
        "coarser": _coarser(ticks), "capacity_estimate": CAPACITY_ESTIMATE,
        "decided": decided.out(), "replayed": replayed.out(),
        "differing_ticks": sum(1 for s in series if s["decided"] != s["replayed"]),
        "first_differences": differ, "series": series,
    }


def ticks_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[LoggedTick]:
    """``LoggedTick``s from ``Repository.decisions_between`` rows, in time order."""
    from controller.db.codec import signals_from_json  # the log's codec, at the edge

    out = [LoggedTick(id=r["id"], at=r["at"], signals=signals_from_json(r["signals"]),
                      placement={k: int(v) for k, v in r["placement"].items()},
                      cost_per_hour_usd=float(r["cost_per_hour_usd"]), reason=r["reason"], trace=list(r["trace"]),
                      learned=learned_from(r.get("rule_state")))
           for r in rows]
    return sorted(out, key=lambda t: (t.at, t.id))


def tick_from_rollup(r: Mapping[str, Any], since: datetime) -> LoggedTick:
    """The coarse tick of one hourly rollup (``controller.db.rollup.to_json``): at the hour's start
    (``since`` if later), the hour's mean signals, its mean replicas per pool (rounded) as both the
    pools' state and what was decided, its mean cost per hour; no trace."""
    at = max(datetime.fromisoformat(r["hour"]), since)
    means = r["signals"]
    samples = {name: Sample(float(means[name]["mean"]), at, "HourlyRollupMean") if name in means
               else Sample.missing("NotInRollup", at) for name in model_signal_names()}
    placement = {p: int(round(v["mean"])) for p, v in r["placement"].items()}
    pools = {p: PoolState(pool=p, replicas=n, ready_replicas=n, at=at) for p, n in placement.items()}
    signals = ModelSignals(model=r["model"], at=at, samples=samples, pools=pools, degraded=None)
    return LoggedTick(id=r["first_id"], at=at, signals=signals, placement=placement,
                      cost_per_hour_usd=float(r["cost_per_hour_mean_usd"]),
                      reason=f"HourlyRollup of {r['decisions']} decisions", trace=[], coarser=True)


def load_ticks(repo: Any, model: str, since: datetime, until: datetime) -> list[LoggedTick]:
    """The window's decisions of ``model`` from the log (``controller.db.repo.Repository``).

    Rolled-up history: the part of the window older than the model's oldest full decision (the
    retention job prunes oldest first) is read from its hourly rollups, one coarse tick per hour
    (``tick_from_rollup``), and the result says ``coarser``; the rest from the full decisions."""
    from controller.errors import UserError

    oldest = repo.oldest_decision_at(model)
    cut = until if oldest is None else min(until, oldest)
    coarse = [] if cut <= since else repo.list_rollups(model, since=since, until=cut, limit=MAX_TICKS + 1)
    rows = list(islice(repo.decisions_between(model, since, until), MAX_TICKS + 1 - len(coarse)))
    if len(rows) + len(coarse) > MAX_TICKS:
        raise UserError(f"the window holds more than {MAX_TICKS} decisions and rollup hours of {model}; replay a "
                        f"shorter window (--from/--to), e.g. one day at a time")
    return sorted([tick_from_rollup(r, since) for r in coarse], key=lambda t: t.at) + ticks_from_rows(rows)


def alternative_policy(file: str, text: str, registry: Any, known_models: Iterable[str],
                       model: str | None) -> EffectivePolicy:
    """The policy to replay under, from a policy file's text: the one for ``model`` (or the only
    one in the file). A bad file is a ``UserError`` with every problem, one per line."""
    from controller.errors import UserError
    from controller.policyfile import load_policy_text

    known = set(known_models)
    result = load_policy_text(file, text, registry, known)
    if result.errors:
        raise UserError("\n".join(str(e) for e in result.errors))
    if model is None:
        if len(result.policies) != 1:
            raise UserError(f"{file}: holds policies for {sorted(result.policies) or 'no model'}; pick one with --model")
        return next(iter(result.policies.values()))
    if model not in result.policies:
        raise UserError(f"{file}: has no policy for model {model!r} (it has: {sorted(result.policies) or 'none'})")
    return result.policies[model]


def run_replay(repo: Any, *, models: Mapping[str, ModelSpec], pools: Mapping[str, PoolSpec], registry: Any,
               policy_file: str, policy_text: str, since: datetime, until: datetime,
               model: str | None = None) -> dict[str, Any]:
    """Load the alternative policy and the window from the log, and replay (the API and the CLI)."""
    from controller.errors import UserError

    if until <= since:
        raise UserError(f"--to ({until.isoformat()}) must be after --from ({since.isoformat()})")
    policy = alternative_policy(policy_file, policy_text, registry, models, model)
    if policy.model not in models:
        raise UserError(f"model {policy.model!r} is not in the daemon's config (known: {sorted(models)})")
    out = replay(load_ticks(repo, policy.model, since, until), model=models[policy.model], pools=pools,
                 policy=policy)
    return {**out, "policy_file": policy_file, "window": {"from": since.isoformat(), "to": until.isoformat()}}
