"""Kubernetes side of every pool: the per-model Deployment, the pool's nodes, capacity trouble and
interruption notices, through the official ``kubernetes`` client.

Why it exists: the placement the core decides becomes ``spec.replicas`` on one Deployment per model
and pool, set through the scale subresource (what HPA and ``kubectl scale`` use, so RBAC can grant
exactly that). What the pool can actually hold is read back from the cluster: desired, ready and
unavailable replicas; the pool's nodes (by label selector) with their allocatable GPUs; pods that
cannot be scheduled (a pool that leaves replicas Pending past a timeout is marked unavailable for a
while, as Karpenter caches insufficient capacity); and nodes about to disappear, from the taints
that the AWS node termination handler, GKE and the cloud controllers put on them, plus notices the
cloud adapters hand in (SQS events, preempted instances), mapped to nodes by ``spec.providerID``.

Reads per tick: the pools of one cluster share one ``ClusterSnapshot`` for the tick (the
``Controller`` opens it: ``controller.protocols.SharesReads``): one LIST of Deployments and one of
pods per namespace, one LIST of nodes, whatever the number of models and pools, each Deployment's
and pool's label selector applied here. A fleet of N models in P pools in one namespace costs 3
reads a tick, not 4 x N x P (a GET of each Deployment, a LIST of its pods, a LIST of the pool's
nodes and a GET of its scale). Nothing read outlives its tick: outside one every call reads afresh.

Safety: scaling is declarative and idempotent (patch only on a difference, with the
``resourceVersion`` of the read compared against, so a concurrent writer causes a 409 instead of a
lost update; a 409 is re-read and retried, never an error on its own). A node is released only
after a fresh read of the pods and nodes, not the tick's. Errors are translated into the project's
tree (``raise ... from e``): 409/429/5xx/network are transient; a configured Deployment that does
not exist is a permanent error naming the model and pool, so only that model stops.

The API server is not asked to filter: the lists are selected on the client side, so a server that
ignores selectors (an emulator, an aggregated API) cannot make a pool count pods or nodes that are
not its own.
"""

from __future__ import annotations

import os
import re
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, Mapping, Protocol, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.core.model import Action, ActionStatus, ModelSpec, PoolSpec, PoolState, Tier
from controller.errors import ConflictError, PermanentProviderError, ProviderError, TransientProviderError
from providers.base import (
    ActionLog, Notice, NoticeKind, ReadMemo, RetryPolicy, UnavailableMarks, retry_transient, unavailable_reason,
)
from providers.registry import PoolProviderKind

if TYPE_CHECKING:  # the client library is imported when a cluster is reached: the settings, the
    # onprem kind and the selector helpers load without its thousands of classes (the simulator
    # and the config loader use them)
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

T = TypeVar("T")

PROVIDER = "kubernetes"
CALL_SCALE = "patch_namespaced_deployment_scale"
CALL_DELETION_COST = "patch_namespaced_pod"
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
"""The ReplicaSet controller removes pods with the lowest cost first when scaling in."""
NOTICED_POD_DELETION_COST = -1000

INTERRUPTION_TAINTS: Mapping[str, NoticeKind] = MappingProxyType({
    # aws-node-termination-handler (TAINT_NODE=true): spot interruption, ASG scale-in lifecycle
    # hook, scheduled maintenance, and the softer rebalance recommendation.
    "aws-node-termination-handler/spot-itn": NoticeKind.INTERRUPTION,
    "aws-node-termination-handler/asg-lifecycle-termination": NoticeKind.INTERRUPTION,
    "aws-node-termination-handler/scheduled-maintenance": NoticeKind.INTERRUPTION,
    "aws-node-termination-handler/rebalance-recommendation": NoticeKind.REBALANCE,
    # GKE (and GoogleCloudPlatform/k8s-node-termination-handler) before a spot/preemptible VM stops.
    "cloud.google.com/impending-node-termination": NoticeKind.INTERRUPTION,
    # The cloud controller manager once the instance is shut down, and the out-of-service taint an
    # operator (or tooling) sets after a non-graceful shutdown: the node is gone already.
    "node.cloudprovider.kubernetes.io/shutdown": NoticeKind.INTERRUPTION,
    "node.kubernetes.io/out-of-service": NoticeKind.INTERRUPTION,
})
"""Node taint keys that announce the node's loss, and how strongly."""


# --- settings ----------------------------------------------------------------------------------


class KubernetesSettings(BaseModel):
    """``providers.settings.kubernetes``: how to reach the cluster's API server, and how the
    Kubernetes side of every pool judges capacity trouble and interruptions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str | None = Field(None, description="API server URL without credentials (kubectl proxy, tests). Unset: in-cluster or kubeconfig.")
    kubeconfig: str | None = Field(None, description="Path of a kubeconfig file. Unset: the default (KUBECONFIG or ~/.kube/config) when not in a cluster.")
    context: str | None = Field(None, description="kubeconfig context. Unset: the file's current context.")
    in_cluster: bool | None = Field(None, description="Use the pod's service account. Unset: yes when KUBERNETES_SERVICE_HOST is set and no host or kubeconfig is given.")
    verify_ssl: bool = Field(True, description="Verify the API server's certificate when `host` is used.")
    unschedulable_timeout_s: float = Field(120.0, ge=0, description="A replica Pending as unschedulable longer than this (plus the pool's provisioning delay) marks the pool unavailable, seconds.")
    unavailable_for_s: float = Field(180.0, gt=0, description="How long that mark lasts before the pool is tried again, seconds (Karpenter caches insufficient capacity for 3 minutes).")
    interruption_window_s: float = Field(3600.0, gt=0, description="Interruption notices seen within this window count as the pool's recent interruptions, seconds.")
    gpu_resource: str = Field("nvidia.com/gpu", description="Extended resource name of the GPUs in node allocatable.")
    request_timeout_s: float = Field(5.0, gt=0, description="Timeout of one API request, seconds.")
    extra_interruption_taints: dict[str, NoticeKind] = Field(default_factory=dict, description="Taint keys that announce a node's loss (interruption or rebalance), added to the built-in ones (aws-node-termination-handler, GKE impending termination, shutdown, out-of-service).")
    interruption_condition_types: list[str] = Field(default_factory=list, description="Node condition types that, when True, announce the node's loss (e.g. a node-problem-detector TerminationScheduled).")
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="Backoff for transient API errors and scale conflicts (409).")

    @model_validator(mode="after")
    def _one_way_in(self) -> "KubernetesSettings":
        if self.in_cluster and (self.host is not None or self.kubeconfig is not None):
            raise ValueError(f"in_cluster: true excludes host ({self.host!r}) and kubeconfig ({self.kubeconfig!r})")
        if self.host is not None and self.kubeconfig is not None:
            raise ValueError(f"set host ({self.host!r}) or kubeconfig ({self.kubeconfig!r}), not both")
        return self

    @property
    def interruption_taints(self) -> Mapping[str, NoticeKind]:
        """The built-in ``INTERRUPTION_TAINTS`` plus ``extra_interruption_taints``."""
        return {**INTERRUPTION_TAINTS, **self.extra_interruption_taints}

    def use_in_cluster(self, environ: Mapping[str, str] | None = None) -> bool:
        if self.in_cluster is not None:
            return self.in_cluster
        env = os.environ if environ is None else environ
        return self.host is None and self.kubeconfig is None and bool(env.get("KUBERNETES_SERVICE_HOST"))

    def api_client(self) -> k8s.ApiClient:
        return make_api_client(host=self.host, kubeconfig=self.kubeconfig, context=self.context,
                               in_cluster=self.use_in_cluster(), verify_ssl=self.verify_ssl)


class DeploymentRef(Protocol):
    """Where a model's Deployment lives in one pool (``controller.config.DeploymentRef`` fits)."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def label_selector(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Deployment:
    """A plain ``DeploymentRef`` for code and tests that do not load a config file."""

    namespace: str
    name: str
    label_selector: str | None = None


# --- label selectors ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Requirement:
    """One term of a label selector."""

    key: str
    op: str
    """``=``, ``!=``, ``in``, ``notin``, ``exists`` or ``!exists``."""
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # != and notin match objects without the label too (as the API server does).
        return not present or labels[self.key] not in self.values


_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<vals>[^()]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<val>{_VALUE})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(?P<neg>!)?\s*(?P<key>{_KEY})\s*$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ')' in selector {text!r}")
        if ch == "," and depth == 0:
            terms.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '(' in selector {text!r}")
    terms.append("".join(cur))
    return terms


def parse_selector(text: str | None) -> tuple[Requirement, ...]:
    """Parse a label selector string (``a=b,c!=d,e in (f,g),h notin (i),j,!k``) as the API server
    does. The empty selector matches everything. Raises ``ValueError`` on bad syntax."""
    if text is None or not text.strip():
        return ()
    out: list[Requirement] = []
    for term in _split_terms(text):
        if not term.strip():
            raise ValueError(f"empty term in selector {text!r}")
        if m := _SET_RE.match(term):
            vals = frozenset(v.strip() for v in m["vals"].split(",") if v.strip())
            bad = [v for v in vals if not _VALUE_RE.match(v)]
            if bad or not vals:
                raise ValueError(f"bad value set in selector term {term.strip()!r}")
            out.append(Requirement(m["key"], m["op"], vals))
        elif m := _EQ_RE.match(term):
            out.append(Requirement(m["key"], "!=" if m["op"] == "!=" else "=", frozenset({m["val"]})))
        elif m := _EXISTS_RE.match(term):
            out.append(Requirement(m["key"], "!exists" if m["neg"] else "exists"))
        else:
            raise ValueError(f"cannot parse selector term {term.strip()!r} in {text!r}")
    return tuple(out)


def selector_matches(labels: Mapping[str, str] | None, selector: str | Sequence[Requirement] | None) -> bool:
    reqs = parse_selector(selector) if selector is None or isinstance(selector, str) else selector
    lab = labels or {}
    return all(r.matches(lab) for r in reqs)


def selector_from_labels(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def selector_from_label_selector(sel: k8s.V1LabelSelector | None) -> str:
    """The string form of a structured ``V1LabelSelector`` (match_labels and match_expressions)."""
    if sel is None:
        return ""
    terms = [f"{k}={v}" for k, v in sorted((sel.match_labels or {}).items())]
    for expr in sel.match_expressions or []:
        op = expr.operator
        vals = ",".join(sorted(expr.values or []))
        if op == "In":
            terms.append(f"{expr.key} in ({vals})")
        elif op == "NotIn":
            terms.append(f"{expr.key} notin ({vals})")
        elif op == "Exists":
            terms.append(expr.key)
        elif op == "DoesNotExist":
            terms.append(f"!{expr.key}")
        else:
            raise ValueError(f"unknown label selector operator {op!r} for key {expr.key!r}")
    return ",".join(terms)


# --- errors ------------------------------------------------------------------------------------


def _api_message(e: ApiException) -> str:
    import json

    try:
        body = json.loads(e.body) if e.body else {}
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])[:300]
    except (ValueError, TypeError):
        pass
    return str(e.reason or "")[:300]


def translate_api_error(e: BaseException, what: str) -> ProviderError:
    """Map a client error onto the project's tree. Use as ``raise translate_api_error(e, w) from e``.

    409 is a ``ConflictError`` (re-read and retry); 429, 5xx and network trouble are transient;
    404 names ``what`` (say, the model's Deployment) as missing, permanently; 401/403 and other
    4xx are permanent (fix the config or RBAC; retrying changes nothing)."""
    import urllib3  # the client's transport: loaded with it (a daemon that never reaches a cluster does without)
    from kubernetes.client.exceptions import ApiException

    if isinstance(e, ApiException):
        status = int(e.status or 0)
        msg = _api_message(e)
        if status == 409:
            return ConflictError(f"{what}: conflict (409): {msg}")
        if status == 404:
            return PermanentProviderError(f"{what} not found (404): {msg}")
        if status in (401, 403):
            return PermanentProviderError(f"{what}: not allowed ({status}): {msg}")
        if status == 0 or status == 429 or status >= 500:
            return TransientProviderError(f"{what}: API server answered {status}: {msg}")
        return PermanentProviderError(f"{what}: rejected ({status}): {msg}")
    if isinstance(e, (urllib3.exceptions.HTTPError, OSError, TimeoutError)):
        return TransientProviderError(f"{what}: {type(e).__name__}: {e}")
    return PermanentProviderError(f"{what}: unexpected {type(e).__name__}: {e}")


# --- reading nodes and pods (pure functions on client model objects) ---------------------------


def node_ready(node: k8s.V1Node) -> bool:
    for c in (node.status.conditions if node.status else None) or []:
        if c.type == "Ready":
            return bool(c.status == "True")
    return False


def node_schedulable(node: k8s.V1Node) -> bool:
    return not (node.spec and node.spec.unschedulable)


def node_allocatable_gpus(node: k8s.V1Node, resource: str = "nvidia.com/gpu") -> int:
    alloc = (node.status.allocatable if node.status else None) or {}
    raw = alloc.get(resource)
    try:
        return int(str(raw)) if raw is not None else 0
    except ValueError:
        return 0


def _aware(t: datetime | None) -> datetime | None:
    if t is None:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def node_notices(node: k8s.V1Node, taints: Mapping[str, NoticeKind] = INTERRUPTION_TAINTS,
                 condition_types: Sequence[str] = ()) -> list[Notice]:
    """Interruption / rebalance notices a node carries as taints or (configured) conditions."""
    name = node.metadata.name if node.metadata else None
    out: list[Notice] = []
    for t in (node.spec.taints if node.spec else None) or []:
        kind = taints.get(t.key)
        if kind is not None:
            out.append(Notice(kind, f"taint:{t.key}", _aware(t.time_added), node=name))
    for c in (node.status.conditions if node.status else None) or []:
        if c.type in condition_types and c.status == "True":
            out.append(Notice(NoticeKind.INTERRUPTION, f"condition:{c.type}",
                              _aware(c.last_transition_time), node=name))
    return out


def pod_terminal(pod: k8s.V1Pod) -> bool:
    return bool(pod.status and pod.status.phase in ("Succeeded", "Failed"))


def pod_unschedulable(pod: k8s.V1Pod) -> bool:
    """Pending and judged unschedulable by the scheduler (``PodScheduled=False``, reason
    ``Unschedulable``)."""
    if not pod.status or pod.status.phase != "Pending" or (pod.spec and pod.spec.node_name):
        return False
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in pod.status.conditions or [])


def pod_unschedulable_since(pod: k8s.V1Pod) -> datetime | None:
    """When an unschedulable pod became so: the condition's transition time, else the pod's
    creation time; ``None`` when the pod is not unschedulable or carries neither timestamp."""
    if not pod_unschedulable(pod) or pod.status is None:
        return None
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.last_transition_time is not None:
            return _aware(c.last_transition_time)
    return _aware(pod.metadata.creation_timestamp if pod.metadata else None)


def _pod_message(pod: k8s.V1Pod) -> str:
    for c in (pod.status.conditions if pod.status else None) or []:
        if c.type == "PodScheduled" and c.message:
            return str(c.message)[:200]
    return "unschedulable"


# --- API access --------------------------------------------------------------------------------


def make_api_client(*, host: str | None = None, kubeconfig: str | None = None, context: str | None = None,
                    in_cluster: bool = False, verify_ssl: bool = True) -> k8s.ApiClient:
    """An ``ApiClient`` from in-cluster credentials, a kubeconfig file, or a bare ``host`` URL
    (tests and ``kubectl proxy``)."""
    from kubernetes import client as k8s
    from kubernetes import config as kconfig

    if in_cluster:
        cfg = k8s.Configuration()
        kconfig.load_incluster_config(client_configuration=cfg)
        return k8s.ApiClient(cfg)
    if host is not None and kubeconfig is None:
        cfg = k8s.Configuration(host=host)
        cfg.verify_ssl = verify_ssl
        return k8s.ApiClient(cfg)
    return kconfig.new_client_from_config(config_file=kubeconfig, context=context)


class KubernetesCluster:
    """The calls tidegate makes to one API server, errors translated, reads retried.

    Reads go through a ``ClusterSnapshot`` (``snapshot()``): while ``sharing_reads()`` is open (the
    ``Controller`` holds it open for each tick) every pool provider on this cluster shares one, so
    a tick lists each namespace's Deployments and pods and the nodes once, whatever the number of
    models and pools; outside it each caller gets a fresh one, so nothing read serves a later tick."""

    def __init__(self, api_client: k8s.ApiClient, settings: KubernetesSettings = KubernetesSettings(),
                 *, sleep: Callable[[float], None] = time.sleep) -> None:
        from kubernetes import client as k8s

        self.api_client = api_client
        self.apps = k8s.AppsV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.settings = settings
        self._sleep = sleep
        self.shared: ClusterSnapshot | None = None
        """The snapshot every caller shares while ``sharing_reads()`` is open; ``None`` outside."""

    @contextmanager
    def sharing_reads(self) -> Iterator[ClusterSnapshot]:
        """Share one snapshot among every caller until the block ends. A block opened inside
        another shares the outer one, which alone ends it (the pools of one cluster each open one)."""
        if self.shared is not None:
            yield self.shared
            return
        self.shared = ClusterSnapshot(self)
        try:
            yield self.shared
        finally:
            self.shared = None

    def snapshot(self) -> ClusterSnapshot:
        """The shared snapshot while ``sharing_reads()`` is open, else a fresh one for one caller."""
        return self.shared if self.shared is not None else ClusterSnapshot(self)

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        import urllib3
        from kubernetes.client.exceptions import ApiException

        try:
            return fn()
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            raise translate_api_error(e, what) from e

    def _read(self, what: str, fn: Callable[[], Any]) -> Any:
        value, _ = retry_transient(lambda: self._call(what, fn), self.settings.retry, sleep=self._sleep)
        return value

    def list_deployments(self, namespace: str, what: str) -> list[k8s.V1Deployment]:
        """Every Deployment of ``namespace`` (one LIST)."""
        t = self.settings.request_timeout_s
        return list(self._read(what, lambda: self.apps.list_namespaced_deployment(
            namespace, _request_timeout=t)).items or [])

    def read_scale(self, namespace: str, name: str, what: str) -> k8s.V1Scale:
        t = self.settings.request_timeout_s
        return self._read(what, lambda: self.apps.read_namespaced_deployment_scale(name, namespace, _request_timeout=t))

    def patch_scale(self, namespace: str, name: str, replicas: int, resource_version: str | None,
                    what: str) -> k8s.V1Scale:
        """One patch of ``spec.replicas``; with ``resource_version`` the server refuses (409) if the
        object changed since it was read. Not retried here: the caller re-reads first."""
        body: dict[str, Any] = {"spec": {"replicas": replicas}}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        t = self.settings.request_timeout_s
        return self._call(what, lambda: self.apps.patch_namespaced_deployment_scale(
            name, namespace, body, _request_timeout=t))

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str], what: str) -> bool:
        """Merge ``annotations`` into a pod; ``False`` if the pod is gone already (not an error)."""
        t = self.settings.request_timeout_s
        try:
            self._call(what, lambda: self.core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": dict(annotations)}}, _request_timeout=t))
        except PermanentProviderError as e:
            from kubernetes.client.exceptions import ApiException

            if isinstance(e.__cause__, ApiException) and e.__cause__.status == 404:
                return False
            raise
        return True

    def list_pods(self, namespace: str, what: str) -> list[k8s.V1Pod]:
        """Every pod of ``namespace`` (one LIST; ``ClusterSnapshot.pods`` selects)."""
        t = self.settings.request_timeout_s
        return list(self._read(what, lambda: self.core.list_namespaced_pod(namespace, _request_timeout=t)).items or [])

    def list_nodes(self, what: str) -> list[k8s.V1Node]:
        """Every node (one LIST; ``ClusterSnapshot.nodes`` selects)."""
        t = self.settings.request_timeout_s
        return list(self._read(what, lambda: self.core.list_node(_request_timeout=t)).items or [])

    def get_cluster_object(self, group: str, version: str, plural: str, name: str, what: str) -> dict[str, Any]:
        """One cluster-scoped custom object (e.g. a Karpenter NodePool), as a dict."""
        from kubernetes import client as k8s

        api, t = k8s.CustomObjectsApi(self.api_client), self.settings.request_timeout_s
        return dict(self._read(what, lambda: api.get_cluster_custom_object(group, version, plural, name,
                                                                            _request_timeout=t)))

    def list_cluster_objects(self, group: str, version: str, plural: str, what: str) -> list[dict[str, Any]]:
        """Every cluster-scoped custom object of a kind (one LIST; ``ClusterSnapshot`` selects)."""
        from kubernetes import client as k8s

        api, t = k8s.CustomObjectsApi(self.api_client), self.settings.request_timeout_s
        body = self._read(what, lambda: api.list_cluster_custom_object(group, version, plural, _request_timeout=t))
        items = body.get("items") if isinstance(body, dict) else None
        return [o for o in items or [] if isinstance(o, dict)]


class LabelIndex(Generic[T]):
    """Objects listed once, indexed by each of their labels, so that selecting with a selector
    that has an equality term (``app=llama``, ``pool in (a)``) looks only at the objects carrying
    that label value: a tick that selects each of a thousand Deployments' pods out of one list of
    the namespace stays linear in the pods, not in pods times Deployments."""

    def __init__(self, items: Sequence[T], labels_of: Callable[[T], Mapping[str, str] | None]) -> None:
        self.items = list(items)
        self._labels_of = labels_of
        self._by_label: dict[tuple[str, str], list[T]] = {}
        for x in self.items:
            for label in (labels_of(x) or {}).items():
                self._by_label.setdefault(label, []).append(x)

    def select(self, reqs: Sequence[Requirement]) -> list[T]:
        """The objects ``reqs`` match, in the order listed (as ``selector_matches`` decides)."""
        candidates = self.items
        for r in reqs:
            if r.op in ("=", "in") and len(r.values) == 1:
                (value,) = r.values
                found = self._by_label.get((r.key, value), [])
                if len(found) < len(candidates):
                    candidates = found
        return [x for x in candidates if selector_matches(self._labels_of(x), reqs)]


def _labels(obj: Any) -> Mapping[str, str] | None:
    """A client model object's labels."""
    return obj.metadata.labels if obj.metadata else None


def _dict_labels(obj: Mapping[str, Any]) -> Mapping[str, str] | None:
    """A custom object's (a dict's) labels."""
    return (obj.get("metadata") or {}).get("labels")


class ClusterSnapshot(ReadMemo):
    """The cluster as read once for every model and pool that asks while it lives: each
    namespace's Deployments and pods and the nodes, each by one LIST on first use, selected here
    by each Deployment's and pool's label selector (the API server is not asked to filter, so a
    server that ignores selectors cannot make a pool count what is not its own); Karpenter's
    NodePools and NodeClaims likewise. A read that failed is remembered as failed: the callers
    after the first get its error at once, so an unreachable API server costs a tick one retry
    budget per list, not one per model and pool.

    ``once`` also keeps what a caller derives from the reads (a pool's ``NodeInfo`` list), so a
    pool's nodes are interpreted once however many models ask."""

    def __init__(self, cluster: KubernetesCluster) -> None:
        super().__init__()
        self.cluster = cluster

    def deployment(self, namespace: str, name: str, what: str) -> k8s.V1Deployment:
        """The Deployment ``namespace/name``; a permanent error naming ``what`` if the namespace
        has none of that name."""
        found: dict[str, k8s.V1Deployment] = self.once(("deployments", namespace), lambda: {
            d.metadata.name: d for d in self.cluster.list_deployments(namespace, f"Deployments of namespace {namespace!r}")
            if d.metadata and d.metadata.name})
        dep = found.get(name)
        if dep is None:
            raise PermanentProviderError(f"{what} not found: namespace {namespace!r} has no Deployment {name!r} "
                                         f"(it has {len(found)})")
        return dep

    def pods(self, namespace: str, selector: str) -> list[k8s.V1Pod]:
        """The pods of ``namespace`` that ``selector`` matches."""
        index: LabelIndex[k8s.V1Pod] = self.once(("pods", namespace), lambda: LabelIndex(
            self.cluster.list_pods(namespace, f"pods of namespace {namespace!r}"), _labels))
        return self.once(("pods", namespace, selector), lambda: index.select(parse_selector(selector)))

    def nodes(self, selector: str) -> list[k8s.V1Node]:
        """The nodes that ``selector`` matches (``""``: every node)."""
        index: LabelIndex[k8s.V1Node] = self.once(("nodes",), lambda: LabelIndex(
            self.cluster.list_nodes("nodes"), _labels))
        return self.once(("nodes", selector), lambda: index.select(parse_selector(selector)))

    def cluster_object(self, group: str, version: str, plural: str, name: str, what: str) -> dict[str, Any]:
        """One cluster-scoped custom object by name (one GET per name)."""
        return self.once(("object", group, version, plural, name),
                         lambda: self.cluster.get_cluster_object(group, version, plural, name, what))

    def cluster_objects(self, group: str, version: str, plural: str, selector: str) -> list[dict[str, Any]]:
        """The cluster-scoped custom objects of a kind that ``selector`` matches."""
        index: LabelIndex[dict[str, Any]] = self.once(("objects", group, version, plural), lambda: LabelIndex(
            self.cluster.list_cluster_objects(group, version, plural, f"{plural}.{group}"), _dict_labels))
        return self.once(("objects", group, version, plural, selector), lambda: index.select(parse_selector(selector)))


def spec_replicas(dep: k8s.V1Deployment) -> int:
    """A Deployment's ``spec.replicas`` (the API defaults an absent one to 1)."""
    return dep.spec.replicas if dep.spec and dep.spec.replicas is not None else 1


# --- observation -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    ready: bool
    schedulable: bool
    gpus_allocatable: int
    provider_id: str | None
    notices: tuple[Notice, ...] = ()

    @property
    def noticed(self) -> bool:
        """Under an interruption notice (rebalance recommendations do not count)."""
        return any(n.kind is NoticeKind.INTERRUPTION for n in self.notices)


@dataclass(frozen=True, slots=True)
class PoolObservation:
    """Everything one ``observe`` read about one model in one pool."""

    model: str
    pool: str
    at: datetime
    replicas: int | None
    ready_replicas: int | None
    unavailable_replicas: int | None
    selector: str
    nodes: tuple[NodeInfo, ...]
    pods_by_node: Mapping[str, int]
    """This model's live pods per node name."""
    unschedulable_pods: int
    oldest_unschedulable_s: float | None
    interrupted_replicas: int
    notices: tuple[Notice, ...]
    namespace: str = ""
    noticed_pods: tuple[str, ...] = ()
    """Names of this model's pods on nodes under an interruption notice."""
    pod_spec: Any = None
    """The Deployment's pod template spec (``V1PodSpec``: node selector, affinity), as read."""
    scheduled_replicas: int | None = None
    """This model's pods bound to a node and not being deleted (ready, or starting there);
    ``None``: not counted."""

    @property
    def gpus_allocatable(self) -> int:
        return sum(n.gpus_allocatable for n in self.nodes if n.ready)


class KubernetesPoolProvider:
    """``PoolProvider`` for one pool whose nodes are not ordered by tidegate (on-prem), and the
    Kubernetes half of every cloud pool (``providers.cloudpool.CloudPoolProvider``).

    ``deployments`` maps model names to their Deployment in this pool; ``node_selector`` is the
    pool's node labels (``PoolConfig.kubernetes.node_selector``)."""

    provider = PROVIDER
    scale_call = CALL_SCALE

    def __init__(
        self,
        pool: PoolSpec,
        deployments: Mapping[str, DeploymentRef],
        cluster: KubernetesCluster,
        *,
        node_selector: Mapping[str, str] | None = None,
        settings: KubernetesSettings | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.deployments = dict(deployments)
        self.cluster = cluster
        self.node_selector = selector_from_labels(node_selector or {})
        self.settings = settings or cluster.settings
        self.marks = UnavailableMarks()
        self._monotonic = monotonic
        self._first_seen: dict[str, dict[str, datetime]] = {}
        """Per model: when each timestamp-less unschedulable pod was first seen."""
        self._notices_seen: dict[str, datetime] = {}
        self._last: dict[str, PoolObservation] = {}

    # -- helpers ----------------------------------------------------------------------------------

    def _ref(self, model: str) -> DeploymentRef:
        ref = self.deployments.get(model)
        if ref is None:
            raise PermanentProviderError(
                f"model {model!r} has no Deployment in pool {self.pool.name!r} (it serves {sorted(self.deployments)})")
        return ref

    def _what(self, model: str, ref: DeploymentRef) -> str:
        return f"Deployment {ref.namespace}/{ref.name} of model {model!r} in pool {self.pool.name!r}"

    def sharing_reads(self) -> AbstractContextManager[ClusterSnapshot]:
        """Share the cluster's reads among every model and every pool on it until the block ends
        (``controller.protocols.SharesReads``: the ``Controller`` holds it open for a tick)."""
        return self.cluster.sharing_reads()

    def pool_nodes(self, selector: str | None = None, *, snapshot: ClusterSnapshot | None = None) -> list[NodeInfo]:
        """The pool's nodes (``selector``: another label selector; ``""`` for every node), read
        from ``snapshot`` (default: the cluster's, shared within a tick)."""
        snap = snapshot or self.cluster.snapshot()
        sel = self.node_selector if selector is None else selector
        return snap.once((self, "nodes", sel), lambda: self._node_infos(snap.nodes(sel)))

    def _node_infos(self, nodes: Sequence[k8s.V1Node]) -> list[NodeInfo]:
        s = self.settings
        out = []
        for n in nodes:
            if n.metadata is None or not n.metadata.name:
                continue  # the API always names a node; nothing to act on without one
            out.append(NodeInfo(
                name=n.metadata.name, ready=node_ready(n), schedulable=node_schedulable(n),
                gpus_allocatable=node_allocatable_gpus(n, s.gpu_resource),
                provider_id=n.spec.provider_id if n.spec else None,
                notices=tuple(node_notices(n, s.interruption_taints, s.interruption_condition_types))))
        return out

    def _selector(self, ref: DeploymentRef, snapshot: ClusterSnapshot, what: str) -> str:
        """The configured pod selector, else the Deployment's own."""
        if ref.label_selector:
            return ref.label_selector
        dep = snapshot.deployment(ref.namespace, ref.name, what)
        return selector_from_label_selector(dep.spec.selector if dep.spec else None)

    # -- observe ----------------------------------------------------------------------------------

    def observe(
        self,
        model: ModelSpec,
        now: datetime,
        *,
        cloud_notices: Sequence[Notice] = (),
        instance_id_for: Callable[[str], str | None] | None = None,
        idle_notices: bool = True,
    ) -> PoolObservation:
        """Read the model's Deployment, its pods and the pool's nodes (from the cluster's snapshot:
        within a tick, one list each for every model and pool); update the unavailable mark and
        the interruption counter. ``cloud_notices`` (by instance id) are mapped onto nodes
        through ``instance_id_for(node.spec.providerID)``. ``idle_notices=False``: only notices on
        nodes holding this model's pods count as interruptions (a provider that also removes idle
        nodes on its own, as Karpenter's consolidation does, is not interrupting anything)."""
        ref = self._ref(model.name)
        what = self._what(model.name, ref)
        snap = self.cluster.snapshot()
        dep = snap.deployment(ref.namespace, ref.name, what)
        selector = self._selector(ref, snap, what)
        pods = snap.pods(ref.namespace, selector)
        nodes = self.pool_nodes(snapshot=snap)

        # Cloud notices name instances; attach them to the nodes they back.
        by_instance: dict[str, NodeInfo] = {}
        if instance_id_for is not None:
            for n in nodes:
                iid = instance_id_for(n.provider_id) if n.provider_id else None
                if iid:
                    by_instance[iid] = n
        extra: dict[str, list[Notice]] = {}
        loose: list[Notice] = []
        for notice in cloud_notices:
            node = by_instance.get(notice.instance_id or "")
            if node is not None:
                extra.setdefault(node.name, []).append(
                    Notice(notice.kind, notice.source, notice.at, node=node.name, instance_id=notice.instance_id))
            else:
                loose.append(notice)  # an instance that never joined: no replica on it, still counted
        if extra:
            nodes = [NodeInfo(n.name, n.ready, n.schedulable, n.gpus_allocatable, n.provider_id,
                              n.notices + tuple(extra.get(n.name, ()))) for n in nodes]
        noticed = {n.name for n in nodes if n.noticed}
        notices = tuple(x for n in nodes for x in n.notices) + tuple(loose)

        live = [p for p in pods if not pod_terminal(p)]
        pods_by_node: dict[str, int] = {}
        for p in live:
            if p.spec and p.spec.node_name:
                pods_by_node[p.spec.node_name] = pods_by_node.get(p.spec.node_name, 0) + 1
        interrupted = sum(c for n, c in pods_by_node.items() if n in noticed)
        scheduled = sum(1 for p in live if p.spec and p.spec.node_name
                        and not (p.metadata and p.metadata.deletion_timestamp))
        noticed_pods = tuple(sorted(p.metadata.name for p in live
                                    if p.spec and p.spec.node_name in noticed and p.metadata and p.metadata.name))

        # Unschedulable replicas past the timeout mark the whole pool: it lacks capacity for all.
        timeout_s = self.settings.unschedulable_timeout_s + self.pool.provisioning_delay_s
        stuck_ages: list[float] = []
        first_seen: dict[str, datetime] = {}
        message = ""
        for p in live:
            if not pod_unschedulable(p):
                continue
            key = (p.metadata.uid or f"{p.metadata.namespace}/{p.metadata.name}") if p.metadata else ""
            # A pod without any timestamp is aged from the first time this provider saw it.
            first_seen[key] = self._first_seen.get(model.name, {}).get(key, now)
            since = pod_unschedulable_since(p) or first_seen[key]
            stuck_ages.append(max(0.0, (now - since).total_seconds()))
            message = message or _pod_message(p)
        self._first_seen[model.name] = first_seen
        late = [a for a in stuck_ages if a > timeout_s]
        if late:
            self.marks.mark(self.pool.name, now + timedelta(seconds=self.settings.unavailable_for_s), unavailable_reason(
                self.pool, "Unschedulable",
                f"{len(late)} replica(s) of {model.name} Pending for more than {timeout_s:g} s: {message}"))

        self._count_notices(notices if idle_notices else tuple(n for n in notices if n.node in pods_by_node), now)

        # The status once the controller has reconciled the Deployment (observedGeneration set).
        reconciled = dep.status if dep.status is not None and dep.status.observed_generation is not None else None
        obs = PoolObservation(
            model=model.name, pool=self.pool.name, at=now,
            replicas=spec_replicas(dep),
            # The API omits zero-valued status fields; once the controller has reconciled the
            # Deployment an absent count means 0, before that: unknown.
            ready_replicas=(reconciled.ready_replicas or 0) if reconciled is not None else None,
            unavailable_replicas=(reconciled.unavailable_replicas or 0) if reconciled is not None else None,
            selector=selector, nodes=tuple(nodes), pods_by_node=pods_by_node,
            unschedulable_pods=len(stuck_ages), oldest_unschedulable_s=max(stuck_ages) if stuck_ages else None,
            interrupted_replicas=interrupted, notices=notices, namespace=ref.namespace, noticed_pods=noticed_pods,
            pod_spec=dep.spec.template.spec if dep.spec and dep.spec.template else None,
            scheduled_replicas=scheduled)
        self._last[model.name] = obs
        return obs

    def _count_notices(self, notices: Sequence[Notice], now: datetime) -> None:
        for n in notices:
            if n.kind is NoticeKind.INTERRUPTION:
                self._notices_seen.setdefault(n.key, n.at or now)
        horizon = now - timedelta(seconds=self.settings.interruption_window_s)
        self._notices_seen = {k: t for k, t in self._notices_seen.items() if t >= horizon}

    def recent_interruptions(self) -> int:
        return len(self._notices_seen)

    def to_state(self, obs: PoolObservation, now: datetime, *, nodes: int | None = None) -> PoolState:
        why = self.marks.reason(self.pool.name, now)
        if nodes is None:
            nodes = sum(1 for n in obs.nodes if n.ready and n.schedulable and not n.noticed)
        return PoolState(
            pool=self.pool.name, replicas=obs.replicas, ready_replicas=obs.ready_replicas, nodes=nodes,
            available=why is None, unavailable_reason=why, interrupted_replicas=obs.interrupted_replicas,
            recent_interruptions=self.recent_interruptions(), price_per_node_hour_usd=None, at=now,
            scheduled_replicas=obs.scheduled_replicas)

    def state(self, model: ModelSpec, now: datetime) -> PoolState:
        return self.to_state(self.observe(model, now), now)

    def last_observation(self, model: str) -> PoolObservation | None:
        return self._last.get(model)

    def busy_nodes(self, now: datetime) -> set[str]:
        """Nodes that still hold a pod (running, pending on the node or terminating) of any of this
        pool's Deployments: a node group must not release them. (A pool's GPU nodes are expected to
        carry only tidegate's pods and DaemonSets, kept there by the pool's taints.) A Deployment
        that cannot be read makes this raise: no node is released on a guess. Read afresh, not
        from the tick's snapshot: a release is re-validated against the cluster just before it."""
        snap = ClusterSnapshot(self.cluster)
        busy: set[str] = set()
        for model, ref in self.deployments.items():
            what = self._what(model, ref)
            for p in snap.pods(ref.namespace, self._selector(ref, snap, what)):
                if p.spec and p.spec.node_name and not pod_terminal(p):
                    busy.add(p.spec.node_name)
        return busy

    def nodes_by_instance(self, instance_id_for: Callable[[str], str | None], now: datetime) -> dict[str, NodeInfo]:
        """Every node of the cluster by the instance behind it, read afresh (as ``busy_nodes``):
        a node that joined since the tick's read must not pass for an instance that never did."""
        out: dict[str, NodeInfo] = {}
        for n in self.pool_nodes("", snapshot=ClusterSnapshot(self.cluster)):
            iid = instance_id_for(n.provider_id) if n.provider_id else None
            if iid:
                out[iid] = n
        return out

    # -- act --------------------------------------------------------------------------------------

    def validate(self, model: ModelSpec, replicas: int, log: ActionLog) -> None:
        try:
            self._ref(model.name)
        except PermanentProviderError as e:
            raise log.fail(e) from None
        if replicas < 0:
            raise log.fail(PermanentProviderError(
                f"replicas must be >= 0, got {replicas} for {model.name}/{self.pool.name}"))

    def set_replicas(self, model: ModelSpec, replicas: int, log: ActionLog) -> None:
        """Make the Deployment's ``spec.replicas`` equal ``replicas``: patch only on a difference
        (else a ``NOOP`` row), always with the resourceVersion of the read it compared against, so
        a concurrent writer causes a 409 instead of a lost update. Within a tick that read is the
        tick's own (no call at all when it shows ``replicas`` already); outside one, and before
        every retry (a 409 or another transient error, with backoff), the scale is read. Every
        patch made is a row."""
        ref = self._ref(model.name)
        what = self._what(model.name, ref)
        self._prefer_noticed_pods(model, replicas, log)
        seen = self._tick_scale(ref, what)

        def once() -> None:
            nonlocal seen
            if seen is None:
                scale = self.cluster.read_scale(ref.namespace, ref.name, what)
                seen = (scale.spec.replicas if scale.spec and scale.spec.replicas is not None else 0,
                        scale.metadata.resource_version if scale.metadata else None)
            (cur, rv), seen = seen, None  # a retry reads again
            args = {"namespace": ref.namespace, "deployment": ref.name, "replicas": replicas, "previous_replicas": cur}
            if cur == replicas:
                log.note(CALL_SCALE, args, ActionStatus.NOOP, provider=PROVIDER)
                return
            log.run(CALL_SCALE, args, lambda: self.cluster.patch_scale(ref.namespace, ref.name, replicas, rv, what),
                    provider=PROVIDER)

        try:
            retry_transient(once, self.settings.retry, sleep=self.cluster._sleep)
        except ProviderError as e:
            # Failed patches are already rows; a read that failed is not a call we made to act.
            raise log.fail(e) from e.__cause__

    def _tick_scale(self, ref: DeploymentRef, what: str) -> tuple[int, str | None] | None:
        """``(replicas, resourceVersion)`` of the Deployment as this tick read it (the scale
        subresource carries the Deployment's own resourceVersion, so a patch with it conflicts on
        any change since); ``None`` outside a tick, or when the tick could not read it or the read
        has no resourceVersion: then the scale is read, and nothing is patched on a guess."""
        snap = self.cluster.shared
        if snap is None:
            return None
        try:
            dep = snap.deployment(ref.namespace, ref.name, what)
        except ProviderError:
            return None  # reading the scale says why, or succeeds
        rv = dep.metadata.resource_version if dep.metadata else None
        return (spec_replicas(dep), rv) if rv else None

    def _prefer_noticed_pods(self, model: ModelSpec, replicas: int, log: ActionLog) -> None:
        """Before scaling in, give the pods on nodes under an interruption notice the lowest
        ``pod-deletion-cost``, so the ReplicaSet removes those (they are going anyway) instead of
        healthy ones. Pods already gone are skipped."""
        obs = self._last.get(model.name)
        if obs is None or obs.replicas is None or replicas >= obs.replicas or not obs.noticed_pods:
            return
        ns = obs.namespace

        def annotate(pod: str) -> Callable[[], bool]:
            return lambda: self.cluster.annotate_pod(
                ns, pod, {DELETION_COST_ANNOTATION: str(NOTICED_POD_DELETION_COST)},
                f"pod {ns}/{pod} of model {model.name!r} in pool {self.pool.name!r}")

        for name in obs.noticed_pods[: obs.replicas - replicas]:
            args = {"namespace": ns, "pod": name,
                    "annotation": f"{DELETION_COST_ANNOTATION}={NOTICED_POD_DELETION_COST}"}
            log.run(CALL_DELETION_COST, args, annotate(name), provider=PROVIDER)

    def scale(self, model: ModelSpec, replicas: int, nodes: int, now: datetime) -> Sequence[Action]:
        """Set the model's replicas in this pool. ``nodes`` is not actuated: the nodes of a pool
        without a node group exist or not; the core sizes placements by ``max_nodes``."""
        log = ActionLog(PROVIDER, self.pool.name, model.name, monotonic=self._monotonic)
        self.validate(model, replicas, log)
        self.set_replicas(model, replicas, log)
        return log.actions


# --- the onprem provider ------------------------------------------------------------------------


class OnPremProvider(PoolProviderKind):
    """``provider: onprem``: nodes that exist and are paid for. The pool is its Kubernetes side
    alone (its Deployments on the nodes its selector names); there is no node group to resize."""

    name = "onprem"
    tiers = frozenset({Tier.ONPREM})
    description = "Nodes already in the cluster: tidegate scales the pool's Deployments only."


class ClusterAutoscalerProvider(PoolProviderKind):
    """``provider: cluster-autoscaler``: cloud nodes that cluster-autoscaler (or GKE node
    auto-provisioning, or any other autoscaler) adds for Pending pods and removes when idle.
    tidegate scales the pool's Deployments only and never resizes a node group; replicas left
    unschedulable past ``unschedulable_timeout_s`` mark the pool unavailable, as for every pool."""

    name = "cluster-autoscaler"
    tiers = frozenset({Tier.SPOT, Tier.ONDEMAND})
    description = "Nodes that cluster-autoscaler adds and removes: tidegate scales the pool's Deployments only."


__all__ = [
    "CALL_DELETION_COST", "ClusterAutoscalerProvider", "ClusterSnapshot", "CALL_SCALE", "ConflictError", "DELETION_COST_ANNOTATION", "Deployment", "DeploymentRef", "INTERRUPTION_TAINTS", "KubernetesCluster",
    "KubernetesPoolProvider", "KubernetesSettings", "LabelIndex", "OnPremProvider", "NodeInfo", "PROVIDER", "PoolObservation", "Requirement",
    "make_api_client", "node_allocatable_gpus", "node_notices", "node_ready", "node_schedulable",
    "parse_selector", "pod_terminal", "pod_unschedulable", "pod_unschedulable_since", "selector_from_label_selector",
    "selector_from_labels", "selector_matches", "spec_replicas", "translate_api_error",
]
