"""Retention: decisions older than ``database.retention.full_days`` become hourly rollups per
model, in small batches, on SQLite and PostgreSQL; what is kept still decodes; the API and
``tidegate decisions`` read the rollups for the older range and say so; the daemon's scheduler
runs the job."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

from controller.config import RetentionConfig
from controller.core.model import Action, ActionStatus, History, Sample, ScaleEvent
from controller.db.repo import Repository
from controller.db.retention import prune
from controller.runtime import build_runtime
from providers.clock import ManualClock
from tests.integration.daemon_harness import build_harness, serving
from tests.integration.test_db_repo import decision_for, signals_for

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=timezone.utc)
STEP_S = 60
REPO_ROOT = Path(__file__).resolve().parents[2]


def fill(repo: Repository, hours: int = 3) -> dict[int, tuple[str, int, float]]:
    """Two models, a decision a minute for ``hours``, replicas and queue depth varying, a scale
    step when replicas change, an action on each; returns id -> (model, replicas, queue)."""
    made = {}
    for i in range(hours * 3600 // STEP_S):
        at = T0 + timedelta(seconds=STEP_S * i)
        items = []
        for k, model in enumerate(("a", "b")):
            replicas, prev = 3 + (i + k) % 4, 3 + (i + k - 1) % 4
            d = decision_for(model, at, current=prev, replicas=replicas,
                             history=History(recommendations=((at, replicas),), scale_events=(ScaleEvent(at, prev, replicas),),
                                             rule_state={"latency": {"i": i}}))
            d = replace(d, recommendations=tuple(replace(r, state={"i": i}) if r.rule == "latency" else r
                                                 for r in d.recommendations))
            sig = signals_for(model, at)
            sig = replace(sig, samples={**sig.samples, "queue_depth": Sample(float(i % 10), at)})
            items.append((d, sig, False))
        ids = repo.record_decisions(items)
        repo.record_outcomes([(i_, [Action("kubernetes", "scale", "onprem", d.model, {"replicas": d.replicas},
                                           ActionStatus.OK)], "applied", None, None) for i_, (d, _, _) in zip(ids, items)])
        for i_, (d, sig, _) in zip(ids, items):
            made[i_] = (d.model, d.replicas, sig.queue_depth.value)
    return made


def test_old_decisions_become_hourly_rollups_in_small_batches(repo: Repository) -> None:
    made = fill(repo)
    cfg = RetentionConfig(full_days=14, batch=7)
    clock = ManualClock(T0 + timedelta(days=14, hours=2, minutes=30))  # cutoff: T0 + 2 h (an hour boundary)
    compacted = prune(repo, clock, cfg)
    assert compacted == 2 * 120
    assert prune(repo, clock, cfg) == 0, "a second run finds nothing left: nothing is counted twice"
    kept = list(repo.all_decisions())
    assert {d["id"] for d in kept} == {i for i in made if i > max(made) - 120}
    assert all(datetime.fromisoformat(d["at"]) >= T0 + timedelta(hours=2) for d in kept)
    for d in kept[:3] + kept[-3:]:  # rows compressed against deleted ones were rewritten on their own
        assert repo.load_decision(d["id"]) is not None
    rollups = repo.list_rollups()
    assert [(r["model"], r["hour"]) for r in rollups] == [
        (m, (T0 + timedelta(hours=h)).isoformat()) for h in (1, 0) for m in ("a", "b")]
    for r in rollups:
        hour = datetime.fromisoformat(r["hour"])
        mine = [v for i, v in made.items() if v[0] == r["model"]
                and hour <= T0 + timedelta(seconds=STEP_S * ((i - 1) // 2)) < hour + timedelta(hours=1)]
        assert r["decisions"] == len(mine) == 60
        assert (r["replicas"]["min"], r["replicas"]["max"], r["replicas"]["last"]) == (
            min(v[1] for v in mine), max(v[1] for v in mine), mine[-1][1])
        assert r["signals"]["queue_depth"]["mean"] == statistics.fmean(v[2] for v in mine)
        assert r["placement"]["aws-spot"]["mean"] == statistics.fmean(v[1] - 2 for v in mine)
        assert sum(r["reasons"].values()) == 60 and r["outcomes"] == {"applied": 60}
        assert r["cost_per_hour_mean_usd"] == 7.5
    with repo.engine.connect() as c:  # the compacted decisions' actions went with them
        assert c.exec_driver_sql("SELECT count(*) FROM actions").scalar() == len(kept)


def test_api_and_cli_read_rollups_for_the_older_range(tmp_path: Path) -> None:
    h = build_harness(tmp_path)
    try:
        h.run(3 * 3600, step_s=60)
        h.clock.advance(14 * 86400)
        assert prune(h.repo, h.clock, RetentionConfig(full_days=14, batch=50)) > 0
        tokens = {"TIDEGATE_ADMIN_TOKENS": "alice:adm", "TIDEGATE_VIEWER_TOKENS": "victor:view"}
        with serving(h, tokens) as url, httpx.Client(base_url=url, timeout=10) as c:
            since = (h.clock.now() - timedelta(days=15)).isoformat()
            body = c.get("/v1/decisions", headers={"Authorization": "Bearer view"},
                         params={"since": since, "limit": 1000}).json()
        oldest = h.repo.oldest_decision_at()
        assert oldest is not None and body["full_decisions_since"] == oldest.isoformat()
        assert "hourly rollups" in body["note"] and body["rollups"]
        assert all(datetime.fromisoformat(r["until"]) <= oldest for r in body["rollups"])
        assert sum(r["decisions"] for r in body["rollups"]) + len(body["items"]) == 3 * 60
        out = subprocess.run([sys.executable, "-m", "controller.cli", "decisions", "--url", f"sqlite:///{tmp_path / 'tidegate.db'}",
                              "--rollups", "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == body["rollups"]
        plain = subprocess.run([sys.executable, "-m", "controller.cli", "decisions", "--url",
                                f"sqlite:///{tmp_path / 'tidegate.db'}", "--limit", "3"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert "kept as hourly rollups: add --rollups" in plain.stdout
    finally:
        h.close()


def test_the_daemon_runs_the_retention_job_on_its_scheduler(tmp_path: Path) -> None:
    """Decisions two days old in the log, ``full_days`` one: the daemon ``tidegate run`` builds
    compacts them from its scheduler, while it ticks."""
    url = f"sqlite:///{tmp_path / 'tidegate.db'}"
    now = datetime.now(timezone.utc)
    h = build_harness(tmp_path, start=now - timedelta(days=2),
                      config_updates={"database": {"url": url, "retention": {"full_days": 1, "interval_s": 0.2}}})
    h.run(600)
    old = len(list(h.repo.all_decisions()))
    h.close()
    rt = build_runtime(h.config, clock=ManualClock(now), environ={})
    try:
        rt.daemon.start()
        deadline = time.monotonic() + 20
        while not rt.daemon.repo.list_rollups() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        rt.stop()
    repo = Repository(url)
    try:
        rollups = repo.list_rollups()
        assert sum(r["decisions"] for r in rollups) == old
        assert all(datetime.fromisoformat(d["at"]) > now - timedelta(days=1) for d in repo.all_decisions())
    finally:
        repo.close()
