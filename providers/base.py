"""What every real adapter shares, so that ``kubernetes``, ``aws`` and ``gcp`` depend on this module
and never on each other (an import-linter ``independence`` contract keeps them so):

- ``retry_transient``: exponential backoff with full jitter inside a time budget (the tick must
  not stall behind a throttled cloud), retrying only ``TransientProviderError``;
- ``ActionLog``: times one provider call and turns its outcome into an ``Action`` row;
- ``UnavailableMarks``: the Karpenter-style insufficient-capacity cache (a pool that could not get
  capacity is skipped for a while, then tried again);
- ``SharedReads``: cloud reads shared by every model and pool within a tick, and by nothing after it;
- ``Notice`` and the ``NodeGroup`` protocol with its value types.

``providers.cloudpool`` composes the adapters; this module imports none of them.
"""

from __future__ import annotations

import enum
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Hashable, Iterator, Mapping, Protocol, Sequence, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from controller.core.model import Action, ActionStatus, PoolSpec
from controller.core.reasons import Reason
from controller.errors import ProviderError, TransientProviderError

T = TypeVar("T")


# --- retry -------------------------------------------------------------------------------------


class RetryPolicy(BaseModel):
    """Exponential backoff with full jitter for transient errors (throttling, 5xx, 409 conflicts),
    inside a time budget per call so that a throttled API delays one tick, never the loop. The
    ``retry`` section of each adapter's settings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget_s: float = Field(3.0, gt=0, description="Longest wall time one logical call may spend, retries and pauses included, seconds. Keep it well under loop.interval_s (5 s by default), so a throttled cloud delays one tick, never the loop.")
    base_delay_s: float = Field(0.1, gt=0, description="Upper bound of the first pause, seconds; each later bound doubles (full jitter).")
    max_delay_s: float = Field(2.0, gt=0, description="Cap on the bound of any one pause, seconds.")
    max_attempts: int = Field(5, ge=1, description="Attempts in all, the first included.")


def retry_transient(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    rng: Callable[[], float] = random.random,
) -> tuple[T, int]:
    """Call ``fn`` until it returns, retrying ``TransientProviderError`` with exponential backoff and
    full jitter (pause ~ U(0, min(max_delay, base * 2^k))) while the budget and attempts last.

    ``fn`` must already translate library errors into the project's tree. Returns the value and
    the number of attempts made. A permanent error is raised at once; when the budget or the
    attempts run out the last transient error is re-raised with the attempts counted in its
    message (the library error stays chained)."""
    start = monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn(), attempt
        except TransientProviderError as e:
            elapsed = monotonic() - start
            bound = min(policy.max_delay_s, policy.base_delay_s * (2 ** (attempt - 1)))
            delay = rng() * bound
            if attempt >= policy.max_attempts or elapsed + delay > policy.budget_s:
                err = TransientProviderError(f"{e} (gave up after {attempt} attempts in {elapsed:.2f} s)")
                raise err from (e.__cause__ or e)
            sleep(delay)


# --- actions -----------------------------------------------------------------------------------


def status_of(err: ProviderError) -> ActionStatus:
    return ActionStatus.FAILED_TRANSIENT if err.retryable else ActionStatus.FAILED_PERMANENT


def actions_of(err: BaseException) -> tuple[Action, ...]:
    """The actions a failed ``scale`` made, the failed one last (empty if none were recorded)."""
    return tuple(getattr(err, "actions", ()))


def _attach(err: ProviderError, actions: Sequence[Action]) -> ProviderError:
    err.actions = tuple(actions)  # type: ignore[attr-defined]
    return err


def describe_error(err: BaseException) -> str:
    """``Class: message`` of a provider error plus its chained library error, for the action row."""
    text = f"{type(err).__name__}: {err}"
    cause = err.__cause__
    if cause is not None:
        text += f" (caused by {type(cause).__name__}: {cause})"
    return text[:2000]


class ActionLog:
    """Builds the ``Action`` rows of one ``scale`` call for one pool and model, timing each call."""

    def __init__(self, provider: str, pool: str, model: str, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.provider = provider
        self.pool = pool
        self.model = model
        self.actions: list[Action] = []
        self._monotonic = monotonic

    def run(self, call: str, arguments: Mapping[str, Any], fn: Callable[[], T],
            *, provider: str | None = None) -> T:
        """Run ``fn`` (one provider call, errors already translated) and record it. On failure the
        failed action is recorded and the error re-raised with every action so far attached."""
        t0 = self._monotonic()
        try:
            result = fn()
        except ProviderError as e:
            self.actions.append(Action(
                provider or self.provider, call, self.pool, self.model, dict(arguments), status_of(e),
                error=describe_error(e), latency_ms=(self._monotonic() - t0) * 1000.0))
            raise _attach(e, self.actions)
        self.actions.append(Action(provider or self.provider, call, self.pool, self.model, dict(arguments),
                                   ActionStatus.OK, latency_ms=(self._monotonic() - t0) * 1000.0))
        return result

    def note(self, call: str, arguments: Mapping[str, Any], status: ActionStatus,
             error: str | None = None, *, provider: str | None = None) -> None:
        """Record a call that was not made (``NOOP``, ``SKIPPED``, ``DRY_RUN``)."""
        self.actions.append(Action(provider or self.provider, call, self.pool, self.model,
                                   dict(arguments), status, error=error))

    def fail(self, err: ProviderError) -> ProviderError:
        """Attach the actions so far to an error raised before any call (validation)."""
        return _attach(err, self.actions)


# --- availability cache ------------------------------------------------------------------------


class UnavailableMarks:
    """Pools that could not get capacity, each with an expiry (Karpenter caches insufficient
    capacity for minutes the same way): the core places elsewhere until the mark expires, then the
    pool is tried again. Keyed by pool name; expiries compare the ``now`` passed in."""

    def __init__(self) -> None:
        self._marks: dict[str, tuple[datetime, str]] = {}

    def mark(self, key: str, until: datetime, reason: str) -> None:
        """Mark ``key`` unavailable until ``until``; a later expiry wins, its reason with it."""
        old = self._marks.get(key)
        if old is None or until >= old[0]:
            self._marks[key] = (until, reason)

    def reason(self, key: str, now: datetime) -> str | None:
        """The reason while ``key`` is marked at ``now``; ``None`` once the mark has expired."""
        m = self._marks.get(key)
        if m is None:
            return None
        if now >= m[0]:
            del self._marks[key]
            return None
        return m[1]

    def until(self, key: str) -> datetime | None:
        m = self._marks.get(key)
        return None if m is None else m[0]


def unavailable_reason(pool: PoolSpec, cause: str, message: str) -> str:
    """``Code: message`` with the placement reason code for the pool's tier plus the cause."""
    code = Reason.SPOT_POOL_UNAVAILABLE if pool.tier.is_spot else Reason.POOL_UNAVAILABLE
    return f"{code.value}: {cause}: {message}"


# --- reads shared within a tick ----------------------------------------------------------------


class ReadMemo:
    """Each key read once: later callers get its value, or its error again (a new exception each
    time: callers attach their actions to the one they get). The Kubernetes ``ClusterSnapshot``
    and the node groups' ``SharedReads`` keep a tick's reads in one."""

    def __init__(self) -> None:
        self._memo: dict[Hashable, tuple[Any, ProviderError | None]] = {}

    def once(self, key: Hashable, read: Callable[[], T]) -> T:
        """``read()`` the first time ``key`` is asked for; later, its value or its error again."""
        if key not in self._memo:
            try:
                self._memo[key] = (read(), None)
            except ProviderError as e:
                self._memo[key] = (None, e)
        value, err = self._memo[key]
        if err is not None:
            raise type(err)(*err.args) from err.__cause__
        return value  # type: ignore[no-any-return]

    def forget(self, stale: Callable[[Hashable], bool]) -> None:
        """Drop every key for which ``stale(key)`` holds: the next caller reads again."""
        for key in [k for k in self._memo if stale(k)]:
            del self._memo[key]


class SharedReads:
    """What a node group's adapter read, shared by every caller while a block is open, and by no
    caller after it.

    A pool provider's ``sharing_reads()`` (``controller.protocols.SharesReads``; the ``Controller``
    holds it open for each tick) opens a block here. Within it ``once(key, read)`` reads the first
    time and answers every later caller with that value, or with that error (a new exception each
    time: callers attach their actions to the one they get), so a tick reads each cloud resource
    once whatever the number of models, and an API that cannot answer costs the tick one retry
    budget, not one per model. ``forget`` drops what a write of our own has made stale, so the next
    caller reads again. Outside a block ``once`` always reads: nothing read serves a later tick."""

    def __init__(self) -> None:
        self._memo: ReadMemo | None = None

    @contextmanager
    def sharing(self) -> Iterator[None]:
        """Share reads until the block ends. A block opened inside another shares the outer one,
        which alone ends it (the pools of one account and region each open one)."""
        if self._memo is not None:
            yield
            return
        self._memo = ReadMemo()
        try:
            yield
        finally:
            self._memo = None

    @property
    def open(self) -> bool:
        """Whether a block is open (reads are being shared)."""
        return self._memo is not None

    def once(self, key: Hashable, read: Callable[[], T]) -> T:
        """``read()``, or within a block its first value or error for ``key`` again."""
        return read() if self._memo is None else self._memo.once(key, read)

    def forget(self, stale: Callable[[Hashable], bool]) -> None:
        """Drop every key for which ``stale(key)`` holds (no-op outside a block)."""
        if self._memo is not None:
            self._memo.forget(stale)


# --- notices and node groups -------------------------------------------------------------------


class NoticeKind(str, enum.Enum):
    INTERRUPTION = "interruption"
    """The node goes away soon (spot interruption warning, preemption, termination taint)."""
    REBALANCE = "rebalance"
    """The node is at elevated risk (EC2 rebalance recommendation): worth knowing, not yet gone."""


@dataclass(frozen=True, slots=True)
class Notice:
    """One warning that a node (or the cloud instance behind it) will be lost."""

    kind: NoticeKind
    source: str
    """Where it was seen, e.g. ``taint:aws-node-termination-handler/spot-itn`` or
    ``sqs:EC2 Spot Instance Interruption Warning``."""
    at: datetime | None = None
    node: str | None = None
    instance_id: str | None = None

    @property
    def key(self) -> str:
        """One key per node and kind: a node's taint and the cloud's (or Karpenter's) notice for
        the instance behind it are one interruption, not two."""
        return f"{self.kind.value}:{self.node or self.instance_id}"


@dataclass(frozen=True, slots=True)
class GroupInstance:
    """One instance of a node group as the cloud reports it."""

    instance_id: str
    """AWS instance id (``i-...``) or GCP instance name."""
    state: str
    """The cloud's own lifecycle word (``InService``, ``Pending``, ``RUNNING``, ``CREATING``...)."""
    running: bool
    """Up (billed and able to join the cluster); ``False`` while still being created."""
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class GroupState:
    """A node group (Auto Scaling group / managed instance group) at one observation."""

    name: str
    target: int
    """Desired capacity / target size, nodes."""
    min_size: int
    max_size: int
    instances: tuple[GroupInstance, ...] = ()
    capacity_error: str | None = None
    """The latest insufficient-capacity or quota failure still worth acting on, if any."""
    capacity_error_at: datetime | None = None
    notices: tuple[Notice, ...] = ()
    """Interruption / rebalance notices for this group's instances (cloud side)."""

    @property
    def running(self) -> int:
        return sum(1 for i in self.instances if i.running)

    @property
    def creating(self) -> int:
        return sum(1 for i in self.instances if not i.running)


@runtime_checkable
class NodeGroup(Protocol):
    """The cloud half of a pool. Calls raise ``ProviderError`` subclasses only.

    A node group may also share its reads within a tick (``controller.protocols.SharesReads``,
    optional, checked by attribute): ``CloudPoolProvider.sharing_reads()`` opens its block with the
    Kubernetes side's. Within it ``describe`` must answer from the tick's read, except after the
    group's own ``set_target`` or ``release``, after which it reads again: a later model's scale
    in the same tick compares with what the write left, not with what preceded it."""

    provider: str
    """The provider's name (``aws``, ``gcp``...): the ``provider`` of its action rows."""
    name: str
    set_call: str
    """Name of the resize call in action rows (``set_desired_capacity``, ``resize``)."""
    release_call: str
    """Name of the call that removes given instances (``terminate_instance_in_auto_scaling_group``,
    ``delete_instances``)."""

    def describe(self, now: datetime) -> GroupState:
        ...

    def set_target(self, nodes: int) -> None:
        """Set the desired size (already clamped to the group's bounds by the caller)."""
        ...

    def release(self, instance_ids: Sequence[str]) -> None:
        """Remove exactly these instances and shrink the desired size by as many."""
        ...

    def instance_id_for(self, provider_id: str) -> str | None:
        """The instance id behind a Kubernetes node's ``spec.providerID`` (``None``: not ours)."""
        ...
