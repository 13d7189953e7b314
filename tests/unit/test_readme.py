"""The README's reference tables and docs/config.md are generated from the schemas; they must not drift."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from controller.docs import render_readme

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_tables_match_the_schemas() -> None:
    text = README.read_text()
    assert render_readme(text) == text, "README is stale: run `python -m controller.docs README.md`"


def test_readme_has_the_two_commands_and_every_route() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    from controller.api import create_app

    class _D:  # the app only needs attributes at request time
        pass

    app = create_app(_D(), None)  # type: ignore[arg-type]
    for route in app.routes:
        path = getattr(route, "path", "")
        if path.startswith(("/docs", "/openapi")):
            continue
        base = path.split("{")[0].rstrip("/")
        assert base in text, f"route {path} is not documented in the README"


def _gen_config() -> Any:
    spec = importlib.util.spec_from_file_location("gen_config", README.parent / "docs" / "gen_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_config_md_matches_the_config_schema_and_the_providers(capsys: pytest.CaptureFixture[str]) -> None:
    assert _gen_config().main(["--check"]) == 0, capsys.readouterr().err


def test_a_stale_config_reference_is_named_with_the_command_that_fixes_it(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    gen = _gen_config()
    out = tmp_path / "config.md"
    assert gen.main(["--out", str(out)]) == 0
    text = out.read_text()
    for field in ("`api.ui`", "`database.url`", "`pools[].aws.auto_scaling_group`"):
        assert field in text
    out.write_text(text.replace("`api.ui`", "`api.old_name`"))
    assert gen.main(["--check", "--out", str(out)]) == 1
    assert "is stale: run `python docs/gen_config.py`" in capsys.readouterr().err
