"""Bytes the decision log grows by per decision, in the demo fleet at steady state.

Runs the daemon (``controller.daemon.Daemon``, the demo's config and simulated fleet, a manual
clock) on a fresh database for ``--warmup`` ticks, then ``--ticks`` more, and divides the growth of
the database by the decisions written in between: on SQLite the pages in use times the page size
(after a checkpoint; free pages not counted), on PostgreSQL ``pg_total_relation_size`` of the
``decisions`` and ``actions`` tables (indexes and TOAST included), in a database the script creates
and drops, with a ``VACUUM`` every minute of the daemon's clock as autovacuum would make. Twice: with the demo's policy (``slo-guard``) and with the same policy plus a
``forecast`` rule (whose state is the largest a rule keeps).

    python bench/decision_log_size.py [--warmup 120] [--ticks 720] [--postgresql URL] [--json]

``--postgresql``: a server URL (``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``) on
which the script may create a database.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from tests.integration.daemon_harness import build_harness  # noqa: E402

TARGET_BYTES = 1024

FORECAST_RULE = {"kind": "forecast", "params": {"lead_time_s": 480}}


def policy(forecast: bool) -> str:
    from controller.demo import demo_config_path

    doc = yaml.safe_load((demo_config_path().parent / "policies" / "llama3-70b-fp8.yaml").read_text())
    if forecast:
        doc["spec"]["rules"].append(FORECAST_RULE)
    return yaml.safe_dump(doc)


VACUUM_EVERY = 12
"""Ticks between the VACUUMs the PostgreSQL run makes (one minute of 5 s ticks: autovacuum's
default naptime), so the room dead row versions leave behind is reused as it is in service."""


def vacuum(url: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as c:
            c.exec_driver_sql("VACUUM decisions")
            c.exec_driver_sql("VACUUM actions")
            c.exec_driver_sql("VACUUM decision_outcomes")
    finally:
        engine.dispose()


def pg_bytes(url: str) -> int:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as c:
            return int(c.exec_driver_sql(
                "SELECT pg_total_relation_size('decisions') + pg_total_relation_size('actions') + pg_total_relation_size('decision_outcomes')").scalar() or 0)
    finally:
        engine.dispose()


@contextlib.contextmanager
def pg_database(server: str) -> Iterator[str]:
    import sqlalchemy as sa

    name = f"tidegate_bench_{os.getpid()}"
    engine = sa.create_engine(server, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as c:
            c.exec_driver_sql(f"CREATE DATABASE {name}")
        yield str(sa.engine.make_url(server).set(database=name).render_as_string(hide_password=False))
        with engine.connect() as c:
            c.exec_driver_sql(f"DROP DATABASE {name} WITH (FORCE)")
    finally:
        engine.dispose()


def used_bytes(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages, free, size = (con.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size"))
        return int((pages - free) * size)
    finally:
        con.close()


def measure(forecast: bool, warmup: int, ticks: int, server: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, \
            (pg_database(server) if server else contextlib.nullcontext(None)) as pg_url:
        h = build_harness(Path(tmp), policy=policy(forecast), db_url=pg_url)
        size = (lambda: pg_bytes(pg_url)) if pg_url else (lambda: used_bytes(Path(tmp) / "tidegate.db"))
        step = h.config.loop.interval_s

        def run(n: int) -> None:  # on PostgreSQL, VACUUM every minute of the daemon's clock, as autovacuum would
            for done in range(0, n, VACUUM_EVERY):
                h.run(min(VACUUM_EVERY, n - done) * step)
                if pg_url:
                    vacuum(pg_url)

        try:
            run(warmup)
            before, n0 = size(), len(h.repo.list_decisions(limit=10**9))
            run(ticks)
            after, n1 = size(), len(h.repo.list_decisions(limit=10**9))
        finally:
            h.close()
    decisions = n1 - n0
    return {"policy": "demo + forecast" if forecast else "demo", "database": "postgresql" if server else "sqlite",
            "decisions": decisions, "bytes_per_decision": round((after - before) / max(decisions, 1)),
            "target_bytes": TARGET_BYTES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup", type=int, default=120, help="ticks before measuring (default 120: 10 min)")
    ap.add_argument("--ticks", type=int, default=720, help="ticks measured (default 720: one hour at 5 s)")
    ap.add_argument("--postgresql", metavar="URL", help="measure on PostgreSQL (a server URL; a database is created and dropped)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    runs = [measure(f, args.warmup, args.ticks, args.postgresql) for f in (False, True)]
    if args.json:
        print(json.dumps({"runs": runs}))
    else:
        for r in runs:
            print(f"{r['database']:<10} {r['policy']:<16} {r['bytes_per_decision']:>7} bytes/decision over {r['decisions']} decisions"
                  f" (target <= {r['target_bytes']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
