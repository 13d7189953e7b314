"""The Alembic migrations: one head, the same schema as the ORM models, reversible, ORM-free."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import migrations
from controller.db.migrate import (
    SchemaNotCurrentError,
    alembic_config,
    check,
    current_revision,
    downgrade,
    head_revision,
    migration_lock,
    upgrade,
)
from controller.db.models import Base
from tests import pysource

ROOT = Path(__file__).resolve().parents[2]

TABLES = {"decisions", "actions", "overrides", "audit_log", "policy_versions"}
VERSIONS_DIR = Path(migrations.__file__).parent / "versions"


def _diff(url: str, metadata: sa.MetaData) -> list[object]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
            return list(compare_metadata(ctx, metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_exactly_one_head() -> None:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    heads = script.get_heads()
    assert len(heads) == 1, f"several Alembic heads: {heads}; merge them"
    assert head_revision() == heads[0]


def test_scripts_head_is_read_only_from_a_single_chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The head read from the scripts' lines is Alembic's, and anything but a plain chain (a
    branch, a merge tuple) is left to Alembic."""
    from controller.db import migrate

    versions = tmp_path / "versions"
    versions.mkdir()
    monkeypatch.setattr(migrate, "_script_location", lambda: str(tmp_path))
    (versions / "a.py").write_text('revision = "a"\ndown_revision = None\n')
    (versions / "b.py").write_text("revision: str = 'b'\ndown_revision: str | None = 'a'\n")
    assert migrate._scripts_head() == "b"
    (versions / "c.py").write_text('revision = "c"\ndown_revision = "a"\n')  # a branch: two heads
    assert migrate._scripts_head() is None
    (versions / "c.py").write_text('revision = "c"\ndown_revision = ("a", "b")\n')  # a merge
    assert migrate._scripts_head() is None


def test_a_restart_on_a_database_at_head_does_not_load_alembic(db_url: str) -> None:
    upgrade(db_url)
    probe = ("import sys; from controller.db.migrate import upgrade, check; "
             f"upgrade({db_url!r}); check({db_url!r}); print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_daemons_first_start_migrates_in_a_child_and_loads_no_alembic(db_url: str) -> None:
    probe = ("import sys; from controller.db.preflight import upgrade_apart; from controller.db.migrate import check; "
             f"upgrade_apart({db_url!r}); check({db_url!r}); "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'mako')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_driver_error_in_the_migrating_child_is_one_database_error(tmp_path: Path) -> None:
    from controller.db.preflight import upgrade_apart
    from controller.errors import DatabaseError

    path = tmp_path / "read-only.db"
    sa.create_engine(f"sqlite:///{path}").connect().close()  # an empty file: readable, never migrated
    with pytest.raises(DatabaseError, match=r"^database .*\(TIDEGATE_DATABASE_URL\): attempt to write a readonly database"):
        upgrade_apart(f"sqlite:///file:{path}?mode=ro&uri=true", "TIDEGATE_DATABASE_URL")


def test_version_scripts_never_import_the_orm_models() -> None:
    scripts = sorted(VERSIONS_DIR.glob("*.py"))
    assert scripts, "no version scripts found"
    for path in scripts:
        tree = pysource.parse(path.read_text(), str(path))
        imported = [
            alias.name if isinstance(node, ast.Import) else (node.module or "")
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        ]
        offending = [name for name in imported if name.split(".")[0] == "controller"]
        assert not offending, f"{path.name} imports {offending}: migrations spell their DDL out"


def test_upgrade_matches_the_models_exactly(db_url: str) -> None:
    upgrade(db_url)
    assert current_revision(db_url) == head_revision()
    assert TABLES <= _tables(db_url)
    assert _diff(db_url, Base.metadata) == []


def test_the_comparison_would_see_a_drift(db_url: str) -> None:
    # Guards the empty-diff check above against comparing nothing: a model column the migration
    # does not create must show up.
    upgrade(db_url)
    drifted = sa.MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.tables.values():
        table.to_metadata(drifted)
    drifted.tables["decisions"].append_column(sa.Column("not_migrated", sa.Integer(), nullable=True))
    diff = _diff(db_url, drifted)
    assert [(d[0], d[3].name) for d in diff if isinstance(d, tuple)] == [("add_column", "not_migrated")]


def test_downgrade_to_base_then_upgrade_again(db_url: str) -> None:
    upgrade(db_url)
    downgrade(db_url, "base")
    assert current_revision(db_url) is None
    assert _tables(db_url) & TABLES == set()
    upgrade(db_url)
    assert current_revision(db_url) == head_revision()
    assert TABLES <= _tables(db_url)
    assert _diff(db_url, Base.metadata) == []


def test_downgrade_past_a_journal_replay_in_progress_is_refused_with_what_to_do(db_url: str) -> None:
    """Before 0004 a ``journal_replays`` row meant "replayed whole": downgrading while a journal is
    half replayed would let the older daemon drop its unwritten rest. Refused, saying what to do;
    once it is complete the downgrade goes through."""
    upgrade(db_url)
    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO journal_replays (journal_id, replayed_at, entries, next_offset, complete) "
                                 "VALUES ('j1', '2026-11-24 15:00:00', 12, 4096, :no)"), {"no": False})
        with pytest.raises(RuntimeError, match=r"journal replay in progress \(j1\).*until its journal is replayed"):
            downgrade(db_url, "0003_decision_outcomes")
        assert current_revision(db_url) == head_revision()
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE journal_replays SET complete = :yes"), {"yes": True})
    finally:
        engine.dispose()
    downgrade(db_url, "0003_decision_outcomes")
    assert current_revision(db_url) == "0003_decision_outcomes"


def test_check_refuses_a_database_not_at_head(db_url: str) -> None:
    with pytest.raises(SchemaNotCurrentError, match="tidegate db upgrade"):
        check(db_url)
    upgrade(db_url)
    check(db_url)  # at head: no error


def test_url_with_percent_encoded_password_survives_the_config() -> None:
    # ConfigParser interpolates '%'; the URL must come back exactly as given.
    url = "postgresql+psycopg://user:p%40ss%25word@127.0.0.1:5432/db"
    cfg = alembic_config(url)
    assert cfg.get_main_option("sqlalchemy.url") == url
    assert Path(cfg.get_main_option("script_location") or "") == Path(migrations.__file__).resolve().parent


def _upgrade_in_a_process(url: str) -> subprocess.Popen[str]:
    code = "import sys; from controller.db.migrate import upgrade; upgrade(sys.argv[1])"
    return subprocess.Popen([sys.executable, "-c", code, url], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_daemons_starting_together_take_turns_to_migrate(db_url: str) -> None:
    """The chart's two pods start at once on one database: the second used to fail with "table
    alembic_version already exists". While one holds the migration lock the others wait, then find
    the schema at head."""
    with migration_lock(db_url):
        waiting = [_upgrade_in_a_process(db_url) for _ in range(2)]
        time.sleep(3)  # ample time to import and migrate (about 1 s here) had they not waited
        assert all(p.poll() is None for p in waiting), [p.communicate()[0] for p in waiting]
        assert current_revision(db_url) is None
    for p in waiting:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out
    assert current_revision(db_url) == head_revision()
