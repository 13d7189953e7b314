"""The ScalingPolicy custom resource is the policy file's format: its schema is generated from the
same pydantic models (and the shipped CRD fails this test when it drifts from them), the API
server's schema accepts what the files accept, and an object loads into the same policy as the
file it mirrors."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import jsonschema
import pytest
import yaml

from controller.core.spec import PolicySpec
from controller.crd import API_VERSION, CRD_NAME, PolicyStatus, crd_manifest, object_document, object_source_name
from controller.policyfile import PolicyError, PolicyStore, load_policy_files
from policies.base import Registry

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "policies" / "examples").glob("*.yaml"))
SHIPPED = ROOT / "deploy" / "helm" / "tidegate" / "crds" / f"{CRD_NAME}.yaml"
sys.path.insert(0, str(ROOT / "deploy" / "helm"))
import gen_crd  # noqa: E402


def _schema(part: str) -> dict[str, Any]:
    root = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root if part == "" else root["properties"][part]


def _nodes(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key in ("properties", "additionalProperties"):
            sub = node.get(key)
            if key == "properties" and isinstance(sub, dict):
                for name, child in sub.items():
                    yield from _nodes(child, f"{path}.{name}")
            elif isinstance(sub, dict):
                yield from _nodes(sub, f"{path}{{}}")
        if isinstance(node.get("items"), dict):
            yield from _nodes(node["items"], f"{path}[]")


def _as_json_schema(node: Any) -> Any:
    """OpenAPI 3.0 (``nullable``, boolean ``exclusiveMinimum``) as JSON Schema draft 4 reads it."""
    if isinstance(node, list):
        return [_as_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _as_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes") and k != "nullable"}
    if node.get("nullable"):
        out["type"] = [node["type"], "null"]
    return out


def _validator(part: str) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(_as_json_schema(_schema(part)))


def test_the_shipped_crd_is_generated_from_the_models(tmp_path: Path) -> None:
    assert SHIPPED.read_text() == gen_crd.render(), "stale: run `python deploy/helm/gen_crd.py`"
    assert gen_crd.main(["--check"]) == 0
    stale = tmp_path / "crd.yaml"
    stale.write_text(SHIPPED.read_text().replace("adopt", "adapt"))
    assert gen_crd.main(["--check", "--out", str(stale)]) == 1
    # every field of the file's spec and of the status is in the definition, nothing else
    assert set(_schema("spec")["properties"]) == set(PolicySpec.model_fields)
    assert set(_schema("status")["properties"]) == set(PolicyStatus.model_fields)


def test_the_schema_is_structural_as_the_api_server_requires() -> None:
    crd = crd_manifest()
    version = crd["spec"]["versions"][0]
    assert crd["metadata"]["name"] == CRD_NAME and f"{crd['spec']['group']}/{version['name']}" == API_VERSION
    assert version["subresources"] == {"status": {}} and crd["spec"]["scope"] == "Namespaced"
    for part in ("spec", "status"):
        for path, node in _nodes(_schema(part), part):
            assert "type" in node, f"{path}: every node of a structural schema has a type"
            assert not {"$ref", "anyOf", "oneOf", "allOf", "const", "title", "default", "$defs"} & set(node), path
            for bound in ("exclusiveMinimum", "exclusiveMaximum"):
                assert isinstance(node.get(bound, True), bool), f"{path}: OpenAPI 3.0 {bound} is a boolean"
            if node["type"] == "object" and "properties" not in node and "additionalProperties" not in node:
                assert node.get("x-kubernetes-preserve-unknown-fields") is True, path
    params = _schema("spec")["properties"]["rules"]["items"]["properties"]["params"]
    assert params["x-kubernetes-preserve-unknown-fields"] is True  # each kind checks its own, in the daemon


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_api_server_schema_accepts_every_example_policy(example: Path) -> None:
    for doc in yaml.safe_load_all(example.read_text()):
        if doc:
            _validator("spec").validate(doc["spec"])


@pytest.mark.parametrize("patch, field", [
    ({"bounds": {"min_replicas": -1}}, "min_replicas"),
    ({"behavior": {"tolerance": 1}}, "tolerance"),
    ({"budget": {"max_cost_per_hour_usd": 0}}, "max_cost_per_hour_usd"),
    ({"missing_data": {"on_missing": "guess"}}, "on_missing"),
    ({"behavior": {"scale_up": {"select": "most"}}}, "select"),
    ({"model": None}, "model"),
])
def test_the_api_server_schema_refuses_what_the_model_refuses(patch: Mapping[str, Any], field: str) -> None:
    spec: dict[str, Any] = {"model": "llama"}
    for key, value in patch.items():
        spec[key] = value
    errors = list(_validator("spec").iter_errors(spec))
    assert errors and any(field in "/".join(map(str, e.absolute_path)) or field in e.message for e in errors)
    with pytest.raises(Exception):
        PolicySpec.model_validate(spec)


class Objects:
    """A ``PolicySource`` holding objects as the API server would list them."""

    name = "ScalingPolicy objects"

    def __init__(self, *objects: Mapping[str, Any]) -> None:
        self.objects = list(objects)
        self.errors: list[PolicyError] = []

    def texts(self) -> dict[str, str]:
        return {object_source_name(o["metadata"]["namespace"], o["metadata"]["name"]): object_document(o)
                for o in self.objects}

    def reloaded(self, errors: Sequence[PolicyError], policies: Mapping[str, Any]) -> None:
        self.errors = list(errors)


def _object(doc: Mapping[str, Any], **meta: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ScalingPolicy",
            "metadata": {"name": doc["metadata"]["name"], "namespace": "llm", "generation": 3, **meta},
            "spec": copy.deepcopy(doc["spec"]), "status": {"conditions": []}}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_an_object_loads_into_the_policy_its_file_gives(example: Path, tmp_path: Path) -> None:
    registry = Registry.from_entry_points()
    from_file = load_policy_files(example, registry)
    assert from_file.ok, from_file.errors
    docs = [d for d in yaml.safe_load_all(example.read_text()) if d]
    store = PolicyStore(registry)
    store.add_source(Objects(*(_object(d, labels={"team": "a"}, uid="u") for d in docs)))
    report = store.reload(tmp_path)  # an empty policies directory: the objects alone
    assert report.ok, report.errors
    for model, pol in from_file.policies.items():
        got = store.policies()[model]
        assert got.spec == pol.spec and [r.name for r in got.rules] == [r.name for r in pol.rules]
        assert got.sources == tuple(object_source_name("llm", d["metadata"]["name"]) for d in docs
                                    if d["spec"]["model"] == model)


def test_a_bad_object_is_refused_with_its_field_and_the_last_good_version_stays(tmp_path: Path) -> None:
    registry = Registry.from_entry_points()
    good = {"metadata": {"name": "q"}, "spec": {"model": "llama", "rules": [
        {"kind": "queue-depth", "params": {"target_per_replica": 2}}]}}
    objects = Objects(_object(good))
    store = PolicyStore(registry)
    store.add_source(objects)
    store.reload(tmp_path)
    version = store.policies()["llama"].version
    bad = copy.deepcopy(good)
    bad["spec"]["rules"][0]["params"]["target_per_replica"] = "four"
    objects.objects = [_object(bad)]
    report = store.reload(tmp_path)
    assert report.kept_previous == ("llama",) and store.policies()["llama"].version == version
    (err,) = objects.errors
    assert err.file == "ScalingPolicy llm/q" and err.path == "spec.rules[0].params.target_per_replica"
    # a wrong apiVersion is named as such, not as a field error
    objects.objects = [{**_object(good), "apiVersion": "tidegate.dev/v9"}]
    store.reload(tmp_path)
    assert [(e.path, "tidegate.dev/v9" in e.message) for e in objects.errors] == [("apiVersion", True)]


def test_an_unreadable_source_keeps_every_policy(tmp_path: Path) -> None:
    registry = Registry.from_entry_points()
    objects = Objects(_object({"metadata": {"name": "q"}, "spec": {"model": "llama"}}))
    store = PolicyStore(registry)
    store.add_source(objects)
    store.reload(tmp_path)

    def down() -> dict[str, str]:
        raise ConnectionError("API server unreachable")

    objects.texts = down  # type: ignore[method-assign]
    report = store.reload(tmp_path)
    assert "llama" in store.policies() and report.kept_previous == ("llama",)
    assert [e.file for e in report.errors] == ["ScalingPolicy objects"] and "unreachable" in report.errors[0].message
