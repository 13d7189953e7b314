"""One ``PoolProvider`` for a cloud pool: its Kubernetes Deployments composed with its node group.

Why it exists: a cloud pool is two systems that must move in a safe order. Capacity is ordered
before replicas on the way up (pods would sit Pending without nodes), and on the way down replicas
go first and a node is released only once no pod of the pool is left on it (an Auto Scaling group
or managed instance group told to shrink picks its own victim, busy or not). The Kubernetes half
(``providers.kubernetes``) and the node-group half (``providers.aws`` / ``providers.gcp``) know
nothing of each other; this module is the only place that orders them.

The pieces every real adapter shares (retries, action rows, the insufficient-capacity cache,
notices and the ``NodeGroup`` protocol) are in ``providers.base``: the adapters import that, never
this module or each other, and this module imports them (one direction).

``CombinedPrices`` joins the pool providers' price sources; ``providers.wiring`` wires every pool of
a ``DaemonConfig`` to its real providers through the provider registry (``providers.registry``).

Errors: ``scale`` raises ``TransientProviderError`` / ``PermanentProviderError`` like every
provider; the actions made before the failure and the failed one ride along on the exception
(``actions_of(err)``), so the decision log still holds every call with its result.
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from controller.core.model import Action, ActionStatus, ModelSpec, PoolSpec, PoolState
from controller.errors import PermanentProviderError
from providers.base import (
    ActionLog, GroupInstance, GroupState, NodeGroup, Notice, NoticeKind, RetryPolicy, UnavailableMarks,
    actions_of, describe_error, retry_transient, status_of, unavailable_reason,
)

if TYPE_CHECKING:  # annotations only; the adapters are imported when pools are built (client libraries)
    from providers.kubernetes import KubernetesPoolProvider

# --- the composition ---------------------------------------------------------------------------


class CloudPoolSettings(BaseModel):
    """How a cloud pool reacts to its node group's capacity trouble (``providers.settings.cloud``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capacity_unavailable_s: float = Field(180.0, gt=0, description="After an insufficient-capacity or quota failure the pool is unavailable for this long from the failure's time, seconds (Karpenter: 3 minutes).")
    capacity_error_max_age_s: float = Field(900.0, gt=0, description="Failures older than this are ignored, even at startup, seconds.")


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
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.group = group
        self.pool: PoolSpec = kube.pool
        self.settings = settings
        self._monotonic = monotonic
        self.last_group_state: GroupState | None = None

    # -- observe ----------------------------------------------------------------------------------

    @contextmanager
    def sharing_reads(self) -> Iterator[None]:
        """The Kubernetes side's shared reads and, if it shares its own, the node group's
        (``controller.protocols.SharesReads``): within a tick, one read of the group serves
        ``state`` and ``scale`` for every model of the pool, until a write of the group's own."""
        with ExitStack() as stack:
            stack.enter_context(self.kube.sharing_reads())
            share = getattr(self.group, "sharing_reads", None)  # optional (providers.base.NodeGroup)
            if share is not None:
                stack.enter_context(share())
            yield

    def state(self, model: ModelSpec, now: datetime) -> PoolState:
        if self.group is None:
            return self.kube.state(model, now)
        g = self.group.describe(now)
        self.last_group_state = g
        self._note_capacity_error(g, now)
        obs = self.kube.observe(model, now, cloud_notices=g.notices,
                                instance_id_for=self.group.instance_id_for)
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

        # Within a tick: the tick's read of the group (the one ``state`` made), or the read made
        # after the group's last write, so a later model of the pool compares with what that
        # write left. The release below re-reads the cluster's side before choosing instances.
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


# --- wiring from the daemon config -------------------------------------------------------------


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
