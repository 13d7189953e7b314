"""The Prometheus metrics source: the daemon's eyes on Triton, TensorRT-LLM and DCGM metrics.

Why this module looks the way it does:

- **One query per signal kind per tick**, grouped ``by`` model and pool, never one query per model:
  the cost of a tick stays flat as models are added, and every model is seen at the same instant.
- **Missing is not zero.** Every way an answer can be wrong (HTTP 4xx/5xx, timeout, connection
  refused, invalid JSON, an error status, an empty result, several series where one was expected,
  NaN, +/-Inf, a sample older than the configured age) becomes ``Sample(None, reason=...)`` plus
  one structured log line, never ``0`` and never an exception. KEDA's Prometheus scaler reads "no
  data" as 0 by default; an autoscaler that does that releases capacity exactly when its eyes
  fail.
- **Honest estimates.** When a model exposes only Triton's cumulative duration counters, the
  latency signal is a *mean*, not a p99; the sample carries the value with reason
  ``AverageNotP99`` instead of pretending.
- **prometheus-api-client's** ``PrometheusConnect.custom_query`` issues every query (with
  Prometheus's own ``timeout`` parameter and a client-side timeout). The client raises one
  ``PrometheusApiClientException`` carrying a formatted string for every non-200 answer, so the
  source keeps each response through the ``requests`` session's response hook and classifies
  from it (status, Prometheus's ``errorType``/``error``, the body). The client's default
  ``Retry`` is replaced by a single try: it repeats 5xx answers and refused connections three
  times with backoff, so a dead Prometheus would cost seconds per query instead of one refusal
  per tick, and a 5xx would end in a ``RetryError`` that no longer carries the status.
  Each query is logged at DEBUG only (urllib3, under requests).

Reasons are ``"Code: detail"`` strings; ``reason_code(sample)`` returns the code. Codes:
``NoData``, ``SeveralSeries``, ``NaN``, ``Inf``, ``Stale``, ``HTTP <status>``, ``Timeout``,
``ConnectionRefused``, ``ConnectionError``, ``InvalidJSON``, ``BadResponse``, ``QueryError``,
``NotConfigured``, ``NoRequests`` (latency undefined: nothing completed in the window),
``Partial`` (some pools invalid: the value covers the others), ``NoValidPool`` (every pool
invalid, for different reasons), and the informational
``AverageNotP99`` / ``P99OfFirstResponse`` on present values.
"""

from __future__ import annotations

import enum
import logging
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from string import Template
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, create_model

from controller.core.model import ModelSignals, ModelSpec, Sample
from controller.core.signals import NOT_CONFIGURED, queried_signals, signal

if TYPE_CHECKING:
    import requests

# requests, urllib3 and prometheus-api-client (~5.7 MB of resident memory with http.client and ssl)
# are imported by the source when it is built: the settings below are part of every daemon's
# config schema, and a daemon on other metrics sources never loads them.

log = logging.getLogger("tidegate.providers.prometheus")


class Code(str, enum.Enum):
    """Why a sample is missing or approximate (the part of ``Sample.reason`` before ``:``)."""

    NO_DATA = "NoData"
    SEVERAL_SERIES = "SeveralSeries"
    NAN = "NaN"
    INF = "Inf"
    STALE = "Stale"
    TIMEOUT = "Timeout"
    CONNECTION_REFUSED = "ConnectionRefused"
    CONNECTION_ERROR = "ConnectionError"
    INVALID_JSON = "InvalidJSON"
    BAD_RESPONSE = "BadResponse"
    QUERY_ERROR = "QueryError"
    NOT_CONFIGURED = NOT_CONFIGURED
    NO_REQUESTS = "NoRequests"
    PARTIAL = "Partial"
    NO_VALID_POOL = "NoValidPool"
    AVERAGE_NOT_P99 = "AverageNotP99"
    P99_OF_FIRST_RESPONSE = "P99OfFirstResponse"


def reason_code(sample: Sample) -> str | None:
    """The code of a sample's reason (``"HTTP 503"`` keeps its status)."""
    if sample.reason is None:
        return None
    return sample.reason.split(":", 1)[0]


SIGNALS: tuple[str, ...] = tuple(s.name for s in queried_signals() if s.model_signal)
"""The ``ModelSignals`` samples this source fills: the signal table's rows with a default query
(``controller.core.signals``). Pools combine as each row says."""
EXTRA_SIGNALS: tuple[str, ...] = tuple(s.name for s in queried_signals() if not s.model_signal)
"""Read per pool only (e.g. ``gpu_power_kw`` for the cost of on-prem pools, ``controller.core.pricing``)."""
ESTIMATE_LABEL = "tidegate_estimate"
"""Label the default latency query attaches to say which estimate answered (``p99``,
``p99_first_response`` or ``mean``)."""

DEFAULT_FRESHNESS = "min by (${model}, ${pool}) (timestamp(nv_inference_request_success))"


class _PromQueries(BaseModel):
    """The PromQL the source runs, one query per signal kind per tick (``null`` turns a signal
    off: it is then reported missing with ``NotConfigured``).

    Each query must return at most one series per (model, pool), carrying the model in
    ``${model}`` and the pool in ``${pool}`` labels; ``${window}`` is the rate window. These three
    placeholders are substituted before the query runs (``$`` never appears in PromQL). The
    defaults expect Triton's series to carry ``namespace`` and ``pod`` target labels (the usual
    Kubernetes pod relabelling) and the DCGM exporter's pod mapping (scraped with
    ``honor_labels: true``) for the GPU join.

    One setting per row of the signal table that has a default query (``controller.core.signals``),
    between ``rate_window`` and ``freshness``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate_window: str = Field(
        default="1m", pattern=r"^[0-9]+(ms|s|m|h)$",
        description="Range of rate() windows. At least 4 scrape intervals so a single missed scrape does not empty the rate; longer smooths more and reacts later.")

    def render(self, name: str, model_label: str, pool_label: str) -> str | None:
        text = getattr(self, name)
        if text is None:
            return None
        return Template(text).substitute(model=model_label, pool=pool_label, window=self.rate_window)


if TYPE_CHECKING:
    PromQueries = _PromQueries
else:
    PromQueries = create_model(
        "PromQueries", __base__=_PromQueries, __module__=__name__, __doc__=_PromQueries.__doc__,
        **{s.name: (str | None, Field(default=s.promql, description=f"{s.promql_help} {s.combine.sentence}"))
           for s in queried_signals()},
        freshness=(str | None, Field(
            default=DEFAULT_FRESHNESS,
            description="Unix time of the oldest latest scrape per (model, pool). A query's evaluation time says nothing about how old the data is (a restarted Prometheus serves its last pre-restart scrape for up to its lookback delta); samples are dated by this instead and count as stale past max_sample_age_s. null: date samples by the evaluation time.")),
    )


class PrometheusSettings(BaseModel):
    """The ``prometheus`` section of the real providers' settings (``providers.settings`` in the
    daemon config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="Base URL of the Prometheus HTTP API, e.g. http://prometheus.monitoring:9090.")
    timeout_s: float = Field(default=2.0, gt=0, description="Per-query timeout, seconds (sent to Prometheus too). After a timeout the tick's other queries are skipped, so a dead Prometheus costs one timeout per tick.")
    max_sample_age_s: float = Field(default=30.0, gt=0, description="Samples whose data is older than this count as missing (Stale), seconds. A few scrape intervals.")
    pool_label: str = Field(default="pool", description="Label telling pools apart on Triton's series (attached by the scrape config, e.g. from the Deployment's or node pool's label).")
    model_label: str = Field(default="model", description="Label holding the model bundle name (Triton's own 'model' label when Triton's model names are the bundle names).")
    queries: PromQueries = Field(default_factory=PromQueries, description="PromQL per signal; see PromQueries.")

    def build(self, **kw: Any) -> "PrometheusMetricsSource":
        return PrometheusMetricsSource(self.url, self.queries, timeout_s=self.timeout_s,
                                       max_sample_age_s=self.max_sample_age_s, pool_label=self.pool_label,
                                       model_label=self.model_label, **kw)


@dataclass(frozen=True, slots=True)
class Observation:
    """One tick's reading: the per-model signals plus the per-(model, pool) samples they were
    combined from, so the daemon can tell partial data (a pool with ready replicas but no series)
    and compute cost per pool."""

    at: datetime
    models: Mapping[str, ModelSignals]
    pools: Mapping[tuple[str, str], Mapping[str, Sample]]
    queries: int
    """HTTP queries made this tick."""

    def by_pool(self, model: str, signal: str) -> dict[str, Sample]:
        """Pool -> sample of one signal of one model (e.g. ``gpu_power_kw`` for
        ``controller.core.pricing``)."""
        return {pool: v[signal] for (m, pool), v in self.pools.items() if m == model and signal in v}


@dataclass(frozen=True, slots=True)
class _Series:
    labels: Mapping[str, str]
    at: datetime
    raw: str


@dataclass(slots=True)
class _Answer:
    error: str | None = None
    series: list[_Series] = field(default_factory=list)


_TRANSPORT_CODES = (Code.TIMEOUT.value, Code.CONNECTION_REFUSED.value, Code.CONNECTION_ERROR.value)


class PrometheusMetricsSource:
    """A ``MetricsSource`` reading Prometheus's HTTP API (``/api/v1/query``).

    ``max_sample_age_s``: samples dated (by the ``freshness`` query, else by the evaluation time)
    more than this before ``now`` are ``Stale``. ``timeout_s`` bounds each query; after a timeout
    or refused connection the tick's remaining queries are not attempted (they get the same
    reason) so a dead Prometheus costs one timeout per tick, not one per signal.
    """

    def __init__(self, url: str, queries: PromQueries | None = None, *, timeout_s: float = 2.0,
                 max_sample_age_s: float = 30.0, pool_label: str = "pool", model_label: str = "model",
                 session: requests.Session | None = None, headers: Mapping[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.queries = queries or PromQueries()
        self.timeout_s = timeout_s
        self.max_sample_age_s = max_sample_age_s
        self.pool_label = pool_label
        self.model_label = model_label
        from prometheus_api_client import PrometheusConnect
        from requests.adapters import Retry

        # ``session``: the requests session the client sends through (TLS, proxies, a recording
        # session in tests); by default one that verifies certificates (see _default_session).
        self._session = session if session is not None else _default_session()
        self._session.hooks["response"].append(self._keep_response)
        self._response: requests.Response | None = None
        # One try per query (see the module docstring); read=False re-raises a read timeout as
        # itself, as requests' own default adapter does.
        self._prom = PrometheusConnect(self.url, headers=dict(headers) if headers else None,
                                       retry=Retry(total=0, read=False), session=self._session)
        self._logged: dict[tuple[str, str, str], str] = {}
        self.last: Observation | None = None
        self._custom: dict[str, tuple[str, ...]] = {}

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> "PrometheusMetricsSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the protocol

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        return self.observe_detailed(models, now).models

    def set_queries(self, queries: Mapping[str, Sequence[str]]) -> None:
        """The rules' own PromQL (``promql`` kind), per model: each distinct expression is run once
        per tick, as written (no placeholder is substituted), and must return one series."""
        self._custom = {m: tuple(dict.fromkeys(qs)) for m, qs in queries.items() if qs}

    def _custom_samples(self, names: Sequence[str], now: datetime, down: str | None) -> tuple[dict[str, Sample], int]:
        """Each wanted expression's sample (one query each), and the queries made."""
        out: dict[str, Sample] = {}
        made = 0
        for q in dict.fromkeys(q for n in names for q in self._custom.get(n, ())):
            if down is not None:
                out[q] = Sample.missing(f"{down} (not queried: Prometheus unreachable earlier this tick)")
                continue
            made += 1
            ans = self._query(q)
            if ans.error is None and not ans.series:
                ans.error = f"{Code.NO_DATA.value}: the query returned no series"
            elif ans.error is None and len(ans.series) > 1:
                ans.error = (f"{Code.SEVERAL_SERIES.value}: {len(ans.series)} series where one was expected (aggregate"
                             f" the query, e.g. sum(...)): {'; '.join(_fmt_labels(s.labels) for s in ans.series[:3])}")
            if ans.error is not None:
                if ans.error.split(":", 1)[0] in _TRANSPORT_CODES:
                    down = ans.error
                out[q] = Sample.missing(ans.error)
            else:
                out[q] = self._one("promql", "*", "*", ans.series, None, now)
            self._note("promql", "*", q[:120], out[q].reason if out[q].value is None else None, q)
        return out, made

    def observe_detailed(self, models: Sequence[ModelSpec], now: datetime) -> Observation:
        names = [m.name for m in models]
        queries = 0
        down: str | None = None  # transport failure seen this tick: skip the rest

        fresh_at: dict[tuple[str, str], datetime] = {}
        fq = self.queries.render("freshness", self.model_label, self.pool_label)
        if fq is not None:
            queries += 1
            ans = self._query(fq)
            if ans.error is not None:
                self._note("freshness", "*", "*", ans.error, fq)
                if ans.error.split(":", 1)[0] in _TRANSPORT_CODES:
                    down = ans.error
            else:
                for s in ans.series:
                    key = self._key(s)
                    if key is None:
                        continue
                    try:
                        fresh_at[key] = datetime.fromtimestamp(float(s.raw), tz=timezone.utc)
                    except (ValueError, OverflowError):
                        continue

        per_pool: dict[tuple[str, str], dict[str, Sample]] = {}
        failed: dict[str, str] = {}  # signal -> reason that applies to every model
        ran: dict[str, str] = {}  # signal -> the PromQL it ran
        for sig in SIGNALS + EXTRA_SIGNALS:
            q = self.queries.render(sig, self.model_label, self.pool_label)
            if q is None:
                failed[sig] = f"{Code.NOT_CONFIGURED.value}: no query for {sig}"
                continue
            ran[sig] = q
            if down is not None:
                ans = _Answer(error=f"{down} (not queried: Prometheus unreachable earlier this tick)")
            else:
                queries += 1
                ans = self._query(q)
            if ans.error is not None:
                if down is None and ans.error.split(":", 1)[0] in _TRANSPORT_CODES:
                    down = ans.error
                self._note(sig, "*", "*", ans.error, q)
                failed[sig] = ans.error
                continue
            self._note(sig, "*", "*", None, q)
            groups: dict[tuple[str, str], list[_Series]] = {}
            for s in ans.series:
                key = self._key(s)
                if key is not None and key[0] in names:
                    groups.setdefault(key, []).append(s)
            for (model, pool), series in sorted(groups.items()):
                per_pool.setdefault((model, pool), {})[sig] = self._one(
                    sig, model, pool, series, fresh_at.get((model, pool)), now)

        self._explain_idle_latency(per_pool)
        for (model, pool), ps in per_pool.items():
            for sig, smp in ps.items():
                self._note(sig, model, pool, smp.reason if smp.value is None else None, ran.get(sig, ""))
        per_model: dict[str, dict[str, Sample]] = {}
        for n in names:
            per_model[n] = {}
            for sig in SIGNALS + EXTRA_SIGNALS:
                if sig in failed:
                    per_model[n][sig] = Sample.missing(failed[sig])
                    continue
                samples = {pool: ps[sig] for (m, pool), ps in per_pool.items() if m == n and sig in ps}
                per_model[n][sig] = self._combine(sig, n, samples, ran.get(sig, ""))
        custom, made = self._custom_samples(names, now, down)
        queries += made
        signals = {}
        for n in names:
            signals[n] = ModelSignals(n, now, samples={s: per_model[n][s] for s in SIGNALS},
                                      queries={q: custom[q] for q in self._custom.get(n, ())})
        obs = Observation(at=now, models=signals, pools={k: dict(v) for k, v in per_pool.items()}, queries=queries)
        self.last = obs
        return obs

    def pool_samples(self, signal: str) -> dict[tuple[str, str], Sample]:
        """The last tick's per-(model, pool) samples of one signal (e.g. ``gpu_power_kw``)."""
        if self.last is None:
            return {}
        return {k: v[signal] for k, v in self.last.pools.items() if signal in v}

    def power_kw(self, model: str) -> dict[str, Sample]:
        """Pool -> GPU power (kW) of one model's serving GPUs at the last tick, for on-prem energy
        cost (``controller.core.pricing``); empty before the first tick."""
        return self.last.by_pool(model, "gpu_power_kw") if self.last is not None else {}

    # ---- one answer

    def _key(self, s: _Series) -> tuple[str, str] | None:
        model = s.labels.get(self.model_label)
        if model is None:
            return None
        # a series without the pool label belongs to the unnamed pool (single-pool setups)
        return model, s.labels.get(self.pool_label, "")

    def _one(self, sig: str, model: str, pool: str, series: list[_Series], fresh: datetime | None,
             now: datetime) -> Sample:
        where = f"model={model} pool={pool or '-'}"
        if len(series) > 1:
            shown = "; ".join(_fmt_labels(s.labels) for s in series[:3])
            return Sample.missing(
                f"{Code.SEVERAL_SERIES.value}: {len(series)} series for {where} where one was expected"
                f" (group the query by {self.model_label} and {self.pool_label}): {shown}")
        s = series[0]
        at = s.at if fresh is None else min(s.at, fresh)
        try:
            value = float(s.raw)
        except ValueError:
            return Sample.missing(f"{Code.BAD_RESPONSE.value}: value {s.raw!r} for {where} is not a number", at)
        if math.isnan(value):
            return Sample.missing(f"{Code.NAN.value}: {where} evaluated to NaN", at)
        if math.isinf(value):
            return Sample.missing(f"{Code.INF.value}: {where} evaluated to {s.raw}", at)
        age_s = (now - at).total_seconds()
        if age_s > self.max_sample_age_s:
            return Sample.missing(f"{Code.STALE.value}: {where} sample is {age_s:.1f}s old (max {self.max_sample_age_s:g}s)", at)
        reason: str | None = None
        est = s.labels.get(ESTIMATE_LABEL)
        if est == "mean":
            # Only cumulative duration counters exist for this model: what we have is a mean.
            reason = (f"{Code.AVERAGE_NOT_P99.value}: {where} has only cumulative duration counters"
                      " (nv_inference_request_duration_us / nv_inference_request_success); this is a mean latency")
        elif est == "p99_first_response":
            reason = f"{Code.P99_OF_FIRST_RESPONSE.value}: {where} p99 from nv_inference_first_response_histogram_ms"
        return Sample(value, at, reason)

    def _combine(self, sig: str, model: str, samples: Mapping[str, Sample], query: str) -> Sample:
        if not samples:
            why = f"{Code.NO_DATA.value}: no series for model={model}"
            self._note(sig, model, "*", why, query)
            return Sample.missing(why)
        self._note(sig, model, "*", None, query)
        good = {p: s for p, s in samples.items() if s.value is not None}
        # an idle pool has no latency; it is not missing data about the pools that do
        idle = {p: s for p, s in samples.items() if s.value is None and reason_code(s) == Code.NO_REQUESTS.value}
        bad = {p: s for p, s in samples.items() if s.value is None and p not in idle}
        if not good and not bad:
            ats = [s.at for s in idle.values() if s.at is not None]
            return Sample.missing(f"{Code.NO_REQUESTS.value}: model={model} completed no requests in the window"
                                  f" in any pool ({sorted(idle)}); latency undefined", min(ats) if ats else None)
        if not good:
            if len(bad) == 1:
                return next(iter(bad.values()))
            ats = [s.at for s in bad.values() if s.at is not None]
            codes = sorted({reason_code(s) or Code.NO_DATA.value for s in bad.values()})
            lead = codes[0] if len(codes) == 1 else Code.NO_VALID_POOL.value
            return Sample.missing(f"{lead}: " + "; ".join(f"{p or '-'}: {s.reason}" for p, s in sorted(bad.items())),
                                  min(ats) if ats else None)
        vals = [s.value for s in good.values() if s.value is not None]
        value = signal(sig).combine.apply(vals)
        at = min(s.at for s in good.values() if s.at is not None)
        notes = sorted({s.reason for s in good.values() if s.reason})
        reason: str | None = None
        if bad:
            # Partial data: the value covers only the valid pools. For sums it is a lower bound:
            # fine to scale up on, never a reason to scale down (the core holds on Partial).
            reason = (f"{Code.PARTIAL.value}: value from pools {sorted(good)} only; "
                      + "; ".join(f"{p or '-'}: {s.reason}" for p, s in sorted(bad.items())))
        elif notes:
            reason = notes[0] if len(notes) == 1 else "; ".join(notes)
        return Sample(value, at, reason)

    def _explain_idle_latency(self, per_pool: dict[tuple[str, str], dict[str, Sample]]) -> None:
        """A NaN of a signal that is undefined while idle (a p99 over no request, see the signal
        table) while the pool's request rate is 0 means "no request completed in the window":
        still missing (the value is undefined), but say so, so that nobody reads a broken exporter
        into an idle pool or the other way round, and so that an idle pool does not make the
        model's value look partial."""
        idle_undefined = [s.name for s in queried_signals() if s.undefined_when_idle]
        for (model, pool), ps in per_pool.items():
            rate = ps.get("request_rate_per_s")
            if rate is None or rate.value != 0.0:
                continue
            for name in idle_undefined:
                smp = ps.get(name)
                if smp is None or reason_code(smp) != Code.NAN.value:
                    continue
                ps[name] = Sample.missing(
                    f"{Code.NO_REQUESTS.value}: model={model} pool={pool or '-'} completed no requests in the window"
                    f" (idle); {name} undefined", smp.at)

    # ---- HTTP

    def _keep_response(self, r: requests.Response, *args: Any, **kwargs: Any) -> None:
        """The session's response hook: keeps the last answer, which the client's exception
        describes only as a string."""
        self._response = r

    def _query(self, promql: str) -> _Answer:
        import requests
        from prometheus_api_client import PrometheusApiClientException

        self._response = None
        try:
            result = self._prom.custom_query(
                promql, params={"timeout": f"{self.timeout_s:g}s"},
                timeout=self.timeout_s)  # seconds; requests takes a float
        except requests.exceptions.JSONDecodeError as e:
            text = self._response.text if self._response is not None else ""
            return _Answer(error=f"{Code.INVALID_JSON.value}: {e}; body starts {text[:80]!r}")
        except PrometheusApiClientException as e:
            return _Answer(error=_http_error(self._response, e))
        except requests.Timeout as e:
            return _Answer(error=f"{Code.TIMEOUT.value}: no answer from {self.url} within {self.timeout_s:g}s ({type(e).__name__})")
        except requests.ConnectionError as e:
            # requests wraps urllib3's error ("Max retries exceeded ..."); its reason is the news
            text = str(getattr(e.args[0], "reason", None) or e) if e.args else str(e)
            code = Code.CONNECTION_REFUSED if "refused" in text.lower() or "111" in text else Code.CONNECTION_ERROR
            return _Answer(error=f"{code.value}: {self.url}: {text}")
        except requests.RequestException as e:
            return _Answer(error=f"{Code.CONNECTION_ERROR.value}: {self.url}: {type(e).__name__}: {e}")
        except (KeyError, TypeError):
            # a 200 whose JSON lacks data.result: say what the body was
            return _parse(self._response.json() if self._response is not None else None)
        return _parse_result(result)

    # ---- logging

    def _note(self, sig: str, model: str, pool: str, reason: str | None, query: str) -> None:
        """One structured line when a (signal, model, pool) turns bad or changes reason, one when it
        recovers; repeats of the same reason go to DEBUG so a permanently absent family does not
        flood the log every tick."""
        key = (sig, model, pool)
        code = None if reason is None else reason.split(":", 1)[0]
        before = self._logged.get(key)
        if code is None:
            if before is not None:
                del self._logged[key]
                log.info("signal_recovered signal=%s model=%s pool=%s was=%s", sig, model, pool, before,
                         extra={"event": "signal_recovered", "signal": sig, "model": model, "pool": pool, "was": before})
            return
        # an idle model is news, not a problem
        level = logging.DEBUG if before == code else logging.INFO if code == Code.NO_REQUESTS.value else logging.WARNING
        self._logged[key] = code
        log.log(level, "signal_missing signal=%s model=%s pool=%s reason=%s", sig, model, pool, reason,
                extra={"event": "signal_missing", "signal": sig, "model": model, "pool": pool,
                       "reason": reason, "code": code, "query": query})


def _default_session() -> requests.Session:
    """A session verifying https against certifi's CA bundle, or against the one named by
    ``SSL_CERT_FILE`` (else ``SSL_CERT_DIR``), OpenSSL's variables, which the source honoured
    before it used requests; requests' own ``REQUESTS_CA_BUNDLE`` applies when neither is set."""
    import requests

    session = requests.Session()
    ca = os.environ.get("SSL_CERT_FILE") or os.environ.get("SSL_CERT_DIR")
    if ca:
        session.verify = ca
    return session


def _http_error(r: requests.Response | None, e: Exception) -> str:
    """``HTTP <status>: <errorType>: <error>`` from a non-200 answer (Prometheus's JSON error
    when the body has one, else the body's start)."""
    if r is None:  # not seen by the hook: only the client's message is left
        return f"{Code.BAD_RESPONSE.value}: {str(e)[:300]}"
    detail = r.text[:300].strip()
    try:
        body = r.json()
        if isinstance(body, dict) and "error" in body:
            detail = f"{body.get('errorType', '')}: {body['error']}"[:300]
    except ValueError:
        pass
    return f"HTTP {r.status_code}: {detail}"


def _parse(body: Any) -> _Answer:
    """A whole ``/api/v1/query`` body (a 200 the client could not take ``data.result`` from)."""
    if not isinstance(body, dict):
        return _Answer(error=f"{Code.BAD_RESPONSE.value}: expected a JSON object, got {type(body).__name__}")
    if body.get("status") != "success":
        return _Answer(error=f"{Code.QUERY_ERROR.value}: status={body.get('status')!r} {body.get('errorType', '')}: {body.get('error', '')}"[:300])
    data = body.get("data")
    rt = data.get("resultType") if isinstance(data, dict) else None
    return _Answer(error=f"{Code.BAD_RESPONSE.value}: expected data.resultType 'vector' with a result list, got {rt!r}")


def _parse_result(result: Any) -> _Answer:
    """``data.result`` of an instant query, which must be a vector: a list of
    ``{"metric": {...}, "value": [ts, "raw"]}`` (a scalar's ``[ts, "raw"]`` is refused here)."""
    if not isinstance(result, list) or not all(isinstance(item, dict) for item in result):
        # a scalar or string result is one [ts, "raw"] pair, not a list of series
        return _Answer(error=f"{Code.BAD_RESPONSE.value}: expected a vector (a list of series) as data.result,"
                             f" got {str(result)[:80]}")
    out = _Answer()
    for item in result:
        try:
            labels = item["metric"]
            ts, raw = item["value"]
            at = datetime.fromtimestamp(float(ts), tz=timezone.utc)
            if not isinstance(labels, dict):
                raise TypeError("metric is not an object")
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            return _Answer(error=f"{Code.BAD_RESPONSE.value}: malformed result item {str(item)[:120]}: {e}")
        out.series.append(_Series({str(k): str(v) for k, v in labels.items()}, at, str(raw)))
    return out


def _fmt_labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def signals_missing(signals: ModelSignals, names: Iterable[str] = SIGNALS) -> dict[str, str]:
    """Signal name -> reason for every missing signal of one model (for status pages and logs)."""
    out = {}
    for n in names:
        s: Sample = getattr(signals, n)
        if s.value is None:
            out[n] = s.reason or Code.NO_DATA.value
    return out
