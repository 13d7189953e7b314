"""``queue-depth``: KEDA's Prometheus scaler behaviour, without its "no data means zero" default.

For operators coming from KEDA: ``desired = ceil(value / target_per_replica)`` (HPA's AverageValue
on an external metric), and at or below ``activation_threshold`` the scaler is inactive and
recommends 0 (KEDA scales to ``minReplicaCount``; our bounds stage then applies the policy's
``min_replicas``, so scale-to-zero happens only where the policy allows ``min_replicas: 0``).

Difference from KEDA, on purpose: KEDA reads an empty Prometheus result as 0 by default
(``ignoreNullValues``), which scales a fleet to zero when the exporter breaks. Here missing or stale
data is no opinion (``missing_data=True``, so the pipeline holds) unless ``missing_as_zero: true``
says otherwise explicitly.
"""

from __future__ import annotations

from pydantic import Field

from controller.core.model import Recommendation
from controller.core.reasons import Reason
from controller.core.signals import signal
from controller.core.spec import MAX_SIGNAL_VALUE
from policies.base import PolicyContext, PolicyKind, StrictParams
from policies.target_utilization import SignalName, ceil_replicas, read_signal


class QueueDepth(PolicyKind):
    """KEDA-style: ``ceil(value / target_per_replica)``, 0 at or below the activation threshold."""

    name = "queue-depth"
    description = "KEDA Prometheus-scaler behaviour: replicas = ceil(queue / target per replica), with an activation threshold."

    class Params(StrictParams):
        signal: SignalName = Field(
            "queue_depth",
            description="Which observed signal to scale on; a total over replicas (default: "
                        "queue_depth, requests waiting).",
        )
        target_per_replica: float = Field(
            gt=0, le=MAX_SIGNAL_VALUE,
            description="Value of the signal one replica should carry (KEDA's threshold), in the "
                        "signal's unit, e.g. 4 waiting requests per replica.",
        )
        activation_threshold: float = Field(
            0, ge=0, le=MAX_SIGNAL_VALUE,
            description="At or below this value the scaler is inactive and recommends 0 replicas "
                        "(KEDA's activationThreshold); the policy's min_replicas still applies.",
        )
        missing_as_zero: bool = Field(
            False,
            description="Read a missing or stale signal as 0 (KEDA's default). Off by default: "
                        "missing data is no opinion and the pipeline holds.",
        )

    params: Params

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        value, code, why = read_signal(ctx, self.params.signal)
        return self.scale_on(ctx, self.params.signal, value, code, why, signal(self.params.signal).above_reason)

    def scale_on(self, ctx: PolicyContext, what: str, value: float | None, code: str, why: str,
                 above: Reason) -> Recommendation:
        """KEDA's arithmetic on ``value`` (``None``: missing, with ``code`` and ``why``), named
        ``what`` in messages; ``above`` is the reason code when it asks for more replicas."""
        p = self.params
        note = ""
        if value is None:
            if not p.missing_as_zero:
                return Recommendation(rule=self.rule, kind=self.name, replicas=None, reason=code,
                                      message=why, missing_data=True)
            # Explicitly asked for: KEDA's behaviour. Not flagged as missing data, by request.
            value, note = 0.0, f" ({why}; read as 0 because missing_as_zero is set)"
        current = ctx.current_replicas
        if value <= p.activation_threshold:
            return Recommendation(
                rule=self.rule, kind=self.name, replicas=0, reason=Reason.BELOW_TARGETS.value,
                message=f"{what} {value:g} at or below activation threshold "
                        f"{p.activation_threshold:g}: inactive, 0 replicas{note}",
            )
        # active: above a threshold >= 0, so a positive value, which needs a replica even where the
        # division underflows to 0 (5e-324 / 10)
        desired = max(1, ceil_replicas(value / p.target_per_replica))
        if desired > current:
            reason = above
        elif desired == current:
            reason = Reason.WITHIN_TARGETS
        else:
            reason = Reason.BELOW_TARGETS
        return Recommendation(
            rule=self.rule, kind=self.name, replicas=desired, reason=reason.value,
            message=f"{what} {value:g} / {p.target_per_replica:g} per replica -> {desired} "
                    f"replicas (current {current}){note}",
        )
