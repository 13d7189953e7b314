"""The daemon's configuration file (``apiVersion: tidegate/v1``, ``kind: DaemonConfig``).

One pydantic schema validates it, documents every field (``tidegate config schema`` prints the JSON
Schema; the README's config table is generated from the same descriptions) and converts it into the
core's value types (``PoolSpec``, ``ModelSpec``). Cross-field errors quote both values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from controller.core.capacity import for_mix
from controller.core.model import ModelSpec, PoolSpec, ReplicaCapacity, Tier
from controller.core.spec import Mode
from controller.policyfile import PolicyLimits
from providers.aws import AwsPoolSettings
from providers.gcp import GcpPoolSettings
from providers.karpenter import KarpenterPoolSettings
from providers.leader import LeaderElectionSettings
from providers.real import RealSettings  # the real providers' settings schema
from providers.registry import ProviderRegistry, installed, split_legacy_kind


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesPool(_Strict):
    """How the pool looks inside the cluster."""

    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels that select this pool's nodes (e.g. a node-pool or capacity-type label).")
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="Tolerations the pool's Deployments carry (e.g. for a spot taint).")


class PoolConfig(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", description="Pool name (DNS-1123 label), used in policies, overrides, metrics and the API.")
    tier: Tier | None = Field(None, description="The capacity the pool holds: onprem (nodes that exist and are paid for), spot (reclaimable cloud capacity) or ondemand (cloud capacity at list price). Placement fills onprem first, then spot, then ondemand. Required unless the older `kind` is given.")
    provider: str | None = Field(None, description="Who holds the pool's nodes: an installed pool provider (built in: onprem, aws, gcp; a package adds one through the tidegate.providers entry point group). Default: onprem for tier onprem; required otherwise.")
    kind: str | None = Field(None, description="Older spelling of tier plus provider, still read: onprem, or PROVIDER-spot / PROVIDER-ondemand (e.g. aws-spot is tier spot from provider aws). Give either kind or tier.")
    gpu_type: str = Field(description="GPU type of the pool's nodes (e.g. A100-80GB, L4, H100); must be one the model bundle has engines for.")
    gpus_per_node: int = Field(gt=0, description="GPUs per node; a replica of TP GPUs never spans nodes.")
    max_nodes: int = Field(ge=0, description="Most nodes the pool may hold (for on-prem: nodes that exist).")
    min_nodes: int = Field(0, ge=0, description="Fewest nodes the node group keeps.")
    price_per_node_hour_usd: float = Field(ge=0, description="Static price per node-hour: amortized cost for on-prem, list price for on-demand, fallback for spot when no live price is known.")
    provisioning_delay_s: float = Field(0, ge=0, description="Seconds from ordering a node to it being schedulable (0 for on-prem).")
    priority: int = Field(0, description="Tie-breaker between pools of equal effective cost (lower first).")
    kubernetes: KubernetesPool = Field(default_factory=KubernetesPool, description="Node selector and tolerations of the pool inside the cluster.")
    aws: AwsPoolSettings | None = Field(None, description="The pool's Auto Scaling group: required for provider aws with real providers.")
    gcp: GcpPoolSettings | None = Field(None, description="The pool's managed instance group: required for provider gcp with real providers.")
    karpenter: KarpenterPoolSettings | None = Field(None, description="The pool's Karpenter NodePool: required for provider karpenter with real providers.")

    @model_validator(mode="after")
    def _tier_and_provider(self) -> "PoolConfig":
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) is greater than max_nodes ({self.max_nodes})")
        if self.kind is not None:
            tier, provider = split_legacy_kind(self.kind)
            if self.tier is not None and self.tier is not tier:
                raise ValueError(f"kind ({self.kind!r}) says tier {tier.value!r} but tier is {self.tier.value!r}; give only tier and provider")
            if self.provider is not None and self.provider != provider:
                raise ValueError(f"kind ({self.kind!r}) says provider {provider!r} but provider is {self.provider!r}; give only tier and provider")
            object.__setattr__(self, "tier", tier)
            object.__setattr__(self, "provider", provider)
        if self.tier is None:
            raise ValueError("set tier (onprem, spot or ondemand) and provider (e.g. aws), or the older kind (e.g. aws-spot)")
        if self.provider is None:
            if self.tier is not Tier.ONPREM:
                raise ValueError(f"tier {self.tier.value!r} needs a provider (who holds the nodes, e.g. aws or gcp)")
            object.__setattr__(self, "provider", "onprem")
        return self

    def to_spec(self) -> PoolSpec:
        assert self.tier is not None and self.provider is not None  # set by _tier_and_provider
        return PoolSpec(
            name=self.name, tier=self.tier, provider=self.provider, gpu_type=self.gpu_type,
            gpus_per_node=self.gpus_per_node, max_nodes=self.max_nodes, min_nodes=self.min_nodes,
            price_per_node_hour_usd=self.price_per_node_hour_usd,
            provisioning_delay_s=self.provisioning_delay_s, priority=self.priority,
        )


class CapacityProfile(_Strict):
    output_tokens_per_s: float | None = Field(None, gt=0, description="Output tokens per second one replica sustains at the SLO on this GPU type, for one token mix. Optional with prefill_tokens_per_s and decode_tokens_per_s (then derived for a 1000-prompt / 250-output mix).")
    requests_per_s: float | None = Field(None, gt=0, description="Requests per second one replica sustains at the SLO on this GPU type, for one token mix. Optional with prefill_tokens_per_s and decode_tokens_per_s.")
    prefill_tokens_per_s: float | None = Field(None, gt=0, description="Prompt tokens per second one replica prefills at the SLO doing nothing else. With decode_tokens_per_s: the capacity for whatever token mix is observed (a request costs prompt/prefill + output/decode replica-seconds), corrected online (spec.capacity in the policy).")
    decode_tokens_per_s: float | None = Field(None, gt=0, description="Output tokens per second one replica generates at the SLO doing nothing else (see prefill_tokens_per_s).")

    @model_validator(mode="after")
    def _one_way_or_the_other(self) -> "CapacityProfile":
        mix_free = (self.prefill_tokens_per_s is not None, self.decode_tokens_per_s is not None)
        fixed = (self.output_tokens_per_s is not None, self.requests_per_s is not None)
        if mix_free[0] != mix_free[1]:
            raise ValueError("give prefill_tokens_per_s and decode_tokens_per_s together")
        if not all(mix_free) and not all(fixed):
            raise ValueError("give output_tokens_per_s and requests_per_s, or prefill_tokens_per_s and decode_tokens_per_s")
        return self

    def to_capacity(self) -> ReplicaCapacity:
        if self.output_tokens_per_s is not None and self.requests_per_s is not None:
            return ReplicaCapacity(self.output_tokens_per_s, self.requests_per_s, self.prefill_tokens_per_s,
                                   self.decode_tokens_per_s)
        return for_mix(ReplicaCapacity(0.0, 0.0, self.prefill_tokens_per_s, self.decode_tokens_per_s), None)


class DeploymentRef(_Strict):
    namespace: str = Field("default", description="Namespace of the pool's Deployment.")
    name: str = Field(description="Deployment name serving this model in this pool.")
    label_selector: str | None = Field(None, description="Label selector of its pods (default: the Deployment's own).")


class ModelConfig(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="Model bundle name, as policies and the API refer to it.")
    tp_degree: int = Field(ge=1, le=16, description="Tensor-parallel degree = GPUs per replica.")
    quantization: str = Field(description="Engine quantization, e.g. fp8, int8-weight-only, int4-awq.")
    gpu_types: list[str] = Field(min_length=1, description="GPU types the bundle has TensorRT-LLM engines for.")
    cold_start_s: float = Field(ge=0, description="Pod start plus engine load until ready, seconds.")
    capacity: dict[str, CapacityProfile] = Field(description="Per GPU type: what one replica sustains at the SLO.")
    deployments: dict[str, DeploymentRef] = Field(description="Per pool name: the Deployment that serves this model there.")
    bundle_manifest: Path | None = Field(None, description="Path to the bundle manifest (deploy/model/...); when set, its TP and GPU types must agree with this entry.")

    @model_validator(mode="after")
    def _capacity_for_each_gpu(self) -> "ModelConfig":
        missing = [g for g in self.gpu_types if g not in self.capacity]
        if missing:
            raise ValueError(f"capacity has no profile for gpu_types {missing} (has {sorted(self.capacity)})")
        return self

    def to_spec(self) -> ModelSpec:
        return ModelSpec(
            name=self.name, tp_degree=self.tp_degree, quantization=self.quantization,
            gpu_types=tuple(self.gpu_types), cold_start_s=self.cold_start_s,
            capacity={g: c.to_capacity() for g, c in self.capacity.items()},
            pools=tuple(self.deployments),
        )


class RetentionConfig(_Strict):
    """How long the decision log keeps full decisions, and the job that compacts older ones."""

    enabled: bool = Field(True, description="Run the retention job (on every daemon; a PostgreSQL lock or SQLite's single writer lets one compact at a time).")
    full_days: float = Field(14, gt=0, le=3650, description="Keep full decisions this many days; older ones are compacted into one row per model and hour (replicas per pool, cost, signal summaries, counts by reason and outcome) and deleted.")
    interval_s: float = Field(300, gt=0, description="Seconds between runs of the retention job (wall clock).")
    batch: int = Field(500, ge=1, le=100_000, description="Decisions compacted per transaction: each batch holds the log's write lock briefly, so ticks are never blocked for long.")
    max_batches: int = Field(200, ge=1, description="Most batches per run (the rest waits for the next run).")


class DatabaseConfig(_Strict):
    url: str = Field("sqlite:///tidegate.db", description="SQLAlchemy URL: sqlite:///PATH (embedded default) or postgresql+psycopg://user@host/db.")
    echo: bool = Field(False, description="Log every SQL statement (debugging).")
    journal_path: Path | None = Field(None, description="Local journal (JSON lines, fsync'd) for the decisions the database cannot take while it is away: the daemon then acts on scale-ups only and replays the journal, in order and once, when the database returns. Put it on a volume of its own (the chart mounts one). null (the default outside the chart): no journal; with the database away the daemon acts on nothing.")
    retention: RetentionConfig = Field(default_factory=RetentionConfig, description="Retention of full decisions and hourly rollups.")


class TokenSource(_Strict):
    env: str | None = Field(None, description="Environment variable holding comma-separated tokens.")
    file: Path | None = Field(None, description="File holding one token per line.")


class ApiConfig(_Strict):
    enabled: bool = Field(True, description="Serve the admin API and /metrics.")
    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8080, ge=0, le=65535, description="Bind port (0: pick a free one).")
    admin_tokens: TokenSource = Field(default_factory=lambda: TokenSource(env="TIDEGATE_ADMIN_TOKENS"), description="Where admin bearer tokens come from (never from policy files).")
    viewer_tokens: TokenSource = Field(default_factory=lambda: TokenSource(env="TIDEGATE_VIEWER_TOKENS"), description="Where viewer bearer tokens come from.")
    max_body_bytes: int = Field(65536, ge=1024, le=16 * 1024 * 1024, description="Largest request body accepted, bytes; a larger one is answered 413 before it is read or parsed (also for chunked bodies without Content-Length).")
    docs: bool = Field(True, description="Serve the Swagger UI at /docs (its assets come from the daemon itself, never a CDN) and the OpenAPI document at /openapi.json.")
    ui: bool = Field(True, description="Serve the status page at /ui (fleet, timeline, decisions, overrides, policies, shadow report; no external assets). It asks for a viewer or admin token once and keeps it in an HttpOnly, SameSite=Strict cookie.")
    docs_require_token: bool = Field(False, description="Whether /docs, its assets and /openapi.json need a viewer or admin token. Off by default: the document describes the open-source API and no state; a browser cannot send a bearer token to open /docs.")


class LoopConfig(_Strict):
    interval_s: float = Field(5, gt=0, description="Seconds between ticks (of the daemon's clock).")
    policy_reload_s: float = Field(2, gt=0, description="Seconds between checks of the policies directory for changed files (wall clock).")
    backoff_max_s: float = Field(60, gt=0, description="Longest pause after repeated provider errors, seconds.")
    ready_after_failed_ticks: int = Field(3, ge=1, description="/readyz turns unready after this many consecutive failed ticks.")


class SimulatedProviders(_Strict):
    type: Literal["simulated"] = Field("simulated", description="Simulated fleet and load (demo, tests).")
    seed: int = Field(7, description="Random seed of the synthetic load and the spot interruptions.")
    speedup: float = Field(60, gt=0, description="Simulated seconds per wall second (the demo's accelerated clock).")
    base_requests_per_s: float = Field(2.0, ge=0, description="Trough load of the diurnal curve, requests per second.")
    peak_requests_per_s: float = Field(30.0, ge=0, description="Peak load of the diurnal curve, requests per second.")
    period_s: float = Field(3600, gt=0, description="Length of one simulated load cycle, seconds.")
    burst_every_s: float = Field(0, ge=0, description="Mean seconds between random bursts (0: none).")
    burst_factor: float = Field(1.5, ge=1, description="Load multiplier during a burst.")
    burst_duration_s: float = Field(120, gt=0, description="Burst length, seconds.")
    interruptions_per_node_hour: float = Field(0.0, ge=0, description="Spot interruption rate per spot node-hour.")
    mean_output_tokens: float = Field(250, gt=0, description="Mean output tokens per request.")
    mean_input_tokens: float = Field(1000, gt=0, description="Mean prompt tokens per request.")
    initial_onprem_replicas: int = Field(1, ge=0, description="Replicas each model starts with (ready) in each on-prem pool; other pools start empty.")


class RealProviders(_Strict):
    type: Literal["real"] = Field("real", description="Prometheus, Triton, Kubernetes and the pool providers (aws, gcp...).")
    settings: RealSettings = Field(default_factory=RealSettings, description="Provider settings: Prometheus, the Triton fallback, Kubernetes, each pool provider's section and cloud capacity (see providers.real).")


class OnPremCostConfig(_Strict):
    """How an on-prem node-hour is priced for placement, budgets and cost per token (GPUs already paid
    for still cost): ``controller.core.pricing``."""

    capital_usd_per_gpu_hour: float = Field(ge=0, description="Purchase and hosting cost of one GPU spread over its service life, USD per GPU-hour.")
    energy_usd_per_kwh: float = Field(ge=0, description="Electricity price at the site, USD per kWh, applied to DCGM's measured GPU power.")
    pue: float = Field(1.0, ge=1, description="Power usage effectiveness (facility / IT power); 1.0 counts the GPUs only.")
    assumed_gpu_power_kw: float | None = Field(None, gt=0, description="kW per GPU to assume while DCGM's power reading is missing; unset: the displayed cost per token is then missing and placement prices the pool at its static price_per_node_hour_usd.")


_POLICY_FILE_CEILING_BYTES = 64 << 20
"""Highest policy_max_file_bytes accepted: policy files are small, and each is read whole."""


class DaemonConfig(_Strict):
    apiVersion: Literal["tidegate/v1"] = Field("tidegate/v1", description="Format version.")
    kind: Literal["DaemonConfig"] = Field("DaemonConfig", description="Document kind.")
    policies_dir: Path = Field(Path("policies"), description="Directory of ScalingPolicy YAML files, watched for changes (relative paths are relative to the config file).")
    policy_max_file_bytes: int = Field(PolicyLimits().max_file_bytes, ge=1024, le=_POLICY_FILE_CEILING_BYTES, description=f"Largest policy file read, bytes (at most {_POLICY_FILE_CEILING_BYTES}): a larger file is refused with an error naming it, after reading one byte more than this.")
    dry_run: bool = Field(False, description="Decide and record, never call a provider to act.")
    mode: Mode = Field(Mode.ACTIVE, description="shadow: every model in shadow mode, whatever its policy says (observe, decide as if in charge, never act, record both; see a policy's spec.mode).")
    database: DatabaseConfig = Field(default_factory=DatabaseConfig, description="The decision log (env TIDEGATE_DATABASE_URL overrides database.url).")
    api: ApiConfig = Field(default_factory=ApiConfig, description="The admin REST API and /metrics.")
    loop: LoopConfig = Field(default_factory=LoopConfig, description="Tick and reload intervals, backoff.")
    providers: SimulatedProviders | RealProviders = Field(default_factory=SimulatedProviders, discriminator="type", description="Where signals come from and where actions go: `simulated` (the demo's fleet) or `real`.")
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings, description="Leader election between daemon replicas (simulated and real providers alike): which backend, the Lease's name and namespace, its timing.")
    onprem_cost: OnPremCostConfig | None = Field(None, description="On-prem capital and energy pricing, used alike by placement, both budget caps and the displayed cost per token; unset: on-prem nodes cost their static price_per_node_hour_usd.")
    pools: list[PoolConfig] = Field(min_length=1, description="Where replicas can run.")
    models: list[ModelConfig] = Field(min_length=1, description="The model bundles served, each with one Deployment per pool.")

    @model_validator(mode="after")
    def _cross_refs(self, info: ValidationInfo) -> "DaemonConfig":
        names = [p.name for p in self.pools]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"pool names must be unique; repeated: {sorted(dup)}")
        pools = {p.name: p for p in self.pools}
        # Which providers exist is what is installed (entry points), unless the caller passes a
        # registry as validation context: model_validate(data, context={"providers": registry}).
        registry: ProviderRegistry = (info.context or {}).get("providers") or installed()
        real = isinstance(self.providers, RealProviders)
        for p in self.pools:
            spec = p.to_spec()
            problem = registry.problem(p.name, spec.provider, spec.tier)
            if problem:
                raise ValueError(problem)
            kind = registry.get(spec.provider)
            if real and kind.PoolSettings is not None and not isinstance(getattr(p, spec.provider, None), kind.PoolSettings):
                raise ValueError(f"pool {p.name!r} has provider {spec.provider} but no {spec.provider} section")
        if isinstance(self.providers, RealProviders):  # settings that name pools or models
            problems = self.providers.settings.cross_check(
                {p.name: p.to_spec().provider for p in self.pools}, {m.name: list(m.deployments) for m in self.models},
                registry)
            if problems:
                raise ValueError("; ".join(problems))
        election_problem = self.leader_election.problem_with(self.database.url)
        if election_problem:
            raise ValueError(election_problem)
        mnames = [m.name for m in self.models]
        mdup = {n for n in mnames if mnames.count(n) > 1}
        if mdup:
            raise ValueError(f"model names must be unique; repeated: {sorted(mdup)}")
        for m in self.models:
            for pool_name in m.deployments:
                if pool_name not in pools:
                    raise ValueError(f"model {m.name!r} has a deployment in pool {pool_name!r}, which is not among the pools {names}")
                pool = pools[pool_name]
                if pool.gpu_type not in m.gpu_types:
                    raise ValueError(
                        f"model {m.name!r} has no engine for pool {pool_name!r}'s gpu_type {pool.gpu_type!r} (gpu_types: {m.gpu_types})")
                if pool.gpus_per_node < m.tp_degree:
                    raise ValueError(
                        f"pool {pool_name!r} gpus_per_node ({pool.gpus_per_node}) is less than model {m.name!r} tp_degree ({m.tp_degree})")
        return self

    def pool_specs(self) -> dict[str, PoolSpec]:
        return {p.name: p.to_spec() for p in self.pools}

    def model_specs(self) -> dict[str, ModelSpec]:
        return {m.name: m.to_spec() for m in self.models}
