"""GCP side of the pools with ``provider: gcp`` (spot or on-demand), through google-cloud-compute.

Why it exists: a GCP pool's nodes are a zonal or regional managed instance group (spot VMs or
standard). tidegate resizes it to the node count the core computes and, on the way down, deletes
exactly the instances that hold no pods (``deleteInstances`` shrinks the target size by as many;
a plain resize lets the group pick its victims). ``listManagedInstances`` tells running from
still-creating instances, shows spot VMs being preempted (``STOPPING`` / ``TERMINATED``, or
recreated) and carries the last creation attempt's errors, where quota and zone stock-outs appear
(``QUOTA_EXCEEDED``, ``ZONE_RESOURCE_POOL_EXHAUSTED``...): those are reported like AWS's
insufficient capacity, so the pool is marked unavailable for a while.

Within a tick (``sharing_reads()``, held open by the ``Controller``) a group is read once for every
model of its pool, and again after a write of ours.

The compute client has no spot price API, so spot list prices come from the config
(``GcpSpotPrices``). Errors are translated into the project's tree with the library error chained:
429, 5xx, rate-limit 403s and network trouble are transient; 404 (a misconfigured group), other
403s and 400s are permanent.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Callable, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.core.model import PoolSpec, Tier
from controller.errors import PermanentProviderError, ProviderError, TransientProviderError
from providers.base import (
    GroupInstance, GroupState, Notice, NoticeKind, RetryPolicy, SharedReads, retry_transient,
)
from providers.registry import BuildContext, PoolProviderKind, ProviderParts

PROVIDER = "gcp"
CALL_RESIZE = "resize"
CALL_DELETE_INSTANCES = "delete_instances"

CAPACITY_ERROR_CODES = frozenset({
    "QUOTA_EXCEEDED", "ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "RESOURCE_POOL_EXHAUSTED", "REGION_RESOURCE_POOL_EXHAUSTED", "RESOURCE_EXHAUSTED",
    "CONDITION_NOT_MET_RESOURCE_EXHAUSTED",
})
"""Creation-attempt error codes that mean the pool cannot get capacity now."""

CREATING_ACTIONS = frozenset({"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING", "VERIFYING", "STARTING",
                              "RESUMING", "RESTARTING"})
LEAVING_ACTIONS = frozenset({"DELETING", "ABANDONING"})
PREEMPTED_STATUSES = frozenset({"STOPPING", "TERMINATED", "PENDING_STOP", "SUSPENDING"})
"""Instance statuses of a VM being stopped under the group (for a spot VM: preempted)."""

RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})


class GcpSettings(BaseModel):
    """``providers.settings.gcp``: google-cloud-compute for managed instance groups (credentials:
    Application Default Credentials, e.g. Workload Identity) and spot list prices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_endpoint: str | None = Field(None, description="Compute API endpoint override (private service connect, tests). Unset: the default.")
    credentials: Literal["default", "anonymous"] = Field("default", description="default: Application Default Credentials; anonymous: none at all (only for a local test endpoint).")
    request_timeout_s: float = Field(10.0, gt=0, description="Timeout per request, seconds.")
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="Backoff for 429, 5xx and rate-limit 403s.")
    max_group_size: int = Field(1000, ge=1, description="Upper bound of a group's size (a zonal MIG holds at most 1000 VMs); the pool's max_nodes applies too.")
    spot_prices_usd: dict[str, float] = Field(default_factory=dict, description="Spot list price per node-hour, USD, per gcp pool name (the compute client has no spot price API). Pools not listed use their static price_per_node_hour_usd.")

    @model_validator(mode="after")
    def _prices_non_negative(self) -> "GcpSettings":
        bad = {k: v for k, v in self.spot_prices_usd.items() if not v >= 0}
        if bad:
            raise ValueError(f"spot_prices_usd must be >= 0, got {bad}")
        return self


class GcpPoolSettings(BaseModel):
    """``pools[].gcp``: the managed instance group behind one pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str = Field(description="GCP project id.")
    zone: str | None = Field(None, description="Zone of a zonal managed instance group.")
    region: str | None = Field(None, description="Region of a regional managed instance group.")
    instance_group_manager: str = Field(description="Managed instance group name.")

    @model_validator(mode="after")
    def _zone_xor_region(self) -> "GcpPoolSettings":
        if (self.zone is None) == (self.region is None):
            raise ValueError(f"set exactly one of zone ({self.zone!r}) and region ({self.region!r})")
        return self


def make_mig_client(*, regional: bool, settings: GcpSettings = GcpSettings(), credentials: Any = None) -> Any:
    """A zonal or regional instance group managers client on the REST transport. ``credentials``
    default to Application Default Credentials; tests pass ``AnonymousCredentials()``."""
    from google.cloud import compute_v1

    cls = compute_v1.RegionInstanceGroupManagersClient if regional else compute_v1.InstanceGroupManagersClient
    options = {"api_endpoint": settings.api_endpoint} if settings.api_endpoint else None
    return cls(credentials=credentials, client_options=options, transport="rest")


def _reasons(e: Any) -> set[str]:
    out = set()
    for err in getattr(e, "errors", None) or []:
        if isinstance(err, dict) and err.get("reason"):
            out.add(str(err["reason"]))
    return out


def translate_gcp_error(e: BaseException, what: str) -> ProviderError:
    from google.api_core import exceptions as gexc  # imported when called: the settings and the kind load without it

    if isinstance(e, ProviderError):  # our own reading of an answer, already said
        return e

    if isinstance(e, gexc.GoogleAPICallError):
        code = getattr(e, "code", None)
        msg = str(getattr(e, "message", e))[:300]
        if isinstance(e, (gexc.TooManyRequests, gexc.ServerError, gexc.DeadlineExceeded, gexc.Aborted,
                          gexc.ServiceUnavailable, gexc.Conflict)) \
                or (isinstance(e, gexc.Forbidden) and _reasons(e) & RATE_LIMIT_REASONS):
            return TransientProviderError(f"{what}: {code}: {msg}")
        if isinstance(e, gexc.NotFound):
            return PermanentProviderError(f"{what} not found (404): {msg}")
        return PermanentProviderError(f"{what}: {code}: {msg}")
    if isinstance(e, (gexc.RetryError, OSError, TimeoutError)):
        return TransientProviderError(f"{what}: {type(e).__name__}: {e}")
    from google.protobuf import json_format

    if isinstance(e, json_format.ParseError):
        # a 200 whose body is not the API's JSON (a proxy's or another service's page): trouble on
        # the way, as botocore's ResponseParserError is for AWS
        return TransientProviderError(f"{what}: the answer could not be read ({type(e).__name__}: {str(e)[:200]}): "
                                      "is the endpoint the Compute Engine API, or a proxy in between?")
    try:
        import google.auth.exceptions as gauth
        import requests

        if isinstance(e, (requests.exceptions.RequestException, gauth.TransportError)):
            return TransientProviderError(f"{what}: {type(e).__name__}: {e}")
        if isinstance(e, gauth.GoogleAuthError):
            return PermanentProviderError(f"{what}: {type(e).__name__}: {e}")
    except ImportError:  # pragma: no cover - both ship with google-cloud-compute
        pass
    return PermanentProviderError(f"{what}: unexpected {type(e).__name__}: {e}")


def instance_name_from_provider_id(provider_id: str | None) -> str | None:
    """``gce://project/zone/name`` (GKE's ``spec.providerID``) -> ``name``."""
    if not provider_id or not provider_id.startswith("gce://"):
        return None
    parts = provider_id[len("gce://"):].split("/")
    return parts[2] if len(parts) == 3 and parts[2] else None


def _name_of(mi: Any) -> str:
    return str(mi.name or str(mi.instance).rstrip("/").rsplit("/", 1)[-1])


def _zone_of(url: str) -> str | None:
    parts = url.split("/")
    return parts[parts.index("zones") + 1] if "zones" in parts and parts.index("zones") + 1 < len(parts) else None


class GcpNodeGroup:
    """``NodeGroup`` over one zonal (``zone=``) or regional (``region=``) managed instance group.
    ``client`` is the matching ``InstanceGroupManagersClient`` / ``RegionInstanceGroupManagersClient``.
    Within ``sharing_reads()`` (a tick) the group is read once (its GET and its managed instances)
    for every model of its pool, and again only after a write of ours."""

    provider = PROVIDER
    set_call = CALL_RESIZE
    release_call = CALL_DELETE_INSTANCES

    def __init__(self, project: str, name: str, client: Any, *, zone: str | None = None, region: str | None = None,
                 spot: bool = True, settings: GcpSettings = GcpSettings(),
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if (zone is None) == (region is None):
            raise ValueError(f"set exactly one of zone ({zone!r}) and region ({region!r})")
        self.project = project
        self.name = name
        self.client = client
        self.zone = zone
        self.region = region
        self.spot = spot
        self.settings = settings
        self._sleep = sleep
        self._urls: dict[str, str] = {}
        self.shared = SharedReads()

    @property
    def _where(self) -> dict[str, str]:
        return {"zone": self.zone} if self.zone else {"region": self.region or ""}

    @property
    def _label(self) -> str:
        return f"managed instance group {self.project}/{self.zone or self.region}/{self.name}"

    def _retry(self, what: str, fn: Callable[[], Any]) -> Any:
        def once() -> Any:
            try:
                return fn()
            except Exception as e:  # the REST transport raises api_core, auth and requests errors
                raise translate_gcp_error(e, what) from e

        value, _ = retry_transient(once, self.settings.retry, sleep=self._sleep)
        return value

    def _kw(self) -> dict[str, Any]:
        return {"project": self.project, "instance_group_manager": self.name, **self._where,
                "retry": None, "timeout": self.settings.request_timeout_s}

    def sharing_reads(self) -> AbstractContextManager[None]:
        """Share this group's reads until the block ends (``SharesReads``)."""
        return self.shared.sharing()

    def describe(self, now: datetime) -> GroupState:
        """The group as read once a tick (within ``sharing_reads()``; read again after a write of
        ours), else as read now."""
        return self.shared.once(("state", now), lambda: self._state(now))

    def _written(self) -> None:
        """After a write (made or attempted): the next ``describe`` reads the group again."""
        self.shared.forget(lambda key: True)

    def _this_group(self, mig: Any) -> Any:
        """``mig`` if it is the answer about this group. protobuf reads any JSON object with its
        unknown fields ignored: another service's answer would read as an empty group of target
        0, and be acted on."""
        if mig.name != self.name:
            raise TransientProviderError(f"{self._label}: the answer is not this group (it names {mig.name!r}): "
                                         "is the endpoint the Compute Engine API, or a proxy in between?")
        return mig

    def _state(self, now: datetime) -> GroupState:
        mig = self._retry(self._label, lambda: self._this_group(self.client.get(**self._kw())))
        managed = self._retry(f"listManagedInstances of {self._label}",
                              lambda: list(self.client.list_managed_instances(**self._kw())))
        instances: list[GroupInstance] = []
        notices: list[Notice] = []
        errors: list[str] = []
        urls: dict[str, str] = {}
        for mi in managed:
            name = _name_of(mi)
            action = str(mi.current_action or "NONE")
            status = str(mi.instance_status or "")
            if mi.instance:
                urls[name] = str(mi.instance)
            for err in (mi.last_attempt.errors.errors if mi.last_attempt and mi.last_attempt.errors else []):
                if err.code in CAPACITY_ERROR_CODES:
                    errors.append(f"{err.code}: {err.message}"[:300])
            if action in LEAVING_ACTIONS:
                continue
            if self.spot and status in PREEMPTED_STATUSES:
                notices.append(Notice(NoticeKind.INTERRUPTION, f"gcp:preempted ({status})", now, instance_id=name))
            running = status == "RUNNING" and action == "NONE"
            instances.append(GroupInstance(name, f"{status or 'NONE'}/{action}", running, _zone_of(urls.get(name, ""))))
        self._urls = urls
        return GroupState(
            name=self.name, target=int(mig.target_size), min_size=0,
            max_size=self.settings.max_group_size, instances=tuple(instances),
            # The attempt errors carry no timestamp: they count from the observation that saw them,
            # and keep the pool marked for as long as they are still reported.
            capacity_error="; ".join(sorted(set(errors))) or None, capacity_error_at=now if errors else None,
            notices=tuple(notices))

    def _check_operation(self, op: Any, what: str) -> None:
        errs = list(op.error.errors) if getattr(op, "error", None) and op.error.errors else []
        if not errs:
            return
        text = "; ".join(f"{e.code}: {e.message}" for e in errs)[:300]
        if any(e.code in CAPACITY_ERROR_CODES for e in errs):
            raise TransientProviderError(f"{what}: {text}")
        raise PermanentProviderError(f"{what}: {text}")

    def set_target(self, nodes: int) -> None:
        what = f"resize of {self._label} to {nodes}"
        try:
            op = self._retry(what, lambda: self.client.resize_unary(size=nodes, **self._kw()))
        finally:
            self._written()
        self._check_operation(op, what)

    def release(self, instance_ids: Sequence[str]) -> None:
        try:
            self._delete(instance_ids)
        finally:
            self._written()

    def _delete(self, instance_ids: Sequence[str]) -> None:
        from google.cloud import compute_v1

        urls = [self._urls.get(n) or f"zones/{self.zone}/instances/{n}" for n in instance_ids]
        what = f"deleteInstances {list(instance_ids)} of {self._label}"
        if self.zone:
            body = compute_v1.InstanceGroupManagersDeleteInstancesRequest(
                instances=urls, skip_instances_on_validation_error=True)
            op = self._retry(what, lambda: self.client.delete_instances_unary(
                instance_group_managers_delete_instances_request_resource=body, **self._kw()))
        else:
            rbody = compute_v1.RegionInstanceGroupManagersDeleteInstancesRequest(
                instances=urls, skip_instances_on_validation_error=True)
            op = self._retry(what, lambda: self.client.delete_instances_unary(
                region_instance_group_managers_delete_instances_request_resource=rbody, **self._kw()))
        self._check_operation(op, what)

    def instance_id_for(self, provider_id: str) -> str | None:
        return instance_name_from_provider_id(provider_id)


class GcpSpotPrices:
    """``PriceSource`` for GCP pools: spot list prices from the config (the compute client has no
    spot price API); pools without one get their static price."""

    def __init__(self, spot_prices_usd: Mapping[str, float]) -> None:
        self.spot_prices_usd = dict(spot_prices_usd)

    def prices(self, pools: Sequence[PoolSpec], now: datetime) -> Mapping[str, float]:
        return {p.name: self.spot_prices_usd.get(p.name, p.price_per_node_hour_usd) for p in pools}


class GcpProvider(PoolProviderKind):
    """``provider: gcp``: each pool's nodes are a zonal or regional managed instance group
    (``pools[].gcp``); spot prices are the configured list prices (``spot_prices_usd``)."""

    name = "gcp"
    tiers = frozenset({Tier.SPOT, Tier.ONDEMAND})
    description = "Compute Engine managed instance groups, configured spot list prices."
    interruption_notice_s = 30.0  # a spot VM's preemption notice
    Settings = GcpSettings
    PoolSettings = GcpPoolSettings

    def problems(self, settings: Any, pools: Mapping[str, str]) -> list[str]:
        s: GcpSettings = settings or GcpSettings()
        out = []
        for name in s.spot_prices_usd:
            if name not in pools:
                out.append(f"providers.settings.gcp.spot_prices_usd names pool {name!r}, which is not among the pools {sorted(pools)}")
            elif pools[name] != self.name:
                out.append(f"providers.settings.gcp.spot_prices_usd names pool {name!r}, whose provider is {pools[name]}, not gcp")
        return out

    def build(self, pools: Sequence[Any], ctx: BuildContext) -> ProviderParts:
        settings: GcpSettings = ctx.settings or GcpSettings()
        creds = ctx.client
        if creds is None and settings.credentials == "anonymous":
            from google.auth.credentials import AnonymousCredentials

            creds = AnonymousCredentials()
        clients: dict[bool, Any] = {}
        groups: dict[str, Any] = {}
        for pc in pools:
            regional = pc.gcp.region is not None
            if regional not in clients:
                clients[regional] = make_mig_client(regional=regional, settings=settings, credentials=creds)
            groups[pc.name] = GcpNodeGroup(pc.gcp.project, pc.gcp.instance_group_manager, clients[regional],
                                           zone=pc.gcp.zone, region=pc.gcp.region, spot=pc.tier is Tier.SPOT,
                                           settings=settings)
        return ProviderParts(groups=groups, prices=GcpSpotPrices(settings.spot_prices_usd))


__all__ = [
    "CALL_DELETE_INSTANCES", "CALL_RESIZE", "CAPACITY_ERROR_CODES", "GcpNodeGroup", "GcpPoolSettings", "GcpProvider",
    "GcpSettings", "GcpSpotPrices",
    "PROVIDER", "instance_name_from_provider_id", "make_mig_client", "translate_gcp_error",
]
