"""Alembic environment for the decision log.

Run through ``controller.db.migrate`` (``tidegate db upgrade``), which builds the Alembic config in
code and may hand over an open connection in ``config.attributes["connection"]``; or through the
plain ``alembic -c migrations/alembic.ini ...`` command, where the URL comes from
``TIDEGATE_DATABASE_URL`` (or ``sqlalchemy.url`` in the ini file).

The ORM metadata is imported here only as the *target* of autogenerate comparisons
(``alembic revision --autogenerate``, the empty-diff check in the tests); the version scripts
themselves spell their DDL out and never import the models.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool
from sqlalchemy.engine import Connection

from controller.db.models import Base

config = context.config

# Only the command-line entry point (an ini file) configures logging; the daemon and the tests own
# their logging and must not have it replaced by a migration run.
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url") or os.environ.get("TIDEGATE_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: set TIDEGATE_DATABASE_URL or use `tidegate db upgrade`")
    return str(url)


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        # SQLite cannot ALTER most things: batch mode recreates the table in later migrations.
        render_as_batch=connection.dialect.name == "sqlite",
    )


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade head --sql``) without a database."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
