"""The signal table: every signal tidegate observes, defined once.

A *signal* is an observation of one model (or one of its pools) at one tick. Each row says its
name (the ``ModelSignals`` accessor, the key in the decision log, in ``/v1/status`` and in the
``signal`` label of ``tidegate_signal_missing``), its unit, how the per-pool values combine into
the model's value, the Prometheus source's default PromQL, what it means, and what an absent value
means. Everything else derives from this table instead of listing the names again:

- ``ModelSignals`` (``controller.core.model``) holds one ``Sample`` per row with ``model_signal``
  set, readable as ``signals.<name>``;
- the decision-log codec (``controller.db.codec``), ``/v1/status`` and the ``tidegate_signal_missing``
  gauge (``controller.daemon``) iterate over those rows;
- the pipeline's partial-data guard iterates over the rows whose value combines pools;
- the Prometheus source's ``PromQueries`` has one setting per row with a query, defaulting to it,
  and combines pools as the row says;
- the signals a ``target-utilization`` or ``queue-depth`` rule may name are the ``ModelSignals``
  rows, and the reason code above the target is the row's;
- the README's signal table is generated from it (``controller.docs``; ``python -m controller.docs
  README.md`` rewrites it).

Adding a signal touches this table, the source that measures it, and the policy that reads it.

Consumers read ``SIGNALS`` through the functions below at call time (not copied at import), so a
test can add a row to a copy of the table and watch everything pick it up. Pure: standard library
and the core's reason codes only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

from controller.core.reasons import Reason


class Combine(str, enum.Enum):
    """How the per-pool values of one model combine into the model's value."""

    SUM = "sum"
    """Queues and rates add up over pools."""
    MAX = "max"
    """The worst pool counts: a p99 cannot be averaged, and the most pressured pool is the one
    that hurts."""
    MEAN = "mean"
    """Unweighted mean of the pools' values (each already a mean over the pool's GPUs)."""
    MODEL = "model"
    """Not combined from pools: computed for the model as a whole."""

    @property
    def sentence(self) -> str:
        return {Combine.SUM: "Pools add up.", Combine.MAX: "The worst pool counts.",
                Combine.MEAN: "Pools combine as the unweighted mean.",
                Combine.MODEL: "Computed for the model as a whole."}[self]

    def apply(self, values: Iterable[float]) -> float:
        """The model's value from its pools' values (at least one)."""
        if self is Combine.MODEL:
            raise ValueError("a model-wide signal is computed for the model, not combined from pools")
        vals = list(values)
        if self is Combine.MAX:
            return max(vals)
        if self is Combine.MEAN:
            return sum(vals) / len(vals)
        return sum(vals)


@dataclass(frozen=True, slots=True)
class Signal:
    """One row of the signal table."""

    name: str
    """Identifier everywhere: ``ModelSignals.<name>``, decision log, API, metrics label. Unit in
    the name (``_ms``, ``_pct``, ``_per_s``, ``_usd``)."""
    unit: str
    combine: Combine
    description: str
    """What the signal measures (one sentence for the README and the PromQL setting)."""
    missing: str
    """What an absent value means and what the decision core does about it."""
    above_reason: Reason
    """Reason code a rule reports when this signal is above its target."""
    promql: str | None = None
    """The Prometheus source's default query (``${model}``, ``${pool}``, ``${window}`` are
    substituted); ``None``: not read from Prometheus."""
    promql_help: str = ""
    """What the default query reads (the PromQL setting's description)."""
    model_signal: bool = True
    """A ``ModelSignals`` sample; ``False``: read per pool only (input to another computation)."""
    imported_from: str = ""
    """A regular expression over metric names (``tidegate import`` of an HPA's or a ScaledObject's
    metrics): a metric whose name it matches carries this signal (``""``: none)."""
    undefined_when_idle: bool = False
    """Undefined, rather than missing, while the model serves no request: absent with reason
    ``NoRequests``, or while ``request_rate_per_s`` is a fresh 0. ``slo-guard`` then has nothing
    to guard instead of holding for missing data, and the Prometheus source turns a NaN of an
    idle pool (rate 0) into ``NoRequests``."""


NOT_CONFIGURED = "NotConfigured"
"""A source's reason for a signal whose query is turned off."""
NOT_SIMULATED = "NotSimulated"
"""A simulated world's reason for a signal it does not model."""
NOT_MEASURED_REASONS = frozenset({NOT_CONFIGURED, NOT_SIMULATED})
"""Reasons a source gives for a signal it does not measure by design (its query turned off, a
simulated world without it). The decision core still sees such a sample as missing; the daemon's
``tidegate_signal_missing`` leaves it out, so the ``TidegateSignalMissing`` alert pages only for
signals that are measured and stopped arriving."""


_MISSING_DATA = ("missing data: a rule that reads it has no opinion and, with `on_missing: hold`, blocks any"
                 " scale-down (other rules may still scale up).")
_HOLD = "M" + _MISSING_DATA[1:]

# The join that gives DCGM's per-GPU series the serving pod's model and pool: a 0-valued marker per
# (namespace, pod, model, pool) from Triton's own series, plus the pod's GPU value. Pre-aggregating
# DCGM per pod keeps the match many-to-one even when one pod serves several Triton models (a
# TensorRT-LLM ensemble) and holds several GPUs (tensor parallelism).
_POD_MARKER = "max by (namespace, pod, ${model}, ${pool}) (nv_inference_request_success * 0)"

SIGNALS: tuple[Signal, ...] = (
    Signal(
        "queue_depth", "requests", Combine.SUM,
        "Requests waiting (not yet scheduled into a batch), summed over replicas.",
        _HOLD + " Never read as an empty queue (unless a queue-depth rule sets missing_as_zero).",
        Reason.QUEUE_ABOVE_TARGET,
        promql='sum by (${model}, ${pool}) (nv_trt_llm_request_metrics{request_type="waiting"})'
               " or on (${model}, ${pool}) "
               "sum by (${model}, ${pool}) (nv_inference_pending_request_count)",
        promql_help="Requests waiting per model and pool. TensorRT-LLM: nv_trt_llm_request_metrics{request_type=\"waiting\"}"
                    " (the in-flight batcher's queue); other Triton backends: nv_inference_pending_request_count.",
        imported_from=r"pending_request|queue|waiting",
    ),
    Signal(
        "p99_latency_ms", "ms", Combine.MAX,
        "p99 end-to-end request latency; a mean (reason AverageNotP99) where only Triton's duration counters exist.",
        "Undefined while the model is idle (reason NoRequests, or a fresh request rate of 0): slo-guard then has"
        " no latency to guard, which is not missing data. Otherwise " + _MISSING_DATA,
        Reason.LATENCY_ABOVE_TARGET,
        promql='label_replace(max by (${model}, ${pool}) (nv_inference_request_summary_us{quantile="0.99"}) / 1000,'
               ' "tidegate_estimate", "p99", "", "")'
               " or on (${model}, ${pool}) "
               "label_replace(histogram_quantile(0.99, sum by (${model}, ${pool}, le)"
               " (rate(nv_inference_first_response_histogram_ms_bucket[${window}]))),"
               ' "tidegate_estimate", "p99_first_response", "", "")'
               " or on (${model}, ${pool}) "
               "label_replace(sum by (${model}, ${pool}) (rate(nv_inference_request_duration_us[${window}]))"
               " / sum by (${model}, ${pool}) (rate(nv_inference_request_success[${window}])) / 1000,"
               ' "tidegate_estimate", "mean", "", "")',
        promql_help="p99 request latency in ms, first answer wins: Triton's summary quantile (needs --metrics-config"
                    " summary_latencies=true), then histogram_quantile over nv_inference_first_response_histogram_ms"
                    " (time to first response; histogram_latencies=true), then the mean from the cumulative duration"
                    " counters, marked AverageNotP99 through the tidegate_estimate label.",
        undefined_when_idle=True,
    ),
    Signal(
        "p99_ttft_ms", "ms", Combine.MAX,
        "p99 time to first token (queueing plus prefill): how close the replicas are to the TTFT target.",
        "Undefined while the model is idle (reason NoRequests, or a fresh request rate of 0). Otherwise "
        + _MISSING_DATA + " The learned capacity then judges pressure from the queue instead.",
        Reason.LATENCY_ABOVE_TARGET,
        promql="histogram_quantile(0.99, sum by (${model}, ${pool}, le)"
               " (rate(nv_inference_first_response_histogram_ms_bucket[${window}])))",
        promql_help="p99 time to first response in ms from Triton's nv_inference_first_response_histogram_ms"
                    " (needs --metrics-config histogram_latencies=true).",
        undefined_when_idle=True,
    ),
    Signal(
        "gpu_utilization_pct", "%", Combine.MEAN,
        "Mean GPU utilization of the model's GPUs, 0-100.",
        _HOLD,
        Reason.UTILIZATION_ABOVE_TARGET,
        promql=f"avg by (${{model}}, ${{pool}}) ({_POD_MARKER}"
               " + on (namespace, pod) group_left avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL))",
        promql_help="GPU utilization 0-100 of the GPUs of the serving pods: DCGM_FI_DEV_GPU_UTIL joined on"
                    " (namespace, pod) to Triton's series.",
        imported_from=r"gpu_util|DCGM_FI_DEV_GPU_UTIL",
    ),
    Signal(
        "request_rate_per_s", "requests/s", Combine.SUM,
        "Successful requests per second.",
        _HOLD,
        Reason.THROUGHPUT_ABOVE_CAPACITY,
        promql="sum by (${model}, ${pool}) (rate(nv_inference_request_success[${window}]))",
        promql_help="Successful requests per second (rate of nv_inference_request_success).",
        imported_from=r"request_success|requests?_per_s|request_rate|http_requests",
    ),
    Signal(
        "arrival_rate_per_s", "requests/s", Combine.SUM,
        "Requests arriving per second: the successful requests plus the growth of the requests in"
        " the system (waiting or in flight) over the same window (the load offered: above"
        " request_rate_per_s while a queue builds, below it while one drains).",
        _HOLD + " Sizing for the load (the learned capacity, the forecast kind) then reads"
        " request_rate_per_s instead.",
        Reason.THROUGHPUT_ABOVE_CAPACITY,
        promql="clamp_min(sum by (${model}, ${pool}) (rate(nv_inference_request_success[${window}]))"
               " + on (${model}, ${pool}) "
               'sum by (${model}, ${pool}) (deriv(nv_trt_llm_request_metrics{request_type=~"waiting|active"}[${window}])), 0)'
               " or on (${model}, ${pool}) "
               "sum by (${model}, ${pool}) (rate(nv_inference_request_success[${window}]))",
        promql_help="Successful requests per second plus the per-second slope (deriv) of the TensorRT-LLM"
                    " requests waiting and active over the rate window, at least 0 (a pod that goes away takes its"
                    " requests out of the sum); without those series, the successful requests alone.",
    ),
    Signal(
        "output_tokens_per_s", "tokens/s", Combine.SUM,
        "Output (generated) tokens per second.",
        _HOLD + " The budget's cost-per-token cap is then not applied.",
        Reason.THROUGHPUT_ABOVE_CAPACITY,
        promql="sum by (${model}, ${pool}) (rate(nv_llm_output_token_len_sum[${window}]))",
        promql_help="Output tokens per second: rate of the sum of the TensorRT-LLM backend's nv_llm_output_token_len histogram.",
    ),
    Signal(
        "input_tokens_per_s", "tokens/s", Combine.SUM,
        "Prompt tokens per second.",
        _HOLD,
        Reason.THROUGHPUT_ABOVE_CAPACITY,
        promql="sum by (${model}, ${pool}) (rate(nv_llm_input_token_len_sum[${window}]))",
        promql_help="Prompt tokens per second: rate of the sum of nv_llm_input_token_len.",
    ),
    Signal(
        "kv_cache_utilization_pct", "%", Combine.MAX,
        "KV-cache blocks in use, percent of the cache.",
        _HOLD,
        Reason.UTILIZATION_ABOVE_TARGET,
        promql='max by (${model}, ${pool}) (nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}) * 100'
               " or on (${model}, ${pool}) "
               'max by (${model}, ${pool}) (nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used"}'
               ' / ignoring (kv_cache_block_type) nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"}) * 100',
        promql_help="KV-cache blocks in use, percent: nv_trt_llm_kv_cache_block_metrics fraction, or used/max on"
                    " backends without it.",
    ),
    Signal(
        "cost_per_million_tokens_usd", "USD per million output tokens", Combine.MODEL,
        "The model's cost per hour (all its pools) over its output tokens per hour.",
        "Undefined while no output token is served; missing while the token rate or a pool's cost is unknown."
        " Either way missing data for a rule that reads it.",
        Reason.UTILIZATION_ABOVE_TARGET,
    ),
    Signal(
        "gpu_power_kw", "kW", Combine.SUM,
        "Power drawn by the serving pods' GPUs, per pool: the energy part of on-prem cost.",
        "An on-prem pool's energy cost then uses the configured power per GPU (reason AssumedPower), else that"
        " pool's cost, and so the model's cost per token, is missing.",
        Reason.UTILIZATION_ABOVE_TARGET,
        promql=f"sum by (${{model}}, ${{pool}}) ({_POD_MARKER}"
               " + on (namespace, pod) group_left"
               " sum by (namespace, pod) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[${window}]))) / 1e6",
        promql_help="Power drawn by the serving pods' GPUs in kW: rate of DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
                    " (mJ since boot) / 1e6. Used for the energy part of on-prem cost.",
        model_signal=False,
    ),
)


@dataclass(frozen=True, slots=True)
class _Index:
    table: tuple[Signal, ...]
    by_name: dict[str, Signal]
    model: tuple[str, ...]
    pooled: tuple[str, ...]


_index: _Index | None = None


def _indexed() -> _Index:
    """Lookups over ``SIGNALS``, rebuilt when ``SIGNALS`` is another tuple (a test's copy): the
    decision core asks for them several times per decision, millions of times in the simulator."""
    global _index
    if _index is None or _index.table is not SIGNALS:
        _index = _Index(SIGNALS, {s.name: s for s in SIGNALS},
                        tuple(s.name for s in SIGNALS if s.model_signal),
                        tuple(s.name for s in SIGNALS if s.model_signal and s.combine is not Combine.MODEL))
    return _index


def signal(name: str) -> Signal:
    """The row named ``name`` (``KeyError`` naming the known ones otherwise)."""
    try:
        return _indexed().by_name[name]
    except KeyError:
        raise KeyError(f"unknown signal {name!r} (known: {', '.join(s.name for s in SIGNALS)})") from None


def model_signal_names() -> tuple[str, ...]:
    """The ``ModelSignals`` samples, in table order."""
    return _indexed().model


def pooled_signal_names() -> tuple[str, ...]:
    """The ``ModelSignals`` samples combined from pools (which can therefore cover only some)."""
    return _indexed().pooled


def queried_signals() -> tuple[Signal, ...]:
    """The rows the Prometheus source can query, in table order."""
    return tuple(s for s in SIGNALS if s.promql is not None)
