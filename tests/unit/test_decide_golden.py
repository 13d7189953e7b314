"""``decide`` gives the same decisions, with the same trace, as the code that wrote the golden file.

``golden/decide.jsonl.gz`` holds, for 200 seeded scenarios of ``decide_scenarios`` (every built-in
policy kind and a scripted one that raises or returns nonsense, overrides, budgets, spot pools with
interruption notices and live prices, missing, stale, NaN, partial and degraded signals, paused
ticks, pools not observed yet), four chained decisions each: totals, placements, reason codes,
costs, and every stage's name, value, reason code and message. It was written by the pipeline as
it was before ``decide`` and ``place`` were split into stage functions; a refactoring must leave it
unchanged. An intended change of behaviour rewrites it with
``python -m tests.unit.decide_scenarios --write`` and says so in the commit.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter

from controller.core.pipeline import STAGES, decide
from tests.unit.decide_scenarios import GOLDEN, SEEDS, golden_lines


def _first_difference(seed: int, want: list, got: list) -> str:
    for tick, (w, g) in enumerate(zip(want, got)):
        if w != g:
            fields = [i for i, (a, b) in enumerate(zip(w, g)) if a != b]
            return f"seed {seed}, tick {tick}, record fields {fields}:\n want {w}\n got  {g}"
    return f"seed {seed}: {len(want)} decisions wanted, {len(got)} made"


def test_decide_reproduces_the_golden_decisions_and_traces() -> None:
    want = gzip.decompress(GOLDEN.read_bytes()).decode().splitlines()
    got = golden_lines(decide)
    assert len(want) == len(got) == len(SEEDS)
    for seed, (w, g) in zip(SEEDS, zip(want, got)):
        assert w == g, _first_difference(seed, json.loads(w), json.loads(g))


def test_the_golden_scenarios_reach_every_stage_and_the_main_reasons() -> None:
    """The scenario set is only a proof if it exercises what the stages can say."""
    stage_reasons: Counter[tuple[str, str]] = Counter()
    for line in gzip.decompress(GOLDEN.read_bytes()).decode().splitlines():
        for decision in json.loads(line):
            for name, _, reason, _ in decision[8]:
                stage_reasons[(name, reason)] += 1
    stages = {name for name, _ in stage_reasons}
    assert stages == set(STAGES) | {"observe"}
    expected = {
        ("combine", "MaxOfRecommendations"), ("tolerance", "WithinTolerance"),
        ("missing-data", "HoldOnMissingData"), ("stabilize", "ScaleDownStabilized"),
        ("stabilize", "ScaleUpStabilized"), ("rate-limit", "ScaleUpLimited"), ("rate-limit", "ScaleDownLimited"),
        ("rate-limit", "ScaleDownCooldown"), ("bounds", "TooFewReplicas"), ("bounds", "TooManyReplicas"),
        ("bounds", "ScheduleFloor"), ("bounds", "OverrideBounds"), ("overrides", "OverridePin"),
        ("overrides", "OverrideFreeze"), ("placement", "CapacityExhausted"), ("placement", "SpotInterrupted"),
        ("placement", "SpotPoolUnavailable"), ("placement", "PoolUnavailable"), ("placement", "OverrideDrain"),
        ("placement", "OnDemandFallback"), ("budget", "BudgetCapReached"), ("budget", "CostPerTokenCapReached"),
        ("outcome", "Scaled"), ("outcome", "Unchanged"), ("outcome", "Paused"), ("outcome", "OverrideFreeze"),
        ("observe", "NotObservedYet"),
    }
    assert expected <= set(stage_reasons), sorted(expected - set(stage_reasons))
