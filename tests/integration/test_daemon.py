"""The daemon end to end on the simulated fleet: observe -> decide -> act -> record, driven tick by
tick on a manual clock against a real SQLite decision log."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.analysis import all_ok, check_story
from controller.core.model import ActionStatus
from controller.core.reasons import Reason
from controller.protocols import PermanentProviderError, TransientProviderError
from tests.integration.daemon_harness import DEFAULT_POLICY, make_harness  # noqa: F401 (fixture)


def test_full_load_cycle_tells_the_story(make_harness, tmp_path: Path) -> None:
    h = make_harness(tmp_path)
    h.run(2 * 3600)  # two diurnal cycles of the demo load
    rows = list(h.repo.all_decisions(model="llama3-70b-fp8"))
    assert len(rows) == 2 * 3600 / 5
    pol = h.daemon.policy_store.policies()["llama3-70b-fp8"]
    findings = check_story(rows, model=h.daemon.models["llama3-70b-fp8"], pools=h.daemon.pools,
                           max_replicas=pol.spec.bounds.max_replicas,
                           max_cost_per_hour_usd=pol.spec.budget.max_cost_per_hour_usd)
    assert all_ok(findings), findings
    # every decision carries its trace and the policy version in force
    full = h.repo.get_decision(rows[-1]["id"])
    assert full is not None and full["policy_version"] == pol.version
    stages = [s["name"] for s in full["trace"]]
    assert {"combine", "stabilize", "bounds", "placement", "budget"} <= set(stages), stages


def test_bad_policy_is_rejected_and_last_good_keeps_deciding(make_harness, tmp_path: Path) -> None:
    h = make_harness(tmp_path)
    h.run(60)
    good = h.daemon.policy_store.policies()["llama3-70b-fp8"].version
    (h.policies_dir / "policy.yaml").write_text(DEFAULT_POLICY.replace("min_replicas: 2, max_replicas: 24",
                                                                       "min_replicas: 30, max_replicas: 24"))
    status = h.daemon.reload_policies()
    assert h.daemon.policy_store.errors(), "the broken file must be reported"
    assert "30" in str(status) and "24" in str(status)
    h.run(30)
    latest = h.repo.list_decisions(model="llama3-70b-fp8", limit=1)[0]
    assert latest["policy_version"] == good
    # fixing the file brings a new version into force
    (h.policies_dir / "policy.yaml").write_text(DEFAULT_POLICY.replace("max_replicas: 24", "max_replicas: 20"))
    h.daemon.reload_policies()
    assert not h.daemon.policy_store.errors()
    h.run(5)
    newer = h.repo.list_decisions(model="llama3-70b-fp8", limit=1)[0]
    assert newer["policy_version"] != good


def test_dry_run_decides_and_records_but_never_scales(make_harness, tmp_path: Path) -> None:
    h = make_harness(tmp_path, dry_run=True)
    before = {p: h.sim.pools[p].state(h.daemon.models["llama3-70b-fp8"], h.clock.now()).replicas for p in h.sim.pools}
    h.run(1800)
    after = {p: h.sim.pools[p].state(h.daemon.models["llama3-70b-fp8"], h.clock.now()).replicas for p in h.sim.pools}
    assert before == after
    rows = h.repo.list_decisions(limit=1000)
    assert rows and all(r["dry_run"] for r in rows)
    changed = [r for r in rows if r["placement"] != r.get("previous_placement", r["placement"]) or r["replicas"] != r["current_replicas"]]
    assert changed, "load rose: the dry-run daemon should have wanted to scale"
    detail = h.repo.get_decision(changed[0]["id"])
    assert detail and detail["actions"] and {a["status"] for a in detail["actions"]} == {ActionStatus.DRY_RUN.value}


def test_restart_rebuilds_stabilization_from_the_log(make_harness, tmp_path: Path) -> None:
    h = make_harness(tmp_path)
    # run into the peak, where cloud replicas are held
    h.run(1800)
    peak = h.repo.list_decisions(limit=1)[0]["replicas"]
    # a new daemon on the same database and fleet, right after the load starts to fall
    h2 = make_harness(tmp_path, repo=h.repo)
    h2.sim, h2.clock = h.sim, h.clock
    h2.daemon.metrics_source, h2.daemon.pool_providers, h2.daemon.price_source = h.sim.metrics, h.sim.pools, h.sim.prices
    h2.daemon.clock = h.clock
    h2.run(5)
    first = h2.repo.list_decisions(limit=1)[0]
    detail = h2.repo.get_decision(first["id"])
    assert detail is not None
    # the scale-down window (300 s) still holds the peak recommendations after restart
    assert first["replicas"] >= peak - 1, (first, peak)


class _FailingScale:
    """Wraps a pool provider: state passes through, scale raises the given error."""

    def __init__(self, inner, error: Exception) -> None:
        self.inner, self.error, self.pool, self.calls = inner, error, inner.pool, 0

    def state(self, model, now):
        return self.inner.state(model, now)

    def scale(self, model, replicas, nodes, now):
        self.calls += 1
        raise self.error


class _FailingState(_FailingScale):
    def state(self, model, now):
        raise self.error


def test_transient_provider_errors_back_off_and_are_recorded(make_harness, tmp_path: Path) -> None:
    h = make_harness(tmp_path, pool_wrappers={"onprem-h100": lambda p: _FailingScale(p, TransientProviderError("429 throttled"))})
    reports = h.run(1200)
    failed = [r for r in reports if r.errors]
    skipped = [r for r in reports if r.skipped]
    assert failed, "the first scale-out of on-prem must fail"
    assert skipped and all("backing off" in r.skipped for r in skipped)
    rows = h.repo.list_decisions(limit=1000)
    outcomes = {r["outcome"] for r in rows}
    assert outcomes & {"failed", "partial"}
    detail = h.repo.get_decision(next(r["id"] for r in rows if r["outcome"] in ("failed", "partial")))
    assert any(a["status"] == ActionStatus.FAILED_TRANSIENT.value and "throttled" in (a["error"] or "")
               for a in detail["actions"])
    ready, info = h.daemon.readiness()
    assert not ready and info["consecutive_failures"] >= 1


def test_no_actuation_before_a_complete_observation(make_harness, tmp_path: Path) -> None:
    wrapper = lambda p: _FailingState(p, PermanentProviderError("403 forbidden"))  # noqa: E731
    h = make_harness(tmp_path, pool_wrappers={"gcp-spot-a3": wrapper})
    initial_onprem = h.sim.pools["onprem-h100"].state(h.daemon.models["llama3-70b-fp8"], h.clock.now()).replicas
    h.run(600)
    rows = h.repo.list_decisions(limit=1000)
    assert rows and all(not r["actuate"] for r in rows)
    assert {r["reason"] for r in rows} == {Reason.NOT_OBSERVED_YET.value}
    model = h.daemon.models["llama3-70b-fp8"]
    # nothing was scaled: the healthy pools still hold what they started with
    assert h.sim.pools["onprem-h100"].state(model, h.clock.now()).replicas == initial_onprem
    ready, info = h.daemon.readiness()
    assert not ready
    # why: the pool that could not be read, with its last error and when (daemon clock)
    assert info["reasons"] == ["not observed yet: llama3-70b-fp8"], info["reasons"]
    failing = info["providers"]["pool/gcp-spot-a3"]
    assert not failing["ok"] and "403 forbidden" in failing["last_error"]
    assert failing["last_error_at"] == h.clock.now().isoformat()
    assert info["providers"]["pool/onprem-h100"] == {"ok": True, "last_error": None, "last_error_at": None}
    assert info["providers"]["database"]["ok"]


@pytest.mark.postgres
def test_daemon_on_postgresql(make_harness, tmp_path: Path, pg_url: str) -> None:
    h = make_harness(tmp_path, db_url=pg_url)
    h.run(900)
    rows = list(h.repo.all_decisions())
    assert len(rows) == 900 / 5
    assert h.repo.get_decision(rows[-1]["id"])["trace"]


class _FailForModel:
    """Wraps a pool provider so that scaling one model fails permanently; others pass through."""

    def __init__(self, inner, model: str) -> None:
        self.inner, self.model, self.pool = inner, model, inner.pool

    def state(self, model, now):
        return self.inner.state(model, now)

    def scale(self, model, replicas, nodes, now):
        if model.name == self.model:
            raise PermanentProviderError(f"deployment for {model.name} not found (404)")
        return self.inner.scale(model, replicas, nodes, now)


def test_one_models_failure_spares_the_others(make_harness, tmp_path: Path) -> None:
    from tests.integration.daemon_harness import demo_config_dict

    raw = demo_config_dict()
    second = dict(raw["models"][0], name="llama3-8b-fp8",
                  deployments={p: {"namespace": "llm", "name": f"llama3-8b-{p}"} for p in raw["models"][0]["deployments"]})
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "second.yaml").write_text(
        DEFAULT_POLICY.replace("llama3-70b-fp8", "llama3-8b-fp8").replace("name: llama3-70b-slo", "name: second"))
    h = make_harness(tmp_path, config_updates={"models": raw["models"] + [second]},
                     pool_wrappers={"onprem-h100": lambda p: _FailForModel(p, "llama3-8b-fp8")})
    reports = h.run(1200)
    assert all("llama3-70b-fp8" in r.decisions for r in reports if not r.skipped)
    assert all("llama3-8b-fp8" in r.errors for r in reports if not r.skipped)
    good = h.repo.list_decisions(model="llama3-70b-fp8", limit=1000)
    bad = h.repo.list_decisions(model="llama3-8b-fp8", limit=1000)
    assert {r["outcome"] for r in good} == {"applied"}
    assert {r["outcome"] for r in bad} <= {"failed", "partial"} and bad
    # the healthy model really scaled while the other one failed
    assert max(r["replicas"] for r in good) > good[-1]["current_replicas"]


class _NoCostSource:
    """The simulated metrics without their cost signal, as a Prometheus source delivers them."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def observe(self, models, now):
        import dataclasses

        from controller.core.model import Sample
        return {m: dataclasses.replace(s, cost_per_million_tokens_usd=Sample.missing("NotExported", now))
                for m, s in self.inner.observe(models, now).items()}


def test_daemon_computes_cost_per_token_from_nodes_prices_and_tokens(make_harness, tmp_path: Path) -> None:
    onprem_cost = {"capital_usd_per_gpu_hour": 1.5, "energy_usd_per_kwh": 0.2, "pue": 1.25,
                   "assumed_gpu_power_kw": 0.7}
    h = make_harness(tmp_path, config_updates={"onprem_cost": onprem_cost})
    h.daemon.metrics_source = _NoCostSource(h.sim.metrics)
    h.run(600)
    row = h.repo.get_decision(h.repo.list_decisions(limit=1)[0]["id"])
    sig = row["signals"]
    tokens = sig["output_tokens_per_s"]["value"]
    model = h.daemon.models["llama3-70b-fp8"]
    cost = 0.0
    for name, st in sig["pools"].items():
        pool = h.daemon.pools[name]
        nodes = pool.nodes_for(model, st["replicas"])  # whole nodes for the model's replicas
        if pool.tier.is_onprem:
            price = pool.gpus_per_node * (1.5 + 0.7 * 1.25 * 0.2)  # capital + assumed energy per node
            assert st["price_per_node_hour_usd"] == pytest.approx(price)  # the price the budget used
        else:
            price = st["price_per_node_hour_usd"] or pool.price_per_node_hour_usd
        cost += nodes * price
    assert cost > 0
    assert sig["cost_per_million_tokens_usd"]["value"] == pytest.approx(cost / (tokens * 3600) * 1e6)
    assert "AssumedPower" in (sig["cost_per_million_tokens_usd"]["reason"] or "")
    text = h.daemon.metrics.render().decode()
    assert 'tidegate_cost_per_million_tokens_usd{model="llama3-70b-fp8"}' in text
    assert h.daemon.status()["models"]["llama3-70b-fp8"]["signals"]["cost_per_million_tokens_usd"]["value"] is not None
