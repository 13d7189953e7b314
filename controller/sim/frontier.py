"""Frontiers, not points: every controller at several settings of its main knob, and dominance.

Why: one setting per controller gives one point each, and a cheaper baseline that misses more is
neither better nor worse than tidegate. Sweeping each controller's main knob gives a cost /
attainment frontier per controller; tidegate's frontier *dominates* a baseline's when every
baseline point with at least 90 % attainment (below, no one would operate it) has a tidegate
point with at least its attainment at no more than its cost.

The knobs (:data:`KNOBS`, six settings each, from eager to lax):

``tidegate``    ``capacity_fraction`` of every rule that has one (the share of a replica's profiled
                throughput at the SLO the rules plan for; the example policy's 0.8 is its default;
                the learned capacity's pressure and calm ratios scale with it:
                ``EffectivePolicy.capacity_learning``)
``hpa``         target GPU utilization, percent
``keda``        target pending requests (waiting plus in flight) per replica
``skyserve``    target requests/s per replica, as a fraction of the capacity profile's
``seed-stack``  its on-prem HPA's GPU-utilization target and its burst KEDA's queue length, together
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from controller.core.policy import EffectivePolicy
from controller.core.spec import RuleSpec
from controller.sim.baselines import BaselineSettings, make_controller
from controller.sim.engine import Autoscaler, SimSetup

KNOBS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "tidegate": ("capacity_fraction", (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)),
    "hpa": ("target_gpu_utilization_pct", (40.0, 50.0, 60.0, 70.0, 80.0, 90.0)),
    "keda": ("target_pending_per_replica", (2.0, 3.0, 4.0, 6.0, 8.0, 12.0)),
    "skyserve": ("target_qps_per_replica_x_profile", (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)),
    "seed-stack": ("gpu_utilization_pct,queue_length", ((40.0, 2.0), (50.0, 5.0), (60.0, 10.0), (70.0, 20.0),
                                                        (70.0, 50.0), (90.0, 100.0))),
}
"""Per controller: the knob's name and its settings."""

MIN_OPERATING_ATTAINMENT = 0.90
"""Baseline points below this attainment are no operating point anyone would choose."""


def with_capacity_fraction(policy: EffectivePolicy, fraction: float) -> EffectivePolicy:
    """``policy`` with ``capacity_fraction`` set on every rule whose kind has it, rebuilt through
    the kinds' registry (so the value is validated like a policy file's)."""
    from policies.base import Registry

    reg = Registry.from_entry_points()
    specs: list[RuleSpec] = []
    rules = []
    for rule in policy.spec.rules:
        params = dict(rule.params)
        if "capacity_fraction" in reg.get(rule.kind).Params.model_fields:
            params["capacity_fraction"] = fraction
        spec = rule.model_copy(update={"params": params})
        specs.append(spec)
        rules.append(reg.build(spec.kind, spec.params, spec.name))
    pspec = policy.spec.model_copy(update={"rules": tuple(specs)})
    return replace(policy, spec=pspec, rules=tuple(rules), version=f"{policy.version}+capacity_fraction={fraction:g}")


def knob_controller(name: str, setting: Any, setup: SimSetup, policy: EffectivePolicy,
                    settings: BaselineSettings) -> Autoscaler:
    """``name`` at one setting of its knob (:data:`KNOBS`), on equal terms with every other."""
    if name == "tidegate":
        return make_controller("tidegate", setup, with_capacity_fraction(policy, float(setting)), settings)
    if name == "hpa":
        return make_controller("hpa", setup, policy, replace(settings, hpa_target_util_pct=float(setting)))
    if name == "keda":
        return make_controller("keda", setup, policy, replace(settings, keda_queue_threshold=float(setting)))
    if name == "skyserve":
        ref = next((p for p in setup.model_pools() if p.tier.is_onprem), setup.model_pools()[0])
        cap = setup.model.capacity.get(ref.gpu_type)
        qps = cap.requests_per_s if cap is not None else setup.rate_at_slo(ref.gpu_type)
        return make_controller("skyserve", setup, policy, replace(settings, skyserve_target_qps=float(setting) * qps))
    if name == "seed-stack":
        util, queue = setting
        return make_controller("seed-stack", setup, policy,
                               replace(settings, seed_target_util_pct=float(util), seed_queue_threshold=float(queue)))
    raise ValueError(f"no knob for controller {name!r} (knobs: {', '.join(KNOBS)})")


def dominates(ours: Sequence[Mapping[str, Any]], theirs: Sequence[Mapping[str, Any]],
              min_attainment: float = MIN_OPERATING_ATTAINMENT) -> bool:
    """True when every point of ``theirs`` with ``attainment >= min_attainment`` has a point of
    ``ours`` with at least its attainment at no more than its cost (points: ``attainment``, ``cost``)."""
    return all(any(o["attainment"] >= t["attainment"] and o["cost"] <= t["cost"] for o in ours)
               for t in theirs if t["attainment"] >= min_attainment)


def pareto(points: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The points no other point beats on both attainment (higher) and cost (lower), by cost."""
    pts = sorted(points, key=lambda p: (p["cost"], -p["attainment"]))
    out: list[Mapping[str, Any]] = []
    best = -1.0
    for p in pts:
        if p["attainment"] > best:
            out.append(p)
            best = p["attainment"]
    return out
