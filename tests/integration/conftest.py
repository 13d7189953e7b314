"""Shared fixtures of the integration tier: real local servers on 127.0.0.1.

Databases: ``db_url`` runs each test against an empty SQLite file and an empty database on a real
PostgreSQL server (127.0.0.1:5432, user ``postgres``, trust auth; override the libpq connection
string with ``TIDEGATE_TEST_PG_DSN``). One PostgreSQL database with a unique name is created per
test session and dropped at the end; its schema is emptied before each test. Without a reachable
PostgreSQL the PostgreSQL cases skip, except under ``CI=true`` where they fail: CI must test both.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from typing import TYPE_CHECKING

from controller.db.migrate import upgrade
from controller.db.repo import Repository

if TYPE_CHECKING:
    from tests.integration.gcp_server import GcpComputeServer
    from tests.integration.own_postgres import OwnPostgres
    from tests.integration.peers import AwsPeer, KubePeer

# --- test outcomes for fixtures ----------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Keep each phase's report on the item (``item.rep_call``), so a fixture's teardown can tell
    whether the test itself passed."""
    report: pytest.TestReport = yield
    setattr(item, f"rep_{report.when}", report)
    return report


# --- databases ---------------------------------------------------------------------------------

PG_DSN = os.environ.get("TIDEGATE_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres connect_timeout=3")
"""libpq connection string of the test PostgreSQL server, without a database name."""

_PG_ADMIN_DATABASES = ("postgres", "test")
"""Databases to connect to for CREATE / DROP DATABASE (the first that answers)."""


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _pg_admin_connect() -> psycopg.Connection[tuple[object, ...]]:
    errors = []
    for dbname in _PG_ADMIN_DATABASES:
        try:
            return psycopg.connect(f"{PG_DSN} dbname={dbname}", autocommit=True)
        except psycopg.OperationalError as e:
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            errors.append(f"{dbname}: {first_line}")
    message = f"no PostgreSQL server answers at '{PG_DSN}' ({'; '.join(errors)})"
    if _in_ci():
        pytest.fail(f"{message}; CI=true requires PostgreSQL", pytrace=False)
    pytest.skip(f"{message}; start one or set TIDEGATE_TEST_PG_DSN (CI fails instead of skipping)")


def _sqlalchemy_url(dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(PG_DSN)
    user = params.get("user", "postgres")
    host = params.get("host", "127.0.0.1")
    port = params.get("port", 5432)
    password = f":{params['password']}" if params.get("password") else ""
    return f"postgresql+psycopg://{user}{password}@{host}:{port}/{dbname}"


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """SQLAlchemy URL of a fresh PostgreSQL database created for this test session."""
    name = f"tidegate_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with _pg_admin_connect() as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _sqlalchemy_url(name)
    finally:
        with _pg_admin_connect() as admin:
            # FORCE: a test that failed mid-way may have left a connection open.
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _reset_postgres(url: str) -> None:
    dbname = url.rsplit("/", 1)[1]
    with psycopg.connect(f"{PG_DSN} dbname={dbname}", autocommit=True) as conn:
        # Fail fast instead of hanging if a previous test leaked a connection holding locks.
        conn.execute("SET lock_timeout = '10s'")
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """URL of an empty database, not migrated: a SQLite file, then PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tidegate.db'}"
    url: str = request.getfixturevalue("postgres_url")
    _reset_postgres(url)
    return url


@pytest.fixture
def migrated_db_url(db_url: str) -> str:
    """``db_url`` migrated to the head revision."""
    upgrade(db_url)
    return db_url


@pytest.fixture
def repo(migrated_db_url: str) -> Iterator[Repository]:
    """A repository on a migrated, empty database (closed after the test)."""
    repository = Repository(migrated_db_url)
    try:
        yield repository
    finally:
        repository.close()


@pytest.fixture
def pg_url(postgres_url: str) -> str:
    """URL of an empty PostgreSQL database, not migrated (for tests that run on PostgreSQL only;
    mark them ``@pytest.mark.postgres``)."""
    _reset_postgres(postgres_url)
    return postgres_url


@pytest.fixture
def own_postgres() -> Iterator["OwnPostgres"]:
    """A PostgreSQL server of the test's own, started, which the test may stop and start
    (``tests.integration.own_postgres``); removed after the test."""
    from tests.integration.own_postgres import OwnPostgres

    pg = OwnPostgres()
    try:
        pg.start()
        yield pg
    finally:
        pg.close()


# --- metrics: a real Prometheus scraping loopback exporters (tests.integration.exporters) -------------
# Owned by the metrics adapters (issue 3). One Prometheus per test session (its first data takes
# ~6 s: Prometheus batches discovery updates every 5 s); tests give each model they add to the
# shared exporters a unique name, so they never see each other's series.

from dataclasses import dataclass as _dataclass  # noqa: E402

from tests.integration.exporters import (  # noqa: E402
    DcgmExporter,
    GpuState,
    LocalPrometheus,
    PrometheusUnavailable,
    Ramp,
    ScrapeTarget,
    TritonExporter,
)

LAB_NAMESPACE = "serving"
LAB_PODS = {"onprem": "triton-onprem-0", "aws-spot": "triton-spot-0"}
LAB_GPU_UTIL_PCT = {"onprem": (60.0, 80.0), "aws-spot": (40.0,)}
"""DCGM utilization of each pod's GPUs (the onprem pod runs TP=2)."""
LAB_GPU_POWER_W = {"onprem": 300.0, "aws-spot": 250.0}
"""Power per GPU, driven as a DCGM energy counter ramp (mJ)."""


def prometheus_binary_or_skip() -> str:
    """The ``prometheus`` binary on PATH; fails under CI=true (CI installs it), skips elsewhere."""
    import shutil

    found = shutil.which("prometheus")
    if found:
        return found
    message = "the prometheus binary is not on PATH (Debian: apt-get update && apt-get install -y prometheus)"
    if _in_ci():
        pytest.fail(f"{message}; CI=true requires it", pytrace=False)
    pytest.skip(message)


@_dataclass
class MetricsLab:
    prometheus: LocalPrometheus
    triton: dict[str, TritonExporter]
    """Pool name -> the Triton metrics endpoint of that pool's (single) pod."""
    dcgm: DcgmExporter
    victim: TritonExporter
    """A Triton endpoint of its own (pool ``victim``) that a test may stop and restart."""


@pytest.fixture(scope="session")
def metrics_lab() -> Iterator[MetricsLab]:
    """Triton exporters for pools ``onprem`` and ``aws-spot`` (target labels pool, namespace, pod,
    as a Kubernetes pod scrape config attaches them), a DCGM exporter with pod mapping, and a real
    Prometheus scraping them every second."""
    binary = prometheus_binary_or_skip()
    started: list[TritonExporter | DcgmExporter] = []
    try:
        triton = {pool: TritonExporter().start() for pool in LAB_PODS}
        victim = TritonExporter().start()
        gpus: list[GpuState] = []
        dcgm = DcgmExporter()
        for pool, pod in LAB_PODS.items():
            for i, util in enumerate(LAB_GPU_UTIL_PCT[pool]):
                g = GpuState(len(gpus), pod=pod, namespace=LAB_NAMESPACE, container="triton", util_pct=util,
                             hostname=f"{pool}-node-0")
                gpus.append(g)
                dcgm.add_load(Ramp(g, "energy_mj", LAB_GPU_POWER_W[pool] * 1000.0))
        dcgm.gpus = gpus
        dcgm.start()
        started = [*triton.values(), victim, dcgm]
        targets = [ScrapeTarget(f"triton-{pool}", exp.address, {"pool": pool, "namespace": LAB_NAMESPACE, "pod": LAB_PODS[pool]})
                   for pool, exp in triton.items()]
        targets.append(ScrapeTarget("triton-victim", victim.address, {"pool": "victim", "namespace": LAB_NAMESPACE, "pod": "victim-0"}))
        targets.append(ScrapeTarget("dcgm", dcgm.address, honor_labels=True))
        prom = LocalPrometheus(targets, scrape_interval_s=1.0, binary=binary)
        try:
            prom.start()
            prom.wait_for('count(up == 1) >= 4', timeout_s=30)
        except (PrometheusUnavailable, TimeoutError) as e:
            prom.close()
            pytest.fail(f"local Prometheus did not come up: {e}", pytrace=False)
        try:
            yield MetricsLab(prom, triton, dcgm, victim)
        finally:
            prom.close()
    finally:
        for exp in started:
            exp.stop()


# --- protocol peers for the actuation adapters (one per test module) ---------------------------


@pytest.fixture(scope="module")
def kube() -> Iterator["KubePeer"]:
    """The Kubernetes API emulator (kmock) with our PUT handler and controllers."""
    from tests.integration.peers import KubePeer

    peer = KubePeer().start()
    yield peer
    peer.stop()


@pytest.fixture(scope="module")
def aws() -> Iterator["AwsPeer"]:
    """moto in server mode on 127.0.0.1 behind a fault-injecting proxy, with dummy credentials."""
    from tests.integration.peers import AwsPeer, aws_env

    with pytest.MonkeyPatch.context() as mp:
        for k, v in aws_env().items():
            mp.setenv(k, v)
        peer = AwsPeer().start()
        yield peer
        peer.stop()


@pytest.fixture(scope="module")
def gcp() -> Iterator["GcpComputeServer"]:
    """The local server speaking the compute REST paths google-cloud-compute uses."""
    from tests.integration.gcp_server import GcpComputeServer

    srv = GcpComputeServer().start()
    yield srv
    srv.stop()
