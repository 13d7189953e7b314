"""The daemon reads each node group once a tick, whatever its number of models, and never acts on a
read older than the tick: the daemon as ``tidegate run`` builds it (``tests.integration.cloud_fleet``:
two Auto Scaling groups in one region, a managed instance group, the SQS interruption queue), its
calls counted where they arrive (moto's recording proxy, the local compute server).

- A steady tick is one DescribeAutoScalingGroups naming both groups, one DescribeScalingActivities
  per group, one ReceiveMessage and, for the managed instance group, one GET and one
  listManagedInstances: the same for 2 models as for 12 (it was both groups' reads for every model
  and pool, once to observe and once more to act).
- A node group resized by someone else between two ticks is seen at the next tick and set back:
  the first model's scale releases the extra instance; the group is read again after that write,
  so every later model of the pool compares with what the write left (no call), not with the
  tick's first read.
- A throttled DescribeAutoScalingGroups costs the tick one retry budget, not one per model and
  pool; those pools are unknown for the tick (the core holds) and read afresh at the next.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from providers.aws import CALL_TERMINATE
from providers.gcp import CALL_DELETE_INSTANCES
from tests.integration.cloud_fleet import CloudFleet, cloud_calls
from tests.integration.gcp_server import GcpComputeServer
from tests.integration.kube_fleet import FAST_RETRY
from tests.integration.peers import AwsPeer, KubePeer, query_error

READS = Counter({"aws:DescribeAutoScalingGroups": 1, "aws:DescribeScalingActivities": 2, "aws:ReceiveMessage": 1,
                 "gcp:get": 1, "gcp:listManagedInstances": 1})
"""A tick that reads every node group and writes nothing."""


@pytest.fixture
def fleet_factory(kube: KubePeer, aws: AwsPeer, gcp: GcpComputeServer, tmp_path: Path) -> Iterator[Callable[..., CloudFleet]]:
    made: list[CloudFleet] = []

    def make(**kw: Any) -> CloudFleet:
        f = CloudFleet(kube, aws, gcp, tmp_path, **kw)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def _settled(f: CloudFleet) -> None:
    """Each model's one replica on aws-spot, one node each, all running."""
    report, _, _ = f.tick(queue=1)
    assert report.ok, report.errors
    f.catch_up()
    assert (f.desired("aws-spot"), f.desired("aws-od"), f.desired("gcp-spot")) == (len(f.models), 0, 0)


def _pool(f: CloudFleet, report: Any, model: str, pool: str) -> dict[str, Any]:
    return dict(f.runtime.daemon.repo.get_decision(report.decision_ids[model])["signals"]["pools"][pool])


def _rows(f: CloudFleet, report: Any, model: str, pool: str) -> list[tuple[str, str, Any]]:
    """The node group's action rows of a model's decision (the log keeps no NOOP rows, only their count)."""
    return [(a["call"], a["status"], a["arguments"].get("previous_nodes"))
            for a in f.runtime.daemon.repo.get_decision(report.decision_ids[model])["actions"]
            if a["pool"] == pool and a["provider"] != "kubernetes"]


@pytest.mark.parametrize("models", [2, 12])
def test_a_steady_tick_reads_each_node_group_once_whatever_the_models(
        fleet_factory: Callable[..., CloudFleet], models: int) -> None:
    f = fleet_factory(models=models)
    _settled(f)
    for _ in range(3):
        report, aws, gcp = f.tick(queue=1)
        assert report.ok, report.errors
        # 3 node groups x `models` models, observed and acted on, in six calls
        assert cloud_calls(aws, gcp) == READS
    (describe,) = [r for r in aws if r.action == "DescribeAutoScalingGroups"]
    assert sorted(v for k, v in describe.params.items() if k.startswith("AutoScalingGroupNames.")) == sorted(f.asg.values())
    last = f.models[-1]
    seen = {p: _pool(f, report, last, p) for p in ("aws-spot", "gcp-spot", "aws-od")}
    assert {p: (s["replicas"], s["nodes"]) for p, s in seen.items()} == {
        "aws-spot": (1, models), "gcp-spot": (0, 0), "aws-od": (0, 0)}
    assert _rows(f, report, last, "aws-spot") == []


def test_a_node_group_resized_by_someone_else_is_seen_at_the_next_tick_and_set_back(
        fleet_factory: Callable[..., CloudFleet], aws: AwsPeer, gcp: GcpComputeServer) -> None:
    f = fleet_factory(models=4)
    _settled(f)
    f.tick(queue=1)
    # between two ticks an operator adds a node to each spot group (not yet joined to the cluster)
    aws.client("autoscaling", direct=True).set_desired_capacity(AutoScalingGroupName=f.asg["aws-spot"], DesiredCapacity=5)
    gcp.resize(f.mig, 1)

    report, aws_calls, gcp_calls = f.tick()
    assert report.ok, report.errors
    first, *others = f.models
    # this tick's read, not the last tick's
    assert _pool(f, report, first, "aws-spot")["nodes"] == 5 and _pool(f, report, first, "gcp-spot")["nodes"] == 1
    # the first model's scale releases the extra instance; after that write the group is read
    # again (one more describe), and every later model finds it at its target: no row, no call
    # (with the tick's first read each would release again)
    assert _rows(f, report, first, "aws-spot") == [(CALL_TERMINATE, "ok", 5)]
    assert _rows(f, report, first, "gcp-spot") == [(CALL_DELETE_INSTANCES, "ok", 1)]
    for m in others:
        assert _rows(f, report, m, "aws-spot") == _rows(f, report, m, "gcp-spot") == [], m
    assert cloud_calls(aws_calls, gcp_calls) == READS + Counter({
        "aws:TerminateInstanceInAutoScalingGroup": 1, "aws:DescribeAutoScalingGroups": 1,
        "gcp:deleteInstances": 1, "gcp:get": 1, "gcp:listManagedInstances": 1})
    assert (f.desired("aws-spot"), f.desired("gcp-spot")) == (4, 0)

    report, aws_calls, gcp_calls = f.tick()
    assert cloud_calls(aws_calls, gcp_calls) == READS
    assert _pool(f, report, first, "aws-spot")["nodes"] == 4


def test_a_throttled_describe_costs_one_retry_budget_a_tick_and_is_read_afresh_next_tick(
        fleet_factory: Callable[..., CloudFleet], aws: AwsPeer) -> None:
    f = fleet_factory(models=6)
    _settled(f)
    attempts = int(FAST_RETRY["max_attempts"])
    aws.fault("DescribeAutoScalingGroups", 400, query_error("Throttling", "Rate exceeded"), times=attempts)

    report, aws_calls, gcp_calls = f.tick(queue=1)
    # one retry budget for both groups, shared by 6 models x 2 pools, observing and acting
    assert cloud_calls(aws_calls, [])["aws:DescribeAutoScalingGroups"] == attempts
    assert not any(r.is_write for r in aws_calls) and not any(r.is_write for r in gcp_calls)
    for m in f.models:
        pools = {p: _pool(f, report, m, p)["replicas"] for p in ("aws-spot", "gcp-spot", "aws-od")}
        assert pools == {"aws-spot": None, "gcp-spot": 0, "aws-od": None}, m  # unknown: the core holds

    report, aws_calls, gcp_calls = f.tick(queue=1)
    assert report.ok, report.errors
    assert cloud_calls(aws_calls, gcp_calls) == READS
    assert _pool(f, report, f.models[0], "aws-spot")["replicas"] == 1
