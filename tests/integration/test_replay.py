"""Counterfactual replay over a real decision log (SQLite and PostgreSQL) written by a real daemon on
the simulated fleet: the policy that was in force reproduces the log; a tighter one costs less and
shows where it would have had less capacity than the load needed; through the API and directly."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml

from controller.cli import main
from controller.config import RetentionConfig
from controller.db.retention import prune
from controller.replay import load_ticks, placement_capacity, run_replay
from policies.base import Registry
from providers.clock import ManualClock
from tests.integration.daemon_harness import DEFAULT_POLICY, START, build_harness, serving

MODEL = "llama3-70b-fp8"
END = START + timedelta(hours=2, seconds=1)  # the last tick is at START + 2 h
TIGHT = DEFAULT_POLICY.replace("max_replicas: 24", "max_replicas: 8")


def _replay(h, text: str, since: datetime = START, until: datetime = END) -> dict:
    return run_replay(h.repo, models=h.daemon.models, pools=h.daemon.pools, registry=Registry.from_entry_points(),
                      policy_file="p.yaml", policy_text=text, since=since, until=until)


def test_replay_reproduces_the_log_and_compares_a_tighter_policy(tmp_path: Path, db_url: str) -> None:
    h = build_harness(tmp_path, db_url=db_url)
    try:
        h.run(2 * 3600)
        same = _replay(h, DEFAULT_POLICY)
        assert same["ticks"] == 2 * 3600 / h.config.loop.interval_s
        assert same["differing_ticks"] == 0 and same["first_differences"] == []
        assert same["replayed"]["cost_usd"] == pytest.approx(same["decided"]["cost_usd"])
        rows = list(h.repo.decisions_between(MODEL, START, END))
        dt = h.config.loop.interval_s
        assert same["decided"]["cost_usd"] == pytest.approx(sum(r["cost_per_hour_usd"] for r in rows) * dt / 3600)

        tight = _replay(h, TIGHT)
        assert max(sum(s["replayed"].values()) for s in tight["series"]) == 8
        assert tight["replayed"]["cost_usd"] < tight["decided"]["cost_usd"]
        first = tight["first_differences"][0]
        assert [s["name"] for s in first["replayed"]["trace"]][-6:] == ["bounds", "overrides", "lead-time", "placement", "budget", "outcome"]
        assert first["replayed"]["placement"] != first["decided"]["placement"]
        # under capacity, by hand: each tick whose 8 replicas serve fewer tokens/s than recorded
        ticks = load_ticks(h.repo, MODEL, START, END)
        by_at = {s["at"]: s["replayed"] for s in tight["series"]}
        short = sum(dt for t in ticks if placement_capacity(h.daemon.models[MODEL], h.daemon.pools,
                                                            by_at[t.at.isoformat()])[0]
                    < (t.signals.output_tokens_per_s.value or 0))
        assert short > 0 and tight["replayed"]["under_capacity_s"] >= short
        assert tight["replayed"]["under_capacity_s"] == sum(r["seconds"] for r in tight["replayed"]["under_capacity"])
        assert _replay(h, TIGHT) == tight  # pure: same log, same policy, same result
    finally:
        h.close()


def test_replay_reads_hourly_rollups_where_retention_pruned_the_log(
        tmp_path: Path, db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    h = build_harness(tmp_path, db_url=db_url)
    config = tmp_path / "daemon.yaml"
    config.write_text(yaml.safe_dump(json.loads(h.config.model_dump_json()), sort_keys=False))
    policy = tmp_path / "tight.yaml"
    policy.write_text(TIGHT)
    cut, end = START + timedelta(hours=2), START + timedelta(hours=3, seconds=1)
    try:
        h.run(3 * 3600, step_s=30)  # a tick every 30 s: three hours in a few seconds
        before = _replay(h, TIGHT, START, end)
        full_before = _replay(h, TIGHT, cut, end)
        hours = [list(h.repo.decisions_between(MODEL, START + timedelta(hours=k), START + timedelta(hours=k + 1)))
                 for k in range(2)]
        # the retention job, two hours of the window past full_days: they become hourly rollups
        assert prune(h.repo, ManualClock(cut + timedelta(days=14)), RetentionConfig(full_days=14)) > 0
        assert h.repo.oldest_decision_at(MODEL) == cut
        assert list(h.repo.decisions_between(MODEL, START, cut)) == []

        whole = _replay(h, TIGHT, START, end)
        assert whole["coarser"]["hours"] == 2 and "2 h of hourly rollups" in whole["coarser"]["note"]
        assert (whole["coarser"]["from"], whole["coarser"]["to"]) == (START.isoformat(), cut.isoformat())
        coarse = [s for s in whole["series"] if s.get("coarser")]
        assert [s["at"] for s in coarse] == [START.isoformat(), (START + timedelta(hours=1)).isoformat()]
        for s, rows in zip(coarse, hours):  # what was decided: the hour's mean replicas per pool, by hand
            pools = {p for r in rows for p in r["placement"]}
            assert s["decided"] == {p: round(sum(r["placement"].get(p, 0) for r in rows) / len(rows)) for p in pools}
        # the full part as before: same ticks, same decisions, and replaying it alone is unchanged
        assert whole["ticks"] == 2 + full_before["ticks"] and before["ticks"] == sum(map(len, hours)) + full_before["ticks"]
        assert [s["decided"] for s in whole["series"][2:]] == [s["decided"] for s in full_before["series"]]
        assert not any(s.get("coarser") for s in whole["series"][2:])
        assert _replay(h, TIGHT, cut, end) == full_before and full_before["coarser"] is None
        # an hour at its mean cost per hour costs what its decisions did (the first hour from its
        # start, where the log's first tick came one interval later)
        mean0 = sum(r["cost_per_hour_usd"] for r in hours[0]) / len(hours[0])
        lead_s = (hours[0][0]["at"] - START).total_seconds()
        assert whole["decided"]["cost_usd"] == pytest.approx(before["decided"]["cost_usd"] + mean0 * lead_s / 3600,
                                                             abs=2e-4)
        assert max(sum(s["replayed"].values()) for s in coarse) <= 8 and whole["replayed"]["cost_usd"] > 0
        assert _replay(h, TIGHT, START, end) == whole  # pure: same log, same policy, same result

        window = ("--from", START.isoformat(), "--to", end.isoformat(), "--policy", str(policy),
                  "--database", h.config.database.url, "--config", str(config))
        main(["replay", *window, "--json"])
        assert json.loads(capsys.readouterr().out)["coarser"] == whole["coarser"]
        main(["replay", *window])
        assert "coarser: 2 h of hourly rollups" in capsys.readouterr().out
    finally:
        h.close()


def test_replay_command_through_the_api_and_the_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    h = build_harness(tmp_path)
    policy = tmp_path / "tight.yaml"
    policy.write_text(TIGHT)
    config = tmp_path / "daemon.yaml"
    config.write_text(yaml.safe_dump(json.loads(h.config.model_dump_json()), sort_keys=False))
    try:
        h.run(2 * 3600)
        window = ("--from", START.isoformat(), "--to", END.isoformat())
        with serving(h, {"TIDEGATE_VIEWER_TOKENS": "v:viewer-token"}) as url:
            code = main(["replay", *window, "--policy", str(policy), "--server", url, "--token", "viewer-token", "--json"])
            via_api = json.loads(capsys.readouterr().out)
            assert code == 1  # the tighter policy would have had less capacity than the load needed
            code = main(["replay", "--from", "2h", "--policy", str(policy), "--server", url, "--token", "viewer-token"])
            table = capsys.readouterr().out
            assert code == 1 and "replayed" in table and "first differences" in table
            bad = httpx.post(f"{url}/v1/replay", headers={"Authorization": "Bearer viewer-token"},
                             json={"from": START.isoformat(), "to": START.isoformat() + "x", "policy": "spec: 1"})
            assert bad.status_code == 422
            bad = httpx.post(f"{url}/v1/replay", headers={"Authorization": "Bearer viewer-token"},
                             json={"from": START.isoformat(), "to": (START + timedelta(hours=1)).isoformat(),
                                   "policy": TIGHT.replace("slo-guard", "warp-drive")})
            assert bad.status_code == 422 and "warp-drive" in bad.json()["detail"]
        code = main(["replay", *window, "--policy", str(policy), "--database", h.config.database.url,
                     "--config", str(config), "--json"])
        direct = json.loads(capsys.readouterr().out)
        assert code == 1
        assert {k: v for k, v in direct.items() if k != "policy_file"} == \
            {k: v for k, v in via_api.items() if k != "policy_file"}
        code = main(["replay", *window, "--policy", str(policy), "--database", h.config.database.url])
        assert code == 2 and "--config" in capsys.readouterr().err
    finally:
        h.close()
