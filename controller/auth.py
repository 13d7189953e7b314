"""Bearer-token authentication for the admin API, with two roles.

Tokens come from environment variables or files named in the daemon config (never from policy
files). An entry is either ``NAME:SECRET`` (the name becomes the audited author) or a bare
``SECRET`` (the author is then ``admin-<8 hex of its sha256>`` / ``viewer-...``, so logs never carry
the secret). Comparison is constant-time.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from controller.config import ApiConfig, TokenSource


class Role(str, enum.Enum):
    VIEWER = "viewer"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role

    @property
    def can_write(self) -> bool:
        return self.role is Role.ADMIN


def _entries(src: TokenSource, environ: dict[str, str]) -> list[str]:
    raw: list[str] = []
    if src.env and environ.get(src.env):
        raw += environ[src.env].split(",")
    if src.file is not None:
        path = Path(src.file)
        if not path.exists():
            raise FileNotFoundError(f"token file {path} does not exist")
        raw += path.read_text().splitlines()
    return [r.strip() for r in raw if r.strip() and not r.strip().startswith("#")]


class TokenAuth:
    def __init__(self, tokens: Iterable[tuple[str, str, Role]]) -> None:
        self._tokens = [(secret.encode(), name, role) for secret, name, role in tokens]

    @classmethod
    def from_config(cls, api: ApiConfig, environ: dict[str, str] | None = None) -> "TokenAuth":
        env = dict(os.environ if environ is None else environ)
        out: list[tuple[str, str, Role]] = []
        for src, role in ((api.admin_tokens, Role.ADMIN), (api.viewer_tokens, Role.VIEWER)):
            for entry in _entries(src, env):
                if ":" in entry:
                    name, secret = entry.split(":", 1)
                else:
                    name, secret = f"{role.value}-{hashlib.sha256(entry.encode()).hexdigest()[:8]}", entry
                out.append((secret, name, role))
        return cls(out)

    @property
    def empty(self) -> bool:
        return not self._tokens

    def from_header(self, authorization: str | None) -> Principal | None:
        """The principal of an ``Authorization: Bearer <secret>`` header value, or ``None``."""
        scheme, _, secret = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            return None
        return self.authenticate(secret.strip())

    def authenticate(self, secret: str) -> Principal | None:
        given = secret.encode()
        found: Principal | None = None
        for token, name, role in self._tokens:
            # check every token (no early exit) so timing does not reveal which matched
            if hmac.compare_digest(token, given):
                found = Principal(name, role)
        return found
