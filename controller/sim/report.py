"""Turn simulation runs into what people and machines read: a comparison table and a JSON document.

Every figure keeps its unit in its name (``_ms``, ``_usd``, ``_s``); the table shows the same
numbers rounded. ``cost_vs_oracle`` is each run's cost over the oracle's in the same comparison (the
lower bound), when the oracle ran.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

from controller.sim.engine import RunResult


def _num(x: Any) -> Any:
    """JSON-safe: NaN and infinities become null; numpy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): _num(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_num(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            x = x.item()
        except (AttributeError, ValueError):
            pass
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def with_ratios(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """Each run's summary plus ``cost_vs_oracle`` (and ``wall_s``)."""
    oracle = next((r for r in results if r.controller == "oracle"), None)
    base = oracle.summary["cost_usd"] if oracle is not None else None
    out = []
    for r in results:
        s = dict(r.summary)
        s["wall_s"] = round(r.wall_s, 3)
        s["cost_vs_oracle"] = (s["cost_usd"] / base) if base else None
        out.append(s)
    return out


def to_json(scenario: Mapping[str, Any], results: Sequence[RunResult], include_timeline: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {"scenario": dict(scenario), "runs": with_ratios(results)}
    if include_timeline:
        doc["timelines"] = {r.controller: r.timeline for r in results}
    return _num(doc)


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(_num(doc), indent=2, sort_keys=False)


def _pct(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100.0 * x:.{digits}f}%"


def _f(x: float | None, fmt: str) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, fmt)


COLUMNS = (
    ("policy", "controller", lambda v: str(v)),
    ("SLO att.", "slo_attainment", lambda v: _pct(v)),
    ("TTFT att.", "ttft_attainment", lambda v: _pct(v)),
    ("TTFT p50/p99 ms", None, None),
    ("e2e p99 ms", "e2e_p99_ms", lambda v: _f(v, ",.0f")),
    ("cost $", "cost_usd", lambda v: _f(v, ",.2f")),
    ("/oracle", "cost_vs_oracle", lambda v: _f(v, ".2f")),
    ("$/M tok", "cost_per_million_output_tokens_usd", lambda v: _f(v, ",.1f")),
    ("spot", "spot_share", lambda v: _pct(v, 0)),
    ("on-dem.", "ondemand_share", lambda v: _pct(v, 0)),
    ("actions", "scaling_actions", lambda v: str(v)),
    ("interr.", "interruptions", lambda v: str(v)),
    ("dropped", "dropped", lambda v: f"{v:,}"),
)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text comparison table (one row per run)."""
    header = [c[0] for c in COLUMNS]
    body: list[list[str]] = []
    for s in rows:
        line = []
        for title, key, fmt in COLUMNS:
            if key is None:
                line.append(f"{_f(s.get('ttft_p50_ms'), ',.0f')}/{_f(s.get('ttft_p99_ms'), ',.0f')}")
            else:
                v = s.get(key)
                line.append("-" if v is None else fmt(v))  # type: ignore[misc]
        body.append(line)
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    out.append("  ".join("-" * w for w in widths))
    for r in body:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(out)
