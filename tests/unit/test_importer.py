"""``tidegate import hpa|keda``: manifests shaped like the HPA and KEDA documentations' examples
(written here), the policy printed for them, and that it passes ``tidegate policy validate``."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

from typing import Any

import pytest
import yaml
from jsonschema import Draft4Validator
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.cli import main
from controller.core.spec import ScalingPolicy
from controller.importer import import_hpa
from controller.policyfile import validate_files
from policies.base import Registry

HPA = textwrap.dedent("""\
    apiVersion: autoscaling/v2
    kind: HorizontalPodAutoscaler
    metadata: {name: Llama_HPA}
    spec:
      scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llama-70b}
      minReplicas: 2
      maxReplicas: 12
      metrics:
        - type: Resource
          resource: {name: cpu, target: {type: Utilization, averageUtilization: 60}}
        - type: Pods
          pods:
            metric: {name: nv_inference_pending_request_count}
            target: {type: AverageValue, averageValue: 4}
        - type: Object
          object:
            describedObject: {apiVersion: networking.k8s.io/v1, kind: Ingress, name: main}
            metric: {name: http_requests_per_second}
            target: {type: AverageValue, averageValue: 2500m}
        - type: External
          external:
            metric: {name: DCGM_FI_DEV_GPU_UTIL, selector: {matchLabels: {app: llama}}}
            target: {type: AverageValue, averageValue: "75"}
        - type: External
          external:
            metric: {name: sqs_messages_visible}
            target: {type: AverageValue, averageValue: "30"}
      behavior:
        scaleDown:
          stabilizationWindowSeconds: 600
          policies: [{type: Percent, value: 50, periodSeconds: 60}]
          selectPolicy: Min
        scaleUp:
          selectPolicy: Disabled
    """)

KEDA = textwrap.dedent("""\
    apiVersion: keda.sh/v1alpha1
    kind: ScaledObject
    metadata: {name: llama-scaler}
    spec:
      scaleTargetRef: {name: llama-70b}
      pollingInterval: 15
      cooldownPeriod: 120
      minReplicaCount: 0
      maxReplicaCount: 20
      fallback: {failureThreshold: 3, replicas: 4}
      advanced:
        horizontalPodAutoscalerConfig:
          behavior:
            scaleDown: {stabilizationWindowSeconds: 120}
      triggers:
        - type: prometheus
          name: llm-queue
          metadata:
            serverAddress: http://prometheus.monitoring:9090
            query: sum(nv_inference_pending_request_count{model="llama"})
            threshold: "8"
            activationThreshold: "1.5"
            ignoreNullValues: "false"
        - type: cron
          metadata: {timezone: Europe/Paris, start: 0 8 * * *, end: 0 20 * * *, desiredReplicas: "4"}
    """)


def run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str],
        stdin: str | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def valid(text: str, tmp_path: Path) -> ScalingPolicy:
    f = tmp_path / "imported.yaml"
    f.write_text(text)
    report = io.StringIO()
    assert validate_files([f], Registry.from_entry_points(), report) == 0, report.getvalue()
    return ScalingPolicy.model_validate(yaml.safe_load(text))


def test_hpa_carries_bounds_behaviour_and_matching_metrics_and_comments_the_rest(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "hpa.yaml").write_text(HPA)
    rc, out, err = run(capsys, monkeypatch, ["import", "hpa", str(tmp_path / "hpa.yaml")])
    assert rc == 0 and err == ""
    pol = valid(out, tmp_path)
    s = pol.spec
    assert pol.metadata.name == "llama-hpa" and s.model == "llama-70b"
    assert (s.bounds.min_replicas, s.bounds.max_replicas) == (2, 12)
    down, up = s.behavior.scale_down, s.behavior.scale_up
    assert (down.stabilization_s, down.select, [(p.type.value, p.value, p.period_s) for p in down.policies]) == (
        600, "min", [("percent", 50, 60)])
    # scaleUp given in part keeps HPA's defaults for the rest
    assert (up.stabilization_s, up.select, len(up.policies)) == (0, "disabled", 2)
    rules = {(r.kind, r.params.get("signal")): r.params for r in s.rules}
    assert rules[("queue-depth", "queue_depth")]["target_per_replica"] == 4
    assert rules[("queue-depth", "request_rate_per_s")]["target_per_replica"] == 2.5  # 2500m
    assert rules[("target-utilization", "gpu_utilization_pct")]["target"] == 75
    comments = [line for line in out.splitlines() if line.startswith("#")]
    for path in ("spec.metrics[0]", "spec.metrics[3].metric.selector", "spec.metrics[4]"):
        assert any(path in c for c in comments), path
    assert any("sqs_messages_visible" in c and "promql" in c for c in comments)


def test_keda_prometheus_trigger_becomes_a_promql_rule(capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    rc, out, _ = run(capsys, monkeypatch, ["import", "keda", "-"], stdin=KEDA)
    assert rc == 0
    s = valid(out, tmp_path).spec
    assert (s.bounds.min_replicas, s.bounds.max_replicas) == (0, 20)
    assert s.behavior.scale_down.stabilization_s == 120 and len(s.behavior.scale_down.policies) == 1
    (rule,) = s.rules
    assert (rule.kind, rule.name) == ("promql", "llm-queue")
    assert rule.params == {"query": 'sum(nv_inference_pending_request_count{model="llama"})',
                           "target_per_replica": 8, "activation_threshold": 1.5}
    comments = "\n".join(line for line in out.splitlines() if line.startswith("#"))
    for field in ("serverAddress", "spec.triggers[1]", "pollingInterval", "cooldownPeriod", "spec.fallback"):
        assert field in comments, field
    assert "ignoreNullValues" not in comments  # "false" is tidegate's own reading: nothing lost


@pytest.mark.parametrize("source, text, needle", [
    ("hpa", "a: [", "<stdin>:1: not YAML"),
    ("hpa", KEDA, "no autoscaling/v2 HorizontalPodAutoscaler in it (found keda.sh/v1alpha1 ScaledObject); "
                  "for the other kind use `tidegate import keda`"),
    ("keda", HPA, "use `tidegate import hpa`"),
    ("hpa", HPA.replace("maxReplicas: 12", "maxReplicas: twelve"), "spec.maxReplicas ('twelve')"),
    ("hpa", HPA.replace('averageValue: "75"', 'averageValue: "lots"'), "spec.metrics[3].target: 'lots' is not a quantity"),
    ("keda", KEDA.replace('threshold: "8"', "nothreshold: 8"), "spec.triggers[0].metadata needs query and threshold"),
])
def test_bad_input_is_one_line_saying_where(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                            source: str, text: str, needle: str) -> None:
    rc, out, err = run(capsys, monkeypatch, ["import", source, "-"], stdin=text)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("tidegate: error: ") and needle in err


def test_an_unreadable_file_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    rc, _, err = run(capsys, monkeypatch, ["import", "keda", str(tmp_path / "missing.yaml")])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "missing.yaml" in err and "No such file" in err


_POLICY = st.fixed_dictionaries({"type": st.sampled_from(["Pods", "Percent"]), "value": st.integers(1, 100),
                                 "periodSeconds": st.integers(1, 1800)})
_RULES = st.fixed_dictionaries({}, optional={
    "stabilizationWindowSeconds": st.integers(0, 3600), "policies": st.lists(_POLICY, max_size=3),
    "selectPolicy": st.sampled_from(["Max", "Min", "Disabled"])})
_TARGET = st.sampled_from(["0", "4", "500m", "1.5k", "75", 12])
_METRIC = st.one_of(
    st.builds(lambda res: {"type": "Resource", "resource": {"name": res, "target": {"type": "Utilization",
                                                                                      "averageUtilization": 60}}},
              st.sampled_from(["cpu", "memory"])),
    st.builds(lambda kind, name, target, tt: {"type": kind, kind[0].lower() + kind[1:]: {
        "metric": {"name": name}, "target": {"type": tt, ("averageValue" if tt == "AverageValue" else "value"): target}}},
        st.sampled_from(["Pods", "External", "Object"]),
        st.sampled_from(["nv_inference_pending_request_count", "DCGM_FI_DEV_GPU_UTIL", "http_requests_per_second",
                         "kafka_lag", "llm_queue_size"]),
        _TARGET, st.sampled_from(["AverageValue", "Value"])),
)


@settings(max_examples=60, deadline=None)
@given(lo=st.integers(0, 50), extra=st.integers(0, 100), metrics=st.lists(_METRIC, max_size=4),
       behavior=st.fixed_dictionaries({}, optional={"scaleUp": _RULES, "scaleDown": _RULES}))
def test_any_hpa_of_the_documented_shape_imports_to_a_valid_policy(lo: int, extra: int, metrics: list[Any],
                                                                   behavior: dict[str, Any]) -> None:
    doc = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "gen"},
           "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "llama"}, "minReplicas": lo,
                    "maxReplicas": lo + extra, "metrics": metrics, **({"behavior": behavior} if behavior else {})}}
    out = import_hpa(yaml.safe_dump(doc), "gen.yaml")
    pol = ScalingPolicy.model_validate(yaml.safe_load(out))
    registry = Registry.from_entry_points()
    for rule in pol.spec.rules:
        registry.build(rule.kind, rule.params, rule.name)
    assert (pol.spec.bounds.min_replicas, pol.spec.bounds.max_replicas) == (lo, lo + extra)
    # every metric is exactly one of: a rule, or a comment naming it with the reason
    comments = "\n".join(line for line in out.splitlines() if line.startswith("#"))
    mapped = len(yaml.safe_load(out)["spec"].get("rules", []))
    assert mapped + sum(1 for i in range(len(metrics)) if f"spec.metrics[{i}]: " in comments) == len(metrics)


def test_as_an_object_it_is_the_custom_resource_the_daemon_loads_like_a_file(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from controller.crd import API_VERSION, crd_manifest, object_document
    from tests.unit.test_crd import _as_json_schema

    keda = KEDA.replace("metadata: {name: llama-scaler}", "metadata: {name: llama-scaler, namespace: llm}")
    rc, out, _ = run(capsys, monkeypatch, ["import", "keda", "-", "--object"], stdin=keda)
    obj = yaml.safe_load(out)
    assert rc == 0 and obj["apiVersion"] == API_VERSION and obj["metadata"] == {"name": "llama-scaler", "namespace": "llm"}
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    Draft4Validator(_as_json_schema(schema)).validate(obj)  # what the API server checks on apply
    assert valid(object_document(obj), tmp_path).spec.rules[0].kind == "promql"  # what the daemon loads
