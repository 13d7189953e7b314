"""The README's reference tables are generated from the schemas; they must not drift."""

from __future__ import annotations

from pathlib import Path

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
