"""The real providers wired from a daemon config: what ``controller.runtime`` hands the daemon.

``build_real_providers(cfg, clock)`` turns ``cfg.providers.settings`` (a ``providers.real.RealSettings``)
into a metrics source, one provider per pool, a price source and the periodic jobs (the spot
price refresh). Leader election is the daemon config's own ``leader_election`` section
(``providers.leader``), built by ``controller.runtime`` for simulated and real providers alike.

It lives apart from the schema because it reads the whole daemon config: ``controller.config``
imports the schema (``providers.real``), this module imports ``controller.config``, one direction.

Which adapter holds a pool's nodes comes from the pool's ``provider`` through the provider registry
(``providers.registry``): this module names no cloud. The Triton client is imported inside the
functions. Building makes no network call: the first tick is the first observation (nothing is
decided before every pool has been read).

Dry-run is the ``Controller``'s act step alone (``controller.controller``: in dry-run it calls no
provider's ``scale`` and records what it would have asked for); the pool providers have no dry-run
of their own. Here it means one thing: the SQS interruption queue is *not* read, because reading it
deletes the messages: a dry-run daemon beside an acting one would steal its interruption
warnings. Node taints still show interruptions to a dry-run daemon.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from controller.config import DaemonConfig
from providers.cloudpool import CloudPoolProvider, CombinedPrices
from providers.kubernetes import KubernetesCluster, KubernetesPoolProvider
from providers.real import RealSettings, TritonSettings
from providers.registry import BuildContext, Job, ProviderRegistry, installed

if TYPE_CHECKING:  # annotations only
    from controller.protocols import Clock, MetricsSource, PoolProvider, PriceSource
    from providers.triton import TritonReplica

logger = logging.getLogger("tidegate.providers.real")

# --- the assembled providers -------------------------------------------------------------------

@dataclass
class RealProviderSet:
    """What ``build_real_providers`` wires, in the shape ``controller.runtime`` hands the daemon."""

    metrics: "MetricsSource"
    pools: dict[str, "PoolProvider"]
    prices: "PriceSource"
    jobs: list[Job] = field(default_factory=list)
    """Periodic work for ``Daemon.add_job`` (the spot price refresh)."""
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per provider name, the named pieces its build exposes (aws: ``spot_prices``, the
    ``AwsSpotPrices`` cache; ``interruptions``, the SQS queue reader, never in dry-run)."""
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


def discover_triton_replicas(cluster: KubernetesCluster, cfg: "DaemonConfig",
                             triton: TritonSettings) -> Callable[[], dict[str, list["TritonReplica"]]]:
    """A callable (called every tick by ``TritonFallback``) returning each model's Triton endpoints:
    the static ones plus, with ``discover``, ``podIP:port`` of the Running pods of the model's
    Deployment in each pool (the Deployment's own selector unless the config names one), read from
    ``cluster``'s snapshot: within a tick, the lists the pools read anyway. A pool whose pods
    cannot be listed contributes none this tick (the fallback reports ``Partial``)."""
    from controller.protocols import ProviderError
    from providers.kubernetes import selector_from_label_selector
    from providers.triton import TritonReplica

    def replicas() -> dict[str, list[TritonReplica]]:
        snap = cluster.snapshot()

        def selector(namespace: str, name: str, configured: str | None, what: str) -> str:
            if configured:
                return configured
            dep = snap.deployment(namespace, name, what)
            return selector_from_label_selector(dep.spec.selector if dep.spec else None)

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
                        pods = snap.pods(ref.namespace, sel)
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


@dataclass
class RealPools:
    """What ``build_real_pools`` wires: a provider per pool, the price source over all of them,
    the cluster they read, the periodic jobs and each provider's named parts
    (``RealProviderSet.parts``)."""

    pools: dict[str, "PoolProvider"]
    prices: CombinedPrices
    cluster: KubernetesCluster
    """The one cluster every pool's Kubernetes side reads through (and shares a tick's reads of)."""
    jobs: list[Job] = field(default_factory=list)
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)


def build_real_pools(
    config: "DaemonConfig",
    *,
    kube_api: Any,
    settings: RealSettings | None = None,
    registry: ProviderRegistry | None = None,
    clock: "Clock | None" = None,
    dry_run: bool | None = None,
    clients: Mapping[str, Any] | None = None,
) -> RealPools:
    """One ``PoolProvider`` per pool of a ``DaemonConfig``: the pool's Kubernetes side, composed
    (``CloudPoolProvider``) with the node group its provider builds, if any. ``kube_api`` is a
    ``kubernetes.client.ApiClient``; ``settings`` default to the config's (or the defaults);
    ``clients`` hands a provider a client handle the caller holds (by provider name: a
    ``boto3.Session`` for aws, credentials for gcp). ``dry_run`` (default: the config's) only keeps
the providers from consuming shared queues (``BuildContext.dry_run``); acting is the controller's."""
    reg = registry or installed()
    if settings is None:
        settings = getattr(config.providers, "settings", None) or RealSettings()
    dry = config.dry_run if dry_run is None else dry_run
    ks = settings.kubernetes
    cluster = KubernetesCluster(kube_api, ks)
    specs = config.pool_specs()
    kubes: dict[str, KubernetesPoolProvider] = {}

    def kube(pc: Any) -> KubernetesPoolProvider:
        if pc.name not in kubes:
            deployments = {m.name: m.deployments[pc.name] for m in config.models if pc.name in m.deployments}
            kubes[pc.name] = KubernetesPoolProvider(specs[pc.name], deployments, cluster,
                                                    node_selector=pc.kubernetes.node_selector, settings=ks)
        return kubes[pc.name]

    by_provider: dict[str, list[Any]] = {}
    for pc in config.pools:
        by_provider.setdefault(specs[pc.name].provider, []).append(pc)
    out: dict[str, Any] = {}
    prices: dict[str, Any] = {}
    jobs: list[Job] = []
    parts: dict[str, dict[str, Any]] = {}
    for provider, pcs in by_provider.items():
        kind = reg.get(provider)
        if kind.PoolSettings is not None:
            missing = [pc.name for pc in pcs if not isinstance(getattr(pc, provider, None), kind.PoolSettings)]
            if missing:
                raise ValueError(f"pools {missing} have provider {provider} but no {provider} section")
        built = kind.build(pcs, BuildContext(settings.provider_settings(provider), kube, dry,
                                             clock, (clients or {}).get(provider)))
        for pc in pcs:
            if pc.name in built.providers:  # the kind composed the pool itself
                out[pc.name] = built.providers[pc.name]
                continue
            group = built.groups.get(pc.name)
            out[pc.name] = kube(pc) if group is None else CloudPoolProvider(
                kube(pc), group, settings=settings.cloud)
        if built.prices is not None:
            prices[provider] = built.prices
        jobs += built.jobs
        parts[provider] = built.parts
    return RealPools({pc.name: out[pc.name] for pc in config.pools}, CombinedPrices(prices), cluster, jobs, parts)


def build_real_providers(
    cfg: "DaemonConfig",
    clock: "Clock",
    *,
    dry_run: bool | None = None,
    kube_api: Any = None,
    registry: ProviderRegistry | None = None,
    clients: Mapping[str, Any] | None = None,
) -> RealProviderSet:
    """Wire the real providers from ``cfg.providers.settings`` (a ``RealSettings``).

    ``dry_run`` defaults to the config's. ``kube_api`` (a ``kubernetes.client.ApiClient``) and
    ``clients`` (by provider name, see ``build_real_pools``) replace what the settings would
    build, for callers that hold their own. Raises ``ValueError`` when the settings cannot run
    (no Prometheus section, references to unknown pools or models)."""
    settings = getattr(cfg.providers, "settings", None)
    if not isinstance(settings, RealSettings):
        raise ValueError(f"build_real_providers needs providers.type real, got {getattr(cfg.providers, 'type', None)!r}")
    if settings.prometheus is None:
        raise ValueError("providers.settings.prometheus is required with providers.type real (the url of Prometheus's HTTP API)")
    specs = cfg.pool_specs()
    problems = settings.cross_check({n: p.provider for n, p in specs.items()},
                                    {m.name: list(m.deployments) for m in cfg.models}, registry)
    if problems:
        raise ValueError("; ".join(problems))
    dry = cfg.dry_run if dry_run is None else dry_run

    out_closers: list[Callable[[], None]] = []
    api = kube_api
    if api is None:
        api = settings.kubernetes.api_client()
        out_closers.append(api.close)
    real = build_real_pools(cfg, kube_api=api, settings=settings, registry=registry, clock=clock, dry_run=dry,
                            clients=clients)

    prom = settings.prometheus.build()
    out_closers.append(prom.close)
    metrics: Any = prom
    if settings.triton is not None:
        from providers.triton import CombinedMetricsSource, TritonFallback

        replicas = discover_triton_replicas(real.cluster, cfg, settings.triton)
        fallback = TritonFallback(replicas, timeout_s=settings.triton.timeout_s,
                                  max_interval_s=settings.triton.max_interval_s)
        out_closers.append(fallback.close)
        metrics = CombinedMetricsSource(prom, fallback)

    return RealProviderSet(metrics=metrics, pools=real.pools, prices=real.prices, jobs=real.jobs,
                           parts=real.parts, api_client=api, _closers=out_closers)


__all__ = ["Job", "RealPools", "RealProviderSet", "build_real_pools", "build_real_providers", "discover_triton_replicas"]
