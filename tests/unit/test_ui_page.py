"""The status page's pure parts: timeline thinning (a long window is sent as at most about
``limit`` evenly spaced points, never losing a decision that changed something: those are its
markers), and the package shipping the page's files."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from controller.ui import thin


@given(changed=st.lists(st.booleans(), max_size=600), limit=st.integers(min_value=2, max_value=200))
def test_thin_keeps_every_change_the_ends_and_about_limit_points(changed: list[bool], limit: int) -> None:
    points = [{"id": i, "changed": c} for i, c in enumerate(changed)]
    kept = thin(points, limit)
    ids = [p["id"] for p in kept]
    assert ids == sorted(set(ids)), "in order, no duplicates"
    assert {p["id"] for p in points if p["changed"]} <= set(ids)
    if points:
        assert ids[0] == 0 and ids[-1] == len(points) - 1
    unchanged_kept = sum(1 for p in kept if not p["changed"])
    assert unchanged_kept <= limit + 1
    if len(points) <= limit:
        assert kept == points


def test_the_package_ships_every_file_of_the_page() -> None:
    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["controller"]
    assets = sorted((root / "controller" / "ui_assets").iterdir())
    assert {a.name for a in assets} >= {"ui.js", "ui.css"}
    for asset in assets:
        rel = asset.relative_to(root / "controller").as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not in [tool.setuptools.package-data]"
