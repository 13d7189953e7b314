"""Hourly rollups of the decision log: what is kept of a model's decisions once they are older than
the retention period (``RetentionConfig.full_days``).

One row per model and hour: how many decisions, the replicas (min, max, last; per pool min, max,
sum and last), the cost per hour (sum and max), each measured signal (min, max, sum, count), and
counts by reason and by outcome, and how many scale steps. Every field merges (``merge``): the
retention job compacts in small batches, and a batch that ends inside an hour adds to the row the
previous batch started. Means are sums over counts, computed on reading (``to_json``).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, Mapping

__all__ = ["hour_of", "from_decision", "merge", "to_json"]


def hour_of(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def _stat(value: float) -> dict[str, float]:
    return {"min": value, "max": value, "sum": value, "n": 1}


def _merge_stats(a: Mapping[str, Mapping[str, float]], b: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    out = {k: dict(v) for k, v in a.items()}
    for k, v in b.items():
        if k not in out:
            out[k] = dict(v)
            continue
        o = out[k]
        o.update(min=min(o["min"], v["min"]), max=max(o["max"], v["max"]), sum=o["sum"] + v["sum"], n=o["n"] + v["n"])
        if "last" in v:
            o["last"] = v["last"]
    return out


def _counts(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, n in b.items():
        out[k] = out.get(k, 0) + n
    return out


def from_decision(row: Mapping[str, Any], signals: Mapping[str, Any]) -> dict[str, Any]:
    """The rollup of one decision (``row``: the decision's columns; ``signals``: its stored
    signals document)."""
    measured = {}
    for name, sample in signals.items():
        value = sample.get("value") if isinstance(sample, Mapping) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            measured[name] = _stat(float(value))
    return {
        "model": row["model"], "hour": hour_of(row["at"]), "decisions": 1, "first_id": row["id"], "last_id": row["id"],
        "replicas_min": row["replicas"], "replicas_max": row["replicas"], "replicas_last": row["replicas"],
        "placement": {p: {**_stat(float(n)), "last": n} for p, n in row["placement"].items()},
        "cost_per_hour_sum_usd": float(row["cost_per_hour_usd"]),
        "cost_per_hour_max_usd": float(row["cost_per_hour_usd"]),
        "signals": measured, "reasons": {row["reason"]: 1}, "outcomes": {row["outcome"]: 1},
        "scale_events": int(row["scale_from_replicas"] is not None and row["scale_to_replicas"] is not None),
    }


def merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two rollups of the same model and hour as one (``b`` the later decisions)."""
    later = b["last_id"] >= a["last_id"]
    return {
        "model": a["model"], "hour": a["hour"], "decisions": a["decisions"] + b["decisions"],
        "first_id": min(a["first_id"], b["first_id"]), "last_id": max(a["last_id"], b["last_id"]),
        "replicas_min": min(a["replicas_min"], b["replicas_min"]), "replicas_max": max(a["replicas_max"], b["replicas_max"]),
        "replicas_last": b["replicas_last"] if later else a["replicas_last"],
        "placement": _merge_stats(a["placement"], b["placement"]) if later else _merge_stats(b["placement"], a["placement"]),
        "cost_per_hour_sum_usd": a["cost_per_hour_sum_usd"] + b["cost_per_hour_sum_usd"],
        "cost_per_hour_max_usd": max(a["cost_per_hour_max_usd"], b["cost_per_hour_max_usd"]),
        "signals": _merge_stats(a["signals"], b["signals"]), "reasons": _counts(a["reasons"], b["reasons"]),
        "outcomes": _counts(a["outcomes"], b["outcomes"]), "scale_events": a["scale_events"] + b["scale_events"],
    }


def to_json(r: Mapping[str, Any]) -> dict[str, Any]:
    """A rollup as the API and the CLI show it: means instead of sums, the hour as ISO-8601."""
    n = r["decisions"]

    def stats(d: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
        return {k: {"min": v["min"], "max": v["max"], "mean": v["sum"] / v["n"], "n": v["n"],
                    **({"last": v["last"]} if "last" in v else {})} for k, v in sorted(d.items())}

    mean_cost = r["cost_per_hour_sum_usd"] / n if n else 0.0
    return {
        "model": r["model"], "hour": r["hour"].isoformat(), "until": (r["hour"] + timedelta(hours=1)).isoformat(),
        "decisions": n, "first_id": r["first_id"], "last_id": r["last_id"],
        "replicas": {"min": r["replicas_min"], "max": r["replicas_max"], "last": r["replicas_last"]},
        "placement": stats(r["placement"]), "cost_per_hour_mean_usd": mean_cost,
        "cost_per_hour_max_usd": r["cost_per_hour_max_usd"], "signals": stats(r["signals"]),
        "reasons": dict(sorted(r["reasons"].items())), "outcomes": dict(sorted(r["outcomes"].items())),
        "scale_events": r["scale_events"],
    }
