"""The real providers' settings: one documented schema, the ``providers.settings`` section.

Why it exists: the adapters (``providers.prometheus``, ``providers.triton``, ``providers.kubernetes``,
``providers.aws``, ``providers.gcp``, ``providers.cloudpool``) each take a small settings dataclass
and know nothing of each other or of the daemon's config file. An operator writes one
``providers.settings`` section (``providers.type: real``); ``RealSettings`` validates and documents
it (``tidegate config schema`` and the README table come from it, every field has a description
and a unit, unknown keys are errors). ``providers.wiring`` turns it, with the rest of the daemon
config, into what the daemon takes.

This module is imported by ``controller.config`` (the schema is part of the daemon config), so it
imports neither ``controller.config`` nor any client library: only pydantic and the light adapter
modules at the top.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from providers.base import RetryPolicy
from providers.cloudpool import CloudPoolSettings
from providers.prometheus import PrometheusSettings

if TYPE_CHECKING:  # annotations only: the adapters' client libraries are not imported here
    from providers.kubernetes import KubernetesSettings
    from providers.aws import AwsSettings
    from providers.gcp import GcpSettings


def _default(cls: type, name: str) -> Any:
    """The default of a settings dataclass field, so that the schema and the adapter agree."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.default
    raise KeyError(f"{cls.__name__} has no field {name!r}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- sections ----------------------------------------------------------------------------------


class RetrySettings(_Strict):
    """Exponential backoff with full jitter for transient errors (throttling, 5xx, 409 conflicts),
    inside a time budget per call so that a throttled API delays one tick, never the loop."""

    budget_s: float = Field(_default(RetryPolicy, "budget_s"), gt=0, description="Longest wall time one logical call may spend, retries and pauses included, seconds. Keep it well under loop.interval_s.")
    base_delay_s: float = Field(_default(RetryPolicy, "base_delay_s"), gt=0, description="Upper bound of the first pause, seconds; each later bound doubles (full jitter).")
    max_delay_s: float = Field(_default(RetryPolicy, "max_delay_s"), gt=0, description="Cap on the bound of any one pause, seconds.")
    max_attempts: int = Field(_default(RetryPolicy, "max_attempts"), ge=1, description="Attempts in all, the first included.")

    def build(self) -> RetryPolicy:
        return RetryPolicy(budget_s=self.budget_s, base_delay_s=self.base_delay_s,
                           max_delay_s=self.max_delay_s, max_attempts=self.max_attempts)


class TritonSettings(_Strict):
    """Triton's own statistics as a fallback when Prometheus cannot answer (queue depth, mean
    latency, request rate per model). Optional: without this section Prometheus is the only
    metrics source. Replicas come from a static list, from the pods of each pool's Deployment, or
    both."""

    replicas: dict[str, dict[str, list[str]]] = Field(default_factory=dict, description="Static Triton HTTP endpoints (host:port, no scheme) per model name, then per pool name, e.g. {llama: {onprem: ['10.0.0.5:8000']}}.")
    discover: bool = Field(False, description="Also read the endpoints of the Running pods of each model's Deployment in each pool (pod IP and `port`), listed through the Kubernetes API every tick with the Deployment's label selector.")
    port: int = Field(8000, ge=1, le=65535, description="Triton's HTTP port on discovered pods.")
    triton_models: dict[str, str] = Field(default_factory=dict, description="Model name inside Triton per model (bundle) name, where they differ (e.g. an ensemble's 'ensemble' or 'tensorrt_llm').")
    timeout_s: float = Field(1.0, gt=0, description="Connection and network timeout per Triton request, seconds.")
    max_interval_s: float = Field(120.0, gt=0, description="Statistics deltas are taken between consecutive reads; a previous read older than this is no baseline, seconds.")

    @model_validator(mode="after")
    def _some_source(self) -> "TritonSettings":
        if not self.replicas and not self.discover:
            raise ValueError("the triton section needs replicas (static endpoints) or discover: true")
        return self


class KubernetesConnection(_Strict):
    """How to reach the cluster's API server, plus the Kubernetes adapter's knobs."""

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
    extra_interruption_taints: dict[str, Literal["interruption", "rebalance"]] = Field(default_factory=dict, description="Taint keys that announce a node's loss, added to the built-in ones (aws-node-termination-handler, GKE impending termination, shutdown, out-of-service).")
    interruption_condition_types: list[str] = Field(default_factory=list, description="Node condition types that, when True, announce the node's loss (e.g. a node-problem-detector TerminationScheduled).")
    retry: RetrySettings = Field(default_factory=RetrySettings, description="Backoff for transient API errors and scale conflicts (409).")

    @model_validator(mode="after")
    def _one_way_in(self) -> "KubernetesConnection":
        if self.in_cluster and (self.host is not None or self.kubeconfig is not None):
            raise ValueError(f"in_cluster: true excludes host ({self.host!r}) and kubeconfig ({self.kubeconfig!r})")
        if self.host is not None and self.kubeconfig is not None:
            raise ValueError(f"set host ({self.host!r}) or kubeconfig ({self.kubeconfig!r}), not both")
        return self

    def use_in_cluster(self, environ: Mapping[str, str] | None = None) -> bool:
        if self.in_cluster is not None:
            return self.in_cluster
        env = os.environ if environ is None else environ
        return self.host is None and self.kubeconfig is None and bool(env.get("KUBERNETES_SERVICE_HOST"))

    def to_settings(self) -> "KubernetesSettings":
        from providers.base import NoticeKind
        from providers.kubernetes import INTERRUPTION_TAINTS, KubernetesSettings

        taints = dict(INTERRUPTION_TAINTS)
        taints.update({k: NoticeKind(v) for k, v in self.extra_interruption_taints.items()})
        return KubernetesSettings(
            unschedulable_timeout_s=self.unschedulable_timeout_s, unavailable_for_s=self.unavailable_for_s,
            interruption_window_s=self.interruption_window_s, gpu_resource=self.gpu_resource,
            request_timeout_s=self.request_timeout_s, interruption_taints=taints,
            interruption_condition_types=tuple(self.interruption_condition_types), retry=self.retry.build())

    def api_client(self) -> Any:
        from providers.kubernetes import make_api_client

        return make_api_client(host=self.host, kubeconfig=self.kubeconfig, context=self.context,
                               in_cluster=self.use_in_cluster(), verify_ssl=self.verify_ssl)


class AwsSection(_Strict):
    """boto3 for Auto Scaling, EC2 spot prices and the SQS interruption queue (credentials come
    from the usual chain: IRSA / pod identity, environment, instance profile)."""

    endpoint_url: str | None = Field(None, description="Override of every AWS endpoint (a proxy, tests). Unset: each region's default.")
    connect_timeout_s: float = Field(3.0, gt=0, description="Connection timeout per request, seconds.")
    read_timeout_s: float = Field(10.0, gt=0, description="Read timeout per request, seconds.")
    retry: RetrySettings = Field(default_factory=RetrySettings, description="Backoff for throttling and 5xx (botocore's own retries are off so the budget is ours).")
    capacity_error_lookback_s: float = Field(900.0, gt=0, description="Failed scaling activities older than this are ignored, seconds.")
    interruption_queue_url: str | None = Field(None, description="SQS queue fed by EventBridge rules for spot interruption warnings, rebalance recommendations, instance state changes and scheduled health events (as Karpenter uses). Unset: interruptions only from node taints. Not read in dry-run (reading deletes messages).")
    queue_poll_interval_s: float = Field(2.0, ge=0, description="The queue is read at most this often, seconds (daemon clock).")
    queue_max_batches: int = Field(10, ge=1, description="At most this many ReceiveMessage batches (10 messages each) per poll.")
    notice_ttl_s: float = Field(600.0, gt=0, description="A notice read from the queue is kept this long after the event's time, seconds.")
    rebalance_is_interruption: bool = Field(False, description="Treat rebalance recommendations as interruptions (replace at once) instead of a softer notice.")
    spot_price_max_age_s: float = Field(3600.0, gt=0, description="A live spot price older than this is no longer used (the pool's static price is), seconds.")
    product_description: str = Field("Linux/UNIX", description="Spot price product description to query.")
    spot_price_refresh_s: float = Field(300.0, gt=0, description="Seconds between refreshes of the live spot prices (describe_spot_price_history; a scheduler job, never on the tick's path). Must be shorter than spot_price_max_age_s.")

    @model_validator(mode="after")
    def _refresh_before_expiry(self) -> "AwsSection":
        if self.spot_price_refresh_s >= self.spot_price_max_age_s:
            raise ValueError(f"spot_price_refresh_s ({self.spot_price_refresh_s:g}) must be less than "
                             f"spot_price_max_age_s ({self.spot_price_max_age_s:g}), or live prices expire between refreshes")
        return self

    def to_settings(self, *, dry_run: bool = False) -> "AwsSettings":
        from providers.aws import AwsSettings

        return AwsSettings(
            endpoint_url=self.endpoint_url, connect_timeout_s=self.connect_timeout_s,
            read_timeout_s=self.read_timeout_s, retry=self.retry.build(),
            capacity_error_lookback_s=self.capacity_error_lookback_s,
            interruption_queue_url=None if dry_run else self.interruption_queue_url,
            queue_poll_interval_s=self.queue_poll_interval_s, queue_max_batches=self.queue_max_batches,
            notice_ttl_s=self.notice_ttl_s, rebalance_is_interruption=self.rebalance_is_interruption,
            spot_price_max_age_s=self.spot_price_max_age_s, product_description=self.product_description)


class GcpSection(_Strict):
    """google-cloud-compute for managed instance groups (credentials: Application Default
    Credentials, e.g. Workload Identity)."""

    api_endpoint: str | None = Field(None, description="Compute API endpoint override (private service connect, tests). Unset: the default.")
    credentials: Literal["default", "anonymous"] = Field("default", description="default: Application Default Credentials; anonymous: none at all (only for a local test endpoint).")
    request_timeout_s: float = Field(10.0, gt=0, description="Timeout per request, seconds.")
    retry: RetrySettings = Field(default_factory=RetrySettings, description="Backoff for 429, 5xx and rate-limit 403s.")
    max_group_size: int = Field(1000, ge=1, description="Upper bound of a group's size (a zonal MIG holds at most 1000 VMs); the pool's max_nodes applies too.")
    spot_prices_usd: dict[str, float] = Field(default_factory=dict, description="Spot list price per node-hour, USD, per gcp-* pool name (the compute client has no spot price API). Pools not listed use their static price_per_node_hour_usd.")

    @model_validator(mode="after")
    def _prices_non_negative(self) -> "GcpSection":
        bad = {k: v for k, v in self.spot_prices_usd.items() if not v >= 0}
        if bad:
            raise ValueError(f"spot_prices_usd must be >= 0, got {bad}")
        return self

    def to_settings(self) -> "GcpSettings":
        from providers.gcp import GcpSettings

        return GcpSettings(api_endpoint=self.api_endpoint, request_timeout_s=self.request_timeout_s,
                           retry=self.retry.build(), max_group_size=self.max_group_size)


class CloudSection(_Strict):
    """How a cloud pool reacts to its node group's capacity trouble."""

    capacity_unavailable_s: float = Field(_default(CloudPoolSettings, "capacity_unavailable_s"), gt=0, description="After an insufficient-capacity or quota failure the pool is unavailable for this long from the failure's time, seconds (Karpenter: 3 minutes).")
    capacity_error_max_age_s: float = Field(_default(CloudPoolSettings, "capacity_error_max_age_s"), gt=0, description="Failures older than this are ignored, even at startup, seconds.")

    def build(self) -> CloudPoolSettings:
        return CloudPoolSettings(capacity_unavailable_s=self.capacity_unavailable_s,
                                 capacity_error_max_age_s=self.capacity_error_max_age_s)


class RealSettings(_Strict):
    """``providers.settings`` when ``providers.type`` is ``real``."""

    prometheus: PrometheusSettings | None = Field(None, description="The metrics source (required to run): Prometheus's HTTP API and the PromQL per signal.")
    triton: TritonSettings | None = Field(None, description="Optional fallback for queue depth, latency and request rate from Triton's own statistics while Prometheus cannot answer.")
    kubernetes: KubernetesConnection = Field(default_factory=KubernetesConnection, description="The cluster: connection, capacity-trouble timeouts, interruption taints.")
    aws: AwsSection = Field(default_factory=AwsSection, description="AWS Auto Scaling groups, spot prices and the interruption queue.")
    gcp: GcpSection = Field(default_factory=GcpSection, description="GCP managed instance groups and spot list prices.")
    cloud: CloudSection = Field(default_factory=CloudSection, description="How long capacity failures keep a cloud pool unavailable.")

    def cross_check(self, pools: Mapping[str, str], models: Mapping[str, Sequence[str]]) -> list[str]:
        """Problems with references to the daemon config's pools (name -> kind) and models
        (name -> its pools), each quoting both sides."""
        problems = []
        for name in self.gcp.spot_prices_usd:
            if name not in pools:
                problems.append(f"providers.settings.gcp.spot_prices_usd names pool {name!r}, which is not among the pools {sorted(pools)}")
            elif not pools[name].startswith("gcp-"):
                problems.append(f"providers.settings.gcp.spot_prices_usd names pool {name!r}, which is {pools[name]}, not a gcp pool")
        if self.triton is not None:
            for model, per_pool in self.triton.replicas.items():
                if model not in models:
                    problems.append(f"providers.settings.triton.replicas names model {model!r}, which is not among the models {sorted(models)}")
                    continue
                for pool in per_pool:
                    if pool not in models[model]:
                        problems.append(f"providers.settings.triton.replicas[{model!r}] names pool {pool!r}, where model {model!r} has no deployment (it has {sorted(models[model])})")
            for model in self.triton.triton_models:
                if model not in models:
                    problems.append(f"providers.settings.triton.triton_models names model {model!r}, which is not among the models {sorted(models)}")
        return problems


__all__ = [
    "AwsSection", "CloudSection", "GcpSection", "KubernetesConnection", "RealSettings", "RetrySettings",
    "TritonSettings",
]
