"""The real providers wired from a daemon config: what ``controller.runtime`` hands the daemon.

``build_real_providers(cfg, clock)`` turns ``cfg.providers.settings`` (a ``providers.real.RealSettings``)
into a metrics source, one provider per pool, a price source and the periodic jobs (the spot
price refresh). Leader election is the daemon config's own ``leader_election`` section
(``providers.leader``), built by ``controller.runtime`` for simulated and real providers alike.

It lives apart from the schema because it reads the whole daemon config: ``controller.config``
imports the schema (``providers.real``), this module imports ``controller.config``, one direction.

The Kubernetes, AWS, GCP and Triton client libraries are imported inside the functions. Building
makes no network call: the first tick is the first observation (nothing is decided before every
pool has been read).

Dry-run: the pool providers are built in dry-run (``CloudPoolProvider`` and the Kubernetes side
record what they would do), and the SQS interruption queue is *not* read, because reading it
deletes the messages: a dry-run daemon beside an acting one would steal its interruption
warnings. Node taints still show interruptions to a dry-run daemon.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from controller.config import DaemonConfig
from providers.real import RealSettings, TritonSettings

if TYPE_CHECKING:  # annotations only; the adapters are imported when the providers are built
    from controller.protocols import Clock, MetricsSource, PoolProvider, PriceSource
    from providers.kubernetes import KubernetesCluster
    from providers.triton import TritonReplica

logger = logging.getLogger("tidegate.providers.real")

# --- the assembled providers -------------------------------------------------------------------

Job = tuple[Callable[[], None], float, str]
"""A periodic job for the daemon's scheduler: (callable, seconds between runs, job id)."""


@dataclass
class RealProviderSet:
    """What ``build_real_providers`` wires, in the shape ``controller.runtime`` hands the daemon."""

    metrics: "MetricsSource"
    pools: dict[str, "PoolProvider"]
    prices: "PriceSource"
    jobs: list[Job] = field(default_factory=list)
    """Periodic work for ``Daemon.add_job`` (the spot price refresh)."""
    spot_prices: Any = None
    """``providers.aws.AwsSpotPrices`` when an AWS spot pool names an instance type."""
    interruptions: Any = None
    """``providers.aws.AwsInterruptionQueue`` when a queue is configured (never in dry-run)."""
    api_client: Any = None
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Close connections (on shutdown)."""
        for close in reversed(self._closers):
            try:
                close()
            except Exception:  # noqa: BLE001 - shutting down: one failed close must not skip the rest
                logger.exception("closing a real provider failed")
        self._closers.clear()


def discover_triton_replicas(cluster: "KubernetesCluster", cfg: "DaemonConfig",
                             triton: TritonSettings) -> Callable[[], dict[str, list["TritonReplica"]]]:
    """A callable (called every tick by ``TritonFallback``) returning each model's Triton endpoints:
    the static ones plus, with ``discover``, ``podIP:port`` of the Running pods of the model's
    Deployment in each pool (the Deployment's own selector unless the config names one). A pool
    whose pods cannot be listed contributes none this tick (the fallback reports ``Partial``)."""
    from controller.protocols import ProviderError
    from providers.kubernetes import selector_from_label_selector
    from providers.triton import TritonReplica

    selectors: dict[tuple[str, str], str] = {}

    def selector(namespace: str, name: str, configured: str | None, what: str) -> str:
        if configured:
            return configured
        key = (namespace, name)
        if key not in selectors:
            dep = cluster.read_deployment(namespace, name, what)
            selectors[key] = selector_from_label_selector(dep.spec.selector if dep.spec else None)
        return selectors[key]

    def replicas() -> dict[str, list[TritonReplica]]:
        out: dict[str, list[TritonReplica]] = {}
        for m in cfg.models:
            tm = triton.triton_models.get(m.name)
            found = [TritonReplica(url, pool, tm) for pool, urls in triton.replicas.get(m.name, {}).items()
                     for url in urls]
            if triton.discover:
                for pool, ref in m.deployments.items():
                    what = f"Deployment {ref.namespace}/{ref.name} of model {m.name!r} in pool {pool!r}"
                    try:
                        sel = selector(ref.namespace, ref.name, ref.label_selector, what)
                        pods = cluster.list_pods(ref.namespace, sel, f"pods of {what}")
                    except ProviderError as e:
                        logger.warning("triton discovery: cannot list pods of %s: %s", what, e)
                        continue
                    for p in pods:
                        ip = p.status.pod_ip if p.status else None
                        gone = p.metadata is not None and p.metadata.deletion_timestamp is not None
                        if ip and not gone and p.status is not None and p.status.phase == "Running":
                            found.append(TritonReplica(f"{ip}:{triton.port}", pool, tm))
            out[m.name] = found
        return out

    return replicas


def build_real_providers(
    cfg: "DaemonConfig",
    clock: "Clock",
    *,
    dry_run: bool | None = None,
    kube_api: Any = None,
    aws_session: Any = None,
    gcp_credentials: Any = None,
) -> RealProviderSet:
    """Wire the real providers from ``cfg.providers.settings`` (a ``RealSettings``).

    ``dry_run`` defaults to the config's. ``kube_api`` (a ``kubernetes.client.ApiClient``),
    ``aws_session`` (a ``boto3.Session``) and ``gcp_credentials`` replace what the settings would
    build, for callers that hold their own. Raises ``ValueError`` when the settings cannot run
    (no Prometheus section, references to unknown pools or models)."""
    settings = getattr(cfg.providers, "settings", None)
    if not isinstance(settings, RealSettings):
        raise ValueError(f"build_real_providers needs providers.type real, got {getattr(cfg.providers, 'type', None)!r}")
    if settings.prometheus is None:
        raise ValueError("providers.settings.prometheus is required with providers.type real (the url of Prometheus's HTTP API)")
    problems = settings.cross_check({p.name: p.kind.value for p in cfg.pools},
                                    {m.name: list(m.deployments) for m in cfg.models})
    if problems:
        raise ValueError("; ".join(problems))
    dry = cfg.dry_run if dry_run is None else dry_run

    from providers.cloudpool import build_real_pools
    from providers.kubernetes import KubernetesCluster

    out_closers: list[Callable[[], None]] = []
    api = kube_api
    if api is None:
        api = settings.kubernetes.api_client()
        out_closers.append(api.close)
    ks = settings.kubernetes.to_settings()
    aws = settings.aws.to_settings(dry_run=dry)
    if dry and settings.aws.interruption_queue_url:
        logger.info("dry-run: the SQS interruption queue is not read (reading deletes messages an acting daemon needs); "
                    "interruptions are seen from node taints only")
    creds = gcp_credentials
    if creds is None and settings.gcp.credentials == "anonymous":
        from google.auth.credentials import AnonymousCredentials

        creds = AnonymousCredentials()
    real = build_real_pools(
        cfg, kube_api=api, kubernetes=ks, aws=aws, gcp=settings.gcp.to_settings(), cloud=settings.cloud.build(),
        gcp_spot_prices_usd=settings.gcp.spot_prices_usd, dry_run=dry, aws_session=aws_session,
        gcp_credentials=creds)

    prom = settings.prometheus.build()
    out_closers.append(prom.close)
    metrics: Any = prom
    if settings.triton is not None:
        from providers.triton import CombinedMetricsSource, TritonFallback

        replicas = discover_triton_replicas(KubernetesCluster(api, ks), cfg, settings.triton)
        fallback = TritonFallback(replicas, timeout_s=settings.triton.timeout_s,
                                  max_interval_s=settings.triton.max_interval_s)
        out_closers.append(fallback.close)
        metrics = CombinedMetricsSource(prom, fallback)

    jobs: list[Job] = []
    if real.spot_prices is not None:
        jobs.append((real.spot_prices.refresh_job(clock), settings.aws.spot_price_refresh_s, "aws-spot-prices"))
    return RealProviderSet(
        metrics=metrics, pools=real.pools, prices=real.prices,
        jobs=jobs, spot_prices=real.spot_prices, interruptions=real.interruptions,
        api_client=api, _closers=out_closers)


__all__ = ["Job", "RealProviderSet", "build_real_providers", "discover_triton_replicas"]
