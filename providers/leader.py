"""Leader election: when two or more daemons run, only one actuates.

Why it exists: every daemon observes, decides and records (followers keep warm state and serve the
API), but two daemons scaling the same Deployments and node groups would fight. Before acting, the
daemon asks ``elector.try_acquire()``; a ``False`` means "decide and record, do not act".

Two implementations of one small protocol:

- ``PostgresAdvisoryLock``: a session-level ``pg_try_advisory_lock`` on a dedicated connection to
  the daemon's PostgreSQL database. The server itself guarantees that at most one session holds the
  lock; when the leader's session ends (process death, ``pg_terminate_backend``, a broken
  connection noticed by TCP keepalives) the server releases it and the next ``try_acquire`` of a
  follower wins. ``is_leader`` asks the server (``pg_locks``) rather than trusting a flag, so a
  leader whose session was killed learns it on its next check, before acting.
- ``KubernetesLeaseElector``: a ``coordination.k8s.io/v1`` Lease, as client-go's leader election
  does: the holder renews ``renewTime``; a follower takes over a lease not renewed within
  ``leaseDurationSeconds``; every write carries the read ``resourceVersion``, so of two candidates
  racing for an expired lease the API server lets exactly one through (the other gets 409). A
  leader that could not renew stops acting once its last renewal is older than the lease duration.

With ``buckets`` > 1 (backend lease only), the models are sharded instead of led by one daemon:
``KubernetesBucketElector`` holds one Lease per bucket of models (``controller.shards``), each
replica acts on the models of the buckets it holds, and the buckets are shared out fairly between
the live replicas (their heartbeats in one members Lease).

Neither is a fence against a leader paused in the middle of an action (GC pause, suspended VM): as
everywhere, the window is one action, and the actions themselves are declarative and idempotent.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.logs import log
from controller.protocols import LeaderElector, ShardElector
from controller.shards import assignment, bucket_lease_name, live_members, members_lease_name

logger = logging.getLogger("tidegate.leader")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
"""Where a pod finds its own namespace (the Lease's default namespace)."""


def default_identity(environ: Mapping[str, str] | None = None) -> str:
    """``$POD_NAME`` when set (the chart sets it from the pod's name), else ``host/pid``: unique per
    process, readable in the lease and in ``pg_stat_activity``."""
    env = os.environ if environ is None else environ
    return env.get("POD_NAME") or f"{socket.gethostname()}/{os.getpid()}"


class LeaderElectionSettings(BaseModel):
    """The ``leader_election`` section of the daemon config: when several daemons run, only the
    leader observes, decides and acts; the others stand by (ready) and take over when it goes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["lease", "database", "none"] | None = Field(None, description="lease: a coordination.k8s.io/v1 Lease (taken over after lease_duration_s without renewal; works with any database, and is what the Helm chart sets whenever replicaCount > 1); database: a session advisory lock on the decision log's PostgreSQL database (freed by the server the moment the leader's session ends; PostgreSQL only); none: every daemon acts (run one replica only). Unset: database when database.url is PostgreSQL, else none.")
    name: str = Field("tidegate-leader", min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="Election name: the Lease's name (backend lease; the Helm chart's Role allows exactly this name) or the advisory lock's key (backend database). Daemons with the same name in one namespace or database elect one leader.")
    identity: str | None = Field(None, description="This daemon's identity in the election. Unset: $POD_NAME when set (the chart sets it), else host/pid.")
    lease_namespace: str | None = Field(None, description="Namespace of the Lease. Unset: the pod's own namespace (its service account's), else default. The Helm chart sets the release namespace.")
    lease_duration_s: int = Field(15, ge=1, description="A Lease not renewed for this long may be taken over by another daemon, and its holder stops acting, seconds (client-go's leaseDuration).")
    retry_period_s: float = Field(2.0, gt=0, description="Least wall time between two Lease requests of one daemon (renewal by the leader, takeover attempts by the others), seconds (client-go's retryPeriod); ticks in between reuse the last answer. A follower takes over at its first tick once lease_duration_s has passed since the leader's last renewal (later by up to retry_period_s).")
    connect_timeout_s: float = Field(3.0, gt=0, description="Timeout of the advisory lock's own PostgreSQL connection, seconds.")
    buckets: int = Field(1, ge=1, le=1000, description="Model shards (backend lease only). 1: one leader acts on every model. More: each model hashes into one of this many buckets, each bucket is a Lease named NAME-bucket-II-of-N, the live replicas share the buckets evenly (rebalanced when one joins, taken over within lease_duration_s + retry_period_s when one dies) and each acts only on the models of the buckets it holds. Keep it fixed while daemons run (a change moves models between buckets); a few times the largest replica count you expect.")

    @model_validator(mode="after")
    def _renew_within_the_lease(self) -> "LeaderElectionSettings":
        if self.retry_period_s * 2 > self.lease_duration_s:
            raise ValueError(f"retry_period_s ({self.retry_period_s:g}) must be at most half of lease_duration_s "
                             f"({self.lease_duration_s}), or the leader's renewals come too late to keep the Lease")
        if self.buckets > 1 and self.backend not in ("lease", None):
            raise ValueError(f"buckets ({self.buckets}) shard models over Leases: set backend lease (backend is "
                             f"{self.backend}), or buckets 1 for a single leader")
        return self

    def problem_with(self, database_url: str) -> str | None:
        """Why these settings cannot run on this database (``None``: they can)."""
        if self.buckets > 1 and self.resolved_backend(database_url) != "lease":
            return (f"leader_election.buckets ({self.buckets}) shard models over Leases but the backend resolves to "
                    f"{self.resolved_backend(database_url)}; set leader_election.backend lease")
        if self.resolved_backend(database_url) == "database" and not is_postgres_url(database_url):
            return (f"leader_election.backend is database but database.url ({database_url!r}) is not PostgreSQL; "
                    "use backend lease (any database) or a PostgreSQL database")
        return None

    def resolved_backend(self, database_url: str) -> str:
        if self.backend is not None:
            return self.backend
        return "database" if is_postgres_url(database_url) else "none"

    def namespace(self) -> str:
        if self.lease_namespace:
            return self.lease_namespace
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
        except OSError:
            return "default"


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql", "postgres"))


def build_elector(settings: LeaderElectionSettings, *, database_url: str, api_client: Callable[[], Any],
                  clock: Any = None, environ: Mapping[str, str] | None = None) -> LeaderElector | ShardElector | None:
    """The elector ``settings`` ask for (``None`` for backend none). ``api_client`` builds the
    Kubernetes client (called for backend lease only); ``clock`` is the Lease's clock: the wall
    clock unless a test drives one (never the demo's accelerated clock: the Lease's times are
    compared across processes)."""
    backend = settings.resolved_backend(database_url)
    identity = settings.identity or default_identity(environ)
    if backend == "none":
        return None
    if backend == "database":
        problem = settings.problem_with(database_url)
        if problem:
            raise ValueError(problem)
        return PostgresAdvisoryLock(database_url, name=settings.name, identity=identity,
                                    connect_timeout_s=settings.connect_timeout_s)
    if settings.buckets > 1:
        return KubernetesBucketElector(api_client(), namespace=settings.namespace(), name=settings.name,
                                       identity=identity, buckets=settings.buckets,
                                       lease_duration_s=settings.lease_duration_s,
                                       retry_period_s=settings.retry_period_s, clock=clock)
    return KubernetesLeaseElector(api_client(), namespace=settings.namespace(), name=settings.name,
                                  identity=identity, lease_duration_s=settings.lease_duration_s,
                                  retry_period_s=settings.retry_period_s, clock=clock)


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory lock key for a name (same name, same key, on every host)."""
    return int.from_bytes(hashlib.sha256(f"tidegate:{name}".encode()).digest()[:8], "big", signed=True)


def libpq_dsn(url: str) -> str:
    """A libpq connection string from a SQLAlchemy URL (``postgresql+psycopg://`` ->
    ``postgresql://``); libpq strings pass through."""
    for prefix in ("postgresql+psycopg://", "postgresql+psycopg2://", "postgres+psycopg://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url


class PostgresAdvisoryLock:
    """``LeaderElector`` on a PostgreSQL session advisory lock.

    ``dsn`` is a libpq string or URL (``libpq_dsn`` converts a SQLAlchemy URL); ``name`` scopes the
    election (daemons of one cluster share it). The connection is this elector's own (autocommit,
    so no transaction stays open) with TCP keepalives, so the server notices a vanished leader and
    frees the lock."""

    def __init__(self, dsn: str, *, name: str = "leader", identity: str | None = None,
                 connect_timeout_s: float = 3.0, keepalive_idle_s: int = 10,
                 connect: Callable[..., Any] | None = None) -> None:
        import psycopg  # here, not at the top: a daemon on SQLite never loads the driver

        self._error: type[Exception] = psycopg.Error
        self.dsn = libpq_dsn(dsn)
        self.name = name
        self.key = lock_key(name)
        self.identity = identity or default_identity()
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_idle_s = keepalive_idle_s
        self._connect = connect or psycopg.connect
        self._conn: Any = None
        self.last_error: str | None = None
        self.check_error: str | None = None
        """Why the last ``try_acquire`` could not reach the server (``None``: it could)."""

    # The key as pg_locks shows a bigint advisory lock: classid = high 32 bits, objid = low 32.
    @property
    def _classid(self) -> int:
        return (self.key >> 32) & 0xFFFFFFFF

    @property
    def _objid(self) -> int:
        return self.key & 0xFFFFFFFF

    def _connection(self) -> Any:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        self._conn = self._connect(
            self.dsn, autocommit=True, connect_timeout=max(1, int(self.connect_timeout_s)),
            application_name=f"tidegate-leader {self.identity}"[:63],
            keepalives=1, keepalives_idle=self.keepalive_idle_s, keepalives_interval=5, keepalives_count=3)
        return self._conn

    def _drop(self, e: BaseException) -> None:
        self.last_error = f"{type(e).__name__}: {e}"
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except self._error:
                pass

    @property
    def backend_pid(self) -> int | None:
        """The server process of this elector's session (``None`` when not connected)."""
        if self._conn is None or self._conn.closed:
            return None
        return int(self._conn.info.backend_pid)

    def _holds(self, conn: Any) -> bool:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
            "AND granted AND classid = %s AND objid = %s AND objsubid = 1",
            (self._classid, self._objid)).fetchone()
        return bool(row and row[0])

    def is_leader(self) -> bool:
        if self._conn is None or self._conn.closed:
            return False
        try:
            return self._holds(self._conn)
        except self._error as e:  # the session is gone, and the lock with it
            self._drop(e)
            return False

    def try_acquire(self) -> bool:
        # A connection whose session was ended under it fails on first use; one fresh connection
        # is tried at once rather than losing a whole tick.
        for attempt in range(2):
            reused = self._conn is not None and not self._conn.closed
            try:
                conn = self._connection()
                if self._holds(conn):
                    self.check_error = None
                    return True  # no second lock: session locks stack and would need two unlocks
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
                self.check_error = None
                return bool(row and row[0])
            except self._error as e:
                self._drop(e)
                if not reused or attempt:
                    self.check_error = self.last_error
                    return False
        return False

    def release(self) -> None:
        if self._conn is None or self._conn.closed:
            return
        try:
            if self._holds(self._conn):
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
        except self._error as e:
            self._drop(e)
            return
        self._drop(RuntimeError("released"))
        self.last_error = None

    def holder_pid(self) -> int | None:
        """The backend pid holding the lock now, as any session sees it (for status pages)."""
        try:
            row = self._connection().execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s "
                "AND objid = %s AND objsubid = 1", (self._classid, self._objid)).fetchone()
        except self._error as e:
            self._drop(e)
            return None
        return int(row[0]) if row else None


def _micro(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _LeaseClient:
    """What the Lease electors share: the ``CoordinationV1Api`` built on ``api_client``, the
    Lease's place and timing, and the clock (the daemon's ``controller.protocols.Clock``, which
    tests drive by hand; the wall clock when ``None``)."""

    def __init__(self, api_client: Any, *, namespace: str, name: str = "tidegate-leader",
                 identity: str | None = None, lease_duration_s: int = 15, retry_period_s: float = 0.0,
                 clock: Any = None, request_timeout_s: float = 5.0) -> None:
        from kubernetes import client as k8s

        self._k8s = k8s
        self.api = k8s.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration_s = lease_duration_s
        self._clock = clock
        self.request_timeout_s = request_timeout_s
        self.retry_period_s = retry_period_s
        self._tried_at: datetime | None = None
        self.last_error: str | None = None
        self.check_error: str | None = None
        """Why the last Lease request failed other than by losing a race (``None``: it was answered)."""

    def _now(self) -> datetime:
        return self._clock.now() if self._clock is not None else datetime.now(timezone.utc)


class KubernetesLeaseElector(_LeaseClient):
    """``LeaderElector`` on a ``coordination.k8s.io/v1`` Lease (client-go's algorithm).

    ``clock`` is the daemon's clock (a ``controller.protocols.Clock``): the lease compares times,
    and tests drive it by hand. Reads and writes go through ``kubernetes.client.CoordinationV1Api``
    built on ``api_client``; writes are replaces carrying the read ``resourceVersion``."""

    def __init__(self, api_client: Any, **kw: Any) -> None:
        super().__init__(api_client, **kw)
        self._renewed_at: datetime | None = None

    def _spec(self, now: datetime, *, acquire: datetime, transitions: int) -> Any:
        return self._k8s.V1LeaseSpec(
            holder_identity=self.identity, lease_duration_seconds=self.lease_duration_s,
            acquire_time=acquire, renew_time=now, lease_transitions=transitions)

    def try_acquire(self) -> bool:
        from kubernetes.client.exceptions import ApiException

        now = self._now()
        if self._tried_at is not None and self._tried_at <= now < self._tried_at + timedelta(seconds=self.retry_period_s):
            # at most one round of Lease requests per retry period (ticks may come much faster:
            # the demo's clock); in between, the last answer stands for as long as it is fresh
            return self.is_leader()
        self._tried_at = now
        try:
            try:
                lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.request_timeout_s)
            except ApiException as e:
                if e.status != 404:
                    raise
                body = self._k8s.V1Lease(
                    metadata=self._k8s.V1ObjectMeta(name=self.name, namespace=self.namespace),
                    spec=self._spec(now, acquire=now, transitions=0))
                self.api.create_namespaced_lease(self.namespace, body, _request_timeout=self.request_timeout_s)
                self._renewed_at = now
                self.check_error = None
                return True
            spec = lease.spec or self._k8s.V1LeaseSpec()
            holder = spec.holder_identity or ""
            renew = spec.renew_time
            if renew is not None and renew.tzinfo is None:
                renew = renew.replace(tzinfo=timezone.utc)
            duration = spec.lease_duration_seconds or self.lease_duration_s
            expired = renew is None or now >= renew + timedelta(seconds=duration)
            self.check_error = None
            if holder and holder != self.identity and not expired:
                self._renewed_at = None
                return False
            mine = holder == self.identity
            acquire = spec.acquire_time if mine and spec.acquire_time else now
            transitions = (spec.lease_transitions or 0) + (0 if mine else 1)
            lease.spec = self._spec(now, acquire=acquire, transitions=transitions)
            # replace (PUT) with the read resourceVersion: of two racing candidates one gets 409
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=self.request_timeout_s)
            self._renewed_at = now
            return True
        except ApiException as e:
            self.last_error = f"{e.status}: {e.reason}"
            # 409: someone else wrote the lease since we read it (a rival took it, or won the race
            # for it): step down now; the next try re-reads and renews if the lease is still ours.
            # Any other status (403, 5xx) means the election cannot be checked.
            self.check_error = None if e.status == 409 else self.last_error
            return self._lose()
        except Exception as e:  # network trouble: keep leading only while the last renewal is fresh
            self.last_error = f"{type(e).__name__}: {e}"
            self.check_error = self.last_error
            return self.is_leader()

    def _lose(self) -> bool:
        self._renewed_at = None
        return False

    def is_leader(self) -> bool:
        """Leader while the last successful renewal is younger than the lease duration (after
        that a follower may already have taken over)."""
        if self._renewed_at is None:
            return False
        if self._now() >= self._renewed_at + timedelta(seconds=self.lease_duration_s):
            self._renewed_at = None
            return False
        return True

    def release(self) -> None:
        """Hand over at once: blank holder and a 1 s duration, as client-go does on release."""
        from kubernetes.client.exceptions import ApiException

        if self._renewed_at is None:
            return
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.request_timeout_s)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = ""
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=self.request_timeout_s)
        except ApiException as e:
            self.last_error = f"{e.status}: {e.reason}"
        finally:
            self._renewed_at = None


MEMBERS_ANNOTATION = "tidegate.io/members"
"""Annotation of the members Lease: JSON ``{identity: last heartbeat (RFC 3339)}``."""


class KubernetesBucketElector(_LeaseClient):
    """``ShardElector`` on one Lease per bucket plus a members Lease (see ``controller.shards``).

    Each round (at most one per ``retry_period_s``; ticks in between reuse the answer while it is
    fresh): write this replica's heartbeat into the members Lease, work out the live members and
    this replica's fair share, release held buckets that belong to another live member, and take
    or renew the buckets of its share (``KubernetesLeaseElector`` per bucket: renewals, expiry and
    409 races as for a single leader). ``acquire_buckets()`` returns the buckets whose last
    renewal is younger than the lease duration: only their models may be acted on."""

    def __init__(self, api_client: Any, *, namespace: str, name: str = "tidegate-leader", buckets: int,
                 identity: str | None = None, lease_duration_s: int = 15, retry_period_s: float = 0.0,
                 clock: Any = None, request_timeout_s: float = 5.0) -> None:
        super().__init__(api_client, namespace=namespace, name=name, identity=identity,
                         lease_duration_s=lease_duration_s, retry_period_s=retry_period_s, clock=clock,
                         request_timeout_s=request_timeout_s)
        self.buckets = buckets
        self.leases = [KubernetesLeaseElector(api_client, namespace=namespace, name=bucket_lease_name(name, i, buckets),
                                              identity=self.identity, lease_duration_s=lease_duration_s,
                                              clock=clock, request_timeout_s=request_timeout_s)
                       for i in range(buckets)]
        self.members: list[str] = [self.identity]
        """The live members as of the last round (this replica included)."""

    def held(self) -> frozenset[int]:
        """Buckets whose last renewal is still fresh."""
        return frozenset(i for i, lease in enumerate(self.leases) if lease.is_leader())

    def acquire_buckets(self) -> frozenset[int]:
        now = self._now()
        if self._tried_at is not None and self._tried_at <= now < self._tried_at + timedelta(seconds=self.retry_period_s):
            return self.held()
        self._tried_at = now
        errors: list[str] = []
        try:
            self.members = live_members(self._heartbeat(now), now, self.lease_duration_s)
        except Exception as e:  # noqa: BLE001 - the members Lease is for balance only; never stop on it
            errors.append(f"members lease: {type(e).__name__}: {e}")
            self.members = sorted(set(self.members) | {self.identity})
        owner = assignment(set(self.members) | {self.identity}, self.buckets)
        for i, lease in enumerate(self.leases):
            if owner.get(i) == self.identity:
                lease.try_acquire()
            elif lease.is_leader():
                # another live replica's share: hand it over at once (release blanks the holder, so
                # it takes the bucket at its next round instead of after the lease duration)
                log_handover(self.identity, lease.name, owner.get(i))
                lease.release()
            if lease.check_error:
                errors.append(f"{lease.name}: {lease.check_error}")
        self.check_error = "; ".join(errors) or None
        self.last_error = self.check_error or self.last_error
        return self.held()

    def _heartbeat(self, now: datetime) -> dict[str, datetime]:
        """Write this replica's heartbeat into the members Lease; returns every member's (a 409
        from a concurrent writer is retried on a fresh read)."""
        from kubernetes.client.exceptions import ApiException

        name = members_lease_name(self.name)
        for _ in range(4):
            try:
                lease = self.api.read_namespaced_lease(name, self.namespace, _request_timeout=self.request_timeout_s)
            except ApiException as e:
                if e.status != 404:
                    raise
                lease = None
            beats = _heartbeats(lease)
            horizon = timedelta(seconds=self.lease_duration_s)
            beats = {m: at for m, at in beats.items() if now - at < horizon}  # the departed drop out
            beats[self.identity] = now
            note = {MEMBERS_ANNOTATION: json.dumps({m: _micro(at) for m, at in sorted(beats.items())})}
            try:
                if lease is None:
                    self.api.create_namespaced_lease(self.namespace, self._k8s.V1Lease(
                        metadata=self._k8s.V1ObjectMeta(name=name, namespace=self.namespace, annotations=note),
                        spec=self._k8s.V1LeaseSpec(lease_duration_seconds=self.lease_duration_s)),
                        _request_timeout=self.request_timeout_s)
                else:
                    lease.metadata = lease.metadata or self._k8s.V1ObjectMeta(name=name, namespace=self.namespace)
                    lease.metadata.annotations = {**(lease.metadata.annotations or {}), **note}
                    self.api.replace_namespaced_lease(name, self.namespace, lease, _request_timeout=self.request_timeout_s)
                return beats
            except ApiException as e:
                if e.status != 409:
                    raise
        return beats  # lost every race this round: the others' view is fresh, ours joins next round

    def release(self) -> None:
        """Hand every held bucket over at once (on shutdown)."""
        for lease in self.leases:
            lease.release()


def _heartbeats(lease: Any) -> dict[str, datetime]:
    raw = ((lease.metadata.annotations or {}) if lease is not None and lease.metadata else {}).get(MEMBERS_ANNOTATION)
    try:
        data = json.loads(raw) if raw else {}
        return {str(m): datetime.fromisoformat(str(t).replace("Z", "+00:00")) for m, t in data.items()}
    except (ValueError, AttributeError):  # a hand-edited annotation: start the member list afresh
        return {}


def log_handover(identity: str, lease: str, to: str | None) -> None:
    log(logger, logging.INFO, "bucket handed over for balance", identity=identity, lease=lease, to=to)


__all__ = [
    "KubernetesBucketElector", "KubernetesLeaseElector", "LeaderElectionSettings", "LeaderElector", "PostgresAdvisoryLock",
    "build_elector", "default_identity", "is_postgres_url", "libpq_dsn", "lock_key",
]
