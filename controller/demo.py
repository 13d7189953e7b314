"""``tidegate demo``: the real daemon on the embedded default.

SQLite in a work directory, the simulated fleet (an on-prem pool, two spot pools, one on-demand
pool) on an accelerated clock, the admin API on 127.0.0.1. It prints each change of placement as it
happens and, at the end, checks the decision log for the story the product promises.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import shutil
import sys
import threading
from importlib import resources
from pathlib import Path
from typing import TextIO

from controller.analysis import all_ok, check_story
from controller.core.model import Decision, ModelSignals
from controller.errors import UserError
from controller.runtime import AddressUnavailable, build_runtime, load_config


def demo_config_path() -> Path:
    return Path(str(resources.files("controller") / "demo_assets" / "config.yaml"))


def tidegate_command() -> str:
    """How a shell runs this installation's ``tidegate``, for hints printed to copy: the bare name
    when the PATH finds this very script, else the console script's full path beside this Python
    (``make demo`` runs ``.venv/bin/tidegate``, which is not on the PATH), else ``python -m``."""
    script = Path(sys.executable).parent / "tidegate"  # not resolved: a venv's python is a symlink
    if script.is_file():
        on_path = shutil.which("tidegate")
        if on_path is not None and Path(on_path).resolve() == script.resolve():
            return "tidegate"
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m controller.cli"


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def run_demo(*, duration_s: float = 120, port: int = 8080, workdir: Path = Path(".tidegate/demo"),
             speedup: float | None = None, quiet: bool = False, out: TextIO = sys.stdout) -> int:
    from controller import logs

    # the demo prints its own table; structured logs only for warnings and errors
    logs.setup("text", "WARNING")
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    workdir = workdir.resolve()
    try:
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"cannot prepare the demo's work folder {workdir}: {e.strerror or e}; "
                        "pass --workdir with a folder this user may create") from e
    cfg = load_config(demo_config_path())
    updates = {"database": cfg.database.model_copy(update={"url": f"sqlite:///{workdir / 'demo.db'}"}),
               "api": cfg.api.model_copy(update={"port": port})}
    if speedup is not None:
        updates["providers"] = cfg.providers.model_copy(update={"speedup": speedup})
    cfg = cfg.model_copy(update=updates)

    environ = dict(os.environ)
    admin = environ.get("TIDEGATE_ADMIN_TOKENS") or f"demo-admin:{secrets.token_urlsafe(12)}"
    viewer = environ.get("TIDEGATE_VIEWER_TOKENS") or f"demo-viewer:{secrets.token_urlsafe(12)}"
    environ.update(TIDEGATE_ADMIN_TOKENS=admin, TIDEGATE_VIEWER_TOKENS=viewer)

    rt = build_runtime(cfg, environ=environ)
    daemon = rt.daemon
    sim = rt.extras["sim"]
    model_name = next(iter(daemon.models))
    pool_names = list(daemon.models[model_name].pools)
    print_lock = threading.Lock()

    def show(d: Decision, sig: ModelSignals) -> None:
        if quiet or not (d.changed or d.stage("placement") is None):
            return
        rps = sig.request_rate_per_s.value
        cells = " ".join(f"{d.placement.get(p, 0):>{max(len(p), 3)}}" for p in pool_names)
        with print_lock:
            print(f"{d.at:%H:%M:%S} {_fmt(rps, '6.1f')} {_fmt(sig.queue_depth.value, '6.0f')} "
                  f"{_fmt(sig.p99_latency_ms.value, '8.0f')} {d.current_replicas:>4}->{d.replicas:<4} {cells} "
                  f"{d.cost_per_hour_usd:8.1f}  {d.reason}", file=out, flush=True)

    daemon.on_decision = show
    try:
        rt.serve_api(cfg.api.host, port)
    except AddressUnavailable as e:
        if not e.in_use:
            rt.stop()
            raise
        rt.serve_api(cfg.api.host, 0)  # the demo runs anyway, on a free port, and says which
        print(f"port {port} is in use on {cfg.api.host}; the admin API listens on port {rt.api_port} instead "
              "(--port, or PORT= with make demo, picks another)", file=out)
    base = f"http://{cfg.api.host}:{rt.api_port}"
    print(f"tidegate demo: simulated fleet at {cfg.providers.speedup:g}x "  # type: ignore[union-attr]
          f"(one wall second = {cfg.providers.speedup:g} simulated s), database {workdir / 'demo.db'}", file=out)  # type: ignore[union-attr]
    print(f"admin API {base}  (admin token: {admin.split(':', 1)[-1]}, viewer token: {viewer.split(':', 1)[-1]})", file=out)
    print(f"  try: curl -H 'Authorization: Bearer {viewer.split(':', 1)[-1]}' {base}/v1/status", file=out)
    if not quiet:
        print(f"{'sim time':<8} {'req/s':>6} {'queue':>6} {'p99 ms':>8} {'replicas':<10} "
              + " ".join(f"{p:>{max(len(p), 3)}}" for p in pool_names) + f" {'$/h':>8}  reason", file=out)
    daemon.start()  # every loop.interval_s of the accelerated clock: interval_s / speedup wall seconds
    stop = threading.Event()
    try:
        stop.wait(duration_s)
    except KeyboardInterrupt:
        pass
    finally:
        rt.stop()

    rows = list(daemon.repo.all_decisions(model=model_name))
    policy = daemon.policy_store.policies()[model_name]
    findings = check_story(rows, model=daemon.models[model_name], pools=daemon.pools,
                           max_replicas=policy.spec.bounds.max_replicas,
                           max_cost_per_hour_usd=policy.spec.budget.max_cost_per_hour_usd)
    print(f"\n{len(rows)} decisions recorded in {workdir / 'demo.db'}; what the decision log shows:", file=out)
    for f in findings:
        print(f"  [{'ok' if f.ok else 'NO'}] {f.check}: {f.detail}", file=out)
    url = shlex.quote(f"sqlite:///{workdir / 'demo.db'}")
    print(f"inspect: {tidegate_command()} decisions --url {url} --json", file=out)
    del sim
    return 0 if all_ok(findings) else 1
