"""The admin API against hostile clients, over real sockets to a real uvicorn on 127.0.0.1 in front of
a real daemon (simulated fleet; SQLite, and PostgreSQL where the database matters).

What a client sees: a body is refused (401 without a valid token, 413 over ``api.max_body_bytes``)
before it is read; numbers the database cannot hold are a 422 that names the field, never a 500;
a per-pool pin obeys the same cap as a total pin; every error is ``application/problem+json`` and
the OpenAPI document says so; ``/docs`` needs nothing but the daemon.
"""

from __future__ import annotations

import re
import select
import socket
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.integration.daemon_harness import DEFAULT_POLICY, Harness, build_harness, serving

ADMIN = "hostile-admin"
VIEWER = "hostile-viewer"
MODEL = "llama3-70b-fp8"
TOKENS = {"TIDEGATE_ADMIN_TOKENS": f"alice:{ADMIN}", "TIDEGATE_VIEWER_TOKENS": f"victor:{VIEWER}"}
MiB = 1 << 20


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _serve(tmp_path: Path, db_url: str | None = None, api: dict[str, Any] | None = None,
           policy: str = DEFAULT_POLICY) -> Iterator[tuple[Harness, httpx.Client]]:
    tmp_path.mkdir(exist_ok=True)
    h = build_harness(tmp_path, db_url=db_url, config_updates={"api": api} if api else None, policy=policy)
    h.run(30)
    with serving(h, TOKENS) as url, httpx.Client(base_url=url, timeout=10) as client:
        yield h, client


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Harness, httpx.Client]]:
    yield from _serve(tmp_path)


@pytest.fixture
def api_on_db(tmp_path: Path, db_url: str) -> Iterator[tuple[Harness, httpx.Client]]:
    """The API on SQLite, then on PostgreSQL."""
    yield from _serve(tmp_path, db_url)


def _is_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json"), r.headers
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["type"] == "about:blank" and body["title"] and body["detail"], body
    return body


# --- bodies are refused before they are read ----------------------------------------------------

def _peak_rss_reset() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM restarts from the current RSS


def _peak_rss() -> int:
    m = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
    assert m
    return int(m.group(1)) * 1024


def _push(port: int, headers: str, total: int, chunked: bool) -> tuple[int, int, float, bool]:
    """Send ``headers`` then up to ``total`` body bytes while the server takes them. Returns
    (status, body bytes sent, seconds until the answer, whether the server closed the connection)."""
    piece = b"0" * MiB
    frame = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    start = time.monotonic()
    sock.sendall(headers.encode())
    sock.setblocking(False)
    sent, answer, answered_at, closed = 0, b"", 0.0, False
    try:
        while not closed and time.monotonic() - start < 20:
            if answer and sent >= total:
                break
            readable, writable, _ = select.select([sock], [sock] if sent < total else [], [], 5)
            if not readable and not writable:
                break
            try:
                if readable:
                    data = sock.recv(65536)
                    closed = not data
                    if data and not answer:
                        answered_at = time.monotonic() - start
                    answer += data
                elif writable:
                    sent += sock.send(frame)
            except BlockingIOError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                closed = True
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ")[1]), sent, answered_at, closed


@pytest.mark.parametrize("token,chunked,status", [
    (None, False, 401), (None, True, 401), ("wrong", False, 401),  # no or a bad token: never read
    (ADMIN, False, 413), (ADMIN, True, 413),                       # over the limit: never parsed
])
def test_a_300_mb_body_is_refused_before_it_is_read(api: tuple[Harness, httpx.Client], token: str | None,
                                                     chunked: bool, status: int) -> None:
    _, c = api
    port = urlsplit(str(c.base_url)).port
    assert port is not None
    total = 300 * MiB
    head = "POST /v1/overrides HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {total}\r\n"
    head += f"Authorization: Bearer {token}\r\n" if token else ""
    _peak_rss_reset()
    before = _peak_rss()
    got, sent, seconds, closed = _push(port, head + "\r\n", total, chunked)
    assert got == status
    assert seconds < 3, f"answered after {seconds:.1f} s"
    assert closed, "the server kept the connection open"
    assert sent < 32 * MiB, f"the server took {sent / MiB:.0f} MiB of the body"
    assert _peak_rss() - before < 48 * MiB, "memory grew with the body"


@pytest.mark.parametrize("chunked", [False, True])
def test_body_limit_is_configurable_and_a_body_at_the_limit_passes(tmp_path: Path, chunked: bool) -> None:
    limit = 2048
    for _, c in _serve(tmp_path, api={"max_body_bytes": limit}):
        body = b'{"kind": "freeze", "model": "%s", "reason": "r"}' % MODEL.encode()
        at_limit = body + b" " * (limit - len(body))
        over = at_limit + b" "

        def send(data: bytes) -> httpx.Response:
            content: Any = iter([data[:1000], data[1000:]]) if chunked else data  # an iterator goes chunked
            return c.post("/v1/overrides", headers={**_h(ADMIN), "Content-Type": "application/json"}, content=content)

        assert send(at_limit).status_code == 201
        problem = _is_problem(send(over), 413)
        assert "2048" in problem["detail"] and "api.max_body_bytes" in problem["detail"]


# --- integers the database can hold ---------------------------------------------------------------

def test_ids_beyond_an_integer_column_are_422_on_both_databases(api_on_db: tuple[Harness, httpx.Client]) -> None:
    _, c = api_on_db
    for n in (2**31, 3_000_000_000, 2**63, 10**30):
        for method, path, query, field in (("GET", f"/v1/decisions/{n}", None, "decision_id"),
                                           ("DELETE", f"/v1/overrides/{n}", None, "override_id"),
                                           ("GET", "/v1/decisions", {"before_id": str(n)}, "before_id")):
            body = _is_problem(c.request(method, path, params=query, headers=_h(ADMIN)), 422)
            assert [e["loc"][-1] for e in body["errors"]] == [field], body


def test_the_largest_id_is_a_plain_404(api_on_db: tuple[Harness, httpx.Client]) -> None:
    _, c = api_on_db
    _is_problem(c.get(f"/v1/decisions/{2**31 - 1}", headers=_h(VIEWER)), 404)
    assert c.get("/v1/decisions", params={"before_id": 2**31 - 1}, headers=_h(VIEWER)).json()["items"]


@pytest.mark.parametrize("body,field", [
    ({"kind": "pin", "model": MODEL, "pool": "onprem-h100", "replicas": 10**12, "reason": "r"}, "replicas"),
    ({"kind": "pin", "model": MODEL, "replicas": 2**31, "reason": "r"}, "replicas"),
    ({"kind": "bounds", "model": MODEL, "min_replicas": 3_000_000_000, "reason": "r"}, "min_replicas"),
    ({"kind": "freeze", "model": MODEL, "reason": "nul \u0000 byte"}, "reason"),
])
def test_oversized_numbers_and_nul_bytes_are_422_on_both_databases(api_on_db: tuple[Harness, httpx.Client],
                                                                   body: dict[str, Any], field: str) -> None:
    _, c = api_on_db
    problem = _is_problem(c.post("/v1/overrides", headers=_h(ADMIN), json=body), 422)
    assert field in [e["loc"][-1] for e in problem["errors"]], problem
    assert c.get("/v1/overrides", headers=_h(ADMIN)).json()["items"] == []


def test_pause_reason_with_a_nul_byte_is_422_on_both_databases(api_on_db: tuple[Harness, httpx.Client]) -> None:
    _, c = api_on_db
    problem = _is_problem(c.post("/v1/pause", headers=_h(ADMIN), json={"reason": "a\u0000b"}), 422)
    assert problem["errors"][0]["field"] == "body.reason"
    assert c.get("/v1/status", headers=_h(ADMIN)).json()["paused"] is False


@pytest.mark.parametrize("since", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_timestamp_that_leaves_the_calendar_in_utc_is_422(api: tuple[Harness, httpx.Client], since: str) -> None:
    _, c = api
    problem = _is_problem(c.get("/v1/decisions", params={"since": since}, headers=_h(VIEWER)), 422)
    assert problem["errors"][0]["field"] == "query.since"


@pytest.fixture
def api_max_10(tmp_path: Path) -> Iterator[tuple[Harness, httpx.Client]]:
    """A policy whose hard max (10) lies between the on-prem pool's capacity (8) and the clouds' (12)."""
    yield from _serve(tmp_path, policy=DEFAULT_POLICY.replace("max_replicas: 24", "max_replicas: 10"))


def test_a_per_pool_pin_is_capped_like_a_total_pin(api_max_10: tuple[Harness, httpx.Client]) -> None:
    h, c = api_max_10
    model = h.daemon.models[MODEL]
    hard_max = h.daemon.policy_store.policies()[MODEL].spec.bounds.max_replicas
    held = {p: h.daemon.pools[p].max_replicas(model) for p in model.pools}
    big = [p for p in model.pools if held[p] >= hard_max]
    small = [p for p in model.pools if held[p] < hard_max]
    assert big and small, (held, hard_max)

    def pin(pool: str | None, n: int) -> httpx.Response:
        return c.post("/v1/overrides", headers=_h(ADMIN),
                      json={"kind": "pin", "model": MODEL, "pool": pool, "replicas": n, "reason": "r"})

    for pool in (None, *big):  # the policy's hard max caps a pool's pin as it caps the total
        problem = _is_problem(pin(pool, hard_max + 1), 422)
        assert problem["errors"][0]["field"] == "body.replicas", problem
        assert f"replicas ({hard_max + 1}) exceeds the policy's max_replicas ({hard_max})" in problem["detail"]
    for pool in small:  # and a pool's capacity caps that pool's pin
        problem = _is_problem(pin(pool, held[pool] + 1), 422)
        assert f"what pool {pool} holds ({held[pool]}" in problem["detail"], problem
    assert pin(small[0], held[small[0]]).status_code == 201
    assert pin(big[0], hard_max).status_code == 201
    assert pin(None, hard_max).status_code == 201


# --- problems, in the answers and in the document -------------------------------------------------

def test_every_error_is_a_problem_document(api: tuple[Harness, httpx.Client]) -> None:
    _, c = api
    assert _is_problem(c.get("/v1/status"), 401)["detail"] == "missing bearer token"
    assert c.get("/v1/status").headers["www-authenticate"] == "Bearer"
    _is_problem(c.get("/v1/status", headers=_h("nope")), 401)
    _is_problem(c.post("/v1/pause", headers=_h(VIEWER)), 403)
    _is_problem(c.get("/v1/decisions/999999", headers=_h(VIEWER)), 404)
    _is_problem(c.get("/no/such/route", headers=_h(VIEWER)), 404)
    body = _is_problem(c.post("/v1/overrides", headers=_h(ADMIN), json={"kind": "pin", "model": MODEL,
                                                                         "replicas": -1, "reason": "r"}), 422)
    assert [e["field"] for e in body["errors"]] == ["body.replicas"]
    assert body["detail"].startswith("body.replicas: ")


def test_the_openapi_document_lists_the_problems_of_each_route(api: tuple[Harness, httpx.Client]) -> None:
    _, c = api
    doc = c.get("/openapi.json").json()
    problem = doc["components"]["schemas"]["Problem"]
    assert {"type", "title", "status", "detail", "errors"} <= set(problem["properties"])
    assert {"title", "status", "detail"} <= set(problem["required"])
    expected = {
        ("get", "/v1/status"): {"401"},
        ("get", "/v1/decisions"): {"401", "422", "503"},
        ("get", "/v1/decisions/{decision_id}"): {"401", "404", "422", "503"},
        ("post", "/v1/overrides"): {"400", "401", "403", "413", "422", "503"},
        ("delete", "/v1/overrides/{override_id}"): {"401", "403", "404", "422", "503"},
        ("post", "/v1/pause"): {"400", "401", "403", "413", "422"},
        ("post", "/v1/policies/reload"): {"401", "403", "422", "503"},
        ("get", "/v1/audit"): {"401", "422", "503"},
    }
    for (method, path), codes in expected.items():
        responses = doc["paths"][path][method]["responses"]
        errors = {code for code in responses if code[0] in "45"}
        assert errors == codes, (method, path, errors)
        for code in codes:
            assert list(responses[code]["content"]) == ["application/problem+json"], (method, path, code)
    assert doc["paths"]["/v1/decisions/{decision_id}"]["get"]["parameters"][0]["schema"]["maximum"] == 2**31 - 1


# --- /docs without the internet ------------------------------------------------------------------

def test_docs_reference_no_external_host_and_their_assets_are_served(api: tuple[Harness, httpx.Client]) -> None:
    _, c = api
    r = c.get("/docs")
    assert r.status_code == 200 and "swagger" in r.text.lower()
    assert not re.findall(r"(?:https?:)?//[\w.-]+", r.text), "the page names another host"
    refs = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", r.text)
    assert any(ref.endswith(".js") for ref in refs) and any(ref.endswith(".css") for ref in refs), refs
    for ref in refs:
        got = c.get(httpx.URL(str(c.base_url) + "/docs").join(ref))
        assert got.status_code == 200 and got.content, ref


def test_docs_can_require_a_token_or_be_off(tmp_path: Path) -> None:
    for _, c in _serve(tmp_path / "token", api={"docs_require_token": True}):
        for path in ("/docs", "/openapi.json", "/docs/assets/swagger-ui.css"):
            _is_problem(c.get(path), 401)
            assert c.get(path, headers=_h(VIEWER)).status_code == 200
    for _, c in _serve(tmp_path / "off", api={"docs": False}):
        for path in ("/docs", "/openapi.json"):
            _is_problem(c.get(path, headers=_h(ADMIN)), 404)


def test_405_lists_every_method_of_the_path(api: tuple[Harness, httpx.Client]) -> None:
    _, c = api
    r = c.request("PUT", "/v1/overrides", headers=_h(ADMIN))
    _is_problem(r, 405)
    assert r.headers["allow"] == "GET, POST"
