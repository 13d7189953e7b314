"""The vocabulary of the decision core, as plain immutable values.

Everything the pure pipeline (``controller.core.pipeline.decide``) consumes or produces is defined
here: what is served (``ModelSpec``), where it runs (``PoolSpec``), what was seen (``Sample``,
``PoolState``, ``ModelSignals``), what a policy thinks (``Recommendation``), what an operator asks
(``Override``), what the pipeline concludes (``Decision`` with its ``Stage`` trace) and what the
providers did about it (``Action``).

These are frozen dataclasses, not pydantic models: they are built every tick (and millions of times
in the simulator), they carry no validation of their own (config and policy files are validated at
load by the pydantic schemas in ``controller.config`` and ``controller.policyfile``), and they
import nothing but the standard library (and the core's own signal table, which ``ModelSignals``
derives its samples from) so that the core stays pure.

Units live in the names: ``_s`` seconds, ``_ms`` milliseconds, ``_usd`` US dollars, ``_pct`` percent
(0-100), ``_per_s`` per second.
"""

from __future__ import annotations

import enum
import math
from dataclasses import MISSING as _NO_DEFAULT, dataclass, field, fields
from datetime import datetime
from typing import TYPE_CHECKING, Any, Mapping, TypeVar

from controller.core import signals as signal_table


_T = TypeVar("_T")
_isfinite = math.isfinite  # Sample.fresh's test, without a module attribute lookup (hot path)


class _Factory:
    """The default of a field with a ``default_factory`` in a :func:`fast_init` signature."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()


def fast_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an ``__init__`` that sets each field through its slot's own
    descriptor, with the same parameters and defaults as the generated one.

    The generated ``__init__`` of a frozen dataclass sets each field with ``object.__setattr__(self,
    name, value)``, which looks the name up on the class again; the slot's descriptor sets it
    directly (a ``Stage`` is built in 0.27 us instead of 0.45 on the machine of this change). It counts for the values the pipeline builds every decision
    (a dozen ``Stage`` alone; the simulator takes hundreds of thousands of decisions). Nothing else
    changes: ``repr``, equality, hashing and pickling stay the dataclass's. Refuses a class with a
    ``__post_init__``, an ``init=False`` or a keyword-only field (none of these is handled here).
    """
    if "__slots__" not in cls.__dict__ or not cls.__dataclass_params__.frozen or hasattr(cls, "__post_init__"):  # type: ignore[attr-defined]
        raise TypeError(f"fast_init: {cls.__name__} is not a frozen, slotted dataclass without __post_init__")
    params, body = [], []
    env: dict[str, Any] = {"_FACTORY": _FACTORY}
    for f in fields(cls):  # type: ignore[arg-type]
        if not f.init or f.kw_only:
            raise TypeError(f"fast_init: {cls.__name__}.{f.name} is init=False or keyword-only")
        env[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default is not _NO_DEFAULT:
            env[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not _NO_DEFAULT:
            env[f"_factory_{f.name}"] = f.default_factory
            params.append(f"{f.name}=_FACTORY")
            body.append(f"    if {f.name} is _FACTORY: {f.name} = _factory_{f.name}()")
        else:
            params.append(f.name)
        body.append(f"    _set_{f.name}(self, {f.name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"]), env)  # noqa: S102
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    setattr(cls, "__init__", init)
    return cls


class Tier(str, enum.Enum):
    """What kind of capacity a pool holds, whoever provides it. The order of preference is
    on-prem, then spot, then on-demand: fill low tiers first, release high tiers first."""

    ONPREM = "onprem"
    """Nodes that exist and are paid for (a fixed count): no node group to resize."""
    SPOT = "spot"
    """Cheap cloud capacity that the provider can take back with a short notice."""
    ONDEMAND = "ondemand"
    """Cloud capacity at list price that stays until released."""

    @property
    def is_onprem(self) -> bool:
        return self is Tier.ONPREM

    @property
    def is_spot(self) -> bool:
        return self is Tier.SPOT

    @property
    def is_ondemand(self) -> bool:
        return self is Tier.ONDEMAND

    @property
    def rank(self) -> int:
        """0 on-prem, 1 spot, 2 on-demand: fill low ranks first, release high ranks first."""
        # identity tests, not a dict keyed by members: an Enum member hashes in Python (hot path)
        return 0 if self is Tier.ONPREM else 1 if self is Tier.SPOT else 2


@fast_init
@dataclass(frozen=True, slots=True)
class ReplicaCapacity:
    """What one replica sustains while meeting the SLO, on one GPU type."""

    output_tokens_per_s: float
    requests_per_s: float
    prefill_tokens_per_s: float | None = None
    """Prompt tokens/s one replica prefills at the SLO when doing nothing else (with
    ``decode_tokens_per_s``: the capacity for any token mix, see ``controller.core.capacity``)."""
    decode_tokens_per_s: float | None = None
    """Output tokens/s one replica generates at the SLO when doing nothing else."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A served model bundle (Triton + TensorRT-LLM engine)."""

    name: str
    tp_degree: int
    """Tensor-parallel degree = GPUs per replica; a replica never spans nodes."""
    quantization: str
    gpu_types: tuple[str, ...]
    """GPU types the bundle has engines for; a pool of another GPU type cannot host it."""
    cold_start_s: float
    """Pod start plus engine load, seconds, until a new replica is ready."""
    capacity: Mapping[str, ReplicaCapacity]
    """Per GPU type: sustainable throughput of one replica at the SLO."""
    pools: tuple[str, ...]
    """Names of the pools this model has a Deployment in."""

    @property
    def gpus_per_replica(self) -> int:
        return self.tp_degree


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A place replicas run: static facts from the daemon config."""

    name: str
    tier: Tier
    provider: str
    """Name of the pool provider that holds its nodes (``onprem``, ``aws``, ``gcp``, or any other
    installed one): the core never looks at it; adapters and the simulator do."""
    gpu_type: str
    gpus_per_node: int
    max_nodes: int
    price_per_node_hour_usd: float
    """Static price: the on-prem amortized cost, the on-demand list price, or the spot fallback
    when no live spot price is known."""
    provisioning_delay_s: float = 0.0
    min_nodes: int = 0
    priority: int = 0
    """Tie-breaker among pools of equal effective cost: lower is preferred."""

    def replicas_per_node(self, model: ModelSpec) -> int:
        if self.gpu_type not in model.gpu_types:
            return 0
        return self.gpus_per_node // model.tp_degree

    def max_replicas(self, model: ModelSpec) -> int:
        return self.max_nodes * self.replicas_per_node(model)

    def nodes_for(self, model: ModelSpec, replicas: int) -> int:
        """Whole nodes needed to pack ``replicas`` replicas of ``model`` (TP GPUs each)."""
        per_node = self.replicas_per_node(model)
        if replicas <= 0:
            return 0
        if per_node == 0:
            raise ValueError(f"pool {self.name} cannot host model {model.name}")
        return -(-replicas // per_node)


@fast_init
@dataclass(frozen=True, slots=True)
class Sample:
    """One observed value with its timestamp. ``value is None`` means missing, never zero."""

    value: float | None
    at: datetime | None = None
    reason: str | None = None
    """Why the value is missing or approximate (``NoData``, ``NaN``, ``HTTP 503``, ...)."""

    @staticmethod
    def missing(reason: str, at: datetime | None = None) -> "Sample":
        return Sample(None, at, reason)

    def age_s(self, now: datetime) -> float | None:
        return None if self.at is None else (now - self.at).total_seconds()

    def fresh(self, now: datetime, max_age_s: float) -> float | None:
        """The value if present, finite and not older than ``max_age_s``; else ``None``."""
        value, at = self.value, self.at  # each slot read once: a few per decision and signal (hot path)
        if value is None or at is None or not _isfinite(value) or (now - at).total_seconds() > max_age_s:
            return None
        return value


MISSING = Sample(None, None, "NoData")


@fast_init
@dataclass(frozen=True, slots=True)
class PoolState:
    """What capacity providers report about one pool for one model, plus the live price."""

    pool: str
    replicas: int | None
    """Desired replicas as currently set on the pool's Deployment (``None``: unknown)."""
    ready_replicas: int | None = None
    nodes: int | None = None
    available: bool = True
    """False while the pool cannot take new replicas (unschedulable past a timeout, failed
    launches, too many recent interruptions)."""
    unavailable_reason: str | None = None
    interrupted_replicas: int = 0
    """Replicas on nodes with an interruption notice: they will be gone soon and are replaced
    elsewhere now."""
    recent_interruptions: int = 0
    price_per_node_hour_usd: float | None = None
    """Live price (spot); ``None`` means use the static price from the pool spec."""
    at: datetime | None = None
    max_nodes: int | None = None
    """The provider's own bound on the pool's nodes now (a Karpenter NodePool's ``spec.limits``);
    placement uses the smaller of it and the spec's ``max_nodes``. ``None``: the spec's alone."""
    scheduled_replicas: int | None = None
    """Replicas whose pod is bound to a node now (ready, or starting on a node that is up), those on
    noticed nodes included; ``None``: unknown. On an unavailable pool these stay (a launched node's
    replica finishes its cold start) where only the ready ones would otherwise."""


@dataclass(frozen=True, slots=True, init=False)
class ModelSignals:
    """Load and health of one model across its pools at one tick.

    One ``Sample`` per ``ModelSignals`` row of the signal table (``controller.core.signals``),
    read as ``signals.<name>`` (or ``signals.sample(name)``); a signal not given is ``MISSING``.
    Built as ``ModelSignals(model, at, queue_depth=Sample(...), ...)`` or with ``samples=``; a
    name the table does not hold is a ``TypeError``, as an unknown field would be.
    """

    model: str
    at: datetime
    samples: Mapping[str, Sample]
    """Signal name -> sample, every ``ModelSignals`` row of the table, in table order."""
    pools: Mapping[str, PoolState]
    degraded: str | None
    """Why this observation is degraded (e.g. ``PrometheusUnavailable: ...`` while values come from
    a fallback source); ``None`` when healthy. Degraded observations never release capacity."""
    queries: Mapping[str, Sample]
    """PromQL expression -> its value this tick, for the expressions the model's rules asked the
    metrics source to evaluate (the ``promql`` kind); an expression not evaluated is absent."""

    def __init__(self, model: str, at: datetime, *, samples: Mapping[str, Sample] | None = None,
                 pools: Mapping[str, PoolState] | None = None, degraded: str | None = None,
                 queries: Mapping[str, Sample] | None = None, **named: Sample) -> None:
        names = signal_table.model_signal_names()
        given = {**samples, **named} if samples else named
        full = {n: given.get(n, MISSING) for n in names}
        if any(n not in full for n in given):
            unknown = [n for n in given if n not in full]
            raise TypeError(f"ModelSignals has no signal {', '.join(map(repr, unknown))} "
                            f"(the signal table has: {', '.join(names)})")
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "at", at)
        object.__setattr__(self, "samples", full)
        object.__setattr__(self, "pools", {} if pools is None else pools)
        object.__setattr__(self, "degraded", degraded)
        object.__setattr__(self, "queries", {} if queries is None else queries)

    @classmethod
    def all_missing(cls, model: str, at: datetime, sample: Sample, **kw: Any) -> "ModelSignals":
        """Every signal the same missing ``sample`` (e.g. no data at all for this model)."""
        return cls(model, at, samples=dict.fromkeys(signal_table.model_signal_names(), sample), **kw)

    def sample(self, name: str) -> Sample:
        """The sample of signal ``name`` (``KeyError`` for a name the table does not hold)."""
        try:
            return self.samples[name]
        except KeyError:
            raise KeyError(f"unknown signal {name!r} (known: {', '.join(self.samples)})") from None

    def replace_samples(self, **changes: Sample) -> "ModelSignals":
        """A copy with some samples changed."""
        return ModelSignals(self.model, self.at, samples={**self.samples, **changes}, pools=self.pools,
                            degraded=self.degraded, queries=self.queries)

    def query(self, expression: str) -> Sample:
        """The value of a PromQL expression a rule asked for (missing when no source evaluated it)."""
        return self.queries.get(expression) or Sample.missing(
            "NotConfigured: no metrics source evaluated this query (the promql kind needs the Prometheus source)")

    if TYPE_CHECKING:
        # ``signals.queue_depth`` and the like: one accessor per table row (installed below; rows a
        # test adds to the table at run time are served by ``__getattr__``).
        def __getattr__(self, name: str) -> Sample: ...
    else:
        def __getattr__(self, name: str) -> Sample:
            if name != "samples" and name in signal_table.model_signal_names():
                return self.samples.get(name, MISSING)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def current_replicas(self) -> int | None:
        """Sum of desired replicas over pools; ``None`` if any pool is unknown."""
        total = 0
        for st in self.pools.values():
            if st.replicas is None:
                return None
            total += st.replicas
        return total

    @property
    def ready_replicas(self) -> int | None:
        total = 0
        for st in self.pools.values():
            if st.ready_replicas is None:
                return None
            total += st.ready_replicas
        return total


def _accessor(name: str) -> property:
    return property(lambda self: self.samples[name], doc=signal_table.signal(name).description)


for _name in signal_table.model_signal_names():
    setattr(ModelSignals, _name, _accessor(_name))
del _name


class Opinion(str, enum.Enum):
    TARGET = "target"
    """The replicas the rule wants: combined with the others by max."""
    FLOOR = "floor"
    """A lower bound (e.g. a warm-pool schedule): applied at the bounds stage, unstabilized."""


@fast_init
@dataclass(frozen=True, slots=True)
class Recommendation:
    """One rule's raw opinion. ``replicas is None`` means no opinion (e.g. missing data)."""

    rule: str
    kind: str
    replicas: int | None
    reason: str
    message: str = ""
    opinion: Opinion = Opinion.TARGET
    missing_data: bool = False
    """True when the rule had no opinion because its inputs were missing or stale: the pipeline
    then refuses to release capacity (unless the policy says otherwise)."""
    state: Mapping[str, Any] = field(default_factory=dict)
    """Explicit state handed back to the same rule on the next tick."""
    present_replicas: int | None = None
    """The replicas the load seen now needs, without anticipation or memory of past peaks
    (``None``: ``replicas`` is that already, as for a reactive rule). Lead-time economics
    (``controller.core.leadtime``) buys and keeps cloud capacity for this, not for memory."""
    trend_replicas: int | None = None
    """The replicas the rule's trend expects one lead time ahead, without memory of past peaks
    (``None``: ``present_replicas``)."""


class OverrideKind(str, enum.Enum):
    PIN = "pin"
    BOUNDS = "bounds"
    FREEZE = "freeze"
    DRAIN_POOL = "drain-pool"


@dataclass(frozen=True, slots=True)
class Override:
    """An operator's instruction, scoped to a model and optionally a pool, with a TTL."""

    id: int
    kind: OverrideKind
    model: str
    pool: str | None = None
    replicas: int | None = None
    """For ``pin``: the total (or, with ``pool``, that pool's) replicas."""
    min_replicas: int | None = None
    max_replicas: int | None = None
    expires_at: datetime | None = None
    reason: str = ""
    author: str = ""
    created_at: datetime | None = None

    def active(self, now: datetime) -> bool:
        return self.expires_at is None or now < self.expires_at


@fast_init
@dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline stage's outcome: the total after the stage, a reason code and a message."""

    name: str
    replicas: int | None
    reason: str
    message: str = ""


@fast_init
@dataclass(frozen=True, slots=True)
class ScaleEvent:
    at: datetime
    from_replicas: int
    to_replicas: int


@fast_init
@dataclass(frozen=True, slots=True)
class History:
    """The pipeline's memory, passed in and returned explicitly (rebuilt from the decision log on
    restart). Windows compare timestamps; nothing here counts ticks."""

    recommendations: tuple[tuple[datetime, int], ...] = ()
    """(time, combined recommendation after tolerance) kept for the longest stabilization window."""
    scale_events: tuple[ScaleEvent, ...] = ()
    """Changes of the decided total, kept for the longest rate-limit period / cooldown."""
    rule_state: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@fast_init
@dataclass(frozen=True, slots=True)
class Decision:
    """The result of the whole pipeline for one model at one tick, with its trace."""

    model: str
    at: datetime
    current_replicas: int
    """Total desired replicas before this decision."""
    replicas: int
    """Decided total (after overrides, placement and budget: the sum of ``placement``)."""
    placement: Mapping[str, int]
    previous_placement: Mapping[str, int]
    recommendations: tuple[Recommendation, ...]
    trace: tuple[Stage, ...]
    reason: str
    """The reason code of the stage that determined the outcome."""
    actuate: bool
    """False when frozen, paused, or holding before the first complete observation."""
    cost_per_hour_usd: float
    policy_version: str = ""
    history: History = field(default_factory=History)
    interrupted_replaced: int = 0

    @property
    def changed(self) -> bool:
        return dict(self.placement) != dict(self.previous_placement)

    def stage(self, name: str) -> Stage | None:
        for st in self.trace:
            if st.name == name:
                return st
        return None


class ActionStatus(str, enum.Enum):
    OK = "ok"
    NOOP = "noop"
    DRY_RUN = "dry-run"
    FAILED_TRANSIENT = "failed-transient"
    FAILED_PERMANENT = "failed-permanent"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Action:
    """One provider call (or one that would have been made, in dry-run) and how it went."""

    provider: str
    call: str
    pool: str
    model: str
    arguments: Mapping[str, Any]
    status: ActionStatus
    error: str | None = None
    latency_ms: float = 0.0
