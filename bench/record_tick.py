"""The decision log's cost of recording one tick: one tick of ``bench/control_plane.py``'s fleet
(N models x 5 pools on the simulated world) is captured as the daemon hands it to the repository
(its intents, then its outcomes), then written again ``--repeat`` times into a fresh log of the
same kind, and the CPU seconds of ``record_decisions`` (the intents' transaction) and
``record_outcomes`` (the outcomes' transaction) and the wall seconds of both are printed as
medians. Only the repository is measured: no decision, no provider, no world.

    python bench/record_tick.py [--models 1000] [--database sqlite|postgresql ...] [--repeat 12] [--json]

PostgreSQL: ``TIDEGATE_BENCH_PG_DSN`` as for ``bench/control_plane.py``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import controller  # noqa: F401 - the code under test comes from PYTHONPATH when given
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import control_plane as cp  # noqa: E402


def capture(n: int, db: str) -> tuple[list[Any], list[Any], list[Any]]:
    """One tick's ``record_decisions`` (its items and their ``skipped``) and ``record_outcomes``
    arguments, after 6 ticks."""
    from controller.config import DaemonConfig
    from controller.db.repo import Repository
    from controller.runtime import build_runtime
    from providers.clock import ManualClock

    got: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp, cp.database(db, Path(tmp)) as (url, _):
        clock = ManualClock(cp.T0)
        rt = build_runtime(DaemonConfig.model_validate(cp.fleet_config(n, Path(tmp), url)), clock=clock, environ={})
        d = rt.daemon
        d.reload_policies()
        for _ in range(6):
            clock.advance(5)
            d.tick()
        decisions, outcomes = Repository.record_decisions, Repository.record_outcomes

        def keep_decisions(self: Repository, items: Any, skipped: Any = ()) -> list[int]:
            got["intents"], got["skipped"] = list(items), list(skipped)
            return decisions(self, items, skipped)

        def keep_outcomes(self: Repository, items: Any, *, at: Any = None) -> None:
            got["outcomes"] = list(items)
            outcomes(self, items, at=at)

        Repository.record_decisions, Repository.record_outcomes = keep_decisions, keep_outcomes  # type: ignore[method-assign]
        try:
            clock.advance(5)
            d.tick()
        finally:
            Repository.record_decisions, Repository.record_outcomes = decisions, outcomes  # type: ignore[method-assign]
            rt.stop()
    return got["intents"], got["skipped"], got["outcomes"]


def replay(n: int, db: str, repeat: int) -> dict[str, Any]:
    from controller.db.migrate import upgrade
    from controller.db.repo import Repository

    intents, skipped, outcomes = capture(n, db)
    cpu_i, cpu_o, wall = [], [], []
    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp, cp.database(db, Path(tmp)) as (url, _):
        upgrade(url)
        repo = Repository(url)
        try:
            for _ in range(repeat):
                w, c = time.perf_counter(), time.process_time()
                ids = repo.record_decisions(intents, skipped)
                cpu_i.append(time.process_time() - c)
                c = time.process_time()
                repo.record_outcomes([(ids[k], *o[1:]) for k, o in enumerate(outcomes)])
                cpu_o.append(time.process_time() - c)
                wall.append(time.perf_counter() - w)
        finally:
            repo.close()
    return {"models": n, "database": db, "decisions": len(intents), "repeat": repeat,
            "record_decisions_cpu_s": round(statistics.median(cpu_i), 4),
            "record_outcomes_cpu_s": round(statistics.median(cpu_o), 4), "wall_s": round(statistics.median(wall), 4)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--database", choices=("sqlite", "postgresql"), nargs="+", default=["sqlite"])
    ap.add_argument("--repeat", type=int, default=12)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    runs = [replay(args.models, db, args.repeat) for db in args.database]
    if args.json:
        print(json.dumps({"runs": runs}))
    else:
        for r in runs:
            print(f"{r['models']} models on {r['database']}: record_decisions {r['record_decisions_cpu_s']} CPU s, "
                  f"record_outcomes {r['record_outcomes_cpu_s']} CPU s, both {r['wall_s']} s wall "
                  f"(medians of {r['repeat']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
