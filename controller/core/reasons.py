"""Reason codes carried by every pipeline stage (HPA-style conditions).

A code is a stable CamelCase identifier that operators grep for, alert on and see in
``/v1/decisions/{id}``; the message beside it in a ``Stage`` says the numbers.
"""

from __future__ import annotations

import enum


class Reason(str, enum.Enum):
    # recommendations
    NO_RULES = "NoRules"
    METRIC_MISSING = "MetricMissing"
    METRIC_STALE = "MetricStale"
    LATENCY_ABOVE_TARGET = "LatencyAboveTarget"
    QUEUE_ABOVE_TARGET = "QueueAboveTarget"
    UTILIZATION_ABOVE_TARGET = "UtilizationAboveTarget"
    THROUGHPUT_ABOVE_CAPACITY = "ThroughputAboveCapacity"
    QUERY_ABOVE_TARGET = "QueryAboveTarget"
    """A promql rule's expression is above its target per replica."""
    WITHIN_TARGETS = "WithinTargets"
    BELOW_TARGETS = "BelowTargets"
    SCHEDULE_WINDOW = "ScheduleWindow"
    OUTSIDE_SCHEDULE = "OutsideSchedule"
    RULE_ERROR = "RuleError"
    """A rule raised or returned something invalid: no opinion, treated as missing data."""
    # combine / tolerance / missing-data guard
    MAX_OF_RECOMMENDATIONS = "MaxOfRecommendations"
    WITHIN_TOLERANCE = "WithinTolerance"
    HOLD_ON_MISSING_DATA = "HoldOnMissingData"
    # stabilization / rate limits / cooldowns
    SCALE_UP_STABILIZED = "ScaleUpStabilized"
    SCALE_DOWN_STABILIZED = "ScaleDownStabilized"
    SCALE_UP_LIMITED = "ScaleUpLimited"
    SCALE_DOWN_LIMITED = "ScaleDownLimited"
    SCALE_UP_COOLDOWN = "ScaleUpCooldown"
    SCALE_DOWN_COOLDOWN = "ScaleDownCooldown"
    # bounds / overrides
    TOO_FEW_REPLICAS = "TooFewReplicas"
    TOO_MANY_REPLICAS = "TooManyReplicas"
    SCHEDULE_FLOOR = "ScheduleFloor"
    OVERRIDE_PIN = "OverridePin"
    OVERRIDE_BOUNDS = "OverrideBounds"
    OVERRIDE_FREEZE = "OverrideFreeze"
    OVERRIDE_DRAIN = "OverrideDrain"
    PAUSED = "Paused"
    NOT_OBSERVED_YET = "NotObservedYet"
    # placement / budget
    PLACED = "Placed"
    CAPACITY_EXHAUSTED = "CapacityExhausted"
    SPOT_POOL_UNAVAILABLE = "SpotPoolUnavailable"
    POOL_UNAVAILABLE = "PoolUnavailable"
    SPOT_INTERRUPTED = "SpotInterrupted"
    ON_DEMAND_FALLBACK = "OnDemandFallback"
    HELD_NOT_REPLACED = "HeldNotReplaced"
    """Replicas only the scale-down memory holds (stabilization window, rate limit: above what the
    rules ask now) that no pool kept (interrupted, on an unavailable pool) are not bought again in
    the cloud, whose orders serve after the window lets them go; on-prem room still takes them.
    Those of them on on-demand orders still starting are cancelled, whole nodes only."""
    SPOT_HEDGE = "SpotHedge"
    """Spare replicas placed away from spot pools with recent interruptions (placement.spot_hedge)."""
    FALLBACK_RETURN = "FallbackReturn"
    """Dynamic fallback (placement.return_from_fallback): replacements ordered on cheaper pools for
    on-demand replicas, above the total, or on-demand replicas released once their replacements
    serve."""
    BUDGET_CAP_REACHED = "BudgetCapReached"
    COST_PER_TOKEN_CAP_REACHED = "CostPerTokenCapReached"
    WITHIN_BUDGET = "WithinBudget"
    # lead-time economics (controller.core.leadtime)
    BURST_SHORTER_THAN_LEAD_TIME = "BurstShorterThanLeadTime"
    """The burst is not expected to outlast the cloud lead time: served from on-prem, no cloud ordered."""
    CLOUD_RELEASED = "CloudReleased"
    """The present need has fit on-prem for spec.lead_time.cloud_scale_down_s: cloud replicas go
    (not-ready ones first)."""
    CLOUD_NOT_NEEDED = "CloudNotNeeded"
    """The total beyond on-prem is memory of past peaks or an unsteady trend: kept on-prem only."""
    # outcome
    SCALED = "Scaled"
    UNCHANGED = "Unchanged"


# The codes the hot path reads, as plain strings (``controller.core.pipeline`` and ``placement``
# import them): an enum member's ``.value`` is a Python-level property call, and a decision reads
# a dozen.
PLACED = Reason.PLACED.value
BUDGET_CAP_REACHED = Reason.BUDGET_CAP_REACHED.value
WITHIN_BUDGET = Reason.WITHIN_BUDGET.value
SCALED = Reason.SCALED.value
UNCHANGED = Reason.UNCHANGED.value
TOO_FEW_REPLICAS = Reason.TOO_FEW_REPLICAS.value
TOO_MANY_REPLICAS = Reason.TOO_MANY_REPLICAS.value
OVERRIDE_BOUNDS = Reason.OVERRIDE_BOUNDS.value
CAPACITY_EXHAUSTED = Reason.CAPACITY_EXHAUSTED.value
OVERRIDE_DRAIN = Reason.OVERRIDE_DRAIN.value
SPOT_INTERRUPTED = Reason.SPOT_INTERRUPTED.value
SPOT_POOL_UNAVAILABLE = Reason.SPOT_POOL_UNAVAILABLE.value
POOL_UNAVAILABLE = Reason.POOL_UNAVAILABLE.value
ON_DEMAND_FALLBACK = Reason.ON_DEMAND_FALLBACK.value
HELD_NOT_REPLACED = Reason.HELD_NOT_REPLACED.value
SPOT_HEDGE = Reason.SPOT_HEDGE.value
FALLBACK_RETURN = Reason.FALLBACK_RETURN.value
