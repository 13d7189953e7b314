"""Operator overrides: resolution and precedence, and their effect through the whole pipeline."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.core.model import Override, OverrideKind
from controller.core.overrides import NO_OVERRIDES, replica_cap, resolve
from controller.core.reasons import Reason
from tests.unit.test_pipeline import MODEL, NOW, POOLS, fixed, policy, run, stage

PIN, BOUNDS, FREEZE, DRAIN = OverrideKind.PIN, OverrideKind.BOUNDS, OverrideKind.FREEZE, OverrideKind.DRAIN_POOL


def ov(id_: int, kind: OverrideKind, *, created_s_ago: float | None = 100, expires_in_s: float | None = 3600,
       model: str = "m", **kw) -> Override:
    return Override(
        id=id_, kind=kind, model=model,
        created_at=None if created_s_ago is None else NOW - timedelta(seconds=created_s_ago),
        expires_at=None if expires_in_s is None else NOW + timedelta(seconds=expires_in_s),
        author="alice", reason="test", **kw,
    )


# -- resolution -----------------------------------------------------------------------------------

def test_expired_and_foreign_overrides_have_no_effect() -> None:
    expired = ov(1, PIN, replicas=7, expires_in_s=-1)
    just_expired = ov(2, FREEZE, expires_in_s=0)
    other_model = ov(3, FREEZE, model="other")
    assert resolve([expired, just_expired, other_model], model=MODEL, now=NOW) is NO_OVERRIDES
    assert resolve([], model=MODEL, now=NOW) is NO_OVERRIDES
    no_expiry = ov(4, PIN, replicas=7, expires_in_s=None)
    assert resolve([no_expiry], model=MODEL, now=NOW).pin_total is no_expiry


def test_latest_created_pin_wins() -> None:
    old, new = ov(1, PIN, replicas=3, created_s_ago=500), ov(2, PIN, replicas=9, created_s_ago=10)
    for order in ([old, new], [new, old]):
        assert resolve(order, model=MODEL, now=NOW).pin_total is new
    # per pool, too; and pools pin independently of the total
    a1 = ov(3, PIN, pool="od", replicas=1, created_s_ago=50)
    a2 = ov(4, PIN, pool="od", replicas=2, created_s_ago=5)
    eff = resolve([a2, a1, old], model=MODEL, now=NOW)
    assert eff.pin_pools == {"od": a2} and eff.pin_total is old


@pytest.mark.parametrize(
    ("lo", "hi", "expected"),
    [
        (0, None, (0, 20)),  # widen the min
        (5, 8, (5, 8)),  # narrow both
        (None, 50, (1, 20)),  # never above the policy's hard max
        (30, None, (20, 20)),  # min capped by max
    ],
)
def test_bounds_for(lo, hi, expected) -> None:
    eff = resolve([ov(1, BOUNDS, min_replicas=lo, max_replicas=hi)], model=MODEL, now=NOW)
    assert eff.bounds_for(1, 20) == expected


def test_ignored_overrides_say_why() -> None:
    eff = resolve([ov(1, PIN, pool="nowhere", replicas=2), ov(2, PIN), ov(3, DRAIN)], model=MODEL, now=NOW)
    whys = [why for _, why in eff.ignored]
    assert len(whys) == 3 and "no pool nowhere" in whys[0]
    assert eff.pin_total is None and not eff.drained
    assert "ignored #1" in eff.describe()


def test_pool_constraints_precedence() -> None:
    current = {"onprem": 4, "spot-a": 2, "od": 1}
    eff = resolve([ov(1, FREEZE, pool="spot-a"), ov(2, DRAIN, pool="spot-a"), ov(3, DRAIN, pool="od"),
                   ov(4, PIN, pool="od", replicas=3), ov(5, PIN, pool="spot-b", replicas=30)],
                  model=MODEL, now=NOW)
    fixed_, drained = eff.pool_constraints(current, 20)
    # freeze beats drain (spot-a stays at 2), drain beats pin (od), pins capped at the max total
    assert drained == frozenset({"od"})
    assert fixed_ == {"spot-a": 2, "spot-b": 18}


# -- through the pipeline -------------------------------------------------------------------------

def test_freeze_decides_but_keeps_placement_and_does_not_act() -> None:
    d = run(policy(fixed(9)), {"onprem": 2}, overrides=(ov(1, FREEZE),))
    assert not d.actuate and d.reason == Reason.OVERRIDE_FREEZE.value
    assert d.placement == d.previous_placement and d.replicas == 2
    assert "would place 9" in stage(d, "outcome").message
    assert d.history.scale_events == ()


def test_freeze_wins_over_pin() -> None:
    d = run(policy(fixed(3)), {"onprem": 3}, overrides=(ov(1, PIN, replicas=10, created_s_ago=1), ov(2, FREEZE)))
    assert d.replicas == 3 and not d.actuate and d.reason == Reason.OVERRIDE_FREEZE.value


def test_expired_freeze_has_no_effect() -> None:
    d = run(policy(fixed(9)), {"onprem": 2}, overrides=(ov(1, FREEZE, expires_in_s=-60),))
    assert d.actuate and d.replicas == 9
    assert stage(d, "overrides").message == "no active overrides"


def test_pin_total_beats_policy_and_bounds_but_not_max() -> None:
    pol = policy(fixed(3), bounds={"min_replicas": 2, "max_replicas": 10})
    d = run(pol, {"onprem": 3}, overrides=(ov(1, PIN, replicas=7), ov(2, BOUNDS, max_replicas=5)))
    assert d.replicas == 7 and d.reason == Reason.OVERRIDE_PIN.value
    d = run(pol, {"onprem": 3}, overrides=(ov(1, PIN, replicas=70),))
    assert d.replicas == 10
    # a pin below min_replicas is the operator's call
    d = run(pol, {"onprem": 3}, overrides=(ov(1, PIN, replicas=1),))
    assert d.replicas == 1


def test_pin_is_still_within_budget() -> None:
    pol = policy(fixed(3), budget={"max_cost_per_hour_usd": 10.0})
    d = run(pol, {"onprem": 3}, overrides=(ov(1, PIN, replicas=12),))
    assert d.cost_per_hour_usd <= 10.0 and d.replicas < 12
    assert d.reason == Reason.BUDGET_CAP_REACHED.value


def test_pin_per_pool() -> None:
    d = run(policy(fixed(5)), {"onprem": 4, "spot-a": 1}, overrides=(ov(1, PIN, pool="od", replicas=2),))
    # the pinned pool is exact; the rest of the total goes where placement prefers (on-prem)
    assert d.placement == {"onprem": 3, "spot-a": 0, "spot-b": 0, "od": 2}
    assert d.replicas == 5
    # pool pins raise the total when they need more than the policy asks for
    d = run(policy(fixed(2)), {"onprem": 2}, overrides=(ov(1, PIN, pool="spot-a", replicas=5),))
    assert d.placement["spot-a"] == 5 and d.replicas == 5 and d.reason == Reason.OVERRIDE_PIN.value


def test_bounds_override_widens_and_narrows() -> None:
    pol = policy(fixed(0), bounds={"min_replicas": 3, "max_replicas": 10})
    assert run(pol, {"onprem": 3}).replicas == 3
    d = run(pol, {"onprem": 3}, overrides=(ov(1, BOUNDS, min_replicas=1),))
    assert d.replicas == 1 and d.reason == Reason.OVERRIDE_BOUNDS.value
    big = policy(fixed(9), bounds={"min_replicas": 3, "max_replicas": 10})
    d = run(big, {"onprem": 3}, overrides=(ov(1, BOUNDS, max_replicas=6),))
    assert d.replicas == 6 and d.reason == Reason.OVERRIDE_BOUNDS.value
    # never above the policy's hard max
    d = run(big, {"onprem": 3}, overrides=(ov(1, BOUNDS, min_replicas=15, max_replicas=40),))
    assert d.replicas == 10


def test_drain_moves_replicas_elsewhere() -> None:
    d = run(policy(fixed(6)), {"onprem": 4, "spot-a": 2}, overrides=(ov(1, DRAIN, pool="spot-a"),))
    assert d.placement["spot-a"] == 0 and d.replicas == 6
    assert d.placement == {"onprem": 4, "spot-a": 0, "spot-b": 2, "od": 0}
    assert d.reason == Reason.OVERRIDE_DRAIN.value and d.actuate
    expired = run(policy(fixed(6)), {"onprem": 4, "spot-a": 2},
                  overrides=(ov(1, DRAIN, pool="spot-a", expires_in_s=-1),))
    assert expired == run(policy(fixed(6)), {"onprem": 4, "spot-a": 2})
    assert expired.placement["spot-a"] > 0


def test_pool_freeze_keeps_that_pool_only() -> None:
    d = run(policy(fixed(2)), {"onprem": 4, "spot-a": 3}, overrides=(ov(1, FREEZE, pool="spot-a"),))
    # the frozen pool keeps its 3 even though the policy wants 2 in total; the others follow
    assert d.actuate and d.reason == Reason.OVERRIDE_FREEZE.value
    assert d.placement == {"onprem": 0, "spot-a": 3, "spot-b": 0, "od": 0}


# -- how many replicas an override may ask for ------------------------------------------------------

@pytest.mark.parametrize("policy_max,pool,cap,names", [
    (10, None, 10, "the policy's max_replicas (10)"),    # the pools hold more than the policy allows
    (100, None, None, "what the model's pools hold together"),
    (10, "onprem", None, "what pool onprem holds"),     # one pool holds less than the policy allows
    (2, "onprem", 2, "the policy's max_replicas (2)"),  # a pool's pin obeys the policy's hard max
    (None, "od", None, "what pool od holds"),
    (None, None, None, "what the model's pools hold together"),
])
def test_replica_cap_is_one_rule_for_a_pool_and_the_total(policy_max: int | None, pool: str | None,
                                                          cap: int | None, names: str) -> None:
    held = {p: POOLS[p].max_replicas(MODEL) for p in MODEL.pools}
    expected = cap if cap is not None else (held[pool] if pool else sum(held.values()))
    got, why = replica_cap(MODEL, POOLS, policy_max_replicas=policy_max, pool=pool)
    assert got == expected and names in why, (got, why, held)
    assert got <= min(v for v in (policy_max, held[pool] if pool else sum(held.values())) if v is not None)


def test_replica_cap_without_policy_or_known_pools_is_none() -> None:
    assert replica_cap(MODEL, {}, policy_max_replicas=None, pool=None) == (None, "")
