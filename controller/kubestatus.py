"""What a ScalingPolicy object and a managed Deployment show in ``kubectl``: status conditions,
Events and their rate limit. Pure: values in, values out; ``providers.kubeobjects`` does the calls.

Conditions follow what HPA and KEDA report (a type, True/False, a CamelCase reason and a message)
and are read off the decision's own trace, so ``kubectl describe scalingpolicy`` and
``/v1/decisions/{id}`` never disagree:

* ``Ready``: the object's spec is valid and in force (``PolicyInForce``); ``InvalidSpec`` names the
  field, and says which earlier version keeps deciding;
* ``Active``: the policy computes a scale from its signals; False while nothing has been observed
  yet, while data is missing and the policy holds, while paused or frozen;
* ``AbleToScale``: the daemon can act on every pool; False while another autoscaler (an HPA, a
  KEDA ScaledObject, another tidegate policy) scales one of the Deployments, or a scale failed;
* ``ScalingLimited``: the result was cut by a limit, and which stage: ``bounds``, ``budget``,
  ``rate limit`` or ``capacity``;
* ``Degraded``: the metrics source is degraded (Prometheus down, values from a fallback) or a
  rule's signals are missing or stale.

Events carry the decision log's reason codes. ``EventCorrelator`` keeps them from storming, as the
kubelet's event correlator does: an event identical to one sent within ``dedupe_window_s`` is
dropped (counted), and each object has a token bucket (``burst`` events, one more every
``refill_s``), so a flapping signal cannot flood the API server or ``kubectl describe``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

from controller.core.model import Decision, ModelSignals
from controller.core.reasons import Reason
from controller.crd import CONDITION_TYPES, Condition, DecisionRef, PolicyStatus, PoolReplicas

LIMIT_STAGES: Mapping[str, str] = {
    Reason.TOO_FEW_REPLICAS.value: "bounds",
    Reason.TOO_MANY_REPLICAS.value: "bounds",
    Reason.BUDGET_CAP_REACHED.value: "budget",
    Reason.COST_PER_TOKEN_CAP_REACHED.value: "budget",
    Reason.SCALE_UP_LIMITED.value: "rate limit",
    Reason.SCALE_DOWN_LIMITED.value: "rate limit",
    Reason.CAPACITY_EXHAUSTED.value: "capacity",
    Reason.BURST_SHORTER_THAN_LEAD_TIME.value: "lead time",
    Reason.CLOUD_RELEASED.value: "lead time",
    Reason.CLOUD_NOT_NEEDED.value: "lead time",
}
"""Reason codes that mean "the result was cut", and the limiting stage each names."""

MISSING_DATA_REASONS = frozenset({Reason.METRIC_MISSING.value, Reason.METRIC_STALE.value,
                                  Reason.HOLD_ON_MISSING_DATA.value, Reason.RULE_ERROR.value})
INACTIVE_REASONS = frozenset({Reason.NOT_OBSERVED_YET.value, Reason.HOLD_ON_MISSING_DATA.value,
                              Reason.PAUSED.value, Reason.OVERRIDE_FREEZE.value, Reason.NO_RULES.value})


@dataclass(frozen=True)
class Refusal:
    """Why the daemon leaves one pool's Deployment alone."""

    pool: str
    namespace: str
    deployment: str
    reason: str
    """``HorizontalPodAutoscalerActive``, ``ScaledObjectActive`` or ``ClaimedByAnotherPolicy``."""
    by: str
    """The other autoscaler: ``HorizontalPodAutoscaler ns/name`` ..."""

    @property
    def message(self) -> str:
        return (f"{self.by} scales Deployment {self.namespace}/{self.deployment} (pool {self.pool}): "
                "tidegate leaves it alone; remove it and set spec.adopt: true to let tidegate scale it")


def _t(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _cond(kind: str, ok: bool, reason: str, message: str) -> tuple[str, str, str, str]:
    return kind, "True" if ok else "False", reason, message[:1000]


def ready_condition(errors: Sequence[str], version: str | None) -> tuple[str, str, str, str]:
    if errors:
        keeps = f"; version {version} keeps deciding" if version else "; no version of this model is in force"
        return _cond("Ready", False, "InvalidSpec", "; ".join(errors) + keeps)
    if version is None:
        return _cond("Ready", False, "NotLoaded", "not loaded yet (the next policy reload reads it)")
    return _cond("Ready", True, "PolicyInForce", f"version {version} is in force")


def _stage_of(decision: Decision, reasons: frozenset[str] | Mapping[str, str]) -> Any:
    for st in decision.trace:
        if st.reason in reasons and st.name != "outcome":
            return st
    return None


def active_condition(decision: Decision) -> tuple[str, str, str, str]:
    inactive = _stage_of(decision, INACTIVE_REASONS)
    if inactive is not None or not decision.actuate:
        st = inactive or decision.trace[-1]
        return _cond("Active", False, st.reason, st.message)
    rec = decision.stage("recommend")
    if rec is not None and rec.replicas is None:  # no rule had an opinion (HPA: FailedGetMetrics)
        return _cond("Active", False, rec.reason, f"no rule could compute replicas: {rec.message}")
    reason = rec.reason if rec else decision.reason
    # no live numbers in the message: a status that changed with every tick's load would be
    # rewritten every tick (the numbers are in the decision log and in the Events)
    return _cond("Active", True, reason, f"the rules compute replicas from their signals ({reason})")


def able_condition(outcome: str, detail: str | None, refusals: Sequence[Refusal]) -> tuple[str, str, str, str]:
    if refusals:
        return _cond("AbleToScale", False, refusals[0].reason, "; ".join(r.message for r in refusals))
    if outcome in ("failed", "partial"):
        return _cond("AbleToScale", False, "FailedRescale", detail or outcome)
    return _cond("AbleToScale", True, "ReadyForNewScale", "every pool can be scaled")


def limited_condition(decision: Decision) -> tuple[str, str, str, str]:
    st = _stage_of(decision, LIMIT_STAGES)
    if st is None:
        return _cond("ScalingLimited", False, "DesiredWithinRange", f"{decision.replicas} replicas: no limit cut it")
    return _cond("ScalingLimited", True, st.reason,
                 f"{LIMIT_STAGES[st.reason]}: held at {st.replicas} replicas by the {st.name} stage")


def degraded_condition(decision: Decision, signals: ModelSignals) -> tuple[str, str, str, str]:
    if signals.degraded:
        return _cond("Degraded", True, "MetricsSourceDegraded", signals.degraded)
    for rec in decision.recommendations:
        if rec.missing_data or rec.reason in MISSING_DATA_REASONS:
            return _cond("Degraded", True, rec.reason, f"rule {rec.rule}: {rec.message}")
    st = _stage_of(decision, MISSING_DATA_REASONS)
    if st is not None:
        return _cond("Degraded", True, st.reason, st.message)
    return _cond("Degraded", False, "SignalsPresent", "every rule had fresh data")


def conditions(new: Sequence[tuple[str, str, str, str]], previous: Sequence[Condition], now: datetime) -> list[Condition]:
    """Conditions in ``CONDITION_TYPES`` order; ``lastTransitionTime`` moves only when a status
    flips (a new reason or message alone keeps it)."""
    before = {c.type: c for c in previous}
    out = []
    by_type = {c[0]: c for c in new}
    for kind in CONDITION_TYPES:
        if kind not in by_type:
            if kind in before:
                out.append(before[kind])
            continue
        _, status, reason, message = by_type[kind]
        old = before.get(kind)
        at = old.lastTransitionTime if old is not None and old.status == status else _t(now)
        out.append(Condition(type=kind, status=status, reason=reason, message=message, lastTransitionTime=at))  # type: ignore[arg-type]
    return out


def _two_significant(value: float | None) -> str | None:
    if value is None:
        return None
    return f"{float(f'{value:.2g}'):g}"


def decided_status(decision: Decision, decision_id: int | None, signals: ModelSignals, outcome: str,
                   detail: str | None, refusals: Sequence[Refusal], errors: Sequence[str], version: str | None,
                   generation: int | None, previous: PolicyStatus | None) -> PolicyStatus:
    """The status of one object of ``decision``'s model after that decision."""
    refused = {r.pool for r in refusals}
    pools = {}
    for name in sorted(set(decision.placement) | set(signals.pools)):
        st = signals.pools.get(name)
        pools[name] = PoolReplicas(desired=decision.placement.get(name), current=st.replicas if st else None,
                                   ready=st.ready_replicas if st else None, managed=name not in refused)
    new = [ready_condition(errors, version), active_condition(decision), able_condition(outcome, detail, refusals),
           limited_condition(decision), degraded_condition(decision, signals)]
    status = PolicyStatus(
        observedGeneration=generation, policyVersion=version, model=decision.model,
        desiredReplicas=decision.replicas, currentReplicas=decision.current_replicas, pools=pools,
        lastDecision=DecisionRef(id=decision_id, time=_t(decision.at), reason=decision.reason),
        costPerHourUSD=f"{decision.cost_per_hour_usd:.2f}",
        costPerMillionTokensUSD=_two_significant(signals.cost_per_million_tokens_usd.value),
        conditions=conditions(new, previous.conditions if previous else (), decision.at),
    )
    if previous is not None and same_but_decision(previous, status):
        return previous
    return status


def error_status(errors: Sequence[str], version: str | None, generation: int | None,
                 previous: PolicyStatus | None, now: datetime) -> PolicyStatus:
    """The status of an object whose spec was refused (or not loaded yet): ``Ready`` says why;
    what the last decision showed stays."""
    base = previous or PolicyStatus()
    conds = conditions([ready_condition(errors, version)], base.conditions, now)
    new = base.model_copy(update={"conditions": conds, "observedGeneration": generation})
    return base if new == base else new


def same_but_decision(a: PolicyStatus, b: PolicyStatus) -> bool:
    """Equal apart from which decision said so: no reason to write."""
    return a.model_copy(update={"lastDecision": None}) == b.model_copy(update={"lastDecision": None})


# --------------------------------------------------------------------------------------------------
# events


@dataclass(frozen=True)
class Event:
    """One Event to create: on ``kind`` ``namespace/name``."""

    kind: str
    """``Deployment`` or ``ScalingPolicy``."""
    namespace: str
    name: str
    reason: str
    message: str
    type: str = "Normal"
    """``Normal`` or ``Warning``."""


def _why(decision: Decision) -> str:
    """The decision's cause in a few words: the message of the stage that set its reason, else the
    recommendation's."""
    for st in decision.trace:
        if st.reason == decision.reason and st.name != "outcome" and st.message:
            return st.message
    rec = decision.stage("recommend")
    return rec.message if rec is not None else decision.reason


def rescale_events(decision: Decision, deployments: Mapping[str, tuple[str, str]],
                   policies: Sequence[tuple[str, str]], failed_pools: Sequence[str]) -> list[Event]:
    """Events for one acted-on decision: per pool whose replicas changed, ``SuccessfulRescale``
    (``FailedRescale`` when its calls failed) on its Deployment; one on each ScalingPolicy object
    of the model. ``deployments``: pool -> (namespace, name)."""
    out: list[Event] = []
    why = _why(decision)
    moves = []
    for pool in sorted(decision.placement):
        before, after = decision.previous_placement.get(pool, 0), decision.placement[pool]
        if before == after or pool not in deployments:
            continue
        ns, name = deployments[pool]
        failed = pool in failed_pools
        reason = "FailedRescale" if failed else "SuccessfulRescale"
        text = f"{before} -> {after} on {pool}: {why}" if not failed else f"{before} -> {after} on {pool} failed"
        out.append(Event("Deployment", ns, name, reason, f"{reason}: {text}", "Warning" if failed else "Normal"))
        moves.append(f"{pool} {before} -> {after}")
    if moves:
        failed = any(p in failed_pools for p in decision.placement)
        reason = "FailedRescale" if failed else "SuccessfulRescale"
        text = (f"{reason}: {decision.current_replicas} -> {decision.replicas} ({', '.join(moves)}): "
                f"{decision.reason}: {why}")
        out += [Event("ScalingPolicy", ns, name, reason, text, "Warning" if failed else "Normal") for ns, name in policies]
    return out


@dataclass
class _Bucket:
    tokens: float
    at: datetime


@dataclass
class EventCorrelator:
    """Drops Events that would storm (see the module docstring). ``admit(event, now)`` says
    whether to send ``event``; ``dropped`` counts the rest, per reason."""

    burst: int = 25
    """Events one object may receive at once (the kubelet's spam filter allows 25)."""
    refill_s: float = 300.0
    """Seconds until an object may receive one more (the kubelet's: one per 5 minutes)."""
    dedupe_window_s: float = 600.0
    """An event identical to one sent this recently (same object, reason, message) is dropped."""
    max_keys: int = 4096
    """Most recent events remembered (oldest forgotten first): memory stays bounded."""
    dropped: dict[str, int] = field(default_factory=dict)
    _recent: "OrderedDict[tuple[str, str, str, str, str], datetime]" = field(default_factory=OrderedDict)
    _buckets: "OrderedDict[tuple[str, str, str], _Bucket]" = field(default_factory=OrderedDict)

    def admit(self, e: Event, now: datetime) -> bool:
        key = (e.kind, e.namespace, e.name, e.reason, e.message)
        seen = self._recent.get(key)
        if seen is not None and (now - seen).total_seconds() < self.dedupe_window_s:
            return self._drop(e)
        obj = (e.kind, e.namespace, e.name)
        b = self._buckets.pop(obj, None) or _Bucket(float(self.burst), now)
        elapsed = max(0.0, (now - b.at).total_seconds())
        b.tokens, b.at = min(float(self.burst), b.tokens + elapsed / self.refill_s), now
        self._remember(self._buckets, obj, b)
        if b.tokens < 1:
            return self._drop(e)
        b.tokens -= 1
        self._recent.pop(key, None)
        self._remember(self._recent, key, now)
        return True

    def _drop(self, e: Event) -> bool:
        self.dropped[e.reason] = self.dropped.get(e.reason, 0) + 1
        return False

    def _remember(self, d: "OrderedDict[Any, Any]", key: Any, value: Any) -> None:
        d[key] = value
        while len(d) > self.max_keys:
            d.popitem(last=False)


__all__ = [
    "EventCorrelator", "Event", "LIMIT_STAGES", "Refusal", "able_condition", "active_condition", "conditions",
    "decided_status", "degraded_condition", "error_status", "limited_condition", "ready_condition",
    "rescale_events", "same_but_decision",
]
