"""Policy files: errors with path and line, merging, versions, the store's hot reload, schema, CLI."""

from __future__ import annotations

import hashlib
import io
import json
import textwrap
from pathlib import Path

import pytest

from controller.core.spec import OnMissing
from controller.policyfile import (
    PolicyStore,
    PolicyVersion,
    json_schema,
    load_policy_files,
    validate_files,
)
from policies.base import Registry
from policies.queue_depth import QueueDepth
from policies.schedule import Schedule
from policies.slo_guard import SloGuard
from policies.target_utilization import TargetUtilization

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"
MODELS = {"llama3-70b-fp8", "mistral-7b-int8"}


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.from_entry_points()


def write(dir_: Path, name: str, text: str) -> Path:
    path = dir_ / name
    path.write_text(textwrap.dedent(text))
    return path


def policy(name: str = "p1", model: str = "llama3-70b-fp8", body: str = "") -> str:
    """A valid document; ``body`` (spec keys, 2-space indented) is appended to the spec."""
    return (f"apiVersion: tidegate/v1\nkind: ScalingPolicy\nmetadata:\n  name: {name}\n"
            f"spec:\n  model: {model}\n" + textwrap.indent(textwrap.dedent(body), "  "))


# --- the examples ---------------------------------------------------------------------------------

def test_examples_are_valid(registry: Registry) -> None:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert {f.name for f in files} >= {"llama3-70b-slo.yaml", "hpa-like.yaml", "keda-like.yaml"}
    result = load_policy_files(EXAMPLES, registry, known_models=MODELS)
    assert result.errors == ()
    assert set(result.policies) == MODELS
    llama = result.policies["llama3-70b-fp8"]
    assert [r.name for r in llama.rules] == ["slo-guard", "schedule"]
    assert llama.spec.budget.max_cost_per_hour_usd == 400
    mistral = result.policies["mistral-7b-int8"]
    assert sorted(r.name for r in mistral.rules) == ["queue-depth", "target-utilization"]
    assert mistral.spec.budget.max_cost_per_hour_usd == 60  # from keda-like.yaml
    out = io.StringIO()
    assert validate_files([EXAMPLES], registry, out, known_models=MODELS) == 0
    assert out.getvalue().startswith("OK: 3 file(s), 3 document(s) valid")


# --- one error per bad file, with message, path and line ----------------------------------------------

BAD = [
    pytest.param(
        policy(body="colour: blue\n"),
        "spec.colour", 7, ["unknown key 'colour'", "extra fields not permitted", "allowed: model, priority, bounds"],
        id="unknown-key"),
    pytest.param(
        policy(body="bounds:\n  min_replicas: 5\n  max_replicas: 3\n"),
        "spec.bounds", 7, ["min_replicas (5) is greater than max_replicas (3)"], id="min-gt-max"),
    pytest.param(
        policy(body="rules:\n  - kind: slo-guard\n  - kind: nope\n"),
        "spec.rules[1].kind", 9,
        ["unknown policy kind 'nope' (known: ", "queue-depth, schedule, slo-guard, target-utilization)"],
        id="unknown-kind"),
    pytest.param(
        policy(body="rules:\n  - kind: queue-depth\n    params:\n      target_per_replica: -4\n"),
        "spec.rules[0].params.target_per_replica", 10,
        ["invalid params for kind 'queue-depth'", "greater than 0", "(got -4)"], id="bad-param-value"),
    pytest.param(
        policy(body="rules:\n  - kind: queue-depth\n    params:\n      activation_threshold: 1\n"),
        "spec.rules[0].params.target_per_replica", 9,
        ["invalid params for kind 'queue-depth'", "required key 'target_per_replica' is missing"],
        id="missing-param"),
    pytest.param(
        policy(body="rules:\n  - kind: target-utilization\n    params: {target: 70, tolerence: 0.2}\n"),
        "spec.rules[0].params.tolerence", 9,
        ["unknown key 'tolerence'", "allowed: signal, target, target_type, tolerance"], id="param-typo"),
    pytest.param(
        policy(body="rules:\n  - kind: schedule\n    params:\n      windows:\n        - cron: '0 8 * * mon-fry'\n"
                    "          duration_s: 60\n          min_replicas: 2\n"),
        "spec.rules[0].params.windows[0].cron", 11,
        ["invalid params for kind 'schedule'", "day-of-week field: 'fry' is not a number or a name"],
        id="bad-cron"),
    pytest.param(
        policy(model="gpt-5"), "spec.model", 6,
        ["unknown model 'gpt-5' (known: llama3-70b-fp8, mistral-7b-int8)"], id="unknown-model"),
    pytest.param(
        policy().replace("tidegate/v1", "tidegate/v2"), "apiVersion", 1,
        ["apiVersion must be 'tidegate/v1' (got 'tidegate/v2')"], id="wrong-api-version"),
    pytest.param(
        policy().replace("kind: ScalingPolicy", "kind: DaemonConfig"), "kind", 2,
        ["kind must be 'ScalingPolicy' (got 'DaemonConfig')"], id="wrong-kind"),
    pytest.param(
        policy().replace("  model: llama3-70b-fp8\n", "  priority: 1\n"), "spec.model", 5,
        ["required key 'model' is missing"], id="missing-model"),
    pytest.param(
        policy(body="budget:\n  max_cost_per_hour_usd: 100\nbudget:\n  max_cost_per_hour_usd: 900\n"),
        "spec.budget", 9, ["duplicate key 'budget' (first at line 7)"], id="duplicate-key"),
    pytest.param(
        policy(body="rules: [{kind: slo-guard}, {kind: slo-guard}]\n"), "spec.rules", 7,
        ["rule name 'slo-guard' appears twice"], id="duplicate-rule-name"),
    pytest.param(
        policy(name="Not_A_Name"), "metadata.name", 4, ["should match pattern"], id="bad-metadata-name"),
    pytest.param(
        policy(body="missing_data: {on_missing: zero}\n"), "spec.missing_data.on_missing", 7,
        ["'hold' or 'ignore'", "(got 'zero')"], id="bad-enum"),
    pytest.param("- just\n- a list\n", "", 1, ["a policy document must be a mapping (got list)"], id="not-a-mapping"),
    # Two placement settings no code ever read are gone: a file that sets one learns it at load
    # instead of believing it works (the recent-interruption window is the provider's).
    pytest.param(
        policy(body="placement:\n  unavailable_after_unready_s: 900\n"), "spec.placement.unavailable_after_unready_s", 8,
        ["unknown key 'unavailable_after_unready_s'", "allowed: pools, spot_spread_min_pools"], id="removed-unready-timeout"),
    pytest.param(
        policy(body="placement:\n  interruption_window_s: 3600\n"), "spec.placement.interruption_window_s", 8,
        ["unknown key 'interruption_window_s'", "max_recent_interruptions"], id="removed-interruption-window"),
]


@pytest.mark.parametrize(("text", "path", "line", "needles"), BAD)
def test_each_problem_has_a_clear_message_path_and_line(
    tmp_path: Path, registry: Registry, text: str, path: str, line: int, needles: list[str],
) -> None:
    f = write(tmp_path, "bad.yaml", text)
    result = load_policy_files([f], registry, known_models=MODELS)
    assert len(result.errors) == 1, result.errors
    err = result.errors[0]
    assert (err.file, err.path, err.line) == (str(f), path, line), err
    for needle in needles:
        assert needle in err.message, (needle, err.message)
    assert result.policies == {}
    # the CLI prints it as FILE:LINE: PATH: message and fails
    out = io.StringIO()
    assert validate_files([f], registry, out, known_models=MODELS) == 1
    expected = f"{f}:{line}: {path}: " if path else f"{f}:{line}: "
    assert out.getvalue().splitlines()[0].startswith(expected)
    assert "FAILED: 1 error(s) in 1 of 1 file(s)" in out.getvalue()


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path, registry: Registry) -> None:
    f = write(tmp_path, "bad.yaml", policy(body="""\
        colour: blue
        bounds: {min_replicas: 9, max_replicas: 3}
        rules:
          - kind: slo-guard
            params: {gpu_utilization_target_pct: 180}
          - kind: nope
        """))
    paths = [e.path for e in load_policy_files([f], registry).errors]
    assert sorted(paths) == sorted(["spec.colour", "spec.bounds", "spec.rules[0].params.gpu_utilization_target_pct",
                                    "spec.rules[1].kind"])


def test_yaml_syntax_error_has_its_line(tmp_path: Path, registry: Registry) -> None:
    f = write(tmp_path, "broken.yaml", "apiVersion: tidegate/v1\nkind: ScalingPolicy\nmetadata: {name: x\nspec:\n  model: m\n")
    result = load_policy_files([f], registry)
    (err,) = result.errors
    assert err.message.startswith("YAML syntax error:")
    assert err.line == 4 and err.path == ""
    assert result.files[0].opaque


def test_empty_and_unreadable_files(tmp_path: Path, registry: Registry) -> None:
    empty = write(tmp_path, "empty.yaml", "# nothing here\n")
    missing = tmp_path / "missing.yaml"
    result = load_policy_files([empty, missing], registry)
    messages = {e.file: e.message for e in result.errors}
    assert messages[str(empty)] == "the file holds no YAML document"
    assert messages[str(missing)].startswith("cannot read the file:")


def test_errors_in_a_later_document_have_file_line_numbers(tmp_path: Path, registry: Registry) -> None:
    text = policy("a") + "---\n" + policy("b", model="mistral-7b-int8", body="bounds: {min_replicas: 4, max_replicas: 2}\n")
    f = write(tmp_path, "multi.yaml", text)
    result = load_policy_files([f], registry)
    (err,) = result.errors
    assert (err.line, err.path, err.model) == (14, "spec.bounds", "mistral-7b-int8")
    # the good document's model still loads
    assert set(result.policies) == {"llama3-70b-fp8"}
    assert result.failed_models == {"mistral-7b-int8"}


def test_duplicate_metadata_name_across_files(tmp_path: Path, registry: Registry) -> None:
    a = write(tmp_path, "a.yaml", policy("shared"))
    b = write(tmp_path, "b.yaml", policy("shared", model="mistral-7b-int8"))
    result = load_policy_files(tmp_path, registry)
    (err,) = result.errors
    assert (err.file, err.line, err.path) == (str(b), 4, "metadata.name")
    assert err.message == f"metadata.name 'shared' is already used by {a}:4"
    assert set(result.policies) == {"llama3-70b-fp8"}


# --- merging several documents of one model ----------------------------------------------------------

def test_documents_of_one_model_merge(tmp_path: Path, registry: Registry) -> None:
    write(tmp_path, "a-team.yaml", policy("team", body="""\
        bounds: {min_replicas: 2, max_replicas: 24}
        slo: {p99_latency_ms: 4000}
        rules: [{kind: slo-guard}]
        behavior: {tolerance: 0.2}
        budget: {max_cost_per_hour_usd: 400}
        missing_data: {on_missing: ignore}
        """))
    write(tmp_path, "b-platform.yaml", policy("platform", body="""\
        priority: 5
        bounds: {min_replicas: 4, max_replicas: 20}
        rules:
          - kind: schedule
            params: {windows: [{cron: "0 8 * * *", duration_s: 3600, min_replicas: 6}]}
        behavior: {tolerance: 0.05}
        placement: {allow_on_demand: false}
        budget: {max_cost_per_hour_usd: 300, max_cost_per_million_tokens_usd: 3}
        """))
    result = load_policy_files(tmp_path, registry)
    assert result.errors == ()
    pol = result.policies["llama3-70b-fp8"]
    assert [type(r) for r in pol.rules] == [SloGuard, Schedule]
    assert [r.kind for r in pol.spec.rules] == ["slo-guard", "schedule"]
    assert (pol.spec.bounds.min_replicas, pol.spec.bounds.max_replicas) == (4, 20)
    assert pol.spec.budget.max_cost_per_hour_usd == 300
    assert pol.spec.budget.max_cost_per_million_tokens_usd == 3
    assert pol.spec.behavior.tolerance == 0.05            # priority 5 wins
    assert pol.spec.placement.allow_on_demand is False    # only b sets it
    assert pol.spec.slo.p99_latency_ms == 4000            # only a sets it
    assert pol.spec.missing_data.on_missing is OnMissing.IGNORE
    assert pol.spec.priority == 5
    assert pol.sources == (str(tmp_path / "a-team.yaml"), str(tmp_path / "b-platform.yaml"))


def test_defaults_do_not_narrow_the_bounds(tmp_path: Path, registry: Registry) -> None:
    write(tmp_path, "a.yaml", policy("a", body="bounds: {min_replicas: 2, max_replicas: 50}\n"))
    write(tmp_path, "b.yaml", policy("b", body="rules: [{kind: queue-depth, params: {target_per_replica: 4}}]\n"))
    pol = load_policy_files(tmp_path, registry).policies["llama3-70b-fp8"]
    assert (pol.spec.bounds.min_replicas, pol.spec.bounds.max_replicas) == (2, 50)
    # a.yaml states no rules, so it adds no default rule: the union is b's rules
    assert [type(r) for r in pol.rules] == [QueueDepth]


@pytest.mark.parametrize(
    ("a_body", "b_body", "path", "needles"),
    [
        ("bounds: {min_replicas: 10, max_replicas: 24}\n", "bounds: {min_replicas: 2, max_replicas: 8}\n",
         "spec.bounds", ["the bounds of model 'llama3-70b-fp8' do not intersect",
                         "min_replicas (10, from {a}:7)", "max_replicas (8, from {b}:7)"]),
        ("behavior: {tolerance: 0.2}\n", "behavior: {tolerance: 0.3}\n",
         "spec.behavior", ["spec.behavior for model 'llama3-70b-fp8' is set by both {a}:7 and {b}:7 at priority 0"]),
        ("rules: [{kind: slo-guard}]\n", "rules: [{kind: slo-guard, params: {capacity_fraction: 0.5}}]\n",
         "spec.rules[0].kind", ["rule name 'slo-guard' is already defined in {a}:7", "must be unique"]),
    ],
    ids=["bounds-do-not-intersect", "priority-tie", "rule-name-clash"],
)
def test_merge_conflicts_name_both_files(tmp_path: Path, registry: Registry, a_body: str, b_body: str,
                                         path: str, needles: list[str]) -> None:
    a = write(tmp_path, "a.yaml", policy("a", body=a_body))
    b = write(tmp_path, "b.yaml", policy("b", body=b_body))
    result = load_policy_files(tmp_path, registry)
    (err,) = result.errors
    assert (err.file, err.path) == (str(b), path)
    for needle in needles:
        assert needle.format(a=a, b=b) in err.message, err.message
    assert result.policies == {} and result.failed_models == {"llama3-70b-fp8"}


def test_a_higher_priority_resolves_a_tie(tmp_path: Path, registry: Registry) -> None:
    write(tmp_path, "a.yaml", policy("a", body="priority: 1\nbehavior: {tolerance: 0.2}\n"))
    write(tmp_path, "b.yaml", policy("b", body="behavior: {tolerance: 0.3}\n"))
    assert load_policy_files(tmp_path, registry).policies["llama3-70b-fp8"].spec.behavior.tolerance == 0.2


# --- versions -------------------------------------------------------------------------------------------

def test_version_hashes_content_not_formatting(tmp_path: Path, registry: Registry) -> None:
    one = write(tmp_path, "one.yaml", policy(body="bounds: {min_replicas: 2, max_replicas: 24}\n"))
    v1 = load_policy_files([one], registry).policies["llama3-70b-fp8"].version
    assert len(v1) == 16 and int(v1, 16) >= 0
    one.write_text("# a comment\nkind: ScalingPolicy\napiVersion: tidegate/v1\n"
                   "spec:\n  bounds:\n    max_replicas: 24\n    min_replicas: 2\n  model: llama3-70b-fp8\n"
                   "metadata: {name: p1}\n")
    result = load_policy_files([one], registry)
    assert result.policies["llama3-70b-fp8"].version == v1
    text = result.canonical["llama3-70b-fp8"]
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == v1
    assert "# source: one.yaml" in text
    one.write_text(policy(body="bounds: {min_replicas: 2, max_replicas: 25}\n"))
    assert load_policy_files([one], registry).policies["llama3-70b-fp8"].version != v1


def test_version_does_not_depend_on_the_order_files_are_given(tmp_path: Path, registry: Registry) -> None:
    a = write(tmp_path, "a.yaml", policy("a"))
    b = write(tmp_path, "b.yaml", policy("b", body="rules: [{kind: queue-depth, params: {target_per_replica: 4}}]\n"))
    v_ab = load_policy_files([a, b], registry).policies["llama3-70b-fp8"]
    v_ba = load_policy_files([b, a], registry).policies["llama3-70b-fp8"]
    assert v_ab.version == v_ba.version and v_ab.sources == v_ba.sources


# --- the store: last good version in force ----------------------------------------------------------------

def test_store_keeps_the_last_good_version_and_isolates_models(tmp_path: Path, registry: Registry) -> None:
    a = write(tmp_path, "llama.yaml", policy("llama", body="bounds: {min_replicas: 2, max_replicas: 24}\n"))
    m = write(tmp_path, "mistral.yaml", policy("mistral", model="mistral-7b-int8"))
    store = PolicyStore(registry, known_models=MODELS)

    first = store.reload(tmp_path)
    assert first.changed and first.ok
    assert {v.model for v in first.new_versions} == MODELS
    model, version, sources, text = next(v for v in first.new_versions if v.model == "llama3-70b-fp8")
    assert sources == (str(a),) and version == store.policies()["llama3-70b-fp8"].version
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == version
    good = store.policies()

    # nothing changed (even a rewrite with the same bytes): nothing re-parsed, nothing new
    a.write_text(a.read_text())
    again = store.reload(tmp_path)
    assert not again.changed and again.new_versions == ()

    # break llama's file and change mistral's at once
    a.write_text(policy("llama", body="bounds: {min_replicas: 30, max_replicas: 24}\n"))
    m.write_text(policy("mistral", model="mistral-7b-int8", body="bounds: {min_replicas: 1, max_replicas: 3}\n"))
    report = store.reload(tmp_path)
    assert report.kept_previous == ("llama3-70b-fp8",)
    assert [v.model for v in report.new_versions] == ["mistral-7b-int8"]
    assert store.policies()["llama3-70b-fp8"] is good["llama3-70b-fp8"]
    assert store.policies()["mistral-7b-int8"].spec.bounds.max_replicas == 3
    (err,) = store.errors()
    assert (err.file, err.line, err.path) == (str(a), 7, "spec.bounds")
    assert "min_replicas (30) is greater than max_replicas (24)" in err.message
    assert report.errors == (err,)
    # polling again changes nothing and reports nothing new; the errors stay visible
    quiet = store.reload(tmp_path)
    assert not quiet.changed and quiet.errors == () and store.errors() == [err]

    status = store.status()
    json.dumps(status)  # JSON-able
    assert status["ok"] is False
    assert status["models"]["llama3-70b-fp8"]["kept_previous"] is True
    assert status["models"]["llama3-70b-fp8"]["version"] == good["llama3-70b-fp8"].version
    assert status["models"]["llama3-70b-fp8"]["errors"][0]["line"] == 7
    assert status["models"]["mistral-7b-int8"]["rules"] == [{"name": "slo-guard", "kind": "slo-guard"}]
    assert status["files"][str(a)]["ok"] is False
    assert status["files"][str(a)]["errors"][0]["message"].startswith("min_replicas (30)")
    assert status["files"][str(m)]["ok"] is True

    # a YAML syntax error keeps it too (the file's models cannot even be read)
    a.write_text("apiVersion: [\n")
    report = store.reload(tmp_path)
    assert report.kept_previous == ("llama3-70b-fp8",) and report.new_versions == ()
    assert store.policies()["llama3-70b-fp8"] is good["llama3-70b-fp8"]
    assert store.status()["models"]["llama3-70b-fp8"]["errors"][0]["message"].startswith("YAML syntax error")

    # fixed: a new version comes into force and the errors go away
    a.write_text(policy("llama", body="bounds: {min_replicas: 2, max_replicas: 20}\n"))
    report = store.reload(tmp_path)
    assert report.ok and [v.model for v in report.new_versions] == ["llama3-70b-fp8"]
    assert store.errors() == [] and store.status()["ok"] is True
    assert store.policies()["llama3-70b-fp8"].spec.bounds.max_replicas == 20

    # deleting a model's only file removes its policy
    m.unlink()
    report = store.reload(tmp_path)
    assert report.removed == ("mistral-7b-int8",)
    assert set(store.policies()) == {"llama3-70b-fp8"}

    seen = store.versions_seen()
    assert all(isinstance(v, PolicyVersion) for v in seen)
    assert [v.model for v in seen] == ["llama3-70b-fp8", "mistral-7b-int8", "mistral-7b-int8", "llama3-70b-fp8"]


def test_store_keeps_a_model_whose_second_file_breaks(tmp_path: Path, registry: Registry) -> None:
    write(tmp_path, "a.yaml", policy("a", body="budget: {max_cost_per_hour_usd: 400}\n"))
    b = write(tmp_path, "b.yaml", policy("b", body="budget: {max_cost_per_hour_usd: 100}\nrules: [{kind: queue-depth, params: {target_per_replica: 4}}]\n"))
    store = PolicyStore(registry)
    store.reload(tmp_path)
    before = store.policies()["llama3-70b-fp8"]
    assert before.spec.budget.max_cost_per_hour_usd == 100
    b.write_text("spec: {model: [\n")  # unparseable: which models it fed cannot be read
    report = store.reload(tmp_path)
    assert report.kept_previous == ("llama3-70b-fp8",)
    # not silently replaced by a.yaml alone (which would lift the budget to 400)
    assert store.policies()["llama3-70b-fp8"] is before


def test_store_reports_a_model_that_never_loaded(tmp_path: Path, registry: Registry) -> None:
    write(tmp_path, "bad.yaml", policy(model="mistral-7b-int8", body="rules: [{kind: nope}]\n"))
    store = PolicyStore(registry)
    report = store.reload(tmp_path)
    assert not report.ok and report.kept_previous == ()
    assert store.policies() == {}
    entry = store.status()["models"]["mistral-7b-int8"]
    assert entry["version"] is None and "unknown policy kind 'nope'" in entry["errors"][0]["message"]


def test_hidden_files_in_a_directory_are_skipped(tmp_path: Path, registry: Registry) -> None:
    write(tmp_path, "a.yaml", policy())
    write(tmp_path, ".#a.yaml", "not: [valid\n")  # an editor's lock file
    write(tmp_path, "notes.txt", "not yaml at all: [\n")
    result = load_policy_files(tmp_path, registry)
    assert result.errors == () and [f.file for f in result.files] == [str(tmp_path / "a.yaml")]


def test_store_keeps_everything_when_the_directory_vanishes(tmp_path: Path, registry: Registry) -> None:
    d = tmp_path / "policies"
    d.mkdir()
    write(d, "a.yaml", policy())
    store = PolicyStore(registry)
    store.reload(d)
    good = store.policies()
    write(d, "a.yaml", policy()).unlink()
    d.rmdir()
    report = store.reload(d)
    assert report.kept_previous == ("llama3-70b-fp8",) and store.policies() == good
    assert report.errors[0].message == "no such file or directory"


# --- schema ------------------------------------------------------------------------------------------------

def test_json_schema_has_every_kind_and_checks_params(registry: Registry, tmp_path: Path) -> None:
    schema = json_schema(registry)
    json.dumps(schema)
    for kind in ("slo-guard", "target-utilization", "queue-depth", "schedule"):
        assert kind in schema["$defs"]
    assert schema["$defs"]["schedule"]["properties"]["windows"]["items"]["$ref"] == "#/$defs/schedule.Window"
    assert "target_per_replica" in schema["$defs"]["queue-depth"]["required"]
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    validator = jsonschema.Draft202012Validator(schema)
    for f in EXAMPLES.glob("*.yaml"):
        for doc in yaml.safe_load_all(f.read_text()):
            validator.validate(doc)
    bad = yaml.safe_load(policy(body="rules: [{kind: queue-depth, params: {target_per_replica: 4, targt: 1}}]\n"))
    assert not validator.is_valid(bad)


def test_registry_built_by_hand_limits_the_known_kinds(tmp_path: Path) -> None:
    reg = Registry([TargetUtilization])
    f = write(tmp_path, "p.yaml", policy(body="rules: [{kind: slo-guard}]\n"))
    (err,) = load_policy_files([f], reg).errors
    assert err.message == "unknown policy kind 'slo-guard' (known: target-utilization)"
    schema = json_schema(reg)
    assert "target-utilization" in schema["$defs"] and "slo-guard" not in schema["$defs"]
