"""Learned capacity: what one replica sustains at the SLO, for the token mix it is serving now.

Why: a fixed "69 output tokens/s per replica" holds for one token mix only. A workload with longer
answers makes the token signal ask for many times the replicas it needs, one with longer prompts
for too few. So the capacity is computed in two steps, each tick:

1. **Prior, for the observed mix.** Where the bundle's capacity gives ``prefill_tokens_per_s`` and
   ``decode_tokens_per_s`` (what one replica processes at the SLO when doing only that), a request
   of the observed mix (``P`` prompt and ``O`` output tokens on average, from the prompt-token,
   output-token and request rates) costs ``P / prefill + O / decode`` replica-seconds, so a replica
   sustains ``1 / that`` requests/s and ``O / that`` output tokens/s. Without those fields (or
   before any token rate is seen) the prior is the bundle's fixed ``output_tokens_per_s`` /
   ``requests_per_s``.
2. **Correction, learned online** from what ready replicas actually sustain: ``scale`` multiplies
   the prior. Each tick with a settled fleet (every desired replica ready, rates fresh), the load
   per ready replica in units of the prior, ``u``, is evidence:

   - *under pressure* (the smoothed queue per replica, or p99 latency, at least
     ``pressure_ratio`` of its target, the smoothed pressure not falling, and no replica become
     ready within ``tau_s``: new replicas drain a backlog that the windowed signals still show):
     the replicas are at their capacity, so it is at most ``u``, and, where they are offered
     more than the estimate, at most what they serve where that is at most ``planned_fraction``
     of ``u`` (output tokens alone, where the pipeline gives them: an overloaded replica serves
     less than it is offered; see :func:`_sustained`): ``scale`` drops to that when above it (an
     upper bound, remembered for ``memory_s``). The served rate is read only ``tau_s`` after the
     first observation;
   - *between* calm and pressure (at least midway) for ``tau_s`` while the fleet is the size the
     estimate asks for: the planned load is not comfortable, so ``scale`` drops to ``u`` and
     bounds the probe as pressure does (a probe that released one replica too many is taken
     back rather than left standing);
   - *calm* (smoothed queue under ``calm_ratio`` of its target): the replicas sustain ``u``, so
     ``scale`` moves toward ``u`` when below it; and while the fleet runs close to its planned
     load and no recent upper bound forbids it, ``scale`` probes upward by ``probe_per_min`` a
     minute: a fleet sized by a pessimistic prior never loads its replicas enough to show that
     they could take more. On ``FAR_PROBE_MIN_REPLICAS`` or more the probe runs one replica
     further ahead of the fleet than usual; on fewer it waits ``tau_s`` after the ready count
     falls (see :func:`_calm`). Calm minutes in which something else holds the fleet far above
     the estimate's size (a cold start's backlog, a burst, a floor) teach nothing. Calm is read
     only while the tick's own pressure is under ``pressure_ratio`` (the smoothed value lags a
     sudden backlog).

   The pressure is smoothed with time constant ``tau_s`` (time is data: computed from the
   observations' timestamps, never from tick counts), each reading clipped to ``PRESSURE_CAP``.
   ``scale`` stays within [``min_scale``, ``max_scale``].

The state is plain JSON in the history's rule state under ``STATE_KEY`` (persisted and rebuilt
from the decision log like a rule's). Pure: standard library and the core's own values only.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.core.model import Decision, ReplicaCapacity, fast_init
from controller.core.spec import CapacityLearning

STATE_KEY = "@capacity"
"""Key of the learner's state in ``History.rule_state`` (rule names cannot start with ``@``)."""

RECOVER_PER_MIN = 0.15
"""Below the profile, calm evidence raises the learned value back toward it at most this much per
minute even with ``probe_per_min: 0`` (a correction downward is not a ratchet)."""

PROBE_MIN_REPLICAS = 4
"""No upward probe with fewer ready replicas: releasing one of three is a third of the fleet, and
a probe that overshoots there costs the SLO more than the replica saves."""

HELD_SHARE = 0.5
"""A settled fleet whose replicas carry at most this share of the load the estimate plans for them
(``planned_fraction * scale``) is held far above the estimate's size by something other than
the probe: a cold start's backlog, a burst, a floor. The probe's own lag (it raises the estimate,
the fleet follows after the scale-down window) is at most ``2 + slack`` replicas (``1 + slack``,
one more on ``FAR_PROBE_MIN_REPLICAS`` or more), so at the default tolerance (0.1) the replicas
then still carry more than half the planned load."""

FAR_PROBE_MIN_REPLICAS = 2 * PROBE_MIN_REPLICAS
"""The probe goes one replica further ahead than usual only with at least this many ready
replicas: the extra replica is then at most an eighth of the fleet. Below it, after the ready
count falls, the probe also waits ``tau_s`` for the smoothed pressure to show the fewer replicas'
load (a replica there is a large step)."""

PRESSURE_CAP = 2.0
"""Pressure is smoothed clipped to this (twice the SLO): beyond it, it says only "at capacity". A
cold start into a backlog reads hundreds of times the SLO; smoothed unclipped, that reading would
decay for many ``tau_s`` and, easing all the while, hide the real pressure that follows."""

FLOOR_CAP = 0.7
"""The TTFT's pressure is what it reads above the latency floor over what the target leaves above
the floor, but never over less than ``1 - FLOOR_CAP`` of the target. A floor above this share is a
tail no fleet serves within the SLO (prompts whose prefill alone nears the target): waits may then
add at most ``pressure_ratio x (1 - FLOOR_CAP)`` of the target before they count as pressure,
instead of a vanishing share of it (or none, over a floor above the target)."""

FLOOR_RISE_PER_MIN = 0.002
"""How fast the latency floor climbs toward readings above it, in TTFT-target shares per minute
(0.12 in an hour): slower than any backlog or burst lasts, so that only a latency that every hour
shows becomes floor. Faster (0.004, 0.01) let a day's busy hours pass their contention off as
floor (README, "A latency floor under the p99 TTFT")."""

FLOOR_MIX_CHANGE = 0.25
"""The floor is measured afresh when the mix's mean prompt moves by more than this share from the
one it was measured on (a floor is the prefill of the mix's longest prompts)."""

REFERENCE_PROMPT_TOKENS = 1000.0
REFERENCE_OUTPUT_TOKENS = 250.0
"""The mix at which a capacity given only as prefill/decode tokens/s is quoted as requests/s and
output tokens/s where no mix has been observed (before the first token rates, and for readers
without a mix such as the SkyServe baseline's default target)."""


@fast_init
@dataclass(frozen=True, slots=True)
class Mix:
    """Mean tokens per request of the traffic being served."""

    prompt_tokens: float
    output_tokens: float


@fast_init
@dataclass(frozen=True, slots=True)
class Learned:
    """The capacity in force this tick and how it came about (for the trace and ``/v1/status``)."""

    capacity: ReplicaCapacity
    prior: ReplicaCapacity
    """The profile's capacity for the same mix, uncorrected."""
    scale: float
    evidence: str
    """What this tick's observation taught (``pressure``, ``calm``, ``probe``, or why nothing)."""
    state: Mapping[str, Any]

    def describe(self) -> str:
        """One line: ``capacity 41 output tok/s per replica, learned (x0.59); profile 69``."""
        how = f"learned (x{self.scale:.2f}, {self.evidence})" if self.scale != 1.0 else f"profile ({self.evidence})"
        return (f"capacity {self.capacity.output_tokens_per_s:.3g} output tok/s, "
                f"{self.capacity.requests_per_s:.3g} req/s per replica, {how}; "
                f"profile {self.prior.output_tokens_per_s:.3g} tok/s, {self.prior.requests_per_s:.3g} req/s")


def offered_tokens(out: float | None, done: float | None, arrivals: float | None) -> float | None:
    """Output tokens per second the arriving requests bring: ``out`` (served) per request completed
    (``done``) times the ``arrivals``; ``out`` itself when either rate is unknown or nothing
    completed. While a backlog drains the tokens served run ahead of the load (on the steady
    adversarial hour, nearly twice it), and while the replicas saturate they fall behind it."""
    if out is None or arrivals is None or done is None or done <= 0:
        return out
    return out * arrivals / done


def mix_of(req: float | None, out: float | None, inp: float | None) -> Mix | None:
    """Mean prompt and output tokens per request from fresh request, output token and input token
    rates; ``None`` without traffic."""
    if req is None or out is None or inp is None or req <= 0 or out < 0 or inp < 0:
        return None
    return Mix(inp / req, max(out / req, 1.0))


def for_mix(cap: ReplicaCapacity, mix: Mix | None, scale: float = 1.0) -> ReplicaCapacity:
    """``cap`` for ``mix`` (prefill/decode model when the capacity has it), times ``scale``."""
    pre, dec = cap.prefill_tokens_per_s, cap.decode_tokens_per_s
    if pre is None or dec is None:
        if scale == 1.0:
            return cap
        return ReplicaCapacity(cap.output_tokens_per_s * scale, cap.requests_per_s * scale, pre, dec)
    prompt, output = ((mix.prompt_tokens, mix.output_tokens) if mix is not None
                      else (REFERENCE_PROMPT_TOKENS, REFERENCE_OUTPUT_TOKENS))
    seconds = prompt / pre + output / dec
    rps = scale / seconds if seconds > 0 else cap.requests_per_s * scale
    return ReplicaCapacity(rps * output, rps, pre, dec)


def smoothed_mix(state: Mapping[str, Any], mix: Mix | None, now_s: float, tau_s: float) -> Mix | None:
    """The mix averaged over about ``tau_s`` (kept in the learner's state as ``mix``): one minute's
    mean of a few requests says little, and a minute without traffic keeps the last mix known."""
    raw = state.get("mix")
    old = None
    if isinstance(raw, (list, tuple)) and len(raw) == 3:
        try:
            old = (float(raw[0]), float(raw[1]), float(raw[2]))
        except (TypeError, ValueError):
            old = None
    if mix is None:
        return None if old is None else Mix(old[1], old[2])
    if old is None:
        return mix
    a = 1.0 - math.exp(-max(0.0, now_s - old[0]) / tau_s)
    return Mix(old[1] + a * (mix.prompt_tokens - old[1]), old[2] + a * (mix.output_tokens - old[2]))


def _num(state: Mapping[str, Any], key: str, default: float) -> float:
    """A number from JSON-round-tripped state (a malformed value is the default, never fatal)."""
    v = state.get(key, default)
    if type(v) is float:  # the learner's own writes (and the defaults): no conversion, no try (hot path)
        return v if math.isfinite(v) else default
    if v is None:  # written for "none" (no upper bound, no rise yet): the default without raising
        return default
    try:
        v = float(v)
    except (TypeError, ValueError):
        return default
    return v if math.isfinite(v) else default


@fast_init
@dataclass(frozen=True, slots=True)
class Observed:
    """One tick's evidence about the fleet's capacity, already read from the signals."""

    now_s: float
    load_units: float | None
    """Load in units of one replica's prior capacity for the mix (``None``: no fresh rate)."""
    ready: int
    settled: bool
    """Every desired replica ready (new replicas are not loaded yet: no evidence while starting)."""
    slack: int = 0
    """Replicas the tolerance dead band lets the fleet sit above its recommendation."""
    pressure: float | None = None
    """How close the replicas are to the SLO, 1 = at it: the largest of the queue per ready replica
    over its target, the mean wait (queue over request rate, Little's law) over
    ``wait_fraction`` of the TTFT target where no p99 TTFT is measured, and p99 latency over its
    target (``None``: none known). The p99 TTFT comes apart (``ttft_ratio``)."""
    ttft_ratio: float | None = None
    """p99 TTFT over its target (``None``: not measured). What of it counts is what lies above the
    latency floor (:func:`_latency_pressure`), and only while requests wait (``queued``)."""
    queued: bool = True
    """Requests were waiting at this observation: a p99 TTFT with none waiting is the window's
    memory of a backlog already served, so it counts toward pressure only with a queue (it still
    measures the floor)."""
    prompt_tokens: float | None = None
    """Mean prompt tokens per request of the mix served (the floor is the mix's: a new mix measures
    it afresh)."""


def _smooth(old: float | None, new: float, dt: float, tau_s: float) -> float:
    if old is None or dt <= 0:
        return new if old is None else old
    a = 1.0 - math.exp(-dt / tau_s)
    return old + a * (new - old)


def _pressure(smoothed: float | None, previous: float | None, held_off: bool, cfg: CapacityLearning,
              now: float | None = None) -> str | None:
    """``pressure``, ``calm`` or ``None`` (in between, or nothing to judge by). Pressure counts
    only while it is not easing and not ``held_off`` (a backlog draining after new replicas came
    is no evidence). Calm counts only while this observation's own pressure ``now`` is under
    ``pressure_ratio``: the smoothed value lags a sudden backlog (from a cold start into full
    traffic it read calm for 20 s with 279 requests waiting on one replica, and the estimate rose)."""
    if smoothed is None:
        return None
    if smoothed >= cfg.pressure_ratio and not held_off and (previous is None or smoothed >= previous - 1e-9):
        return "pressure"
    if smoothed <= cfg.calm_ratio and (now is None or now < cfg.pressure_ratio):
        return "calm"
    return None


def _restore(state: Mapping[str, Any], obs: Observed, cfg: CapacityLearning) -> tuple[float, float, float | None, float, float]:
    """(scale, dt since the last observation, previous smoothed pressure, upper bound, its time)
    from the state (tolerant of a JSON round trip and of malformed values)."""
    scale = min(max(_num(state, "scale", 1.0), cfg.min_scale), cfg.max_scale)
    dt = max(0.0, min(obs.now_s - _num(state, "t", obs.now_s), 300.0))  # a long gap is one step, not a leap
    q_prev = None if state.get("q") is None else min(_num(state, "q", 0.0), PRESSURE_CAP)
    hi, hi_t = _num(state, "hi", math.inf), _num(state, "hi_t", -math.inf)
    if obs.now_s - hi_t > cfg.memory_s:
        hi = math.inf
    return scale, dt, q_prev, hi, hi_t


def _held_off(state: Mapping[str, Any], obs: Observed, cfg: CapacityLearning, new: dict[str, Any]) -> bool:
    """Whether replicas became ready within ``tau_s``: they drain a backlog the windowed signals
    still show, so the load per ready replica understates what one sustains. Records the ready
    count and the time it last rose in ``new``."""
    up_t = obs.now_s if obs.ready > _num(state, "n", obs.ready) else _num(state, "up_t", -math.inf)
    new["n"], new["up_t"] = obs.ready, None if math.isinf(up_t) else up_t
    return obs.now_s - up_t < cfg.tau_s


def _stepped_down(state: Mapping[str, Any], obs: Observed, cfg: CapacityLearning, new: dict[str, Any]) -> bool:
    """Whether the ready count fell within ``tau_s``: the smoothed pressure has not yet shown what
    the fewer replicas carry, so calm then is no licence to probe further. Records the time in
    ``new``."""
    dn_t = obs.now_s if obs.ready < _num(state, "n", obs.ready) else _num(state, "dn_t", -math.inf)
    new["dn_t"] = None if math.isinf(dn_t) else dn_t
    return obs.now_s - dn_t < cfg.tau_s


def _calm(scale: float, u: float, hi: float, dt: float, obs: Observed, cfg: CapacityLearning,
          planned_fraction: float, stepped_down: bool = False) -> tuple[float, str]:
    """Calm evidence: (scale, evidence). Up slowly, down fast (AIMD):
    a capacity set too high costs the SLO, one too low costs money for a minute. Calm evidence
    above the estimate and the probe both rise at most ``probe_per_min``, and never to a load at
    which pressure was seen within ``memory_s``."""
    evidence = f"calm at {u:.3g} x profile per replica"
    step = scale * (1.0 + cfg.probe_per_min * dt / 60.0)
    if scale < 1.0:  # back toward the profile after a correction, whatever the probe allows above it
        step = max(step, min(1.0, scale * (1.0 + RECOVER_PER_MIN * dt / 60.0)))
    if u > scale:
        return min(u, step, max(hi, scale)), evidence
    ready = obs.ready
    if not obs.settled or ready < PROBE_MIN_REPLICAS:
        return scale, evidence
    planned = planned_fraction * scale
    if u <= HELD_SHARE * planned:
        # Held far above the estimate's size by something else (HELD_SHARE): what the replicas
        # carry tests no estimate, and the minute is lost to the probe rather than spent waiting
        # for the fleet to follow it. The estimate stays put.
        return scale, evidence + ", fleet held far above its size"
    if step >= hi:
        return scale, evidence
    if stepped_down and ready < FAR_PROBE_MIN_REPLICAS:  # the fewer replicas' load has not shown in the smoothed pressure yet
        return scale, evidence + ", fewer replicas not yet shown"
    # Probe only while the fleet is the size the current estimate asks for, give or take the
    # tolerance dead band that keeps a small change from happening (raising the estimate before the
    # fleet has followed teaches nothing), and only with enough replicas that the one a probe
    # releases is a small step (PROBE_MIN_REPLICAS).
    if u * ready > planned * (ready - 1 - obs.slack):
        return step, evidence + ", probing up"
    # That gate closes just as the fleet starts to follow (the same dead band), so the probe idles
    # through each scale-down window. On a fleet large enough that one replica is a small step
    # (FAR_PROBE_MIN_REPLICAS) it goes on one replica further ahead, still on calm evidence, below
    # ``hi``; an overshoot shows as pressure, or as the fleet at its new size not calm (``mid_t``
    # in :func:`_learn`), and is taken back. (Measured with bench/learned_capacity.py: gated on
    # calm minutes banked while the fleet was held far above its size, as before, a cold start
    # reached only 0.75-0.80 x the true capacity by 600 s on seeds 1-6; ungated 0.89-0.95 x.)
    if ready >= FAR_PROBE_MIN_REPLICAS and u * ready > planned * (ready - 2 - obs.slack):
        return step, evidence + ", probing up one replica further ahead"
    return scale, evidence


def _under_pressure(u: float, scale: float, served_units: float | None, obs: Observed, cfg: CapacityLearning,
                    planned_fraction: float, new: dict[str, Any]) -> tuple[float, str]:
    """(scale, evidence) under pressure; records the upper bound in ``new``."""
    if u < cfg.burst_share * planned_fraction * scale:
        # Pressure while the replicas carry far less than planned is a burst inside the rate's
        # window (or a slow request), not a measure of what a replica sustains.
        return scale, f"pressure at only {u:.3g} x profile per replica: a burst, not capacity"
    new["hi"], new["hi_t"] = u, obs.now_s
    evidence = f"pressure at {u:.3g} x profile per replica"
    return min(scale, _sustained(u, served_units, obs.ready, planned_fraction, scale)), evidence


def _sustained(u: float, served_units: float | None, ready: int, planned_fraction: float, scale: float) -> float:
    """What a replica under pressure at load ``u`` sustains at most: down fast, ``u``, and, where
    it is offered more than the estimate ``scale`` says it sustains, what it serves where that is
    clearly less (an overloaded replica serves less than it is offered; a gap within
    ``planned_fraction`` is the token mix moving, not overload). Offered no more than the estimate,
    a replica serving less is at a burst's onset, its completions lagging the arrivals: on the
    Functions training split such a reading (offered 0.76, serving 0.46 of the profile) cut the
    estimate to 0.46 and held it there for ``memory_s``."""
    served = u if served_units is None or u <= scale else served_units / ready
    return served if served <= planned_fraction * u else u


def _between(state: Mapping[str, Any], obs: Observed, cfg: CapacityLearning, planned_fraction: float, u: float,
             scale: float, qs: float | None, hi: float, held: bool, new: dict[str, Any], evidence: str
             ) -> tuple[float, str]:
    """(scale, evidence) between calm and pressure. At least midway while the fleet is the size
    the estimate asks for: the planned load is not comfortable, so the estimate is too high; a
    replica sustains about u (at most u / planned_fraction, calm there; at least u, no
    pressure). Once that has lasted ``tau_s`` (not a burst), down to u, and no probe past it
    (as after pressure). Records when it began in ``new["mid_t"]``."""
    new["mid_t"] = None
    if (qs is None or qs < (cfg.calm_ratio + cfg.pressure_ratio) / 2 or not obs.settled or held or u >= scale
            or u * obs.ready <= planned_fraction * scale * (obs.ready - 1)):
        return scale, evidence
    mid_t = new["mid_t"] = min(obs.now_s, _num(state, "mid_t", obs.now_s))
    evidence = f"between calm and pressure at {u:.3g} x profile per replica, at its planned size"
    if obs.now_s - mid_t < cfg.tau_s:
        return scale, evidence
    if u < hi:
        new["hi"], new["hi_t"] = u, obs.now_s
    return u, evidence


def _latency_pressure(state: Mapping[str, Any], obs: Observed, dt: float, cfg: CapacityLearning,
                      new: dict[str, Any]) -> float | None:
    """The p99 TTFT's pressure above its latency floor, ``max(0, r - floor) / (1 - min(floor,
    FLOOR_CAP))`` for a reading ``r`` of the TTFT over its target (a reading at the target still
    counts 1 where the floor is under ``FLOOR_CAP``); ``None`` when it says nothing of capacity (not
    measured, or no request waiting). Records the floor in ``new``.

    Why: a TTFT is the wait for a replica plus the prefill of the prompt itself, and more replicas
    shorten only the wait. Where the mix has long prompts, the p99 TTFT of an idle fleet is already
    a large share of the target (a day of prompts up to 8,000 tokens read 0.6-0.67 of 1.5 s at
    every fleet size), and read as pressure it halved the learned capacity again and again while
    requests hardly queued. The floor is the lower envelope of the smoothed readings: it falls at
    once to a lower one and climbs toward higher ones by at most ``FLOOR_RISE_PER_MIN``, so only a
    latency that stays high for many minutes raises it (a cold start's backlog, a burst's queue,
    the contention of a busy batch come and go with the load; the prefill of the mix's long prompts
    stays). It starts at 0 (the whole TTFT counts, as without a floor) and starts again at 0 when
    the mix's mean prompt moves by more than ``FLOOR_MIX_CHANGE`` from the one it was measured on."""
    r = obs.ttft_ratio
    fl = _num(state, "fl", 0.0)
    fl_p = _num(state, "fl_p", math.nan)
    tq = None if state.get("tq") is None else min(_num(state, "tq", 0.0), PRESSURE_CAP)
    p = obs.prompt_tokens
    if p is not None and (math.isnan(fl_p) or abs(p - fl_p) > FLOOR_MIX_CHANGE * fl_p):
        fl, fl_p = 0.0, p
    if r is not None:
        tq = _smooth(tq, min(r, PRESSURE_CAP), dt, cfg.tau_s)
        fl = min(fl + FLOOR_RISE_PER_MIN * dt / 60.0, tq)
    new["tq"], new["fl"], new["fl_p"] = tq, fl, None if math.isnan(fl_p) else fl_p
    if r is None or not obs.queued:
        return None
    return max(0.0, r - fl) / (1.0 - min(fl, FLOOR_CAP))


def _observed_pressure(state: Mapping[str, Any], obs: Observed, dt: float, cfg: CapacityLearning,
                       new: dict[str, Any]) -> float | None:
    """This observation's pressure: the largest of ``obs.pressure`` and the p99 TTFT's above its
    latency floor (:func:`_latency_pressure`, which records the floor in ``new``)."""
    now = obs.pressure
    if obs.ttft_ratio is None and obs.prompt_tokens is None and "fl" not in state:
        return now  # no TTFT and no floor: as without one
    latency = _latency_pressure(state, obs, dt, cfg, new)
    if latency is None:
        return now
    return latency if now is None else max(now, latency)


def learn(state: Mapping[str, Any], obs: Observed, cfg: CapacityLearning, planned_fraction: float,
          served_units: float | None = None) -> tuple[float, str, dict[str, Any]]:
    """(scale, evidence, new state) after one observation. ``planned_fraction``: the share of its
    capacity the policy plans a replica to run at (probing only while the fleet runs near it).
    ``served_units``: the load served (output tokens alone, in the same units as the load), where
    known: under pressure a replica sustains at most what it serves."""
    return _learn(state, obs, obs.load_units, cfg, planned_fraction, served_units)


def _learn(state: Mapping[str, Any], obs: Observed, load_units: float | None, cfg: CapacityLearning,
           planned_fraction: float, served_units: float | None = None) -> tuple[float, str, dict[str, Any]]:
    """:func:`learn` with the observation's load given apart (one per GPU type, the rest shared)."""
    scale, dt, q_prev, hi, hi_t = _restore(state, obs, cfg)
    new: dict[str, Any] = {"scale": scale, "t": obs.now_s, "hi": None if math.isinf(hi) else hi,
                           "hi_t": None if math.isinf(hi) else hi_t, "mid_t": None,
                           "t0": min(obs.now_s, _num(state, "t0", obs.now_s))}
    now = _observed_pressure(state, obs, dt, cfg, new)
    qs = new["q"] = None if now is None else _smooth(q_prev, min(now, PRESSURE_CAP), dt, cfg.tau_s)
    if not cfg.learn:
        return scale, "learning off", new
    if load_units is None or obs.ready <= 0:
        return scale, "no evidence (no ready replica or no traffic)", new
    u = load_units / obs.ready
    down = _stepped_down(state, obs, cfg, new)
    held = _held_off(state, obs, cfg, new)
    what = _pressure(qs, q_prev, held, cfg, now)
    evidence = "no evidence (between calm and pressure)"
    if what == "pressure":
        # the served rate needs a window of signals behind it (tau_s since the first observation)
        served = served_units if obs.now_s - new["t0"] >= cfg.tau_s else None
        scale, evidence = _under_pressure(u, scale, served, obs, cfg, planned_fraction, new)
    elif what == "calm":
        scale, evidence = _calm(scale, u, hi, dt, obs, cfg, planned_fraction, down)
    else:
        scale, evidence = _between(state, obs, cfg, planned_fraction, u, scale, qs, hi, held, new, evidence)
    scale = min(max(scale, cfg.min_scale), cfg.max_scale)
    new["scale"] = scale
    return scale, evidence, new


GPU_KEY = "gpus"
"""Key of the per-GPU-type part of the learner's state: ``{gpu_type: {"scale", "hi", "hi_t"}}``."""

_GPU_FIELDS = ("scale", "hi", "hi_t")
"""What the learner keeps per GPU type; the rest (time, smoothed pressure, ready count, mix) is
the fleet's."""


_GPU_FIELD_SET = frozenset(_GPU_FIELDS)
_FLEET_FIELDS = ("t", "q", "n", "up_t", "dn_t", "mid_t", "t0", "tq", "fl", "fl_p")
"""What :func:`learn` reads of the fleet's part of the state (the GPU type's part: ``_GPU_FIELDS``)."""


def _gpu_fields(state: Mapping[str, Any], gpu: str) -> dict[str, Any]:
    """The learner's fields for ``gpu``. A state from before the per-GPU learner (no ``gpus``)
    holds one scale for the model: every GPU type starts from it. A GPU type the state does not
    know yet starts from its profile."""
    per = state.get(GPU_KEY)
    # ``type(...) is dict`` first: an ABC isinstance check is slow, and the state is plain dicts
    if not (type(per) is dict or isinstance(per, Mapping)):
        return {k: state[k] for k in _GPU_FIELDS if k in state}
    own = per.get(gpu)
    if type(own) is dict and own.keys() == _GPU_FIELD_SET:
        return own  # as the learner wrote it: those fields and no other (read, never written to)
    return {k: own[k] for k in _GPU_FIELDS if k in own} if type(own) is dict or isinstance(own, Mapping) else {}


def learned_scale(state: Mapping[str, Any], gpu: str, cfg: CapacityLearning) -> float:
    """The scale the state holds for ``gpu`` (within the configured bounds)."""
    return min(max(_num(_gpu_fields(state, gpu), "scale", 1.0), cfg.min_scale), cfg.max_scale)


def load_units_by_gpu(state: Mapping[str, Any], cfg: CapacityLearning, ready: Mapping[str, int],
                      priors: Mapping[str, ReplicaCapacity], requests_per_s: float | None,
                      output_tokens_per_s: float | None, served_tokens_per_s: float | None = None,
                      ) -> tuple[dict[str, float | None], dict[str, float | None] | None]:
    """(load, served) per GPU type with ready replicas, for :func:`learn_by_gpu`. The load: the
    fleet's load over what its ready replicas sustain by the current estimates (the larger of
    requests and output tokens), given to each GPU type in proportion to its own scale. The
    signals are the model's, summed over its pools, so one observation cannot tell which GPU type
    is the slow one: it moves every GPU type present by the same factor and keeps the differences
    learned while each served alone. On one GPU type it is the load per ready replica in units of
    its prior. The rates are those offered (arrivals); the served load is the same for the output
    tokens served alone (``served_tokens_per_s``, by default ``output_tokens_per_s``; ``None``
    without one): what replicas under pressure sustain at most (``served_units``). Both from one
    reading of the scales."""
    n = sum(ready.values())
    scales = {g: learned_scale(state, g, cfg) for g in ready}
    rel: float | None = None
    if requests_per_s is not None:
        rel = _larger(rel, requests_per_s, sum([k * scales[g] * priors[g].requests_per_s for g, k in ready.items()]))
    done = output_tokens_per_s if served_tokens_per_s is None else served_tokens_per_s
    if output_tokens_per_s is None or done is None:
        return _spread(rel, scales, n), None
    out_cap = sum([k * scales[g] * priors[g].output_tokens_per_s for g, k in ready.items()])
    return _spread(_larger(rel, output_tokens_per_s, out_cap), scales, n), _spread(_larger(None, done, out_cap), scales, n)


def _spread(rel: float | None, scales: Mapping[str, float], n: int) -> dict[str, float | None]:
    """The fleet's relative load ``rel`` per GPU type, in proportion to its scale, over ``n`` ready
    replicas."""
    return {g: None if rel is None else rel * s * n for g, s in scales.items()}


def _larger(rel: float | None, load: float, cap: float) -> float | None:
    """The larger of ``rel`` and ``load / cap`` (``rel`` alone when nothing sustains the load)."""
    return max(rel or 0.0, load / cap) if cap > 0 else rel


def learn_by_gpu(state: Mapping[str, Any], obs: Observed, load_units: Mapping[str, float | None],
                 cfg: CapacityLearning, planned_fraction: float,
                 served_units: Mapping[str, float | None] | None = None,
                 ready: Mapping[str, int] | None = None) -> tuple[dict[str, float], str, dict[str, Any]]:
    """Per GPU type: (scale, evidence, new state) of :func:`learn`, each GPU type with its own
    scale and upper bound, so that a fleet on two GPU types of different speeds learns two
    capacities. ``load_units[g]``: :func:`load_units_by_gpu`, for the GPU types with ready
    replicas; the others keep what they learned. The pressure, its smoothing and the ready count
    are the fleet's, shared.

    ``ready``: ready replicas per GPU type. While several GPU types serve, one with fewer than
    PROBE_MIN_REPLICAS of them does not probe above its profile or its estimate (it still comes
    back up to the profile, and falls with the fleet): its share of the fleet's pressure is too
    small for calm to say anything of what it sustains. Probing on it, one H200 replica beside
    nine H100 ones (held under the load they saw pressure at) rose from 1.43 to the 4.0 cap in 25
    minutes on a day of long prompts; on a conversation day a fleet sized with such a scale
    dropped every cloud replica in one tick and ordered them back within four."""
    fleet = {k: state[k] for k in _FLEET_FIELDS if k in state}
    known = state.get(GPU_KEY)
    gpus = sorted(set(load_units) | (set(known) if type(known) is dict or isinstance(known, Mapping) else set()))
    scales: dict[str, float] = {}
    per: dict[str, dict[str, Any]] = {}
    evidence: list[tuple[str | None, str]] = []
    new_fleet: dict[str, Any] | None = None
    for gpu in gpus:
        fields = _gpu_fields(state, gpu)
        if gpu in load_units:
            scale, ev, new = _learn({**fleet, **fields}, obs, load_units[gpu], cfg, planned_fraction,
                                    None if served_units is None else served_units.get(gpu))
            new_fleet = new
            scale, ev = _few_to_probe(state, cfg, gpu, ready, len(load_units), scale, ev)
            new["scale"] = scale
            evidence.append((gpu, ev))
            per[gpu] = {"scale": new["scale"], "hi": new["hi"], "hi_t": new["hi_t"]}  # _GPU_FIELDS
        else:  # no replica of it ready: nothing to learn about it this tick
            scale, per[gpu] = _idle(fields, obs.now_s, cfg)
        scales[gpu] = scale
    if new_fleet is None:  # no GPU type has evidence: the fleet's clock and pressure still move
        scale, ev, new_fleet = _learn(fleet, obs, None, cfg, planned_fraction)
        evidence.append((None, ev))
    out = {k: v for k, v in new_fleet.items() if k not in _GPU_FIELDS}
    out[GPU_KEY] = per
    return scales, _one_line(evidence), out


def _few_to_probe(state: Mapping[str, Any], cfg: CapacityLearning, gpu: str, ready: Mapping[str, int] | None,
                  serving: int, scale: float, evidence: str) -> tuple[float, str]:
    """(scale, evidence) of ``gpu`` while ``serving`` GPU types have ready replicas: beside others,
    with fewer than PROBE_MIN_REPLICAS of its own ready, no rise above its profile or its estimate
    (see :func:`learn_by_gpu`). ``ready``: ready replicas per GPU type (``None``: not known, no
    hold)."""
    if ready is None or serving < 2 or ready.get(gpu, 0) >= PROBE_MIN_REPLICAS:
        return scale, evidence
    held = max(1.0, learned_scale(state, gpu, cfg))
    if scale <= held:
        return scale, evidence
    return held, evidence + f", too few {gpu} replicas to probe"


def _idle(state: Mapping[str, Any], now_s: float, cfg: CapacityLearning) -> tuple[float, dict[str, Any]]:
    """(scale, per-GPU fields) of a GPU type with no ready replica: what :func:`learn` returns for
    an observation without load (its scale kept, its upper bound forgotten after ``memory_s``),
    without the fleet's fields it would compute only to be dropped."""
    scale = min(max(_num(state, "scale", 1.0), cfg.min_scale), cfg.max_scale)
    hi, hi_t = _num(state, "hi", math.inf), _num(state, "hi_t", -math.inf)
    if now_s - hi_t > cfg.memory_s or math.isinf(hi):
        return scale, {"scale": scale, "hi": None, "hi_t": None}
    return scale, {"scale": scale, "hi": hi, "hi_t": hi_t}


def _one_line(evidence: list[tuple[str | None, str]]) -> str:
    """``H100: calm ...; H200: pressure ...`` from (GPU type, evidence) pairs, or the evidence
    alone where every GPU type saw the same (one GPU type, or several with the same profile) or
    none had any (GPU type ``None``)."""
    if len(evidence) == 1:  # one GPU type: the common case
        return evidence[0][1]
    plain = {ev for _, ev in evidence}
    return plain.pop() if len(plain) == 1 else "; ".join([f"{gpu}: {ev}" for gpu, ev in evidence])


def weighted(caps: Mapping[str, ReplicaCapacity], weights: Mapping[str, float]) -> ReplicaCapacity:
    """The weighted mean of per-GPU-type capacities (by replicas); prefill and decode tokens/s
    average too when every capacity gives them."""
    parts = [(caps[g], w) for g, w in weights.items() if g in caps and w > 0]
    if not parts:
        return next(iter(caps.values()))
    if len(parts) == 1:
        return parts[0][0]
    ws = [w for _, w in parts]
    total = sum(ws)
    out = _mean([c.output_tokens_per_s for c, _ in parts], ws, total)
    req = _mean([c.requests_per_s for c, _ in parts], ws, total)
    assert out is not None and req is not None
    return ReplicaCapacity(out, req, _mean([c.prefill_tokens_per_s for c, _ in parts], ws, total),
                           _mean([c.decode_tokens_per_s for c, _ in parts], ws, total))


def _mean(values: list[float | None], weights: list[float], total: float) -> float | None:
    """The mean of ``values`` weighted by ``weights`` (summing to ``total``); ``None`` if one is."""
    if None in values:
        return None
    return sum(map(operator.mul, values, weights)) / total


def shown(cap: ReplicaCapacity, prior: ReplicaCapacity, evidence: str) -> dict[str, Any]:
    """The values kept next to the learner's state for readers (``/v1/status``, the simulator)."""
    return {"tokens_per_s": cap.output_tokens_per_s, "req_per_s": cap.requests_per_s,
            "profile_tokens_per_s": prior.output_tokens_per_s, "profile_req_per_s": prior.requests_per_s,
            "evidence": evidence}


def capacity_of(decision: Decision) -> tuple[float, float, float] | None:
    """(learned output tok/s per replica, the profile's for the same mix, scale) from a decision's
    history; ``None`` when it carries no capacity."""
    st = decision.history.rule_state.get(STATE_KEY)
    if not st or "tokens_per_s" not in st:
        return None
    return (_num(st, "tokens_per_s", 0.0), _num(st, "profile_tokens_per_s", 0.0),
            _num(st, "scale", 1.0))


def status_line(state: Mapping[str, Any] | None) -> str | None:
    """``capacity 41 output tok/s per replica, learned; profile 69`` from the learner's state."""
    if not state or "tokens_per_s" not in state:
        return None
    scale = _num(state, "scale", 1.0)
    how = "learned" if scale != 1.0 else "profile"
    return (f"capacity {_num(state, 'tokens_per_s', 0.0):.3g} output tok/s per replica, {how}; "
            f"profile {_num(state, 'profile_tokens_per_s', 0.0):.3g}")


def status(decision: Decision | None) -> dict[str, Any] | None:
    """The capacity in force at ``decision``, for ``/v1/status``: values and the one-line text."""
    st = None if decision is None else decision.history.rule_state.get(STATE_KEY)
    text = status_line(st)
    if st is None or text is None:
        return None
    return {"output_tokens_per_s_per_replica": _num(st, "tokens_per_s", 0.0),
            "requests_per_s_per_replica": _num(st, "req_per_s", 0.0),
            "profile_output_tokens_per_s_per_replica": _num(st, "profile_tokens_per_s", 0.0),
            "profile_requests_per_s_per_replica": _num(st, "profile_req_per_s", 0.0), "scale": _num(st, "scale", 1.0),
            "scale_per_gpu_type": gpu_scales(st), "evidence": str(st.get("evidence", "")), "text": text}


def gpu_scales(state: Mapping[str, Any]) -> dict[str, float]:
    """The correction learned per GPU type (empty for a state from before the per-GPU learner)."""
    per = state.get(GPU_KEY)
    if not isinstance(per, Mapping):
        return {}
    return {str(g): _num(v, "scale", 1.0) for g, v in per.items() if isinstance(v, Mapping)}
