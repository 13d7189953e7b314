"""The small protocols every provider implements: the only doors between the daemon and the world.

The simulated providers (``providers.sim``) implement them now; the real adapters (Prometheus,
Triton, Kubernetes scale subresource per pool Deployment, AWS Auto Scaling desired capacity, GCP
managed instance group resize) implement the same protocols, and one contract suite runs against
both so the fakes cannot drift.

Errors: providers raise ``ProviderError`` subclasses only (``TransientProviderError`` is retried
with backoff, ``PermanentProviderError`` is surfaced and not retried), always chaining the library
error (``raise ... from e``). A metric that cannot be read is not an error: it is a ``Sample`` with
``value=None`` and a reason.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from typing import Mapping, Protocol, Sequence, runtime_checkable

from controller.core.model import Action, ModelSignals, ModelSpec, PoolSpec, PoolState, Sample
from controller.errors import PermanentProviderError, ProviderError, TransientProviderError  # re-exported


@runtime_checkable
class Clock(Protocol):
    """The daemon's sense of time. The real one reads the system clock; the demo's runs faster;
    tests drive a manual one."""

    def now(self) -> datetime:
        """Timezone-aware UTC now."""
        ...


@runtime_checkable
class MetricsSource(Protocol):
    """Reads load signals for every model at once (one query per signal kind per tick)."""

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        """Signals per model name. ``pools`` in the returned signals may be empty: the capacity
        providers fill them in. Must not raise for missing data (return missing ``Sample``s)."""
        ...


@runtime_checkable
class ReportsDegradation(Protocol):
    """A metrics source that can fall back to a poorer one (Triton's own metrics while Prometheus
    is down) says, per model, why it is degraded. The core then never releases capacity for that
    model. Optional: a source without it is never degraded."""

    @property
    def degraded(self) -> Mapping[str, str]:
        """Model name -> why its signals come from the fallback; absent: not degraded."""
        ...


@runtime_checkable
class EvaluatesQueries(Protocol):
    """A metrics source that evaluates arbitrary PromQL for rules that ask for it (the ``promql``
    kind): told the expressions before each ``observe``, it returns their values in
    ``ModelSignals.queries``. Optional: without it such rules see their query as missing."""

    def set_queries(self, queries: Mapping[str, Sequence[str]]) -> None:
        """Model name -> the PromQL expressions to evaluate for it from the next ``observe`` on."""
        ...


@runtime_checkable
class MeasuresPower(Protocol):
    """A metrics source that measures the GPU power of a model's serving GPUs (DCGM), which prices
    on-prem energy (``controller.core.pricing``). Optional: without it the assumed power per GPU
    of the ``onprem_cost`` settings is used."""

    def power_kw(self, model: str) -> Mapping[str, Sample]:
        """Pool name -> power (kW) of ``model``'s GPUs at the last observation; empty before it."""
        ...


def degraded_models(source: object) -> Mapping[str, str]:
    """What ``source`` reports as degraded (:class:`ReportsDegradation`); nothing otherwise."""
    # hasattr is the runtime check of this data-only protocol, without typing's isinstance (7.3 us
    # against 0.03 us for a source without it, `python -m timeit`); the daemon asks at every tick
    return source.degraded if hasattr(source, "degraded") else {}


@runtime_checkable
class PoolProvider(Protocol):
    """Capacity and actuation for one pool: a Deployment per model plus, for cloud pools, a node
    group. ``scale`` is declarative and idempotent: the same call twice changes nothing the second
    time. Scale-out of a cloud pool orders nodes first, then replicas; scale-in removes replicas
    first, then releases nodes."""

    pool: PoolSpec

    def state(self, model: ModelSpec, now: datetime) -> PoolState:
        """Current desired/ready replicas, nodes, availability and interruption notices."""
        ...

    def scale(self, model: ModelSpec, replicas: int, nodes: int, now: datetime) -> Sequence[Action]:
        """Make the pool hold ``replicas`` replicas of ``model`` on ``nodes`` nodes (the nodes the
        pool needs for all models it serves). Returns one ``Action`` per provider call made."""
        ...


@runtime_checkable
class SharesReads(Protocol):
    """A pool provider whose reads every model and pool can share within one tick (the Kubernetes
    side: one LIST per namespace of Deployments and of pods, and one of nodes, for every model and
    pool, where each would read its own; a cloud node group: one read for every model of its pool,
    the Auto Scaling groups of a region in one call). The ``Controller`` holds ``sharing_reads()``
    open for each tick, so nothing read serves a later one; outside it every call reads afresh.
    Optional."""

    def sharing_reads(self) -> AbstractContextManager[object]:
        """A block within which this provider's reads are shared (nested blocks share the outer)."""
        ...


@runtime_checkable
class PriceSource(Protocol):
    """Live prices per node-hour (spot); pools without a live price use their static price."""

    def prices(self, pools: Sequence[PoolSpec], now: datetime) -> Mapping[str, float]:
        ...


@runtime_checkable
class LeaderElector(Protocol):
    """Leader election between daemon replicas (``providers.leader`` has a PostgreSQL advisory lock
    and a Kubernetes Lease). Asked before every tick; only the leader observes, decides and acts."""

    identity: str
    check_error: str | None
    """Why the last ``try_acquire`` could not reach the lock's backend; ``None`` when it could
    (holding the lock or not). The daemon turns unready while it is set."""

    def try_acquire(self) -> bool:
        """Become (or stay) leader if possible; ``True`` while this instance may actuate."""
        ...

    def is_leader(self) -> bool:
        """Whether this instance holds leadership now (checked, not remembered)."""
        ...

    def release(self) -> None:
        """Give leadership up (on shutdown) so a follower takes over without waiting."""
        ...


@runtime_checkable
class ShardElector(Protocol):
    """Models sharded over daemon replicas (``controller.shards``; ``providers.leader`` has one on
    Kubernetes Leases): asked before every tick, it says which buckets of models this replica holds;
    the daemon acts only on their models."""

    identity: str
    buckets: int
    """How many buckets the models hash into."""
    check_error: str | None
    """Why the last round could not reach the backend (``None``: it could)."""

    def acquire_buckets(self) -> frozenset[int]:
        """Take or renew this replica's share of the buckets; the buckets it may act on now."""
        ...

    def release(self) -> None:
        """Give every bucket up (on shutdown) so the others take over without waiting."""
        ...

