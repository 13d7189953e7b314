"""Mistakes a new user makes, through the installed ``tidegate`` console script as they would run it:
each gives one line on stderr (what, where, how to fix), a non-zero exit and no traceback; ``config
validate`` fails wherever ``run`` would; read-only commands leave the database alone; the demo runs
on a taken port and prints commands that run as printed; HTTP clients do not log each query."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import event

from controller import logs
from controller.cli import main
from controller.core.model import ModelSpec, ReplicaCapacity
from controller.db.models import DecisionRow
from controller.demo import demo_config_path
from tests.integration.exporters import LocalPrometheus, free_port
from providers.prometheus import PrometheusSettings
from tests.integration.conftest import prometheus_binary_or_skip
from tests.integration.daemon_harness import make_harness  # noqa: F401 (fixture)

BIN = Path(sys.executable).parent
TIDEGATE = shutil.which("tidegate", path=str(BIN)) or "tidegate"
ROOT = Path(__file__).resolve().parents[2]


def tidegate(*args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TIDEGATE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})


def one_error(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single error line of a failed command, checked: non-zero exit, no traceback, every
    needle (the thing named, the fix) in that line."""
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tidegate: error: ")]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def write_config(tmp: Path, **changes: Any) -> Path:
    """The demo's config with ``changes``: its policies, a SQLite file in ``tmp``, no API port clash."""
    raw = yaml.safe_load(demo_config_path().read_text())
    raw["policies_dir"] = str(demo_config_path().parent / "policies")
    raw["database"] = {"url": f"sqlite:///{tmp / 'tidegate.db'}"}
    raw["api"] = {"host": "127.0.0.1", "port": 0}
    raw.update(changes)
    path = tmp / f"config-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def real_config(tmp: Path, prometheus: dict[str, Any] | None, **changes: Any) -> Path:
    """A ``providers.type: real`` config with one on-prem pool (nothing is contacted before a tick)."""
    raw = yaml.safe_load(demo_config_path().read_text())
    onprem = raw["pools"][0]
    model = raw["models"][0]
    model["deployments"] = {onprem["name"]: model["deployments"][onprem["name"]]}
    settings: dict[str, Any] = {"kubernetes": {"host": "http://127.0.0.1:9"}}
    if prometheus is not None:
        settings["prometheus"] = prometheus
    return write_config(tmp, pools=[onprem], models=[model], providers={"type": "real", "settings": settings},
                        **changes)


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 that something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def prometheus() -> Iterator[LocalPrometheus]:
    """A real Prometheus (scraping nothing: it answers queries, which is all these tests need)."""
    with LocalPrometheus([], binary=prometheus_binary_or_skip()) as prom:
        yield prom


# --- run and config validate: the same checks, one line each ---------------------------------


def test_run_on_a_busy_api_port(tmp_path: Path, busy_port: int) -> None:
    cfg = write_config(tmp_path, api={"host": "127.0.0.1", "port": busy_port})
    one_error(tidegate("run", "--config", str(cfg)), str(cfg), f"127.0.0.1:{busy_port}", "in use", "api.port")


@pytest.mark.parametrize("command", ["run", "validate"])
def test_sqlite_database_in_a_missing_folder(tmp_path: Path, command: str) -> None:
    folder = tmp_path / "no" / "such"
    cfg = write_config(tmp_path, database={"url": f"sqlite:///{folder / 'x.db'}"})
    args = ("run", "--config", str(cfg)) if command == "run" else ("config", "validate", str(cfg))
    one_error(tidegate(*args), str(cfg), str(folder), "does not exist", f"mkdir -p {folder}")
    assert not folder.exists()


@pytest.mark.parametrize("url,needles", [
    ("sqlit:/x", ["'sqlit:/x'", "cannot be parsed", "sqlite:///PATH"]),
    # psycopg2 named explicitly (a bare postgresql:// means psycopg2 before SQLAlchemy 2.1, psycopg 3 after)
    ("postgresql+psycopg2://tidegate@db:5432/log", ["'psycopg2'", "postgresql+psycopg://tidegate@db:5432/log"]),
    ("mysql://u@h/db", ["'mysql'", "not support"]),
])
def test_malformed_database_url(tmp_path: Path, url: str, needles: list[str]) -> None:
    cfg = write_config(tmp_path, database={"url": url})
    one_error(tidegate("run", "--config", str(cfg)), str(cfg), "database.url", *needles)
    one_error(tidegate("config", "validate", str(cfg)), str(cfg), "database.url", *needles)


@pytest.mark.parametrize("command", ["db upgrade", "decisions"])
def test_malformed_database_url_given_with_url(command: str) -> None:
    one_error(tidegate(*command.split(), "--url", "sqlit:/x"), "'sqlit:/x'", "(--url)", "cannot be parsed")


def test_malformed_url_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    one_error(tidegate("run", "--config", str(cfg), env={"TIDEGATE_DATABASE_URL": "nope"}),
              "TIDEGATE_DATABASE_URL", "'nope'", "cannot be parsed")


@pytest.mark.postgres
def test_unknown_postgresql_database(tmp_path: Path, postgres_url: str) -> None:
    name = f"tidegate_absent_{uuid.uuid4().hex[:8]}"
    url = postgres_url.rsplit("/", 1)[0] + "/" + name
    cfg = write_config(tmp_path, database={"url": url})
    one_error(tidegate("run", "--config", str(cfg)), str(cfg), name, "does not exist", f"createdb", "database.url")
    one_error(tidegate("config", "validate", "--connect", str(cfg)), name, "does not exist", "createdb")
    one_error(tidegate("decisions", "--url", url), name, "does not exist", "--url")


@pytest.mark.parametrize("command", ["run", "validate"])
def test_real_providers_without_a_prometheus_section(tmp_path: Path, command: str) -> None:
    cfg = real_config(tmp_path, prometheus=None)
    args = ("run", "--config", str(cfg)) if command == "run" else ("config", "validate", str(cfg))
    one_error(tidegate(*args), str(cfg), "providers.settings.prometheus", "add providers.settings.prometheus.url")


def test_real_providers_without_cluster_credentials(tmp_path: Path) -> None:
    missing = tmp_path / "kubeconfig"
    cfg = real_config(tmp_path, {"url": "http://127.0.0.1:9"})
    raw = yaml.safe_load(cfg.read_text())
    raw["providers"]["settings"]["kubernetes"] = {"kubeconfig": str(missing)}
    named = tmp_path / "named-kubeconfig.yaml"
    named.write_text(yaml.safe_dump(raw))
    for args in (("run", "--config", str(named)), ("config", "validate", str(named))):
        one_error(tidegate(*args), str(named), f"providers.settings.kubernetes.kubeconfig {missing}", "does not exist")
    del raw["providers"]["settings"]["kubernetes"]  # none named, none in the environment either
    cfg.write_text(yaml.safe_dump(raw))
    one_error(tidegate("run", "--config", str(cfg), env={"KUBECONFIG": str(missing), "HOME": str(tmp_path)}),
              str(cfg), "providers.settings.kubernetes", "cannot load credentials", "kubeconfig")


def test_lease_election_outside_a_cluster_without_credentials(tmp_path: Path) -> None:
    """The chart's election (a Lease) copied to a laptop with the simulated fleet: one line, no traceback."""
    cfg = write_config(tmp_path, leader_election={"backend": "lease", "lease_namespace": "default"})
    missing = tmp_path / "kubeconfig"
    one_error(tidegate("run", "--config", str(cfg), env={"KUBECONFIG": str(missing), "HOME": str(tmp_path)}),
              str(cfg), "leader_election: backend lease", "cannot load credentials", "kubeconfig")


def test_missing_policies_directory_refuses_to_start(tmp_path: Path) -> None:
    """`run` used to start and fail every tick forever: it must stop at once with the reason."""
    missing = tmp_path / "policies"
    cfg = write_config(tmp_path, policies_dir=str(missing))
    one_error(tidegate("run", "--config", str(cfg), timeout=30), str(cfg), f"policies_dir {missing}", "does not exist")
    one_error(tidegate("config", "validate", str(cfg)), str(cfg), f"policies_dir {missing}", "does not exist")


def test_a_journal_without_its_folder_refuses_to_start(tmp_path: Path) -> None:
    """The journal is written only while the database is away: its folder is checked at start,
    not discovered missing during an outage."""
    journal = tmp_path / "journal" / "intents.jsonl"
    cfg = write_config(tmp_path, database={"url": f"sqlite:///{tmp_path / 'tidegate.db'}", "journal_path": str(journal)})
    one_error(tidegate("config", "validate", str(cfg)), f"database.journal_path {journal}", "does not exist", "null")


def test_config_validate_checks_the_policies_run_would_load(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    one_error(tidegate("config", "validate", str(write_config(tmp_path, policies_dir=str(empty)))),
              "'llama3-70b-fp8' has no valid ScalingPolicy", str(empty))
    bad = tmp_path / "bad"
    bad.mkdir()
    policy = (demo_config_path().parent / "policies" / "llama3-70b-fp8.yaml").read_text()
    (bad / "p.yaml").write_text(policy.replace("max_replicas:", "max_replicaz:"))
    r = tidegate("config", "validate", str(write_config(tmp_path, policies_dir=str(bad))))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{bad / 'p.yaml'}:" in r.stderr and "max_replicaz" in r.stderr, r.stderr


def test_missing_token_file(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, api={"port": 0, "admin_tokens": {"file": str(tmp_path / "admin.tokens")}})
    one_error(tidegate("run", "--config", str(cfg)), "api.admin_tokens.file", str(tmp_path / "admin.tokens"))
    one_error(tidegate("config", "validate", str(cfg)), "api.admin_tokens.file", "does not exist")


def test_config_validate_accepts_what_run_can_use(tmp_path: Path) -> None:
    r = tidegate("config", "validate", str(write_config(tmp_path)))
    assert r.returncode == 0 and r.stdout.strip().endswith(": ok"), r.stdout + r.stderr


@pytest.mark.postgres
def test_config_validate_connect_reaches_database_and_prometheus(tmp_path: Path, postgres_url: str,
                                                                  prometheus: LocalPrometheus) -> None:
    good = real_config(tmp_path, {"url": prometheus.url}, database={"url": postgres_url})
    r = tidegate("config", "validate", "--connect", str(good))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
    absent = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = real_config(tmp_path, {"url": absent, "timeout_s": 1}, database={"url": postgres_url})
    assert tidegate("config", "validate", str(cfg)).returncode == 0  # without --connect: nothing is reached
    one_error(tidegate("config", "validate", "--connect", str(cfg)), str(cfg), absent,
              "providers.settings.prometheus.url", "Connection refused")
    not_prometheus = real_config(tmp_path, {"url": f"{prometheus.url}/nothing-here"}, database={"url": postgres_url})
    one_error(tidegate("config", "validate", "--connect", str(not_prometheus)), "nothing-here", "HTTP API")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'absent.db'}"
    r = tidegate("--debug", "decisions", "--url", url)
    assert r.returncode != 0 and "Traceback" in r.stderr and "tidegate: error:" in r.stderr, r.stderr


# --- decisions: read only, and only what was asked ---------------------------------------------


def test_decisions_on_a_missing_sqlite_file_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "typo.db"
    one_error(tidegate("decisions", "--url", f"sqlite:///{db}"), str(db), "does not exist", "--url")
    assert not db.exists() and list(tmp_path.iterdir()) == []


def test_decisions_on_a_database_without_the_log(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    db.touch()
    one_error(tidegate("decisions", "--url", f"sqlite:///{db}"), str(db), "no decision log", "tidegate db upgrade")


def test_decisions_limit_reads_only_that_many_rows(make_harness, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'log.db'}"
    make_harness(tmp_path, db_url=url).run(60)  # 12 decisions
    loaded: list[int] = []

    def count(target: DecisionRow, _context: Any) -> None:
        loaded.append(target.id)

    event.listen(DecisionRow, "load", count)
    try:
        assert main(["decisions", "--url", url, "--json"]) == 0
        every = [r["id"] for r in json.loads(capsys.readouterr().out)]
        assert len(loaded) == len(every) == 12
        loaded.clear()
        assert main(["decisions", "--url", url, "--limit", "5", "--json"]) == 0
        newest = [r["id"] for r in json.loads(capsys.readouterr().out)]
    finally:
        event.remove(DecisionRow, "load", count)
    assert newest == every[-5:]
    assert sorted(loaded) == newest  # the other 7 rows were never fetched


# --- the demo --------------------------------------------------------------------------------


def test_demo_on_a_taken_port_runs_elsewhere_and_its_hint_runs_as_printed(tmp_path: Path, busy_port: int) -> None:
    # a PATH without the virtualenv, as after `make demo`: a bare `tidegate` would not be found
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != BIN.resolve())
    r = tidegate("demo", "--port", str(busy_port), "--duration-s", "1", "--speedup", "240", "--quiet",
                 "--workdir", str(tmp_path / "demo"), env={"PATH": path}, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    said = [ln for ln in r.stdout.splitlines() if ln.startswith(f"port {busy_port} is in use")]
    assert said, r.stdout
    api = [ln for ln in r.stdout.splitlines() if ln.startswith("admin API http://127.0.0.1:")]
    assert api and f":{busy_port}" not in api[0] and said[0].split("listens on port ")[1].split()[0] in api[0]
    hint = [ln.removeprefix("inspect: ") for ln in r.stdout.splitlines() if ln.startswith("inspect: ")]
    assert len(hint) == 1, r.stdout
    ran = subprocess.run(shlex.split(hint[0]), capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": path, "PYTHONWARNINGS": "ignore"})
    assert ran.returncode == 0, ran.stderr
    assert len(json.loads(ran.stdout)) > 0


def test_make_demo_takes_a_port() -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")

    def dry(*args: str) -> str:
        return subprocess.run([make, "-n", "demo", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout

    assert "tidegate demo --port 9000" in dry("PORT=9000")
    assert "tidegate demo --port 8080" in dry()


# --- logs: no line per HTTP request unless asked ----------------------------------------------


@pytest.fixture
def restore_logging() -> Iterator[None]:
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {n: logging.getLogger(n).level for n in ("httpx", "httpcore", "urllib3", "requests")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for n, lv in levels.items():
        logging.getLogger(n).setLevel(lv)


def test_a_tick_against_prometheus_logs_no_query_at_info(prometheus: LocalPrometheus, restore_logging: None,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from datetime import datetime, timezone

    model = ModelSpec(name="m", tp_degree=1, quantization="fp8", gpu_types=("A100",), cold_start_s=60,
                      capacity={"A100": ReplicaCapacity(1000, 2)}, pools=("onprem",))

    def tick_output(level: str) -> list[str]:
        logs.setup("json", level)
        src = PrometheusSettings(url=prometheus.url).build()
        try:
            src.observe([model], datetime.now(timezone.utc))
        finally:
            src.close()
        return [ln for ln in capsys.readouterr().err.splitlines() if "/api/v1/query" in ln]

    assert tick_output("INFO") == []
    assert tick_output("DEBUG")  # the requests are still there for whoever asks
