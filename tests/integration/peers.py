"""Real protocol peers for the provider adapters' integration tests, each on 127.0.0.1.

- ``KubePeer``: the Kubernetes API served over HTTP by ``kmock``'s emulator, in a thread with its
  own event loop (the official client is synchronous), plus what kmock lacks and our behaviour
  depends on: ``resourceVersion`` with 409 on a stale write, ``PUT`` (replace), the Deployment
  ``scale`` subresource answered as an ``autoscaling/v1`` Scale, injectable faults and a request
  log. It still ignores label and field selectors: the adapters filter on the client side, and the
  tests put foreign objects beside ours to prove it.
- ``KubeControllers``: the test playing kube-controller-manager, scheduler and kubelet *through
  the API*: it turns cloud instances into Nodes (with ``providerID``), creates / binds / deletes
  pods to match each Deployment's replicas (first fit by GPUs, unschedulable when nothing fits)
  and writes Deployment status. Nothing in it talks to the adapters.
- ``AwsPeer``: ``moto`` in server mode behind a small recording proxy that can answer chosen
  actions with AWS-shaped errors (throttling, 5xx) or documents (failed scaling activities, which
  moto never produces), so the adapters meet those through the real wire protocol.
"""

from __future__ import annotations

import asyncio
import http.client
import http.server
import itertools
import json
import os
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp.web
import attrs
import kmock
from kubernetes import client as k8s
from tests.integration.loopback import LoopbackServer

# --- Kubernetes --------------------------------------------------------------------------------

_DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass
class KubeFault:
    """Answer matching requests with ``status`` (a Kubernetes Status body) instead of serving
    them; ``before`` runs first, in the server's loop, against the emulator (to play a concurrent
    writer). ``times`` matching requests are affected, then the fault is spent."""

    method: str
    path: re.Pattern[str]
    status: int | None = None
    message: str = "injected fault"
    times: int = 1
    before: Callable[["TidegateKubernetes"], None] | None = None
    answer_after_s: float = 0.0
    """Serve the request (the change is made at once), then hold the answer this long: a slow
    API server, or a network that loses the reply, while the write has happened."""


TEST_TOKEN = "tidegate-tests"
"""Bearer token of the clients the tests themselves use (``KubePeer.api_client``): the
controllers, the test's reads and writes. A request without it came from the daemon's own client
(built from its config), so the request log tells the two apart as the API server's authenticator
would."""


@dataclass(frozen=True)
class KubeRequest:
    method: str
    path: str
    query: str
    subresource: str | None
    token: str | None = None
    """The bearer token the request carried (``TEST_TOKEN`` for the tests' own clients)."""

    @property
    def by_test(self) -> bool:
        return self.token == TEST_TOKEN

    @property
    def is_write(self) -> bool:
        return self.method in _WRITE_METHODS


@attrs.define(kw_only=True)
class TidegateKubernetes(kmock.KubernetesEmulator):
    """kmock's emulator plus resourceVersion/409, PUT, the scale subresource, faults and a log."""

    faults: list[KubeFault] = attrs.field(factory=list)
    log: list[KubeRequest] = attrs.field(factory=list)
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    _rv: Iterator[int] = attrs.field(factory=lambda: itertools.count(100))

    def _next_rv(self) -> str:
        return str(next(self._rv))

    def _take_fault(self, method: str, path: str) -> KubeFault | None:
        with self.lock:
            for f in self.faults:
                if f.times > 0 and f.method == method and f.path.search(path):
                    f.times -= 1
                    return f
        return None

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        method = str(request.method.value if hasattr(request.method, "value") else request.method).upper()
        path = request.url.path
        auth = next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        with self.lock:
            self.log.append(KubeRequest(method, path, request.url.query_string, request.subresource, token))
        # kmock matches each request against its reactions by scanning its whole request history,
        # which makes a long-lived server quadratic; our own ``log`` is the history, so keep only
        # the request being served (``__call__`` appended it before calling us).
        del self._requests[:-1]
        fault = self._take_fault(method, path)
        if fault is not None and fault.answer_after_s:
            response = await self._serve(request, method, None)
            await asyncio.sleep(fault.answer_after_s)
            return response
        return await self._serve(request, method, fault)

    async def _serve(self, request: Any, method: str, fault: KubeFault | None) -> aiohttp.web.StreamResponse:
        if fault is not None:
            if fault.before is not None:
                async with self._lock:
                    fault.before(self)
            if fault.status is not None:
                return self._status(fault.status, "InjectedFault", fault.message)
        if request.resource is not None and request.name is not None:
            key = (request.resource, request.namespace, request.name)
            if request.subresource == "scale" and request.resource == _DEPLOYMENTS:
                return await self._serve_scale(request, key, method)
            if method == "PUT":
                return await self._serve_put(request, key)
            if method == "PATCH" and isinstance(request.data, dict):
                async with self._lock:
                    conflict = self._check_rv(key, request.data)
                    if conflict is not None:
                        return conflict
                    meta = request.data.setdefault("metadata", {})
                    meta["resourceVersion"] = self._next_rv()
                    if "spec" in request.data and request.subresource is None and self._live(key):
                        meta["generation"] = int(self._objects[key].raw.get("metadata", {}).get("generation", 1)) + 1
        elif method == "POST" and isinstance(request.data, dict) and request.resource is not None:
            meta = request.data.setdefault("metadata", {})
            meta["resourceVersion"] = self._next_rv()
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("generation", 1)
            meta.setdefault("creationTimestamp", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
        return await super()._handle(request)

    # -- helpers ----------------------------------------------------------------------------------

    @staticmethod
    def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
        return aiohttp.web.json_response({
            "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "code": code, "reason": reason, "message": message}, status=code)

    def _live(self, key: Any) -> bool:
        return key in self._objects and not self._objects[key].deleted

    def _check_rv(self, key: Any, data: Mapping[str, Any]) -> aiohttp.web.Response | None:
        want = (data.get("metadata") or {}).get("resourceVersion")
        if not self._live(key):
            return self._status(404, "NotFound", f"{key[0].plural} {key[2]!r} not found")
        have = self._objects[key].raw.get("metadata", {}).get("resourceVersion")
        if want is not None and want != have:
            return self._status(409, "Conflict", (
                f"Operation cannot be fulfilled on {key[0].plural} {key[2]!r}: the object has been modified; "
                "please apply your changes to the latest version and try again"))
        return None

    def _scale_of(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata", {})
        labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        return {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion"), "uid": meta.get("uid")},
            "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 1)},
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                       "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))},
        }

    async def _serve_scale(self, request: Any, key: Any, method: str) -> aiohttp.web.StreamResponse:
        async with self._lock:
            if not self._live(key):
                return self._status(404, "NotFound", f"deployments.apps {key[2]!r} not found")
            if method == "GET":
                return aiohttp.web.json_response(self._scale_of(self._objects[key].raw))
            if method not in ("PATCH", "PUT") or not isinstance(request.data, dict):
                return self._status(405, "MethodNotAllowed", f"{method} on scale")
            conflict = self._check_rv(key, request.data)
            if conflict is not None:
                return conflict
            replicas = (request.data.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                return self._status(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}")
            obj = self._objects[key]
            gen = int(obj.raw.get("metadata", {}).get("generation", 1))
            changed = (obj.raw.get("spec") or {}).get("replicas") != replicas
            obj.patch({"spec": {"replicas": replicas},
                       "metadata": {"resourceVersion": self._next_rv(), "generation": gen + 1 if changed else gen}})
            return aiohttp.web.json_response(self._scale_of(obj.raw))

    async def _serve_put(self, request: Any, key: Any) -> aiohttp.web.StreamResponse:
        async with self._lock:
            if not isinstance(request.data, dict):
                return self._status(400, "BadRequest", "PUT needs a JSON object")
            conflict = self._check_rv(key, request.data)
            if conflict is not None:
                return conflict
            new = json.loads(json.dumps(request.data))
            old_meta = self._objects[key].raw.get("metadata", {})
            meta = new.setdefault("metadata", {})
            for k in ("uid", "creationTimestamp", "generation"):
                if k in old_meta:
                    meta.setdefault(k, old_meta[k])
            meta["resourceVersion"] = self._next_rv()
            self._objects[key].history.append(new)
            return aiohttp.web.json_response(new)


class KubePeer:
    """``TidegateKubernetes`` served on 127.0.0.1 from a background thread."""

    RESOURCES = ("v1/pods", "v1/nodes", "apps/v1/deployments", "coordination.k8s.io/v1/leases",
                 # ScalingPolicy objects and what the daemon refuses to fight (providers.kubeobjects)
                 "v1/events", "tidegate.dev/v1alpha1/scalingpolicies", "autoscaling/v2/horizontalpodautoscalers",
                 "keda.sh/v1alpha1/scaledobjects")
    CLUSTER_CUSTOM_RESOURCES = ("karpenter.sh/v1/nodepools", "karpenter.sh/v1/nodeclaims")
    """Karpenter's NodePools and NodeClaims (cluster-scoped custom resources)."""

    def __init__(self) -> None:
        self.url = ""
        self.emulator: TidegateKubernetes | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)

    def start(self) -> "KubePeer":
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("kmock did not start within 15 s")
        if self._error is not None:
            raise RuntimeError("kmock failed to start") from self._error
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # surfaced by start()
            self._error = e
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with TidegateKubernetes() as emu, kmock.Server(emu) as server:
            for r in self.RESOURCES:
                emu.resources[r] = kmock.ResourceInfo(namespaced=not r.endswith("/nodes"),
                                                      verbs={"get", "list", "create", "update", "patch", "delete"})
            for r in self.CLUSTER_CUSTOM_RESOURCES:
                emu.resources[r] = kmock.ResourceInfo(namespaced=False,
                                                      verbs={"get", "list", "create", "update", "patch", "delete"})
            self.emulator = emu
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    # -- test-side controls (thread-safe) ---------------------------------------------------------

    @property
    def emu(self) -> TidegateKubernetes:
        assert self.emulator is not None
        return self.emulator

    def api_client(self) -> k8s.ApiClient:
        """A client for the test's own requests: it authenticates with ``TEST_TOKEN``."""
        cfg = k8s.Configuration(host=self.url, api_key={"authorization": TEST_TOKEN},
                                api_key_prefix={"authorization": "Bearer"})
        return k8s.ApiClient(cfg)

    def fault(self, method: str, path: str, status: int | None = None, *, times: int = 1,
              message: str = "injected fault", before: Callable[[TidegateKubernetes], None] | None = None,
              answer_after_s: float = 0.0) -> KubeFault:
        f = KubeFault(method.upper(), re.compile(path), status, message, times, before, answer_after_s)
        with self.emu.lock:
            self.emu.faults.append(f)
        return f

    def requests(self) -> list[KubeRequest]:
        with self.emu.lock:
            return list(self.emu.log)

    def writes(self) -> list[KubeRequest]:
        return [r for r in self.requests() if r.is_write]

    def mark(self) -> int:
        """Position in the request log (compare with ``requests_since``)."""
        with self.emu.lock:
            return len(self.emu.log)

    def requests_since(self, mark: int) -> list[KubeRequest]:
        with self.emu.lock:
            return list(self.emu.log[mark:])


# --- Kubernetes object builders ------------------------------------------------------------------


def deployment(namespace: str, name: str, labels: Mapping[str, str], replicas: int, *,
               gpus: int, node_selector: Mapping[str, str] | None = None) -> k8s.V1Deployment:
    """A complete Deployment (the client refuses specs without selector and template)."""
    container = k8s.V1Container(
        name="triton", image="nvcr.io/nvidia/tritonserver:24.05-trtllm-python-py3",
        resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}, requests={"nvidia.com/gpu": str(gpus)}))
    return k8s.V1Deployment(
        api_version="apps/v1", kind="Deployment",
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=dict(labels)),
        spec=k8s.V1DeploymentSpec(
            replicas=replicas, selector=k8s.V1LabelSelector(match_labels=dict(labels)),
            template=k8s.V1PodTemplateSpec(
                metadata=k8s.V1ObjectMeta(labels=dict(labels)),
                spec=k8s.V1PodSpec(containers=[container], node_selector=dict(node_selector or {}) or None))))


def node(name: str, labels: Mapping[str, str], gpus: int, *, provider_id: str | None = None,
         ready: bool = True, taints: Sequence[k8s.V1Taint] = ()) -> k8s.V1Node:
    return k8s.V1Node(
        api_version="v1", kind="Node",
        metadata=k8s.V1ObjectMeta(name=name, labels=dict(labels)),
        spec=k8s.V1NodeSpec(provider_id=provider_id, taints=list(taints) or None),
        status=k8s.V1NodeStatus(
            allocatable={"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1000Gi"},
            capacity={"nvidia.com/gpu": str(gpus)},
            conditions=[k8s.V1NodeCondition(type="Ready", status="True" if ready else "False")]))


def taint_node(core: k8s.CoreV1Api, name: str, key: str, *, value: str = "", effect: str = "NoSchedule",
               at: datetime | None = None) -> None:
    """Add a taint as a termination handler does (a patch of ``spec.taints`` with the new list)."""
    current = core.read_node(name).spec.taints or []
    taints = [{"key": t.key, "value": t.value or "", "effect": t.effect,
               **({"timeAdded": t.time_added.strftime("%Y-%m-%dT%H:%M:%SZ")} if t.time_added else {})}
              for t in current]
    taints.append({"key": key, "value": value, "effect": effect,
                   "timeAdded": (at or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")})
    core.patch_node(name, {"spec": {"taints": taints}})


@dataclass
class ManagedDeployment:
    """What ``KubeControllers`` reconciles for one Deployment."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    gpus_per_pod: int
    node_selector: Mapping[str, str]


@dataclass
class KubeControllers:
    """The test's stand-in for the controllers and the scheduler, acting through the API.

    ``reconcile(now)``: pods follow each managed Deployment's ``spec.replicas`` (scale-in deletes
    Pending pods first, then the newest); Pending pods are bound first-fit to Ready, schedulable,
    untainted nodes matching the Deployment's node selector with free GPUs, else they stay Pending
    as ``Unschedulable`` (stamped ``now``); status is written (ready = bound pods)."""

    api: k8s.ApiClient
    deployments: list[ManagedDeployment] = field(default_factory=list)
    _serial: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def apps(self) -> k8s.AppsV1Api:
        return k8s.AppsV1Api(self.api)

    def add_deployment(self, namespace: str, name: str, labels: Mapping[str, str], replicas: int, *,
                       gpus: int, node_selector: Mapping[str, str] | None = None) -> ManagedDeployment:
        self.apps.create_namespaced_deployment(namespace, deployment(
            namespace, name, labels, replicas, gpus=gpus, node_selector=node_selector))
        md = ManagedDeployment(namespace, name, dict(labels), gpus, dict(node_selector or {}))
        self.deployments.append(md)
        return md

    def add_node(self, name: str, labels: Mapping[str, str], gpus: int, *, provider_id: str | None = None) -> None:
        self.core.create_node(node(name, labels, gpus, provider_id=provider_id))

    def sync_nodes(self, instances: Mapping[str, str], labels: Mapping[str, str], gpus: int) -> None:
        """Make the nodes carrying ``labels`` exactly ``instances`` (node name -> providerID): new
        instances join, gone ones leave (their pods go back to Pending, as after an eviction)."""
        have = {n.metadata.name for n in self.core.list_node().items
                if all((n.metadata.labels or {}).get(k) == v for k, v in labels.items())}
        for name, pid in instances.items():
            if name not in have:
                self.add_node(name, labels, gpus, provider_id=pid)
        for name in have - set(instances):
            self.core.delete_node(name)
            for p in self._all_pods():
                if p.spec.node_name == name:
                    self.core.delete_namespaced_pod(p.metadata.name, p.metadata.namespace)

    def _all_pods(self) -> list[k8s.V1Pod]:
        out = []
        for ns in {d.namespace for d in self.deployments}:
            out.extend(self.core.list_namespaced_pod(ns).items)
        return out

    def _pods_of(self, md: ManagedDeployment) -> list[k8s.V1Pod]:
        return [p for p in self.core.list_namespaced_pod(md.namespace).items
                if all((p.metadata.labels or {}).get(k) == v for k, v in md.labels.items())]

    def reconcile(self, now: datetime) -> None:
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        nodes = self.core.list_node().items
        used: dict[str, int] = {}
        for p in self._all_pods():
            if p.spec.node_name:
                g = int(((p.spec.containers[0].resources.requests or {}).get("nvidia.com/gpu")) or 0)
                used[p.spec.node_name] = used.get(p.spec.node_name, 0) + g
        for md in self.deployments:
            dep = self.apps.read_namespaced_deployment(md.name, md.namespace)
            want = dep.spec.replicas
            pods = self._pods_of(md)
            # scale-in as the ReplicaSet controller ranks: unscheduled first, then the lowest
            # controller.kubernetes.io/pod-deletion-cost, then (here) by name
            def rank(p: k8s.V1Pod) -> tuple[bool, int, str]:
                cost = int((p.metadata.annotations or {}).get("controller.kubernetes.io/pod-deletion-cost", "0"))
                return (p.spec.node_name is not None, cost, p.metadata.name)

            pods.sort(key=rank)
            while len(pods) > want:
                victim = pods.pop(0)
                self.core.delete_namespaced_pod(victim.metadata.name, md.namespace)
                if victim.spec.node_name:
                    used[victim.spec.node_name] -= md.gpus_per_pod
            for _ in range(want - len(pods)):
                name = f"{md.name}-{next(self._serial):05d}"
                pod = k8s.V1Pod(
                    api_version="v1", kind="Pod",
                    metadata=k8s.V1ObjectMeta(name=name, namespace=md.namespace, labels=dict(md.labels)),
                    spec=dep.spec.template.spec,
                    status=k8s.V1PodStatus(phase="Pending"))
                pods.append(self.core.create_namespaced_pod(md.namespace, pod))
            for p in pods:
                if p.spec.node_name:
                    continue
                target = None
                for n in nodes:
                    labels = n.metadata.labels or {}
                    if not all(labels.get(k) == v for k, v in md.node_selector.items()):
                        continue
                    if n.spec.unschedulable or n.spec.taints:
                        continue
                    if not any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []):
                        continue
                    free = int(n.status.allocatable.get("nvidia.com/gpu", "0")) - used.get(n.metadata.name, 0)
                    if free >= md.gpus_per_pod:
                        target = n.metadata.name
                        break
                if target is None:
                    if not (p.status and any(c.reason == "Unschedulable" for c in p.status.conditions or [])):
                        self.core.patch_namespaced_pod_status(p.metadata.name, md.namespace, {"status": {
                            "phase": "Pending", "conditions": [{
                                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                "lastTransitionTime": stamp,
                                "message": f"0/{len(nodes)} nodes are available: insufficient nvidia.com/gpu."}]}})
                    continue
                used[target] = used.get(target, 0) + md.gpus_per_pod
                self.core.patch_namespaced_pod(p.metadata.name, md.namespace, {"spec": {"nodeName": target}})
                self.core.patch_namespaced_pod_status(p.metadata.name, md.namespace, {"status": {
                    "phase": "Running", "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
                        {"type": "Ready", "status": "True", "lastTransitionTime": stamp}]}})
            bound = sum(1 for p in self._pods_of(md) if p.spec.node_name)
            dep = self.apps.read_namespaced_deployment(md.name, md.namespace)
            self.apps.patch_namespaced_deployment_status(md.name, md.namespace, {"status": {
                "observedGeneration": dep.metadata.generation, "replicas": want,
                "readyReplicas": bound, "availableReplicas": bound, "unavailableReplicas": max(0, want - bound)}})


# --- AWS -----------------------------------------------------------------------------------------

AWS_REGION = "us-east-1"
AWS_ACCOUNT = "123456789012"


@dataclass
class AwsFault:
    """Answer ``times`` requests for ``action`` with ``status`` and ``body`` instead of moto."""

    action: str
    status: int
    body: bytes
    content_type: str = "text/xml"
    times: int = 1
    params: Mapping[str, str] | None = None
    """Only requests carrying these parameters (e.g. one ``AutoScalingGroupName``)."""


@dataclass(frozen=True)
class AwsRequest:
    action: str
    params: Mapping[str, Any]
    answered_by: str
    """``moto`` or ``fault``."""

    @property
    def is_write(self) -> bool:
        return not self.action.startswith(("Describe", "Get", "List", "Receive"))


def query_error(code: str, message: str) -> bytes:
    """An error document of the AWS query protocol (Auto Scaling, SQS query)."""
    return (f'<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/"><Error><Type>Sender</Type>'
            f"<Code>{code}</Code><Message>{message}</Message></Error><RequestId>{uuid.uuid4()}</RequestId>"
            "</ErrorResponse>").encode()


def ec2_error(code: str, message: str) -> bytes:
    """An error document of the EC2 protocol."""
    return (f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
            f"<RequestID>{uuid.uuid4()}</RequestID></Response>").encode()


def scaling_activities(group: str, activities: Sequence[Mapping[str, str]]) -> bytes:
    """A DescribeScalingActivities answer (moto answers an empty list whatever happened)."""
    members = "".join(
        "<member>" + "".join(f"<{k}>{v}</{k}>" for k, v in a.items()) +
        f"<AutoScalingGroupName>{group}</AutoScalingGroupName></member>" for a in activities)
    return ('<DescribeScalingActivitiesResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">'
            f"<DescribeScalingActivitiesResult><Activities>{members}</Activities></DescribeScalingActivitiesResult>"
            f"<ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata>"
            "</DescribeScalingActivitiesResponse>").encode()


class _AwsProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    peer: "AwsPeer"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        target = self.headers.get("X-Amz-Target", "")
        if target:  # JSON protocol (SQS): the action is in the header, params in the body
            action = target.rsplit(".", 1)[-1]
            try:
                params: Mapping[str, Any] = json.loads(body or b"{}")
            except ValueError:
                params = {}
        else:
            q = parse_qs(body.decode(), keep_blank_values=True)
            params = {k: v[0] for k, v in q.items()}
            action = str(params.get("Action", ""))
        fault = self.peer._take_fault(action, params)
        self.peer._record(AwsRequest(action, params, "fault" if fault else "moto"))
        if fault is not None:
            self._answer(fault.status, fault.content_type, fault.body)
            return
        conn = http.client.HTTPConnection("127.0.0.1", self.peer.moto_port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request("POST", self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self._answer(resp.status, resp.getheader("Content-Type") or "text/xml", data)
        conn.close()

    def _answer(self, status: int, content_type: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        self.end_headers()
        self.wfile.write(data)


class AwsPeer:
    """moto (Auto Scaling, EC2, SQS) on 127.0.0.1 behind a recording, fault-injecting proxy.
    Clients use ``url`` (the proxy); ``moto_url`` bypasses it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.moto_port = 0
        self._faults: list[AwsFault] = []
        self._log: list[AwsRequest] = []
        self._lock = threading.Lock()
        handler = type("Handler", (_AwsProxyHandler,), {"peer": self})
        self._proxy = LoopbackServer(("127.0.0.1", 0), handler)
        self._proxy.daemon_threads = True
        self._thread = threading.Thread(target=self._proxy.serve_forever, name="aws-proxy", daemon=True)

    def start(self) -> "AwsPeer":
        import logging

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self._moto.start()
        self.moto_port = self._moto.get_host_and_port()[1]
        self._thread.start()
        return self

    def stop(self) -> None:
        self._proxy.shutdown()
        self._proxy.server_close()
        self._moto.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._proxy.server_address[1]}"

    @property
    def moto_url(self) -> str:
        return f"http://127.0.0.1:{self.moto_port}"

    def reset(self) -> None:
        """Empty moto's state (every service) and the proxy's faults and log."""
        conn = http.client.HTTPConnection("127.0.0.1", self.moto_port, timeout=10)
        conn.request("POST", "/moto-api/reset")
        conn.getresponse().read()
        conn.close()
        with self._lock:
            self._faults.clear()
            self._log.clear()

    def client(self, service: str, *, direct: bool = False) -> Any:
        import boto3

        return boto3.client(service, endpoint_url=self.moto_url if direct else self.url, region_name=AWS_REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def fault(self, action: str, status: int, body: bytes, *, times: int = 1, content_type: str = "text/xml",
              params: Mapping[str, str] | None = None) -> AwsFault:
        f = AwsFault(action, status, body, content_type, times, params)
        with self._lock:
            self._faults.append(f)
        return f

    def _take_fault(self, action: str, params: Mapping[str, Any]) -> AwsFault | None:
        with self._lock:
            for f in self._faults:
                if f.params and any(params.get(k) != v for k, v in f.params.items()):
                    continue
                if f.action == action and f.times > 0:
                    f.times -= 1
                    return f
        return None

    def _record(self, r: AwsRequest) -> None:
        with self._lock:
            self._log.append(r)

    def requests(self) -> list[AwsRequest]:
        with self._lock:
            return list(self._log)

    def mark(self) -> int:
        with self._lock:
            return len(self._log)

    def requests_since(self, mark: int) -> list[AwsRequest]:
        with self._lock:
            return list(self._log[mark:])


def aws_env() -> dict[str, str]:
    """Dummy credentials so that no test ever reaches for a real account's."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": AWS_REGION, "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def spot_interruption_event(instance_id: str, *, at: datetime, region: str = AWS_REGION,
                            action: str = "terminate") -> dict[str, Any]:
    """The EventBridge event EC2 emits two minutes before reclaiming a spot instance."""
    return {
        "version": "0", "id": str(uuid.uuid4()), "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2", "account": AWS_ACCOUNT, "time": at.strftime("%Y-%m-%dT%H:%M:%SZ"), "region": region,
        "resources": [f"arn:aws:ec2:{region}:{AWS_ACCOUNT}:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "instance-action": action},
    }


def rebalance_event(instance_id: str, *, at: datetime, region: str = AWS_REGION) -> dict[str, Any]:
    """The EventBridge event of an EC2 instance rebalance recommendation."""
    return {
        "version": "0", "id": str(uuid.uuid4()), "detail-type": "EC2 Instance Rebalance Recommendation",
        "source": "aws.ec2", "account": AWS_ACCOUNT, "time": at.strftime("%Y-%m-%dT%H:%M:%SZ"), "region": region,
        "resources": [f"arn:aws:ec2:{region}:{AWS_ACCOUNT}:instance/{instance_id}"],
        "detail": {"instance-id": instance_id},
    }


def create_asg(peer: AwsPeer, name: str, *, max_size: int, min_size: int = 0, desired: int = 0,
               instance_type: str = "g5.12xlarge", spot: bool = True, zones: Sequence[str] = ("us-east-1a",)) -> None:
    """A launch template plus an Auto Scaling group (spot through a MixedInstancesPolicy)."""
    ec2 = peer.client("ec2", direct=True)
    asg = peer.client("autoscaling", direct=True)
    lt_name = f"{name}-lt"
    ec2.create_launch_template(LaunchTemplateName=lt_name,
                               LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": instance_type})
    kwargs: dict[str, Any] = dict(AutoScalingGroupName=name, MinSize=min_size, MaxSize=max_size,
                                  DesiredCapacity=desired, AvailabilityZones=list(zones))
    if spot:
        kwargs["MixedInstancesPolicy"] = {
            "LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateName": lt_name, "Version": "$Latest"},
                               "Overrides": [{"InstanceType": instance_type}]},
            "InstancesDistribution": {"OnDemandBaseCapacity": 0, "OnDemandPercentageAboveBaseCapacity": 0,
                                      "SpotAllocationStrategy": "price-capacity-optimized"}}
    else:
        kwargs["LaunchTemplate"] = {"LaunchTemplateName": lt_name, "Version": "$Latest"}
    asg.create_auto_scaling_group(**kwargs)


def asg_instances(peer: AwsPeer, name: str) -> dict[str, str]:
    """In-service instances of a group as node name -> providerID (as the AWS cloud provider sets)."""
    g = peer.client("autoscaling", direct=True).describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    out = {}
    for i in g["AutoScalingGroups"][0]["Instances"]:
        if i["LifecycleState"] == "InService":
            out[f"ip-{i['InstanceId'][2:10]}.ec2.internal"] = f"aws:///{i['AvailabilityZone']}/{i['InstanceId']}"
    return out


def url_port(url: str) -> int:
    return int(urlsplit(url).port or 0)


# --- Karpenter -------------------------------------------------------------------------------------

_KARPENTER = ("karpenter.sh", "v1")


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class KarpenterControllers:
    """The test's stand-in for Karpenter (``karpenter.sh/v1``), acting through the API like
    ``KubeControllers``, whose pods and nodes it shares.

    ``provision(now)``: for each NodePool, Pending pods that select it (``karpenter.sh/nodepool``)
    and fit no node get NodeClaims, one node of ``gpus_per_node`` each, within the NodePool's GPU
    limit; with ``insufficient_capacity`` set, the claim is created and deleted before it launches
    (Karpenter's answer to an insufficient-capacity error). ``progress(now)`` moves each claim one
    step: launched (a ``providerID``), registered (its Node joins, labelled with the NodePool and
    capacity type), initialized. ``interrupt(node)`` plays the interruption controller: the node is
    tainted ``karpenter.sh/disrupted`` and its claim deleted; ``settle()`` removes deleted claims
    with their nodes (their pods go back to Pending). ``consolidate()`` deletes the claims of
    empty nodes. A claim carries Karpenter's termination finalizer, so a deleted claim stays
    listed with its ``deletionTimestamp`` (stamped with the test's time) until ``settle()``."""

    kube: KubeControllers
    gpus_per_node: int = 4
    pools: dict[str, str] = field(default_factory=dict)
    """NodePool name -> capacity type."""
    insufficient_capacity: set[str] = field(default_factory=set)
    _serial: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.kube.api)

    def add_node_pool(self, name: str, capacity_type: str, *, gpu_limit: int | None = None,
                      requirements: Sequence[Mapping[str, Any]] | None = None) -> None:
        reqs = list(requirements) if requirements is not None else [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [capacity_type]}]
        self.custom.create_cluster_custom_object(*_KARPENTER, "nodepools", {
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass",
                                                             "name": "gpu"}, "requirements": reqs}},
                     **({"limits": {"cpu": "1000", "nvidia.com/gpu": str(gpu_limit)}} if gpu_limit is not None else {}),
                     "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "30s"}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        self.pools[name] = capacity_type

    def claims(self, node_pool: str | None = None) -> list[dict[str, Any]]:
        items = self.custom.list_cluster_custom_object(*_KARPENTER, "nodeclaims")["items"]
        pool_of = (lambda c: c["metadata"]["labels"]["karpenter.sh/nodepool"])
        return [c for c in items if pool_of(c) == node_pool or (node_pool is None and pool_of(c) in self.pools)]

    def _patch_claim(self, name: str, body: Mapping[str, Any]) -> None:
        self.custom.patch_cluster_custom_object(*_KARPENTER, "nodeclaims", name, dict(body))

    def provision(self, now: datetime) -> None:
        for pool, capacity_type in self.pools.items():
            pending = sum(md.gpus_per_pod for md in self.kube.deployments
                          if md.node_selector.get("karpenter.sh/nodepool") == pool
                          for p in self.kube._pods_of(md) if not p.spec.node_name)
            coming = [c for c in self.claims(pool) if not c["metadata"].get("deletionTimestamp")
                      and not (c.get("status") or {}).get("nodeName")]
            need = -(-pending // self.gpus_per_node) - len(coming)
            np = self.custom.get_cluster_custom_object(*_KARPENTER, "nodepools", pool)
            limit = ((np.get("spec") or {}).get("limits") or {}).get("nvidia.com/gpu")
            live = [c for c in self.claims(pool) if not c["metadata"].get("deletionTimestamp")]
            if limit is not None:
                need = min(need, int(limit) // self.gpus_per_node - len(live))
            for _ in range(max(0, need)):
                name = f"{pool}-{next(self._serial):04d}"
                self.custom.create_cluster_custom_object(*_KARPENTER, "nodeclaims", {
                    "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                    "metadata": {"name": name, "finalizers": ["karpenter.sh/termination"],
                                 "labels": {"karpenter.sh/nodepool": pool, "karpenter.sh/capacity-type": capacity_type}},
                    "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"}},
                    "status": {"conditions": [{"type": "Launched", "status": "Unknown", "lastTransitionTime": _stamp(now)}]}})
                if pool in self.insufficient_capacity:
                    self._patch_claim(name, {"metadata": {"deletionTimestamp": _stamp(now)}})

    def progress(self, now: datetime) -> None:
        for c in self.claims():
            name, status = c["metadata"]["name"], c.get("status") or {}
            if c["metadata"].get("deletionTimestamp"):
                continue
            done = {x["type"] for x in status.get("conditions", []) if x.get("status") == "True"}
            pool = c["metadata"]["labels"]["karpenter.sh/nodepool"]
            pid = f"aws:///us-east-1a/i-{abs(hash(name)) % 10**12:012d}"
            if "Launched" not in done:
                conds = [{"type": "Launched", "status": "True", "lastTransitionTime": _stamp(now)}]
                self._patch_claim(name, {"status": {"providerID": pid, "conditions": conds}})
            elif "Registered" not in done:
                self.kube.add_node(name, {"karpenter.sh/nodepool": pool, "karpenter.sh/capacity-type": self.pools[pool]},
                                   self.gpus_per_node, provider_id=status["providerID"])
                conds = [*status["conditions"], {"type": "Registered", "status": "True", "lastTransitionTime": _stamp(now)}]
                self._patch_claim(name, {"status": {"nodeName": name, "conditions": conds}})
            elif "Initialized" not in done:
                conds = [*status["conditions"], {"type": "Initialized", "status": "True", "lastTransitionTime": _stamp(now)},
                         {"type": "Ready", "status": "True", "lastTransitionTime": _stamp(now)}]
                self._patch_claim(name, {"status": {"conditions": conds}})

    def interrupt(self, node_name: str, now: datetime) -> None:
        taint_node(self.kube.core, node_name, "karpenter.sh/disrupted", at=now)
        self._patch_claim(node_name, {"metadata": {"deletionTimestamp": _stamp(now)}})

    def settle(self) -> None:
        for c in self.claims():
            if not c["metadata"].get("deletionTimestamp"):
                continue
            node = (c.get("status") or {}).get("nodeName")
            if node:
                self.kube.core.delete_node(node)
                for p in self.kube._all_pods():
                    if p.spec.node_name == node:
                        self.kube.core.delete_namespaced_pod(p.metadata.name, p.metadata.namespace)
            # Karpenter's termination finalizer goes once the instance is gone; the API server then
            # removes the claim (kmock likewise)
            self._patch_claim(c["metadata"]["name"], {"metadata": {"finalizers": []}})

    def consolidate(self, now: datetime) -> None:
        busy = {p.spec.node_name for p in self.kube._all_pods() if p.spec.node_name}
        for c in self.claims():
            node = (c.get("status") or {}).get("nodeName")
            if node and node not in busy and not c["metadata"].get("deletionTimestamp"):
                self._patch_claim(c["metadata"]["name"], {"metadata": {"deletionTimestamp": _stamp(now)}})

    def catch_up(self, now: datetime) -> None:
        """Karpenter and the cluster do what was asked: claims for Pending pods, launched,
        registered and initialized; pods scheduled onto the new nodes."""
        self.kube.reconcile(now)
        self.provision(now)
        for _ in range(3):
            self.progress(now)
        self.kube.reconcile(now)
