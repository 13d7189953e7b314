"""The ``ScalingPolicy`` file format: one pydantic schema that validates, documents and emits the
JSON Schema (``tidegate policy schema``).

A policy file configures, for one model, the bounds, the SLO targets, the rules (policy kinds with
their params), the behaviour of the shared safeguards (HPA semantics, seconds), placement
preferences, the budget and what to do when data is missing. Loading files from disk (with line
numbers in errors) lives in ``controller.policyfile``; this module is pure.
"""

from __future__ import annotations

import enum
import threading
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

API_VERSION = "tidegate/v1"

# Upper bounds on the numbers a policy sets (the kinds' params use them too). Far above any real
# fleet or SLO, low enough that a typo (`max_replicas: 1e12`) is an error at load instead of a
# replica count sent to the cluster or a window no history can hold. NaN and infinity are refused
# everywhere (``allow_inf_nan=False``).
MAX_REPLICAS = 10_000
"""Replicas of one model, total across pools (and a rate limit's replicas or percent)."""
MAX_WINDOW_S = 7 * 24 * 3600
"""Any window, delay or period, seconds: one week."""
MAX_LATENCY_MS = 3_600_000
"""Any latency target, milliseconds: one hour."""
MAX_USD = 1_000_000
"""Any cost ceiling, USD (per hour, or per million tokens)."""
MAX_PRIORITY = 1_000_000
"""``spec.priority``, either sign."""
MAX_SIGNAL_VALUE = 1e9
"""A target or threshold in a signal's own unit (waiting requests, tokens per second...)."""
MAX_COUNT = 10_000
MAX_SPOT_HEDGE = 4.0
"""Other counts: spot pools to spread over, interruptions within a window."""

WindowS = Annotated[float, Field(ge=0, le=MAX_WINDOW_S)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Bounds(_Strict):
    min_replicas: int = Field(1, ge=0, le=MAX_REPLICAS, description=f"Fewest replicas (total across pools), at most {MAX_REPLICAS}.")
    max_replicas: int = Field(10, ge=0, le=MAX_REPLICAS, description=f"Most replicas (total across pools), at most {MAX_REPLICAS}; a hard limit overrides cannot exceed.")

    @model_validator(mode="after")
    def _min_le_max(self) -> "Bounds":
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is greater than max_replicas ({self.max_replicas})"
            )
        return self


class SLO(_Strict):
    p99_latency_ms: float | None = Field(None, gt=0, le=MAX_LATENCY_MS, description=f"Target p99 end-to-end request latency, milliseconds (at most {MAX_LATENCY_MS}).")
    ttft_p99_ms: float | None = Field(None, gt=0, le=MAX_LATENCY_MS, description=f"Target p99 time to first token, milliseconds (at most {MAX_LATENCY_MS}; used by the simulator's attainment).")
    tpot_ms: float | None = Field(None, gt=0, le=MAX_LATENCY_MS, description=f"Target time per output token, milliseconds (at most {MAX_LATENCY_MS}; simulator attainment).")
    queue_depth_per_replica: float | None = Field(None, gt=0, le=MAX_SIGNAL_VALUE, description=f"Target waiting requests per ready replica (at most {MAX_SIGNAL_VALUE:.0f}).")


class RuleSpec(_Strict):
    kind: str = Field(description="Policy kind name, e.g. slo-guard, target-utilization, queue-depth, schedule.")
    name: str | None = Field(None, description="Rule name shown in traces; defaults to the kind.")
    params: dict[str, Any] = Field(default_factory=dict, description="Kind-specific parameters, validated by the kind's schema.")


class RateLimitType(str, enum.Enum):
    REPLICAS = "replicas"
    PERCENT = "percent"


class RateLimit(_Strict):
    """HPA ``HPAScalingPolicy``: at most ``value`` replicas (or percent of current) per ``period_s``."""

    type: RateLimitType = Field(description="replicas or percent.")
    value: int = Field(gt=0, le=MAX_REPLICAS, description=f"Replicas, or percent of the replicas at the start of the period (at most {MAX_REPLICAS}).")
    period_s: float = Field(gt=0, le=1800, description="Length of the period, seconds.")


class ScalingRules(_Strict):
    stabilization_s: WindowS = Field(0, description=f"Stabilization window, seconds (at most {MAX_WINDOW_S}): scale-up takes the min, scale-down the max, of the recommendations in the window.")
    policies: tuple[RateLimit, ...] = Field((), description="Rate limits (HPA semantics). Empty: no limit.")
    select: Literal["max", "min", "disabled"] = Field("max", description="Which rate limit applies when several do: the most permissive (max), the strictest (min), or none may scale (disabled).")
    cooldown_s: WindowS = Field(0, description=f"Minimum seconds since the last scaling event in this direction before another (at most {MAX_WINDOW_S}).")


def _default_up() -> ScalingRules:
    # HPA's default scale-up: max(100 % / 15 s, 4 pods / 15 s), no stabilization.
    return ScalingRules(
        stabilization_s=0,
        policies=(RateLimit(type=RateLimitType.PERCENT, value=100, period_s=15),
                  RateLimit(type=RateLimitType.REPLICAS, value=4, period_s=15)),
    )


def _default_down() -> ScalingRules:
    # HPA's default scale-down: 300 s stabilization, 100 % / 15 s.
    return ScalingRules(
        stabilization_s=300,
        policies=(RateLimit(type=RateLimitType.PERCENT, value=100, period_s=15),),
    )


class Behavior(_Strict):
    tolerance: float = Field(0.1, ge=0, lt=1, description="Dead band: a change of the combined recommendation within this fraction of current replicas is ignored.")
    scale_up: ScalingRules = Field(default_factory=_default_up, description="Scale-up rules; default: no stabilization, max(100 %, 4 replicas) per 15 s.")
    scale_down: ScalingRules = Field(default_factory=_default_down, description="Scale-down rules; default: 300 s stabilization, 100 % per 15 s.")


class Placement(_Strict):
    pools: tuple[str, ...] | None = Field(None, description="Pools this policy may use (default: every pool the model has a Deployment in).")
    spot_spread_min_pools: int = Field(2, ge=1, le=MAX_COUNT, description=f"When more than one replica bursts to spot, spread them over at least this many spot pools (when that many are available; at most {MAX_COUNT}).")
    allow_on_demand: bool = Field(True, description="Use on-demand pools as the fallback when on-prem and spot cannot hold the total.")
    max_recent_interruptions: int = Field(3, ge=0, le=MAX_COUNT, description=f"A spot pool with more recent interruptions than this (at most {MAX_COUNT}) is treated as unavailable. Recent: within the provider's window (providers.settings.kubernetes.interruption_window_s, 3600 s by default).")
    spot_hedge: float = Field(0.0, ge=0, le=MAX_SPOT_HEDGE, description=f"Spot hedge (SkyServe's SpotHedge over-provisioning, sized per pool): spare replicas per replica a spot pool's recent interruptions took (interrupted nodes in the provider's window x replicas per node, at most the replicas the pool holds), placed away from the interrupted pools: on-prem room first, then spot pools with no recent interruption (spread), then on-demand, within the budget and max_replicas. A pool never interrupted gets no spare. 0: no hedge; 1: one spare per replica at risk; at most {MAX_SPOT_HEDGE}.")
    fill_paid_nodes: bool = Field(False, description="Fill the free replica slots of on-prem nodes that already hold replicas of the model (a node is billed while it holds any): the extra replicas cost nothing more, serve from the first second of a burst, and are no demand (spares, like the spot hedge's: the rules and safeguards never read them). Within max_replicas; not on pinned or drained pools. false: a node holds what the total asks and no more (its free GPUs stay free for other workloads).")
    warm_spot_at: float | None = Field(None, gt=0, le=1, description="Keep one spot node warm: while the present need (what the rules ask for the load now, without their memory of past peaks) reaches this share (at most 1) of the on-prem pools' replica slots (0.75 of 8 slots: 6 replicas), and for warm_spot_hold_s after, hold one spare replica whenever no spot pool holds any, on the spot pool with the most replicas per node (then the cheapest replica-hour) among the spot_spread_min_pools cheapest, which a scale-up fills first, whose nodes hold more than one replica. A step beyond on-prem then gets replicas on that node's free slots after the model's cold start alone, instead of the pool's provisioning delay plus the cold start (the node is billed whole, so its free slots cost nothing more). The spare is no demand (like the spot hedge's: the rules and safeguards never read it); within max_replicas, the budget and the lead-time cloud ceiling; not on pinned, drained or unavailable pools; none without on-prem pools. null: off.")
    warm_spot_hold_s: WindowS = Field(600, description=f"How long the warm spot node stays after the present need last reached warm_spot_at of the on-prem slots, seconds (at most {MAX_WINDOW_S}): a load that wavers around the threshold keeps one node instead of ordering and releasing it.")
    return_from_fallback: bool = Field(True, description="Dynamic fallback (SkyServe's SpotHedge): while on-demand replicas serve and cheaper pools take replicas again (on-prem room; spot pools that are available, have no interruption notices and no more recent interruptions than max_recent_interruptions, and are not drained or pinned), order replacements there above the total, keep the on-demand replicas serving, and release as many on-demand replicas once the replacements are ready (make before break). Only in steps that empty whole on-demand nodes (dearest first) for less than they cost per hour; the overlap must fit max_cost_per_hour_usd and max_replicas (at max_replicas nothing moves back) and, with lead_time, its cloud ceiling. The replacements are no demand. false: on-demand replicas stay until the demand falls.")


class Budget(_Strict):
    max_cost_per_hour_usd: float | None = Field(None, gt=0, le=MAX_USD, description=f"Hard ceiling on the placement's cost per hour, all pools (on-prem at its static amortized price, or capital plus energy with the daemon's onprem_cost), at most {MAX_USD}.")
    max_cost_per_million_tokens_usd: float | None = Field(None, gt=0, le=MAX_USD, description=f"Ceiling (at most {MAX_USD}) on cost per million output tokens at the observed token rate: limits scale-out, never pushes below min_replicas; ignored while the token rate is unknown or zero.")


class OnMissing(str, enum.Enum):
    HOLD = "hold"
    """Keep current replicas; scale-up from other rules still applies; never scale down."""
    IGNORE = "ignore"
    """Let the other rules decide as if the missing rule had no opinion (may scale down)."""


class MissingData(_Strict):
    on_missing: OnMissing = Field(OnMissing.HOLD, description="What to do when a rule's inputs are missing or stale.")
    max_signal_age_s: float = Field(60, gt=0, le=MAX_WINDOW_S, description=f"Samples older than this count as missing, seconds (at most {MAX_WINDOW_S}).")


REFERENCE_PLANNED_FRACTION = 0.8
"""The share of its capacity a replica is planned at (the rules' default ``capacity_fraction``) for
which ``capacity.pressure_ratio`` and ``capacity.calm_ratio`` are stated; at another planned
fraction both scale with it (``EffectivePolicy.capacity_learning``)."""


class CapacityLearning(_Strict):
    """``spec.capacity``: how the per-replica capacity is corrected online from what ready
    replicas sustain (``controller.core.capacity``)."""

    learn: bool = Field(True, description="Correct the bundle's capacity profile online from the load ready replicas sustain (queue and latency near their targets: at capacity; calm: at least that much). false: use the profile as is.")
    tau_s: float = Field(60, gt=0, le=MAX_WINDOW_S, description="Time constant of the pressure smoothing, seconds (a pressure reading moves the smoothed value 63 % of the way in this time); also the hold-off after replicas become ready, while the signals still show the backlog they drain. Confirmed pressure lowers the learned value at once to the load it was seen at.")
    probe_per_min: float = Field(0, ge=0, le=1, description="While replicas are calm near their planned load and no recent pressure forbids it, raise the learned capacity above the profile by this fraction per minute (a fleet sized by a pessimistic profile never shows that it could carry more; a probe runs replicas up to the SLO's edge to find out, so it is opt-in). 0: the profile is the most a replica is trusted with; a value learned below it still recovers toward it at 15 % a minute.")
    pressure_ratio: float = Field(0.75, gt=0, le=10, description="Pressure (the largest of: queue per ready replica over slo.queue_depth_per_replica, p99 TTFT above its latency floor, or where it is not measured the mean wait, queue over request rate, over wait_fraction x slo.ttft_p99_ms, p99 latency over slo.p99_latency_ms; smoothed over tau_s) at or above this, and not easing, means the replicas are at capacity. Stated for rules planning replicas at 0.8 of their capacity (capacity_fraction); at another fraction it scales with it (0.5: x0.625), so that capacity_fraction moves the fleet while the probe raises the estimate.")
    calm_ratio: float = Field(0.5, ge=0, le=10, description="Pressure at or below this means the replicas carry their load with room. Scales with the rules' capacity_fraction as pressure_ratio does.")
    wait_fraction: float = Field(0.1, gt=0, le=1, description="The mean wait that counts as at the SLO, as a fraction of slo.ttft_p99_ms (a p99 is several times the mean of a queueing wait).")
    burst_share: float = Field(0.75, ge=0, le=10, description="Pressure counts as evidence only while the load per ready replica is at least this share of its planned load (capacity x capacity_fraction); below, it is a burst inside the rate window, not a measure of capacity.")
    mix_tau_s: float = Field(300, gt=0, le=MAX_WINDOW_S, description="Time constant, seconds, over which the observed token mix (prompt and output tokens per request) is averaged before the capacity is computed for it.")
    memory_s: float = Field(1800, ge=0, le=MAX_WINDOW_S, description="How long the load at which pressure was last seen bounds the upward probing, seconds.")
    min_scale: float = Field(0.25, gt=0, le=1, description="The learned capacity never goes below this multiple of the profile's.")
    max_scale: float = Field(4.0, ge=1, le=100, description="The learned capacity never goes above this multiple of the profile's.")


class LeadTime(_Strict):
    """``spec.lead_time``: lead-time economics (``controller.core.leadtime``). A cloud replica
    serves one lead time (provisioning delay + cold start) after it is ordered: order it only for
    demand expected at its ready time, release it first."""

    enabled: bool = Field(False, description="Buy cloud (spot, on-demand) replicas only when the burst is expected to outlast the cloud lead time (pool provisioning_delay_s + the model's cold_start_s), the load rises steadily, the SLO is missed now with the need beyond on-prem, or a burst is expected from the past gaps between bursts; serve other bursts from on-prem, and release cloud replicas on their own short window. false (the default: on the benchmark it cut cost but lost SLO attainment where a ramp or a recurring burst came without warning; README, 'Lead-time economics'): the total is placed as is, cloud and on-prem alike.")
    cloud_scale_down_s: WindowS = Field(60, description=f"Cloud replicas bought for a burst go once the present need (without memory of past peaks) has fit on the on-prem pools for this long, seconds (at most {MAX_WINDOW_S}); not-ready ones are cancelled first. On-prem keeps behavior.scale_down and the rules' memory. Also the dip that does not end a burst. Read with lead-time economics off too: replicas the scale-down window holds above the most the rules asked within this long are not bought again in the cloud when lost, and those of them on on-demand orders not ready yet are cancelled, whole nodes only (reason HeldNotReplaced).")
    min_survival: float = Field(0.3, ge=0, le=1, description="Order cloud replicas for a burst when the estimated probability that it still runs one lead time from now is at least this (from the durations of past bursts, with the burst's age as the prior: a burst is expected to last as long again; 0.3 orders a first burst once it is 3/7 of a lead time old, 0.5 once it is one lead time old).")
    burst_history: int = Field(16, ge=0, le=MAX_COUNT, description=f"Durations of past bursts remembered for that estimate (at most {MAX_COUNT}).")


class Mode(str, enum.Enum):
    """Whether tidegate scales a model or only shadows what scales it."""

    ACTIVE = "active"
    SHADOW = "shadow"


class PolicySpec(_Strict):
    model: str = Field(description="The model (bundle name in the daemon config) this policy scales.")
    priority: int = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY, description=f"When several files set behaviour for one model, the highest priority wins (ties are an error); within +-{MAX_PRIORITY}.")
    bounds: Bounds = Field(default_factory=Bounds, description="Replica bounds, total across pools.")
    slo: SLO = Field(default_factory=SLO, description="SLO targets the rules aim at.")
    rules: tuple[RuleSpec, ...] = Field(default=(RuleSpec(kind="slo-guard"),), min_length=1, description="Policy kinds and their params; the max of their recommendations wins.")
    behavior: Behavior = Field(default_factory=Behavior, description="Shared safeguards (HPA semantics): tolerance, stabilization, rate limits, cooldowns.")
    placement: Placement = Field(default_factory=Placement, description="How the total is spread over pools.")
    budget: Budget = Field(default_factory=Budget, description="Cost ceilings, never exceeded.")
    missing_data: MissingData = Field(default_factory=MissingData, description="Behaviour when signals are missing or stale.")
    capacity: CapacityLearning = Field(default_factory=CapacityLearning, description="Online correction of the per-replica capacity (learned capacity).")
    lead_time: LeadTime = Field(default_factory=LeadTime, description="Lead-time economics: cloud replicas only for demand expected at their ready time, released on their own short window.")


    mode: Mode = Field(Mode.ACTIVE, description="active: tidegate scales the model. shadow: it observes the model's Deployments while something else scales them (an HPA, KEDA, a person), decides as if in charge of a fleet of its own, never acts, and records both; `tidegate report --shadow` compares them.")
    adopt: bool = Field(False, description="Take over Deployments that a HorizontalPodAutoscaler, a KEDA ScaledObject or another tidegate policy also scales. Off: while the daemon watches for them (providers.settings.kubernetes_objects.enabled) such a pool is left alone (AbleToScale=False). Remove the other autoscaler first; with both acting they fight over the replica count.")

    @field_validator("rules")
    @classmethod
    def _unique_rule_names(cls, rules: tuple[RuleSpec, ...]) -> tuple[RuleSpec, ...]:
        seen: set[str] = set()
        for r in rules:
            n = r.name or r.kind
            if n.startswith("@"):
                raise ValueError(f"rule name {n!r} starts with '@', which is reserved for tidegate's own state; rename it")
            if n in seen:
                raise ValueError(f"rule name {n!r} appears twice; give each rule a distinct name")
            seen.add(n)
        return rules


class Metadata(_Strict):
    name: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="DNS-1123 style name, unique across policy files.")
    labels: dict[str, str] = Field(default_factory=dict, description="Free-form labels.")


class ScalingPolicy(_Strict):
    """One YAML document: ``apiVersion: tidegate/v1``, ``kind: ScalingPolicy``."""

    apiVersion: Literal["tidegate/v1"] = Field(description="Format version.")
    kind: Literal["ScalingPolicy"] = Field(description="Document kind.")
    metadata: Metadata = Field(description="Name and labels.")
    spec: PolicySpec = Field(description="The policy.")


_INTERNED_MAX = 4096
"""Distinct sub-models :func:`interned` remembers before it starts afresh (a bound, not a size
anyone should reach: a fleet's policies share a few shapes)."""

_interned: dict[Any, BaseModel] = {}
_canonical: set[int] = set()
"""``id()`` of the models in ``_interned`` (which keeps them alive, so the ids stay theirs)."""
_interning = threading.Lock()
"""Policies load on the watcher's thread and the API's: the table and its ids change together."""


def interned(model: Any) -> Any:
    """``model`` (a frozen pydantic model) with each nested model replaced by an equal one seen
    before, so a thousand policies written from one template hold their bounds, behaviour,
    rule params and defaults once, not a thousand times (issue 13's memory at 1,000 models).
    Equal means the same type, the same fields written (``model_fields_set``) and the same
    values, compared by type too (``1`` is not ``1.0`` nor ``True``); a model holding a value with
    no such key (a dict of rule params) is kept as it is, its nested models still shared. No value
    changes."""
    with _interning:
        return _intern(model)


def _intern(model: Any) -> Any:
    if not isinstance(model, BaseModel) or not model.model_config.get("frozen"):
        return model
    changed: dict[str, Any] = {}
    # which fields the author wrote is part of a model (policy files merge by it), so it is part
    # of the key, and a copy keeps it (model_copy(update=...) would count the updated ones as set)
    fields_set = frozenset(model.model_fields_set)
    key: list[Any] = [type(model), fields_set]
    values: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        new = _interned_value(value)
        if new is not value:
            changed[name] = new
        values[name] = new
        key.append(_key(new))
    out = type(model).model_construct(_fields_set=set(fields_set), **values) if changed else model
    if any(k is None for k in key):
        return out
    frozen_key = tuple(key)
    found = _interned.get(frozen_key)
    if found is not None:
        return found
    if len(_interned) >= _INTERNED_MAX:
        _interned.clear()
        _canonical.clear()
    _interned[frozen_key] = out
    _canonical.add(id(out))
    return out


def _interned_value(value: Any) -> Any:
    """``value`` with the models in it interned: itself when none changed (so interning twice
    makes no new object), else a new tuple, list or dict of the same items."""
    if isinstance(value, BaseModel):
        return _intern(value)
    if type(value) in (tuple, list):
        items = [_interned_value(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    if type(value) is dict:
        new = {k: _interned_value(v) for k, v in value.items()}
        return value if all(new[k] is v for k, v in value.items()) else new
    return value


def _key(value: Any) -> Any:
    """A hashable key equal only for equal values of the same types (``None``: none)."""
    if isinstance(value, BaseModel):
        return ("model", id(value)) if id(value) in _canonical else None
    if isinstance(value, tuple):
        parts = tuple(_key(v) for v in value)
        return None if any(p is None for p in parts) else ("tuple", parts)
    if value is None or isinstance(value, (str, int, float, enum.Enum)):
        return (type(value), value)
    return None
