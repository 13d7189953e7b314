"""``tidegate simulate`` end to end on small files: table, JSON, --out with results.json and PNGs,
and clear errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.sim.cli import simulate_main
from controller.sim.scenario import SHARED_DATA
from tests.unit.simulator_fixtures import step_trace, write_azure_csv

FLEET = Path(__file__).resolve().parents[2] / "controller" / "sim" / "examples" / "fleet-llama3-70b.yaml"


@pytest.fixture()
def azure_csv(tmp_path: Path) -> Path:
    return write_azure_csv(tmp_path / "trace.csv", step_trace(300.0, 900.0, 2.0, 8.0, seed=2))


def test_simulate_table_and_out_dir(azure_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    rc = simulate_main(["--trace", str(azure_csv), "--format", "azure", "--fleet", str(FLEET),
                        "--baselines", "hpa,oracle", "--out", str(out), "--seed", "3", "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "tidegate" in text and "hpa" in text and "oracle" in text and "SLO att." in text
    doc = json.loads((out / "results.json").read_text())
    assert [r["controller"] for r in doc["runs"]] == ["tidegate", "hpa", "oracle"]
    assert doc["runs"][2]["cost_vs_oracle"] == pytest.approx(1.0)
    assert set(doc["timelines"]) == {"tidegate", "hpa", "oracle"}
    for name in ("tidegate", "hpa", "oracle"):
        png = out / f"timeline-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_json_rate_series(tmp_path: Path, capsys: pytest.CaptureFixture[str], azure_csv: Path) -> None:
    rate = tmp_path / "rate.csv"
    rate.write_text("Time (min),Requests\n" + "\n".join(f"{i},{60 * (2 + i % 5)}" for i in range(30)) + "\n")
    rc = simulate_main(["--trace", str(rate), "--format", "rate", "--token-trace", str(azure_csv), "--fleet", str(FLEET),
                        "--json", "--baselines", "skyserve", "--peak-replicas", "4", "--mode", "fluid", "--no-progress"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scenario"]["format"] == "rate"
    assert doc["scenario"]["load_factor"] > 0
    runs = {r["controller"]: r for r in doc["runs"]}
    assert set(runs) == {"tidegate", "skyserve"}
    assert runs["tidegate"]["mode"] == "fluid"
    assert 0 <= runs["tidegate"]["slo_attainment"] <= 1


def test_simulate_is_deterministic(azure_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--trace", str(azure_csv), "--fleet", str(FLEET), "--json", "--seed", "5", "--no-progress"]
    assert simulate_main(args) == 0
    a = json.loads(capsys.readouterr().out)["runs"]
    assert simulate_main(args) == 0
    b = json.loads(capsys.readouterr().out)["runs"]
    for x in (a, b):
        for r in x:
            r.pop("wall_s")
    assert a == b


@pytest.mark.parametrize("extra, needle", [
    (["--trace", "/nonexistent.csv"], "does not exist"),
    (["--baselines", "kubeflow"], "unknown baseline"),
    (["--spot", "nopool=rate:1"], "no pool"),
    (["--peak-replicas", "4", "--load-scale", "2"], "not both"),
    (["--initial-replicas", "-1"], "give 0 or more replicas"),
])
def test_simulate_bad_input_exits_2(azure_csv: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str) -> None:
    args = ["--trace", str(azure_csv), "--fleet", str(FLEET), "--no-progress"]
    # later options win for --trace
    rc = simulate_main(args + extra)
    assert rc == 2
    assert needle in capsys.readouterr().err


def test_print_capacity(azure_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_main(["--trace", str(azure_csv), "--fleet", str(FLEET), "--print-capacity"]) == 0
    out = capsys.readouterr().out
    assert "gpu_type=H100" in out and "gpu_type=H200" in out and "requests_per_s_at_slo=" in out


@pytest.mark.skipif(not SHARED_DATA.exists(), reason=f"shared data folder {SHARED_DATA} is absent (fresh clone)")
def test_simulate_shared_azure_trace_with_a_spot_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = SHARED_DATA / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    spot = SHARED_DATA / "spotserve_traces" / "trace_full" / "g4dn.csv"
    rc = simulate_main(["--trace", str(trace), "--duration-s", "600", "--fleet", str(FLEET), "--json",
                        "--spot", f"aws-spot-h100={spot}", "--no-progress"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["scenario"]["spot"]["aws-spot-h100"] == "g4dn"
    assert doc["runs"][0]["requests"] > 1000


def _prompts_trace(tmp_path: Path, long_share: float, long_tokens: int) -> Path:
    """A 10-minute trace at 2 req/s whose prompts are ordinary except ``long_share`` of them,
    ``long_tokens`` long (their prefill alone outlasts the 1.5 s TTFT target)."""
    import numpy as np
    from controller.sim.workload import RequestTrace

    rng = np.random.default_rng(4)
    t = np.sort(rng.uniform(0.0, 600.0, 1200))
    prompts = np.where(rng.random(len(t)) < long_share, long_tokens, rng.integers(200, 2000, len(t)))
    return write_azure_csv(tmp_path / "prompts.csv", RequestTrace("prompts", t, prompts, rng.integers(20, 300, len(t))))


def test_a_trace_with_prompts_beyond_the_ttft_target_is_sized_at_what_can_be_attained(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 5 % of the prompts cannot meet the TTFT target on any fleet: before, the capacity at the SLO
    # (99 % attainment) was 0 and the run refused to scale ("capacity 0 req/s"); now it is sized at
    # a point below what an idle replica attains, and says so
    trace = _prompts_trace(tmp_path, 0.05, 24000)
    rc = simulate_main(["--trace", str(trace), "--fleet", str(FLEET), "--peak-replicas", "8", "--json",
                        "--baselines", "hpa", "--no-progress"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    note = next(n for n in doc["scenario"]["notes"] if "even on an idle" in n)
    best = float(note.split("only ")[1].split(" %")[0])
    assert 90.0 < best < 99.0
    assert doc["scenario"]["load_factor"] > 0
    for run in doc["runs"]:  # nobody gets past what an idle replica attains
        assert run["slo_attainment"] <= best / 100 + 1e-9


def test_a_trace_no_request_of_which_can_meet_the_ttft_target_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _prompts_trace(tmp_path, 1.0, 30000)
    rc = simulate_main(["--trace", str(trace), "--fleet", str(FLEET), "--peak-replicas", "8", "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "0.0 % of this trace's requests meet the SLO" in err and "--ttft-ms" in err
    assert "Traceback" not in err


def test_a_peak_the_policy_cannot_reach_is_noted_and_a_zero_peak_refused(
        azure_csv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = FLEET.parent / "policy-llama3-70b.yaml"  # bounds.max_replicas 32
    rc = simulate_main(["--trace", str(azure_csv), "--fleet", str(FLEET), "--policy", str(policy),
                        "--peak-replicas", "40", "--json", "--baselines", "hpa", "--no-progress"])
    assert rc == 0
    notes = json.loads(capsys.readouterr().out)["scenario"]["notes"]
    assert any("needs 40 replicas and the policy allows at most 32" in n for n in notes)
    assert simulate_main(["--trace", str(azure_csv), "--fleet", str(FLEET), "--peak-replicas", "0", "--no-progress"]) == 2
    assert "--peak-replicas must be > 0, got 0" in capsys.readouterr().err
