"""The admin API, served by a real uvicorn server on 127.0.0.1 in front of a real daemon (simulated
fleet, SQLite decision log, manual clock), exercised over HTTP."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from controller.core import signals as signal_table
from controller.core.model import ModelSignals, Sample
from controller.core.signals import NOT_MEASURED_REASONS, model_signal_names
from tests.integration.daemon_harness import Harness, build_harness, serving
from tests.integration.own_postgres import OwnPostgres
from tests.unit.test_signal_table import FAKE

ADMIN = "s3cret-admin"
VIEWER = "s3cret-viewer"
MODEL = "llama3-70b-fp8"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Harness, httpx.Client]]:
    h = build_harness(tmp_path)
    with serving(h, {"TIDEGATE_ADMIN_TOKENS": f"alice:{ADMIN}", "TIDEGATE_VIEWER_TOKENS": f"victor:{VIEWER}"}) as url:
        with httpx.Client(base_url=url, timeout=10) as client:
            yield h, client


def _h(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_open_probes_and_metrics(served: tuple[Harness, httpx.Client]) -> None:
    h, c = served
    assert c.get("/healthz").status_code == 200
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["ready"] is False  # no tick yet
    h.run(10)
    r = c.get("/readyz")
    assert r.status_code == 200, r.text
    text = c.get("/metrics").text
    assert "tidegate_ticks_total" in text and 'tidegate_replicas{model="llama3-70b-fp8",pool="onprem-h100",state="desired"}' in text


@pytest.mark.parametrize("method,path", [("GET", "/v1/status"), ("GET", "/v1/decisions"), ("GET", "/v1/overrides"),
                                         ("GET", "/v1/policies"), ("POST", "/v1/pause"), ("POST", "/v1/policies/reload")])
def test_401_without_or_with_a_wrong_token(served: tuple[Harness, httpx.Client], method: str, path: str) -> None:
    _, c = served
    assert c.request(method, path).status_code == 401
    assert c.request(method, path, headers=_h("nope")).status_code == 401


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/v1/pause", None), ("POST", "/v1/resume", None), ("POST", "/v1/policies/reload", None),
    ("POST", "/v1/overrides", {"kind": "freeze", "model": MODEL, "reason": "x"}),
    ("DELETE", "/v1/overrides/1", None),
])
def test_403_for_a_viewer_on_every_write(served: tuple[Harness, httpx.Client], method: str, path: str, body) -> None:
    _, c = served
    r = c.request(method, path, headers=_h(VIEWER), json=body)
    assert r.status_code == 403, r.text


@pytest.mark.parametrize("body,field", [
    ({"kind": "pin", "model": MODEL, "reason": "r"}, None),                       # pin without replicas
    ({"kind": "teleport", "model": MODEL, "reason": "r"}, "kind"),
    ({"kind": "pin", "model": MODEL, "replicas": -1, "reason": "r"}, "replicas"),
    ({"kind": "pin", "model": MODEL, "replicas": 3}, "reason"),
    ({"kind": "pin", "model": "nope", "replicas": 3, "reason": "r"}, "model"),
    ({"kind": "drain-pool", "model": MODEL, "pool": "moon", "reason": "r"}, "pool"),
    ({"kind": "pin", "model": MODEL, "replicas": 99, "reason": "r"}, "replicas"),  # over the policy's hard max
    ({"kind": "bounds", "model": MODEL, "min_replicas": 5, "max_replicas": 2, "reason": "r"}, None),
    ({"kind": "freeze", "model": MODEL, "reason": "r", "colour": "red"}, "colour"),
])
def test_422_names_the_bad_field(served: tuple[Harness, httpx.Client], body, field) -> None:
    _, c = served
    r = c.post("/v1/overrides", headers=_h(ADMIN), json=body)
    assert r.status_code == 422, r.text
    if field is not None:
        assert any(field in [str(x) for x in e["loc"]] for e in r.json()["errors"]), r.json()


def test_pin_with_ttl_applies_then_expires_by_itself(served: tuple[Harness, httpx.Client]) -> None:
    h, c = served
    h.run(120)
    r = c.post("/v1/overrides", headers=_h(ADMIN), json={"kind": "pin", "model": MODEL, "replicas": 7, "ttl_s": 60,
                                                         "reason": "load test"})
    assert r.status_code == 201, r.text
    ov = r.json()
    assert ov["author"] == "alice"
    h.run(30)
    last = c.get("/v1/decisions", headers=_h(VIEWER), params={"limit": 1}).json()["items"][0]
    assert last["replicas"] == 7 and last["reason"] == "OverridePin"
    assert [o["id"] for o in c.get("/v1/overrides", headers=_h(VIEWER)).json()["items"]] == [ov["id"]]
    h.run(40)  # past the TTL: nobody deleted it
    last = c.get("/v1/decisions", headers=_h(VIEWER), params={"limit": 1}).json()["items"][0]
    assert last["reason"] != "OverridePin"
    assert c.get("/v1/overrides", headers=_h(VIEWER)).json()["items"] == []
    audit = c.get("/v1/audit", headers=_h(VIEWER)).json()["items"]
    assert any(a["action"] == "override.create" and a["author"] == "alice" for a in audit)


def test_freeze_then_delete(served: tuple[Harness, httpx.Client]) -> None:
    h, c = served
    h.run(60)
    ov = c.post("/v1/overrides", headers=_h(ADMIN), json={"kind": "freeze", "model": MODEL, "reason": "incident"}).json()
    h.run(600)
    rows = c.get("/v1/decisions", headers=_h(VIEWER), params={"limit": 100}).json()["items"]
    assert all(not r["actuate"] for r in rows[:100])
    assert c.delete(f"/v1/overrides/{ov['id']}", headers=_h(ADMIN)).status_code == 204
    assert c.delete(f"/v1/overrides/{ov['id']}", headers=_h(ADMIN)).status_code == 404
    h.run(10)
    assert c.get("/v1/decisions", headers=_h(VIEWER), params={"limit": 1}).json()["items"][0]["actuate"]


def test_pause_resume_and_status(served: tuple[Harness, httpx.Client]) -> None:
    h, c = served
    h.run(30)
    assert c.post("/v1/pause", headers=_h(ADMIN), json={"reason": "maintenance"}).json() == {"paused": True, "audited": True}
    h.run(10)
    last = c.get("/v1/decisions", headers=_h(VIEWER), params={"limit": 1}).json()["items"][0]
    assert not last["actuate"] and last["reason"] == "Paused"
    st = c.get("/v1/status", headers=_h(VIEWER)).json()
    assert st["paused"] is True
    pools = st["models"][MODEL]["pools"]
    assert set(pools) == {"onprem-h100", "aws-spot-p5", "gcp-spot-a3", "aws-od-p5"}
    # each pool says its tier and who holds its nodes
    assert {p: (v["tier"], v["provider"]) for p, v in pools.items()} == {
        "onprem-h100": ("onprem", "onprem"), "aws-spot-p5": ("spot", "aws"), "gcp-spot-a3": ("spot", "gcp"),
        "aws-od-p5": ("ondemand", "aws")}
    # the replicas on nodes that are up lie between those serving and those asked for
    assert all(v["ready_replicas"] <= v["scheduled_replicas"] <= v["current_replicas"] for v in pools.values()), pools
    assert c.post("/v1/resume", headers=_h(ADMIN)).json() == {"paused": False, "audited": True}
    h.run(10)
    assert c.get("/v1/decisions", headers=_h(VIEWER), params={"limit": 1}).json()["items"][0]["actuate"]


def test_status_shows_the_capacity_the_rules_sized_with(served: tuple[Harness, httpx.Client]) -> None:
    """"capacity 41 output tok/s per replica, learned; profile 69": the per-replica capacity in force
    (learned from what the replicas sustain, or the profile's), next to the profile's."""
    h, c = served
    h.run(60)
    cap = c.get("/v1/status", headers=_h(VIEWER)).json()["models"][MODEL]["capacity"]
    assert cap["text"].startswith("capacity ") and "; profile " in cap["text"]
    assert cap["output_tokens_per_s_per_replica"] == pytest.approx(
        cap["profile_output_tokens_per_s_per_replica"] * cap["scale"], rel=1e-6)


def test_decisions_paginate_filter_and_show_the_trace(served: tuple[Harness, httpx.Client]) -> None:
    h, c = served
    h.run(300)
    page1 = c.get("/v1/decisions", headers=_h(VIEWER), params={"limit": 25}).json()
    page2 = c.get("/v1/decisions", headers=_h(VIEWER), params={"limit": 25, "before_id": page1["next_before_id"]}).json()
    ids1 = [r["id"] for r in page1["items"]]
    ids2 = [r["id"] for r in page2["items"]]
    assert len(ids1) == 25 and len(ids2) == 25 and max(ids2) < min(ids1)
    assert ids1 == sorted(ids1, reverse=True)
    since = page2["items"][-1]["at"]
    until = page1["items"][0]["at"]
    window = c.get("/v1/decisions", headers=_h(VIEWER), params={"since": since, "until": until, "limit": 1000}).json()["items"]
    assert len(window) == 49  # inclusive since, exclusive until
    assert c.get("/v1/decisions", headers=_h(VIEWER), params={"model": "nope"}).status_code == 422
    assert c.get("/v1/decisions", headers=_h(VIEWER), params={"since": "yesterday"}).status_code == 422
    one = c.get(f"/v1/decisions/{ids1[0]}", headers=_h(VIEWER)).json()
    assert one["trace"] and one["signals"] and "recommendations" in one
    assert c.get("/v1/decisions/999999", headers=_h(VIEWER)).status_code == 404


def test_policies_reload_keeps_last_good_and_shows_errors(served: tuple[Harness, httpx.Client]) -> None:
    h, c = served
    h.run(10)
    before = c.get("/v1/policies", headers=_h(VIEWER)).json()
    assert c.post("/v1/policies/reload", headers=_h(ADMIN)).status_code == 200  # all good
    (h.policies_dir / "broken.yaml").write_text("apiVersion: tidegate/v1\nkind: ScalingPolicy\nmetadata: {name: b}\n"
                                                "spec:\n  model: llama3-70b-fp8\n  rules:\n    - kind: warp-drive\n")
    r = c.post("/v1/policies/reload", headers=_h(ADMIN))
    assert r.status_code == 422 and "warp-drive" in r.text
    body = c.get("/v1/policies", headers=_h(VIEWER)).json()
    assert "warp-drive" in str(body) and "broken.yaml" in str(body)
    h.run(10)
    last = c.get("/v1/decisions", headers=_h(VIEWER), params={"limit": 1}).json()["items"][0]
    assert last["policy_version"] == h.daemon.policy_store.policies()[MODEL].version
    assert str(before) != str(body)


def _signal_missing(metrics_text: str, name: str) -> float | None:
    prefix = f'tidegate_signal_missing{{model="{MODEL}",signal="{name}"}} '
    lines = [ln for ln in metrics_text.splitlines() if ln.startswith(prefix)]
    assert len(lines) <= 1, lines
    return float(lines[0][len(prefix):]) if lines else None


def test_status_and_metrics_show_every_signal_of_the_table(served: tuple[Harness, httpx.Client]) -> None:
    """Every ModelSignals sample, KV cache and input tokens included, is in /v1/status and in
    tidegate_signal_missing, which says missing exactly when the status has no value."""
    h, c = served
    h.run(30)
    shown = c.get("/v1/status", headers=_h(VIEWER)).json()["models"][MODEL]["signals"]
    assert list(shown) == list(model_signal_names())
    text = c.get("/metrics").text
    for name, sample in shown.items():
        not_measured = sample["value"] is None and (sample["reason"] or "").split(":")[0] in NOT_MEASURED_REASONS
        # a signal the source does not measure by design (the demo world's KV cache) is no alert
        expected = None if not_measured else 1.0 if sample["value"] is None else 0.0
        assert _signal_missing(text, name) == expected, (name, sample)
    # the one simulated world measures the KV cache (the continuous-batching replicas' reservations)
    assert shown["kv_cache_utilization_pct"]["value"] > 0
    assert _signal_missing(text, "kv_cache_utilization_pct") == 0.0
    assert shown["input_tokens_per_s"]["value"] > 0


def test_a_signal_added_to_the_table_reaches_status_metrics_and_the_decision_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's "Adding a signal": one row in the table plus the source that measures it; the
    daemon's status, metrics and decision log carry it with no other edit."""
    monkeypatch.setattr(signal_table, "SIGNALS", signal_table.SIGNALS + (FAKE,))
    h = build_harness(tmp_path)
    world = h.daemon.metrics_source

    class Thermometer:
        """The source that measures it: the simulated world's signals plus a GPU temperature."""

        def observe(self, models: Any, now: datetime) -> dict[str, ModelSignals]:
            return {name: sig.replace_samples(gpu_temperature_c=Sample(71.5, now))
                    for name, sig in world.observe(models, now).items()}

    h.daemon.metrics_source = Thermometer()
    try:
        with serving(h, {"TIDEGATE_VIEWER_TOKENS": f"victor:{VIEWER}"}) as url, \
                httpx.Client(base_url=url, timeout=10) as c:
            h.run(10)
            status = c.get("/v1/status", headers=_h(VIEWER)).json()["models"][MODEL]
            assert status["signals"]["gpu_temperature_c"]["value"] == 71.5
            assert _signal_missing(c.get("/metrics").text, "gpu_temperature_c") == 0.0
            row = c.get(f"/v1/decisions/{status['last_decision']['id']}", headers=_h(VIEWER)).json()
            assert row["signals"]["gpu_temperature_c"]["value"] == 71.5
    finally:
        h.close()


def test_the_database_away_is_a_503_with_retry_after_while_status_and_pause_still_answer(
        own_postgres: OwnPostgres, tmp_path: Path) -> None:
    """The decision log's PostgreSQL stops under a serving daemon: a request that needs it gets a
    503 problem (the cause, Retry-After) and writes nothing; the status still answers with the
    journal that holds the gap's decisions; pause takes effect and says its audit row is missing.
    Once the server is back the same requests succeed."""
    h = build_harness(tmp_path, db_url=own_postgres.url,
                      config_updates={"database": {"journal_path": str(tmp_path / "journal.jsonl")}})
    try:
        assert all(r.ok for r in h.run(30))
        tokens = {"TIDEGATE_ADMIN_TOKENS": f"alice:{ADMIN}", "TIDEGATE_VIEWER_TOKENS": f"victor:{VIEWER}"}
        with serving(h, tokens) as url, httpx.Client(base_url=url, timeout=10) as c:
            own_postgres.stop()
            assert all(r.journaled for r in h.run(15))
            # a policy edit during the outage: in force at once, recorded once the database is back
            policy = h.policies_dir / "policy.yaml"
            policy.write_text(policy.read_text().replace("max_replicas: 24", "max_replicas: 23"))
            edited_at, before = h.clock.now(), h.daemon.policy_store.policies()[MODEL].version
            for method, path, body in (("GET", "/v1/decisions", None), ("GET", "/v1/overrides", None),
                                       ("POST", "/v1/overrides", {"kind": "freeze", "model": MODEL, "reason": "db away"}),
                                       ("GET", "/v1/audit", None), ("POST", "/v1/policies/reload", None)):
                r = c.request(method, path, headers=_h(ADMIN), json=body)
                assert r.status_code == 503, (path, r.status_code, r.text)
                assert r.headers["content-type"] == "application/problem+json" and r.headers["retry-after"] == "5"
                assert "database is unavailable" in r.json()["detail"], r.json()
            st = c.get("/v1/status", headers=_h(VIEWER))
            assert st.status_code == 200 and st.json()["journal"]["decisions"] > 0, st.text
            in_force = h.daemon.policy_store.policies()[MODEL].version
            assert in_force != before and st.json()["models"][MODEL]["policy_version"] == in_force
            assert c.post("/v1/pause", headers=_h(ADMIN), json={"reason": "db away"}).json() == {"paused": True, "audited": False}
            assert h.daemon.paused

            own_postgres.start()
            assert all(r.ok for r in h.run(10))
            assert c.post("/v1/resume", headers=_h(ADMIN)).json() == {"paused": False, "audited": True}
            assert c.get("/v1/overrides", headers=_h(VIEWER)).json()["items"] == [], "the refused override was not stored"
            assert c.get("/v1/decisions", headers=_h(VIEWER)).status_code == 200
            assert c.post("/v1/policies/reload", headers=_h(ADMIN)).status_code == 200
            versions = c.get("/ui/policy-versions", headers=_h(VIEWER)).json()["items"]
            mine = [v for v in versions if v["version"] == in_force]
            assert len(mine) == 1 and datetime.fromisoformat(mine[0]["first_seen_at"]) == edited_at, (mine, edited_at)
            actions = [a["action"] for a in c.get("/v1/audit", headers=_h(ADMIN)).json()["items"]]
            assert "resume" in actions and "pause" not in actions
    finally:
        h.close()
