"""``tidegate``: the command line.

    tidegate run --config FILE [--dry-run]     the daemon
    tidegate demo [--duration-s N] [--port P]  the daemon on the embedded default (simulated fleet)
    tidegate policy validate PATH...           check policy files, each path on its own (exit 1 on any problem)
    tidegate policy schema                     JSON Schema of policy files
    tidegate config validate FILE [--connect]  check a daemon config (and reach its database, Prometheus)
    tidegate config schema                     JSON Schema of the daemon config
    tidegate db upgrade (--config FILE | --url URL)
    tidegate decisions (--config FILE | --url URL) [--model M] [--limit N] [--rollups] [--json]
    tidegate simulate ...                      replay traces (see ``tidegate simulate --help``)
    tidegate status | why | override | pause | resume | policies | replay | report
                                               a running daemon (controller.live)
    tidegate completion bash|zsh               shell completion script
    tidegate import (hpa|keda) FILE|- [--object]  print the policy equivalent to an HPA or a KEDA ScaledObject

A mistake a person can fix (a busy port, a missing folder, a bad database URL...) is one line on
stderr, ``tidegate: error: WHAT (WHERE); FIX``, and a non-zero exit; ``tidegate --debug ...`` also
prints the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Sequence

from controller import __version__
from controller.errors import UserError


def _db_url(args: argparse.Namespace) -> tuple[str, str]:
    """The database URL a command was given and where it came from (for error lines)."""
    if getattr(args, "url", None):
        return str(args.url), "--url"
    from controller.runtime import load_config

    cfg = load_config(Path(args.config))
    source = "TIDEGATE_DATABASE_URL" if os.environ.get("TIDEGATE_DATABASE_URL") else f"database.url in {args.config}"
    return cfg.database.url, source


def _in_file(path: str, e: UserError) -> UserError:
    """``e`` with each line naming the config file it is about (unless it already does)."""
    lines = [ln if ln.startswith(f"{path}:") else f"{path}: {ln}" for ln in str(e).splitlines()]
    out = UserError("\n".join(lines))
    out.exit_code = e.exit_code
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from controller import logs
    from controller.runtime import build_runtime, load_config

    logs.setup(args.log_format, "DEBUG" if args.debug else args.log_level)
    try:
        cfg = load_config(Path(args.config))
        rt = build_runtime(cfg, dry_run=True if args.dry_run else None)
    except UserError as e:
        raise _in_file(args.config, e) from e
    if rt.auth.empty:
        logging.getLogger("tidegate").warning("no API tokens configured: every /v1 route will answer 401")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if cfg.api.enabled:
        try:
            rt.serve_api(cfg.api.host, cfg.api.port)
        except UserError as e:
            rt.stop()
            raise _in_file(args.config, e) from e
    rt.daemon.start()
    stop.wait()
    rt.stop()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from controller.demo import run_demo

    return run_demo(duration_s=args.duration_s, port=args.port, workdir=Path(args.workdir),
                    speedup=args.speedup, quiet=args.quiet)


def cmd_policy_validate(args: argparse.Namespace) -> int:
    from controller.policyfile import load_policy_files, validate_files
    from policies.base import Registry

    registry = Registry.from_entry_points()
    if not args.json:
        return validate_files([Path(p) for p in args.files], registry, sys.stdout)
    paths = []
    for arg in args.files:
        result = load_policy_files(Path(arg), registry)
        paths.append({"path": arg, "ok": not result.errors, "errors": [e.to_dict() for e in result.errors],
                      "models": {m: p.version for m, p in sorted(result.policies.items())}})
    print(json.dumps({"ok": all(p["ok"] for p in paths), "paths": paths}, indent=2))
    return 0 if all(p["ok"] for p in paths) else 1


def cmd_policy_schema(args: argparse.Namespace) -> int:
    from controller.policyfile import json_schema
    from policies.base import Registry

    print(json.dumps(json_schema(Registry.from_entry_points()), indent=2))
    return 0


def cmd_config_validate(args: argparse.Namespace) -> int:
    from controller.runtime import ConfigError, load_config, policy_problems, preflight

    try:
        cfg = load_config(Path(args.file))
        problems = preflight(cfg, connect=args.connect) + policy_problems(cfg)
    except ConfigError as e:
        problems = str(e).splitlines()
    if args.json:
        print(json.dumps({"file": args.file, "ok": not problems, "connected": bool(args.connect and not problems),
                          "problems": problems}, indent=2))
        return 1 if problems else 0
    if problems:
        found = UserError("\n".join(problems))
        found.exit_code = 1
        raise _in_file(args.file, found)
    print(f"{args.file}: ok" + (" (database and Prometheus answer)" if args.connect else ""))
    return 0


def cmd_config_schema(args: argparse.Namespace) -> int:
    from controller.config import DaemonConfig

    print(json.dumps(DaemonConfig.model_json_schema(), indent=2))
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from controller.db.migrate import upgrade
    from controller.db.preflight import DatabaseError, database_errors, shown, url_problem

    url, source = _db_url(args)
    problem = url_problem(url, source)
    if problem is not None:
        raise DatabaseError(problem)
    with database_errors(url, source):
        upgrade(url)
    print(f"database at head: {shown(url)}")
    return 0


def cmd_decisions(args: argparse.Namespace) -> int:
    from controller.db.preflight import database_errors, open_log

    url, source = _db_url(args)
    repo = open_log(url, source)
    try:
        with database_errors(url, source):
            if args.rollups:
                return _print_rollups(repo.list_rollups(model=args.model, limit=args.limit or 1000), args)
            rows = list(repo.all_decisions(model=args.model, limit=args.limit or None))
            rolled = repo.list_rollups(model=args.model, limit=1)
    finally:
        repo.close()
    if rolled and not args.json:
        print(f"(decisions before {rolled[0]['until']} are kept as hourly rollups: add --rollups)")
    if args.json:
        json.dump(rows, sys.stdout, indent=None if args.compact else 2, default=str)
        print()
        return 0
    pools = sorted({p for r in rows for p in r["placement"]})
    head = f"{'id':>6} {'at':<25} {'model':<16} {'cur':>4} {'new':>4} " + " ".join(f"{p[:14]:>14}" for p in pools) + "  reason"
    print(head)
    for r in rows:
        cells = " ".join(f"{r['placement'].get(p, 0):>14}" for p in pools)
        print(f"{r['id']:>6} {r['at'][:25]:<25} {r['model'][:16]:<16} {r['current_replicas']:>4} {r['replicas']:>4} {cells}  {r['reason']}")
    return 0


def _print_rollups(rows: list[dict[str, Any]], args: argparse.Namespace) -> int:
    """Hourly rollups of decisions older than the retention period, newest first."""
    if args.json:
        json.dump(rows, sys.stdout, indent=None if args.compact else 2, default=str)
        print()
        return 0
    print(f"{'hour':<25} {'model':<16} {'n':>5} {'min':>4} {'max':>4} {'last':>4} {'$/h mean':>9}  reasons")
    for r in rows:
        reasons = ",".join(f"{k}={n}" for k, n in r["reasons"].items())
        rep = r["replicas"]
        print(f"{r['hour'][:25]:<25} {r['model'][:16]:<16} {r['decisions']:>5} {rep['min']:>4} {rep['max']:>4} "
              f"{rep['last']:>4} {r['cost_per_hour_mean_usd']:>9.2f}  {reasons}")
    return 0


def cmd_simulate(argv: Sequence[str]) -> int:
    from controller.sim import missing_extras

    missing = missing_extras()
    if missing:  # the daemon's install leaves the simulator's libraries out
        print(f"tidegate: error: tidegate simulate needs {', '.join(missing)}, which this install lacks; "
              f"install the simulator's extra: pip install 'tidegate[sim]'", file=sys.stderr)
        return 2
    from controller.sim.cli import simulate_main

    return simulate_main(list(argv))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tidegate", description="Autoscaling and cost control for LLM inference.")
    p.add_argument("--version", action="version", version=f"tidegate {__version__}")
    p.add_argument("--debug", action="store_true",
                   help="show the traceback behind an error; `run` also logs at DEBUG (HTTP requests included)")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", required=True, help="daemon config YAML")
    run.add_argument("--dry-run", action="store_true", help="decide and record, never act")
    run.add_argument("--log-format", choices=["json", "text"], default="json")
    run.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                     help="INFO by default; HTTP client libraries log their requests only at DEBUG")
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="run the daemon on the embedded default: simulated fleet, SQLite")
    demo.add_argument("--duration-s", type=float, default=120, help="wall seconds to run (default 120)")
    demo.add_argument("--speedup", type=float, default=None, help="simulated seconds per wall second (default from the demo config: 60)")
    demo.add_argument("--port", type=int, default=8080,
                      help="admin API port on 127.0.0.1 (default 8080; when it is taken the demo picks a free one and says which; 0: any free port)")
    demo.add_argument("--workdir", default=".tidegate/demo", help="where the demo's SQLite database goes")
    demo.add_argument("--quiet", action="store_true", help="print only the summary")
    demo.set_defaults(func=cmd_demo)

    pol = sub.add_parser("policy", help="policy files").add_subparsers(dest="policy_command", required=True)
    pv = pol.add_parser("validate", help="validate policy files")
    pv.add_argument("files", nargs="+", metavar="PATH", help="policy files or directories, each checked on its own")
    pv.add_argument("--json", action="store_true", help="print {ok, paths: [{path, ok, errors, models}]}")
    pv.set_defaults(func=cmd_policy_validate)
    pol.add_parser("schema", help="print the JSON Schema").set_defaults(func=cmd_policy_schema)

    cfg = sub.add_parser("config", help="daemon config").add_subparsers(dest="config_command", required=True)
    cv = cfg.add_parser("validate", help="validate a daemon config file")
    cv.add_argument("file")
    cv.add_argument("--connect", action="store_true", help="also connect to the database and query Prometheus")
    cv.add_argument("--json", action="store_true", help="print {file, ok, connected, problems}")
    cv.set_defaults(func=cmd_config_validate)
    cfg.add_parser("schema", help="print the JSON Schema").set_defaults(func=cmd_config_schema)

    db = sub.add_parser("db", help="database").add_subparsers(dest="db_command", required=True)
    up = db.add_parser("upgrade", help="run Alembic migrations to head")
    g = up.add_mutually_exclusive_group(required=True)
    g.add_argument("--config")
    g.add_argument("--url")
    up.set_defaults(func=cmd_db_upgrade)

    dec = sub.add_parser("decisions", help="print the decision log")
    g = dec.add_mutually_exclusive_group(required=True)
    g.add_argument("--config")
    g.add_argument("--url")
    dec.add_argument("--model")
    dec.add_argument("--limit", type=_positive_int, default=0, help="only the newest N (only those are read)")
    dec.add_argument("--json", action="store_true")
    dec.add_argument("--compact", action="store_true", help="with --json: one line")
    dec.add_argument("--rollups", action="store_true",
                     help="the hourly rollups of decisions older than database.retention.full_days instead")
    dec.set_defaults(func=cmd_decisions)

    sub.add_parser("simulate", help="replay traces through policies and baselines", add_help=False)

    from controller.live import add_commands  # the commands over a running daemon's admin API

    add_commands(sub)
    comp = sub.add_parser("completion", help="print a shell completion script: eval \"$(tidegate completion bash)\"")
    comp.add_argument("shell", choices=["bash", "zsh"])
    comp.set_defaults(func=cmd_completion)
    imp = sub.add_parser("import", help="print the policy equivalent to an HPA or a KEDA ScaledObject")
    imp.add_argument("source", choices=["hpa", "keda"], help="hpa: autoscaling/v2 HorizontalPodAutoscaler; keda: keda.sh/v1alpha1 ScaledObject")
    imp.add_argument("file", help="the manifest (YAML), or - for stdin")
    imp.add_argument("--object", action="store_true", help="print a tidegate.dev/v1alpha1 ScalingPolicy object (kubectl apply) instead of a policy file")
    imp.set_defaults(func=cmd_import)
    return p


def cmd_completion(args: argparse.Namespace) -> int:
    from controller.completion import script

    print(script(build_parser(), args.shell))
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text}")
    return value


def cmd_import(args: argparse.Namespace) -> int:
    from controller.importer import IMPORTERS

    if args.file == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        try:
            text, source = Path(args.file).read_text(encoding="utf-8"), args.file
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read {args.file}: {getattr(e, 'strerror', None) or e}; give a readable YAML file or -") from None
    sys.stdout.write(IMPORTERS[args.source](text, source, as_object=args.object))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = bool(argv) and argv[0] == "--debug"
    if argv[debug:debug + 1] == ["simulate"]:
        return cmd_simulate(argv[debug + 1:])
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except UserError as e:
        if args.debug:
            traceback.print_exc()
        for line in str(e).splitlines():
            print(f"tidegate: error: {line}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
