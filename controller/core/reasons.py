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
    SPOT_HEDGE = "SpotHedge"
    """Spare replicas placed away from spot pools with recent interruptions (placement.spot_hedge)."""
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
