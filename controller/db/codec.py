"""JSON encoding of the decision core's values, for the decision log and the admin API.

The core's values (``controller.core.model``) are frozen dataclasses holding enums, datetimes,
mappings and floats that may be missing (``None``) or not finite (a ``NaN`` that Prometheus
returned). This module turns them into plain JSON-ready structures and back, so that the decision
log stores one well-defined shape and every reader (the repository, the API, ``tidegate decisions
--json``, analyses) decodes it the same way.

Conventions (the wire format, stable across versions):

- datetimes are ISO-8601 strings in UTC with an explicit offset (``2024-05-01T12:00:00+00:00``);
  naive datetimes are refused, because a time without a zone cannot be placed on the log's axis;
- enums are stored by value (``"aws-spot"``, ``"target"``);
- a missing value stays ``null``: missing is never written as zero;
- non-finite floats (``NaN``, ``Infinity``) are written as the strings ``"NaN"``, ``"Infinity"``,
  ``"-Infinity"`` where the schema says a float (``Sample.value``), because neither standard JSON
  nor PostgreSQL ``jsonb`` accepts them;
- free-form mappings (a rule's ``state``, an action's ``arguments``) are encoded by
  :func:`to_jsonable`, which tags the two things JSON cannot carry (datetimes, non-finite floats)
  as ``{"$datetime": ...}`` / ``{"$float": ...}`` so that :func:`from_jsonable` restores them
  exactly. Tuples come back as lists.
"""

from __future__ import annotations

import enum
import functools
import json
import math
from datetime import datetime, timezone
from typing import Any, Mapping

import orjson

from controller.core.model import (
    Action,
    ActionStatus,
    Decision,
    History,
    ModelSignals,
    Opinion,
    Override,
    OverrideKind,
    PoolState,
    Recommendation,
    Sample,
    ScaleEvent,
    Stage,
)
from controller.core.signals import model_signal_names

__all__ = [
    "encode_datetime",
    "decode_datetime",
    "encode_float",
    "decode_float",
    "to_jsonable",
    "from_jsonable",
    "sample_to_json",
    "sample_from_json",
    "pool_state_to_json",
    "pool_state_from_json",
    "signals_to_json",
    "signals_from_json",
    "recommendation_to_json",
    "recommendation_from_json",
    "stage_to_json",
    "stage_from_json",
    "action_to_json",
    "action_from_json",
    "override_to_json",
    "override_from_json",
    "scale_event_to_json",
    "scale_event_from_json",
    "history_to_json",
    "history_from_json",
    "decision_to_json",
    "decision_from_json",
]

_DATETIME_TAG = "$datetime"
_FLOAT_TAG = "$float"


# --- scalars -------------------------------------------------------------------------------


def dump_json(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON (UTF-8, no spaces) of JSON-ready ``value`` by orjson, ~8x faster than the
    standard encoder on a decision's payload (the largest part of recording a tick). ``value``
    must be JSON-ready: a non-finite float must be encoded first (:func:`encode_float`,
    :func:`to_jsonable`; every ``*_to_json`` here does), since orjson writes NaN and infinities as
    ``null``. A value orjson refuses (an integer beyond 64 bits) goes through ``json.dumps``."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS | (orjson.OPT_SORT_KEYS if sort_keys else 0))
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys, ensure_ascii=False).encode()


_utc_iso = functools.lru_cache(maxsize=8192)(datetime.isoformat)
"""``isoformat`` of UTC datetimes, remembered: a tick writes the same few instants thousands of
times (every sample and pool state of every model carries one), and a lookup costs ~1/15 of
formatting again. Only UTC values enter it, so equal instants are equal strings."""


def encode_datetime(value: datetime) -> str:
    """ISO-8601 in UTC. Raises ``ValueError`` on a naive datetime (no zone: a bug upstream)."""
    if value.tzinfo is timezone.utc:  # the usual case: already UTC (same string, no conversion)
        return _utc_iso(value)
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value.isoformat()} has no timezone; pass aware UTC times")
    return value.astimezone(timezone.utc).isoformat()


def decode_datetime(value: str) -> datetime:
    """Parse an ISO-8601 string into an aware UTC datetime (a string without offset reads as UTC,
    the convention of this log)."""
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def _opt_datetime(value: datetime | None) -> str | None:
    return None if value is None else encode_datetime(value)


def _opt_decode_datetime(value: str | None) -> datetime | None:
    return None if value is None else decode_datetime(value)


def encode_float(value: float | None) -> float | str | None:
    """A float as JSON: finite floats as numbers, NaN/Inf as strings, ``None`` stays ``None``."""
    if value is None:
        return None
    value = float(value)
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def decode_float(value: float | int | str | None) -> float | None:
    if value is None:
        return None
    return float(value)  # float("NaN"), float("Infinity") and float("-Infinity") all parse


def to_jsonable(value: Any) -> Any:
    """Encode a free-form value (rule state, action arguments) into JSON-ready data, tagging
    datetimes and non-finite floats so :func:`from_jsonable` restores them."""
    kind = type(value)  # exact types first: the common ones, without the ABC checks below
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float and math.isfinite(value):
        return value
    if kind is dict:
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        encoded = encode_float(value)
        return encoded if isinstance(encoded, float) else {_FLOAT_TAG: encoded}
    if isinstance(value, datetime):
        return {_DATETIME_TAG: encode_datetime(value)}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    raise TypeError(f"cannot encode {type(value).__name__} as JSON: {value!r}")


def from_jsonable(value: Any) -> Any:
    """Inverse of :func:`to_jsonable` (tuples and sets come back as lists)."""
    if isinstance(value, dict):
        if len(value) == 1:
            if _DATETIME_TAG in value:
                return decode_datetime(value[_DATETIME_TAG])
            if _FLOAT_TAG in value:
                return float(value[_FLOAT_TAG])
        return {k: from_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    return value


# --- signals -------------------------------------------------------------------------------


def sample_to_json(sample: Sample) -> dict[str, Any]:
    return {"value": encode_float(sample.value), "at": _opt_datetime(sample.at), "reason": sample.reason}


def sample_from_json(data: Mapping[str, Any]) -> Sample:
    return Sample(
        value=decode_float(data.get("value")),
        at=_opt_decode_datetime(data.get("at")),
        reason=data.get("reason"),
    )


def pool_state_to_json(state: PoolState) -> dict[str, Any]:
    return {
        "pool": state.pool,
        "replicas": state.replicas,
        "ready_replicas": state.ready_replicas,
        "nodes": state.nodes,
        "available": state.available,
        "unavailable_reason": state.unavailable_reason,
        "interrupted_replicas": state.interrupted_replicas,
        "recent_interruptions": state.recent_interruptions,
        "price_per_node_hour_usd": encode_float(state.price_per_node_hour_usd),
        "at": _opt_datetime(state.at),
        "max_nodes": state.max_nodes,
        "scheduled_replicas": state.scheduled_replicas,
    }


def pool_state_from_json(data: Mapping[str, Any]) -> PoolState:
    return PoolState(
        pool=data["pool"],
        replicas=data.get("replicas"),
        ready_replicas=data.get("ready_replicas"),
        nodes=data.get("nodes"),
        available=bool(data.get("available", True)),
        unavailable_reason=data.get("unavailable_reason"),
        interrupted_replicas=int(data.get("interrupted_replicas", 0)),
        recent_interruptions=int(data.get("recent_interruptions", 0)),
        price_per_node_hour_usd=decode_float(data.get("price_per_node_hour_usd")),
        at=_opt_decode_datetime(data.get("at")),
        max_nodes=data.get("max_nodes"),
        scheduled_replicas=data.get("scheduled_replicas"),
    )


def signals_to_json(signals: ModelSignals) -> dict[str, Any]:
    out: dict[str, Any] = {"model": signals.model, "at": encode_datetime(signals.at)}
    for name, sample in signals.samples.items():
        out[name] = sample_to_json(sample)
    out["pools"] = {name: pool_state_to_json(st) for name, st in signals.pools.items()}
    out["degraded"] = signals.degraded
    if signals.queries:
        out["queries"] = {q: sample_to_json(s) for q, s in signals.queries.items()}
    return out


def signals_from_json(data: Mapping[str, Any]) -> ModelSignals:
    # A sample absent from the stored row (an older writer, or a signal added to the table since)
    # reads as missing, never as zero; a stored signal the table no longer has is left out.
    samples = {
        name: sample_from_json(data[name]) if data.get(name) is not None else Sample.missing("NoData")
        for name in model_signal_names()
    }
    return ModelSignals(
        model=data["model"],
        at=decode_datetime(data["at"]),
        pools={name: pool_state_from_json(st) for name, st in (data.get("pools") or {}).items()},
        degraded=data.get("degraded"),
        samples=samples,
        queries={q: sample_from_json(s) for q, s in (data.get("queries") or {}).items()},
    )


# --- pipeline ------------------------------------------------------------------------------


def recommendation_to_json(rec: Recommendation) -> dict[str, Any]:
    return {
        "rule": rec.rule,
        "kind": rec.kind,
        "replicas": rec.replicas,
        "reason": rec.reason,
        "message": rec.message,
        "opinion": rec.opinion.value,
        "missing_data": rec.missing_data,
        "state": to_jsonable(rec.state),
        "present_replicas": rec.present_replicas,
        "trend_replicas": rec.trend_replicas,
    }


def recommendation_from_json(data: Mapping[str, Any]) -> Recommendation:
    return Recommendation(
        rule=data["rule"],
        kind=data["kind"],
        replicas=data.get("replicas"),
        reason=data["reason"],
        message=data.get("message", ""),
        opinion=Opinion(data.get("opinion", Opinion.TARGET.value)),
        missing_data=bool(data.get("missing_data", False)),
        state=from_jsonable(data.get("state") or {}),
        present_replicas=data.get("present_replicas"),
        trend_replicas=data.get("trend_replicas"),
    )


def stage_to_json(stage: Stage) -> dict[str, Any]:
    return {"name": stage.name, "replicas": stage.replicas, "reason": stage.reason, "message": stage.message}


def stage_from_json(data: Mapping[str, Any]) -> Stage:
    return Stage(name=data["name"], replicas=data.get("replicas"), reason=data["reason"], message=data.get("message", ""))


def scale_event_to_json(event: ScaleEvent) -> dict[str, Any]:
    return {"at": encode_datetime(event.at), "from_replicas": event.from_replicas, "to_replicas": event.to_replicas}


def scale_event_from_json(data: Mapping[str, Any]) -> ScaleEvent:
    return ScaleEvent(
        at=decode_datetime(data["at"]),
        from_replicas=int(data["from_replicas"]),
        to_replicas=int(data["to_replicas"]),
    )


def history_to_json(history: History) -> dict[str, Any]:
    return {
        "recommendations": [[encode_datetime(at), n] for at, n in history.recommendations],
        "scale_events": [scale_event_to_json(e) for e in history.scale_events],
        "rule_state": to_jsonable(history.rule_state),
    }


def history_from_json(data: Mapping[str, Any]) -> History:
    return History(
        recommendations=tuple((decode_datetime(at), int(n)) for at, n in data.get("recommendations", ())),
        scale_events=tuple(scale_event_from_json(e) for e in data.get("scale_events", ())),
        rule_state=from_jsonable(data.get("rule_state") or {}),
    )


def action_to_json(action: Action) -> dict[str, Any]:
    return {
        "provider": action.provider,
        "call": action.call,
        "pool": action.pool,
        "model": action.model,
        "arguments": to_jsonable(action.arguments),
        "status": action.status.value,
        "error": action.error,
        "latency_ms": encode_float(action.latency_ms),
    }


def action_from_json(data: Mapping[str, Any]) -> Action:
    latency_ms = decode_float(data.get("latency_ms"))
    return Action(
        provider=data["provider"],
        call=data["call"],
        pool=data["pool"],
        model=data["model"],
        arguments=from_jsonable(data.get("arguments") or {}),
        status=ActionStatus(data["status"]),
        error=data.get("error"),
        latency_ms=0.0 if latency_ms is None else latency_ms,
    )


def override_to_json(override: Override) -> dict[str, Any]:
    return {
        "id": override.id,
        "kind": override.kind.value,
        "model": override.model,
        "pool": override.pool,
        "replicas": override.replicas,
        "min_replicas": override.min_replicas,
        "max_replicas": override.max_replicas,
        "expires_at": _opt_datetime(override.expires_at),
        "reason": override.reason,
        "author": override.author,
        "created_at": _opt_datetime(override.created_at),
    }


def override_from_json(data: Mapping[str, Any]) -> Override:
    return Override(
        id=int(data["id"]),
        kind=OverrideKind(data["kind"]),
        model=data["model"],
        pool=data.get("pool"),
        replicas=data.get("replicas"),
        min_replicas=data.get("min_replicas"),
        max_replicas=data.get("max_replicas"),
        expires_at=_opt_decode_datetime(data.get("expires_at")),
        reason=data.get("reason", ""),
        author=data.get("author", ""),
        created_at=_opt_decode_datetime(data.get("created_at")),
    )


def decision_to_json(decision: Decision) -> dict[str, Any]:
    """The whole decision, history included (the log stores the history only as per-tick deltas;
    see ``controller.db.repo``)."""
    return {
        "model": decision.model,
        "at": encode_datetime(decision.at),
        "current_replicas": decision.current_replicas,
        "replicas": decision.replicas,
        "placement": {k: int(v) for k, v in decision.placement.items()},
        "previous_placement": {k: int(v) for k, v in decision.previous_placement.items()},
        "recommendations": [recommendation_to_json(r) for r in decision.recommendations],
        "trace": [stage_to_json(s) for s in decision.trace],
        "reason": decision.reason,
        "actuate": decision.actuate,
        "cost_per_hour_usd": encode_float(decision.cost_per_hour_usd),
        "policy_version": decision.policy_version,
        "history": history_to_json(decision.history),
        "interrupted_replaced": decision.interrupted_replaced,
    }


def decision_from_json(data: Mapping[str, Any]) -> Decision:
    cost = decode_float(data.get("cost_per_hour_usd"))
    return Decision(
        model=data["model"],
        at=decode_datetime(data["at"]),
        current_replicas=int(data["current_replicas"]),
        replicas=int(data["replicas"]),
        placement={k: int(v) for k, v in (data.get("placement") or {}).items()},
        previous_placement={k: int(v) for k, v in (data.get("previous_placement") or {}).items()},
        recommendations=tuple(recommendation_from_json(r) for r in data.get("recommendations", ())),
        trace=tuple(stage_from_json(s) for s in data.get("trace", ())),
        reason=data["reason"],
        actuate=bool(data["actuate"]),
        cost_per_hour_usd=0.0 if cost is None else cost,
        policy_version=data.get("policy_version", ""),
        history=history_from_json(data.get("history") or {}),
        interrupted_replaced=int(data.get("interrupted_replaced", 0)),
    )
