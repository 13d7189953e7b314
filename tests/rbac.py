"""Kubernetes RBAC as the API server applies it, for the test that holds the chart's Roles to the
calls the daemon really makes.

- ``request_attributes``: an HTTP request (method, path, query) read the way the API server's
  request-info resolver reads it before the authorizer runs: the verb (GET on an item ``get``, on a
  collection ``list``, with ``?watch`` ``watch``; POST ``create``, PUT ``update``, PATCH ``patch``,
  DELETE ``delete`` or ``deletecollection``), the API group, the resource (``resource/subresource``
  for a subresource), the namespace and the name.
- ``DAEMON_CALLS``: the committed record (``tests/integration/daemon_kube_calls.yaml``) of every
  permission the daemon used in ``tests/integration/test_daemon_actuation.py``, each with the test
  that must make it. That module fails a test whose daemon made a call missing from the record, and
  one that no longer makes a call the record says it makes; ``tests/integration/test_deploy.py``
  fails when the rendered Roles grant anything else or anything less.
- ``granted``: what rendered Role and ClusterRole documents grant, as (namespace, group, resource,
  verb); a ClusterRole's namespace is ``CLUSTER``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import yaml

DAEMON_CALLS = Path(__file__).resolve().parent / "integration" / "daemon_kube_calls.yaml"

CLUSTER = ""
"""The namespace of a cluster-wide grant (a ClusterRole bound by a ClusterRoleBinding)."""

SCOPES = ("managed", "release", "cluster")
"""Where a recorded call lands: ``managed`` the namespaces of the model's Deployments
(``rbac.managedNamespaces``), ``release`` the daemon's own namespace (its Lease), ``cluster`` a
cluster-scoped resource."""

_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}  # what the API server's boolean query parameters accept


@dataclass(frozen=True, order=True)
class RequestAttributes:
    verb: str
    group: str
    resource: str
    """``plural`` or ``plural/subresource``."""
    namespace: str | None
    name: str | None


def request_attributes(method: str, path: str, query: str = "") -> RequestAttributes | None:
    """The authorizer's view of one request, or ``None`` for a non-resource path (``/version``,
    ``/apis``, ``/api/v1`` discovery). Raises ``ValueError`` for a method the API has no verb for."""
    verb = _VERBS.get(method.upper())
    if verb is None:
        raise ValueError(f"{method} {path}: no Kubernetes verb for this HTTP method")
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"]:
        if len(parts) < 3:
            return None
        group, rest = parts[1], parts[3:]
    else:
        return None
    if rest[:1] == ["watch"]:  # the deprecated /watch/ prefix
        verb, rest = "watch", rest[1:]
    namespace = None
    if rest[:1] == ["namespaces"] and len(rest) >= 2:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in ("status", "finalize"):  # else the Namespace object itself
            rest = rest[2:]
    if not rest:
        return None
    resource, name = rest[0], rest[1] if len(rest) >= 2 else None
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    if name is None:
        if verb == "get":
            verb = "watch" if any(v in _TRUE for v in parse_qs(query).get("watch", [])) else "list"
        elif verb == "delete":
            verb = "deletecollection"
    return RequestAttributes(verb, group, resource, namespace, name)


@dataclass(frozen=True, order=True)
class Permission:
    scope: str
    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.group or 'core'}/{self.resource} ({self.scope})"


def load_daemon_calls(path: Path = DAEMON_CALLS) -> dict[Permission, str]:
    """The committed record: permission -> the test that must use it."""
    out: dict[Permission, str] = {}
    for entry in yaml.safe_load(path.read_text())["calls"]:
        p = Permission(entry["scope"], entry["group"], entry["resource"], entry["verb"])
        if p.scope not in SCOPES:
            raise ValueError(f"{path}: scope {p.scope!r} of {p} is not one of {SCOPES}")
        if p in out:
            raise ValueError(f"{path}: {p} is listed twice")
        out[p] = entry["witness"]
    return out


def scope_of(attrs: RequestAttributes, managed: Iterable[str], release: Iterable[str]) -> str:
    """Which scope a request's namespace is; ``ValueError`` for a namespace that is neither."""
    if attrs.namespace is None:
        return "cluster"
    if attrs.namespace in set(managed):
        return "managed"
    if attrs.namespace in set(release):
        return "release"
    raise ValueError(f"{attrs.verb} {attrs.resource} in namespace {attrs.namespace!r}, which is neither a managed "
                     "namespace nor the daemon's own")


def granted(docs: Sequence[Mapping[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(namespace or ``CLUSTER``, group, resource, verb) for every rule of the rendered Roles and
    ClusterRoles (``resourceNames`` narrow a rule to named objects; they are not expanded here)."""
    out = set()
    for d in docs:
        if d["kind"] not in ("Role", "ClusterRole"):
            continue
        ns = d["metadata"]["namespace"] if d["kind"] == "Role" else CLUSTER
        for rule in d.get("rules") or []:
            for g in rule.get("apiGroups", []):
                for r in rule.get("resources", []):
                    for v in rule.get("verbs", []):
                        out.add((ns, g, r, v))
    return out


def expected(calls: Iterable[Permission], *, release: str, managed: Sequence[str]) -> set[tuple[str, str, str, str]]:
    """What the Roles must grant for ``calls`` when the chart is installed in ``release`` and
    manages Deployments in ``managed``."""
    out = set()
    for p in calls:
        namespaces = {"cluster": [CLUSTER], "release": [release], "managed": list(managed)}[p.scope]
        out |= {(ns, p.group, p.resource, p.verb) for ns in namespaces}
    return out
