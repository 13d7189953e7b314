"""What can be known about a database URL before the daemon or a command relies on it.

``tidegate config validate`` and ``tidegate run`` check the URL without connecting
(:func:`url_problem`: it parses, names a supported backend and an installed driver, a SQLite file's
folder exists); ``config validate --connect`` and ``run`` also connect (:func:`connect_problem`).
Read-only commands open the log with :func:`open_log`, which never creates a SQLite file and checks
the schema first; the daemon's start migrates with :func:`upgrade_apart`. Every problem is one
line: what is wrong, the URL (password hidden), and the fix, naming ``source`` (where the URL came
from: ``database.url``, ``--url``...).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from controller.db.migrate import current_revision, head_revision, upgrade
from controller.db.repo import Repository, make_engine
from controller.errors import DatabaseError  # re-exported: raised here

__all__ = ["DatabaseError", "connect_problem", "database_errors", "open_log", "shown", "sqlite_file", "upgrade_apart",
           "url_problem"]

EXAMPLES = "sqlite:///PATH or postgresql+psycopg://USER@HOST:PORT/DATABASE"
"""The URL forms tidegate supports (its migrations run on SQLite and PostgreSQL through psycopg 3)."""


def shown(url: str) -> str:
    """The URL as it may be printed: the password masked."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except (sa.exc.ArgumentError, ValueError):
        return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL; ``None`` for in-memory SQLite and for other backends."""
    parsed = sa.engine.make_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or name is None or name in ("", ":memory:") \
            or parsed.query.get("mode") == "memory":
        return None
    return Path(name)


def url_problem(url: str, source: str = "database.url") -> str | None:
    """Why ``url`` cannot work, found without connecting; ``None`` when it may."""
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        return f"database URL {shown(url)!r} ({source}) cannot be parsed; write it as {EXAMPLES}"
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        return f"database URL {shown(url)!r} ({source}) names {parsed.drivername!r}, which tidegate does not support; use {EXAMPLES}"
    if backend == "postgresql" and parsed.get_driver_name() != "psycopg":
        fixed = parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=True)
        return (f"database URL {shown(url)!r} ({source}) uses the driver {parsed.get_driver_name()!r}; "
                f"tidegate ships psycopg 3: write {fixed}")
    if backend == "postgresql" and not parsed.database:
        return f"database URL {shown(url)!r} ({source}) names no database; add /DATABASE at the end ({EXAMPLES})"
    path = sqlite_file(url)
    if path is not None:
        folder = path.resolve().parent
        if not folder.is_dir():
            return (f"database {shown(url)} ({source}): the folder {folder} does not exist; "
                    f"create it (mkdir -p {folder}) or point {source} at an existing folder")
        if path.is_dir():
            return f"database {shown(url)} ({source}): {path} is a folder, not a file; point {source} at a file path"
    return None


def _reason(e: BaseException) -> str:
    """The first line of what the database driver said (SQLAlchemy wraps it in a longer text)."""
    orig = getattr(e, "orig", None) or e
    lines = [ln.strip() for ln in str(orig).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(orig).__name__


def _fix(url: str, reason: str, source: str) -> str:
    parsed = sa.engine.make_url(url)
    if "does not exist" in reason and "database" in reason and parsed.database:
        return (f"create it (createdb -h {parsed.host or 'localhost'} -p {parsed.port or 5432} "
                f"-U {parsed.username or 'postgres'} {parsed.database}) or fix {source}")
    if "password authentication failed" in reason or "no password supplied" in reason:
        return f"check the user and password in {source}"
    if "refused" in reason or "timeout expired" in reason or "could not translate host name" in reason:
        return f"start the database server or fix the host and port in {source}"
    if "unable to open database file" in reason or "readonly" in reason or "permission" in reason.lower():
        return f"check that the file and its folder are readable and writable by this user, or fix {source}"
    return f"check the server and {source}"


def describe(url: str, e: BaseException, source: str = "database.url") -> str:
    """One line for a failed database operation on ``url``."""
    reason = _reason(e)
    return f"database {shown(url)} ({source}): {reason}; {_fix(url, reason, source)}"


@contextmanager
def database_errors(url: str, source: str = "database.url") -> Iterator[None]:
    """Turn the driver's errors inside the block into a :class:`DatabaseError` of one line."""
    try:
        yield
    except sa.exc.DBAPIError as e:
        raise DatabaseError(describe(url, e, source)) from e


def connect_problem(url: str, source: str = "database.url") -> str | None:
    """Why the database at ``url`` cannot be reached (it connects and runs ``SELECT 1``); ``None``
    when it answers. Never creates a SQLite file."""
    problem = url_problem(url, source)
    if problem is not None:
        return problem
    path = sqlite_file(url)
    if path is not None and not path.exists():
        return None  # the daemon creates it on start; nothing to reach yet
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.DBAPIError as e:
        return describe(url, e, source)
    finally:
        engine.dispose()
    return None


def open_log(url: str, source: str = "--url") -> Repository:
    """A repository on an existing, migrated decision log, for commands that only read it: a
    missing SQLite file is an error (it is not created), so is a database without the schema."""
    problem = url_problem(url, source)
    if problem is not None:
        raise DatabaseError(problem)
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        raise DatabaseError(f"database {shown(url)} ({source}): {path} does not exist; point {source} at the daemon's "
                            "database (its config's database.url) or run the daemon first")
    with database_errors(url, source):
        current = current_revision(url)
    head = head_revision()
    if current != head:
        what = "no decision log (an empty database)" if current is None else f"a decision log at revision {current}, not {head}"
        raise DatabaseError(f"database {shown(url)} ({source}) holds {what}; run `tidegate db upgrade --url URL` "
                            f"or point {source} at the daemon's database")
    return Repository(url)


def upgrade_apart(url: str, source: str = "database.url") -> None:
    """``upgrade`` to head for a long-lived process (the daemon's start): when the database is not
    at head, Alembic runs in a child interpreter and exits with it, so Alembic and Mako never
    load into the daemon (9.4 MB of its resident memory at 1,000 models: a probe of
    ``bench/control_plane.py``'s SQLite run, migrated in or out of the process). A database at head
    costs one query, as in ``upgrade``; an in-memory SQLite database, which only this process
    can see, is migrated here. The child's driver errors come back as a
    :class:`~controller.errors.DatabaseError` of one line, as ``database_errors`` words them in
    the process; anything else as a ``RuntimeError`` with the end of the child's output."""
    if current_revision(url) == head_revision():
        return
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite" and (parsed.database in (None, "", ":memory:")
                                                  or parsed.query.get("mode") == "memory"):
        upgrade(url)
        return
    # the URL (it may hold a password) goes through stdin, not the command line other users can read
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", "from controller.db.preflight import _child; raise SystemExit(_child())"],
                          input=json.dumps({"url": url, "source": source}),
                          capture_output=True, text=True, env=env)
    if proc.returncode == _CHILD_DATABASE_ERROR:
        raise DatabaseError(proc.stdout.strip())
    if proc.returncode != 0:
        raise RuntimeError(f"migrating the decision log failed in its child process (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()[-2000:]}")


_CHILD_DATABASE_ERROR = 3
"""Exit status of :func:`_child` for a driver error (its stdout: the one-line description)."""


def _child() -> int:
    """``upgrade`` the database named on stdin (JSON ``{"url", "source"}``) to head:
    :func:`upgrade_apart`'s child."""
    args = json.load(sys.stdin)
    try:
        upgrade(args["url"])
    except sa.exc.DBAPIError as e:
        print(describe(args["url"], e, args["source"]))
        return _CHILD_DATABASE_ERROR
    return 0
