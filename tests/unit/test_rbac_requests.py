"""tests/rbac.py reads requests as the API server's request-info resolver does (the verb, group,
resource and subresource an RBAC rule must name), table-driven from the Kubernetes API conventions."""

from __future__ import annotations

import pytest

from tests.rbac import Permission, RequestAttributes, expected, granted, load_daemon_calls, request_attributes, scope_of


@pytest.mark.parametrize("method, path, query, want", [
    ("GET", "/apis/apps/v1/namespaces/llm/deployments/llama", "", ("get", "apps", "deployments", "llm", "llama")),
    ("GET", "/apis/apps/v1/namespaces/llm/deployments", "", ("list", "apps", "deployments", "llm", None)),
    ("GET", "/apis/apps/v1/namespaces/llm/deployments", "watch=true&resourceVersion=5", ("watch", "apps", "deployments", "llm", None)),
    ("GET", "/apis/apps/v1/namespaces/llm/deployments", "watch=1", ("watch", "apps", "deployments", "llm", None)),
    ("GET", "/apis/apps/v1/namespaces/llm/deployments", "watch=false", ("list", "apps", "deployments", "llm", None)),
    ("GET", "/apis/apps/v1/watch/namespaces/llm/deployments", "", ("watch", "apps", "deployments", "llm", None)),
    ("GET", "/apis/apps/v1/namespaces/llm/deployments/llama/scale", "", ("get", "apps", "deployments/scale", "llm", "llama")),
    ("PATCH", "/apis/apps/v1/namespaces/llm/deployments/llama/scale", "", ("patch", "apps", "deployments/scale", "llm", "llama")),
    ("PUT", "/apis/apps/v1/namespaces/llm/deployments/llama/scale", "", ("update", "apps", "deployments/scale", "llm", "llama")),
    ("PATCH", "/api/v1/namespaces/llm/pods/p-1", "", ("patch", "", "pods", "llm", "p-1")),
    ("PATCH", "/api/v1/namespaces/llm/pods/p-1/status", "", ("patch", "", "pods/status", "llm", "p-1")),
    ("GET", "/api/v1/nodes", "labelSelector=a%3Db", ("list", "", "nodes", None, None)),
    ("GET", "/api/v1/nodes/n-1", "", ("get", "", "nodes", None, "n-1")),
    ("POST", "/apis/coordination.k8s.io/v1/namespaces/tg/leases", "", ("create", "coordination.k8s.io", "leases", "tg", None)),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/tg/leases/l", "", ("update", "coordination.k8s.io", "leases", "tg", "l")),
    ("DELETE", "/api/v1/namespaces/llm/pods/p-1", "", ("delete", "", "pods", "llm", "p-1")),
    ("DELETE", "/api/v1/namespaces/llm/pods", "", ("deletecollection", "", "pods", "llm", None)),
    # the Namespace object itself, and its own subresources
    ("GET", "/api/v1/namespaces", "", ("list", "", "namespaces", None, None)),
    ("GET", "/api/v1/namespaces/llm", "", ("get", "", "namespaces", "llm", "llm")),
    ("PUT", "/api/v1/namespaces/llm/finalize", "", ("update", "", "namespaces/finalize", "llm", "llm")),
])
def test_request_attributes_follow_the_api_conventions(method: str, path: str, query: str,
                                                       want: tuple[str, str, str, str | None, str | None]) -> None:
    assert request_attributes(method, path, query) == RequestAttributes(*want)


@pytest.mark.parametrize("path", ["/version", "/api", "/api/v1", "/apis", "/apis/apps/v1", "/healthz"])
def test_non_resource_paths_have_no_resource(path: str) -> None:
    assert request_attributes("GET", path) is None


def test_an_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="OPTIONS /api/v1/pods"):
        request_attributes("OPTIONS", "/api/v1/pods")


def test_scopes_and_grants() -> None:
    get_pods = RequestAttributes("get", "", "pods", "llm", "p")
    assert scope_of(get_pods, managed=["llm"], release=["tg"]) == "managed"
    assert scope_of(RequestAttributes("get", "coordination.k8s.io", "leases", "tg", "l"), ["llm"], ["tg"]) == "release"
    assert scope_of(RequestAttributes("list", "", "nodes", None, None), ["llm"], ["tg"]) == "cluster"
    with pytest.raises(ValueError, match="'other'"):
        scope_of(RequestAttributes("get", "", "pods", "other", "p"), ["llm"], ["tg"])
    calls = [Permission("managed", "", "pods", "list"), Permission("cluster", "", "nodes", "list"),
             Permission("release", "coordination.k8s.io", "leases", "create")]
    assert expected(calls, release="tg", managed=["a", "b"]) == {
        ("a", "", "pods", "list"), ("b", "", "pods", "list"), ("", "", "nodes", "list"),
        ("tg", "coordination.k8s.io", "leases", "create")}
    docs = [{"kind": "Role", "metadata": {"namespace": "a"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]}]},
            {"kind": "ClusterRole", "metadata": {}, "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]},
            {"kind": "Service", "metadata": {}}]
    assert granted(docs) == {("a", "", "pods", "list"), ("a", "", "pods", "patch"), ("", "", "nodes", "list")}


def test_the_committed_record_loads_and_names_a_witness_for_each_call() -> None:
    calls = load_daemon_calls()
    assert Permission("managed", "", "pods", "patch") in calls
    assert {p.verb for p in calls if p.resource == "leases"} == {"get", "create", "update"}
    assert all(w.startswith("test_") for w in calls.values())
