"""The decision log: the daemon's memory and audit trail in SQL (SQLite or PostgreSQL).

``repo.Repository`` is the only way in and out; ``migrate`` creates and upgrades the schema with
Alembic; ``codec`` is the JSON form of the core's values shared by the log and the admin API;
``models`` are the ORM tables (used by the repository and by autogenerate checks only).
"""

from controller.db.migrate import SchemaNotCurrentError, alembic_config, check, current_revision, upgrade
from controller.db.repo import Repository, make_engine

__all__ = ["Repository", "make_engine", "upgrade", "check", "current_revision", "alembic_config", "SchemaNotCurrentError"]
