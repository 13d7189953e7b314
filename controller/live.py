"""The live commands: ``tidegate status | why | override | pause | resume | policies | replay``
over a running daemon's admin API (``controller.client``); ``replay`` can also read a decision log
directly (``--database URL --config FILE``).

Each prints tables for people (rich) or, with ``--json``, the API's JSON as it came (``status``
and ``why`` add what they computed: signal ages, cost per million tokens, conditions); the exit
statuses are ``controller.client.EXIT_CODES``.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from controller.client import EXIT_CODES, Api, resolve
from controller.errors import UserError
from controller.timespec import parse_duration_s, parse_when

def duration_s(text: str) -> float:
    """``controller.timespec.parse_duration_s`` as an argparse type."""
    try:
        return parse_duration_s(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _console() -> Any:
    from rich.console import Console

    return Console(width=max(100, Console().width), highlight=False)


def _table(title: str, *columns: str) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left", show_edge=False)
    for c in columns:
        t.add_column(c, justify="left" if c in ("pool", "signal", "stage", "reason", "message", "kind", "model",
                                                 "scope", "condition", "why", "file", "rules", "author")
                     else "right")
    return t


def _emit(args: argparse.Namespace, data: Any, render: Callable[[Any], None]) -> int:
    if args.json:
        json.dump(data, sys.stdout, indent=2, default=str)
        print()
    else:
        render(data)
    return 0


def _api(args: argparse.Namespace) -> Api:
    return Api(resolve(args.server, args.token, args.client_config))


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


# --- status ------------------------------------------------------------------------------------

def _age_s(now: datetime, at: str | None) -> float | None:
    return None if at is None else round((now - datetime.fromisoformat(at)).total_seconds(), 1)


def _conditions(status: Mapping[str, Any], ready: Mapping[str, Any], mode: str | None, m: Mapping[str, Any]
                ) -> list[dict[str, str]]:
    """What an operator looks at first, HPA-conditions style: type, status, why."""
    out = [{"type": "Ready", "status": str(not ready.get("reasons")),
            "message": "; ".join(ready.get("reasons") or []) or "ticking"},
           {"type": "Paused", "status": str(bool(status.get("paused"))), "message": ""},
           {"type": "DryRun", "status": str(bool(status.get("dry_run"))), "message": ""},
           {"type": "Shadow", "status": str(mode == "shadow"),
            "message": "observing, deciding, never acting (tidegate report --shadow)" if mode == "shadow" else ""}]
    if m.get("degraded"):
        out.append({"type": "Degraded", "status": "True", "message": str(m["degraded"])})
    last = m.get("last_decision") or {}
    if last:
        out.append({"type": "LastDecision", "status": str(last.get("actuate")),
                    "message": f"#{last.get('id')} {last.get('reason')} at {last.get('at')}"})
    for pool, p in (m.get("pools") or {}).items():
        if p.get("available") is False:
            out.append({"type": "PoolUnavailable", "status": "True",
                        "message": f"{pool}: {p.get('unavailable_reason') or 'unavailable'}"})
    return out


def _usd_per_million_tokens(name: str, m: Mapping[str, Any]) -> float | None:
    """The cost signal of ``/v1/status``, read through the signal table's own type."""
    from controller.core.model import ModelSignals
    from controller.core.signals import model_signal_names
    from controller.db.codec import sample_from_json

    raw = m.get("signals")
    if not raw:
        return None
    known = set(model_signal_names())  # a daemon of another version may send others
    sig = ModelSignals(name, datetime.now(timezone.utc),
                       samples={k: sample_from_json(v) for k, v in raw.items() if k in known})
    return sig.cost_per_million_tokens_usd.value


def status_view(status: Mapping[str, Any], ready: Mapping[str, Any], overrides: list[Mapping[str, Any]],
                policies: Mapping[str, Any], model: str | None) -> dict[str, Any]:
    """``/v1/status`` with, per model, each signal's age, the cost per million tokens, the active
    overrides in full and the conditions."""
    now = datetime.fromisoformat(status["at"])
    models = {}
    for name, m in status["models"].items():
        if model is not None and name != model:
            continue
        signals = {s: {**v, "age_s": _age_s(now, v.get("at"))} for s, v in (m.get("signals") or {}).items()}
        models[name] = {**m, "signals": signals, "usd_per_million_tokens": _usd_per_million_tokens(name, m),
                        "overrides": [o for o in overrides if o["model"] == name],
                        "conditions": _conditions(status, ready, policies.get("models", {}).get(name, {}).get("mode"), m)}
    if model is not None and not models:
        raise UserError(f"unknown model {model!r} (known: {', '.join(sorted(status['models']))})")
    return {**status, "models": models}


def _render_status(view: Mapping[str, Any]) -> None:
    con = _console()
    flags = [w for w, on in (("PAUSED", view.get("paused")), ("dry-run", view.get("dry_run"))) if on]
    con.print(f"tidegate at {view['at']}" + (f"  [{', '.join(flags)}]" if flags else ""))
    for name, m in view["models"].items():
        con.print(f"\n[bold]{name}[/bold]  policy {m.get('policy_version') or '-'}  "
                  f"replicas {_fmt(m.get('current_replicas'))} -> {_fmt(m.get('desired_replicas'))}  "
                  f"${_fmt(m.get('cost_per_hour_usd'))}/h  ${_fmt(m.get('usd_per_million_tokens'), 3)}/M tokens")
        t = _table("pools", "pool", "tier", "desired", "ready", "current", "$/node-h")
        for pool, p in m["pools"].items():
            t.add_row(pool, p["tier"], _fmt(p["desired_replicas"]), _fmt(p["ready_replicas"]),
                      _fmt(p["current_replicas"]), _fmt(p["price_per_node_hour_usd"]))
        con.print(t)
        t = _table("signals", "signal", "value", "age s", "reason")
        for s, v in m["signals"].items():
            t.add_row(s, _fmt(v.get("value"), 3), _fmt(v.get("age_s"), 1), v.get("reason") or "")
        con.print(t)
        if m["overrides"]:
            _override_table(con, m["overrides"])
        t = _table("conditions", "condition", "status", "message")
        for c in m["conditions"]:
            t.add_row(c["type"], c["status"], c["message"])
        con.print(t)


def cmd_status(args: argparse.Namespace) -> int:
    with _api(args) as api:
        status = api.get("/v1/status")
        ready = api.call("GET", "/readyz", ok=(200, 503))
        overrides = api.get("/v1/overrides")["items"]
        policies = api.get("/v1/policies")
    return _emit(args, status_view(status, ready, overrides, policies, args.model), _render_status)


# --- why ---------------------------------------------------------------------------------------

def pool_reasons(trace: list[Mapping[str, Any]]) -> list[str]:
    """The placement stage's ``why:`` parts (``controller.core.placement.PlacementResult.why``)."""
    for st in trace:
        if st["name"] == "placement":
            return [p[len("why: "):] for p in st.get("message", "").split("; ") if p.startswith("why: ")]
    return []


def _render_why(d: Mapping[str, Any]) -> None:
    con = _console()
    con.print(f"[bold]decision #{d['id']}[/bold] {d['model']} at {d['at']}: {d['current_replicas']} -> "
              f"{d['replicas']} ({d['reason']}), ${_fmt(d['cost_per_hour_usd'])}/h, outcome {d['outcome']}, "
              f"policy {d['policy_version']}")
    t = _table("recommendations", "rule", "kind", "replicas", "reason", "message")
    for r in d.get("recommendations") or []:
        t.add_row(r.get("rule", ""), r.get("kind", ""), _fmt(r.get("replicas")), r.get("reason", ""), r.get("message", ""))
    con.print(t)
    t = _table("stages", "stage", "replicas", "reason", "message")
    for st in d["trace"]:
        msg = "; ".join(p for p in st.get("message", "").split("; ") if not p.startswith("why: "))
        t.add_row(st["name"], _fmt(st.get("replicas")), st["reason"], msg)
    con.print(t)
    t = _table("pools", "pool", "before", "after", "why")
    why = d["pool_reasons"]
    for pool in dict.fromkeys([*d["placement"], *(d.get("previous_placement") or {})]):
        lines = [w for w in why if w.startswith(pool + " ") or f" {pool}:" in w or f"before {pool}" in w]
        t.add_row(pool, _fmt((d.get("previous_placement") or {}).get(pool)), _fmt(d["placement"].get(pool)),
                  "\n".join(lines))
    con.print(t)
    for line in (w for w in why if not any(w.startswith(p + " ") for p in d["placement"])):
        con.print(f"  {line}")
    for a in d.get("actions") or []:
        con.print(f"  action: {a['provider']} {a['call']} {a['pool']} {a['arguments']} {a['status']}"
                  + (f" ({a['error']})" if a.get("error") else ""))


def cmd_why(args: argparse.Namespace) -> int:
    with _api(args) as api:
        decision_id = args.decision_id
        if decision_id is None:
            items = api.get("/v1/decisions", model=args.model, limit=1)["items"]
            if not items:
                raise UserError("no decision recorded yet" + (f" for {args.model}" if args.model else ""))
            decision_id = items[0]["id"]
        d = api.get(f"/v1/decisions/{decision_id}")
    d["pool_reasons"] = pool_reasons(d["trace"])
    return _emit(args, d, _render_why)


# --- overrides, pause, resume, policies ----------------------------------------------------------

def _override_table(con: Any, items: list[Mapping[str, Any]]) -> None:
    t = _table("overrides", "id", "kind", "model", "scope", "value", "expires", "author", "reason")
    for o in items:
        value = (o["replicas"] if o["kind"] == "pin" else
                 f"{_fmt(o['min_replicas'])}..{_fmt(o['max_replicas'])}" if o["kind"] == "bounds" else "")
        t.add_row(str(o["id"]), o["kind"], o["model"], o.get("pool") or "(model)", str(value),
                  o.get("expires_at") or "never", o.get("author", ""), o.get("reason", ""))
    con.print(t)


def override_body(args: argparse.Namespace) -> dict[str, Any]:
    """The ``POST /v1/overrides`` body of ``tidegate override pin|min|max|freeze|drain``."""
    kind = {"pin": "pin", "min": "bounds", "max": "bounds", "freeze": "freeze", "drain": "drain-pool"}[args.action]
    body: dict[str, Any] = {"kind": kind, "model": args.model, "reason": args.reason}
    if args.action == "pin":
        body["replicas"] = args.replicas
    elif args.action in ("min", "max"):
        body[f"{args.action}_replicas"] = args.replicas
    if getattr(args, "pool", None):
        body["pool"] = args.pool
    if args.ttl is not None:
        body["ttl_s"] = args.ttl
    return body


def cmd_override(args: argparse.Namespace) -> int:
    with _api(args) as api:
        if args.action == "list":
            items = api.get("/v1/overrides", include_inactive=str(args.all).lower())["items"]
            return _emit(args, {"items": items}, lambda d: _override_table(_console(), d["items"]))
        if args.action == "delete":
            api.delete(f"/v1/overrides/{args.id}")
            return _emit(args, {"deleted": args.id}, lambda d: print(f"override {d['deleted']} deleted"))
        ov = api.post("/v1/overrides", override_body(args))
    return _emit(args, ov, lambda o: _override_table(_console(), [o]))


def cmd_pause(args: argparse.Namespace) -> int:
    with _api(args) as api:
        out = api.post(f"/v1/{args.command}", {"reason": args.reason or ""})
    word = "paused: deciding and recording, not acting" if out["paused"] else "resumed: acting again"
    return _emit(args, out, lambda _: print(word))


def _render_policies(data: Mapping[str, Any]) -> None:
    con = _console()
    t = _table("policies in force", "model", "version", "rules", "file")
    for m, p in data.get("models", {}).items():
        t.add_row(m, _fmt(p.get("version")) + (" (kept previous)" if p.get("kept_previous") else ""),
                  ", ".join(f"{r['name']}:{r['kind']}" for r in p.get("rules", [])), "\n".join(p.get("sources", [])))
    con.print(t)
    errors = [(f, e) for f, st in data.get("files", {}).items() for e in (st.get("errors") or [])]
    for f, e in errors:
        con.print(f"[red]{f}:{e.get('line') or ''}: {e.get('path') or ''}: {e.get('message')}[/red]")


def cmd_policies(args: argparse.Namespace) -> int:
    with _api(args) as api:
        data = api.get("/v1/policies")
    _emit(args, data, _render_policies)
    return 1 if any(st.get("errors") for st in data.get("files", {}).values()) else 0


# --- replay ------------------------------------------------------------------------------------

def when(text: str, now: datetime) -> datetime:
    try:
        return parse_when(text, now)
    except ValueError as e:
        raise UserError(str(e)) from None


def _replay_local(args: argparse.Namespace, text: str) -> dict[str, Any]:
    from controller.db.preflight import database_errors, open_log
    from controller.replay import run_replay
    from controller.runtime import load_config
    from policies.base import Registry

    if not args.config:
        raise UserError("--database needs --config FILE too: the daemon config names the models and pools to replay")
    cfg = load_config(Path(args.config))
    url, source = (args.database, "--database") if args.database else (cfg.database.url, f"database.url in {args.config}")
    now = datetime.now(timezone.utc)
    repo = open_log(url, source)
    try:
        with database_errors(url, source):
            return run_replay(repo, models=cfg.model_specs(), pools=cfg.pool_specs(), registry=Registry.from_entry_points(),
                              policy_file=args.policy, policy_text=text, since=when(args.since, now),
                              until=when(args.until, now), model=args.model)
    finally:
        repo.close()


def _render_replay(r: Mapping[str, Any]) -> None:
    con = _console()
    coarser = f" (coarser: {r['coarser']['hours']} h of hourly rollups)" if r["coarser"] else ""
    con.print(f"replay of {r['model']} from {r['window']['from']} to {r['window']['to']}: {r['ticks']} decisions"
              f"{coarser}, under {r['policy_file']} ({r['policy_version']})")
    t = _table("", "side", "cost $", "under capacity s", "intervals")
    for side in ("decided", "replayed"):
        v = r[side]
        t.add_row(side, _fmt(v["cost_usd"]), _fmt(v["under_capacity_s"], 0), str(len(v["under_capacity"])))
    con.print(t)
    con.print(f"capacity estimate: {r['capacity_estimate']}")
    pools = list(dict.fromkeys(p for s in r["series"] for p in s["decided"]))
    t = _table("replicas per pool (decided / replayed), where either changed", "at", *pools)
    prev = None
    for s in r["series"]:
        key = (s["decided"], s["replayed"])
        if key != prev:
            t.add_row(s["at"], *(f"{s['decided'].get(p, 0)} / {s['replayed'].get(p, 0)}" for p in pools))
        prev = key
    con.print(t)
    for run in r["replayed"]["under_capacity"]:
        con.print(f"  replayed under capacity {run['from']} .. {run['to']} ({run['seconds']:.0f} s): "
                  f"needed {_fmt(run['needed_output_tokens_per_s'], 0)} tok/s, had {_fmt(run['had_output_tokens_per_s'], 0)}")
    for d in r["first_differences"]:
        t = _table(f"first differences: decision #{d['id']} at {d['at']}", "stage", "decided", "replayed")
        for a, b in zip(d["decided"]["trace"], d["replayed"]["trace"]):
            t.add_row(a["name"], f"{_fmt(a['replicas'])} {a['reason']}", f"{_fmt(b['replicas'])} {b['reason']}")
        con.print(t)


def cmd_replay(args: argparse.Namespace) -> int:
    try:
        text = Path(args.policy).read_text()
    except OSError as e:
        raise UserError(f"--policy {args.policy}: {e.strerror}") from None
    if args.database or args.config:
        result = _replay_local(args, text)
    else:
        with _api(args) as api:
            now = datetime.fromisoformat(api.get("/v1/status")["at"])  # relative times on the daemon's clock
            body = {"from": when(args.since, now).isoformat(), "to": when(args.until, now).isoformat(),
                    "policy": text, "policy_file": args.policy, "model": args.model}
            result = api.post("/v1/replay", body)
    _emit(args, result, _render_replay)
    return 1 if result["replayed"]["under_capacity_s"] > 0 else 0


# --- shadow report -------------------------------------------------------------------------------

def _render_shadow(data: Mapping[str, Any]) -> None:
    from controller.shadow import FIELDS, sentence

    con = _console()
    if not data:
        con.print("no shadow decisions in that window: set a policy's spec.mode (or the daemon's mode) to shadow")
        return
    t = _table("shadow mode: tidegate beside the current autoscaler", "model", *FIELDS)
    for model, f in data.items():
        t.add_row(model, *(_fmt(f[k]) for k in FIELDS))
    con.print(t)
    for model, f in data.items():
        con.print(sentence(model, f), soft_wrap=True)


def cmd_report(args: argparse.Namespace) -> int:
    with _api(args) as api:
        data = api.get("/v1/shadow", since=args.since)
    _emit(args, data, _render_shadow)
    return 1 if any(f["under_capacity_s"] > 0 for f in data.values()) else 0


# --- the parser ------------------------------------------------------------------------------------

def exit_codes_text() -> str:
    return "exit status:\n" + "\n".join(f"  {k}  {v}" for k, v in EXIT_CODES.items())


def connection_options() -> argparse.ArgumentParser:
    """``--server``, ``--token``, ``--client-config``, ``--json``: shared by every live command."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("daemon")
    g.add_argument("--server", metavar="URL", help="admin API URL (else TIDEGATE_URL, else the client file)")
    g.add_argument("--token", help="bearer token (else TIDEGATE_TOKEN, else the client file); never printed")
    g.add_argument("--client-config", metavar="FILE",
                   help="YAML with server: and token: or token_file: (default ~/.config/tidegate/client.yaml)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return p


def add_commands(sub: Any) -> argparse.ArgumentParser:
    """Register the live commands on ``tidegate``'s subparsers; returns the shared options parser."""
    common = connection_options()
    kw: dict[str, Any] = {"parents": [common], "epilog": exit_codes_text(),
                          "formatter_class": argparse.RawDescriptionHelpFormatter}
    st = sub.add_parser("status", help="each model's pools, signals, cost, overrides, conditions", **kw)
    st.add_argument("--model")
    st.set_defaults(func=cmd_status)
    why = sub.add_parser("why", help="a decision's stages and why each pool got what it got", **kw)
    why.add_argument("decision_id", nargs="?", type=int, help="default: the newest decision (of --model)")
    why.add_argument("--model")
    why.set_defaults(func=cmd_why)
    ov = sub.add_parser("override", help="pin, bound, freeze or drain; list and delete", **kw)
    ovs = ov.add_subparsers(dest="action", required=True)
    for action, helptext in (("pin", "pin the replicas (of --pool, else the total)"), ("min", "a minimum"),
                             ("max", "a maximum"), ("freeze", "keep the placement as it is"),
                             ("drain", "move every replica off POOL")):
        a = ovs.add_parser(action, help=helptext, **kw)
        a.add_argument("model")
        if action == "drain":
            a.add_argument("pool")
        if action in ("pin", "min", "max"):
            a.add_argument("replicas", type=int)
        if action == "pin":
            a.add_argument("--pool")
        a.add_argument("--ttl", type=duration_s, help="expires by itself after this long (90s, 30m, 2h, 7d)")
        a.add_argument("--reason", required=True, help="why (audited)")
        a.set_defaults(func=cmd_override)
    ls = ovs.add_parser("list", help="active overrides", **kw)
    ls.add_argument("--all", action="store_true", help="also expired and deleted ones")
    ls.set_defaults(func=cmd_override)
    rm = ovs.add_parser("delete", help="delete an override", **kw)
    rm.add_argument("id", type=int)
    rm.set_defaults(func=cmd_override)
    for name, helptext in (("pause", "decide and record, act on nothing"), ("resume", "act again")):
        p = sub.add_parser(name, help=helptext, **kw)
        p.add_argument("--reason", default="", help="why (audited)")
        p.set_defaults(func=cmd_pause)
    sub.add_parser("policies", help="the policy versions in force and every file's errors (exit 1 on errors)",
                   **kw).set_defaults(func=cmd_policies)
    rp = sub.add_parser("replay", help="what another policy would have decided over a window of the decision log "
                                       "(exit 1 when it would have had less capacity than the load needed)", **kw)
    rp.add_argument("--from", dest="since", required=True, help="ISO-8601 with a timezone, or a duration ago (6h)")
    rp.add_argument("--to", dest="until", default="now", help="ISO-8601, now (default), or a duration ago")
    rp.add_argument("--policy", required=True, metavar="FILE", help="the policy file to replay under")
    rp.add_argument("--model", help="which model's policy in the file (if several)")
    rp.add_argument("--database", metavar="URL", help="read this decision log directly instead of the daemon (needs --config)")
    rp.add_argument("--config", metavar="FILE", help="the daemon config (models, pools; its database unless --database)")
    rp.set_defaults(func=cmd_replay)
    rep = sub.add_parser("report", help="--shadow: what tidegate would have cost and where it would have fallen short "
                                        "beside the current autoscaler (exit 1 if it would have had less capacity)", **kw)
    rep.add_argument("--shadow", action="store_true", required=True, help="the shadow-mode report (the only one)")
    rep.add_argument("--since", default="7d", help="a duration back from now (default 7d) or an ISO-8601 instant")
    rep.set_defaults(func=cmd_report)
    return common
