"""The admin API's client for the command line: where the daemon is, the token, and errors that
say what to do.

Where: ``--server URL`` / ``--token TOKEN``, else the environment (``TIDEGATE_URL``,
``TIDEGATE_TOKEN``), else a client file (``--client-config FILE``, else ``$TIDEGATE_CLIENT_CONFIG``,
else ``~/.config/tidegate/client.yaml``) with ``server:`` and ``token:`` (or ``token_file:``).
The token is sent as a bearer header and never printed: error lines name where it came from, never
its value.

A failed call is an :class:`controller.errors.ApiError` whose exit status scripts can rely on
(``EXIT_CODES``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import httpx
import yaml

from controller.errors import ApiError, UserError

EXIT_CODES: dict[int, str] = {
    0: "done; the answer is yes (validate: no problem found)",
    1: "done, and the answer is no: a validation (policy validate, config validate, policies) found problems; "
       "a replay or shadow report found time with less capacity than the load needed",
    2: "bad usage or input: a flag, a file, or a request the daemon refused (422), the message says which",
    3: "the daemon could not be reached (refused, timed out, not an HTTP server)",
    4: "not allowed: no token, a wrong token (401), or a viewer token on a write (403)",
    5: "not found: no such decision or override (404)",
    6: "the daemon failed (5xx); its log has the cause",
}
"""Exit status of every ``tidegate`` command that talks to a daemon (documented in the README)."""

_STATUS_EXIT = {401: 4, 403: 4, 404: 5, 409: 2, 413: 2, 422: 2, 400: 2}


def default_client_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tidegate" / "client.yaml"


@dataclass(frozen=True)
class Target:
    """A daemon to talk to: its URL, the token, and where each came from (for error lines)."""

    server: str
    token: str | None
    server_from: str
    token_from: str

    def __repr__(self) -> str:  # never the token, not even in a traceback's locals
        return f"Target(server={self.server!r}, token_from={self.token_from!r})"


def _client_file(path: str | None) -> tuple[dict[str, Any], str]:
    chosen = path or os.environ.get("TIDEGATE_CLIENT_CONFIG")
    file = Path(chosen) if chosen else default_client_file()
    if not file.exists():
        if chosen:
            raise UserError(f"client config {file} does not exist; write one with `server:` and `token_file:`, "
                            "or pass --server and --token")
        return {}, str(file)
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"client config {file} cannot be read ({type(e).__name__}); "
                        "it must be YAML with `server:` and `token:` or `token_file:`") from None
    if not isinstance(data, dict) or not set(data) <= {"server", "token", "token_file"}:
        raise UserError(f"client config {file}: expected a mapping with keys server, token, token_file")
    return data, str(file)


def resolve(server: str | None, token: str | None, client_config: str | None = None) -> Target:
    """Flags beat the environment, which beats the client file."""
    data, file = ({}, "") if server and token else _client_file(client_config)
    srv, srv_from = next(((v, w) for v, w in ((server, "--server"), (os.environ.get("TIDEGATE_URL"), "TIDEGATE_URL"),
                                              (data.get("server"), f"server in {file}")) if v),
                         (None, ""))
    if not srv:
        raise UserError("no daemon to talk to: pass --server URL, set TIDEGATE_URL, "
                        f"or write `server:` in {default_client_file()}")
    tok, tok_from = next(((v, w) for v, w in ((token, "--token"), (os.environ.get("TIDEGATE_TOKEN"), "TIDEGATE_TOKEN"),
                                              (data.get("token"), f"token in {file}")) if v), (None, "no token"))
    if tok is None and data.get("token_file"):
        tf = Path(str(data["token_file"])).expanduser()
        try:
            tok, tok_from = tf.read_text().strip(), f"token_file {tf}"
        except OSError as e:
            raise UserError(f"token_file {tf} (in {file}) cannot be read: {e.strerror}") from None
    srv = str(srv).rstrip("/")
    if not srv.startswith(("http://", "https://")):
        raise UserError(f"server {srv!r} (from {srv_from}) is not an http:// or https:// URL")
    return Target(srv, tok, srv_from, tok_from)


class Api:
    """Calls to one daemon's admin API; every failure is an :class:`ApiError` with its exit status."""

    def __init__(self, target: Target, *, timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None
                 ) -> None:
        self.target = target
        headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        self._http = httpx.Client(base_url=target.server, headers=headers, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Api":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
             json: Any = None, ok: tuple[int, ...] = (200, 201, 204)) -> Any:
        where = f"{method} {self.target.server}{path}"
        try:
            r = self._http.request(method, path, params={k: v for k, v in (params or {}).items() if v is not None},
                                   json=json)
        except httpx.HTTPError as e:
            raise ApiError(f"cannot reach the daemon at {self.target.server} (from {self.target.server_from}): "
                           f"{type(e).__name__}; is it running, and is the URL right?", exit_code=3) from None
        if r.status_code in ok:
            return None if r.status_code == 204 or not r.content else _json(r, where)
        raise ApiError(self._problem(r, where), exit_code=_STATUS_EXIT.get(r.status_code, 6 if r.status_code >= 500 else 2),
                       status=r.status_code)

    def _problem(self, r: httpx.Response, where: str) -> str:
        try:
            body = r.json()
            detail = str(body.get("detail", "")) if isinstance(body, dict) else ""
        except ValueError:
            detail = ""
        detail = detail or r.reason_phrase
        if r.status_code == 401:
            fix = ("pass --token or set TIDEGATE_TOKEN" if self.target.token is None
                   else f"the token from {self.target.token_from} is not one the daemon knows")
            return f"{where}: 401 {detail}; {fix}"
        if r.status_code == 403:
            return f"{where}: 403 {detail}; use an admin token (api.admin_tokens) for writes"
        return f"{where}: {r.status_code} {detail}"

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.call("POST", path, json=body)

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)


def _json(r: httpx.Response, where: str) -> Any:
    try:
        return r.json()
    except ValueError:
        raise ApiError(f"{where}: answered {r.status_code} with a body that is not JSON; is this a tidegate daemon?",
                       exit_code=3) from None
