"""Pools whose nodes Karpenter provisions: ``provider: karpenter``.

Why it exists: on a cluster where Karpenter (``karpenter.sh/v1``) brings nodes up for Pending pods
and takes them away when idle, resizing an Auto Scaling group behind its back would fight it. A
Karpenter pool is therefore its Kubernetes side alone (``providers.kubernetes``): tidegate sets
the replicas of the pool's Deployment, whose pods select one NodePool
(``karpenter.sh/nodepool``) and one capacity type (``karpenter.sh/capacity-type``: ``spot`` or
``on-demand``, from the pool's tier), and capacity comes and goes through Karpenter. What this
module adds is what Karpenter's own objects say about the pool, read every tick:

- **the NodePool** (cluster-scoped): its ``spec.limits`` bound the pool's nodes (the GPU limit
  over ``gpus_per_node``, and a ``nodes`` limit where one is set), reported as
  ``PoolState.max_nodes`` so that placement never plans past what Karpenter will launch (nodes
  the pool already has over a lowered limit still count: Karpenter keeps them); its
  ``spec.template.spec.requirements`` must allow the pool's capacity type;
- **its NodeClaims** (label ``karpenter.sh/nodepool``): provisioning progress (launched,
  registered, initialized), the nodes the pool is billed for (claims launched or launching, as a
  cloud pool counts instances), and launch failures: a claim whose ``Launched`` condition is
  ``False``, or one deleted before it launched (Karpenter deletes a NodeClaim whose launch met
  insufficient capacity), marks the pool unavailable for ``launch_failure_unavailable_s`` from the
  failure's time, as an Auto Scaling group's failed activity does (``providers.cloudpool``);
- **interruptions**: Karpenter's interruption handling deletes the NodeClaim and taints its node
  ``karpenter.sh/disrupted``; either, on a node holding the pool's pods, is an interruption notice
  (the replicas there are replaced elsewhere in the same tick and the pool's recent interruptions
  count it). Consolidation of an idle node is not counted (no pod of ours on it); give the pods
  ``karpenter.sh/do-not-disrupt: "true"`` so that Karpenter disrupts a busy node only when it
  must (spot interruption, expiry).

A Deployment whose pod template does not pin the NodePool and the capacity type (node selector,
or a required node affinity ``In`` that one value) could land on other capacity than its pool
says: the pool is then unavailable, with the fix in the reason, until the Deployment is fixed.

Reads only (get NodePools, list NodeClaims); nothing here writes to Karpenter's objects. Within a
tick each NodePool is read once and the NodeClaims by one LIST (selected here by NodePool), shared
by every model and pool (``providers.kubernetes.ClusterSnapshot``).
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from controller.core.model import Action, ModelSpec, PoolSpec, PoolState, Tier
from controller.errors import PermanentProviderError
from providers.base import Notice, NoticeKind, unavailable_reason
from providers.kubernetes import KubernetesPoolProvider
from providers.registry import BuildContext, PoolProviderKind, ProviderParts

logger = logging.getLogger("tidegate.providers.karpenter")

GROUP = "karpenter.sh"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
DISRUPTED_TAINT = "karpenter.sh/disrupted"
CAPACITY_TYPES: Mapping[Tier, str] = {Tier.SPOT: "spot", Tier.ONDEMAND: "on-demand"}
"""The ``karpenter.sh/capacity-type`` value of each tier a Karpenter pool may have."""


class KarpenterSettings(BaseModel):
    """``providers.settings.karpenter``: how Karpenter pools read Karpenter's objects."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_version: str = Field("v1", pattern=r"^v[0-9a-z]+$", description="Version of the karpenter.sh API to read NodePools and NodeClaims at (v1 since Karpenter 1.0).")
    launch_failure_unavailable_s: float = Field(180.0, gt=0, description="After a NodeClaim's launch fails (Launched=False, or the claim deleted before it launched, as Karpenter does on insufficient capacity) the pool is unavailable for this long from the failure's time, seconds (Karpenter itself caches insufficient capacity for 3 minutes).")
    launch_failure_max_age_s: float = Field(900.0, gt=0, description="Launch failures older than this are ignored, even at startup, seconds.")


class KarpenterPoolSettings(BaseModel):
    """``pools[].karpenter``: the NodePool behind the pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_pool: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="Name of the Karpenter NodePool whose nodes hold the pool (one NodePool per pool). The pool's Deployments must select it (karpenter.sh/nodepool) and the tier's capacity type (karpenter.sh/capacity-type: spot or on-demand).")


# --- reading Karpenter's objects (pure functions on the API's dicts) ------------------------------


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _time(raw: Any) -> datetime | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        t = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The status condition of type ``kind`` of a Karpenter object, if it has one."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def _true(obj: Mapping[str, Any], kind: str) -> bool:
    c = condition(obj, kind)
    return c is not None and c.get("status") == "True"


@dataclass(frozen=True, slots=True)
class ClaimsSummary:
    """What one tick read from a NodePool's NodeClaims."""

    launching: int = 0
    """Asked of the cloud, not launched yet."""
    registering: int = 0
    """Launched, the node not registered yet."""
    initializing: int = 0
    """Registered, not initialized yet (e.g. GPU drivers loading)."""
    ready: int = 0
    deleting: int = 0

    @property
    def billed(self) -> int:
        """Claims launched or launching and not being deleted: the nodes the pool pays for."""
        return self.launching + self.registering + self.initializing + self.ready


def summarize(claims: Sequence[Mapping[str, Any]]) -> ClaimsSummary:
    counts = {"launching": 0, "registering": 0, "initializing": 0, "ready": 0, "deleting": 0}
    for c in claims:
        if _meta(c).get("deletionTimestamp"):
            counts["deleting"] += 1
        elif failed_launch(c) is not None:
            continue
        elif not _true(c, "Launched"):
            counts["launching"] += 1
        elif not _true(c, "Registered"):
            counts["registering"] += 1
        elif not _true(c, "Initialized"):
            counts["initializing"] += 1
        else:
            counts["ready"] += 1
    return ClaimsSummary(**counts)


def failed_launch(claim: Mapping[str, Any]) -> tuple[str, str, datetime | None] | None:
    """(cause, message, when) if the claim's launch failed: ``Launched`` is ``False``, or the
    claim is being deleted without ever having launched (Karpenter's answer to insufficient
    capacity). ``None`` otherwise."""
    name = _meta(claim).get("name", "?")
    launched = condition(claim, "Launched")
    if launched is not None and launched.get("status") == "False":
        return (str(launched.get("reason") or "LaunchFailed"),
                f"NodeClaim {name}: {str(launched.get('message') or 'launch failed')[:200]}",
                _time(launched.get("lastTransitionTime")))
    deleted = _meta(claim).get("deletionTimestamp")
    if deleted and not _true(claim, "Launched"):
        return ("InsufficientCapacity", f"NodeClaim {name} deleted before it launched (Karpenter deletes a NodeClaim "
                "whose launch met insufficient capacity)", _time(deleted))
    return None


def interruption_notices(claims: Sequence[Mapping[str, Any]]) -> list[Notice]:
    """An interruption notice per launched NodeClaim being deleted, naming its node and its
    ``providerID`` (matched to the node's ``spec.providerID``)."""
    out = []
    for c in claims:
        meta, status = _meta(c), c.get("status") or {}
        if meta.get("deletionTimestamp") and _true(c, "Launched") and (status.get("nodeName") or status.get("providerID")):
            out.append(Notice(NoticeKind.INTERRUPTION, f"nodeclaim:{meta.get('name')} deleted",
                              _time(meta.get("deletionTimestamp")), node=status.get("nodeName"),
                              instance_id=status.get("providerID")))
    return out


def _count(raw: Any) -> int | None:
    """A plain count from a resource quantity (``16``, ``"16"``); ``None`` for anything else
    (a GPU or node limit is a whole number)."""
    try:
        value = float(str(raw))
    except ValueError:
        return None
    return int(value) if value >= 0 else None


def node_bound(node_pool: Mapping[str, Any], gpus_per_node: int, gpu_resource: str) -> int | None:
    """The most nodes the NodePool's ``spec.limits`` let the pool hold: the GPU limit over
    ``gpus_per_node`` and the ``nodes`` limit, the smaller; ``None`` without either."""
    limits = (node_pool.get("spec") or {}).get("limits") or {}
    bounds = []
    gpus = _count(limits[gpu_resource]) if gpu_resource in limits else None
    if gpus is not None:
        bounds.append(gpus // gpus_per_node)
    nodes = _count(limits["nodes"]) if "nodes" in limits else None
    if nodes is not None:
        bounds.append(nodes)
    return min(bounds) if bounds else None


def capacity_type_problem(node_pool: Mapping[str, Any], capacity_type: str) -> str | None:
    """Why the NodePool's requirements cannot launch ``capacity_type`` (``None``: they can)."""
    reqs = ((((node_pool.get("spec") or {}).get("template") or {}).get("spec") or {}).get("requirements")) or []
    for r in reqs:
        if not isinstance(r, Mapping) or r.get("key") != CAPACITY_TYPE_LABEL:
            continue
        values = list(r.get("values") or [])
        op = r.get("operator")
        if (op == "In" and capacity_type not in values) or (op == "NotIn" and capacity_type in values) or op == "DoesNotExist":
            return (f"NodePool {_meta(node_pool).get('name')} requires {CAPACITY_TYPE_LABEL} {op} {values}, "
                    f"so it cannot launch {capacity_type} nodes")
    return None


def _requires(pod_spec: Any, key: str, value: str) -> bool:
    """Whether a pod spec (``V1PodSpec``) keeps its pods on nodes labelled ``key=value``: by its
    node selector, or by a required node affinity whose every term has ``key In [value]``."""
    if pod_spec is None:
        return False
    if (pod_spec.node_selector or {}).get(key) == value:
        return True
    na = pod_spec.affinity.node_affinity if pod_spec.affinity is not None else None
    req = na.required_during_scheduling_ignored_during_execution if na is not None else None
    terms = (req.node_selector_terms if req is not None else None) or []
    return bool(terms) and all(
        any(e.key == key and e.operator == "In" and list(e.values or []) == [value] for e in t.match_expressions or [])
        for t in terms)


def pinning_problem(pod_spec: Any, node_pool: str, capacity_type: str, deployment: str) -> str | None:
    """Why a Deployment's pods could land outside the pool's NodePool or capacity type."""
    missing = [f"{k}: {v}" for k, v in ((NODEPOOL_LABEL, node_pool), (CAPACITY_TYPE_LABEL, capacity_type))
               if not _requires(pod_spec, k, v)]
    if not missing:
        return None
    return (f"Deployment {deployment} does not keep its pods on {' and '.join(missing)}; add them to its pod "
            "template's nodeSelector (or a required node affinity) so its replicas land on this pool's capacity")


# --- the pool provider ----------------------------------------------------------------------------


class KarpenterPoolProvider:
    """``PoolProvider`` for one Karpenter pool: ``kube`` (its Deployments, on nodes selected by
    ``karpenter.sh/nodepool``) plus what the NodePool and its NodeClaims say. ``scale`` sets
    replicas only: Karpenter brings the nodes."""

    provider = "karpenter"

    def __init__(self, kube: KubernetesPoolProvider, node_pool: str, *,
                 settings: KarpenterSettings = KarpenterSettings()) -> None:
        self.kube = kube
        self.pool: PoolSpec = kube.pool
        self.node_pool = node_pool
        self.settings = settings
        self.capacity_type = CAPACITY_TYPES[self.pool.tier]
        self.last_claims: ClaimsSummary | None = None
        self._marked: set[str] = set()

    def _what(self, thing: str) -> str:
        return f"{thing} of Karpenter NodePool {self.node_pool!r} (pool {self.pool.name!r})"

    def sharing_reads(self) -> AbstractContextManager[object]:
        """The Kubernetes side's shared reads (``controller.protocols.SharesReads``): within a tick
        the NodePool is read once and every NodeClaim by one LIST, for every model and pool."""
        return self.kube.sharing_reads()

    def state(self, model: ModelSpec, now: datetime) -> PoolState:
        snap, version = self.kube.cluster.snapshot(), self.settings.api_version
        problems: list[str] = []
        try:
            node_pool: Mapping[str, Any] = snap.cluster_object(GROUP, version, "nodepools", self.node_pool,
                                                               self._what("the NodePool"))
        except PermanentProviderError as e:  # a missing NodePool (404) or no right to read it
            node_pool = {}
            problems.append(str(e))
        claims = snap.cluster_objects(GROUP, version, "nodeclaims", f"{NODEPOOL_LABEL}={self.node_pool}")
        obs = self.kube.observe(model, now, cloud_notices=interruption_notices(claims),
                                instance_id_for=lambda provider_id: provider_id, idle_notices=False)
        self._note_failures(claims, now)
        summary = summarize(claims)
        if summary != self.last_claims:
            logger.info("karpenter_claims pool=%s nodepool=%s launching=%d registering=%d initializing=%d ready=%d deleting=%d",
                        self.pool.name, self.node_pool, summary.launching, summary.registering, summary.initializing,
                        summary.ready, summary.deleting,
                        extra={"event": "karpenter_claims", "pool": self.pool.name, "nodepool": self.node_pool,
                               "launching": summary.launching, "registering": summary.registering,
                               "initializing": summary.initializing, "ready": summary.ready, "deleting": summary.deleting})
        self.last_claims = summary
        if node_pool:
            problems += [p for p in [capacity_type_problem(node_pool, self.capacity_type)] if p]
        ref = self.kube.deployments.get(model.name)
        if ref is not None:
            bad = pinning_problem(obs.pod_spec, self.node_pool, self.capacity_type, f"{ref.namespace}/{ref.name}")
            problems += [bad] if bad else []
        st = self.kube.to_state(obs, now, nodes=summary.billed)
        bound = node_bound(node_pool, self.pool.gpus_per_node, self.kube.settings.gpu_resource) if node_pool else None
        # A limit stops new launches; Karpenter keeps the nodes it already has over it (a lowered
        # limit), so those are no reason to move replicas away.
        st = replace(st, max_nodes=None if bound is None else max(bound, summary.billed))
        if problems and st.available:
            st = replace(st, available=False,
                         unavailable_reason=unavailable_reason(self.pool, "Misconfigured", "; ".join(problems)))
        return st

    def _note_failures(self, claims: Sequence[Mapping[str, Any]], now: datetime) -> None:
        s = self.settings
        self._marked &= {str(_meta(c).get("uid") or _meta(c).get("name")) for c in claims}
        for c in claims:
            failed = failed_launch(c)
            if failed is None:
                continue
            cause, message, at = failed
            at = at or now
            if (now - at).total_seconds() > s.launch_failure_max_age_s:
                continue
            until = at + timedelta(seconds=s.launch_failure_unavailable_s)
            if until <= now:
                continue
            self.kube.marks.mark(self.pool.name, until, unavailable_reason(self.pool, cause, message))
            key = str(_meta(c).get("uid") or _meta(c).get("name"))
            if key not in self._marked:
                self._marked.add(key)
                logger.warning("karpenter_launch_failed pool=%s nodepool=%s cause=%s until=%s: %s", self.pool.name,
                               self.node_pool, cause, f"{until:%Y-%m-%dT%H:%M:%SZ}", message,
                               extra={"event": "karpenter_launch_failed", "pool": self.pool.name,
                                      "nodepool": self.node_pool, "cause": cause, "detail": message})

    def scale(self, model: ModelSpec, replicas: int, nodes: int, now: datetime) -> Sequence[Action]:
        """Set the model's replicas in this pool; ``nodes`` is Karpenter's business."""
        return self.kube.scale(model, replicas, nodes, now)


class KarpenterProvider(PoolProviderKind):
    """``provider: karpenter``: spot or on-demand nodes of one Karpenter NodePool per pool."""

    name = "karpenter"
    tiers = frozenset({Tier.SPOT, Tier.ONDEMAND})
    description = ("Nodes of a Karpenter NodePool: tidegate scales the pool's Deployments, Karpenter brings the nodes; "
                   "NodeClaims report launches, failures and interruptions, the NodePool's limits bound the pool.")
    interruption_notice_s = 120.0
    """EC2's two-minute spot warning, which Karpenter's interruption queue receives."""
    Settings = KarpenterSettings
    PoolSettings = KarpenterPoolSettings

    def build(self, pools: Sequence[Any], ctx: BuildContext) -> ProviderParts:
        settings = ctx.settings if isinstance(ctx.settings, KarpenterSettings) else KarpenterSettings()
        out: dict[str, Any] = {}
        for pc in pools:
            base: KubernetesPoolProvider = ctx.kube(pc)
            ks = base.settings.model_copy(update={"extra_interruption_taints": {
                **base.settings.extra_interruption_taints, DISRUPTED_TAINT: NoticeKind.INTERRUPTION}})
            kube = KubernetesPoolProvider(
                base.pool, base.deployments, base.cluster, settings=ks,
                node_selector={**pc.kubernetes.node_selector, NODEPOOL_LABEL: pc.karpenter.node_pool})
            out[pc.name] = KarpenterPoolProvider(kube, pc.karpenter.node_pool, settings=settings)
        return ProviderParts(providers=out)


__all__ = [
    "CAPACITY_TYPES", "CAPACITY_TYPE_LABEL", "ClaimsSummary", "DISRUPTED_TAINT", "GROUP", "KarpenterPoolProvider",
    "KarpenterPoolSettings", "KarpenterProvider", "KarpenterSettings", "NODEPOOL_LABEL", "capacity_type_problem",
    "condition", "failed_launch", "interruption_notices", "node_bound", "pinning_problem", "summarize",
]
