"""The daemon's own cost at scale: per-tick seconds by phase, bytes per decision, memory, startup.

Why: a tick must finish well inside the tick interval (5 s by default) at the fleet sizes tidegate
is meant for, the decision log must not outgrow its volume, memory must stay flat over days, and a
restarted pod must be ready quickly. This measures those on the simulated providers (the demo's
world: every model has a Deployment in each of 5 pools) through the daemon exactly as ``tidegate
run`` builds it (``controller.runtime.build_runtime``: migrations, policy files, history, ticks),
on a manual clock advanced one tick interval per tick so nothing waits on the wall clock.

For each fleet size N (one fresh process per run, so memory figures are the run's own):

- ``ready_s``: wall seconds from ``build_runtime`` to the first ``/readyz``-ready answer
  (migrations, parsing N policy files, rebuilding history, the ticks readiness needs);
- ``world_s``: the simulated world's own step to the tick's instant (every model's ``Simulation``
  served, scraped and moved ``interval_s`` on), timed on its own before each measured tick: it
  stands in for the cluster, whose time is not the daemon's, so it is not part of ``tick_s``. In
  ``ready_s`` the world's construction is included (``world_build_s`` says how much of it it was);
- ``tick_s``, ``observe_s``, ``decide_s``, ``act_s``, ``record_s``: medians over the measured
  ticks of the daemon's whole tick (the world already at its instant) and of its phases: observe
  (metrics source, pool states, prices: each call still answered by the world), decide (the
  decision function, with the history and overrides it reads), act (provider ``scale`` calls),
  record (every other call on the decision log's recorder); ``scrape_s`` renders ``/metrics`` once
  per tick, ``metrics_bytes`` is its size; ``tick_cpu_s`` is the CPU seconds the process spent in
  the tick (on a machine shared with other work, wall seconds also count the waits for a core);
- ``bytes_per_decision``: growth of the database (SQLite: the file's pages; PostgreSQL: the
  tables with their indexes and TOAST) over the measured ticks, divided by the decisions recorded;
- ``rss_mb``: resident memory at the end of the run; ``rss_growth_mb``: its growth over the last
  half of the measured ticks (flat is ~0);
- ``world_mb``: what the simulated world adds to a process that has loaded the daemon's modules,
  measured in a process of its own: its modules (numpy among them, which the daemon does not
  load) and the world built for the same config, before any tick. ``daemon_rss_mb`` is
  ``rss_mb - world_mb``: the daemon's own memory as the cluster's stand-in leaves it, an upper
  bound (what the world grows as it runs, pods, nodes and scrapes, is still counted in it).

``machine_probe_ms`` (once per invocation, beside the runs) is the least of seven timings of a
fixed pure-Python workload (:func:`machine_probe`): the figures above depend on the machine, so
two runs compare only where their probes are close.

With ``--shards`` it also runs 10,000 models across 10 replicas (100 buckets, each replica acting
on its share of 10, as ``leader_election.buckets`` settles them; one database, one simulated world):
the per-tick figures are medians over every replica's ticks (each ~1,000 models), ``ready_s`` is
the first replica's start, the replicas tick one after the other in one process and ``rss_mb`` is
that process's (all ten daemons).

    python bench/control_plane.py [--models 10 100 1000] [--database sqlite|postgresql ...]
                                  [--ticks 30] [--shards [--shard-ticks 5]] [--json]

PostgreSQL: ``TIDEGATE_BENCH_PG_DSN`` (default ``host=127.0.0.1 port=5432 user=postgres``); each
run creates and drops its own database. Timing figures depend on the machine: say which when
quoting them.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

try:
    import controller  # noqa: F401 - the code under test comes from PYTHONPATH when given
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = datetime(2026, 11, 2, tzinfo=timezone.utc)
POOLS = 5
TARGETS = {"tick_s": 0.5, "rss_mb": 200.0, "bytes_per_decision": 1024.0, "ready_s": 5.0}
"""Targets at 1,000 models x 5 pools on either database (issue 13): tick under 0.5 s, RSS under
200 MB and flat, at most 1 KB per decision, ready within 5 s. The RSS target is printed under
both ``rss_mb`` (the process, simulated world included) and ``daemon_rss_mb``."""
FIELDS = ("models", "database", "world_s", "tick_s", "tick_cpu_s", "observe_s", "decide_s", "act_s", "record_s", "bytes_per_decision",
          "rss_mb", "world_mb", "daemon_rss_mb", "rss_growth_mb", "ready_s")

POLICY = """apiVersion: tidegate/v1
kind: ScalingPolicy
metadata:
  name: {name}
spec:
  model: {name}
  bounds: {{min_replicas: 1, max_replicas: 24}}
  slo: {{p99_latency_ms: 6000, queue_depth_per_replica: 4}}
  rules:
    - kind: slo-guard
      params: {{gpu_utilization_target_pct: 80}}
  behavior:
    tolerance: 0.1
    scale_up:
      stabilization_s: 0
      policies: [{{type: percent, value: 100, period_s: 15}}, {{type: replicas, value: 4, period_s: 15}}]
    scale_down:
      stabilization_s: 300
      policies: [{{type: percent, value: 50, period_s: 60}}]
  placement: {{spot_spread_min_pools: 2, allow_on_demand: true}}
  budget: {{max_cost_per_hour_usd: 400}}
  missing_data: {{on_missing: hold, max_signal_age_s: 60}}
"""


def fleet_config(n: int, workdir: Path, database_url: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The demo's world widened to ``n`` models, each with a Deployment in each of 5 pools."""
    pools = [
        {"name": "onprem-h100", "tier": "onprem", "provider": "onprem", "gpu_type": "H100", "gpus_per_node": 8,
         "max_nodes": 4 * n, "min_nodes": 0, "price_per_node_hour_usd": 16.0},
        {"name": "aws-spot-p5", "tier": "spot", "provider": "aws", "gpu_type": "H100", "gpus_per_node": 8,
         "max_nodes": 4 * n, "price_per_node_hour_usd": 30.0, "provisioning_delay_s": 120},
        {"name": "gcp-spot-a3", "tier": "spot", "provider": "gcp", "gpu_type": "H100", "gpus_per_node": 2,
         "max_nodes": 12 * n, "price_per_node_hour_usd": 7.5, "provisioning_delay_s": 90},
        {"name": "aws-od-p5", "tier": "ondemand", "provider": "aws", "gpu_type": "H100", "gpus_per_node": 8,
         "max_nodes": 4 * n, "price_per_node_hour_usd": 98.32, "provisioning_delay_s": 120},
        {"name": "gcp-od-a3", "tier": "ondemand", "provider": "gcp", "gpu_type": "H100", "gpus_per_node": 8,
         "max_nodes": 4 * n, "price_per_node_hour_usd": 88.0, "provisioning_delay_s": 120},
    ]
    assert len(pools) == POOLS
    policies = workdir / "policies"
    policies.mkdir(exist_ok=True)
    models = []
    for i in range(n):
        name = f"m{i:05d}"
        models.append({
            "name": name, "tp_degree": 2, "quantization": "fp8", "gpu_types": ["H100"], "cold_start_s": 60,
            "capacity": {"H100": {"output_tokens_per_s": 500, "requests_per_s": 2.0}},
            "deployments": {p["name"]: {"namespace": "llm", "name": f"{name}-{p['name']}"} for p in pools}})
        (policies / f"{name}.yaml").write_text(POLICY.format(name=name))
    cfg: dict[str, Any] = {
        "apiVersion": "tidegate/v1", "kind": "DaemonConfig", "policies_dir": str(policies), "dry_run": False,
        "database": {"url": database_url}, "api": {"host": "127.0.0.1", "port": 0},
        "loop": {"interval_s": 5},
        "providers": {"type": "simulated", "seed": 7, "base_requests_per_s": 3, "peak_requests_per_s": 26,
                      "period_s": 3600, "interruptions_per_node_hour": 0.2, "initial_onprem_replicas": 2},
        "pools": pools, "models": models, "leader_election": {"backend": "none"},
    }
    cfg.update(extra or {})
    return cfg


# --- databases ----------------------------------------------------------------------------------


@contextmanager
def database(kind: str, workdir: Path) -> Iterator[tuple[str, Callable[[], int]]]:
    """A fresh database: ``(url, size_bytes)``."""
    if kind == "sqlite":
        path = workdir / "tidegate.db"

        def sqlite_size() -> int:
            import sqlite3

            with sqlite3.connect(path) as c:
                c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                (pages,), (page,), (free,) = (c.execute(f"PRAGMA {p}").fetchone()
                                              for p in ("page_count", "page_size", "freelist_count"))
            return int((pages - free) * page)

        yield f"sqlite:///{path}", sqlite_size
        return
    import psycopg

    dsn = os.environ.get("TIDEGATE_BENCH_PG_DSN", "host=127.0.0.1 port=5432 user=postgres connect_timeout=3")
    name = f"tg_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"{dsn} dbname=postgres", autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    params = dict(p.split("=", 1) for p in dsn.split())
    url = (f"postgresql+psycopg://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}:"
           f"{params.get('port', '5432')}/{name}")

    def pg_size() -> int:
        with psycopg.connect(f"{dsn} dbname={name}", autocommit=True) as c:
            row = c.execute("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                            "JOIN pg_namespace n ON n.oid = c.relnamespace "
                            "WHERE n.nspname = 'public' AND c.relkind = 'r'").fetchone()
        return int(row[0]) if row else 0

    try:
        yield url, pg_size
    finally:
        with psycopg.connect(f"{dsn} dbname=postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


# --- phase timing ---------------------------------------------------------------------------------


class Phases:
    """Seconds spent per phase within the current tick."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def reset(self) -> dict[str, float]:
        out, self.spent = self.spent, {}
        return out

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[phase] = self.spent.get(phase, 0.0) + time.perf_counter() - start
        return wrapper


class TimedRecorder:
    """The controller's recorder with each call timed: reads of history and overrides are the
    decide phase's inputs, every other call is recording."""

    def __init__(self, inner: Any, phases: Phases) -> None:
        self._inner = inner
        self._phases = phases

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr
        return self._phases.timed("decide" if name in ("history", "histories", "overrides") else "record", attr)


class TimedProvider:
    def __init__(self, inner: Any, phases: Phases) -> None:
        self._inner = inner
        self._phases = phases

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        return self._phases.timed("act", attr) if name == "scale" else attr


def instrument(daemon: Any) -> Phases:
    phases = Phases()
    ctl = daemon.controller
    ctl.observe = phases.timed("observe", ctl.observe)
    ctl.decide = phases.timed("decide", ctl.decide)
    ctl.recorder = TimedRecorder(ctl.recorder, phases)
    ctl.pool_providers = {k: TimedProvider(v, phases) for k, v in ctl.pool_providers.items()}
    return phases


# --- one run ----------------------------------------------------------------------------------------


class FixedShare:
    """A ``ShardElector`` holding this replica's share of the buckets among fixed members: what the
    Lease elector (``providers.leader.KubernetesBucketElector``) settles on, without its Lease
    traffic (not measured here; ``tests/integration/test_shards.py`` shows the Leases)."""

    def __init__(self, identity: str, members: list[str], buckets: int) -> None:
        from controller.shards import target_buckets

        self.identity, self.buckets, self.check_error = identity, buckets, None
        self._held = target_buckets(identity, members, buckets)

    def acquire_buckets(self) -> frozenset[int]:
        return self._held

    def release(self) -> None:
        return None


def shard_replicas(first: Any, replicas: int) -> list[Any]:
    """``replicas`` daemons on ``first``'s database and simulated world (one world: the models are
    the same), each acting on its share of ``10 * replicas`` buckets."""
    from controller.daemon import Daemon
    from controller.db.repo import Repository

    members = [f"replica-{i}" for i in range(replicas)]
    first.elector = FixedShare(members[0], members, 10 * replicas)
    out = [first]
    for who in members[1:]:
        out.append(Daemon(first.config, clock=first.clock, metrics_source=first.metrics_source,
                          pool_providers=first.pool_providers, price_source=first.price_source,
                          repo=Repository(first.config.database.url), registry=first.registry,
                          elector=FixedShare(who, members, 10 * replicas)))
    return out


def _time_world_build() -> list[float]:
    """Seconds ``build_runtime`` spends building the simulated world (filled when it is built):
    the world's construction is part of ``ready_s`` and said apart."""
    import providers.sim as sim

    spent: list[float] = []
    build = sim.World

    class TimedWorld(build):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            t = time.perf_counter()
            super().__init__(*args, **kwargs)
            spent.append(time.perf_counter() - t)

    sim.World = TimedWorld  # type: ignore[misc]
    return spent


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 4) if values else 0.0


def run_one(n: int, db: str, ticks: int, replicas: int = 1) -> dict[str, Any]:
    """One fleet of ``n`` models on ``db``; with ``replicas`` > 1, the models are sharded over that
    many daemons (``leader_election.buckets``) and the figures are one replica's."""
    from controller.config import DaemonConfig
    from controller.runtime import build_runtime
    from providers.clock import ManualClock

    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp, database(db, Path(tmp)) as (url, size):
        clock = ManualClock(T0)
        # validated as `tidegate run` loads its file: the raw mapping is not kept (1.4 MB at 1,000 models, tracemalloc)
        cfg = DaemonConfig.model_validate(fleet_config(n, Path(tmp), url))
        built = _time_world_build()
        started = time.perf_counter()
        runtimes = [build_runtime(cfg, clock=clock, environ={})]
        daemons = [runtimes[0].daemon]
        world = getattr(daemons[0].metrics_source, "world", None)
        if replicas > 1:
            daemons = shard_replicas(daemons[0], replicas)
        daemons[0].reload_policies()
        interval = daemons[0].config.loop.interval_s
        ready_s = None
        for _ in range(20):  # the first replica's start: a pod starts alone
            clock.advance(interval)
            daemons[0].tick()
            if daemons[0].readiness()[0]:
                ready_s = time.perf_counter() - started
                break
        if ready_s is None:
            raise SystemExit(f"{n} models on {db}: not ready after 20 ticks: {daemons[0].readiness()[1]['reasons']}"[:2000])
        for d in daemons[1:]:
            d.reload_policies()
        phases = [instrument(d) for d in daemons]
        for _ in range(3):  # warm-up: the first scale-ups, caches
            clock.advance(interval)
            for d in daemons:
                d.tick()
        per_tick: dict[str, list[float]] = {k: [] for k in ("world", "tick", "tick_cpu", "observe", "decide", "act",
                                                             "record", "scrape")}
        rss: list[float] = []
        size0, decisions = size(), 0
        metrics_bytes = 0
        for _ in range(ticks):
            clock.advance(interval)
            if world is not None:  # the cluster's time, not the daemon's (see the module doc)
                t = time.perf_counter()
                with world.lock:
                    world.advance(clock.now())
                per_tick["world"].append(time.perf_counter() - t)
            for d, ph in zip(daemons, phases):
                ph.reset()
                t, cpu = time.perf_counter(), time.process_time()
                report = d.tick()
                per_tick["tick"].append(time.perf_counter() - t)
                per_tick["tick_cpu"].append(time.process_time() - cpu)
                spent = ph.reset()
                for k in ("observe", "decide", "act", "record"):
                    per_tick[k].append(spent.get(k, 0.0))
                decisions += len(report.decisions)
                t = time.perf_counter()
                metrics_bytes = len(d.metrics.render())
                per_tick["scrape"].append(time.perf_counter() - t)
            rss.append(rss_mb())
        grown = size() - size0
        for rt in runtimes:
            rt.stop()
        for d in daemons[1:]:
            d.repo.close()
    half = len(rss) // 2
    return {
        "models": n, "database": db, "replicas": replicas,
        **{f"{k}_s": _median(v) for k, v in per_tick.items()},
        "bytes_per_decision": round(grown / decisions) if decisions else None,
        "rss_mb": round(rss[-1], 1), "rss_growth_mb": round(rss[-1] - rss[half], 1),
        "ready_s": round(ready_s, 2), "world_build_s": round(built[0], 2) if built else None,
        "metrics_bytes": metrics_bytes, "ticks": ticks,
    }


def world_mb(n: int) -> float:
    """In this (fresh) process: RSS added by the simulated world's modules and by building the
    world of ``fleet_config(n)``, after the daemon's own modules are loaded."""
    import controller.daemon  # noqa: F401 - the daemon's modules first: not the world's
    import controller.runtime  # noqa: F401
    from controller.config import DaemonConfig
    from providers.clock import ManualClock

    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp:
        cfg = DaemonConfig.model_validate(fleet_config(n, Path(tmp), f"sqlite:///{tmp}/unused.db"))
        before = rss_mb()
        from providers.sim import build_simulated_providers

        world = build_simulated_providers(cfg, ManualClock(T0))
        after = rss_mb()
        del world
    return after - before


def _in_subprocess(n: int, db: str, ticks: int, replicas: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--one", str(n), db, str(ticks), str(replicas)],
                          capture_output=True, text=True, env=os.environ.copy())
    if proc.returncode != 0:
        raise SystemExit(f"run of {n} models on {db} failed:\n{proc.stderr[-3000:]}{proc.stdout[-500:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    world = subprocess.run([sys.executable, __file__, "--world", str(n)], capture_output=True, text=True,
                           env=os.environ.copy(), check=True)
    result["world_mb"] = round(float(world.stdout.strip().splitlines()[-1]), 1)
    result["daemon_rss_mb"] = round(result["rss_mb"] - result["world_mb"], 1)
    return result


def machine_probe() -> float:
    """Milliseconds, the least of seven timings, of a fixed pure-Python workload (building,
    hashing, sorting and formatting 60,000 small tuples): a yardstick of the machine, not of
    tidegate, printed beside the figures so runs on different machines are not compared as if
    the code had changed. On the same machine it varies by about 10 % between invocations."""
    def once() -> float:
        gc.collect()
        t0 = time.perf_counter()
        rows = [(i % 97, f"model-{i:05d}", i * 0.5) for i in range(60_000)]
        index = {r[1]: r for r in rows}
        ordered = sorted(rows, key=lambda r: (r[0], -r[2]))
        text = ",".join(f"{k}={v[2]:.1f}" for k, v in index.items() if v[0] % 3 == 0)
        assert len(ordered) == len(rows) and text
        return (time.perf_counter() - t0) * 1000.0
    return round(min(once() for _ in range(7)), 1)


def _table(runs: list[dict[str, Any]]) -> str:
    cols = ("models", "database", "replicas", "world_s", "tick_s", "tick_cpu_s", "observe_s", "decide_s", "act_s", "record_s", "scrape_s",
            "bytes_per_decision", "rss_mb", "world_mb", "daemon_rss_mb", "rss_growth_mb", "ready_s", "world_build_s")
    rows = [[str(r.get(c)) for c in cols] for r in runs]
    rows.append(["target", "(1,000 models)", "", "", f"<{TARGETS['tick_s']}", "", "", "", "", "", "",
                 f"<={TARGETS['bytes_per_decision']:.0f}", f"<{TARGETS['rss_mb']:.0f}", "", f"<{TARGETS['rss_mb']:.0f}",
                 "~0 (flat)",
                 f"<{TARGETS['ready_s']}", ""])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--one"]:
        n, db, ticks, replicas = int(argv[1]), argv[2], int(argv[3]), int(argv[4])
        print(json.dumps(run_one(n, db, ticks, replicas)))
        return 0
    if argv[:1] == ["--world"]:
        print(world_mb(int(argv[1])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, nargs="+", default=[10, 100, 1000], help="fleet sizes (models x 5 pools)")
    ap.add_argument("--database", choices=("sqlite", "postgresql"), nargs="+", default=["sqlite"])
    ap.add_argument("--ticks", type=int, default=30, help="measured ticks per run (after readiness and 3 warm-up ticks)")
    ap.add_argument("--shards", action="store_true", help="also 10,000 models across 10 replicas")
    ap.add_argument("--shard-ticks", type=int, default=5, help="measured ticks per replica of the --shards run")
    ap.add_argument("--shard-models", type=int, default=10_000, help="models of the --shards run (over 10 replicas)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    runs = []
    for db in args.database:
        for n in args.models:
            runs.append(_in_subprocess(n, db, args.ticks, 1))
            if not args.json:
                print(f"  {n} models on {db}: tick {runs[-1]['tick_s']} s", file=sys.stderr)
        if args.shards:
            runs.append(_in_subprocess(args.shard_models, db, args.shard_ticks, 10))
    probe = machine_probe()
    if args.json:
        print(json.dumps({"runs": runs, "targets": TARGETS, "machine_probe_ms": probe}))
    else:
        print(_table(runs))
        print(f"machine probe: {probe} ms (a fixed pure-Python workload; compare runs only where it is close)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
