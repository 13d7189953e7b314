"""Hostile policy files against the real daemon: its scheduler ticks on while a 50 MB file and a
"billion laughs" file are being rejected, memory stays bounded, the errors show in `/v1/policies`
and the log; a link to a secret outside the policies directory shows nothing of it anywhere; and
`tidegate policy validate` on a billion-laughs file finishes within a small address space."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import httpx
import pytest

from controller.auth import TokenAuth
from controller.policyfile import PolicyLimits
from controller.runtime import Runtime
from tests.integration.daemon_harness import DEFAULT_POLICY, make_harness  # noqa: F401 (fixture)
from tests.unit.hostile_files import SECRET, configmap_mount, laughs

TIDEGATE = shutil.which("tidegate", path=str(Path(sys.executable).parent)) or "tidegate"

TICK_S = 0.2
"""Wall seconds between ticks of the daemon's scheduler in this test."""
RELOAD_S = 0.05
"""Wall seconds between policy reloads: many reloads per tick, each meeting the hostile files."""
MAX_GAP_S = 5 * TICK_S
"""No two ticks further apart than this (the old store held its lock through a 60 s parse)."""
PEAK_BYTES = 32 * 2**20
"""Bound on the Python heap growth (tracemalloc peak) while the hostile files are rejected."""


def _gaps(stamps: list[float]) -> list[float]:
    return [b - a for a, b in zip(stamps, stamps[1:])]


def test_ticks_keep_their_schedule_while_hostile_files_are_rejected(
        make_harness, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    h = make_harness(tmp_path)
    d = h.policies_dir
    stamps: list[float] = []
    # one model: one decision per tick, taken after the tick read the policy store
    h.daemon.on_decision = lambda decision, signals: (stamps.append(time.monotonic()),
                                                      h.clock.advance(h.config.loop.interval_s))
    caplog.set_level(logging.ERROR, logger="tidegate.daemon")
    phases: dict[str, tuple[float, float]] = {}
    tracemalloc.start()
    h.daemon.start(wall_interval_s=TICK_S, policy_reload_s=RELOAD_S)
    try:
        t0 = time.monotonic()
        time.sleep(2.0)  # long enough that a late first tick on a loaded machine is no miss
        phases["clean"] = (t0, time.monotonic())

        t0 = time.monotonic()
        chunk = "# " + "x" * (2**20 - 3) + "\n"  # 1 MiB of comment per write: 50 MB, never held whole
        with (d / "big.yaml").open("w") as f:
            for _ in range(50):
                f.write(chunk)
        time.sleep(2.0)
        phases["50 MB file"] = (t0, time.monotonic())

        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < 2.0:  # a new variant every tick: each one is parsed anew
            (d / "lol.yaml").write_text(f"# variant {n}\n" + laughs(9, 9))
            n += 1
            time.sleep(TICK_S)
        phases["billion laughs"] = (t0, time.monotonic())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        h.daemon.stop()
        tracemalloc.stop()

    start = stamps[0]
    print(f"\ntick schedule: every {TICK_S} s wall, policy reload every {RELOAD_S} s")
    for name, (a, b) in phases.items():
        inside = [s for s in stamps if a <= s < b]
        print(f"{name:>15}: {len(inside)} ticks at t = "
              + ", ".join(f"{s - start:.2f}" for s in inside)
              + f" s; longest gap {max(_gaps(inside), default=0):.3f} s")
    print(f"tracemalloc peak while rejecting: {peak / 2**20:.1f} MiB")

    assert max(_gaps(stamps)) < MAX_GAP_S, _gaps(stamps)
    for name, (a, b) in phases.items():
        inside = [s for s in stamps if a <= s < b]
        assert len(inside) >= (b - a) / TICK_S * 0.6, (name, len(inside))
    assert peak < PEAK_BYTES, peak

    # rejected, visible in /v1/policies' data and in the log, and the good policy still decides
    status = h.daemon.policy_store.status()
    big, lol = status["files"][str(d / "big.yaml")], status["files"][str(d / "lol.yaml")]
    assert big["errors"][0]["message"].startswith("refused: the file is 52428800 bytes, over the limit of 1048576")
    assert f"more than {PolicyLimits().max_nodes} YAML nodes" in lol["errors"][0]["message"]
    assert status["models"]["llama3-70b-fp8"]["version"] is not None
    logged = [r for r in caplog.records if r.getMessage().startswith("policy file rejected")]
    files = {getattr(r, "fields", {}).get("file") for r in logged}
    assert {str(d / "big.yaml"), str(d / "lol.yaml")} <= files


@pytest.fixture
def api_with_secret_link(make_harness, tmp_path: Path):  # type: ignore[no-untyped-def]
    secret = tmp_path / "elsewhere" / "credentials"
    secret.parent.mkdir()
    secret.write_text("kind: [\n" + SECRET + "\n")  # would be quoted by a YAML syntax error
    d = tmp_path / "policies"
    configmap_mount(d, {"policy.yaml": DEFAULT_POLICY})
    (d / "creds.yaml").symlink_to(secret)
    h = make_harness(tmp_path, policy="")
    auth = TokenAuth.from_config(h.config.api, {"TIDEGATE_VIEWER_TOKENS": "victor:viewer-token"})
    rt = Runtime(daemon=h.daemon, auth=auth)
    rt.serve_api("127.0.0.1", 0)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{rt.api_port}", timeout=10,
                          headers={"Authorization": "Bearer viewer-token"}) as client:
            yield h, client, d
    finally:
        rt.stop()


def test_a_secret_behind_a_link_shows_nowhere(api_with_secret_link, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    h, client, d = api_with_secret_link
    caplog.set_level(logging.DEBUG)
    (d / "another.yaml").symlink_to(d.parent / "elsewhere" / "credentials")
    h.daemon.reload_policies()  # a change, so the rejection is logged again, at DEBUG and up
    r = client.get("/v1/policies")
    assert r.status_code == 200
    body = r.json()
    (err,) = body["files"][str(d / "creds.yaml")]["errors"]
    assert err["message"].startswith("refused: a symbolic link that leads outside the policies directory")
    assert body["models"]["llama3-70b-fp8"]["version"] is not None  # the ConfigMap-mounted policy loads
    records = caplog.get_records("setup") + caplog.get_records("call")
    log_text = "".join(f"{rec.getMessage()} {getattr(rec, 'fields', '')}\n" for rec in records)
    assert "creds.yaml" in log_text and "another.yaml" in log_text
    for shown in (r.text, log_text):
        assert "wJalrXUtnFEMI" not in shown and "aws_secret" not in shown


def test_validate_on_a_billion_laughs_finishes_in_a_small_address_space(tmp_path: Path) -> None:
    f = tmp_path / "lol.yaml"
    f.write_text(laughs(9, 9))
    t0 = time.monotonic()
    # at most 768 MiB of address space (the old loader walked the 387 million strings and reached
    # 4.8 GB); set by the shell, as a user would, rather than by a preexec_fn in a threaded pytest
    r = subprocess.run(["bash", "-c", f'ulimit -v {768 * 1024} && exec "$0" "$@"', TIDEGATE, "policy",
                        "validate", str(f)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    elapsed = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    first = r.stdout.splitlines()[0] if r.stdout else r.stderr
    assert first.startswith(f"{f}:") and f": refused: the file holds more than {PolicyLimits().max_nodes} YAML nodes" in first, first
    assert "Traceback" not in r.stderr
    assert elapsed < 20, elapsed


def test_reloads_racing_the_api_and_ticks_never_raise(make_harness, tmp_path: Path) -> None:
    """Many reloads at once (the scheduler's and `POST /v1/policies/reload`'s) while a file keeps
    changing between good and hostile: every call returns, the model always has a policy."""
    h = make_harness(tmp_path)
    good = (h.policies_dir / "policy.yaml").read_text()
    failures: list[BaseException] = []

    def reload_many() -> None:
        try:
            for _ in range(30):
                h.daemon.reload_policies()
        except BaseException as e:  # noqa: BLE001 - collected for the assertion
            failures.append(e)

    threads = [threading.Thread(target=reload_many) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(30):
        (h.policies_dir / "policy.yaml").write_text(good if i % 2 else "a: " + "[" * 1000 + "]" * 1000)
        assert h.daemon.policy_store.get("llama3-70b-fp8") is not None
    for t in threads:
        t.join(30)
    assert failures == []
    assert h.daemon.policy_store.get("llama3-70b-fp8") is not None


def test_the_daemon_config_sets_the_size_limit(make_harness, tmp_path: Path) -> None:
    padded = DEFAULT_POLICY + "# padding\n" * 300  # about 3.5 KiB: fine under the default 1 MiB
    h = make_harness(tmp_path, policy=padded, config_updates={"policy_max_file_bytes": 2048})
    status = h.daemon.policy_store.status()
    (err,) = status["errors"]
    assert err["file"] == str(h.policies_dir / "policy.yaml")
    assert err["message"].startswith(f"refused: the file is {len(padded.encode())} bytes, over the limit of 2048 bytes")
    assert status["models"] == {}
