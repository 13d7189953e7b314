"""Bytes a decision takes in the local journal (``controller.db.journal``), and how long the
chart's journal volume lasts while the database is away.

For each fleet size N: ``bench/control_plane.py``'s fleet (the demo's world widened to N models x 5
pools) with the demo's policy on every model, then with the same policy plus a ``forecast`` rule
(``bench/decision_log_size.py``'s: the largest state a rule keeps), run by the daemon as ``tidegate
run`` builds it, on a manual clock, for ``--warmup`` ticks (the forecast's 30 min of history fills
in 360), then ``--ticks`` more, after each of which the tick's decisions are appended to a journal
as the recorder appends them when the database refuses them (one ``append_intents`` a tick). The
journal's growth (its header line aside) divided by the decisions appended is
``bytes_per_decision``; ``hours`` is how long the chart's ``journalVolume`` (its ``sizeLimit`` in
``deploy/helm/tidegate/values.yaml``) holds the journal of N models at the tick interval (5 s);
``append_cpu_ms`` is the median CPU time of one append (encoding, compressing, writing, fsync).
With ``--replay`` the journal is then replayed whole into a fresh SQLite log
(``Repository.replay_journal`` without a budget, as at start): ``replay_ms_per_decision`` (wall),
and ``hour_replay_s``, what replaying an hour's journal of N models in one go would take, the time
a running daemon's tick would stop for without slices (``controller.db.recorder.REPLAY_SLICE_S``).

    python bench/journal_size.py [--models 10 1000] [--warmup 400] [--ticks 12] [--replay] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import controller  # noqa: F401 - the code under test comes from PYTHONPATH when given
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import control_plane as cp  # noqa: E402
import decision_log_size as dls  # noqa: E402

VALUES = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "tidegate" / "values.yaml"
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def volume_bytes() -> int:
    """The chart's journal volume size (``journalVolume.emptyDir.sizeLimit``), bytes."""
    limit = str(yaml.safe_load(VALUES.read_text())["journalVolume"]["emptyDir"]["sizeLimit"])
    return int(limit[:-2]) * UNITS[limit[-2:]]


def measure(n: int, forecast: bool, warmup: int, ticks: int, replay: bool = False) -> dict[str, Any]:
    from controller.config import DaemonConfig
    from controller.db.journal import Journal
    from controller.db.migrate import upgrade
    from controller.db.repo import Repository
    from controller.runtime import build_runtime
    from providers.clock import ManualClock

    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp:
        raw = cp.fleet_config(n, Path(tmp), f"sqlite:///{tmp}/tidegate.db")
        policy = yaml.safe_load(dls.policy(forecast))
        for m in raw["models"]:
            name = m["name"]
            doc = {**policy, "metadata": {"name": name}, "spec": {**policy["spec"], "model": name}}
            (Path(raw["policies_dir"]) / f"{name}.yaml").write_text(yaml.safe_dump(doc))
        clock = ManualClock(cp.T0)
        rt = build_runtime(DaemonConfig.model_validate(raw), clock=clock, environ={})
        try:
            d = rt.daemon
            d.reload_policies()
            interval = d.config.loop.interval_s
            for _ in range(warmup):
                clock.advance(interval)
                d.tick()
            path = Path(tmp) / "journal.jsonl"
            journal, grown, decisions, cpu = Journal(path), 0, 0, []
            c = d.controller
            for _ in range(ticks):
                clock.advance(interval)
                report = d.tick()
                items = [(decision, c.last_signals[m]) for m, decision in report.decisions.items()]
                before = path.stat().st_size if journal.exists() else None
                t = time.process_time()
                journal.append_intents(items, dry_run=False)
                cpu.append(time.process_time() - t)
                if before is not None:  # the first append also writes the journal's header
                    grown += path.stat().st_size - before
                    decisions += len(items)
        finally:
            rt.stop()
        extra: dict[str, Any] = {}
        if replay:
            url = f"sqlite:///{tmp}/replay.db"
            upgrade(url)
            repo = Repository(url)
            try:
                t = time.perf_counter()
                written = repo.replay_journal(journal.journal_id() or "bench", journal.read_from, clock.now()).written
                per = (time.perf_counter() - t) / max(written, 1)
            finally:
                repo.close()
            extra = {"replay_ms_per_decision": round(per * 1000, 3),
                     "hour_replay_s": round(per * n * 3600 / interval, 1)}
    per_decision = grown / max(decisions, 1)
    return {"models": n, "policy": "demo + forecast" if forecast else "demo", "decisions": decisions,
            "bytes_per_decision": round(per_decision), "bytes_per_tick": round(per_decision * n),
            "hours": round(volume_bytes() / (per_decision * n) * interval / 3600, 1),
            "append_cpu_ms": round(statistics.median(cpu) * 1000, 1), **extra}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, nargs="+", default=[10, 1000], help="fleet sizes (models x 5 pools)")
    ap.add_argument("--warmup", type=int, default=400, help="ticks before measuring (default 400: the forecast's "
                                                               "history full)")
    ap.add_argument("--ticks", type=int, default=12, help="ticks appended (default 12: one minute at 5 s)")
    ap.add_argument("--replay", action="store_true", help="also replay each journal whole into a fresh SQLite log")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    runs = [measure(n, f, args.warmup, args.ticks, args.replay) for n in args.models for f in (False, True)]
    if args.json:
        print(json.dumps({"volume_bytes": volume_bytes(), "runs": runs}))
    else:
        for r in runs:
            print(f"{r['models']:>6} models  {r['policy']:<16} {r['bytes_per_decision']:>6} bytes/decision  "
                  f"{r['bytes_per_tick']:>8} bytes/tick  {r['hours']:>7} h in {volume_bytes() // 2**20} MiB  "
                  f"append {r['append_cpu_ms']} ms CPU"
                  + (f"  replay {r['replay_ms_per_decision']} ms/decision, an hour's journal {r['hour_replay_s']} s"
                     if "hour_replay_s" in r else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
