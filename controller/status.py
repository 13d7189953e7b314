"""``/v1/status``'s body: each model's signals, pools, replicas, cost and last decision.

Split out of ``controller.daemon`` (issue 11). A function of values: the models and pools, the
controller's latest per-model state, the policies and overrides in force; the daemon calls it under
its state lock. The shape is an interface (``tidegate status``, the UI): change it only additively.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Sequence

from controller.core.capacity import status as capacity_status
from controller.core.model import Decision, ModelSignals, ModelSpec, Override, PoolSpec, PoolState
from controller.core.policy import EffectivePolicy
from controller.core.pricing import pool_price
from controller.db.codec import sample_to_json


def pool_json(pool: PoolSpec, st: PoolState | None, d: Decision | None) -> dict[str, Any]:
    return {
        "tier": pool.tier.value,
        "provider": pool.provider,
        "current_replicas": st.replicas if st else None,
        "ready_replicas": st.ready_replicas if st else None,
        "scheduled_replicas": st.scheduled_replicas if st else None,
        "desired_replicas": d.placement.get(pool.name) if d else None,
        "nodes": st.nodes if st else None,
        "available": st.available if st else None,
        "unavailable_reason": st.unavailable_reason if st else None,
        "price_per_node_hour_usd": pool_price(pool, st),
    }


def model_json(model: ModelSpec, pools: Mapping[str, PoolSpec], d: Decision | None, sig: ModelSignals | None,
               decision_id: int | None, policy: EffectivePolicy | None, overrides: Sequence[Override],
               degraded: str | None) -> dict[str, Any]:
    return {
        "policy_version": policy.version if policy is not None else None,
        "signals": {s: sample_to_json(v) for s, v in sig.samples.items()} if sig else None,
        "pools": {p: pool_json(pools[p], sig.pools.get(p) if sig else None, d) for p in model.pools},
        "current_replicas": d.current_replicas if d else None,
        "desired_replicas": d.replicas if d else None,
        "cost_per_hour_usd": d.cost_per_hour_usd if d else None,
        "overrides": [o.id for o in overrides if o.model == model.name],
        "last_decision": ({"id": decision_id, "at": d.at.isoformat(), "reason": d.reason, "actuate": d.actuate}
                          if d else None),
        "degraded": degraded,
        "capacity": capacity_status(d),
    }


def status_json(*, now: datetime, paused: bool, dry_run: bool, models: Mapping[str, ModelSpec],
                pools: Mapping[str, PoolSpec], decisions: Mapping[str, Decision],
                signals: Mapping[str, ModelSignals], decision_ids: Mapping[str, int],
                policies: Mapping[str, EffectivePolicy], overrides: Sequence[Override],
                degraded: Mapping[str, str], journal: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``/v1/status``: the daemon's state, its local journal (``Daemon.journal_status``: ``None``
    when none is configured) and each model's."""
    by_model: dict[str, list[Override]] = {}
    for o in overrides:
        by_model.setdefault(o.model, []).append(o)
    return {"at": now.isoformat(), "paused": paused, "dry_run": dry_run, "journal": journal, "models": {
        name: model_json(model, pools, decisions.get(name), signals.get(name), decision_ids.get(name),
                         policies.get(name), by_model.get(name, ()), degraded.get(name))
        for name, model in models.items()}}
