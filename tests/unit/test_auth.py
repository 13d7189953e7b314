"""Bearer tokens: roles, names, files, and no secret in the author name."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.auth import Role, TokenAuth
from controller.config import ApiConfig, TokenSource


def test_named_and_bare_tokens_from_env() -> None:
    auth = TokenAuth.from_config(ApiConfig(), {"TIDEGATE_ADMIN_TOKENS": "alice:a1, bare-secret",
                                               "TIDEGATE_VIEWER_TOKENS": "victor:v1"})
    a = auth.authenticate("a1")
    assert a is not None and a.name == "alice" and a.role is Role.ADMIN and a.can_write
    b = auth.authenticate("bare-secret")
    assert b is not None and b.role is Role.ADMIN and "bare-secret" not in b.name and b.name.startswith("admin-")
    v = auth.authenticate("v1")
    assert v is not None and v.role is Role.VIEWER and not v.can_write
    assert auth.authenticate("a1 ") is None and auth.authenticate("") is None


def test_tokens_from_files_skip_comments(tmp_path: Path) -> None:
    f = tmp_path / "viewers"
    f.write_text("# team\nops:o1\n\n")
    api = ApiConfig(viewer_tokens=TokenSource(file=f), admin_tokens=TokenSource(env="NOPE"))
    auth = TokenAuth.from_config(api, {})
    assert auth.authenticate("o1").name == "ops"  # type: ignore[union-attr]
    assert auth.authenticate("# team") is None


def test_missing_token_file_is_a_clear_error(tmp_path: Path) -> None:
    api = ApiConfig(admin_tokens=TokenSource(file=tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="absent"):
        TokenAuth.from_config(api, {})


def test_no_tokens_means_empty() -> None:
    assert TokenAuth.from_config(ApiConfig(), {}).empty


@pytest.mark.parametrize("header,name", [
    ("Bearer a1", "alice"), ("bearer a1", "alice"), ("Bearer  a1 ", "alice"),
    (None, None), ("", None), ("Bearer", None), ("Bearer ", None), ("Basic a1", None), ("a1", None),
    ("Bearer a2", None),
])
def test_from_header_reads_only_a_bearer_token(header: str | None, name: str | None) -> None:
    auth = TokenAuth.from_config(ApiConfig(), {"TIDEGATE_ADMIN_TOKENS": "alice:a1"})
    who = auth.from_header(header)
    assert (who.name if who else None) == name
