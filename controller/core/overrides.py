"""Operator overrides, resolved into one effect per model and tick.

Operators pin, bound, freeze and drain through the admin API; the database hands the pipeline
every override it knows, and this module decides which of them count *now* for *this* model and
how they combine, so the pipeline applies one ``OverrideEffect`` instead of re-deciding precedence
in several stages.

Precedence (documented in the README's override table):

- only overrides for this model whose ``expires_at`` is in the future (or unset) count;
- ``freeze`` wins over everything: the pipeline still decides (the trace shows what it would have
  done) but does not actuate, and the placement stays as it is; a freeze scoped to a pool keeps
  that pool at its current replicas and lets the others move;
- pins beat bounds; among pins of the same scope the most recently created wins;
- among bounds overrides the most recently created wins; their ``max_replicas`` can never exceed
  the policy's hard ``max_replicas`` and the budget still applies after them;
- ``drain-pool`` empties that pool (its replicas move elsewhere) and beats a pin of the same pool.

Overrides that cannot apply (a pool the model does not run in, a pin without replicas) are listed
in ``ignored`` with the reason, so the trace says why an operator's instruction had no effect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

from controller.core.model import ModelSpec, Override, OverrideKind, PoolSpec


def _created_key(o: Override) -> tuple[Any, ...]:
    # Overrides without a creation time sort before every timed one; the id breaks ties (ids grow).
    return (0, o.id) if o.created_at is None else (1, o.created_at, o.id)


@dataclass(frozen=True, slots=True)
class OverrideEffect:
    """What the active overrides of one model ask for, precedence already applied."""

    freeze: Override | None = None
    """The newest active model-wide freeze."""
    frozen_pools: Mapping[str, Override] = field(default_factory=dict)
    """Pool-scoped freezes: those pools keep their current replicas."""
    pin_total: Override | None = None
    """The newest model-wide pin (its ``replicas`` is the total)."""
    pin_pools: Mapping[str, Override] = field(default_factory=dict)
    """Per pool, the newest pool-scoped pin (its ``replicas`` is that pool's)."""
    bounds: Override | None = None
    """The newest bounds override."""
    drained: Mapping[str, Override] = field(default_factory=dict)
    """Pools being drained (the newest drain override of each)."""
    ignored: tuple[tuple[Override, str], ...] = ()
    """Active overrides of this model that cannot apply, with why."""

    @property
    def empty(self) -> bool:
        return not (self.freeze or self.frozen_pools or self.pin_total or self.pin_pools or self.bounds
                    or self.drained or self.ignored)

    def bounds_for(self, min_replicas: int, max_replicas: int) -> tuple[int, int]:
        """(min, max) after the bounds override, if any.

        The override may widen or narrow the policy's min, and narrow its max; the policy's
        ``max_replicas`` is a hard limit no override exceeds. ``min`` never exceeds the result's max.
        """
        o = self.bounds
        if o is None:
            return min_replicas, max_replicas
        hi = max_replicas if o.max_replicas is None else min(o.max_replicas, max_replicas)
        lo = min_replicas if o.min_replicas is None else o.min_replicas
        return min(lo, hi), hi

    def pool_constraints(self, current: Mapping[str, int], max_replicas: int) -> tuple[dict[str, int], frozenset[str]]:
        """(replicas per fixed pool, drained pools) for the placement.

        A pool-scoped freeze keeps the pool at its ``current`` replicas and beats a drain or a pin
        of that pool; a drain beats a pin. The fixed replicas' sum is capped at ``max_replicas``
        (pools in name order take what is left, so the result is deterministic).
        """
        drained = frozenset(p for p in self.drained if p not in self.frozen_pools)
        fixed: dict[str, int] = {}
        left = max_replicas
        for pool in sorted(set(self.frozen_pools) | set(self.pin_pools)):
            if pool in self.frozen_pools:
                want = current.get(pool, 0)
            elif pool in drained:
                continue
            else:
                want = self.pin_pools[pool].replicas or 0
            take = min(want, left)
            fixed[pool] = take
            left -= take
        return fixed, drained

    def describe(self) -> str:
        """One line for the trace."""
        parts: list[str] = []
        if self.freeze is not None:
            parts.append(f"freeze #{self.freeze.id}")
        for pool, o in sorted(self.frozen_pools.items()):
            parts.append(f"freeze {pool} #{o.id}")
        if self.pin_total is not None:
            parts.append(f"pin total={self.pin_total.replicas} #{self.pin_total.id}")
        for pool, o in sorted(self.pin_pools.items()):
            parts.append(f"pin {pool}={o.replicas} #{o.id}")
        if self.bounds is not None:
            parts.append(f"bounds [{self.bounds.min_replicas}, {self.bounds.max_replicas}] #{self.bounds.id}")
        for pool, o in sorted(self.drained.items()):
            parts.append(f"drain {pool} #{o.id}")
        for o, why in self.ignored:
            parts.append(f"ignored #{o.id} ({why})")
        return "; ".join(parts) if parts else "no active overrides"


NO_OVERRIDES = OverrideEffect()


def replica_cap(model: ModelSpec, pools: Mapping[str, PoolSpec], *, policy_max_replicas: int | None,
                pool: str | None) -> tuple[int | None, str]:
    """The most replicas an override of this scope may ask for, and what sets that limit.

    One rule for both scopes, so a per-pool pin can never ask for more than a total pin could: the
    policy's hard ``max_replicas`` caps both; a model-wide value is also capped by what the model's
    pools hold together, one pool's value by that pool's capacity (``max_nodes`` x replicas per
    node). ``(None, "")`` when nothing caps it (no policy loaded and no pool known).
    """
    caps: list[tuple[int, str]] = []
    if policy_max_replicas is not None:
        caps.append((policy_max_replicas, f"the policy's max_replicas ({policy_max_replicas}), a hard limit"))
    if pool is not None:
        if pool in pools:
            held = pools[pool].max_replicas(model)
            caps.append((held, f"what pool {pool} holds ({held}: max_nodes x replicas per node)"))
    else:
        known = [pools[p] for p in model.pools if p in pools]
        if known:
            held = sum(p.max_replicas(model) for p in known)
            caps.append((held, f"what the model's pools hold together ({held})"))
    if not caps:
        return None, ""
    return min(caps, key=lambda c: c[0])


@dataclass(slots=True)
class _Resolving:
    """The effect being assembled, oldest override first (private, mutable, never returned)."""

    freeze: Override | None = None
    pin_total: Override | None = None
    bounds: Override | None = None
    frozen_pools: dict[str, Override] = field(default_factory=dict)
    pin_pools: dict[str, Override] = field(default_factory=dict)
    drained: dict[str, Override] = field(default_factory=dict)
    ignored: list[tuple[Override, str]] = field(default_factory=list)

    def apply(self, o: Override) -> None:
        """Take ``o`` (valid for this model) over any older one of the same kind and scope."""
        if o.kind is OverrideKind.FREEZE:
            if o.pool is None:
                self.freeze = o
            else:
                self.frozen_pools[o.pool] = o
        elif o.kind is OverrideKind.PIN:
            if o.pool is None:
                self.pin_total = o
            else:
                self.pin_pools[o.pool] = o
        elif o.kind is OverrideKind.BOUNDS:
            self.bounds = o
        elif o.kind is OverrideKind.DRAIN_POOL and o.pool is not None:
            self.drained[o.pool] = o

    def effect(self) -> OverrideEffect:
        return OverrideEffect(
            freeze=self.freeze, frozen_pools=self.frozen_pools, pin_total=self.pin_total, pin_pools=self.pin_pools,
            bounds=self.bounds, drained=self.drained, ignored=tuple(self.ignored),
        )


def _why_ignored(o: Override, model: ModelSpec) -> str | None:
    """Why override ``o`` cannot apply to ``model``, or ``None`` when it can."""
    if o.pool is not None and o.pool not in model.pools:
        return f"model {model.name} has no pool {o.pool}"
    if o.kind is OverrideKind.PIN and (o.replicas is None or o.replicas < 0):
        return "pin without a replica count"
    if o.kind is OverrideKind.BOUNDS:
        return _bounds_problem(o)
    if o.kind is OverrideKind.DRAIN_POOL and o.pool is None:
        return "drain-pool without a pool"
    return None


def _bounds_problem(o: Override) -> str | None:
    if o.pool is not None:
        return "bounds apply to the model total, not to one pool"
    if o.min_replicas is None and o.max_replicas is None:
        return "bounds without min_replicas or max_replicas"
    return None


def resolve(overrides: Sequence[Override], *, model: ModelSpec, now: datetime) -> OverrideEffect:
    """The effect of the overrides that are active at ``now`` for ``model``."""
    if not overrides:
        return NO_OVERRIDES
    mine = [o for o in overrides if o.model == model.name and o.active(now)]
    if not mine:
        return NO_OVERRIDES
    mine.sort(key=_created_key)  # oldest first: later ones below replace older ones
    out = _Resolving()
    for o in mine:
        why = _why_ignored(o, model)
        if why is None:
            out.apply(o)
        else:
            out.ignored.append((o, why))
    return out.effect()
