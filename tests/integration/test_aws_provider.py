"""The AWS adapters against moto in server mode (Auto Scaling, EC2, SQS) on 127.0.0.1, combined with
the Kubernetes adapter against kmock for the pool as a whole.

moto stores spot settings without simulating them, returns fake spot prices and never reports a
failed scaling activity; a recording proxy in front of it (``AwsPeer``) answers chosen actions with
AWS-shaped throttling / 5xx errors or failed-activity documents, and interruption notices arrive
the way they do in production: EventBridge event JSON in the SQS queue.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import botocore.exceptions
import pytest

from controller.core.model import ActionStatus, Tier, PoolSpec
from controller.protocols import PermanentProviderError, TransientProviderError
from providers.aws import (
    ASG_NAMES_PER_DESCRIBE, CALL_SET_DESIRED, CALL_TERMINATE, AwsGroupReads, AwsInterruptionQueue, AwsNodeGroup,
    AwsSettings, AwsSpotPrices,
    SpotPriceTarget, capacity_failure, instance_id_from_provider_id, make_client, parse_event,
)
from providers.base import NoticeKind, RetryPolicy, actions_of
from providers.cloudpool import CloudPoolProvider
from providers.kubernetes import CALL_SCALE, Deployment, KubernetesCluster, KubernetesPoolProvider, KubernetesSettings
from tests.integration.peers import (
    AWS_REGION, AwsPeer, KubeControllers, KubePeer, asg_instances, aws_env, create_asg, ec2_error, query_error,
    rebalance_event, scaling_activities, spot_interruption_event,
)
from tests.integration.test_kubernetes_provider import FAST_RETRY, model_spec

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


# --- pure parsing ------------------------------------------------------------------------------


def test_eventbridge_events_become_notices_of_the_right_kind() -> None:
    warn = parse_event(json.dumps(spot_interruption_event("i-0abc", at=T0)))
    assert (warn.kind, warn.instance_ids, warn.at) == (NoticeKind.INTERRUPTION, ("i-0abc",), T0)
    reb = parse_event(json.dumps(rebalance_event("i-0def", at=T0)))
    assert (reb.kind, reb.instance_ids) == (NoticeKind.REBALANCE, ("i-0def",))
    assert parse_event(json.dumps(rebalance_event("i-0def", at=T0)), rebalance_is_interruption=True).kind \
        is NoticeKind.INTERRUPTION
    stopping = {"version": "0", "detail-type": "EC2 Instance State-change Notification", "source": "aws.ec2",
                "time": "2025-03-01T12:00:00Z", "detail": {"instance-id": "i-1", "state": "stopping"}}
    assert parse_event(json.dumps(stopping)).kind is NoticeKind.INTERRUPTION
    running = {**stopping, "detail": {"instance-id": "i-1", "state": "running"}}
    assert parse_event(json.dumps(running)).kind is None
    health = {"version": "0", "detail-type": "AWS Health Event", "source": "aws.health", "time": "2025-03-01T12:00:00Z",
              "detail": {"service": "EC2", "eventTypeCategory": "scheduledChange",
                         "affectedEntities": [{"entityValue": "i-2"}, {"entityValue": "vol-1"}]}}
    assert parse_event(json.dumps(health)).instance_ids == ("i-2",)
    # delivered through SNS: the event is the notification's Message
    sns = {"Type": "Notification", "MessageId": "m", "Message": json.dumps(spot_interruption_event("i-9", at=T0))}
    assert parse_event(json.dumps(sns)).instance_ids == ("i-9",)
    with pytest.raises(ValueError):
        parse_event(json.dumps({"hello": "world"}))
    with pytest.raises(ValueError):
        parse_event("not json")


@pytest.mark.parametrize("activity, expected", [
    ({"StatusCode": "Failed", "StatusMessage": "We currently do not have sufficient g5.12xlarge capacity in the "
      "Availability Zone you requested (us-east-1a). Launching EC2 instance failed."}, True),
    ({"StatusCode": "Failed", "StatusMessage": "Could not launch Spot Instances. InsufficientInstanceCapacity - There "
      "is no Spot capacity available that matches your request. Launching EC2 instance failed."}, True),
    ({"StatusCode": "Cancelled", "StatusMessage": "You have requested more vCPU capacity than your current vCPU limit "
      "of 64 allows. VcpuLimitExceeded"}, True),
    ({"StatusCode": "Failed", "StatusMessage": "The image id '[ami-1]' does not exist. Launching EC2 instance failed."}, False),
    ({"StatusCode": "Successful", "StatusMessage": "InsufficientInstanceCapacity"}, False),
])
def test_capacity_failures_are_recognised_from_activity_status(activity: dict[str, str], expected: bool) -> None:
    assert (capacity_failure(activity) is not None) is expected


def test_provider_ids_map_to_instance_ids() -> None:
    assert instance_id_from_provider_id("aws:///us-east-1a/i-0123456789abcdef0") == "i-0123456789abcdef0"
    assert instance_id_from_provider_id("aws://us-east-1a/i-0abc") == "i-0abc"
    assert instance_id_from_provider_id("gce://proj/us-central1-a/vm-1") is None
    assert instance_id_from_provider_id(None) is None


# --- peers -------------------------------------------------------------------------------------


class AwsWorld:
    """One spot pool: an Auto Scaling group, its nodes in the cluster and a model's Deployment."""

    def __init__(self, aws: AwsPeer, kube: KubePeer, *, max_size: int = 4, min_size: int = 0, desired: int = 0,
                 queue: bool = False) -> None:
        aws.reset()
        self.aws = aws
        self.kube = kube
        tag = uuid.uuid4().hex[:6]
        self.group = f"gpu-spot-{tag}"
        self.ns = f"a-{tag}"
        self.labels = {"tidegate.io/pool": f"aws-spot-{tag}"}
        self.settings = AwsSettings(endpoint_url=aws.url, retry=FAST_RETRY)
        create_asg(aws, self.group, max_size=max_size, min_size=min_size, desired=desired)
        self.autoscaling = make_client("autoscaling", AWS_REGION, self.settings)
        self.queue_url = None
        self.queue: AwsInterruptionQueue | None = None
        if queue:
            sqs = make_client("sqs", AWS_REGION, self.settings)
            self.queue_url = aws.client("sqs", direct=True).create_queue(QueueName=f"itn-{tag}")["QueueUrl"]
            self.queue = AwsInterruptionQueue(sqs, self.queue_url, self.settings)
        self.node_group = AwsNodeGroup(self.group, self.autoscaling, interruptions=self.queue, settings=self.settings)
        self.pool = PoolSpec(f"aws-spot-{tag}", Tier.SPOT, "aws", "A100-80GB", gpus_per_node=4, max_nodes=max_size,
                             price_per_node_hour_usd=12.0, provisioning_delay_s=180)
        self.model = model_spec("llama", (self.pool.name,))
        self.api = kube.api_client()
        self.ctl = KubeControllers(self.api)
        self.ctl.add_deployment(self.ns, "llama-spot", {"app": "llama", "pool": self.pool.name}, 0, gpus=2,
                                node_selector=self.labels)
        ks = KubernetesSettings(retry=FAST_RETRY)
        self.kpool = KubernetesPoolProvider(self.pool, {"llama": Deployment(self.ns, "llama-spot")},
                                            KubernetesCluster(self.api, ks), node_selector=self.labels, settings=ks)

    def provider(self) -> CloudPoolProvider:
        return CloudPoolProvider(self.kpool, self.node_group)

    def cluster_catches_up(self, now: datetime) -> None:
        """Instances join as nodes, pods follow the Deployment (the controllers' work)."""
        self.ctl.sync_nodes(asg_instances(self.aws, self.group), self.labels, self.pool.gpus_per_node)
        self.ctl.reconcile(now)

    def desired(self) -> int:
        g = self.aws.client("autoscaling", direct=True).describe_auto_scaling_groups(AutoScalingGroupNames=[self.group])
        return int(g["AutoScalingGroups"][0]["DesiredCapacity"])

    def send(self, event: dict[str, object] | str) -> None:
        body = event if isinstance(event, str) else json.dumps(event)
        self.aws.client("sqs", direct=True).send_message(QueueUrl=self.queue_url, MessageBody=body)


def _actions(aws: AwsPeer, mark: int) -> list[str]:
    return [r.action for r in aws.requests_since(mark)]


# --- the node group ----------------------------------------------------------------------------


def test_describe_reads_the_groups_bounds_and_instances(aws: AwsPeer, kube: KubePeer) -> None:
    w = AwsWorld(aws, kube, max_size=5, min_size=1, desired=2)
    g = w.node_group.describe(T0)
    assert (g.name, g.target, g.min_size, g.max_size, g.running, g.creating) == (w.group, 2, 1, 5, 2, 0)
    assert all(i.instance_id.startswith("i-") and i.state == "InService" for i in g.instances)
    mark = aws.mark()
    with pytest.raises(PermanentProviderError, match="not found"):
        AwsNodeGroup("no-such-group", w.autoscaling, settings=w.settings).describe(T0)
    assert _actions(aws, mark) == ["DescribeAutoScalingGroups"]  # permanent: not retried


def test_the_groups_of_a_region_are_described_together_within_a_block_and_alone_outside(aws: AwsPeer) -> None:
    aws.reset()
    s = AwsSettings(endpoint_url=aws.url, retry=FAST_RETRY)
    autoscaling = make_client("autoscaling", AWS_REGION, s)
    reads = AwsGroupReads(autoscaling, s)
    tag = uuid.uuid4().hex[:6]
    count = ASG_NAMES_PER_DESCRIBE + 1
    for i in range(count):
        create_asg(aws, f"g{i:02d}-{tag}", max_size=3, desired=i % 3)
    groups = [AwsNodeGroup(f"g{i:02d}-{tag}", autoscaling, settings=s, reads=reads) for i in range(count)]

    mark = aws.mark()
    with groups[0].sharing_reads(), groups[1].sharing_reads():  # each pool opens it; the first ends it
        assert [g.describe(T0).target for g in groups] == [i % 3 for i in range(count)]
        assert [g.describe(T0).target for g in groups] == [i % 3 for i in range(count)]  # the block's read
    described = [r for r in aws.requests_since(mark) if r.action == "DescribeAutoScalingGroups"]
    assert [sum(k.startswith("AutoScalingGroupNames.") for k in r.params) for r in described] == [
        ASG_NAMES_PER_DESCRIBE, 1]

    mark = aws.mark()
    assert groups[7].describe(T0).target == 1
    (alone,) = [r for r in aws.requests_since(mark) if r.action == "DescribeAutoScalingGroups"]
    assert [v for k, v in alone.params.items() if k.startswith("AutoScalingGroupNames.")] == [groups[7].name]


def test_throttling_and_5xx_are_retried_with_backoff(aws: AwsPeer, kube: KubePeer) -> None:
    w = AwsWorld(aws, kube)
    aws.fault("SetDesiredCapacity", 400, query_error("Throttling", "Rate exceeded"))
    aws.fault("SetDesiredCapacity", 503, query_error("ServiceUnavailable", "Service is unavailable"))
    mark = aws.mark()
    w.node_group.set_target(2)
    log = aws.requests_since(mark)
    assert [(r.action, r.answered_by) for r in log] == [
        ("SetDesiredCapacity", "fault"), ("SetDesiredCapacity", "fault"), ("SetDesiredCapacity", "moto")]
    assert w.desired() == 2


def test_throttling_beyond_the_budget_is_a_transient_error_with_the_client_error_chained(aws: AwsPeer, kube: KubePeer) -> None:
    w = AwsWorld(aws, kube)
    aws.fault("SetDesiredCapacity", 400, query_error("Throttling", "Rate exceeded"), times=100)
    mark = aws.mark()
    t = time.monotonic()
    with pytest.raises(TransientProviderError, match="Throttling") as info:
        w.node_group.set_target(3)
    assert time.monotonic() - t < FAST_RETRY.budget_s + 1.0
    assert isinstance(info.value.__cause__, botocore.exceptions.ClientError)
    assert len(_actions(aws, mark)) == FAST_RETRY.max_attempts
    assert w.desired() == 0


def test_an_answer_botocore_cannot_read_is_transient_and_retried(aws: AwsPeer, kube: KubePeer) -> None:
    """A proxy's or load balancer's HTML page where XML was expected (botocore's
    ``ResponseParserError``, which is not a ``BotoCoreError``) is trouble on the way, not a refusal:
    retried, then a transient error, never an untranslated exception out of the provider."""
    w = AwsWorld(aws, kube, desired=2)
    page = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway"
            b"</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")  # nginx's page
    aws.fault("DescribeAutoScalingGroups", 200, page, content_type="text/html")
    assert w.node_group.describe(T0).target == 2  # the retry read it
    aws.fault("DescribeAutoScalingGroups", 200, page, content_type="text/html", times=100)
    with pytest.raises(TransientProviderError, match="ResponseParserError"):
        w.node_group.describe(T0)


def test_a_well_formed_answer_of_another_shape_is_transient_and_says_so(aws: AwsPeer, kube: KubePeer) -> None:
    """XML that parses but is not the API's answer (an endpoint that is not AWS, a proxy's own
    XML) fails inside botocore's parser with a plain ``KeyError``: it is retried like an
    unreadable page, then a transient error that names the call and the likely cause, never a
    bare ``KeyError`` out of the provider."""
    w = AwsWorld(aws, kube, desired=2)
    other = b'<?xml version="1.0"?><Error><Reason>maintenance window</Reason></Error>'
    aws.fault("DescribeAutoScalingGroups", 200, other, content_type="text/xml")
    assert w.node_group.describe(T0).target == 2  # the retry read it
    aws.fault("DescribeAutoScalingGroups", 200, other, content_type="text/xml", times=100)
    with pytest.raises(TransientProviderError, match=r"DescribeAutoScalingGroups .*could not be read.*endpoint") as info:
        w.node_group.describe(T0)
    assert isinstance(info.value.__cause__, KeyError)


def test_validation_errors_are_permanent_and_not_retried(aws: AwsPeer, kube: KubePeer) -> None:
    w = AwsWorld(aws, kube)
    aws.fault("SetDesiredCapacity", 400, query_error("ValidationError", "New SetDesiredCapacity value 9 is above max value 4"))
    mark = aws.mark()
    with pytest.raises(PermanentProviderError, match="ValidationError"):
        w.node_group.set_target(9)
    assert _actions(aws, mark) == ["SetDesiredCapacity"]


# --- the pool: ordering, idempotency, precise scale-in ------------------------------------------


def test_scale_out_orders_nodes_before_replicas_and_the_same_call_again_changes_nothing(aws: AwsPeer, kube: KubePeer) -> None:
    w = AwsWorld(aws, kube)
    p = w.provider()
    actions = p.scale(w.model, 4, 2, T0)
    assert [(a.provider, a.call, a.status) for a in actions] == [
        ("aws", CALL_SET_DESIRED, ActionStatus.OK), ("kubernetes", CALL_SCALE, ActionStatus.OK)]
    assert actions[0].arguments["nodes"] == 2 and actions[0].arguments["previous_nodes"] == 0
    assert w.desired() == 2
    w.cluster_catches_up(T0)
    st = p.state(w.model, T0 + timedelta(seconds=5))
    assert (st.replicas, st.ready_replicas, st.nodes, st.available) == (4, 4, 2, True)

    amark, kmark = aws.mark(), kube.mark()
    again = p.scale(w.model, 4, 2, T0 + timedelta(seconds=10))
    assert {a.status for a in again} == {ActionStatus.NOOP}
    assert [r for r in aws.requests_since(amark) if r.is_write] == []
    assert [r for r in kube.requests_since(kmark) if r.is_write] == []


def test_nodes_beyond_the_groups_max_are_clamped_and_said_so(aws: AwsPeer, kube: KubePeer) -> None:
    w = AwsWorld(aws, kube, max_size=3)
    pool = PoolSpec(w.pool.name, Tier.SPOT, "aws", "A100-80GB", 4, max_nodes=8, price_per_node_hour_usd=12.0)
    w.kpool.pool = pool
    p = CloudPoolProvider(w.kpool, w.node_group)
    actions = p.scale(w.model, 10, 5, T0)
    assert actions[0].arguments["nodes"] == 3 and "clamped" in actions[0].arguments
    assert w.desired() == 3


def test_a_failed_capacity_order_stops_before_the_replicas(aws: AwsPeer, kube: KubePeer) -> None:
    w = AwsWorld(aws, kube)
    p = w.provider()
    aws.fault("SetDesiredCapacity", 400, query_error("AccessDenied", "not authorized"), times=5)
    with pytest.raises(PermanentProviderError) as info:
        p.scale(w.model, 4, 2, T0)
    assert [(a.call, a.status) for a in actions_of(info.value)] == [(CALL_SET_DESIRED, ActionStatus.FAILED_PERMANENT)]
    assert "AccessDenied" in (actions_of(info.value)[0].error or "")
    assert p.state(w.model, T0).replicas == 0  # no Pending replicas ordered without capacity


def test_scale_in_removes_replicas_first_and_releases_only_nodes_without_pods(aws: AwsPeer, kube: KubePeer) -> None:
    w = AwsWorld(aws, kube)
    p = w.provider()
    p.scale(w.model, 6, 3, T0)
    w.cluster_catches_up(T0)  # 3 nodes, 2 replicas (TP 2 of 4 GPUs) on each
    assert p.state(w.model, T0).ready_replicas == 6

    first = p.scale(w.model, 2, 1, T0 + timedelta(seconds=30))
    assert [(a.call, a.status) for a in first] == [(CALL_SCALE, ActionStatus.OK), (CALL_TERMINATE, ActionStatus.SKIPPED)]
    assert first[1].arguments["waiting_for_pods_on"] == 2 and w.desired() == 3  # pods still on every node

    w.ctl.reconcile(T0 + timedelta(seconds=40))  # the Deployment controller removes 4 pods
    busy = p.kube.busy_nodes(T0)
    assert len(busy) == 1
    mark = aws.mark()
    second = p.scale(w.model, 2, 1, T0 + timedelta(seconds=60))
    assert [(a.call, a.status) for a in second] == [(CALL_SCALE, ActionStatus.NOOP), (CALL_TERMINATE, ActionStatus.OK)]
    terminated = [r.params["InstanceId"] for r in aws.requests_since(mark) if r.action == "TerminateInstanceInAutoScalingGroup"]
    assert sorted(terminated) == sorted(second[1].arguments["instances"]) and len(terminated) == 2
    kept = asg_instances(aws, w.group)
    assert w.desired() == 1 and len(kept) == 1
    assert set(kept) == busy  # the instance left is the one whose node still serves


# --- capacity trouble and interruptions ---------------------------------------------------------


def test_a_failed_scaling_activity_for_lack_of_capacity_marks_the_pool_unavailable_for_a_while(aws: AwsPeer, kube: KubePeer) -> None:
    w = AwsWorld(aws, kube)
    p = w.provider()
    failed = {"ActivityId": str(uuid.uuid4()), "Description": "Launching a new EC2 instance.  Status Reason: We "
              "currently do not have sufficient g5.12xlarge capacity in the Availability Zone you requested "
              "(us-east-1a). Launching EC2 instance failed.",
              "Cause": "At 2025-03-01T12:00:00Z an instance was started in response to a difference between desired "
              "and actual capacity, increasing the capacity from 0 to 2.",
              "StartTime": "2025-03-01T12:00:00Z", "EndTime": "2025-03-01T12:00:05Z", "StatusCode": "Failed",
              "StatusMessage": "We currently do not have sufficient g5.12xlarge capacity in the Availability Zone you "
              "requested (us-east-1a). Launching EC2 instance failed.", "Progress": "100"}
    aws.fault("DescribeScalingActivities", 200, scaling_activities(w.group, [failed]), times=100)
    st = p.state(w.model, T0 + timedelta(seconds=30))
    assert not st.available
    assert st.unavailable_reason is not None
    assert st.unavailable_reason.startswith("SpotPoolUnavailable: InsufficientCapacity") and "g5.12xlarge" in st.unavailable_reason
    assert not p.state(w.model, T0 + timedelta(seconds=180)).available
    assert p.state(w.model, T0 + timedelta(seconds=186)).available  # 180 s after the failure ended

    # A later successful launch means capacity came back: no mark even inside the window.
    w2 = AwsWorld(aws, kube)
    ok = {**failed, "ActivityId": str(uuid.uuid4()), "StartTime": "2025-03-01T12:01:00Z",
          "EndTime": "2025-03-01T12:01:30Z", "StatusCode": "Successful", "StatusMessage": "",
          "Description": "Launching a new EC2 instance: i-0123"}
    aws.fault("DescribeScalingActivities", 200, scaling_activities(w2.group, [failed, ok]), times=100)
    assert w2.provider().state(w2.model, T0 + timedelta(seconds=100)).available


def test_spot_warnings_from_the_queue_mark_the_replicas_on_that_node_interrupted(aws: AwsPeer, kube: KubePeer) -> None:
    w = AwsWorld(aws, kube, queue=True)
    p = w.provider()
    p.scale(w.model, 4, 2, T0)
    w.cluster_catches_up(T0)
    obs = p.kube.observe(w.model, T0)
    nodes = {n.provider_id.rsplit("/", 1)[-1]: n.name for n in obs.nodes if n.provider_id}
    doomed, other = sorted(nodes)
    w.send(spot_interruption_event(doomed, at=T0 + timedelta(seconds=20)))
    w.send(rebalance_event(other, at=T0 + timedelta(seconds=20)))
    w.send("this is not an event")
    w.send({"version": "0", "detail-type": "EC2 Instance State-change Notification", "time": "2025-03-01T12:00:20Z",
            "detail": {"instance-id": other, "state": "running"}})

    st = p.state(w.model, T0 + timedelta(seconds=25))
    assert st.interrupted_replicas == obs.pods_by_node[nodes[doomed]] == 2
    assert st.recent_interruptions == 1
    g = p.last_group_state
    assert g is not None and {(n.instance_id, n.kind) for n in g.notices} == {
        (doomed, NoticeKind.INTERRUPTION), (other, NoticeKind.REBALANCE)}
    assert w.queue is not None and w.queue.ignored == 2
    left = aws.client("sqs", direct=True).get_queue_attributes(
        QueueUrl=w.queue_url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    assert left["Attributes"] == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}
    # notices outlive the message (the queue was drained) until their TTL
    assert p.state(w.model, T0 + timedelta(seconds=60)).interrupted_replicas == 2
    assert p.state(w.model, T0 + timedelta(seconds=20 + 601)).interrupted_replicas == 0


# --- spot prices -------------------------------------------------------------------------------


def test_spot_prices_are_cached_by_refresh_with_static_fallback(aws: AwsPeer, kube: KubePeer) -> None:
    aws.reset()
    s = AwsSettings(endpoint_url=aws.url, retry=FAST_RETRY, spot_price_max_age_s=600)
    spot = PoolSpec("aws-spot", Tier.SPOT, "aws", "A10G", 4, 8, price_per_node_hour_usd=2.5)
    od = PoolSpec("aws-od", Tier.ONDEMAND, "aws", "A10G", 4, 8, price_per_node_hour_usd=5.67)
    nolive = PoolSpec("aws-spot-b", Tier.SPOT, "aws", "A10G", 4, 8, price_per_node_hour_usd=2.0)
    prices = AwsSpotPrices({"aws-spot": SpotPriceTarget(AWS_REGION, "g5.12xlarge", ("us-east-1a", "us-east-1b"))},
                           lambda region: make_client("ec2", region, s), s)
    assert prices.prices([spot, od, nolive], T0) == {"aws-spot": 2.5, "aws-od": 5.67, "aws-spot-b": 2.0}
    moto_price = float(aws.client("ec2", direct=True).describe_spot_price_history(
        InstanceTypes=["g5.12xlarge"], Filters=[{"Name": "availability-zone", "Values": ["us-east-1a"]}])
        ["SpotPriceHistory"][0]["SpotPrice"])
    assert prices.refresh(T0) == {"aws-spot": moto_price}
    assert prices.prices([spot, od, nolive], T0 + timedelta(seconds=60)) == {
        "aws-spot": moto_price, "aws-od": 5.67, "aws-spot-b": 2.0}
    # a failed refresh keeps the last price (until it ages out) and says why
    aws.fault("DescribeSpotPriceHistory", 503, ec2_error("Unavailable", "try later"), times=100)
    assert prices.refresh(T0 + timedelta(seconds=120)) == {}
    assert "Unavailable" in prices.errors["aws-spot"]
    assert prices.prices([spot], T0 + timedelta(seconds=300))["aws-spot"] == moto_price
    assert prices.prices([spot], T0 + timedelta(seconds=601))["aws-spot"] == 2.5


def test_the_refresh_job_runs_under_apscheduler(aws: AwsPeer, kube: KubePeer) -> None:
    from apscheduler.schedulers.background import BackgroundScheduler

    from providers.clock import ManualClock

    aws.reset()
    s = AwsSettings(endpoint_url=aws.url, retry=FAST_RETRY)
    prices = AwsSpotPrices({"aws-spot": SpotPriceTarget(AWS_REGION, "g5.12xlarge")},
                           lambda region: make_client("ec2", region, s), s)
    clock = ManualClock(T0)
    sched = BackgroundScheduler(timezone="UTC")
    sched.add_job(prices.refresh_job(clock), "interval", seconds=300, next_run_time=datetime.now(timezone.utc),
                  id="spot-prices", max_instances=1, coalesce=True)
    sched.start()
    try:
        deadline = time.monotonic() + 10
        while prices.live("aws-spot", T0) is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        sched.shutdown(wait=True)
    assert prices.live("aws-spot", T0) is not None
    assert any(r.action == "DescribeSpotPriceHistory" for r in aws.requests())
