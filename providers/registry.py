"""Pool providers by name: who holds a pool's nodes (``onprem``, ``aws``, ``gcp``, or another).

Why it exists: a pool is a capacity *tier* (on-prem, spot, on-demand: what the decision core
reasons about) plus a *provider* (whose API grows and shrinks its nodes: what only the adapters
and the simulator care about). The core never sees a provider's name; everything that depends on
it asks this registry instead of testing for a cloud's name.

A provider kind is a ``PoolProviderKind`` subclass: its ``name``, the tiers it can hold, the
notice it gives before taking a spot node back, the pydantic class of its settings sections and a
``build`` that turns the pools naming it into node groups and a price source. Kinds are found
through the ``tidegate.providers`` entry point group, the built-ins too (``pyproject.toml``), so a
package installed beside tidegate can add one. Like the policy kinds' ``Registry`` it is a value
that callers build and pass along; ``installed()`` returns the one made from the entry points
(cached: what is installed does not change while a process runs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

from pydantic import BaseModel

from controller.core.model import Tier
from controller.errors import UnknownProvider  # re-exported: raised here
from controller.plugins import entry_point_kinds

ENTRY_POINT_GROUP = "tidegate.providers"

Job = tuple[Callable[[], None], float, str]
"""A periodic job for the daemon's scheduler: (callable, seconds between runs, job id)."""


@dataclass
class BuildContext:
    """What a provider kind gets to build its pools with (from ``providers.real``)."""

    settings: Any
    """This provider's own settings section (an instance of its ``Settings``), or ``None``."""
    kube: Callable[[Any], Any]
    """The Kubernetes side of a pool (a ``providers.kubernetes.KubernetesPoolProvider``: its
    Deployments and nodes), given the pool's config."""
    dry_run: bool
    clock: Any
    """The daemon's clock (``now()``), for periodic jobs."""
    client: Any = None
    """A client handle the caller holds for this provider (e.g. a ``boto3.Session`` for aws,
    credentials for gcp); ``None``: the provider builds its own from its settings."""


@dataclass
class ProviderParts:
    """What a provider kind's ``build`` returns for the pools that name it."""

    groups: dict[str, Any] = field(default_factory=dict)
    """Node group (``providers.base.NodeGroup``) per pool name; a pool without one is its
    Kubernetes side alone."""
    prices: Any = None
    """Live prices of its pools (a ``PriceSource``); ``None``: their static prices."""
    jobs: list[Job] = field(default_factory=list)
    """Periodic work for the daemon's scheduler (e.g. refreshing live spot prices)."""
    parts: dict[str, Any] = field(default_factory=dict)
    """Named pieces worth reaching from outside (e.g. aws's ``spot_prices``, ``interruptions``)."""
    providers: dict[str, Any] = field(default_factory=dict)
    """A whole ``PoolProvider`` per pool name, for a kind that composes the pool itself (e.g.
    karpenter: the Kubernetes side plus what Karpenter's objects say); it replaces the default
    composition (the Kubernetes side, with the pool's node group if any)."""


class PoolProviderKind:
    """Base class of pool provider kinds. Subclasses set the class attributes and ``build``."""

    name: ClassVar[str]
    """The name pools give in ``provider:`` (and the prefix of the older ``kind: NAME-spot``)."""
    tiers: ClassVar[frozenset[Tier]]
    """The tiers its pools may have (an on-prem provider holds no spot capacity)."""
    description: ClassVar[str] = ""
    interruption_notice_s: ClassVar[float | None] = None
    """Seconds between its warning and a spot node's loss (``None``: it gives none); the simulator
    replays interruptions with this notice."""
    Settings: ClassVar[type[BaseModel] | None] = None
    """Its section of ``providers.settings`` (one pydantic class, taken by the adapter as is)."""
    PoolSettings: ClassVar[type[BaseModel] | None] = None
    """Its section of each of its pools (``pools[].<name>``), required with real providers."""

    def problems(self, settings: Any, pools: Mapping[str, str]) -> list[str]:
        """What is wrong in its ``settings`` given the config's pools (name -> provider name),
        each quoting both sides; checked at load. None by default."""
        return []

    def build(self, pools: Sequence[Any], ctx: BuildContext) -> ProviderParts:
        """Node groups and prices for ``pools`` (``controller.config.PoolConfig`` values naming
        this provider). Makes no network call: the first tick is the first observation."""
        return ProviderParts()


class ProviderRegistry:
    """Pool provider kinds by name. A value: build one, pass it along."""

    def __init__(self, kinds: Iterable[type[PoolProviderKind]] = ()) -> None:
        self._kinds: dict[str, PoolProviderKind] = {}
        for kind in kinds:
            self.register(kind)

    @classmethod
    def from_entry_points(cls, group: str = ENTRY_POINT_GROUP) -> "ProviderRegistry":
        """Every kind installed under the entry point group, built-ins included."""
        return cls(entry_point_kinds(group, PoolProviderKind, "provider"))

    def register(self, kind: type[PoolProviderKind]) -> None:
        old = self._kinds.get(kind.name)
        if old is not None and type(old) is not kind:
            raise ValueError(f"pool provider {kind.name!r} registered twice")
        self._kinds[kind.name] = kind()

    def get(self, name: str) -> PoolProviderKind:
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownProvider(name, self._kinds) from None

    def names(self) -> list[str]:
        return sorted(self._kinds)

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def problem(self, pool: str, provider: str, tier: Tier) -> str | None:
        """Why pool ``pool`` cannot be ``tier`` capacity from ``provider`` (``None``: it can)."""
        if not self._kinds:
            return (f"pool {pool!r} names provider {provider!r}, but no pool provider is installed (entry point group "
                    f"{ENTRY_POINT_GROUP}): reinstall tidegate (pip install -e .) so its built-in providers register")
        if provider not in self._kinds:
            return f"pool {pool!r} names provider {provider!r}, which is not installed (installed: {', '.join(self.names())})"
        tiers = self._kinds[provider].tiers
        if tier not in tiers:
            return (f"pool {pool!r} is tier {tier.value!r} but provider {provider!r} holds only "
                    f"{', '.join(sorted(t.value for t in tiers))}")
        return None

    def notice_s(self, provider: str) -> float | None:
        """The provider's spot interruption notice, seconds (``None``: none, or not installed)."""
        kind = self._kinds.get(provider)
        return None if kind is None else kind.interruption_notice_s


@functools.cache
def installed() -> ProviderRegistry:
    """The registry of the installed entry points (built once per process)."""
    return ProviderRegistry.from_entry_points()


def split_legacy_kind(kind: str) -> tuple[Tier, str]:
    """The older ``kind:`` of a pool as (tier, provider): ``onprem`` is tier and provider onprem,
    ``NAME-spot`` / ``NAME-ondemand`` is that tier from provider NAME (``aws-spot``: spot from
    aws). Raises ``ValueError`` for anything else."""
    if kind == Tier.ONPREM.value:
        return Tier.ONPREM, "onprem"
    provider, sep, tier = kind.rpartition("-")
    if sep and provider and tier in (Tier.SPOT.value, Tier.ONDEMAND.value):
        return Tier(tier), provider
    raise ValueError(f"kind {kind!r} is not onprem, PROVIDER-spot or PROVIDER-ondemand (e.g. aws-spot); "
                     f"better: set tier (onprem, spot, ondemand) and provider instead")


__all__ = [
    "BuildContext", "ENTRY_POINT_GROUP", "Job", "PoolProviderKind", "ProviderParts", "ProviderRegistry",
    "UnknownProvider", "installed", "split_legacy_kind",
]
