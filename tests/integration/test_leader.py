"""Leader election against real peers: PostgreSQL advisory locks on the test server (127.0.0.1:5432)
and a Kubernetes Lease on the kmock API emulator (which the peer teaches resourceVersion and PUT).

The property under test in both: two electors never both lead, and when the leader dies the
follower takes over (for PostgreSQL: as soon as the leader's session is gone; for the Lease: once
the lease duration has passed without a renewal)."""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from providers.clock import ManualClock
from providers.leader import KubernetesLeaseElector, PostgresAdvisoryLock, libpq_dsn, lock_key
from tests.integration.peers import KubePeer

PG_DSN = os.environ.get("TIDEGATE_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres connect_timeout=3")
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def test_lock_keys_are_stable_signed_64_bit_and_urls_convert() -> None:
    assert lock_key("prod") == lock_key("prod") != lock_key("staging")
    assert -(2 ** 63) <= lock_key("prod") < 2 ** 63
    assert libpq_dsn("postgresql+psycopg://postgres@127.0.0.1:5432/tidegate") == "postgresql://postgres@127.0.0.1:5432/tidegate"
    assert libpq_dsn("host=127.0.0.1 dbname=x") == "host=127.0.0.1 dbname=x"


# --- PostgreSQL --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg_dsn() -> str:
    errors = []
    for db in ("test", "postgres"):
        dsn = f"{PG_DSN} dbname={db}"
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("SELECT 1")
            return dsn
        except psycopg.OperationalError as e:
            errors.append(str(e).strip())
    msg = f"no PostgreSQL server answers at '{PG_DSN}' ({'; '.join(errors)})"
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        pytest.fail(f"{msg}; CI=true requires PostgreSQL", pytrace=False)
    pytest.skip(msg)


@pytest.fixture()
def admin(pg_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        yield c


def _kill(admin: psycopg.Connection[tuple[object, ...]], pid: int | None) -> None:
    """End a session from outside, as a crashed host or an operator would, and wait until it is gone."""
    assert pid is not None
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() == (0,):
            return
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} still alive")


def _holders(admin: psycopg.Connection[tuple[object, ...]], e: PostgresAdvisoryLock) -> list[int]:
    rows = admin.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s "
                         "AND objid = %s AND objsubid = 1", (e._classid, e._objid)).fetchall()
    return [int(str(r[0])) for r in rows]


def test_only_one_leads_and_the_follower_takes_over_when_the_leaders_session_is_killed(
        pg_dsn: str, admin: psycopg.Connection[tuple[object, ...]]) -> None:
    name = f"t-{uuid.uuid4().hex}"
    a = PostgresAdvisoryLock(pg_dsn, name=name, identity="daemon-a")
    b = PostgresAdvisoryLock(pg_dsn, name=name, identity="daemon-b")
    try:
        assert a.try_acquire() and not b.try_acquire()
        assert a.is_leader() and not b.is_leader()
        assert a.try_acquire() and a.try_acquire()  # staying leader takes no second lock
        assert _holders(admin, a) == [a.backend_pid]
        row = admin.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND locktype = 'advisory'",
                            (a.backend_pid,)).fetchone()
        assert row == (1,)

        _kill(admin, a.backend_pid)
        assert not a.is_leader()  # it learns before acting, from the server, not from a flag
        assert a.last_error is not None and a.backend_pid is None
        assert b.try_acquire() and b.is_leader()
        assert _holders(admin, b) == [b.backend_pid]
        assert not a.try_acquire()  # reconnects as a follower
        assert a.backend_pid is not None and a.backend_pid != b.backend_pid
    finally:
        a.release()
        b.release()


def test_a_leader_whose_session_was_killed_while_idle_regains_the_free_lock_in_one_try(
        pg_dsn: str, admin: psycopg.Connection[tuple[object, ...]]) -> None:
    a = PostgresAdvisoryLock(pg_dsn, name=f"t-{uuid.uuid4().hex}")
    try:
        assert a.try_acquire()
        old = a.backend_pid
        _kill(admin, old)
        assert a.try_acquire()  # the dead connection fails, a fresh one takes the free lock
        assert a.backend_pid != old and _holders(admin, a) == [a.backend_pid]
    finally:
        a.release()


def test_release_hands_leadership_over_at_once(pg_dsn: str, admin: psycopg.Connection[tuple[object, ...]]) -> None:
    name = f"t-{uuid.uuid4().hex}"
    a = PostgresAdvisoryLock(pg_dsn, name=name)
    b = PostgresAdvisoryLock(pg_dsn, name=name)
    try:
        assert a.try_acquire()
        a.release()
        assert not a.is_leader() and a.backend_pid is None
        assert b.try_acquire() and _holders(admin, b) == [b.backend_pid]
    finally:
        b.release()


def test_random_kills_and_releases_never_leave_two_leaders(pg_dsn: str, admin: psycopg.Connection[tuple[object, ...]]) -> None:
    name = f"t-{uuid.uuid4().hex}"
    electors = [PostgresAdvisoryLock(pg_dsn, name=name, identity=f"d{i}") for i in range(3)]
    rng = random.Random(20250301)
    leaderships = 0
    try:
        for _ in range(60):
            e = rng.choice(electors)
            op = rng.random()
            if op < 0.6:
                e.try_acquire()
            elif op < 0.8:
                if e.backend_pid is not None:
                    _kill(admin, e.backend_pid)
            else:
                e.release()
            leaders = [x for x in electors if x.is_leader()]
            assert len(leaders) <= 1
            assert len(_holders(admin, electors[0])) <= 1
            leaderships += len(leaders)
            # someone who asks while nobody leads always gets it
            if not leaders:
                assert rng.choice(electors).try_acquire()
        assert leaderships > 0
    finally:
        for e in electors:
            e.release()


# --- Kubernetes Lease --------------------------------------------------------------------------


def test_lease_one_holder_renews_and_a_follower_takes_over_after_the_lease_expires(kube: KubePeer) -> None:
    clock = ManualClock(T0)
    ns = f"l-{uuid.uuid4().hex[:6]}"
    a = KubernetesLeaseElector(kube.api_client(), namespace=ns, identity="daemon-a", lease_duration_s=15, clock=clock)
    b = KubernetesLeaseElector(kube.api_client(), namespace=ns, identity="daemon-b", lease_duration_s=15, clock=clock)
    assert a.try_acquire() and not b.try_acquire()
    clock.advance(10)
    assert a.try_acquire() and not b.try_acquire()  # renewed at +10
    assert a.is_leader() and not b.is_leader()
    puts = [r for r in kube.requests() if r.method == "PUT" and f"/namespaces/{ns}/leases/" in r.path]
    assert len(puts) == 1  # the renewal is a replace carrying the read resourceVersion

    clock.advance(14)  # a stops renewing (it died); b keeps trying
    assert not b.try_acquire()
    clock.advance(2)  # 16 s since a's last renewal
    assert not a.is_leader()  # by its own clock it may no longer act
    assert b.try_acquire() and b.is_leader()
    lease = b.api.read_namespaced_lease("tidegate-leader", ns)
    assert lease.spec.holder_identity == "daemon-b" and lease.spec.lease_transitions == 1
    assert not a.try_acquire()


def test_lease_of_two_candidates_racing_for_an_expired_lease_only_one_wins(kube: KubePeer) -> None:
    clock = ManualClock(T0)
    ns = f"l-{uuid.uuid4().hex[:6]}"
    old = KubernetesLeaseElector(kube.api_client(), namespace=ns, identity="old", lease_duration_s=15, clock=clock)
    b = KubernetesLeaseElector(kube.api_client(), namespace=ns, identity="daemon-b", lease_duration_s=15, clock=clock)
    assert old.try_acquire()
    clock.advance(30)  # the old leader is long gone

    def rival_wins(emu: object) -> None:
        # A third daemon read the same expired lease and its replace lands first.
        for k in list(emu._objects):  # type: ignore[attr-defined]
            if k[1] == ns and k[2] == "tidegate-leader":
                emu._objects[k].patch({"spec": {"holderIdentity": "daemon-c", "renewTime": "2025-03-01T12:00:30.000000Z"},  # type: ignore[attr-defined]
                                       "metadata": {"resourceVersion": emu._next_rv()}})  # type: ignore[attr-defined]

    kube.fault("PUT", rf"/namespaces/{ns}/leases/tidegate-leader$", None, before=rival_wins)
    assert not b.try_acquire() and not b.is_leader()  # its replace met a 409
    assert b.last_error is not None and b.last_error.startswith("409")
    assert b.api.read_namespaced_lease("tidegate-leader", ns).spec.holder_identity == "daemon-c"


def test_lease_release_lets_the_follower_in_without_waiting(kube: KubePeer) -> None:
    clock = ManualClock(T0)
    ns = f"l-{uuid.uuid4().hex[:6]}"
    a = KubernetesLeaseElector(kube.api_client(), namespace=ns, identity="daemon-a", lease_duration_s=15, clock=clock)
    b = KubernetesLeaseElector(kube.api_client(), namespace=ns, identity="daemon-b", lease_duration_s=15, clock=clock)
    assert a.try_acquire()
    a.release()
    assert not a.is_leader()
    clock.advance(1)
    assert b.try_acquire() and b.is_leader()
    assert clock.now() - T0 < timedelta(seconds=15)


def test_lease_requests_at_most_once_per_retry_period_and_the_leader_keeps_its_answer(kube: KubePeer) -> None:
    clock = ManualClock(T0)
    ns = f"l-{uuid.uuid4().hex[:6]}"
    a = KubernetesLeaseElector(kube.api_client(), namespace=ns, identity="daemon-a", lease_duration_s=15,
                               retry_period_s=2, clock=clock)
    mark = kube.mark()

    def lease_requests() -> int:
        return sum(1 for r in kube.requests_since(mark) if f"/namespaces/{ns}/leases" in r.path)

    assert a.try_acquire()
    first = lease_requests()
    assert first == 2  # read (404), create
    for _ in range(20):  # the demo's clock ticks 12 times a wall second
        clock.advance(0.05)
        assert a.try_acquire()
    assert lease_requests() == first  # one second later: no request yet
    clock.advance(1.0)
    assert a.try_acquire() and lease_requests() == first + 2  # read, replace: the renewal


def test_lease_check_error_is_set_when_the_api_fails_and_not_when_a_race_is_lost(kube: KubePeer) -> None:
    clock = ManualClock(T0)
    ns = f"l-{uuid.uuid4().hex[:6]}"
    a = KubernetesLeaseElector(kube.api_client(), namespace=ns, identity="daemon-a", lease_duration_s=15, clock=clock)
    b = KubernetesLeaseElector(kube.api_client(), namespace=ns, identity="daemon-b", lease_duration_s=15, clock=clock)
    assert a.try_acquire() and a.check_error is None
    assert not b.try_acquire() and b.check_error is None  # another holds it: answered, not an error
    kube.fault("GET", rf"/namespaces/{ns}/leases/tidegate-leader$", 403, message="forbidden by RBAC")
    clock.advance(1)
    assert not b.try_acquire()
    assert b.check_error is not None and b.check_error.startswith("403"), b.check_error
    clock.advance(1)
    assert not b.try_acquire() and b.check_error is None  # answered again


def test_postgres_check_error_is_set_while_the_server_cannot_be_reached(pg_dsn: str) -> None:
    a = PostgresAdvisoryLock(f"{pg_dsn} port=1", name=f"t-{uuid.uuid4().hex}", connect_timeout_s=1)
    assert not a.try_acquire()
    assert a.check_error is not None and "port 1" in a.check_error
