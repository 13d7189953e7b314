"""``promql``: scale on any PromQL expression, with a target per replica (KEDA's Prometheus scaler).

For operators coming from KEDA, and for ``tidegate import keda``: a ScaledObject's Prometheus
trigger keeps its query. ``desired = ceil(value / target_per_replica)``, 0 at or below
``activation_threshold`` (the policy's ``min_replicas`` still applies), exactly as ``queue-depth``
computes it on a signal of the table; the difference is where the value comes from. The metrics
source (``providers.prometheus``) is told each rule's expression before the tick
(``controller.protocols.EvaluatesQueries``) and evaluates it once per tick as written; it must
return one series (aggregate it, e.g. ``sum(...)``).

Missing data follows the same rules as every other rule: an error, an empty result, several
series, NaN, a negative value or a sample older than ``missing_data.max_signal_age_s`` is no
opinion (``missing_data=True``: with ``on_missing: hold`` nothing scales down), unless
``missing_as_zero: true`` asks for KEDA's reading of it as 0.
"""

from __future__ import annotations

from pydantic import Field

from controller.core.model import Recommendation
from controller.core.reasons import Reason
from controller.core.spec import MAX_SIGNAL_VALUE
from policies.base import PolicyContext, StrictParams
from policies.queue_depth import QueueDepth

MAX_QUERY_CHARS = 4000
"""Longest expression accepted (a typo pasting a whole file is an error at load)."""


class PromQL(QueueDepth):
    """KEDA's Prometheus scaler on the rule's own PromQL expression."""

    name = "promql"
    description = "Any PromQL expression with a target per replica: replicas = ceil(value / target), KEDA's Prometheus scaler."

    class Params(StrictParams):  # type: ignore[assignment]  # queue-depth's, with a query instead of a signal
        query: str = Field(
            min_length=1, max_length=MAX_QUERY_CHARS,
            description="PromQL expression returning one series (aggregate it, e.g. sum(...)), evaluated once per "
                        "tick as written by the Prometheus source.",
        )
        target_per_replica: float = Field(
            gt=0, le=MAX_SIGNAL_VALUE,
            description="Value of the expression one replica should carry (KEDA's threshold), in the "
                        "expression's unit.",
        )
        activation_threshold: float = Field(
            0, ge=0, le=MAX_SIGNAL_VALUE,
            description="At or below this value the rule is inactive and recommends 0 replicas "
                        "(KEDA's activationThreshold); the policy's min_replicas still applies.",
        )
        missing_as_zero: bool = Field(
            False,
            description="Read a missing, stale or negative value as 0 (KEDA's ignoreNullValues default). Off by "
                        "default: missing data is no opinion and the pipeline holds.",
        )

    params: Params  # type: ignore[assignment]

    def queries(self) -> tuple[str, ...]:
        return (self.params.query,)

    def recommend(self, ctx: PolicyContext) -> Recommendation:
        label = f"query {self.rule!r}"
        sample = ctx.signals.query(self.params.query)
        value = sample.fresh(ctx.now, ctx.max_signal_age_s)
        code = why = ""
        if value is None:
            code, why = ctx.why_missing(label, sample)
        elif value < 0:
            value, code, why = None, Reason.METRIC_MISSING.value, f"{label} is negative ({value:g}): treated as missing"
        return self.scale_on(ctx, label, value, code, why, Reason.QUERY_ABOVE_TARGET)
