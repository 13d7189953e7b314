"""Schema migrations of the decision log, driven from code.

The daemon, ``tidegate db upgrade`` and the tests all migrate through these functions, so that
there is one way to reach the schema: Alembic, with the version scripts in the ``migrations``
package. The Alembic configuration is built here in code (no ini file to find relative to the
current directory); ``migrations/alembic.ini`` exists only for people who run ``alembic`` by hand.
"""

from __future__ import annotations

import contextlib
import fcntl
import re
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import migrations
import sqlalchemy as sa

from controller.errors import SchemaNotCurrentError  # re-exported: raised here

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic (with Mako, ~11 MB of resident memory) is imported only to migrate: a daemon restarting
# on a database already at head reads the revision with one query and the scripts' own lines.

__all__ = ["SchemaNotCurrentError", "alembic_config", "migration_lock", "upgrade", "downgrade", "current_revision", "head_revision", "check"]


def _script_location() -> str:
    return str(Path(migrations.__file__).resolve().parent)


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` with the ``migrations`` package as script location."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", _script_location())
    cfg.set_main_option("path_separator", "os")
    # ConfigParser interpolates '%': a percent-encoded password must be escaped to survive. The
    # raw URL also goes in attributes, which env.py prefers.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["url"] = url
    cfg.attributes["configure_logger"] = False
    return cfg


_PG_MIGRATION_LOCK = zlib.crc32(b"tidegate-migrations")
"""Key of the PostgreSQL session advisory lock that serializes migrations (the leader lock of
``providers.leader`` uses other keys)."""


@contextlib.contextmanager
def migration_lock(url: str) -> Iterator[None]:
    """Hold the database's migration lock: daemons starting together (the chart's two pods) take
    turns, and the second finds the schema at head instead of creating it a second time ("table
    alembic_version already exists"). PostgreSQL: a session advisory lock; a SQLite file: an
    exclusive ``flock`` on ``FILE.migrate-lock`` beside it (not on the database file, whose own
    locks SQLite manages); an in-memory SQLite database has nobody to race with."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "postgresql":
        engine = sa.create_engine(parsed, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _PG_MIGRATION_LOCK})
                try:
                    yield
                finally:
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_MIGRATION_LOCK})
                    conn.commit()
        finally:
            engine.dispose()
        return
    database = parsed.database or ""
    if (parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:")
            or not Path(database).parent.is_dir()):  # a missing folder: SQLite's own error says so
        yield
        return
    with open(f"{database}.migrate-lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def upgrade(url: str | sa.engine.Engine, revision: str = "head") -> None:
    """Migrate the database at ``url`` up to ``revision`` (creating the schema on an empty one),
    under :func:`migration_lock`, so concurrent callers take turns.

    An engine may be given instead of a URL: the migration then runs on one of its connections,
    which is the only way to migrate an in-memory SQLite database a repository will use.
    """
    if isinstance(url, str) and revision == "head" and current_revision(url) == head_revision():
        return  # nothing to do, and nothing of Alembic loaded
    from alembic import command

    if isinstance(url, str):
        with migration_lock(url):
            command.upgrade(alembic_config(url), revision)
        return
    cfg = alembic_config(url.url.render_as_string(hide_password=False))
    with url.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(url: str, revision: str) -> None:
    """Migrate down to ``revision`` (``"base"``: drop everything). Loses data; tests and rollbacks only."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)


_ASSIGNED = re.compile(r"^(revision|down_revision)\s*(?::[^=]+)?=\s*(.+?)\s*$", re.M)
_QUOTED = re.compile(r"""^(?:"([^"]*)"|'([^']*)')$""")


def _scripts_head() -> str | None:
    """The head read from the scripts' ``revision`` / ``down_revision`` lines; ``None`` when the
    lines say anything but a single chain of plain strings (a merge, a branch, an expression):
    then Alembic decides."""
    down_of: dict[str, str | None] = {}
    for path in Path(_script_location(), "versions").glob("*.py"):
        found: dict[str, str | None] = {}
        for name, value in _ASSIGNED.findall(path.read_text(encoding="utf-8")):
            quoted = _QUOTED.match(value)
            if name in found or (quoted is None and value != "None"):
                return None
            found[name] = None if quoted is None else (quoted.group(1) or quoted.group(2))
        if not found.get("revision") or "down_revision" not in found:
            return None
        down_of[str(found["revision"])] = found["down_revision"]
    heads = set(down_of) - set(down_of.values())
    return heads.pop() if len(heads) == 1 else None


def head_revision() -> str:
    """The newest revision of the scripts; raises if the scripts have several heads."""
    head = _scripts_head()
    if head is not None:
        return head
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    if head is None:
        raise SchemaNotCurrentError("no migration scripts found")
    return head


def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at; ``None`` for a database never migrated (the
    row of Alembic's version table, read without loading Alembic)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("alembic_version"):
                return None
            rows = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
    finally:
        engine.dispose()
    if len(rows) > 1:
        raise SchemaNotCurrentError(f"the database is at several revisions at once ({', '.join(sorted(rows))})")
    return rows[0] if rows else None


def check(url: str) -> None:
    """Raise :class:`SchemaNotCurrentError` unless the database at ``url`` is at the head revision.

    The daemon calls this at start instead of migrating by itself: schema changes are an
    operator's deliberate step (``tidegate db upgrade``), not a side effect of a restart.
    """
    current = current_revision(url)
    head = head_revision()
    if current != head:
        raise SchemaNotCurrentError(
            f"database schema is at {current or 'no revision (empty database)'}, expected {head}: "
            "run `tidegate db upgrade`"
        )
