"""The status page at ``/ui``: the fleet, a timeline, the decision log, overrides, policies and the
shadow report, in a browser, from the daemon's own API.

No external assets (it works in an air-gapped cluster) and no build step: one HTML shell rendered
here, and a hand-written script and stylesheet in ``controller/ui_assets`` that draw SVG charts from
``/v1/status``, ``/v1/decisions``, ``/v1/overrides``, ``/v1/policies``, ``/v1/shadow`` and the two
read-only views below (``/ui/timeline``, ``/ui/policy-versions``).

Authentication is the API's: a viewer token suffices to read, writes need an admin token. A browser
cannot attach a bearer header to a page load, so the page asks for the token once in a form
(POSTed, never in a URL) and keeps it in an HttpOnly, SameSite=Strict cookie that the API guard
accepts like the header. Scripts cannot read it (HttpOnly); other sites cannot send it
(SameSite=Strict); and a write authenticated by the cookie must also carry ``X-Tidegate-UI: 1``,
a header a cross-site form cannot set, so a forged request is refused even by an old browser.
"""

from __future__ import annotations

import html
import json
import math
import threading
from datetime import datetime, timedelta
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from typing import TYPE_CHECKING, Any, Callable, Mapping
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from controller.auth import Principal, TokenAuth
from controller.core.signals import model_signal_names
from controller.palette import INK, TARGET, pool_colours, pool_order

if TYPE_CHECKING:
    from controller.daemon import Daemon

COOKIE = "tidegate_session"
COOKIE_MAX_AGE_S = 12 * 3600
"""A browser session lasts a working day; then the page asks for the token again."""
UI_HEADER = "x-tidegate-ui"
"""Sent by the page's script on every request; required on a write authenticated by the cookie."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS = frozenset({"/ui", "/ui/login", "/ui/logout"})
"""The page itself answers without a token (it shows the login form); its data needs one."""
ASSETS = "/ui/assets"
MAX_TIMELINE_HOURS = 48
MAX_TIMELINE_ROWS = 3000
"""Decisions read for one timeline: 8 h of 10 s ticks; a longer window at that rate shows its newest part."""
MAX_TIMELINE_POINTS = 400
"""Points sent to the browser; decisions that changed something are always kept (they are markers)."""

_SECURITY_HEADERS = {
    # no inline script or style, nothing from elsewhere: the page's own files only
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(ASSETS + "/")


def _cookie_token(cookie_header: str | None) -> str | None:
    if not cookie_header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(cookie_header)
    except CookieError:
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None and morsel.value else None


def cookie_principal(auth: TokenAuth, headers: Mapping[str, str], method: str) -> tuple[Principal | None, str]:
    """Who the page's cookie authenticates, or ``None`` and why (empty when there is no cookie).
    ``headers``: lower-cased names."""
    token = _cookie_token(headers.get("cookie"))
    if token is None:
        return None, ""
    if method.upper() not in SAFE_METHODS and headers.get(UI_HEADER) != "1":
        return None, ("a write authenticated by the status page's cookie needs the header X-Tidegate-UI: 1 "
                      "(refused as a possible cross-site request)")
    who = auth.authenticate(token)
    if who is None:
        return None, "the status page's session token is no longer valid: log in again at /ui"
    return who, ""


def _asset_dir() -> Any:
    return resources.files("controller") / "ui_assets"


def _page(body: str, *, status: int = 200, data: Mapping[str, Any] | None = None) -> HTMLResponse:
    attrs = "".join(f' data-{k}="{html.escape(json.dumps(v), quote=True)}"' for k, v in (data or {}).items())
    doc = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
           "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
           "<title>tidegate</title><link rel=\"stylesheet\" href=\"ui/assets/ui.css\">"
           "<link rel=\"icon\" href=\"data:,\"></head>"
           f"<body{attrs}>{body}</body></html>")
    return HTMLResponse(doc, status_code=status, headers=_SECURITY_HEADERS)


def _login_page(message: str = "", status: int = 200) -> HTMLResponse:
    note = f'<p class="error" role="alert">{html.escape(message)}</p>' if message else ""
    return _page(
        '<main class="login"><h1>tidegate</h1>'
        '<form method="post" action="ui/login" autocomplete="off">'
        '<label for="token">Admin or viewer token</label>'
        '<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>'
        f'<button type="submit">Open the status page</button>{note}</form>'
        '<p class="hint">The token is sent once in this form and kept in an HttpOnly cookie for this '
        'site only; it never appears in a URL.</p></main>',
        status=status)


def _app_page(daemon: "Daemon", who: Principal) -> HTMLResponse:
    tiers = {name: pool.tier.value for name, pool in daemon.pools.items()}
    return _page(
        '<header><h1>tidegate</h1><span id="flags"></span><span class="who"></span>'
        '<form method="post" action="ui/logout"><button type="submit">Log out</button></form></header>'
        '<main id="app"><p>Loading...</p></main><script src="ui/assets/ui.js"></script>',
        data={"who": {"name": who.name, "role": who.role.value, "can_write": who.can_write},
              "pools": pool_order(tiers), "tiers": tiers, "colours": pool_colours(tiers),
              "ink": INK, "target": TARGET})


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _point(row: Mapping[str, Any]) -> dict[str, Any]:
    signals = row.get("signals") or {}

    def value(name: str) -> float | None:
        sample = signals.get(name)
        return sample.get("value") if isinstance(sample, dict) else None

    pools = signals.get("pools") or {}
    changed = (row["replicas"] != row["current_replicas"]
               or dict(row["placement"]) != dict(row.get("previous_placement") or row["placement"]))
    return {
        "id": row["id"], "at": row["at"], "reason": row["reason"], "changed": changed,
        **{name: value(name) for name in model_signal_names()},
        "cost_per_hour_usd": row["cost_per_hour_usd"], "desired": dict(row["placement"]),
        "ready": {p: s.get("ready_replicas") for p, s in pools.items() if isinstance(s, dict)},
    }


def thin(points: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """At most about ``limit`` points, evenly spaced, plus every point that ``changed`` (markers)."""
    if len(points) <= limit:
        return points
    step = math.ceil(len(points) / limit)
    return [p for i, p in enumerate(points) if p["changed"] or i % step == 0 or i == len(points) - 1]


class TimelineCache:
    """Each model's recent chart points, kept between requests. The decision log only grows, so a
    refresh reads just the decisions recorded since the previous one (a cold 3-hour window of 5 s
    ticks reads 2,160 full rows with their signals); a wider window than the one held reads afresh."""

    def __init__(self, max_rows: int = MAX_TIMELINE_ROWS) -> None:
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._points: dict[str, list[dict[str, Any]]] = {}
        self._from: dict[str, datetime] = {}
        """Every decision of the model at or after this time is held (up to ``max_rows``)."""

    def points(self, repo: Any, model: str, since: datetime, expected_rows: int) -> list[dict[str, Any]]:
        """The chart points of ``model``'s decisions at or after ``since``, oldest first."""
        with self._lock:
            held = self._points.get(model)
            if held is None or since < self._from[model] or not self._extend(repo, model, held):
                held = [_point(r) for r in repo.all_decisions(model=model, limit=min(expected_rows, self.max_rows))
                        if _when(r["at"]) >= since]
                self._from[model] = since
            if len(held) > self.max_rows:
                held = held[-self.max_rows:]
                self._from[model] = _when(held[0]["at"])
            self._points[model] = held
            return [p for p in held if _when(p["at"]) >= since]

    def _extend(self, repo: Any, model: str, held: list[dict[str, Any]]) -> bool:
        """Append the decisions newer than ``held``'s last; ``False`` when they cannot be read
        without a gap (then the caller reads the window afresh)."""
        after_id = held[-1]["id"] if held else 0
        after_at = _when(held[-1]["at"]) if held else self._from[model]
        newer = {r["id"] for r in repo.list_decisions(model=model, since=after_at, limit=self.max_rows) if r["id"] > after_id}
        if not newer:
            return True
        if len(newer) >= self.max_rows:
            return False
        # a few more than counted: a decision recorded between the two reads must not push out one counted
        rows = [r for r in repo.all_decisions(model=model, limit=len(newer) + 8) if r["id"] > after_id]
        if not rows or rows[0]["id"] > min(newer):
            return False
        held.extend(_point(r) for r in rows)
        return True


def timeline(daemon: "Daemon", model: str, hours: float, cache: TimelineCache | None = None) -> dict[str, Any]:
    """The last ``hours`` of ``model``'s decision log as chart series (oldest first)."""
    now = daemon.clock.now()
    since = now - timedelta(hours=hours)
    expected = math.ceil(hours * 3600 / daemon.config.loop.interval_s) + 1
    points = (cache or TimelineCache()).points(daemon.repo, model, since, expected)
    policy = daemon.policy_store.policies().get(model)
    slo = policy.spec.slo.p99_latency_ms if policy is not None else None
    return {"model": model, "since": since.isoformat(), "until": now.isoformat(), "slo_p99_latency_ms": slo,
            "decisions": len(points), "points": thin(points, MAX_TIMELINE_POINTS)}


def _principal(request: Request) -> Principal:
    who: Principal | None = getattr(request.state, "principal", None)
    if who is None:  # the guard lets no request without a token reach the data routes
        raise HTTPException(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
    return who


def install(app: FastAPI, daemon: "Daemon", auth: TokenAuth,
            problems: Callable[..., dict[int | str, dict[str, Any]]]) -> None:
    """Serve the page, its assets and its two read-only views on ``app``. ``problems``: the API's
    OpenAPI entries for the problem responses a route can answer (``controller.api._problems``)."""
    router = APIRouter()
    timelines = TimelineCache()
    app.mount(ASSETS, StaticFiles(directory=str(_asset_dir())), name="ui-assets")

    @router.get("/ui", include_in_schema=False)
    def page(request: Request) -> Response:
        headers = {k.lower(): v for k, v in request.headers.items()}
        who, why = cookie_principal(auth, headers, "GET")
        return _app_page(daemon, who) if who is not None else _login_page(why)

    def cross_site(request: Request) -> bool:
        # Browsers say where a request comes from; a form on another site must not log this
        # browser in (or out) under a token of someone else's choosing.
        return request.headers.get("sec-fetch-site", "same-origin") == "cross-site"

    @router.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        if cross_site(request):
            return _login_page("Refused: the login form was sent from another site.", status=403)
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        token = (form.get("token") or [""])[0].strip()
        if not token or auth.authenticate(token) is None:
            return _login_page("That token is not an admin or viewer token of this daemon.", status=401)
        out = RedirectResponse("../ui", status_code=303, headers=_SECURITY_HEADERS)
        secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"
        out.set_cookie(COOKIE, token, max_age=COOKIE_MAX_AGE_S, path="/", httponly=True, samesite="strict",
                       secure=secure)
        return out

    @router.post("/ui/logout", include_in_schema=False)
    def logout(request: Request) -> Response:
        if cross_site(request):
            return _login_page("Refused: the logout form was sent from another site.", status=403)
        out = RedirectResponse("../ui", status_code=303, headers=_SECURITY_HEADERS)
        out.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return out

    @router.get("/ui/timeline", summary="The last hours of one model's decision log, as chart series",
                responses=problems(401, 422))
    def ui_timeline(request: Request, model: str = Query(max_length=253),
                    hours: float = Query(3, gt=0, le=MAX_TIMELINE_HOURS)) -> dict[str, Any]:
        _principal(request)
        if model not in daemon.models:
            raise RequestValidationError([{"loc": ("query", "model"), "type": "value_error",
                                           "msg": f"unknown model {model!r} (known: {sorted(daemon.models)})"}])
        return timeline(daemon, model, hours, timelines)

    @router.get("/ui/policy-versions", summary="Policy versions the daemon has run, newest first",
                responses=problems(401))
    def policy_versions(request: Request) -> dict[str, Any]:
        _principal(request)
        rows = daemon.repo.list_policy_versions()
        return {"items": [{k: v for k, v in r.items() if k != "content"} for r in rows]}

    app.include_router(router)
