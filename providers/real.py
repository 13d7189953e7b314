"""The real providers' settings: one documented schema, the ``providers.settings`` section.

Why it exists: the adapters (``providers.prometheus``, ``providers.triton``, ``providers.kubernetes``,
``providers.aws``, ``providers.gcp``, ``providers.cloudpool``) each define one pydantic settings
class, which they take as is, and know nothing of each other or of the daemon's config file. An
operator writes one ``providers.settings`` section (``providers.type: real``); ``RealSettings``
gathers those classes (``tidegate config schema`` and the README table come from them, every field
has a description and a unit, unknown keys are errors). ``providers.wiring`` turns it, with the
rest of the daemon config, into what the daemon takes. A pool provider's section is the field
named after it (``aws``, ``gcp``); nothing else here names a cloud.

This module is imported by ``controller.config`` (the schema is part of the daemon config), so it
imports no ``controller.config``; it imports the adapters' modules for their settings classes,
and those import their client libraries (kubernetes, botocore, google-cloud) only when they reach
the outside, so loading a config pulls in none of them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from providers.aws import AwsSettings
from providers.cloudpool import CloudPoolSettings
from providers.gcp import GcpSettings
from providers.karpenter import KarpenterSettings
from providers.kubernetes import KubernetesSettings
from providers.kubeobjects import KubeObjectsSettings
from providers.prometheus import PrometheusSettings
from providers.registry import ProviderRegistry, installed


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- sections ----------------------------------------------------------------------------------


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


class RealSettings(_Strict):
    """``providers.settings`` when ``providers.type`` is ``real``."""

    prometheus: PrometheusSettings | None = Field(None, description="The metrics source (required to run): Prometheus's HTTP API and the PromQL per signal.")
    triton: TritonSettings | None = Field(None, description="Optional fallback for queue depth, latency and request rate from Triton's own statistics while Prometheus cannot answer.")
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings, description="The cluster: connection, capacity-trouble timeouts, interruption taints.")
    kubernetes_objects: KubeObjectsSettings = Field(default_factory=KubeObjectsSettings, description="ScalingPolicy objects (tidegate.dev/v1alpha1), their status and Events, annotations on scaled Deployments, and leaving alone Deployments an HPA or KEDA ScaledObject scales.")
    aws: AwsSettings = Field(default_factory=AwsSettings, description="Pools with provider aws: Auto Scaling groups, spot prices and the interruption queue.")
    gcp: GcpSettings = Field(default_factory=GcpSettings, description="Pools with provider gcp: managed instance groups and spot list prices.")
    cloud: CloudPoolSettings = Field(default_factory=CloudPoolSettings, description="How long capacity failures keep a cloud pool unavailable.")
    karpenter: KarpenterSettings = Field(default_factory=KarpenterSettings, description="Pools with provider karpenter: the karpenter.sh API version, how long a failed NodeClaim launch keeps the pool unavailable.")

    def provider_settings(self, provider: str) -> Any:
        """The section named after a pool provider (``aws``, ``gcp``...), ``None`` if it has none."""
        value = getattr(self, provider, None)
        return value if isinstance(value, BaseModel) else None

    def cross_check(self, pools: Mapping[str, str], models: Mapping[str, Sequence[str]],
                    registry: ProviderRegistry | None = None) -> list[str]:
        """Problems with references to the daemon config's pools (name -> provider) and models
        (name -> its pools), each quoting both sides."""
        reg = registry or installed()
        problems = []
        for provider in sorted(set(pools.values())):
            if provider in reg:
                problems += reg.get(provider).problems(self.provider_settings(provider), pools)
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


__all__ = ["RealSettings", "TritonSettings"]
