"""``bench/control_plane.py``, ``bench/record_tick.py`` and ``bench/journal_size.py`` run end to
end and print the documented JSON (a smoke test with tiny fleets; the figures themselves are the
benchmark's business, never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {"models", "database", "tick_s", "observe_s", "decide_s", "act_s", "record_s", "bytes_per_decision",
          "rss_mb", "world_mb", "daemon_rss_mb", "rss_growth_mb", "ready_s"}


def test_control_plane_bench_prints_one_json_object_with_every_field() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "control_plane.py"), "--models", "3", "--ticks", "2",
                           "--shards", "--shard-models", "30", "--shard-ticks", "1", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    single, sharded = out["runs"]
    for run in (single, sharded):
        assert FIELDS <= set(run), set(run)
        assert run["database"] == "sqlite" and run["bytes_per_decision"] is not None and run["rss_mb"] > 0
        # the world's share is measured apart (numpy alone is tens of MB) and taken off the process's
        assert run["world_mb"] > 0 and run["daemon_rss_mb"] == round(run["rss_mb"] - run["world_mb"], 1)
        assert all(run[k] >= 0 for k in ("tick_s", "observe_s", "decide_s", "act_s", "record_s", "ready_s"))
    assert (single["models"], single["replicas"]) == (3, 1)
    assert (sharded["models"], sharded["replicas"]) == (30, 10)
    assert out["targets"] == {"tick_s": 0.5, "rss_mb": 200.0, "bytes_per_decision": 1024.0, "ready_s": 5.0}
    assert out["machine_probe_ms"] > 0  # the machine's yardstick, printed beside the figures


def test_record_tick_bench_writes_a_captured_tick_and_prints_its_cost() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "record_tick.py"), "--models", "3", "--repeat", "2",
                           "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = json.loads(proc.stdout)["runs"]
    # one decision a model, each written (and its outcome) twice into the fresh log
    assert (run["models"], run["database"], run["decisions"], run["repeat"]) == (3, "sqlite", 3, 2)
    assert run["record_decisions_cpu_s"] > 0 and run["record_outcomes_cpu_s"] >= 0 and run["wall_s"] > 0


def test_journal_size_bench_prints_the_bytes_and_hours_of_each_run() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "journal_size.py"), "--models", "2", "--warmup", "2",
                           "--ticks", "2", "--replay", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["volume_bytes"] > 0  # the chart's journalVolume
    assert [(r["models"], r["policy"]) for r in out["runs"]] == [(2, "demo"), (2, "demo + forecast")]
    for run in out["runs"]:
        # the second tick's two decisions (the first append also writes the journal's header)
        assert run["decisions"] == 2 and run["bytes_per_decision"] > 0 and run["bytes_per_tick"] > 0
        assert run["hours"] > 0 and run["append_cpu_ms"] >= 0
        # replayed whole: both ticks' decisions went in, at some cost each
        assert run["replay_ms_per_decision"] > 0 and run["hour_replay_s"] > 0
