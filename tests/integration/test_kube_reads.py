"""The daemon reads the cluster in a handful of requests a tick, whatever its number of models and
pools, and never acts on a read older than the tick: the daemon as ``tidegate run`` builds it,
over kmock (``tests.integration.kube_fleet``), its requests counted at the peer.

- A steady tick is one LIST of Deployments and one of pods per namespace and one LIST of nodes:
  the same five requests for 2 models x 3 pools as for 12 x 3 in two namespaces (it was a GET of
  each Deployment, a LIST of its pods, a LIST of its pool's nodes and a GET of its scale, for every
  model and pool).
- A Deployment scaled by someone else between two ticks is seen at the next tick and set back with
  one patch (no read of its scale: the tick's list carried its replicas and resourceVersion).
- A change between the tick's read and the patch (a concurrent writer) is a 409: the scale is read
  again and the patch retried, each attempt an action row.
- A namespace that cannot be listed costs the tick one retry budget, not one per model and pool,
  and the next tick reads it afresh.

Every request the daemon made is held to ``daemon_kube_calls.yaml`` as in
``test_daemon_actuation.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from providers.kubernetes import CALL_SCALE
from tests.integration.kube_fleet import FAST_RETRY, KubeFleet
from tests.integration.peers import KubePeer, KubeRequest, TidegateKubernetes
from tests.integration.test_daemon_actuation import check_daemon_permissions, daemon_permissions


@pytest.fixture
def fleet_factory(kube: KubePeer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., KubeFleet]]:
    made: list[KubeFleet] = []
    mark = kube.mark()

    def make(**kw: Any) -> KubeFleet:
        f = KubeFleet(kube, tmp_path, **kw)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()
    report = getattr(request.node, "rep_call", None)
    used = daemon_permissions(kube.requests_since(mark), managed=[ns for f in made for ns in f.namespaces],
                              release=[f.home_ns for f in made])
    check_daemon_permissions(used, request.node.name, passed=report is not None and report.passed)


def _reads(f: KubeFleet) -> list[tuple[str, str]]:
    """The requests of a tick that reads the fleet and writes nothing."""
    return sorted([("GET", "/api/v1/nodes")] + [(m, p) for ns in f.namespaces for m, p in (
        ("GET", f"/apis/apps/v1/namespaces/{ns}/deployments"), ("GET", f"/api/v1/namespaces/{ns}/pods"))])


def _calls(requests: list[KubeRequest]) -> list[tuple[str, str]]:
    return sorted((r.method, r.path) for r in requests)


def _scale_path(f: KubeFleet, model: str) -> str:
    return f"/apis/apps/v1/namespaces/{f.namespace_of[model]}/deployments/{model}-onprem/scale"


def _rows(f: KubeFleet, report: Any, model: str) -> list[dict[str, Any]]:
    return list(f.runtime.daemon.repo.get_decision(report.decision_ids[model])["actions"])


@pytest.mark.parametrize("models", [2, 12])
def test_a_steady_tick_lists_each_namespace_once_whatever_the_models_and_pools(
        fleet_factory: Callable[..., KubeFleet], models: int) -> None:
    f = fleet_factory(models=models, namespaces=2)
    for _ in range(3):
        report, requests = f.tick(queue=1)
        assert report.ok, report.errors
        # 3 pools x `models` Deployments, read in five requests; nothing to write
        assert _calls(requests) == _reads(f)
    assert {p: s["replicas"] for p, s in f.runtime.daemon.repo.get_decision(
        report.decision_ids["m0001"])["signals"]["pools"].items()} == {"onprem": 1, "ca-spot": 0, "ca-od": 0}


def test_a_deployment_scaled_by_someone_else_is_seen_at_the_next_tick_and_set_back_with_one_patch(
        fleet_factory: Callable[..., KubeFleet]) -> None:
    f = fleet_factory(models=4)
    f.tick(queue=1)
    f.ctl.apps.patch_namespaced_deployment_scale("m0001-onprem", f.namespace_of["m0001"], {"spec": {"replicas": 3}})

    report, requests = f.tick()
    signals = f.runtime.daemon.repo.get_decision(report.decision_ids["m0001"])["signals"]
    assert signals["pools"]["onprem"]["replicas"] == 3  # this tick's read, not the last tick's
    # the tick's list held its replicas and resourceVersion: one patch, no read of the scale
    assert _calls(requests) == sorted(_reads(f) + [("PATCH", _scale_path(f, "m0001"))])
    assert [(a["call"], a["status"], a["arguments"]["previous_replicas"]) for a in _rows(f, report, "m0001")] == [
        (CALL_SCALE, "ok", 3)]
    assert f.ctl.apps.read_namespaced_deployment("m0001-onprem", f.namespace_of["m0001"]).spec.replicas == 1

    report, requests = f.tick()
    assert _calls(requests) == _reads(f)


def _scale_to(replicas: int, namespace: str, name: str) -> Callable[[TidegateKubernetes], None]:
    """Another writer (an operator's ``kubectl scale``) moving the Deployment, new resourceVersion."""
    def write(emu: TidegateKubernetes) -> None:
        (key,) = [k for k in emu._objects if k[1:] == (namespace, name)]
        emu._objects[key].patch({"spec": {"replicas": replicas}, "metadata": {"resourceVersion": emu._next_rv()}})
    return write


def test_a_change_between_the_ticks_read_and_its_patch_is_a_conflict_reread_and_retried(
        fleet_factory: Callable[..., KubeFleet], kube: KubePeer) -> None:
    f = fleet_factory(models=4)
    f.tick(queue=1)
    ns = f.namespace_of["m0002"]
    f.ctl.apps.patch_namespaced_deployment_scale("m0002-onprem", ns, {"spec": {"replicas": 3}})
    # after the daemon has read it at 3 and before its patch lands, someone sets it to 2
    kube.fault("PATCH", rf"/namespaces/{ns}/deployments/m0002-onprem/scale$", None,
               before=_scale_to(2, ns, "m0002-onprem"))

    report, requests = f.tick()
    mine = [(r.method, r.path) for r in requests if r.path == _scale_path(f, "m0002")]
    assert mine == [("PATCH", _scale_path(f, "m0002")), ("GET", _scale_path(f, "m0002")),
                    ("PATCH", _scale_path(f, "m0002"))]
    rows = _rows(f, report, "m0002")
    assert [(a["status"], a["arguments"]["previous_replicas"]) for a in rows] == [("failed-transient", 3), ("ok", 2)]
    assert "409" in rows[0]["error"] and "ConflictError" in rows[0]["error"]
    assert f.ctl.apps.read_namespaced_deployment("m0002-onprem", ns).spec.replicas == 1


def test_an_unreadable_namespace_costs_one_retry_budget_a_tick_and_is_read_afresh_next_tick(
        fleet_factory: Callable[..., KubeFleet], kube: KubePeer) -> None:
    f = fleet_factory(models=6, namespaces=2)
    f.tick(queue=1)
    down = f.namespaces[0]
    attempts = int(FAST_RETRY["max_attempts"])
    kube.fault("GET", rf"/namespaces/{down}/deployments$", 503, times=attempts)

    report, requests = f.tick()
    # one retry budget for the namespace, shared by its 3 models x 3 pools
    assert sum(1 for r in requests if r.path.endswith(f"/namespaces/{down}/deployments")) == attempts
    repo = f.runtime.daemon.repo
    for m in f.models:
        pools = repo.get_decision(report.decision_ids[m])["signals"]["pools"]
        # unknown where it could not be read (the core holds), known elsewhere
        assert {s["replicas"] for s in pools.values()} == ({None} if f.namespace_of[m] == down else {0, 1}), m
    assert not any(r.is_write for r in requests)

    report, requests = f.tick()
    assert _calls(requests) == _reads(f)
    assert repo.get_decision(report.decision_ids["m0000"])["signals"]["pools"]["onprem"]["replicas"] == 1
