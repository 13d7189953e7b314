"""AWS side of the pools with ``provider: aws`` (spot or on-demand), through boto3.

Why it exists: an AWS pool's nodes are an Auto Scaling group (spot through a MixedInstancesPolicy,
or on-demand); tidegate sets its desired capacity in nodes (the core computes them from replicas x
TP / GPUs per node) within the group's min and max, and on the way down terminates exactly the
instances that no longer hold pods (``terminate_instance_in_auto_scaling_group`` with decrement;
a plain lower desired capacity lets the group pick a busy victim). Around that:

- capacity trouble: failed scaling activities whose status says insufficient capacity (or a spot /
  vCPU quota) are reported so the pool is marked unavailable for a while (``CloudPoolProvider``);
- interruptions: spot interruption warnings and rebalance recommendations arrive as EventBridge
  events in an SQS queue (the setup Karpenter uses); ``AwsInterruptionQueue`` drains it into
  notices by instance id, which the Kubernetes side maps to nodes through ``providerID``;
- prices: ``AwsSpotPrices`` caches ``describe_spot_price_history`` per pool, refreshed by a
  scheduler job, and falls back to the configured static price when no fresh live price exists;
- reads: within a tick (``sharing_reads()``, held open by the ``Controller``) the groups of one
  region are described in one call and each group's state serves every model of its pool
  (``AwsGroupReads``); a write of ours to a group makes its next read fresh;
- errors: throttling and 5xx are retried with exponential backoff and full jitter inside a time
  budget (botocore's own retries are switched off so that the budget is ours); everything is
  translated into the project's exception tree with the boto error chained.
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.core.model import PoolSpec, Tier
from controller.errors import PermanentProviderError, ProviderError, TransientProviderError
from providers.base import (
    GroupInstance, GroupState, Notice, NoticeKind, RetryPolicy, SharedReads, retry_transient,
)
from providers.registry import BuildContext, PoolProviderKind, ProviderParts

logger = logging.getLogger("tidegate.providers.aws")

PROVIDER = "aws"
CALL_SET_DESIRED = "set_desired_capacity"
CALL_TERMINATE = "terminate_instance_in_auto_scaling_group"

SPOT_INTERRUPTION = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
STATE_CHANGE = "EC2 Instance State-change Notification"
HEALTH_EVENT = "AWS Health Event"

TRANSIENT_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestLimitExceeded", "TooManyRequestsException",
    "RequestThrottled", "RequestThrottledException", "EC2ThrottledException", "SlowDown", "BandwidthLimitExceeded",
    "ServiceUnavailable", "ServiceUnavailableException", "Unavailable", "InternalError", "InternalFailure",
    "InternalServiceError", "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete",
    # Auto Scaling: another scaling activity or update is running; the same request succeeds later.
    "ScalingActivityInProgress", "ResourceContention",
})
"""Error codes that mean "try again later" (throttling, server trouble, contention)."""

CAPACITY_MARKERS = (
    "InsufficientInstanceCapacity", "InsufficientCapacity", "do not have sufficient",
    "no Spot capacity available", "UnfulfillableCapacity", "MaxSpotInstanceCountExceeded",
    "VcpuLimitExceeded", "InstanceLimitExceeded", "InsufficientFreeAddressesInSubnet",
)
"""Substrings of a failed scaling activity's status that mean the pool cannot get capacity now
(an EC2 capacity shortage, or a spot / vCPU / instance quota): the same errors Karpenter caches."""


# --- settings ----------------------------------------------------------------------------------


class AwsSettings(BaseModel):
    """``providers.settings.aws``: boto3 for Auto Scaling, EC2 spot prices and the SQS
    interruption queue (credentials come from the usual chain: IRSA / pod identity, environment,
    instance profile), and how long what the adapters learn stays true."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint_url: str | None = Field(None, description="Override of every AWS endpoint (a proxy, tests). Unset: each region's default.")
    connect_timeout_s: float = Field(3.0, gt=0, description="Connection timeout per request, seconds.")
    read_timeout_s: float = Field(10.0, gt=0, description="Read timeout per request, seconds.")
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="Backoff for throttling and 5xx (botocore's own retries are off so the budget is ours).")
    capacity_error_lookback_s: float = Field(900.0, gt=0, description="Failed scaling activities older than this are ignored, seconds.")
    interruption_queue_url: str | None = Field(None, description="SQS queue fed by EventBridge rules for spot interruption warnings, rebalance recommendations, instance state changes and scheduled health events (as Karpenter uses). Unset: interruptions only from node taints. Not read in dry-run (reading deletes messages).")
    queue_poll_interval_s: float = Field(2.0, ge=0, description="The queue is read at most this often, seconds (daemon clock).")
    queue_max_batches: int = Field(10, ge=1, description="At most this many ReceiveMessage batches (10 messages each) per poll.")
    notice_ttl_s: float = Field(600.0, gt=0, description="A notice read from the queue is kept this long after the event's time, seconds (the spot warning comes 2 minutes ahead; the instance is gone well within this).")
    rebalance_is_interruption: bool = Field(False, description="Treat rebalance recommendations as interruptions (replace at once) instead of a softer notice (off, as in Karpenter and the node termination handler).")
    spot_price_max_age_s: float = Field(3600.0, gt=0, description="A live spot price older than this is no longer used (the pool's static price is), seconds.")
    product_description: str = Field("Linux/UNIX", description="Spot price product description to query.")
    spot_price_refresh_s: float = Field(300.0, gt=0, description="Seconds between refreshes of the live spot prices (describe_spot_price_history; a scheduler job, never on the tick's path). Must be shorter than spot_price_max_age_s.")

    @model_validator(mode="after")
    def _refresh_before_expiry(self) -> "AwsSettings":
        if self.spot_price_refresh_s >= self.spot_price_max_age_s:
            raise ValueError(f"spot_price_refresh_s ({self.spot_price_refresh_s:g}) must be less than "
                             f"spot_price_max_age_s ({self.spot_price_max_age_s:g}), or live prices expire between refreshes")
        return self


class AwsPoolSettings(BaseModel):
    """``pools[].aws``: the Auto Scaling group behind one pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str = Field(description="AWS region, e.g. us-east-1.")
    auto_scaling_group: str = Field(description="Auto Scaling group holding this pool's nodes.")
    instance_type: str | None = Field(None, description="EC2 instance type, used to look up spot prices.")
    availability_zones: list[str] = Field(default_factory=list, description="Zones to read spot prices for (empty: all of the group's).")


def boto_config(settings: AwsSettings) -> Any:
    """botocore config with its own retries off: ``retry_transient`` owns the time budget."""
    from botocore.config import Config

    return Config(retries={"total_max_attempts": 1, "mode": "standard"},
                  connect_timeout=settings.connect_timeout_s, read_timeout=settings.read_timeout_s)


def make_client(service: str, region: str, settings: AwsSettings, session: Any = None) -> Any:
    """A boto3 client for ``service`` in ``region`` (credentials from the usual chain)."""
    import boto3

    s = session or boto3.session.Session()
    return s.client(service, region_name=region, endpoint_url=settings.endpoint_url, config=boto_config(settings))


# --- errors ------------------------------------------------------------------------------------


def translate_aws_error(e: BaseException, what: str) -> ProviderError:
    """Throttling, 5xx, contention and network trouble are transient; everything else (validation,
    access denied, missing resources, no credentials) is permanent."""
    import botocore.exceptions
    import botocore.parsers

    if isinstance(e, botocore.exceptions.ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        msg = str(err.get("Message", ""))[:300]
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
            return TransientProviderError(f"{what}: {code or status}: {msg}")
        return PermanentProviderError(f"{what}: {code or status}: {msg}")
    if isinstance(e, (botocore.exceptions.NoCredentialsError, botocore.exceptions.ParamValidationError,
                      botocore.exceptions.NoRegionError)):
        return PermanentProviderError(f"{what}: {type(e).__name__}: {e}")
    if isinstance(e, (botocore.exceptions.BotoCoreError, botocore.parsers.ResponseParserError, OSError, TimeoutError)):
        # connection refused, timeouts, unparseable answers (a proxy's HTML 502 page: botocore's
        # ResponseParserError, which is not a BotoCoreError)
        return TransientProviderError(f"{what}: {type(e).__name__}: {e}")
    return PermanentProviderError(f"{what}: unexpected {type(e).__name__}: {e}")


def _call(what: str, fn: Callable[[], Any]) -> Any:
    import botocore.exceptions  # imported when called: the settings and the kind load without botocore
    import botocore.parsers

    try:
        return fn()
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError, botocore.parsers.ResponseParserError,
            OSError) as e:
        raise translate_aws_error(e, what) from e
    except (LookupError, ValueError, TypeError, AttributeError) as e:
        # A well-formed answer of another shape (an endpoint or proxy that is not the AWS API, an
        # API change) fails inside botocore's parser with a plain KeyError and the like: trouble
        # on the way, like an unparseable page. Our own bugs raise them too: only botocore's pass.
        if not _raised_in(e, "botocore"):
            raise
        raise TransientProviderError(
            f"{what}: the answer could not be read ({type(e).__name__} {e} in botocore's parser): "
            "is the endpoint the AWS API, or a proxy in between?") from e


def _raised_in(e: BaseException, package: str) -> bool:
    """Whether the innermost frame of ``e``'s traceback is in ``package``'s files."""
    tb = e.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{os.sep}{package}{os.sep}" in tb.tb_frame.f_code.co_filename


def _aware(t: Any) -> datetime | None:
    if not isinstance(t, datetime):
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def instance_id_from_provider_id(provider_id: str | None) -> str | None:
    """``aws:///us-east-1a/i-0abc`` (as the AWS cloud provider sets ``spec.providerID``) -> ``i-0abc``."""
    if not provider_id or not provider_id.startswith("aws://"):
        return None
    last = provider_id.rstrip("/").rsplit("/", 1)[-1]
    return last if last.startswith("i-") else None


# --- interruption queue ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParsedEvent:
    kind: NoticeKind | None
    """``None`` for events that are not about losing an instance (ignored, still deleted)."""
    instance_ids: tuple[str, ...]
    detail_type: str
    at: datetime | None


def _parse_time(s: Any) -> datetime | None:
    if not isinstance(s, str):
        return None
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None


def parse_event(body: str, *, rebalance_is_interruption: bool = False) -> ParsedEvent:
    """Parse one queue message: an EventBridge event, possibly wrapped in an SNS notification.
    Raises ``ValueError`` when it is not an event at all."""
    doc = json.loads(body)
    if isinstance(doc, dict) and doc.get("Type") == "Notification" and isinstance(doc.get("Message"), str):
        doc = json.loads(doc["Message"])  # delivered through SNS
    if not isinstance(doc, dict) or "detail-type" not in doc:
        raise ValueError("not an EventBridge event (no detail-type)")
    dtype = str(doc["detail-type"])
    detail = doc.get("detail") or {}
    at = _parse_time(doc.get("time"))
    iid = detail.get("instance-id") if isinstance(detail, dict) else None
    ids: tuple[str, ...] = (str(iid),) if iid else ()
    if dtype == SPOT_INTERRUPTION:
        return ParsedEvent(NoticeKind.INTERRUPTION, ids, dtype, at)
    if dtype == REBALANCE_RECOMMENDATION:
        kind = NoticeKind.INTERRUPTION if rebalance_is_interruption else NoticeKind.REBALANCE
        return ParsedEvent(kind, ids, dtype, at)
    if dtype == STATE_CHANGE:
        state = detail.get("state") if isinstance(detail, dict) else None
        gone = state in ("stopping", "stopped", "shutting-down", "terminated")
        return ParsedEvent(NoticeKind.INTERRUPTION if gone else None, ids, dtype, at)
    if dtype == HEALTH_EVENT and isinstance(detail, dict) and detail.get("service") == "EC2" \
            and detail.get("eventTypeCategory") == "scheduledChange":
        ents = detail.get("affectedEntities") or []
        hids = tuple(str(x["entityValue"]) for x in ents if isinstance(x, dict) and str(x.get("entityValue", "")).startswith("i-"))
        return ParsedEvent(NoticeKind.INTERRUPTION, hids, dtype, at)
    return ParsedEvent(None, ids, dtype, at)


class AwsInterruptionQueue:
    """Drains the interruption SQS queue into notices by instance id. One queue serves every AWS
    pool: notices are kept here (with a TTL) and each group asks for its own instances'."""

    def __init__(self, sqs: Any, queue_url: str, settings: AwsSettings = AwsSettings(),
                 *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.settings = settings
        self._sleep = sleep
        self._notices: dict[tuple[str, NoticeKind], Notice] = {}
        self._last_poll: datetime | None = None
        self.ignored = 0
        """Messages deleted without a notice (other events, malformed bodies)."""

    def poll(self, now: datetime, *, force: bool = False) -> int:
        """Read and delete what the queue holds (at most ``queue_max_batches`` batches); returns the
        number of new notices. Skipped if the last poll is more recent than the poll interval."""
        if not force and self._last_poll is not None and \
                (now - self._last_poll).total_seconds() < self.settings.queue_poll_interval_s:
            return 0
        self._last_poll = now
        added = 0
        for _ in range(self.settings.queue_max_batches):
            resp, _ = retry_transient(lambda: _call(
                f"SQS ReceiveMessage on {self.queue_url}",
                lambda: self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10,
                                                 WaitTimeSeconds=0)), self.settings.retry, sleep=self._sleep)
            msgs = resp.get("Messages") or []
            if not msgs:
                break
            done: list[dict[str, str]] = []
            for m in msgs:
                try:
                    ev = parse_event(m.get("Body", ""), rebalance_is_interruption=self.settings.rebalance_is_interruption)
                except ValueError:
                    ev = None
                if ev is None or ev.kind is None or not ev.instance_ids:
                    self.ignored += 1
                else:
                    for iid in ev.instance_ids:
                        key = (iid, ev.kind)
                        if key not in self._notices:
                            added += 1
                            self._notices[key] = Notice(ev.kind, f"sqs:{ev.detail_type}", ev.at or now,
                                                        instance_id=iid)
                # Delete what was read, parsed or not: a poison message must not come back forever
                # (Karpenter does the same).
                done.append({"Id": str(len(done)), "ReceiptHandle": m["ReceiptHandle"]})
            retry_transient(lambda: _call(
                f"SQS DeleteMessageBatch on {self.queue_url}",
                lambda: self.sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=done)),
                self.settings.retry, sleep=self._sleep)
        self._expire(now)
        return added

    def _expire(self, now: datetime) -> None:
        ttl = timedelta(seconds=self.settings.notice_ttl_s)
        self._notices = {k: n for k, n in self._notices.items() if n.at is None or n.at + ttl > now}

    def notices(self, now: datetime) -> list[Notice]:
        self.poll(now)
        self._expire(now)
        return list(self._notices.values())

    def notices_for(self, instance_ids: Sequence[str], now: datetime) -> tuple[Notice, ...]:
        ids = set(instance_ids)
        return tuple(n for n in self.notices(now) if n.instance_id in ids)


# --- the node group ----------------------------------------------------------------------------


def capacity_failure(activity: Mapping[str, Any]) -> str | None:
    """The insufficient-capacity / quota message of a failed or cancelled activity, else ``None``."""
    if activity.get("StatusCode") not in ("Failed", "Cancelled"):
        return None
    text = f"{activity.get('StatusMessage', '')} {activity.get('Description', '')} {activity.get('Cause', '')}"
    for marker in CAPACITY_MARKERS:
        if marker in text:
            return str(activity.get("StatusMessage") or activity.get("Description") or marker)[:300]
    return None


ASG_NAMES_PER_DESCRIBE = 50
"""Group names one DescribeAutoScalingGroups may carry (the API's limit at its default MaxRecords)."""


class AwsGroupReads:
    """The Auto Scaling groups of one account and region (one ``autoscaling`` client), read together.

    DescribeAutoScalingGroups takes a list of names and has a low request rate limit of its own,
    shared with everything else in the account that calls it (cluster-autoscaler, Karpenter,
    consoles). While ``shared`` is open (``AwsNodeGroup.sharing_reads()``: the ``Controller`` holds
    it open for a tick) the first group asked for brings every group registered here in one call per
    ``ASG_NAMES_PER_DESCRIBE`` names, and each group's state is composed once for all the models
    of its pool; outside it each ask reads its one group, as always."""

    def __init__(self, autoscaling: Any, settings: AwsSettings = AwsSettings(),
                 *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.autoscaling = autoscaling
        self.settings = settings
        self._sleep = sleep
        self.names: list[str] = []
        """The groups read together (``AwsNodeGroup`` registers its own)."""
        self.shared = SharedReads()

    def register(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)

    def group(self, name: str) -> Mapping[str, Any]:
        """The group's DescribeAutoScalingGroups entry: within a block, from the block's one read of
        every registered group; outside, read alone."""
        if self.shared.open:
            found = self.shared.once("groups", lambda: self._describe(self.names))
        else:
            found = self._describe([name])
        g = found.get(name)
        if g is None:
            raise PermanentProviderError(f"Auto Scaling group {name!r} not found in this account and region")
        return g

    def _describe(self, names: Sequence[str]) -> dict[str, Mapping[str, Any]]:
        out: dict[str, Mapping[str, Any]] = {}
        for i in range(0, len(names), ASG_NAMES_PER_DESCRIBE):
            chunk = list(names[i:i + ASG_NAMES_PER_DESCRIBE])
            token: str | None = None
            while True:
                kwargs: dict[str, Any] = {"AutoScalingGroupNames": chunk, "MaxRecords": ASG_NAMES_PER_DESCRIBE}
                if token:
                    kwargs["NextToken"] = token
                resp, _ = retry_transient(lambda: _call(
                    f"DescribeAutoScalingGroups {' '.join(chunk)}",
                    lambda: self.autoscaling.describe_auto_scaling_groups(**kwargs)), self.settings.retry, sleep=self._sleep)
                for g in resp.get("AutoScalingGroups") or []:
                    out[str(g.get("AutoScalingGroupName"))] = g
                token = resp.get("NextToken")
                if not token:
                    break
        return out


class AwsNodeGroup:
    """``NodeGroup`` over one Auto Scaling group. ``reads``: the ``AwsGroupReads`` of its account
    and region, shared with the other groups there (default: one of its own)."""

    provider = PROVIDER
    set_call = CALL_SET_DESIRED
    release_call = CALL_TERMINATE

    def __init__(self, name: str, autoscaling: Any, *, interruptions: AwsInterruptionQueue | None = None,
                 settings: AwsSettings = AwsSettings(), sleep: Callable[[float], None] = time.sleep,
                 reads: AwsGroupReads | None = None) -> None:
        self.name = name
        self.autoscaling = autoscaling
        self.interruptions = interruptions
        self.settings = settings
        self._sleep = sleep
        self.reads = reads or AwsGroupReads(autoscaling, settings, sleep=sleep)
        self.reads.register(name)

    def _retry(self, what: str, fn: Callable[[], Any]) -> Any:
        value, _ = retry_transient(lambda: _call(what, fn), self.settings.retry, sleep=self._sleep)
        return value

    def sharing_reads(self) -> AbstractContextManager[None]:
        """Share this account and region's group reads until the block ends (``SharesReads``)."""
        return self.reads.shared.sharing()

    def describe(self, now: datetime) -> GroupState:
        """The group as read once a tick (within ``sharing_reads()``; read again after a write of
        ours), else as read now."""
        return self.reads.shared.once(("state", self.name, now), lambda: self._state(now))

    def _state(self, now: datetime) -> GroupState:
        g = self.reads.group(self.name)
        instances = []
        for i in g.get("Instances") or []:
            state = str(i.get("LifecycleState", ""))
            if state.startswith(("Terminating", "Terminated", "Detach", "Standby", "EnteringStandby")):
                continue  # leaving the group (or parked): neither capacity nor cost we control
            instances.append(GroupInstance(i["InstanceId"], state, state == "InService", i.get("AvailabilityZone")))
        error, error_at = self._capacity_error(now)
        notices: tuple[Notice, ...] = ()
        if self.interruptions is not None:
            notices = self.interruptions.notices_for([i.instance_id for i in instances], now)
        return GroupState(
            name=self.name, target=int(g.get("DesiredCapacity", 0)), min_size=int(g.get("MinSize", 0)),
            max_size=int(g.get("MaxSize", 0)), instances=tuple(instances),
            capacity_error=error, capacity_error_at=error_at, notices=notices)

    def _written(self) -> None:
        """After a write (made or attempted) to this group: its size and instances are read again
        (with the other groups', one call); its scaling activities are not (acting does not look
        at them; the next tick reads them afresh)."""
        mine = ("state", self.name)
        self.reads.shared.forget(lambda key: key == "groups" or (isinstance(key, tuple) and key[:2] == mine))

    def _capacity_error(self, now: datetime) -> tuple[str | None, datetime | None]:
        """The newest launch activity decides: a failure for lack of capacity (within the
        lookback) is reported; a later successful launch means capacity came back."""
        resp = self.reads.shared.once(("activities", self.name), lambda: self._retry(
            f"DescribeScalingActivities {self.name}", lambda: self.autoscaling.describe_scaling_activities(
                AutoScalingGroupName=self.name, MaxRecords=20)))
        acts = sorted(resp.get("Activities") or [],
                      key=lambda a: _aware(a.get("StartTime")) or datetime.min.replace(tzinfo=timezone.utc),
                      reverse=True)
        horizon = now - timedelta(seconds=self.settings.capacity_error_lookback_s)
        for a in acts:
            if "Launching" not in str(a.get("Description", "")) and capacity_failure(a) is None:
                continue  # terminations and other activities say nothing about capacity
            at = _aware(a.get("EndTime")) or _aware(a.get("StartTime"))
            if at is not None and at < horizon:
                return None, None
            msg = capacity_failure(a)
            if msg is not None:
                return msg, at
            if a.get("StatusCode") == "Successful":
                return None, None
        return None, None

    def set_target(self, nodes: int) -> None:
        try:
            self._retry(f"SetDesiredCapacity {self.name}={nodes}", lambda: self.autoscaling.set_desired_capacity(
                AutoScalingGroupName=self.name, DesiredCapacity=nodes, HonorCooldown=False))
        finally:
            self._written()

    def release(self, instance_ids: Sequence[str]) -> None:
        try:
            for iid in instance_ids:
                self._terminate(iid)
        finally:
            self._written()

    def _terminate(self, instance_id: str) -> None:
        self._retry(f"TerminateInstanceInAutoScalingGroup {instance_id} ({self.name})",
                    lambda: self.autoscaling.terminate_instance_in_auto_scaling_group(
                        InstanceId=instance_id, ShouldDecrementDesiredCapacity=True))

    def instance_id_for(self, provider_id: str) -> str | None:
        return instance_id_from_provider_id(provider_id)


# --- spot prices -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpotPriceTarget:
    """Where one pool's live spot price comes from."""

    region: str
    instance_type: str
    availability_zones: tuple[str, ...] = ()
    """Zones the group launches in (empty: every zone with a price)."""


@dataclass
class _Cached:
    price_usd: float
    at: datetime
    zones: dict[str, float] = field(default_factory=dict)


class AwsSpotPrices:
    """``PriceSource`` with live spot prices per node-hour for AWS spot pools.

    ``refresh(now)`` (an APScheduler job; see ``refresh_job``) reads the latest price per zone of
    each pool's instance type and keeps the highest across the pool's zones: the group may launch
    in any of them, and a budget cap must not rest on the cheapest one. ``prices`` answers from
    the cache, never calling AWS on the tick's path; a pool without a fresh live price (never
    fetched, failed, older than ``spot_price_max_age_s``, or not a spot pool) gets its static
    price from the config."""

    def __init__(self, targets: Mapping[str, SpotPriceTarget], ec2_for_region: Callable[[str], Any],
                 settings: AwsSettings = AwsSettings(), *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.targets = dict(targets)
        self._ec2_for_region = ec2_for_region
        self.settings = settings
        self._sleep = sleep
        self._cache: dict[str, _Cached] = {}
        self.errors: dict[str, str] = {}
        """Pool -> the last refresh error (cleared by a successful refresh)."""

    def refresh(self, now: datetime) -> dict[str, float]:
        """Fetch current prices for every target; returns the pools refreshed. A pool whose fetch
        fails keeps its previous price (until it ages out) and its error is kept in ``errors``."""
        done: dict[str, float] = {}
        for pool, t in self.targets.items():
            try:
                zones = self._fetch(t, now)
            except ProviderError as e:
                self.errors[pool] = str(e)
                continue
            if not zones:
                self.errors[pool] = f"no spot price for {t.instance_type} in {t.region} {list(t.availability_zones) or ''}"
                continue
            price = max(zones.values())
            self._cache[pool] = _Cached(price, now, zones)
            self.errors.pop(pool, None)
            done[pool] = price
        return done

    def _fetch(self, t: SpotPriceTarget, now: datetime) -> dict[str, float]:
        ec2 = self._ec2_for_region(t.region)
        kwargs: dict[str, Any] = dict(InstanceTypes=[t.instance_type], ProductDescriptions=[self.settings.product_description],
                                      StartTime=now)
        if t.availability_zones:
            kwargs["Filters"] = [{"Name": "availability-zone", "Values": list(t.availability_zones)}]
        what = f"DescribeSpotPriceHistory {t.instance_type} in {t.region}"
        resp, _ = retry_transient(lambda: _call(what, lambda: ec2.describe_spot_price_history(**kwargs)),
                                  self.settings.retry, sleep=self._sleep)
        latest: dict[str, tuple[datetime, float]] = {}
        for row in resp.get("SpotPriceHistory") or []:
            zone = row.get("AvailabilityZone")
            if t.availability_zones and zone not in t.availability_zones:
                continue
            try:
                price = float(row["SpotPrice"])
            except (KeyError, ValueError):
                continue
            ts = _aware(row.get("Timestamp")) or now
            if zone not in latest or ts > latest[zone][0]:
                latest[zone] = (ts, price)
        return {z: p for z, (_, p) in latest.items()}

    def live(self, pool: str, now: datetime) -> float | None:
        c = self._cache.get(pool)
        if c is None or (now - c.at).total_seconds() > self.settings.spot_price_max_age_s:
            return None
        return c.price_usd

    def prices(self, pools: Sequence[PoolSpec], now: datetime) -> Mapping[str, float]:
        out: dict[str, float] = {}
        for p in pools:
            live = self.live(p.name, now) if p.tier.is_spot else None
            out[p.name] = live if live is not None else p.price_per_node_hour_usd
        return out

    def refresh_job(self, clock: Any) -> Callable[[], None]:
        """A zero-argument callable for ``scheduler.add_job(..., 'interval', seconds=...)``."""

        def job() -> None:
            self.refresh(clock.now())

        return job


# --- the aws provider ---------------------------------------------------------------------------


def _sqs_region(queue_url: str, fallback: str) -> str:
    host = queue_url.split("://", 1)[-1].split("/", 1)[0]
    parts = host.split(".")
    return parts[1] if len(parts) > 3 and parts[0] == "sqs" else fallback


class AwsProvider(PoolProviderKind):
    """``provider: aws``: each pool's nodes are an Auto Scaling group (``pools[].aws``); spot pools
    with an ``instance_type`` get live spot prices; one SQS queue (if configured, and never in
    dry-run, because reading deletes the messages an acting daemon needs) brings interruption
    warnings for every AWS pool."""

    name = "aws"
    tiers = frozenset({Tier.SPOT, Tier.ONDEMAND})
    description = "EC2 Auto Scaling groups, live spot prices, the EventBridge/SQS interruption queue."
    interruption_notice_s = 120.0  # the EC2 spot interruption warning comes two minutes ahead
    Settings = AwsSettings
    PoolSettings = AwsPoolSettings

    def build(self, pools: Sequence[Any], ctx: BuildContext) -> ProviderParts:
        settings: AwsSettings = ctx.settings or AwsSettings()
        clients: dict[tuple[str, str], Any] = {}

        def client(service: str, region: str) -> Any:
            if (service, region) not in clients:
                clients[(service, region)] = make_client(service, region, settings, ctx.client)
            return clients[(service, region)]

        queue = None
        if settings.interruption_queue_url and ctx.dry_run:
            logger.info("dry-run: the SQS interruption queue is not read (reading deletes messages an acting daemon "
                        "needs); interruptions are seen from node taints only")
        if settings.interruption_queue_url and pools and not ctx.dry_run:
            region = _sqs_region(settings.interruption_queue_url, pools[0].aws.region)
            queue = AwsInterruptionQueue(client("sqs", region), settings.interruption_queue_url, settings)
        reads: dict[str, AwsGroupReads] = {}  # per region: its groups are described together

        def group_reads(region: str) -> AwsGroupReads:
            if region not in reads:
                reads[region] = AwsGroupReads(client("autoscaling", region), settings)
            return reads[region]

        groups: dict[str, Any] = {
            pc.name: AwsNodeGroup(pc.aws.auto_scaling_group, client("autoscaling", pc.aws.region),
                                  interruptions=queue, settings=settings, reads=group_reads(pc.aws.region))
            for pc in pools}
        targets = {pc.name: SpotPriceTarget(pc.aws.region, pc.aws.instance_type, tuple(pc.aws.availability_zones))
                   for pc in pools if pc.tier is Tier.SPOT and pc.aws.instance_type}
        spot = AwsSpotPrices(targets, lambda region: client("ec2", region), settings) if targets else None
        jobs = [] if spot is None else [(spot.refresh_job(ctx.clock), settings.spot_price_refresh_s, "aws-spot-prices")]
        return ProviderParts(groups=groups, prices=spot, jobs=jobs,
                             parts={"spot_prices": spot, "interruptions": queue})


__all__ = [
    "ASG_NAMES_PER_DESCRIBE", "AwsGroupReads", "AwsInterruptionQueue", "AwsNodeGroup", "AwsPoolSettings", "AwsProvider", "AwsSettings", "AwsSpotPrices", "CALL_SET_DESIRED", "CALL_TERMINATE",
    "CAPACITY_MARKERS", "PROVIDER", "ParsedEvent", "SpotPriceTarget", "TRANSIENT_CODES", "boto_config",
    "capacity_failure", "instance_id_from_provider_id", "make_client", "parse_event", "translate_aws_error",
]
