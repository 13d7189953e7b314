"""The decision core and the policies stay pure: no forbidden imports, no clock reads.

Two independent checks: the import-linter contracts declared in ``pyproject.toml`` (run with the
venv's import-linter, exactly as CI does), and an AST scan for calls that read the clock
(``datetime.now/utcnow/today``, ``date.today``, any ``time.*`` call, or any ``.now()`` at all: in
pure code time arrives as ``now``). The scanner is tested against a known-bad snippet so that a
silent scanner cannot pass.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from tests import pysource

ROOT = Path(__file__).resolve().parents[2]
PURE_DIRS = (ROOT / "controller" / "core", ROOT / "policies")
CLOCK_METHODS = frozenset({"now", "utcnow", "today"})


def clock_reads(source: str, filename: str = "<src>") -> list[str]:
    """Calls in ``source`` that read the wall clock, as ``file:line: call`` strings."""
    tree = pysource.parse(source, filename)
    time_modules: set[str] = set()  # names bound to the time module
    time_functions: set[str] = set()  # names bound to functions from it
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "time":
                    time_modules.add(alias.asname or "time")
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            for alias in node.names:
                time_functions.add(alias.asname or alias.name)
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        bad = False
        if isinstance(func, ast.Attribute):
            # datetime.now(), datetime.datetime.utcnow(), date.today(), clock.now(), ...
            if func.attr in CLOCK_METHODS:
                bad = True
            # time.time(), time.monotonic(), t.perf_counter() with `import time as t`
            elif isinstance(func.value, ast.Name) and func.value.id in time_modules:
                bad = True
        elif isinstance(func, ast.Name) and func.id in time_functions:
            bad = True
        if bad:
            found.append(f"{filename}:{node.lineno}: {ast.unparse(func)}()")
    return found


def pure_files() -> list[Path]:
    return sorted(p for d in PURE_DIRS for p in d.rglob("*.py"))


def test_scanner_finds_clock_reads() -> None:
    bad = """
import time as t
import datetime
from datetime import date, datetime as dt
from time import monotonic

a = datetime.datetime.now()
b = dt.utcnow()
c = date.today()
d = t.time()
e = monotonic()
f = clock.now()
ok = dt.fromisoformat("2025-01-01T00:00:00")
ok2 = ctx.now
"""
    found = clock_reads(bad)
    assert [line.split(": ", 1)[1] for line in found] == [
        "datetime.datetime.now()", "dt.utcnow()", "date.today()", "t.time()", "monotonic()", "clock.now()",
    ]


def test_pure_code_exists_to_scan() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in pure_files()}
    for expected in ("controller/core/pipeline.py", "controller/core/placement.py",
                     "controller/core/stabilize.py", "controller/core/overrides.py", "policies/base.py"):
        assert expected in names


def test_no_clock_reads_in_core_and_policies() -> None:
    found: list[str] = []
    for path in pure_files():
        found += clock_reads(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
    assert found == [], "pure code reads the clock:\n" + "\n".join(found)


def test_import_linter_contracts_kept() -> None:
    pytest.importorskip("importlinter", reason="import-linter is not installed (pip install -e .[test])")
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                               "sys.exit(lint_imports(no_cache=True, no_logo=True))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "0 broken" in out and "pure" in out, out


# --- no cloud in the core or the simulator's controllers ------------------------------------------

PROVIDER_NEUTRAL = sorted([*(ROOT / "controller" / "core").rglob("*.py"),
                           *(ROOT / "controller" / "sim" / n for n in ("baselines.py", "engine.py", "spot.py"))])


def provider_names_in_code(source: str, names: set[str], filename: str = "<src>") -> list[str]:
    """Identifiers and string constants (docstrings and comments aside) that name a pool
    provider, as ``file:line: text``: code that decides by a cloud's name instead of a pool's tier."""
    import re

    pattern = re.compile(rf"(?<![a-z])({'|'.join(sorted(names))})(?![a-z])", re.IGNORECASE)
    tree = pysource.parse(source, filename)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            text = node.name
        if text is not None and pattern.search(text):
            found.append(f"{filename}:{getattr(node, 'lineno', 0)}: {text!r}")
    return found


def test_the_scanner_finds_a_cloud_name() -> None:
    bad = 'AWS_SPOT = "aws-spot"\nif pool.cloud == "gcp":\n    pass\n"""aws in a docstring is fine"""\n'
    assert len(provider_names_in_code(bad, {"aws", "gcp"})) == 3


def test_no_provider_is_named_in_the_core_or_the_simulators_controllers() -> None:
    from providers.registry import installed

    names = set(installed().names()) - {"onprem"}
    assert {"aws", "gcp"} <= names
    found = [hit for p in PROVIDER_NEUTRAL for hit in provider_names_in_code(p.read_text(), names, str(p.relative_to(ROOT)))]
    assert found == [], "decide by the pool's tier, or ask the provider registry:\n" + "\n".join(found)
