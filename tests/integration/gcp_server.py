"""A small local server speaking the compute REST paths that ``google-cloud-compute`` uses for
managed instance groups, for the GCP adapter's tests (no GCP emulator exists).

It serves, for zonal (``zones/{zone}``) and regional (``regions/{region}``) groups:

- ``GET    /compute/v1/projects/{p}/{scope}/{loc}/instanceGroupManagers/{name}``
- ``POST   .../instanceGroupManagers/{name}/resize?size=N``
- ``POST   .../instanceGroupManagers/{name}/listManagedInstances`` (``maxResults`` / ``pageToken``)
- ``POST   .../instanceGroupManagers/{name}/deleteInstances`` (body ``{"instances": [urls]}``)

with the JSON shapes of the compute API (``targetSize``, ``managedInstances`` with
``instanceStatus`` / ``currentAction`` / ``lastAttempt.errors``, ``compute#operation``, and the
``{"error": {...}}`` document for failures). It keeps each group's instances, records every
request and can answer chosen requests with errors. The test drives the "cloud" side: ``settle``
turns creating instances into running ones (or leaves them failing with a stock-out / quota error
while ``stockout`` is set), ``preempt`` stops a spot VM.

The real client points at it with ``client_options={"api_endpoint": server.url}`` and anonymous
credentials.
"""

from __future__ import annotations

import http.server
import itertools
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit
from tests.integration.loopback import LoopbackServer

BASE = "https://www.googleapis.com/compute/v1"
_PATH = re.compile(
    r"^/compute/v1/projects/(?P<project>[^/]+)/(?P<scope>zones|regions)/(?P<loc>[^/]+)"
    r"/instanceGroupManagers/(?P<name>[^/]+)(?:/(?P<verb>resize|listManagedInstances|deleteInstances))?$")


@dataclass
class Instance:
    name: str
    zone: str
    status: str = ""
    """``instanceStatus``: empty while being created, then ``RUNNING``; ``STOPPING`` /
    ``TERMINATED`` when preempted."""
    action: str = "CREATING"
    """``currentAction``: ``CREATING`` until settled, then ``NONE``."""
    errors: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Mig:
    project: str
    scope: str
    location: str
    name: str
    target_size: int = 0
    instances: dict[str, Instance] = field(default_factory=dict)
    stockout: tuple[str, str] | None = None
    """While set, ``settle`` leaves new instances CREATING with this (code, message) error."""
    serial: itertools.count = field(default_factory=lambda: itertools.count(1))

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.project, self.scope, self.location, self.name)

    def zone_for(self, i: int) -> str:
        return self.location if self.scope == "zones" else f"{self.location}-{'abc'[i % 3]}"

    def url(self, inst: Instance) -> str:
        return f"{BASE}/projects/{self.project}/zones/{inst.zone}/instances/{inst.name}"


@dataclass
class GcpFault:
    method: str
    path: re.Pattern[str]
    status: int
    reason: str
    message: str
    times: int = 1
    body: RawBody | None = None
    """Answered as is instead of an API error document (a proxy's page, another service's JSON)."""


@dataclass(frozen=True)
class RawBody:
    """An answer that is not the API's JSON: bytes and their content type."""

    data: bytes
    content_type: str = "text/html"


@dataclass(frozen=True)
class GcpRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any

    @property
    def verb(self) -> str:
        m = _PATH.match(self.path)
        return (m["verb"] if m and m["verb"] else "get") if m else "?"

    @property
    def is_write(self) -> bool:
        return self.verb in ("resize", "deleteInstances")


_STATUS_NAMES = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ALREADY_EXISTS",
                 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


class GcpComputeServer:
    """The server, in a thread on 127.0.0.1. Thread-safe controls for the test."""

    def __init__(self) -> None:
        self.migs: dict[tuple[str, str, str, str], Mig] = {}
        self.page_size = 500
        self._faults: list[GcpFault] = []
        self._log: list[GcpRequest] = []
        self._lock = threading.Lock()
        self._ops = itertools.count(1000)
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._httpd = LoopbackServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="gcp-compute", daemon=True)

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> "GcpComputeServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def reset(self) -> None:
        with self._lock:
            self.migs.clear()
            self._faults.clear()
            self._log.clear()
            self.page_size = 500

    # -- the test's controls ----------------------------------------------------------------------

    def add_mig(self, project: str, name: str, *, zone: str | None = None, region: str | None = None,
                size: int = 0) -> Mig:
        scope, loc = ("zones", zone) if zone else ("regions", region)
        assert loc
        mig = Mig(project, scope, loc, name)
        with self._lock:
            self.migs[mig.key] = mig
            self._resize(mig, size)
            self._settle(mig)
        return mig

    def settle(self, mig: Mig) -> None:
        """The cloud catches up: creating instances come up, unless a stock-out is in force."""
        with self._lock:
            self._settle(mig)

    def resize(self, mig: Mig, size: int) -> None:
        """Someone else (an operator, another autoscaler) resizes the group, unrecorded."""
        with self._lock:
            self._resize(mig, size)

    def preempt(self, mig: Mig, name: str, status: str = "STOPPING") -> None:
        with self._lock:
            inst = mig.instances[name]
            inst.status, inst.action = status, "NONE"

    def running(self, mig: Mig) -> dict[str, str]:
        """Running instances as node name -> providerID (as GKE sets it)."""
        with self._lock:
            return {i.name: f"gce://{mig.project}/{i.zone}/{i.name}" for i in mig.instances.values()
                    if i.status == "RUNNING"}

    def fault(self, method: str, path: str, status: int, *, reason: str = "backendError",
              message: str = "injected fault", times: int = 1, body: RawBody | None = None) -> None:
        """Answer the next ``times`` matching requests with ``status`` and an API error document
        (``reason``, ``message``), or with ``body`` as is."""
        with self._lock:
            self._faults.append(GcpFault(method.upper(), re.compile(path), status, reason, message, times, body))

    def requests(self) -> list[GcpRequest]:
        with self._lock:
            return list(self._log)

    def mark(self) -> int:
        with self._lock:
            return len(self._log)

    def requests_since(self, mark: int) -> list[GcpRequest]:
        with self._lock:
            return list(self._log[mark:])

    # -- state changes (under the lock) -----------------------------------------------------------

    def _resize(self, mig: Mig, size: int) -> None:
        mig.target_size = size
        while len(mig.instances) < size:
            n = next(mig.serial)
            name = f"{mig.name}-{n:04d}"
            mig.instances[name] = Instance(name, mig.zone_for(n))
        if len(mig.instances) > size:
            # A MIG shrinking on its own removes instances still being created first, then others.
            order = sorted(mig.instances.values(), key=lambda i: (i.action != "CREATING", i.name), reverse=False)
            for inst in order[: len(mig.instances) - size]:
                del mig.instances[inst.name]

    def _settle(self, mig: Mig) -> None:
        for inst in mig.instances.values():
            if inst.action != "CREATING":
                continue
            if mig.stockout is not None:
                inst.errors = [mig.stockout]
                continue
            inst.status, inst.action, inst.errors = "RUNNING", "NONE", []

    def _operation(self, mig: Mig, kind: str) -> dict[str, Any]:
        loc_key = "zone" if mig.scope == "zones" else "region"
        target = f"{BASE}/projects/{mig.project}/{mig.scope}/{mig.location}/instanceGroupManagers/{mig.name}"
        op = next(self._ops)
        return {"kind": "compute#operation", "id": str(op), "name": f"operation-{op}",
                "operationType": f"compute.instanceGroupManagers.{kind}", "targetLink": target,
                "status": "DONE", "progress": 100, loc_key: f"{BASE}/projects/{mig.project}/{mig.scope}/{mig.location}",
                "selfLink": f"{BASE}/projects/{mig.project}/{mig.scope}/{mig.location}/operations/operation-{op}"}

    def _mig_json(self, mig: Mig) -> dict[str, Any]:
        creating = sum(1 for i in mig.instances.values() if i.action == "CREATING")
        none = sum(1 for i in mig.instances.values() if i.action == "NONE")
        loc_key = "zone" if mig.scope == "zones" else "region"
        return {"kind": "compute#instanceGroupManager", "name": mig.name, "targetSize": mig.target_size,
                "baseInstanceName": mig.name, loc_key: f"{BASE}/projects/{mig.project}/{mig.scope}/{mig.location}",
                "currentActions": {"creating": creating, "none": none, "deleting": 0, "recreating": 0},
                "status": {"isStable": creating == 0},
                "selfLink": f"{BASE}/projects/{mig.project}/{mig.scope}/{mig.location}/instanceGroupManagers/{mig.name}"}

    def _managed_json(self, mig: Mig, inst: Instance) -> dict[str, Any]:
        out: dict[str, Any] = {"instance": mig.url(inst), "name": inst.name, "currentAction": inst.action,
                               "id": str(abs(hash(inst.name)) % 10**12)}
        if inst.status:
            out["instanceStatus"] = inst.status
        if inst.errors:
            out["lastAttempt"] = {"errors": {"errors": [{"code": c, "message": m} for c, m in inst.errors]}}
        return out

    def handle(self, method: str, raw_path: str, body: Any) -> tuple[int, dict[str, Any] | RawBody]:
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        with self._lock:
            self._log.append(GcpRequest(method, parts.path, query, body))
            for f in self._faults:
                if f.times > 0 and f.method == method and f.path.search(parts.path):
                    f.times -= 1
                    if f.body is not None:
                        return f.status, f.body
                    return f.status, {"error": {"code": f.status, "message": f.message, "status":
                                                _STATUS_NAMES.get(f.status, "UNKNOWN"),
                                                "errors": [{"message": f.message, "domain": "global", "reason": f.reason}]}}
            m = _PATH.match(parts.path)
            if m is None:
                return 404, {"error": {"code": 404, "message": f"no such path {parts.path}", "status": "NOT_FOUND",
                                       "errors": [{"message": "not found", "domain": "global", "reason": "notFound"}]}}
            mig = self.migs.get((m["project"], m["scope"], m["loc"], m["name"]))
            if mig is None:
                msg = f"The resource 'projects/{m['project']}/{m['scope']}/{m['loc']}/instanceGroupManagers/{m['name']}' was not found"
                return 404, {"error": {"code": 404, "message": msg, "status": "NOT_FOUND",
                                       "errors": [{"message": msg, "domain": "global", "reason": "notFound"}]}}
            verb = m["verb"]
            if verb is None and method == "GET":
                return 200, self._mig_json(mig)
            if verb == "resize" and method == "POST":
                size = int(query.get("size", ["-1"])[0])
                if size < 0:
                    return 400, {"error": {"code": 400, "message": "Invalid value for field 'size'", "status": "INVALID_ARGUMENT",
                                           "errors": [{"message": "bad size", "domain": "global", "reason": "invalid"}]}}
                self._resize(mig, size)
                return 200, self._operation(mig, "resize")
            if verb == "listManagedInstances" and method == "POST":
                items = [self._managed_json(mig, i) for i in sorted(mig.instances.values(), key=lambda i: i.name)]
                start = int(query.get("pageToken", ["0"])[0] or 0)
                size = min(int(query.get("maxResults", [str(self.page_size)])[0]), self.page_size)
                page = items[start:start + size]
                out: dict[str, Any] = {"managedInstances": page}
                if start + size < len(items):
                    out["nextPageToken"] = str(start + size)
                return 200, out
            if verb == "deleteInstances" and method == "POST":
                urls = (body or {}).get("instances") or []
                names = [u.rstrip("/").rsplit("/", 1)[-1] for u in urls]
                removed = [n for n in names if n in mig.instances]
                for n in removed:
                    del mig.instances[n]
                mig.target_size = max(0, mig.target_size - len(removed))
                return 200, self._operation(mig, "deleteInstances")
            return 405, {"error": {"code": 405, "message": f"{method} not allowed", "status": "UNIMPLEMENTED",
                                   "errors": [{"message": "no", "domain": "global", "reason": "methodNotAllowed"}]}}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_state: GcpComputeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        status, doc = self.server_state.handle(method, self.path, body)
        if isinstance(doc, RawBody):
            data, content_type = doc.data, doc.content_type
        else:
            data, content_type = json.dumps(doc).encode(), "application/json; charset=UTF-8"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")
