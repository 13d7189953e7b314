"""The `tidegate` console script, run as a user runs it (a subprocess of the installed entry point)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.daemon_harness import make_harness  # noqa: F401 (fixture)

TIDEGATE = shutil.which("tidegate", path=str(Path(sys.executable).parent)) or "tidegate"

GOOD = textwrap.dedent("""\
    apiVersion: tidegate/v1
    kind: ScalingPolicy
    metadata: {name: ok}
    spec:
      model: llama3-70b-fp8
      bounds: {min_replicas: 1, max_replicas: 8}
      rules:
        - kind: slo-guard
    """)


def run(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TIDEGATE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.parametrize("name,text,needles", [
    ("unknown-key.yaml", GOOD.replace("  bounds:", "  boundz: {}\n  bounds:"), ["boundz", ":6:"]),
    ("min-gt-max.yaml", GOOD.replace("min_replicas: 1", "min_replicas: 9"), ["min_replicas (9)", "max_replicas (8)"]),
    ("unknown-kind.yaml", GOOD.replace("slo-guard", "warp-drive"), ["warp-drive", "slo-guard"]),
    ("bad-param.yaml", GOOD.replace("- kind: slo-guard", "- kind: queue-depth\n      params: {target_per_replica: -3}"),
     ["target_per_replica", "params"]),
])
def test_policy_validate_reports_each_problem(make_harness, tmp_path: Path, name: str, text: str, needles: list[str]) -> None:
    f = tmp_path / name
    f.write_text(text)
    r = run("policy", "validate", str(f))
    assert r.returncode == 1, r.stdout + r.stderr
    assert str(f) in r.stdout
    for n in needles:
        assert n in r.stdout, r.stdout


def test_policy_validate_accepts_good_files_and_examples(make_harness, tmp_path: Path) -> None:
    f = tmp_path / "good.yaml"
    f.write_text(GOOD)
    examples = sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "policies" / "examples").glob("*.yaml"))
    assert examples
    for files in ([str(f)], examples):  # validated as one set: together they would merge per model
        r = run("policy", "validate", *files)
        assert r.returncode == 0, r.stdout + r.stderr


def test_schemas_are_json() -> None:
    pol = json.loads(run("policy", "schema").stdout)
    assert "spec" in json.dumps(pol) and "slo-guard" in json.dumps(pol)
    cfg = json.loads(run("config", "schema").stdout)
    assert "pools" in cfg["properties"]


def test_db_upgrade_and_decisions_json(make_harness, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    r = run("db", "upgrade", "--url", url)
    assert r.returncode == 0, r.stderr
    h = make_harness(tmp_path, db_url=url)
    h.run(60)
    r = run("decisions", "--url", url, "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert len(rows) == 12 and rows[0]["id"] < rows[-1]["id"]
    table = run("decisions", "--url", url, "--limit", "3")
    assert table.returncode == 0 and len(table.stdout.strip().splitlines()) == 4


@pytest.mark.slow
def test_demo_command_tells_the_story(make_harness, tmp_path: Path) -> None:
    """The README's demo, shortened: 30 wall seconds at 240x = two simulated hours."""
    r = run("demo", "--duration-s", "30", "--speedup", "240", "--port", "0", "--workdir", str(tmp_path / "demo"),
            "--quiet", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    for check in ("onprem-first", "spot-spread", "cloud-released-first", "bounds-and-budget"):
        assert f"[ok] {check}" in r.stdout, r.stdout
    rows = json.loads(run("decisions", "--url", f"sqlite:///{tmp_path / 'demo' / 'demo.db'}", "--json").stdout)
    assert len(rows) > 100
