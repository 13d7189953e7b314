"""The policy interface: kinds defined in Python, instances configured in YAML.

A *policy kind* is a class with a name, a pydantic ``Params`` model (``extra="forbid"``, a
description on every field) and a pure ``recommend(ctx)`` that returns a ``Recommendation``:
replicas (or ``None`` = no opinion), a reason code, a message, and explicit state that comes back
to it in ``ctx.state`` on the next tick. Kinds never see the clock, the database or a provider: all
they know arrives in the ``PolicyContext``.

The shared safeguards (tolerance, stabilization, rate limits, cooldowns, bounds, overrides,
placement, budgets) are applied around every kind by ``controller.core.pipeline``; kinds do not
re-implement them.

Kinds are found through the ``tidegate.policies`` entry point group (the built-ins too) and kept in
a ``Registry`` value that is passed to whoever needs it; there is no global registry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Iterable, Mapping

from pydantic import BaseModel, ConfigDict

from controller.core.capacity import offered_tokens
from controller.core.model import ModelSignals, ModelSpec, Recommendation, ReplicaCapacity, Sample, fast_init
from controller.core.reasons import Reason
from controller.errors import UnknownPolicyKind  # re-exported: raised here
from controller.plugins import entry_point_kinds

ENTRY_POINT_GROUP = "tidegate.policies"


class StrictParams(BaseModel):
    """Base for every kind's ``Params``: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


@dataclass(frozen=True, slots=True)
class SLOTargets:
    """The SLO the policy file states for the model (all optional)."""

    p99_latency_ms: float | None = None
    queue_depth_per_replica: float | None = None
    ttft_p99_ms: float | None = None


COMPLETIONS, ARRIVALS = "request_rate_per_s", "arrival_rate_per_s"
OFFERED = frozenset({COMPLETIONS, "output_tokens_per_s"})
"""The served-rate signals :meth:`PolicyContext.offered` turns into the load offered."""


@fast_init
@dataclass(frozen=True, slots=True)
class PolicyContext:
    """Everything a kind may look at, as values."""

    model: ModelSpec
    signals: ModelSignals
    now: datetime
    current_replicas: int
    """Total desired replicas across pools before this tick."""
    ready_replicas: int | None
    """Replicas serving now (``None``: unknown)."""
    capacity: ReplicaCapacity | None
    """Per-replica capacity at the SLO for the current pool mix (replica-weighted mean over GPU
    types); ``None`` if the bundle declares none."""
    slo: SLOTargets = SLOTargets()
    max_signal_age_s: float = 60.0
    """Samples older than this are treated as missing."""
    state: Mapping[str, Any] = field(default_factory=dict)
    """What this rule returned as state on its previous tick (empty on the first)."""

    def fresh(self, name: str) -> float | None:
        """A signal's value if present, finite and fresh enough, else ``None``."""
        sample = self.signals.sample(name)
        return sample.fresh(self.now, self.max_signal_age_s)

    def missing_reason(self, name: str) -> tuple[str, str]:
        """(``MetricMissing`` or ``MetricStale``, message) for a signal ``fresh`` refused."""
        return self.why_missing(name, self.signals.sample(name))

    def why_missing(self, name: str, sample: Sample) -> tuple[str, str]:
        """(``MetricMissing`` or ``MetricStale``, message) for a refused sample named ``name``."""
        if sample.value is None or not math.isfinite(sample.value):
            why = sample.reason or ("NaN" if sample.value is not None else "no data")
            return Reason.METRIC_MISSING.value, f"{name} is missing ({why})"
        age = sample.age_s(self.now)
        return Reason.METRIC_STALE.value, f"{name} is {age:.0f}s old (max {self.max_signal_age_s:.0f}s)"

    def offered(self, name: str, value: float) -> float:
        """``value``, read from the served-rate signal ``name``, as the load offered: for the request
        rate (completions) the arrival rate, for the output token rate the tokens those arrivals
        bring (:func:`controller.core.capacity.offered_tokens`); ``value`` itself for another signal
        or without a fresh arrival rate. While a backlog drains the served rates run ahead of the
        load, and while the replicas saturate they fall behind it."""
        if name not in OFFERED:
            return value
        arrivals = self.fresh(ARRIVALS)
        if arrivals is None:
            return value
        if name == COMPLETIONS:
            return arrivals
        tokens = offered_tokens(value, self.fresh(COMPLETIONS), arrivals)
        return value if tokens is None else tokens


class PolicyKind:
    """Base class of policy kinds. Subclasses set ``name`` and ``Params`` and implement
    ``recommend``; the instance holds only its validated params and rule name."""

    name: ClassVar[str]
    Params: ClassVar[type[StrictParams]]
    description: ClassVar[str] = ""

    def __init__(self, params: StrictParams, rule: str | None = None) -> None:
        self.params = params
        self.rule = rule or self.name

    def recommend(self, ctx: PolicyContext) -> Recommendation:  # pragma: no cover - abstract
        raise NotImplementedError

    def queries(self) -> tuple[str, ...]:
        """PromQL expressions this rule needs evaluated each tick (``ModelSignals.queries``);
        none by default."""
        return ()

    # helpers shared by the built-ins
    def no_opinion(self, ctx: PolicyContext, signal: str) -> Recommendation:
        code, message = ctx.missing_reason(signal)
        return Recommendation(
            rule=self.rule, kind=self.name, replicas=None, reason=code, message=message,
            missing_data=True,
        )


class Registry:
    """Policy kinds by name. A value: build one, pass it along."""

    def __init__(self, kinds: Iterable[type[PolicyKind]] = ()) -> None:
        self._kinds: dict[str, type[PolicyKind]] = {}
        for kind in kinds:
            self.register(kind)

    @classmethod
    def from_entry_points(cls, group: str = ENTRY_POINT_GROUP) -> "Registry":
        """Every kind installed under the entry point group, built-ins included."""
        return cls(entry_point_kinds(group, PolicyKind, "kind"))

    def register(self, kind: type[PolicyKind]) -> None:
        if kind.name in self._kinds and self._kinds[kind.name] is not kind:
            raise ValueError(f"policy kind {kind.name!r} registered twice")
        self._kinds[kind.name] = kind

    def get(self, name: str) -> type[PolicyKind]:
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownPolicyKind(name, self._kinds) from None

    def names(self) -> list[str]:
        return sorted(self._kinds)

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def build(self, kind: str, params: Mapping[str, Any], rule: str | None = None) -> PolicyKind:
        """Validate ``params`` against the kind's schema (raises pydantic ``ValidationError``)."""
        cls = self.get(kind)
        return cls(cls.Params.model_validate(dict(params)), rule)
