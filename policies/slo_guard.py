"""``slo-guard`` (the default kind): size the fleet to the SLO from every signal at once.

It is the HPA "max over metrics" recipe applied to four LLM-serving signals, split in two families:

* **Pressure signals** say the SLO is in danger but not how big the fleet should be when it is not:
  - *latency*: p99 latency ``L`` vs target ``T`` (``params.p99_latency_ms``, else the policy's
    ``slo.p99_latency_ms``);
  - *queue*: requests waiting ``W`` per replica vs target ``q`` (``params.queue_depth_per_replica``,
    else ``slo.queue_depth_per_replica``).

  Above target they scale up proportionally in one step (``ceil(base * L / T)``; for the queue
  ``ceil(W / q)``, i.e. ``ceil(base * (W / base) / q)``: the replicas over which the waiting
  requests, spread evenly, meet the per-replica target; HPA's AverageValue formula. It ignores the
  requests already being served on purpose: that load is sized by the utilization and throughput
  signals, and the queue only answers "is there more work than the current replicas take in").
  Between ``scale_down_below_ratio x target`` and the target they hold the current replicas (they
  veto a scale-down). Well below that they raise no objection and leave sizing to the others.

* **Load signals** size the fleet in both directions:
  - *utilization*: HPA's ``ceil(base * gpu_util / target_pct)`` (on the way down, replicas not
    ready yet count as running at the target, as HPA counts pods without metrics);
  - *throughput*: ``ceil(output_tokens_per_s / (capacity.output_tokens_per_s * capacity_fraction))``
    and the same for requests per second, from the bundle's per-replica capacity at the SLO.

The recommendation is the max over the opinions; its reason is the winning signal's
(``LatencyAboveTarget``, ``QueueAboveTarget``, ``UtilizationAboveTarget``,
``ThroughputAboveCapacity``), else ``WithinTargets`` / ``BelowTargets``. A signal above its target
never recommends fewer than the current replicas (HPA's rule against reversing direction, e.g.
while new replicas are still starting).

``base`` is the ready replicas, or, when unknown or 0, the current replicas, at least 1.

Missing or stale inputs: that signal has no opinion and the recommendation is flagged
``missing_data`` (so the pipeline refuses to release capacity); when every configured signal is
missing there is no recommendation at all. Signals that an installation does not export can be
listed in ``ignore`` so that their absence does not hold scale-down forever.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from controller.core.model import Recommendation
from controller.core.reasons import Reason
from controller.core.signals import signal
from controller.core.spec import MAX_LATENCY_MS, MAX_SIGNAL_VALUE
from policies.base import PolicyContext, PolicyKind, StrictParams
from policies.target_utilization import (
    ceil_replicas,
    proportional_base,
    read_signal,
    scale_from_ratio,
)

SubSignal = Literal["latency", "queue", "utilization", "output_tokens", "requests"]


@dataclass(frozen=True, slots=True)
class _Opinion:
    signal: str
    replicas: int | None
    """``None``: well below target, no objection to any size."""
    above: bool
    reason: Reason
    message: str


def _undefined_while_idle(ctx: PolicyContext, name: str) -> bool:
    """True when signal ``name`` is undefined while idle (the signal table says which: a latency
    over no request) and is absent because there was no traffic: the source says so
    (``NoRequests``) or the request rate is a fresh zero."""
    if not signal(name).undefined_when_idle:
        return False
    reason = ctx.signals.sample(name).reason or ""
    rate = ctx.fresh("request_rate_per_s")
    return reason.startswith("NoRequests") or rate == 0


class SloGuard(PolicyKind):
    """Max of latency, queue, utilization and throughput recommendations."""

    name = "slo-guard"
    description = ("Default: max over p99 latency, queue per replica, GPU utilization and "
                   "token/request throughput vs capacity; scale-down only when all agree.")

    class Params(StrictParams):
        p99_latency_ms: float | None = Field(
            None, gt=0, le=MAX_LATENCY_MS,
            description="Target p99 latency, milliseconds; overrides the policy's "
                        "slo.p99_latency_ms. Unset in both: the latency signal is off.",
        )
        queue_depth_per_replica: float | None = Field(
            None, gt=0, le=MAX_SIGNAL_VALUE,
            description="Target waiting requests per ready replica; overrides the policy's "
                        "slo.queue_depth_per_replica. Unset in both: the queue signal is off.",
        )
        gpu_utilization_target_pct: float | None = Field(
            None, gt=0, le=100,
            description="Target mean GPU utilization, percent (HPA-style proportional sizing); "
                        "null (the default) leaves the signal off: DCGM's GPU_UTIL is the share of "
                        "time a kernel ran, near 100 % whenever a continuously batching replica "
                        "holds any request, so it says little about spare capacity. Set it where "
                        "the utilization signal is a real load measure.",
        )
        capacity_fraction: float = Field(
            0.8, gt=0, le=1,
            description="Plan replicas to run at this fraction of their sustainable throughput at "
                        "the SLO (the model's capacity profile): 0.8 keeps 20 % headroom.",
        )
        scale_down_below_ratio: float = Field(
            0.5, gt=0, le=1,
            description="Latency and queue allow a scale-down only below this fraction of their "
                        "targets; between it and the target they hold the current replicas.",
        )
        ignore: tuple[SubSignal, ...] = Field(
            (),
            description="Sub-signals to leave out (latency, queue, utilization, output_tokens, "
                        "requests), e.g. ones the installation does not export, so that their "
                        "absence does not flag missing data.",
        )

    params: Params

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        p = self.params
        base = proportional_base(ctx)
        current = ctx.current_replicas
        opinions: list[_Opinion] = []
        missing: list[tuple[str, str]] = []
        configured = 0

        def pressure(sub: str, signal_name: str, target: float | None, unit: str) -> None:
            nonlocal configured
            if target is None or sub in p.ignore:
                return
            configured += 1
            value, code, why = read_signal(ctx, signal_name)
            if value is None:
                if _undefined_while_idle(ctx, signal_name):
                    # No request completed because none arrived: an idle model has no latency to
                    # guard, and reading that as missing data would hold an idle fleet forever.
                    return
                missing.append((code, why))
                return
            if sub == "queue":
                per_replica = value / base
                ratio = per_replica / target
                shown = f"queue {value:g} = {per_replica:.3g}/replica over {base} vs target {target:g}"
            else:
                ratio = value / target
                shown = f"p99 {value:g}{unit} vs target {target:g}{unit}"
            above_reason = signal(signal_name).above_reason
            if ratio > 1:
                desired = ceil_replicas(base * ratio)
                replicas = max(current, desired)
                opinions.append(_Opinion(sub, replicas, True, above_reason,
                                         f"{shown} -> ceil({base} x {ratio:.3f}) = {desired}"))
            elif ratio >= p.scale_down_below_ratio:
                # Close to the target: shrinking now would push it over; hold.
                opinions.append(_Opinion(sub, current, False, Reason.WITHIN_TARGETS,
                                         f"{shown} -> hold {current}"))
            else:
                opinions.append(_Opinion(sub, None, False, Reason.BELOW_TARGETS,
                                         f"{shown} (< {p.scale_down_below_ratio:g} x target) -> "
                                         "no objection to scale-down"))

        def load(sub: str, signal_name: str, per_replica: float | None, shown_unit: str) -> None:
            nonlocal configured
            if per_replica is None or sub in p.ignore:
                return
            configured += 1
            value, code, why = read_signal(ctx, signal_name)
            if value is None:
                missing.append((code, why))
                return
            reason = signal(signal_name).above_reason
            if sub == "utilization":
                ratio = value / per_replica
                replicas = scale_from_ratio(ctx, ratio)
                above = ratio > 1
                shown = (f"gpu util {value:g}% vs target {per_replica:g}% over {base} ready "
                         f"-> {replicas}")
            else:
                planned = per_replica * p.capacity_fraction
                desired = ceil_replicas(value / planned)
                if value > 0:
                    desired = max(desired, 1)  # any served load needs a replica (no underflow to 0)
                above = desired > current
                replicas = desired
                shown = (f"{sub} {value:g}{shown_unit} / ({per_replica:g} x {p.capacity_fraction:g} "
                         f"per replica) = {desired}")
            opinions.append(_Opinion(sub, replicas, above, reason, shown))

        slo_latency = p.p99_latency_ms if p.p99_latency_ms is not None else ctx.slo.p99_latency_ms
        slo_queue = (p.queue_depth_per_replica if p.queue_depth_per_replica is not None
                     else ctx.slo.queue_depth_per_replica)
        cap = ctx.capacity
        pressure("latency", "p99_latency_ms", slo_latency, "ms")
        pressure("queue", "queue_depth", slo_queue, "")
        load("utilization", "gpu_utilization_pct", p.gpu_utilization_target_pct, "%")
        load("output_tokens", "output_tokens_per_s", cap.output_tokens_per_s if cap else None, " tok/s")
        load("requests", "request_rate_per_s", cap.requests_per_s if cap else None, " req/s")

        missing_text = "; ".join(why for _, why in missing)
        if configured == 0:
            # Nothing to judge by (no SLO, no capacity, utilization off): hold, conservatively.
            return Recommendation(
                rule=self.rule, kind=self.name, replicas=None, reason=Reason.METRIC_MISSING.value,
                message="no signal configured: set slo.p99_latency_ms, slo.queue_depth_per_replica, "
                        "gpu_utilization_target_pct or a capacity profile",
                missing_data=True,
            )
        if not opinions:
            return Recommendation(
                rule=self.rule, kind=self.name, replicas=None, reason=missing[0][0],
                message=f"every signal is missing or stale: {missing_text}", missing_data=True,
            )
        parts = [o.message for o in opinions]
        if missing:
            parts.append(f"no opinion: {missing_text}")
        sizing = [o for o in opinions if o.replicas is not None]
        if not sizing:
            # Latency and queue are well below target but no load signal says how far to shrink.
            return Recommendation(
                rule=self.rule, kind=self.name, replicas=current, reason=Reason.BELOW_TARGETS.value,
                message="; ".join(parts) + f"; no load signal to size a scale-down: hold {current}",
                missing_data=bool(missing),
            )
        # Max replicas wins; on a tie an above-target opinion names the reason.
        best = max(sizing, key=lambda o: (o.replicas, o.above))
        replicas = best.replicas
        assert replicas is not None
        if best.above:
            reason = best.reason
        elif replicas < current:
            reason = Reason.BELOW_TARGETS
        else:
            reason = Reason.WITHIN_TARGETS
        return Recommendation(
            rule=self.rule, kind=self.name, replicas=replicas, reason=reason.value,
            message=f"{best.signal} decides {replicas} (current {current}): " + "; ".join(parts),
            missing_data=bool(missing),
        )
