"""The live commands (``tidegate status | why | override | pause | resume | policies``) against a
real daemon behind its admin API on a real uvicorn server (simulated fleet, SQLite, manual clock):
what they print, their JSON, their exit statuses, and that the token is never shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from controller.cli import main
from tests.integration.daemon_harness import Harness, build_harness, serving

ADMIN = "adm-7f3c-secret"
VIEWER = "view-91ab-secret"
MODEL = "llama3-70b-fp8"


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Harness, str]]:
    for var in ("TIDEGATE_URL", "TIDEGATE_TOKEN", "TIDEGATE_CLIENT_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # no client file of the user's
    h = build_harness(tmp_path)
    try:
        with serving(h, {"TIDEGATE_ADMIN_TOKENS": f"alice:{ADMIN}", "TIDEGATE_VIEWER_TOKENS": f"victor:{VIEWER}"}) as url:
            h.run(600)
            yield h, url
    finally:
        h.close()


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_status_shows_pools_signals_cost_and_conditions(daemon, capsys) -> None:
    h, url = daemon
    code, out, _ = cli(capsys, "status", "--server", url, "--token", VIEWER, "--json")
    assert code == 0
    view = json.loads(out)
    m = view["models"][MODEL]
    last = h.daemon.controller.last_decisions[MODEL]
    assert {p: v["desired_replicas"] for p, v in m["pools"].items()} == dict(last.placement)
    assert m["cost_per_hour_usd"] == pytest.approx(last.cost_per_hour_usd)
    sig = h.daemon.controller.last_signals[MODEL]
    assert m["usd_per_million_tokens"] == pytest.approx(sig.cost_per_million_tokens_usd.value)
    ages = {s: v["age_s"] for s, v in m["signals"].items() if v["at"] is not None}
    assert ages and all(a >= 0 for a in ages.values())
    kinds = {c["type"]: c for c in m["conditions"]}
    assert kinds["Ready"]["status"] == "True" and kinds["Paused"]["status"] == "False" and kinds["Shadow"]["status"] == "False"
    assert kinds["LastDecision"]["message"].startswith(f"#{h.daemon.controller.last_decision_ids[MODEL]} ")
    code, table, _ = cli(capsys, "status", "--server", url, "--token", VIEWER)
    assert code == 0
    for pool, replicas in last.placement.items():
        assert pool in table
    assert "queue_depth" in table and "LastDecision" in table and f"${last.cost_per_hour_usd:.2f}/h" in table


def test_why_explains_the_stages_and_each_pool(daemon, capsys) -> None:
    h, url = daemon
    # more than on-prem holds: spot pools take the rest, the cheaper first
    assert cli(capsys, "override", "pin", MODEL, "12", "--reason", "burst", "--server", url, "--token", ADMIN)[0] == 0
    h.run(30)
    code, out, _ = cli(capsys, "why", "--model", MODEL, "--server", url, "--token", VIEWER, "--json")
    assert code == 0
    d = json.loads(out)
    assert d["id"] == h.daemon.controller.last_decision_ids[MODEL]
    assert [s["name"] for s in d["trace"]][-4:] == ["lead-time", "placement", "budget", "outcome"]
    # the demo fleet's spot pools are priced apart: placement names the order and the prices
    assert any(w.startswith("aws-spot-p5 before gcp-spot-a3: $") and w.endswith(" per replica-hour")
               for w in d["pool_reasons"]), d["pool_reasons"]
    assert "onprem-h100 full: 8 of 8" in d["pool_reasons"]
    code, table, _ = cli(capsys, "why", str(d["id"]), "--server", url, "--token", VIEWER)
    assert code == 0 and f"decision #{d['id']}" in table and "per replica-hour" in table and "rate-limit" in table


def test_override_pin_list_delete_with_ttl(daemon, capsys) -> None:
    h, url = daemon
    auth = ("--server", url, "--token", ADMIN)
    code, out, _ = cli(capsys, "override", "pin", MODEL, "5", "--ttl", "10m", "--reason", "load test", *auth, "--json")
    assert code == 0
    ov = json.loads(out)
    assert ov["kind"] == "pin" and ov["replicas"] == 5 and ov["author"] == "alice"
    h.run(30)
    assert h.daemon.controller.last_decisions[MODEL].replicas == 5
    code, out, _ = cli(capsys, "override", "max", MODEL, "4", "--reason", "cap", *auth, "--json")
    assert code == 0 and json.loads(out)["max_replicas"] == 4
    code, out, _ = cli(capsys, "override", "list", *auth, "--json")
    assert sorted(o["id"] for o in json.loads(out)["items"]) == [ov["id"], ov["id"] + 1]
    code, out, _ = cli(capsys, "override", "list", *auth)
    assert "load test" in out and "pin" in out
    assert cli(capsys, "override", "delete", str(ov["id"]), *auth)[0] == 0
    code, _, err = cli(capsys, "override", "delete", str(ov["id"]), *auth)
    assert code == 5 and "not found" in err
    h.run(660)  # well past the 10 min TTL of the deleted pin; the max stays
    assert h.daemon.controller.last_decisions[MODEL].replicas <= 4


def test_pause_resume_and_policies(daemon, capsys) -> None:
    h, url = daemon
    auth = ("--server", url, "--token", ADMIN)
    assert cli(capsys, "pause", "--reason", "maintenance", *auth)[0] == 0
    assert h.daemon.paused
    code, out, _ = cli(capsys, "status", *auth, "--json")
    assert json.loads(out)["paused"] is True
    assert cli(capsys, "resume", *auth)[0] == 0 and not h.daemon.paused
    code, out, _ = cli(capsys, "policies", *auth, "--json")
    assert code == 0 and json.loads(out)["models"][MODEL]["version"]
    code, out, _ = cli(capsys, "policies", *auth)
    assert "slo-guard" in out


def test_exit_codes_and_the_token_is_never_echoed(daemon, capsys) -> None:
    _, url = daemon
    # a viewer cannot write: 4, and the error says what to use
    code, _, err = cli(capsys, "pause", "--server", url, "--token", VIEWER)
    assert code == 4 and "admin token" in err and VIEWER not in err
    code, _, err = cli(capsys, "status", "--server", url, "--token", "wrong-" + ADMIN)
    assert code == 4 and "--token" in err and ADMIN not in err
    code, _, err = cli(capsys, "why", "999999", "--server", url, "--token", VIEWER)
    assert code == 5
    code, _, err = cli(capsys, "override", "pin", "no-such-model", "3", "--reason", "x", "--server", url, "--token", ADMIN)
    assert code == 2 and "no-such-model" in err and ADMIN not in err
    code, _, err = cli(capsys, "status", "--server", "http://127.0.0.1:9", "--token", ADMIN)
    assert code == 3 and "cannot reach" in err and ADMIN not in err
    code, _, err = cli(capsys, "status")
    assert code == 2 and "TIDEGATE_URL" in err


def test_environment_and_client_file(daemon, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    _, url = daemon
    token_file = tmp_path / "token"
    token_file.write_text(VIEWER + "\n")
    (tmp_path / "xdg" / "tidegate").mkdir(parents=True)
    (tmp_path / "xdg" / "tidegate" / "client.yaml").write_text(f"server: {url}\ntoken_file: {token_file}\n")
    assert cli(capsys, "status", "--json")[0] == 0
    # the environment beats the file: a wrong token there is used, and refused
    monkeypatch.setenv("TIDEGATE_URL", url)
    monkeypatch.setenv("TIDEGATE_TOKEN", "nope-" + VIEWER)
    code, _, err = cli(capsys, "status")
    assert code == 4 and "TIDEGATE_TOKEN" in err and VIEWER not in err


def test_the_console_script_reads_the_environment(daemon) -> None:
    """As a script uses it: a subprocess with the environment, JSON on stdout, status 0."""
    _, url = daemon
    env = {**os.environ, "TIDEGATE_URL": url, "TIDEGATE_TOKEN": VIEWER, "PYTHONWARNINGS": "ignore"}
    r = subprocess.run([sys.executable, "-m", "controller.cli", "override", "list", "--json"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"items": []} and VIEWER not in r.stdout + r.stderr


def test_completion_script_completes_the_commands(tmp_path: Path, capsys) -> None:
    code, script, _ = cli(capsys, "completion", "bash")
    assert code == 0
    f = tmp_path / "comp.sh"
    f.write_text(script)
    probe = ('source "$1"; COMP_WORDS=(tidegate override p); COMP_CWORD=2; _tidegate_complete; '
             'echo "${COMPREPLY[@]}"; COMP_WORDS=(tidegate override pin m 3 --t); COMP_CWORD=5; '
             '_tidegate_complete; echo "${COMPREPLY[@]}"')
    r = subprocess.run(["bash", "-c", probe, "bash", str(f)], capture_output=True, text=True, timeout=30)
    assert r.stdout.splitlines() == ["pin", "--token --ttl"], r.stdout + r.stderr


def test_validate_commands_print_json(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: tidegate/v1\nkind: ScalingPolicy\nmetadata: {name: b}\nspec: {model: m, boundz: {}}\n")
    code, out, _ = cli(capsys, "policy", "validate", str(bad), "--json")
    result = json.loads(out)
    assert code == 1 and result["ok"] is False and any("boundz" in e["message"] or "boundz" in (e["path"] or "")
                                                       for e in result["paths"][0]["errors"])
    code, out, _ = cli(capsys, "config", "validate", str(tmp_path / "missing.yaml"), "--json")
    assert code == 1 and json.loads(out)["ok"] is False and json.loads(out)["problems"]
