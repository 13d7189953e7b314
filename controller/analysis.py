"""Checks over a decision log: did the fleet behave as promised?

Used by ``tidegate demo`` to print its summary and by the tests that hold the demo to its story:
on-prem filled before any cloud replica, spot spread over at least two pools at the peak, cloud
released before on-prem on the way down, and no decision over its bounds or budget.
Works on the row dicts ``Repository.all_decisions()`` returns (oldest first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from controller.core.model import ModelSpec, PoolSpec


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str


def check_story(
    rows: Sequence[Mapping],
    *,
    model: ModelSpec,
    pools: Mapping[str, PoolSpec],
    max_replicas: int,
    max_cost_per_hour_usd: float | None,
) -> list[Finding]:
    rows = [r for r in rows if r["model"] == model.name]
    onprem = [p for p in model.pools if pools[p].tier.is_onprem]
    spot = [p for p in model.pools if pools[p].tier.is_spot]
    cloud = [p for p in model.pools if not pools[p].tier.is_onprem]
    onprem_cap = sum(pools[p].max_replicas(model) for p in onprem)
    out: list[Finding] = []

    # 1. on-prem full before the first cloud replica is added
    first_cloud = next((r for r in rows if sum(r["placement"].get(p, 0) for p in cloud) > 0), None)
    if first_cloud is None:
        out.append(Finding("onprem-first", False, "no cloud replica was ever added (load never exceeded on-prem)"))
    else:
        held = sum(first_cloud["placement"].get(p, 0) for p in onprem)
        out.append(Finding("onprem-first", held >= onprem_cap,
                           f"decision {first_cloud['id']}: first cloud replicas added with on-prem at {held}/{onprem_cap}"))

    # 2. spot spread over >= 2 pools at the peak
    peak = max(rows, key=lambda r: (sum(r["placement"].get(p, 0) for p in spot), -r["id"]), default=None)
    if peak is None:
        out.append(Finding("spot-spread", False, "no decisions"))
    else:
        used = sorted(p for p in spot if peak["placement"].get(p, 0) > 0)
        total = sum(peak["placement"].get(p, 0) for p in spot)
        out.append(Finding("spot-spread", len(used) >= min(2, len(spot)) and total >= 2,
                           f"decision {peak['id']}: {total} spot replicas over {used}"))

    # 3. on-prem never shrinks while cloud replicas remain (cloud released first)
    bad = []
    prev: Mapping[str, int] | None = None
    released_cloud = False
    for r in rows:
        pl = r["placement"]
        if prev is not None:
            if sum(pl.get(p, 0) for p in onprem) < sum(prev.get(p, 0) for p in onprem) and \
                    sum(pl.get(p, 0) for p in cloud) > 0:
                bad.append(r["id"])
            if sum(pl.get(p, 0) for p in cloud) < sum(prev.get(p, 0) for p in cloud):
                released_cloud = True
        prev = pl
    out.append(Finding("cloud-released-first", not bad and released_cloud,
                       "cloud replicas were released as load fell, on-prem kept" if not bad and released_cloud
                       else (f"on-prem shrank while cloud held replicas at decisions {bad[:5]}" if bad
                             else "cloud replicas were never released")))

    # 4. bounds and budget
    over_max = [r["id"] for r in rows if r["replicas"] > max_replicas]
    over_budget = ([r["id"] for r in rows if r["cost_per_hour_usd"] > max_cost_per_hour_usd + 1e-9]
                   if max_cost_per_hour_usd is not None else [])
    out.append(Finding("bounds-and-budget", not over_max and not over_budget,
                       f"{len(rows)} decisions; over max_replicas: {over_max[:5]}; over budget: {over_budget[:5]}"))
    return out


def all_ok(findings: Iterable[Finding]) -> bool:
    return all(f.ok for f in findings)
