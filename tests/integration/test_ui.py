"""The status page (/ui) in a real headless Chromium against a real daemon on the demo's simulated
fleet: a viewer logs in and sees the fleet, opens a decision's trace, and is refused a write; an
admin sets an override from the page and removes it. A screenshot is written as an artifact
(``$TIDEGATE_ARTIFACTS``, else the test's tmp dir); ``TIDEGATE_ARTIFACTS=docs`` refreshes
docs/ui.png, the README's picture.

Chromium and its driver are the Debian packages ``chromium`` and ``chromium-driver`` (.ci/run
installs them); Selenium drives them through ``/usr/bin/chromedriver``, so nothing is downloaded.
Outside CI the browser tests skip, saying so, when the packages are absent; under CI=true they fail.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from controller.ui import COOKIE, UI_HEADER
from tests.integration.daemon_harness import Harness, build_harness, serving
from tests.integration.own_postgres import OwnPostgres

MODEL = "llama3-70b-fp8"
TOKENS = {"TIDEGATE_ADMIN_TOKENS": "ops-admin:adm-7Hq2-secret", "TIDEGATE_VIEWER_TOKENS": "ops-viewer:view-9Kd4-secret"}
ADMIN, VIEWER = "adm-7Hq2-secret", "view-9Kd4-secret"
WAIT_S = 15


def _need_browser() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", chromium), ("chromium-driver", driver)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (the test extra)")
    if missing:
        why = f"the status page test needs {', '.join(missing)} (Debian packages chromium and chromium-driver; .ci/run installs them)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    assert chromium is not None and driver is not None
    return chromium, driver


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Harness, str]]:
    """The demo fleet after 2.5 simulated hours (its hourly load wave has used the spot pools)."""
    h = build_harness(tmp_path_factory.mktemp("ui"), start=datetime(2026, 11, 2, 6, 0, tzinfo=timezone.utc))
    h.run(2.5 * 3600, step_s=15)
    try:
        with serving(h, TOKENS) as base:
            yield h, base
    finally:
        h.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver_path = _need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,2200", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=driver_path), options=opts)
    try:
        yield drv
    finally:
        drv.quit()


def _login(drv: Any, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    drv.delete_all_cookies()
    drv.get(f"{base}/ui")
    drv.find_element(By.ID, "token").send_keys(token)
    drv.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    WebDriverWait(drv, WAIT_S).until(EC.presence_of_element_located((By.CSS_SELECTOR, "body[data-loaded='1']")))
    assert token not in drv.current_url


def _script_errors(drv: Any) -> list[str]:
    """Script errors and Content-Security-Policy refusals the page caused (failed requests, like
    the 404 of an absent /v1/shadow or a refused write, are the page's business, not errors)."""
    return [e["message"] for e in drv.get_log("browser")
            if "Uncaught" in e["message"] or "Content Security Policy" in e["message"]]


def _wait_text(drv: Any, css: str, text: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(drv, WAIT_S).until(
        lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, css) if text in e.text), False),
        message=f"no {css} with text {text!r}")


def _artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("TIDEGATE_ARTIFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_a_viewer_sees_the_fleet_opens_a_decision_and_is_refused_a_write(fleet: tuple[Harness, str], browser: Any,
                                                                          tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    h, base = fleet
    drv = browser
    _login(drv, base, VIEWER)
    cookie = drv.get_cookie(COOKIE)
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert drv.execute_script("return document.cookie") == "", "the session cookie must be out of the script's reach"
    assert "ops-viewer (viewer)" in drv.find_element(By.CSS_SELECTOR, "header .who").text

    # the fleet: every pool of the demo with the daemon's desired / ready replicas
    status = h.daemon.status()["models"][MODEL]["pools"]
    for pool, st in status.items():
        row = drv.find_element(By.CSS_SELECTOR, f"#fleet tr[data-pool='{pool}']")
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        assert cells[0] == pool and cells[1] == st["tier"]
        assert cells[3:5] == [str(st["desired_replicas"]), str(st["ready_replicas"])]
    used = {p for p, st in status.items() if st["desired_replicas"]}
    bars = {e.get_attribute("data-pool") for e in drv.find_elements(By.CSS_SELECTOR, "#fleet svg rect[data-pool]")}
    assert bars == used
    # the timeline draws the pools the window used, and the decisions that changed something
    areas = {e.get_attribute("data-pool") for e in drv.find_elements(By.CSS_SELECTOR, "#timeline path[data-pool]")}
    assert {"onprem-h100", "aws-spot-p5", "gcp-spot-a3"} <= areas
    markers = drv.find_elements(By.CSS_SELECTOR, "#timeline line.marker")
    assert markers
    # nothing from elsewhere: every resource the page loaded came from the daemon
    loaded = drv.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
    assert loaded and all(url.startswith(base + "/") for url in loaded), loaded
    # a marker opens its decision
    marker_id = markers[-1].get_attribute("data-decision")
    drv.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", markers[-1])
    _wait_text(drv, "dialog#decision", f"Decision #{marker_id}").find_element(By.CSS_SELECTOR, "button.close").click()
    assert "no shadow data" in drv.find_element(By.ID, "shadow").text or drv.find_elements(By.CSS_SELECTOR, "#shadow table")
    assert "every policy file is valid" in drv.find_element(By.ID, "policies").text
    assert _script_errors(drv) == []

    # a decision opens with its full trace
    newest = h.repo.list_decisions(model=MODEL, limit=1)[0]
    drv.find_element(By.CSS_SELECTOR, f"#decisions tr[data-decision='{newest['id']}']").click()
    dialog = _wait_text(drv, "dialog#decision", f"Decision #{newest['id']}")
    full = h.repo.get_decision(newest["id"])
    assert full is not None
    stages = [r.find_elements(By.TAG_NAME, "td")[0].text for r in dialog.find_elements(By.CSS_SELECTOR, "table.trace tbody tr")]
    assert stages == [s["name"] for s in full["trace"]]
    assert full["trace"][-1]["message"] in dialog.text
    drv.save_screenshot(str(tmp_path / "ui-decision.png"))
    dialog.find_element(By.CSS_SELECTOR, "button.close").click()

    # a viewer's write: the daemon refuses and the page says so
    Select(drv.find_element(By.ID, "ov-kind")).select_by_value("freeze")
    drv.find_element(By.ID, "ov-reason").send_keys("viewer tries")
    drv.find_element(By.ID, "ov-submit").click()
    msg = _wait_text(drv, "#ov-message", "refused")
    assert "403" in msg.text and "writes need admin" in msg.text
    assert h.repo.list_overrides(include_inactive=True, now=h.clock.now()) == []


def test_an_admin_sets_and_removes_an_override_from_the_page(fleet: tuple[Harness, str], browser: Any,
                                                             tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    h, base = fleet
    drv = browser
    _login(drv, base, ADMIN)
    Select(drv.find_element(By.ID, "ov-kind")).select_by_value("pin")
    Select(drv.find_element(By.ID, "ov-pool")).select_by_value("onprem-h100")
    drv.find_element(By.ID, "ov-replicas").send_keys("4")
    ttl = drv.find_element(By.ID, "ov-ttl")
    ttl.clear()
    ttl.send_keys("30")
    drv.find_element(By.ID, "ov-reason").send_keys("load test on onprem")
    drv.find_element(By.ID, "ov-submit").click()
    _wait_text(drv, "#ov-message", "set")
    [active] = h.repo.active_overrides(h.clock.now(), model=MODEL)
    assert (active.kind.value, active.pool, active.replicas, active.author) == ("pin", "onprem-h100", 4, "ops-admin")
    assert active.expires_at is not None and (active.expires_at - h.clock.now()).total_seconds() == 30 * 60
    row = _wait_text(drv, f"#overrides tr[data-override='{active.id}']", "load test on onprem")
    assert "30 min" in row.text
    drv.set_window_size(1280, 1500)  # the README's picture: the fleet, the timeline, the override
    drv.execute_script("window.scrollTo(0, 0)")
    drv.save_screenshot(str(_artifacts(tmp_path) / "ui.png"))

    row.find_element(By.CSS_SELECTOR, "button.remove").click()
    _wait_text(drv, "#ov-message", "removed")
    WebDriverWait(drv, WAIT_S).until(lambda d: not d.find_elements(By.CSS_SELECTOR, f"tr[data-override='{active.id}']"))
    assert h.repo.active_overrides(h.clock.now(), model=MODEL) == []
    assert _script_errors(drv) == []


def test_decisions_waiting_in_the_journal_are_flagged_until_the_database_takes_them(
        browser: Any, own_postgres: OwnPostgres, tmp_path: Path) -> None:
    """The decision log's PostgreSQL stops under a running daemon: its ticks go to the local
    journal, and the page (which keeps refreshing) says so in its header and above the decision
    list; once the server is back, the next tick replays the journal and both go away."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    journal = tmp_path / "journal.jsonl"
    h = build_harness(tmp_path, db_url=own_postgres.url, config_updates={"database": {"journal_path": str(journal)}},
                      start=datetime(2026, 11, 2, 6, 0, tzinfo=timezone.utc))
    try:
        assert all(r.ok for r in h.run(60, step_s=15))
        with serving(h, TOKENS) as base:
            drv = browser
            _login(drv, base, VIEWER)
            assert not drv.find_elements(By.ID, "journal-flag") and not drv.find_elements(By.ID, "decisions-journal")

            own_postgres.stop()
            gap = h.run(45, step_s=15)
            assert all(r.journaled for r in gap), [r.errors for r in gap]
            waiting = h.daemon.journal_status()
            assert waiting is not None and waiting["decisions"] == len(gap) * len(h.daemon.models)
            flag = _wait_text(drv, "#flags #journal-flag", f"journal: {waiting['decisions']} decisions waiting")
            assert flag.text == (f"journal: {waiting['decisions']} decisions waiting ({waiting['bytes'] / 1024:.1f} KB) "
                                 "since 06:01 \u2014 database unreachable")
            assert waiting["database_error"] and waiting["database_error"] in (flag.get_attribute("title") or "")
            note = _wait_text(drv, "#decisions #decisions-journal", "Not listed yet")
            assert f"Not listed yet: {waiting['decisions']} decisions in the daemon's local journal" in note.text
            drv.save_screenshot(str(_artifacts(tmp_path) / "ui-journal.png"))

            own_postgres.start()
            assert all(r.ok and not r.journaled for r in h.run(15, step_s=15))
            assert not journal.exists(), "replayed whole and removed"
            WebDriverWait(drv, WAIT_S).until(
                lambda d: not d.find_elements(By.ID, "journal-flag") and not d.find_elements(By.ID, "decisions-journal"),
                message="the journal flag stayed after the replay")
            # the decisions the journal held are listed now
            newest = h.repo.list_decisions(model=MODEL, limit=1)[0]
            _wait_text(drv, f"#decisions tr[data-decision='{newest['id']}']", f"#{newest['id']}")
            assert _script_errors(drv) == []
    finally:
        h.close()


def test_api_ui_false_serves_no_page(tmp_path: Path) -> None:
    h = build_harness(tmp_path, config_updates={"api": {"ui": False}})
    try:
        with serving(h, TOKENS) as base, httpx.Client(base_url=base) as c:
            assert c.get("/ui").status_code == 401  # not open any more: an unknown path like any other
            assert c.get("/ui", headers={"Authorization": f"Bearer {VIEWER}"}).status_code == 404
            assert c.get("/v1/status", headers={"Authorization": f"Bearer {VIEWER}"}).status_code == 200
    finally:
        h.close()


# --- the cookie, without a browser ---------------------------------------------------------------

def test_the_page_cookie_authenticates_reads_and_writes_only_with_the_page_header(fleet: tuple[Harness, str]) -> None:
    h, base = fleet
    with httpx.Client(base_url=base) as c:
        assert "token" in c.get("/ui").text  # the login form, no data
        assert c.get("/v1/status").status_code == 401
        assert c.post("/ui/login", data={"token": ADMIN}, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
        assert COOKIE not in c.cookies
        bad = c.post("/ui/login", data={"token": "not-a-token"})
        assert bad.status_code == 401 and COOKIE not in bad.cookies
        ok = c.post("/ui/login", data={"token": ADMIN})
        assert ok.status_code == 303 and ADMIN not in ok.headers["location"]
        set_cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in set_cookie and "samesite=strict" in set_cookie
        assert c.get("/v1/status").status_code == 200
        body = {"kind": "freeze", "model": MODEL, "reason": "forged", "ttl_s": 60}
        forged = c.post("/v1/overrides", json=body)  # what another site's form could send
        assert forged.status_code == 401 and "X-Tidegate-UI" in forged.json()["detail"]
        made = c.post("/v1/overrides", json=body, headers={UI_HEADER: "1"})
        assert made.status_code == 201
        assert c.delete(f"/v1/overrides/{made.json()['id']}", headers={UI_HEADER: "1"}).status_code == 204
        c.post("/ui/logout")
        assert c.get("/v1/status").status_code == 401


def test_the_timeline_is_the_decision_log_of_the_window(fleet: tuple[Harness, str]) -> None:
    h, base = fleet
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {VIEWER}"}) as c:
        tl = c.get("/ui/timeline", params={"model": MODEL, "hours": 1}).json()
        assert c.get("/ui/timeline", params={"model": "nope"}).status_code == 422
    rows = h.repo.list_decisions(model=MODEL, since=datetime.fromisoformat(tl["since"]), limit=1000)
    assert tl["decisions"] == len(rows) == 3600 // 15 + 1  # both ends of the hour (since is inclusive)
    changed = {r["id"] for r in rows if r["replicas"] != r["current_replicas"]}
    assert changed <= {p["id"] for p in tl["points"] if p["changed"]}
    assert tl["slo_p99_latency_ms"] == 6000


def test_a_timeline_refreshed_from_the_cache_is_the_one_read_afresh(tmp_path: Path) -> None:
    from controller.ui import TimelineCache, timeline

    h = build_harness(tmp_path, start=datetime(2026, 11, 2, 6, 0, tzinfo=timezone.utc))
    try:
        cache = TimelineCache()
        h.run(1800, step_s=15)
        first = timeline(h.daemon, MODEL, 1, cache)
        h.run(900, step_s=15)  # new decisions: read on top of the cached ones
        for hours in (0.5, 1, 2):  # narrower, the same, wider (read afresh) than what the cache holds
            assert timeline(h.daemon, MODEL, hours, cache) == timeline(h.daemon, MODEL, hours)
        assert timeline(h.daemon, MODEL, 1, cache)["decisions"] == first["decisions"] + 900 // 15
    finally:
        h.close()
