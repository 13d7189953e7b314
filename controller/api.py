"""The admin REST API: see the state, read the decision log, override, pause, reload policies.

FastAPI app built around a running ``Daemon`` (``create_app(daemon, auth)``), served by uvicorn
inside the daemon process. Reads need a viewer or admin bearer token, writes an admin one; every
write is audited with its author. Errors are errors: 401, 403, 404, 409 and 422 with a body that
names the field; nothing answers 200 on a failure. ``/healthz``, ``/readyz`` and ``/metrics`` are
open (probes and Prometheus scrape them).
"""


import enum
import threading
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.auth import Principal, TokenAuth
from controller.core.model import OverrideKind
from controller.db.codec import override_to_json
from controller.metrics import CONTENT_TYPE

if TYPE_CHECKING:
    from controller.daemon import Daemon

_bearer = HTTPBearer(auto_error=False)


class OverrideKindIn(str, enum.Enum):
    pin = "pin"
    bounds = "bounds"
    freeze = "freeze"
    drain_pool = "drain-pool"


class OverrideIn(BaseModel):
    """An operator override. ``ttl_s`` makes it expire by itself; without it, it lasts until deleted."""

    model_config = ConfigDict(extra="forbid")

    kind: OverrideKindIn = Field(description="pin, bounds, freeze or drain-pool.")
    model: str = Field(min_length=1, description="Model name it applies to.")
    pool: str | None = Field(None, description="Pool scope (required for drain-pool; optional for pin).")
    replicas: int | None = Field(None, ge=0, description="For pin: the replicas (of the pool when pool is set, else total).")
    min_replicas: int | None = Field(None, ge=0, description="For bounds.")
    max_replicas: int | None = Field(None, ge=0, description="For bounds.")
    ttl_s: float | None = Field(None, gt=0, le=30 * 86400, description="Seconds until it expires by itself.")
    reason: str = Field(min_length=1, max_length=500, description="Why (audited).")

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


class ControlIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field("", max_length=500)


def _unprocessable(loc: list[str | int], msg: str) -> HTTPException:
    return HTTPException(status_code=422, detail=[{"loc": loc, "msg": msg, "type": "value_error"}])


def create_app(daemon: "Daemon", auth: TokenAuth) -> FastAPI:
    app = FastAPI(title="tidegate admin API", version="1", docs_url="/docs", redoc_url=None)
    write_lock = threading.Lock()

    def principal(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
        if creds is None or creds.scheme.lower() != "bearer":
            raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        who = auth.authenticate(creds.credentials)
        if who is None:
            raise HTTPException(401, "invalid token", headers={"WWW-Authenticate": "Bearer"})
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

    @app.get("/readyz")
    def readyz() -> JSONResponse:
        ready, detail = daemon.readiness()
        return JSONResponse({"ready": ready, **detail}, status_code=200 if ready else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(daemon.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/status")
    def status(_: Viewer) -> dict[str, Any]:
        return daemon.status()

    @app.get("/v1/decisions")
    def decisions(
        _: Viewer,
        model: str | None = None,
        since: datetime | None = Query(None, description="ISO-8601, inclusive"),
        until: datetime | None = Query(None, description="ISO-8601, exclusive"),
        limit: int = Query(50, ge=1, le=1000),
        before_id: int | None = Query(None, ge=1, description="Keyset cursor: the next_before_id of the previous page."),
    ) -> dict[str, Any]:
        if model is not None and model not in daemon.models:
            raise _unprocessable(["query", "model"], f"unknown model {model!r}")
        for name, value in (("since", since), ("until", until)):
            if value is not None and value.tzinfo is None:
                raise _unprocessable(["query", name], "timestamp needs a timezone (e.g. Z or +00:00)")
        rows = daemon.repo.list_decisions(model=model, since=since, until=until, limit=limit, before_id=before_id)
        nxt = rows[-1]["id"] if len(rows) == limit else None
        return {"items": rows, "next_before_id": nxt}

    @app.get("/v1/decisions/{decision_id}")
    def decision(decision_id: int, _: Viewer) -> dict[str, Any]:
        row = daemon.repo.get_decision(decision_id)
        if row is None:
            raise HTTPException(404, f"decision {decision_id} not found")
        return row

    @app.get("/v1/overrides")
    def overrides(_: Viewer, include_inactive: bool = False) -> dict[str, Any]:
        return {"items": daemon.repo.list_overrides(include_inactive=include_inactive, now=daemon.clock.now())}

    @app.post("/v1/overrides", status_code=201)
    def create_override(body: OverrideIn, who: Admin) -> dict[str, Any]:
        if body.model not in daemon.models:
            raise _unprocessable(["body", "model"], f"unknown model {body.model!r} (known: {sorted(daemon.models)})")
        if body.pool is not None and body.pool not in daemon.models[body.model].pools:
            raise _unprocessable(["body", "pool"], f"model {body.model!r} has no pool {body.pool!r}")
        policy = daemon.policy_store.policies().get(body.model)
        hard_max = policy.spec.bounds.max_replicas if policy else None
        for field in ("replicas", "max_replicas"):
            value = getattr(body, field)
            if hard_max is not None and value is not None and body.pool is None and value > hard_max:
                raise _unprocessable(["body", field],
                                     f"{field} ({value}) exceeds the policy's max_replicas ({hard_max}), a hard limit")
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

    @app.delete("/v1/overrides/{override_id}", status_code=204)
    def delete_override(override_id: int, who: Admin) -> Response:
        now = daemon.clock.now()
        with write_lock:
            if not daemon.repo.delete_override(override_id, author=who.name, now=now):
                raise HTTPException(404, f"override {override_id} not found or already deleted")
            daemon.repo.audit(who.name, "override.delete", f"override/{override_id}", {}, now)
        return Response(status_code=204)

    @app.post("/v1/pause")
    def pause(who: Admin, body: ControlIn | None = None) -> dict[str, Any]:
        daemon.pause(who.name, body.reason if body else "")
        return {"paused": True}

    @app.post("/v1/resume")
    def resume(who: Admin, body: ControlIn | None = None) -> dict[str, Any]:
        daemon.resume(who.name, body.reason if body else "")
        return {"paused": False}

    @app.get("/v1/policies")
    def policies(_: Viewer) -> dict[str, Any]:
        return daemon.policy_store.status()

    @app.post("/v1/policies/reload")
    def reload(who: Admin) -> JSONResponse:
        status = daemon.reload_policies(author=who.name)
        daemon.repo.audit(who.name, "policies.reload", "policies", {"errors": len(daemon.policy_store.errors())},
                          daemon.clock.now())
        # A rejected file is an error for whoever just shipped it (a CI step calling reload must
        # see it fail): 422 with every file's errors; the last good versions stay in force.
        return JSONResponse(status, status_code=422 if daemon.policy_store.errors() else 200)

    @app.get("/v1/audit")
    def audit(_: Viewer, limit: int = Query(100, ge=1, le=1000)) -> dict[str, Any]:
        return {"items": daemon.repo.list_audit(limit)}

    @app.exception_handler(ValueError)
    def _value_error(_: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    return app
