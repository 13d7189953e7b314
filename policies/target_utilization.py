"""``target-utilization``: the Kubernetes HPA algorithm on one signal.

For operators who think in HPA terms: pick one signal and a target per replica; the kind returns
``ceil(ready * current / target)`` unless the ratio is within the tolerance, in which case it keeps
the current replicas (``pkg/controller/podautoscaler/replica_calculator.go``). Like HPA, a
recommendation never goes against the direction the metric points at (a ratio above 1 never
recommends fewer replicas than now, below 1 never more), and missing data is never read as zero.

This module also holds the small helpers the other built-in kinds share (the signal names a rule
may read, the proportional base, a float-safe ceiling), so that they compute the same way.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from controller.core.model import Recommendation
from controller.core.reasons import Reason
from controller.core.signals import model_signal_names, signal
from controller.core.spec import MAX_SIGNAL_VALUE
from policies.base import PolicyContext, PolicyKind, StrictParams

if TYPE_CHECKING:
    SignalName = str
else:
    # The ``ModelSignals`` samples a rule may read, the signal table's (``controller.core.signals``),
    # as a Literal so that the policy schema lists them and a typo is refused.
    SignalName = Literal[model_signal_names()]


def ceil_replicas(x: float) -> int:
    """``ceil`` that ignores float noise (10 * 0.8 / 0.8 must give 10, not 11) with a relative
    margin, so that any positive load still needs at least one replica."""
    if x <= 0:
        return 0
    # a positive load needs a replica even when the division underflowed to a denormal
    return max(1, math.ceil(x - x * 1e-9))


def proportional_base(ctx: PolicyContext) -> int:
    """The replica count proportional math multiplies: the ready replicas (HPA), or, when that is
    unknown or zero, the current desired replicas, at least 1. Conservative both ways: a fleet
    still starting up is not mistaken for an empty one, and a fleet at zero still scales up."""
    if ctx.ready_replicas:
        return ctx.ready_replicas
    return max(ctx.current_replicas, 1)


def scale_from_ratio(ctx: PolicyContext, ratio: float) -> int:
    """HPA's proportional step for a per-replica average at ``ratio = value / target``.

    Scale-up: ``ceil(base * ratio)``, never below the current replicas. Scale-down: replicas
    that are desired but not ready yet are assumed to run at the target (HPA's conservative rule
    for pods without metrics), so a fleet that is still starting up is not cut back because its
    first ready replicas look idle: ``ceil(ready * ratio + (current - ready))``, at most current.
    """
    base = proportional_base(ctx)
    current = ctx.current_replicas
    if ratio > 1:
        return max(current, ceil_replicas(base * ratio))
    pending = max(current - base, 0)
    return min(current, ceil_replicas(base * ratio + pending))


def read_signal(ctx: PolicyContext, name: str) -> tuple[float | None, str, str]:
    """``(value, reason code, message)``: the value when present, finite, fresh and non-negative;
    else ``None`` with ``MetricMissing``/``MetricStale`` and why. Never reads missing as zero."""
    value = ctx.fresh(name)
    if value is None:
        code, message = ctx.missing_reason(name)
        return None, code, message
    if value < 0:
        # A negative rate, depth or percentage is an exporter bug, not a load level.
        return None, Reason.METRIC_MISSING.value, f"{name} is negative ({value:g}): treated as missing"
    return value, "", ""


class TargetUtilization(PolicyKind):
    """HPA on one signal: ``ceil(ready * value / target)`` outside the tolerance band."""

    name = "target-utilization"
    description = "Kubernetes HPA algorithm on one signal, with HPA's tolerance and direction rules."

    class Params(StrictParams):
        signal: SignalName = Field(
            "gpu_utilization_pct",
            description="Which observed signal to track (a ModelSignals sample name).",
        )
        target: float = Field(
            gt=0, le=MAX_SIGNAL_VALUE,
            description="Target value of the signal per replica, in the signal's unit "
                        "(e.g. 70 for gpu_utilization_pct in percent).",
        )
        target_type: Literal["average", "total"] = Field(
            "average",
            description="average: the signal is already a per-replica mean (gpu_utilization_pct, "
                        "p99_latency_ms): desired = ceil(ready x value / target), HPA's Utilization "
                        "target. total: the signal is a sum over replicas (queue_depth, "
                        "request_rate_per_s): desired = ceil(value / target), HPA's AverageValue "
                        "target on an external metric.",
        )
        tolerance: float = Field(
            0.1, ge=0, lt=1,
            description="Dead band around the target, as a fraction: when |value/target - 1| is "
                        "at most this, keep the current replicas (HPA's default 0.1).",
        )

    params: Params

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        p = self.params
        value, code, why = read_signal(ctx, p.signal)
        if value is None:
            return Recommendation(rule=self.rule, kind=self.name, replicas=None, reason=code,
                                  message=why, missing_data=True)
        base = proportional_base(ctx)
        current = ctx.current_replicas
        if p.target_type == "average":
            ratio = value / p.target
            shown = f"{p.signal} {value:g} vs target {p.target:g}"
        else:
            ratio = value / (p.target * base)
            shown = f"{p.signal} {value:g} = {value / base:.3g}/replica over {base} vs target {p.target:g}"
        if abs(ratio - 1.0) <= p.tolerance:
            return Recommendation(
                rule=self.rule, kind=self.name, replicas=current, reason=Reason.WITHIN_TARGETS.value,
                message=f"{shown}: ratio {ratio:.3f} within tolerance {p.tolerance:g}; keep {current}",
            )
        if p.target_type == "average":
            replicas = scale_from_ratio(ctx, ratio)
        else:
            # AverageValue on a total: the pod count does not enter, only the direction rule.
            desired = ceil_replicas(value / p.target)
            replicas = max(current, desired) if ratio > 1 else min(current, desired)
        # HPA: the result never goes against the direction the metric points at.
        reason = signal(p.signal).above_reason if ratio > 1 else Reason.BELOW_TARGETS
        return Recommendation(
            rule=self.rule, kind=self.name, replicas=replicas, reason=reason.value,
            message=f"{shown}: ratio {ratio:.3f} -> {replicas} replicas (from {base} ready)",
        )
