"""``bench/decision_quality.py --default-only --seeds``: the default point over several seeds, summed
up per trace so that one seed's row does not stand for the trace (on the diurnal day one seed
reads 99.9 % where three of nine read 86-89 %)."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.bench_scripts import load, run

dq = load("decision_quality")


@pytest.mark.parametrize("spec, want", [
    ("0-8", list(range(9))),
    ("0,3,5", [0, 3, 5]),
    ("0-2,7", [0, 1, 2, 7]),
    (" 4 , 1-2 ", [4, 1, 2]),
    ("1-3,2-4", [1, 2, 3, 4]),
    ("11", [11]),
])
def test_seed_lists_and_ranges(spec: str, want: list[int]) -> None:
    assert dq.parse_seeds(spec) == want


@pytest.mark.parametrize("spec, says", [
    ("3-1", "runs backwards (write 1-3)"),
    ("a", "is not a seed"),
    ("1-", "is not a seed"),
    ("-2", "is not a seed"),
    ("1,,2", "is not a seed"),
])
def test_a_bad_seed_list_says_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        dq.parse_seeds(spec)


def _run(case: str, seed: int, attainment: float, cost: float, split: str = "adversarial") -> dict[str, object]:
    return {"case": case, "split": split, "seed": seed, "attainment": attainment, "cost": cost}


def test_the_summary_names_the_worst_seed_and_the_dearest() -> None:
    rows = dq.seed_summary([
        _run("diurnal", 0, 0.999, 272.0), _run("diurnal", 1, 0.864, 337.5), _run("diurnal", 2, 0.9996, 277.0),
        _run("steady", 0, 0.86, 125.0), _run("steady", 1, 0.85, 122.0),
    ])
    assert [r["case"] for r in rows] == ["diurnal", "steady"]
    d = rows[0]
    assert d["seeds"] == [0, 1, 2]
    assert d["mean_attainment"] == pytest.approx((0.999 + 0.864 + 0.9996) / 3)
    assert (d["worst_attainment"], d["worst_seed"]) == (0.864, 1)
    assert d["mean_cost"] == pytest.approx((272.0 + 337.5 + 277.0) / 3)
    assert (d["max_cost"], d["max_cost_seed"]) == (337.5, 1)
    table = dq.seed_table(rows)
    assert "| adversarial | diurnal | 3 | 95.42 % | 86.40 % (1) | $295.50 | $337.50 (1) |" in table


def test_a_run_without_requests_counts_toward_the_cost_only() -> None:
    (row,) = dq.seed_summary([_run("idle", 0, math.nan, 10.0), _run("idle", 1, 0.5, 20.0)])
    assert (row["mean_attainment"], row["worst_attainment"], row["worst_seed"]) == (0.5, 0.5, 1)
    assert row["mean_cost"] == 15.0


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1e4)), min_size=1, max_size=12))
def test_the_summary_lies_between_the_runs(points: list[tuple[float, float]]) -> None:
    (row,) = dq.seed_summary([_run("t", i, a, c) for i, (a, c) in enumerate(points)])
    atts, costs = [a for a, _ in points], [c for _, c in points]
    assert row["worst_attainment"] == min(atts) <= row["mean_attainment"] + 1e-12
    assert row["mean_attainment"] <= max(atts) + 1e-12
    assert min(costs) - 1e-9 <= row["mean_cost"] <= row["max_cost"] == max(costs)
    assert atts[row["worst_seed"]] == row["worst_attainment"] and costs[row["max_cost_seed"]] == row["max_cost"]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return run("decision_quality", *args)


def test_seeds_run_each_seed_and_summarise_them() -> None:
    proc = _bench("--quick", "--default-only", "--jobs", "2", "--seeds", "0,1", "--cases", "flash-crowd", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["seeds"] == [0, 1]
    runs = doc["runs"]
    assert [(r["case"], r["seed"]) for r in runs] == [("flash-crowd", 0), ("flash-crowd", 1)]
    # each seed draws its own trace: the two runs differ
    assert runs[0]["cost"] != runs[1]["cost"]
    (row,) = doc["traces"]
    assert row["mean_cost"] == pytest.approx((runs[0]["cost"] + runs[1]["cost"]) / 2)
    assert row["worst_attainment"] == min(r["attainment"] for r in runs)
    # the same run as --seed 1 alone, to the cent
    one = _bench("--quick", "--default-only", "--jobs", "1", "--seed", "1", "--cases", "flash-crowd")
    assert one.returncode == 0, one.stderr
    assert f"${runs[1]['cost']:,.2f}" in one.stdout


@pytest.mark.parametrize("args, says", [
    (("--quick", "--seeds", "0-2"), "--seeds needs --default-only"),
    (("--quick", "--default-only", "--seeds", "2-0"), "runs backwards"),
])
def test_seeds_refused_with_one_line(args: tuple[str, ...], says: str) -> None:
    proc = _bench(*args)
    assert proc.returncode == 2
    assert says in proc.stderr and "Traceback" not in proc.stderr


def test_seeds_on_a_given_trace_keep_the_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from controller.sim.adversarial import ADVERSARIES, write_azure_csv

    trace = write_azure_csv(ADVERSARIES["steady"](3).trace.head(900.0), tmp_path / "steady.csv")
    proc = _bench("--trace", str(trace), "--default-only", "--jobs", "2", "--seeds", "0,1", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [(r["case"], r["split"], r["seed"]) for r in doc["runs"]] == [("steady", "given", 0), ("steady", "given", 1)]
    (row,) = doc["traces"]
    assert row["seeds"] == [0, 1] and row["case"] == "steady"
