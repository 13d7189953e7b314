"""Schemathesis over the admin API's own ``/openapi.json``, against the real app served by uvicorn on
127.0.0.1 in front of a real daemon, on SQLite and on PostgreSQL, with an admin token, a viewer
token and no token.

Two passes per token: schemathesis' coverage phase (its CLI, ``--phases coverage``: the boundary and
just-outside values of every declared constraint, e.g. ids 2147483647 and 2147483648; deterministic),
then generated valid (positive) and invalid (negative) requests for every operation. The run must
see no 5xx and no response the document does not describe (status code, content type, headers,
body schema). The number of examples is bounded (``EXAMPLES`` per operation, mode and token); under
``CI=true`` Hypothesis is derandomized, elsewhere the run is seeded with ``SEED`` (set
``TIDEGATE_FUZZ_SEED`` / ``TIDEGATE_FUZZ_EXAMPLES`` to explore further).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.integration.daemon_harness import build_harness, serving

ADMIN = "fuzz-admin-token"
VIEWER = "fuzz-viewer-token"
MODEL = "llama3-70b-fp8"
EXAMPLES = int(os.environ.get("TIDEGATE_FUZZ_EXAMPLES", "12"))
SEED = int(os.environ.get("TIDEGATE_FUZZ_SEED", "20261123"))
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@dataclass
class Tally:
    requests: int = 0
    server_errors: int = 0
    violations: list[str] = field(default_factory=list)


@pytest.fixture
def base_url(tmp_path: Path, db_url: str) -> Iterator[str]:
    h = build_harness(tmp_path, db_url=db_url)
    h.run(120)  # decisions and audit rows exist, so ids and pages have something to find
    with serving(h, {"TIDEGATE_ADMIN_TOKENS": f"fuzz-admin:{ADMIN}", "TIDEGATE_VIEWER_TOKENS": f"fuzz-viewer:{VIEWER}"}) as url:
        yield url


def _coverage_phase(base: str, token: str | None, tally: Tally, workdir: Path) -> None:
    report = workdir / f"coverage-{token or 'none'}.ndjson"
    cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{base}/openapi.json", "--phases", "coverage",
           "--checks", ",".join(c.__name__ for c in CHECKS), "--continue-on-failure",
           "--report", "ndjson", "--report-ndjson-path", str(report)]
    if token:
        cmd += ["--header", f"Authorization: Bearer {token}"]
    run = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=120)
    for line in report.read_text().splitlines():
        finished = json.loads(line).get("ScenarioFinished")
        for interaction in (finished or {}).get("recorder", {}).get("interactions", {}).values():
            tally.requests += 1
            tally.server_errors += (interaction.get("response") or {}).get("status_code", 0) >= 500
    if run.returncode != 0:
        failures = run.stdout[run.stdout.find("FAILURES"):] if "FAILURES" in run.stdout else run.stdout + run.stderr
        tally.violations.append(f"coverage phase (exit {run.returncode}):\n{failures[-4000:]}")


def _fuzz(base: str, token: str | None, tally: Tally) -> None:
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @settings(max_examples=EXAMPLES, derandomize=IN_CI, database=None, deadline=None,
                      phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def one(case: schemathesis.Case) -> None:
                response = case.call(base_url=base, session=session, headers=headers)
                tally.requests += 1
                tally.server_errors += response.status_code >= 500
                try:
                    case.validate_response(response, checks=CHECKS, headers=headers)
                except (AssertionError, BaseExceptionGroup) as e:  # schemathesis' Failure / FailureGroup
                    for failure in getattr(e, "exceptions", [e]):
                        first = (str(failure).strip().splitlines() or [type(failure).__name__])[0]
                        tally.violations.append(f"{case.method} {case.formatted_path} -> {response.status_code}: "
                                                f"{first} [{case.as_curl_command()}]")

            try:
                (one if IN_CI else seed(SEED)(one))()
            except Unsatisfiable:
                if mode is schemathesis.GenerationMode.POSITIVE:
                    raise
                # an operation without parameters or body has nothing to make invalid


@pytest.mark.slow
def test_fuzzing_the_documented_api_finds_no_5xx_and_no_undocumented_answer(base_url: str, db_url: str,
                                                                            tmp_path: Path) -> None:
    tallies = {}
    for who, token in (("admin", ADMIN), ("viewer", VIEWER), ("none", None)):
        tallies[who] = t = Tally()
        _coverage_phase(base_url, token, t, tmp_path)
        _fuzz(base_url, token, t)
    backend = db_url.split(":", 1)[0]
    summary = ", ".join(f"{who}: {t.requests} requests, {t.server_errors} 5xx, {len(t.violations)} violations"
                        for who, t in tallies.items())
    print(f"schemathesis on {backend}: {summary}")
    problems = [v for t in tallies.values() for v in t.violations]
    assert sum(t.requests for t in tallies.values()) > 0
    assert not problems, f"{len(problems)} violations ({summary}):\n" + "\n".join(problems[:20])
