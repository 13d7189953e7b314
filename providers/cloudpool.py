"""One ``PoolProvider`` for a cloud pool: its Kubernetes Deployments composed with its node group.

Why it exists: a cloud pool is two systems that must move in a safe order. Capacity is ordered
before replicas on the way up (pods would sit Pending without nodes), and on the way down replicas
go first and a node is released only once no pod of the pool is left on it (an Auto Scaling group
or managed instance group told to shrink picks its own victim, busy or not). The Kubernetes half
(``providers.kubernetes``) and the node-group half (``providers.aws`` / ``providers.gcp``) know
nothing of each other; this module is the only place that orders them.

It is also the home of the few pieces every real adapter shares, so that ``kubernetes``, ``aws``
and ``gcp`` depend on this module and never on each other:

- ``retry_transient``: exponential backoff with full jitter inside a time budget (the tick must
  not stall behind a throttled cloud), retrying only ``TransientProviderError``;
- ``ActionLog``: times one provider call and turns its outcome into an ``Action`` row;
- ``UnavailableMarks``: the Karpenter-style insufficient-capacity cache (a pool that could not get
  capacity is skipped for a while, then tried again);
- ``Notice`` and the ``NodeGroup`` protocol with its value types.

``CombinedPrices`` joins the providers' price sources; ``providers.real`` wires every pool of a
``DaemonConfig`` to its real providers through the provider registry (``providers.registry``).

Errors: ``scale`` raises ``TransientProviderError`` / ``PermanentProviderError`` like every
provider; the actions made before the failure and the failed one ride along on the exception
(``actions_of(err)``), so the decision log still holds every call with its result.
"""

from __future__ import annotations

import enum
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from controller.core.model import Action, ActionStatus, ModelSpec, PoolSpec, PoolState
from controller.core.reasons import Reason
from controller.protocols import PermanentProviderError, ProviderError, TransientProviderError

if TYPE_CHECKING:  # only for annotations: kubernetes.py imports this module at runtime
    from providers.kubernetes import KubernetesPoolProvider

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
    """``Code: message`` with the placement reason code for the pool's kind plus the cause."""
    code = Reason.SPOT_POOL_UNAVAILABLE if pool.tier.is_spot else Reason.POOL_UNAVAILABLE
    return f"{code.value}: {cause}: {message}"


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
        return f"{self.kind.value}:{self.instance_id or self.node}"


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
    """The cloud half of a pool. Calls raise ``ProviderError`` subclasses only."""

    provider: str
    """``aws`` or ``gcp``: the ``provider`` of its action rows."""
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


# --- the composition ---------------------------------------------------------------------------


class CloudPoolSettings(BaseModel):
    """How a cloud pool reacts to its node group's capacity trouble (``providers.settings.cloud``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capacity_unavailable_s: float = Field(180.0, gt=0, description="After an insufficient-capacity or quota failure the pool is unavailable for this long from the failure's time, seconds (Karpenter: 3 minutes).")
    capacity_error_max_age_s: float = Field(900.0, gt=0, description="Failures older than this are ignored, even at startup, seconds.")


@dataclass
class _Observed:
    """What the last ``state`` saw, for dry-run planning without any call."""

    replicas: int | None
    group_target: int | None


class CloudPoolProvider:
    """``PoolProvider`` for a cloud pool: ``kube`` (the pool's Deployments and nodes) plus
    ``group`` (its Auto Scaling group or managed instance group). With ``group=None`` it behaves
    like ``kube`` alone (an on-prem pool)."""

    def __init__(
        self,
        kube: "KubernetesPoolProvider",
        group: NodeGroup | None,
        *,
        settings: CloudPoolSettings = CloudPoolSettings(),
        dry_run: bool = False,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.group = group
        self.pool: PoolSpec = kube.pool
        self.settings = settings
        self.dry_run = dry_run
        self._monotonic = monotonic
        self._observed: dict[str, _Observed] = {}
        self.last_group_state: GroupState | None = None

    # -- observe ----------------------------------------------------------------------------------

    def state(self, model: ModelSpec, now: datetime) -> PoolState:
        if self.group is None:
            return self.kube.state(model, now)
        g = self.group.describe(now)
        self.last_group_state = g
        self._note_capacity_error(g, now)
        obs = self.kube.observe(model, now, cloud_notices=g.notices,
                                instance_id_for=self.group.instance_id_for)
        self._observed[model.name] = _Observed(obs.replicas, g.target)
        # Nodes of a cloud pool are what the group holds (billed, or about to be), not only those
        # already registered in the cluster: cost follows instances.
        return self.kube.to_state(obs, now, nodes=g.running + g.creating)

    def _note_capacity_error(self, g: GroupState, now: datetime) -> None:
        if g.capacity_error is None:
            return
        at = g.capacity_error_at or now
        if (now - at).total_seconds() > self.settings.capacity_error_max_age_s:
            return
        until = at + timedelta(seconds=self.settings.capacity_unavailable_s)
        if until > now:
            self.kube.marks.mark(self.pool.name, until, unavailable_reason(
                self.pool, "InsufficientCapacity",
                f"{self.group.name if self.group else ''}: {g.capacity_error} (at {at:%Y-%m-%dT%H:%M:%SZ})"))

    # -- act --------------------------------------------------------------------------------------

    def scale(self, model: ModelSpec, replicas: int, nodes: int, now: datetime) -> Sequence[Action]:
        if self.group is None:
            return self.kube.scale(model, replicas, nodes, now)
        group = self.group
        log = ActionLog(self.kube.provider, self.pool.name, model.name, monotonic=self._monotonic)
        self.kube.validate(model, replicas, log)
        if not 0 <= nodes <= self.pool.max_nodes:
            raise log.fail(PermanentProviderError(
                f"nodes ({nodes}) must be between 0 and pool {self.pool.name!r} max_nodes ({self.pool.max_nodes})"))
        if self.dry_run:
            return self._dry_run(model, replicas, nodes, log)

        g = group.describe(now)
        self.last_group_state = g
        target, clamp_note = self._clamp(nodes, g)
        set_args: dict[str, Any] = {"group": group.name, "nodes": target, "requested_nodes": nodes,
                                    "previous_nodes": g.target}
        if clamp_note:
            set_args["clamped"] = clamp_note

        if target > g.target:
            # Scale-out: order capacity first. If the order fails, adding replicas would only make
            # Pending pods, so the failure stops the call here.
            log.run(group.set_call, set_args, lambda: group.set_target(target), provider=group.provider)
            self.kube.set_replicas(model, replicas, log)
            return log.actions

        # Same size or smaller: replicas first, then release only nodes left without our pods.
        self.kube.set_replicas(model, replicas, log)
        if target == g.target:
            log.note(group.set_call, set_args, ActionStatus.NOOP, provider=group.provider)
            return log.actions
        self._release(g, target, set_args, log, now)
        return log.actions

    def _clamp(self, nodes: int, g: GroupState) -> tuple[int, str | None]:
        hi = min(g.max_size, self.pool.max_nodes)
        lo = min(g.min_size, hi)
        target = min(max(nodes, lo), hi)
        if target != nodes:
            return target, f"{nodes} clamped to the group's bounds [{lo}, {hi}]"
        return target, None

    def _release(self, g: GroupState, target: int, args: dict[str, Any], log: ActionLog, now: datetime) -> None:
        """Remove ``g.target - target`` instances, choosing only ones that hold none of this pool's
        pods: first instances that never became nodes, then nodes under an interruption notice
        (they go anyway), then idle nodes. Instances are matched to nodes by ``providerID`` over
        the whole cluster, so a wrong node selector cannot make a busy node look empty."""
        group = self.group
        assert group is not None
        excess = g.target - target
        node_of = self.kube.nodes_by_instance(group.instance_id_for, now)
        busy = self.kube.busy_nodes(now)
        noticed = {n.instance_id for n in g.notices if n.kind is NoticeKind.INTERRUPTION}

        candidates: list[tuple[int, str]] = []
        for inst in g.instances:
            node = node_of.get(inst.instance_id)
            if node is None:
                candidates.append((0, inst.instance_id))
            elif node.name not in busy:
                candidates.append((1 if inst.instance_id in noticed or node.noticed else 2, inst.instance_id))
        candidates.sort(key=lambda c: c[0])
        chosen = [iid for _, iid in candidates[:excess]]
        waiting = excess - len(chosen)
        rel_args = {**args, "instances": chosen, "waiting_for_pods_on": waiting}
        if not chosen:
            log.note(group.release_call, rel_args, ActionStatus.SKIPPED,
                     error=f"{waiting} node(s) still hold pods of pool {self.pool.name}; released once they are gone",
                     provider=group.provider)
            return
        log.run(group.release_call, rel_args, lambda: group.release(chosen), provider=group.provider)

    def _dry_run(self, model: ModelSpec, replicas: int, nodes: int, log: ActionLog) -> list[Action]:
        """Record what would be done from the last observation; make no call at all."""
        assert self.group is not None
        seen = self._observed.get(model.name)
        cur_r = seen.replicas if seen else None
        cur_n = seen.group_target if seen else None
        log.note(self.group.set_call, {"group": self.group.name, "nodes": nodes, "previous_nodes": cur_n},
                 ActionStatus.NOOP if cur_n == nodes else ActionStatus.DRY_RUN, provider=self.group.provider)
        log.note(self.kube.scale_call, {"replicas": replicas, "previous_replicas": cur_r},
                 ActionStatus.NOOP if cur_r == replicas else ActionStatus.DRY_RUN)
        if cur_n is not None and nodes < cur_n:
            log.actions.reverse()  # replicas first on the way down, as a real call would
        return log.actions


# --- prices ------------------------------------------------------------------------------------


class CombinedPrices:
    """``PriceSource`` over every pool: each provider's live prices for its own pools (``sources``:
    provider name -> its ``PriceSource``), every other pool its static price."""

    def __init__(self, sources: Mapping[str, Any] | None = None) -> None:
        self.sources = dict(sources or {})

    def prices(self, pools: Sequence[PoolSpec], now: datetime) -> Mapping[str, float]:
        out = {p.name: p.price_per_node_hour_usd for p in pools}
        for provider, source in self.sources.items():
            mine = [p for p in pools if p.provider == provider]
            if mine:
                out.update(source.prices(mine, now))
        return out


__all__ = [
    "ActionLog", "CloudPoolProvider", "CloudPoolSettings", "CombinedPrices", "GroupInstance", "GroupState",
    "NodeGroup", "Notice", "NoticeKind", "RetryPolicy", "UnavailableMarks", "actions_of",
    "describe_error", "retry_transient", "status_of", "unavailable_reason",
]
