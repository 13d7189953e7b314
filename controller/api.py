"""The admin REST API: see the state, read the decision log, override, pause, reload policies.

FastAPI app built around a running ``Daemon`` (``create_app(daemon, auth, api)``), served by
uvicorn inside the daemon process. Reads need a viewer or admin bearer token, writes an admin one;
every write is audited with its author. ``/healthz``, ``/readyz`` and ``/metrics`` are open (probes
and Prometheus scrape them); ``/docs`` and ``/openapi.json`` are open unless
``api.docs_require_token``.

Hostile clients: an ASGI guard in front of the app checks the token from the headers alone and
answers 401 before a byte of the body is read, then refuses a body over ``api.max_body_bytes``
with 413 (from Content-Length, or while reading a chunked body, buffering at most that much)
before anything parses it. Every integer that reaches the database is bounded by what its column
holds on both backends.

Errors are errors: every 4xx/5xx is ``application/problem+json`` (RFC 9457: ``type``, ``title``,
``status``, ``detail``; a 422 adds ``errors``, one entry per offending field), and the OpenAPI
document lists the problems each route can answer. Nothing answers 200 on a failure.
"""


import enum
import logging
import threading
from datetime import datetime, timedelta, timezone
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Awaitable, Callable, Mapping

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controller import ui
from controller.auth import Principal, TokenAuth
from controller.config import ApiConfig
from controller.core.model import OverrideKind
from controller.core.overrides import replica_cap
from controller.db.codec import override_to_json
from controller.db.models import INTEGER_MAX
from controller.db.recorder import UNAVAILABLE, database_words
from controller.metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from controller.daemon import Daemon

logger = logging.getLogger("tidegate.api")

_bearer = HTTPBearer(auto_error=False)

PROBLEM = "application/problem+json"
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Answer without a token (probes and Prometheus)."""
DOCS_PATHS = frozenset({"/docs", "/openapi.json"})
DOCS_ASSETS = "/docs/assets"


def _docs_assets_dir() -> Path:
    # fastapi-offline ships the Swagger UI 5 dist (bundle, css, favicon): served by the daemon,
    # so /docs works without reaching any CDN.
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


# --- bodies ----------------------------------------------------------------------------------

_NO_NUL = r"^[^\x00]*$"
"""PostgreSQL text and jsonb cannot hold NUL: refused with a 422 instead of a database error."""

Count = Annotated[int, Field(ge=0, le=INTEGER_MAX)]
Id = Annotated[int, PathParam(ge=1, le=INTEGER_MAX, description="Row id.")]


class OverrideKindIn(str, enum.Enum):
    pin = "pin"
    bounds = "bounds"
    freeze = "freeze"
    drain_pool = "drain-pool"


class OverrideIn(BaseModel):
    """An operator override. ``ttl_s`` makes it expire by itself; without it, it lasts until deleted."""

    model_config = ConfigDict(extra="forbid")

    kind: OverrideKindIn = Field(description="pin, bounds, freeze or drain-pool.")
    model: str = Field(min_length=1, max_length=253, description="Model name it applies to.")
    pool: str | None = Field(None, min_length=1, max_length=253,
                             description="Pool scope (required for drain-pool; optional for pin).")
    replicas: Count | None = Field(None, description="For pin: the replicas (of the pool when pool is set, else total); at most the policy's max_replicas and what the scope holds.")
    min_replicas: Count | None = Field(None, description="For bounds.")
    max_replicas: Count | None = Field(None, description="For bounds; at most the policy's max_replicas.")
    ttl_s: float | None = Field(None, gt=0, le=30 * 86400, description="Seconds until it expires by itself.")
    reason: str = Field(min_length=1, max_length=500, pattern=_NO_NUL, description="Why (audited).")

    @model_validator(mode="after")
    def _per_kind(self) -> "OverrideIn":
        k = self.kind
        if k is OverrideKindIn.pin and self.replicas is None:
            raise ValueError("pin needs replicas")
        if k is OverrideKindIn.bounds:
            if self.min_replicas is None and self.max_replicas is None:
                raise ValueError("bounds needs min_replicas and/or max_replicas")
            if (self.min_replicas is not None and self.max_replicas is not None
                    and self.min_replicas > self.max_replicas):
                raise ValueError(f"min_replicas ({self.min_replicas}) is greater than max_replicas ({self.max_replicas})")
        if k is OverrideKindIn.drain_pool and not self.pool:
            raise ValueError("drain-pool needs pool")
        return self


class ReplayIn(BaseModel):
    """A counterfactual replay: the decision log's window under another policy (``controller.replay``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    since: datetime = Field(alias="from", description="Window start, ISO-8601 with a timezone, inclusive.")
    until: datetime = Field(alias="to", description="Window end, ISO-8601 with a timezone, exclusive.")
    policy: str = Field(min_length=1, pattern=_NO_NUL, description="The policy file's YAML text.")
    policy_file: str = Field("policy.yaml", max_length=253, description="Its name, for error lines.")
    model: str | None = Field(None, max_length=253, description="Which model's policy in the file (if several).")


class ControlIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field("", max_length=500, pattern=_NO_NUL)


# --- problems (RFC 9457) -----------------------------------------------------------------------

class FieldError(BaseModel):
    """One offending field of a 422."""

    field: str = Field(description="Where, dotted: body.replicas, query.limit, path.decision_id.")
    loc: list[str | int] = Field(description="The same place as a list.")
    msg: str
    type: str


class Problem(BaseModel):
    """An error (RFC 9457 problem details), served as application/problem+json."""

    model_config = ConfigDict(extra="allow")

    type: str = Field("about:blank", description="about:blank: the status code says what kind of problem it is.")
    title: str = Field(description="The status code's phrase.")
    status: int
    detail: str = Field(description="What went wrong here, and how to fix it.")
    errors: list[FieldError] | None = Field(None, description="422 only: every offending field.")


_WHEN = {
    400: "Body that is not UTF-8 JSON.",
    401: "No valid bearer token (checked before the body is read).",
    403: "A viewer token on a write: writes need an admin token.",
    404: "No such id.",
    413: "Body larger than api.max_body_bytes (refused before it is read).",
    422: "Invalid path, query or body: `errors` names each field.",
    503: "The decision log's database is unavailable (connection refused or lost, disk full): what the "
         "request had to read or store there was not done; `Retry-After` says when to try again.",
}


DATABASE_RETRY_AFTER_S = 5
"""``Retry-After`` of a 503 for an unavailable database, seconds: one tick of the default loop."""


def _problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the problems a route can answer."""
    ref = {"$ref": "#/components/schemas/Problem"}
    return {c: {"description": _WHEN[c], "content": {PROBLEM: {"schema": ref}}} for c in codes}


def problem_response(status: int, detail: str, *, errors: list[FieldError] | None = None,
                     headers: Mapping[str, str] | None = None, **extensions: Any) -> JSONResponse:
    body = Problem(title=HTTPStatus(status).phrase, status=status, detail=detail, errors=errors, **extensions)
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=dict(headers or {}),
                        media_type=PROBLEM)


def _field_errors(raw: Any) -> list[FieldError]:
    out = []
    for e in raw:
        loc = [x if isinstance(x, int) else str(x) for x in e.get("loc", ())]
        out.append(FieldError(field=".".join(map(str, loc)) or "(request)", loc=loc, msg=str(e.get("msg", "")),
                              type=str(e.get("type", "value_error"))))
    return out


def _unprocessable(loc: list[str | int], msg: str) -> RequestValidationError:
    return RequestValidationError([{"loc": tuple(loc), "msg": msg, "type": "value_error"}])


# --- the guard ---------------------------------------------------------------------------------

class _Guard:
    """Pure ASGI middleware: token check, then body size limit, before the app reads the body."""

    def __init__(self, app: ASGIApp, *, auth: TokenAuth, max_body_bytes: int,
                 is_open: Callable[[str], bool]) -> None:
        self.app = app
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self.is_open = is_open

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        # A refused request's body is never read; `Connection: close` makes uvicorn close the
        # connection right after the answer instead of receiving (and discarding) the rest.
        close = {"Connection": "close"} if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers else {}
        if not self.is_open(scope["path"]):
            who = self.auth.from_header(headers.get("authorization"))
            why = ""
            if who is None and "authorization" not in headers:  # the status page's cookie (controller/ui.py)
                who, why = ui.cookie_principal(self.auth, headers, scope["method"])
            if who is None:
                detail = why or ("missing bearer token" if "authorization" not in headers
                                 else "invalid token (expected `Authorization: Bearer <token>`)")
                await problem_response(401, detail, headers={"WWW-Authenticate": "Bearer", **close})(scope, receive, send)
                return
            scope.setdefault("state", {})["principal"] = who
        limit = self.max_body_bytes
        too_big = problem_response(413, f"request body over {limit} bytes (api.max_body_bytes)", headers=close)
        length = headers.get("content-length")
        if length is not None:
            if not length.strip().isdigit():
                await problem_response(400, f"bad Content-Length {length!r}")(scope, receive, send)
                return
            if int(length) > limit:
                await too_big(scope, receive, send)
                return
        elif "transfer-encoding" in headers:
            # No length announced: read at most `limit` bytes ourselves, then replay them.
            body = await _read_at_most(receive, limit)
            if body is None:
                await too_big(scope, receive, send)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)


async def _read_at_most(receive: Receive, limit: int) -> bytes | None:
    """The whole body if it is at most ``limit`` bytes, else ``None`` (the rest is never read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # client gone: the app sees an empty body and its answer goes nowhere
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


# --- the app -----------------------------------------------------------------------------------

def create_app(daemon: "Daemon", auth: TokenAuth, api: ApiConfig | None = None) -> FastAPI:
    api = api or ApiConfig()
    app = FastAPI(title="tidegate admin API", version="1", docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json" if api.docs else None)
    write_lock = threading.Lock()

    def is_open(path: str) -> bool:
        if path in OPEN_PATHS or (api.ui and ui.is_open(path)):
            return True
        docs = path in DOCS_PATHS or path.startswith(DOCS_ASSETS + "/")
        return api.docs and docs and not api.docs_require_token

    app.add_middleware(_Guard, auth=auth, max_body_bytes=api.max_body_bytes, is_open=is_open)

    def principal(request: Request,
                  _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
        # The guard authenticated the token before the body was read; the bearer dependency only
        # declares the security scheme in the OpenAPI document.
        who: Principal | None = getattr(request.state, "principal", None)
        if who is None:
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        return who

    def admin(who: Annotated[Principal, Depends(principal)]) -> Principal:
        if not who.can_write:
            raise HTTPException(403, f"{who.name} has role {who.role.value}; writes need admin")
        return who

    Viewer = Annotated[Principal, Depends(principal)]
    Admin = Annotated[Principal, Depends(admin)]

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "Not ready, with the reasons.",
                                         "content": {"application/json": {"schema": {"type": "object"}}}}})
    def readyz() -> JSONResponse:
        ready, detail = daemon.readiness()
        return JSONResponse({"ready": ready, **detail}, status_code=200 if ready else 503)

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text exposition format.",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}})
    def metrics() -> Response:
        return Response(daemon.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/status", responses=_problems(401))
    def status(_: Viewer) -> dict[str, Any]:
        return daemon.status()

    @app.get("/v1/decisions", responses=_problems(401, 422, 503))
    def decisions(
        _: Viewer,
        model: str | None = Query(None, max_length=253),
        since: datetime | None = Query(None, description="ISO-8601 with a timezone, inclusive"),
        until: datetime | None = Query(None, description="ISO-8601 with a timezone, exclusive"),
        limit: int = Query(50, ge=1, le=1000),
        before_id: int | None = Query(None, ge=1, le=INTEGER_MAX,
                                      description="Keyset cursor: the next_before_id of the previous page."),
    ) -> dict[str, Any]:
        if model is not None and model not in daemon.models:
            raise _unprocessable(["query", "model"], f"unknown model {model!r}")
        for name, value in (("since", since), ("until", until)):
            if value is None:
                continue
            if value.tzinfo is None:
                raise _unprocessable(["query", name], "timestamp needs a timezone (e.g. Z or +00:00)")
            try:
                value.astimezone(timezone.utc)
            except OverflowError:
                raise _unprocessable(["query", name], "timestamp out of range once converted to UTC") from None
        rows = daemon.repo.list_decisions(model=model, since=since, until=until, limit=limit, before_id=before_id)
        nxt = rows[-1]["id"] if len(rows) == limit else None
        out: dict[str, Any] = {"items": rows, "next_before_id": nxt}
        if since is not None:  # the part of the range older than the full decisions: hourly rollups
            oldest = daemon.repo.oldest_decision_at(model)
            if oldest is None or since < oldest:
                end = until if until is not None and (oldest is None or until < oldest) else oldest
                out["rollups"] = daemon.repo.list_rollups(model=model, since=since, until=end, limit=limit)
                out["full_decisions_since"] = oldest.isoformat() if oldest is not None else None
                out["note"] = ("decisions before full_decisions_since are kept only as hourly rollups "
                               f"(database.retention.full_days: {daemon.config.database.retention.full_days:g})")
        return out

    @app.get("/v1/decisions/{decision_id}", responses=_problems(401, 404, 422, 503))
    def decision(decision_id: Id, _: Viewer) -> dict[str, Any]:
        row = daemon.repo.get_decision(decision_id)
        if row is None:
            raise HTTPException(404, f"decision {decision_id} not found")
        return row

    @app.get("/v1/overrides", responses=_problems(401, 422, 503))
    def overrides(_: Viewer, include_inactive: bool = False) -> dict[str, Any]:
        return {"items": daemon.repo.list_overrides(include_inactive=include_inactive, now=daemon.clock.now())}

    @app.post("/v1/overrides", status_code=201, responses=_problems(400, 401, 403, 413, 422, 503))
    def create_override(body: OverrideIn, who: Admin) -> dict[str, Any]:
        if body.model not in daemon.models:
            raise _unprocessable(["body", "model"], f"unknown model {body.model!r} (known: {sorted(daemon.models)})")
        spec = daemon.models[body.model]
        if body.pool is not None and body.pool not in spec.pools:
            raise _unprocessable(["body", "pool"], f"model {body.model!r} has no pool {body.pool!r}")
        policy = daemon.policy_store.policies().get(body.model)
        cap, why = replica_cap(spec, daemon.pools, pool=body.pool,
                               policy_max_replicas=policy.spec.bounds.max_replicas if policy else None)
        for field in ("replicas", "max_replicas"):
            value = getattr(body, field)
            if cap is not None and value is not None and value > cap:
                raise _unprocessable(["body", field], f"{field} ({value}) exceeds {why}")
        now = daemon.clock.now()
        with write_lock:
            ov = daemon.repo.add_override(
                kind=OverrideKind(body.kind.value), model=body.model, pool=body.pool, replicas=body.replicas,
                min_replicas=body.min_replicas, max_replicas=body.max_replicas,
                expires_at=(now + timedelta(seconds=body.ttl_s)) if body.ttl_s else None,
                reason=body.reason, author=who.name, now=now,
            )
            daemon.repo.audit(who.name, "override.create", f"override/{ov.id}", override_to_json(ov), now)
        return override_to_json(ov)

    @app.delete("/v1/overrides/{override_id}", status_code=204, responses=_problems(401, 403, 404, 422, 503))
    def delete_override(override_id: Id, who: Admin) -> Response:
        now = daemon.clock.now()
        with write_lock:
            if not daemon.repo.delete_override(override_id, author=who.name, now=now):
                raise HTTPException(404, f"override {override_id} not found or already deleted")
            daemon.repo.audit(who.name, "override.delete", f"override/{override_id}", {}, now)
        return Response(status_code=204)

    @app.post("/v1/pause", responses=_problems(400, 401, 403, 413, 422))
    def pause(who: Admin, body: ControlIn | None = None) -> dict[str, Any]:
        return {"paused": True, "audited": daemon.pause(who.name, body.reason if body else "")}

    @app.post("/v1/resume", responses=_problems(400, 401, 403, 413, 422))
    def resume(who: Admin, body: ControlIn | None = None) -> dict[str, Any]:
        return {"paused": False, "audited": daemon.resume(who.name, body.reason if body else "")}

    @app.get("/v1/policies", responses=_problems(401))
    def policies(_: Viewer) -> dict[str, Any]:
        return daemon.policy_store.status()

    reload_responses = _problems(401, 403, 422, 503)
    reload_responses[422]["description"] = "A policy file was rejected: `policies` lists every file's errors."
    reload_responses[503]["description"] = ("The database is unavailable: the files were read again and the good ones "
                                            "are in force (GET /v1/policies); their new versions are recorded, with the time they "
                                            "came into force, by the first reload that reaches the database again.")

    @app.post("/v1/policies/reload", responses=reload_responses)
    def reload(who: Admin) -> JSONResponse:
        status = daemon.reload_policies(author=who.name)
        errors = daemon.policy_store.errors()
        daemon.repo.audit(who.name, "policies.reload", "policies", {"errors": len(errors)}, daemon.clock.now())
        if errors:
            # A rejected file is an error for whoever just shipped it (a CI step calling reload must
            # see it fail): 422 with every file's errors; the last good versions stay in force.
            return problem_response(422, f"{len(errors)} policy file(s) rejected; the last good versions stay in force",
                                    policies=status)
        return JSONResponse(status)

    @app.get("/v1/audit", responses=_problems(401, 422, 503))
    def audit(_: Viewer, limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
        return {"items": daemon.repo.list_audit(limit)}

    @app.get("/v1/shadow", responses=_problems(401, 422, 503))
    def shadow(_: Viewer, since: str = Query("7d", max_length=64, description="A duration back from now (7d, 12h) "
                                               "or an ISO-8601 instant with a timezone.")) -> dict[str, Any]:
        """Per model in shadow mode: what it would have cost and where it would have fallen short,
        beside what ran (``controller.shadow``)."""
        from controller.shadow import report
        from controller.timespec import parse_when

        now = daemon.clock.now()
        try:
            start = parse_when(since, now)
        except ValueError as e:
            raise _unprocessable(["query", "since"], str(e)) from None
        policies = daemon.policy_store.policies()
        targets = {m: p.spec.slo.p99_latency_ms for m, p in policies.items()}
        # until just past now: the decision of this very instant is in the window
        return report(daemon.repo, models=daemon.models, pools=daemon.pools, p99_targets=targets, since=start,
                      until=now + timedelta(seconds=1))

    @app.post("/v1/replay", responses=_problems(400, 401, 413, 422, 503))
    def replay(body: ReplayIn, _: Viewer) -> dict[str, Any]:
        from controller.errors import UserError
        from controller.replay import run_replay
        from policies.base import Registry

        for name, value in (("from", body.since), ("to", body.until)):
            if value.tzinfo is None:
                raise _unprocessable(["body", name], "timestamp needs a timezone (e.g. Z or +00:00)")
            try:
                value.astimezone(timezone.utc)
            except OverflowError:
                raise _unprocessable(["body", name], "timestamp out of range once converted to UTC") from None
        try:
            return run_replay(daemon.repo, models=daemon.models, pools=daemon.pools, registry=Registry.from_entry_points(),
                              policy_file=body.policy_file, policy_text=body.policy, since=body.since,
                              until=body.until, model=body.model)
        except UserError as e:
            raise _unprocessable(["body", "policy"], str(e)) from None

    if api.docs:
        app.mount(DOCS_ASSETS, StaticFiles(directory=_docs_assets_dir()), name="docs-assets")

        @app.get("/docs", include_in_schema=False)
        def docs() -> HTMLResponse:
            # Relative URLs: the page keeps working behind a proxy that adds a path prefix.
            return get_swagger_ui_html(
                openapi_url="openapi.json", title="tidegate admin API",
                swagger_js_url="docs/assets/swagger-ui-bundle.js", swagger_css_url="docs/assets/swagger-ui.css",
                swagger_favicon_url="docs/assets/favicon.png",
                swagger_ui_parameters={"validatorUrl": None},  # never ask validator.swagger.io
            )

    if api.ui:
        ui.install(app, daemon, auth, _problems)
    _install_error_handlers(app)
    _install_openapi(app)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    Handler = Callable[[Request, Any], Awaitable[Response]]

    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette's Allow names the methods of the first route on the path; list them all
            # (GET and POST /v1/overrides are two routes).
            methods = {m for r in app.routes if isinstance(r, APIRoute) and r.matches(request.scope)[0] is not Match.NONE
                       for m in r.methods or ()}
            headers["Allow"] = ", ".join(sorted(methods))
        return problem_response(exc.status_code, str(exc.detail), headers=headers)

    async def invalid(_: Request, exc: RequestValidationError) -> Response:
        errors = _field_errors(exc.errors())
        return problem_response(422, "; ".join(f"{e.field}: {e.msg}" for e in errors), errors=errors)

    async def value_error(_: Request, exc: ValueError) -> Response:
        return problem_response(422, str(exc))

    async def database_down(_: Request, exc: Exception) -> Response:
        # The database's own failure, not a bug: say so (500 would send the operator to the log
        # for a cause the status page already shows); the ticks go on, journaling their decisions.
        words = database_words(exc)[:300]
        logger.warning("admin API request failed: the database is unavailable: %s", words)
        return problem_response(
            503, f"the decision log's database is unavailable ({words}); the daemon keeps ticking and journals "
                 "its decisions where database.journal_path is set (GET /v1/status: journal); retry once the "
                 "database answers", headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)})

    async def server_error(_: Request, exc: Exception) -> Response:
        logger.error("admin API request failed: %s: %s", type(exc).__name__, exc)
        return problem_response(500, "internal error; the daemon's log has the cause")

    handlers: list[tuple[type[Exception], Handler]] = [
        (StarletteHTTPException, http_error), (RequestValidationError, invalid), (ValueError, value_error),
        *((t, database_down) for t in UNAVAILABLE), (Exception, server_error)]
    for exc_type, handler in handlers:
        app.add_exception_handler(exc_type, handler)


def _install_openapi(app: FastAPI) -> None:
    """The generated document, plus the Problem schema the routes' error responses refer to."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(schema.pop("$defs", {}))
            schemas["Problem"] = schema
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
