"""Write the tidegate chart's values.schema.json, which Helm checks on install, upgrade, template and
lint: `--set replicaCount=two`, a misspelt value or an unknown config key fails before anything
reaches the cluster.

Two sources, neither restated here:
- `config`: the daemon's own schema (`controller.config.DaemonConfig`, as `tidegate config schema`
  prints it), without the keys the chart sets itself (apiVersion, kind, policies_dir), so a value
  the daemon would refuse is refused by Helm with the same constraints;
- every other value: its type in values.yaml (every value has a default there), objects closed to
  unknown keys, except the free-form maps and lists below (Kubernetes objects, labels, files)
  and the few values with tighter rules (`CONSTRAINTS`).

    python deploy/helm/gen_schema.py           # write deploy/helm/tidegate/values.schema.json
    python deploy/helm/gen_schema.py --check   # exit 1 when the committed file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent / "tidegate"
sys.path.insert(0, str(CHART.parents[2]))  # the repository root, for `controller` when run as a script

from controller.config import DaemonConfig  # noqa: E402
from controller.docs import write_or_check  # noqa: E402

CHART_OWNED_CONFIG_KEYS = ("apiVersion", "kind", "policies_dir")
"""Set by the chart's config template (templates/_helpers.tpl), whatever the values say."""

FREE_FORM_OBJECTS = {
    "serviceAccount.annotations", "service.annotations", "serviceMonitor.labels", "prometheusRule.labels",
    "grafanaDashboard.labels", "dcgmServiceMonitor.labels", "dcgmServiceMonitor.selector", "resources", "podSecurityContext", "securityContext", "podAnnotations",
    "podLabels", "nodeSelector", "affinity",
    "journalVolume",  # a Kubernetes volume source (emptyDir, persistentVolumeClaim...)
}
"""Maps whose keys are the user's (labels, annotations) or Kubernetes objects the chart passes
through: any keys."""

FREE_FORM_LISTS = {
    "imagePullSecrets", "extraEnv", "extraVolumes", "extraVolumeMounts", "tolerations",
    "networkPolicy.ingressFrom",
}
"""Lists of Kubernetes objects the chart passes through."""

FILES = {"type": "object", "additionalProperties": {"type": ["string", "object", "null"]}}
"""File name -> the file's text, a mapping, or null to remove a default file."""

CONSTRAINTS: dict[str, dict[str, Any]] = {
    "replicaCount": {"type": "integer", "minimum": 0},
    "image.pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
    "bundleManifests": FILES,
    "policies": FILES,
    "logLevel": {"enum": ["debug", "info", "warning", "error"]},
    "service.type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
    "service.port": {"type": "integer", "minimum": 1, "maximum": 65535},
    "rbac.managedNamespaces": {"type": "array", "items": {"type": "string", "minLength": 1}},
    "podDisruptionBudget.minAvailable": {"type": ["integer", "string"]},
    "networkPolicy.egressPorts": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 65535}},
    "networkPolicy.egressCidrs": {"type": "array", "items": {"type": "string"}},
    "topologySpread.whenUnsatisfiable": {"enum": ["ScheduleAnyway", "DoNotSchedule"]},
    "topologySpread.maxSkew": {"type": "integer", "minimum": 1},
    "terminationGracePeriodSeconds": {"type": "integer", "minimum": 0},
    "leaderElection.backend": {"enum": ["", "lease", "database", "none"]},
    "leaderElection.leaseDurationSeconds": {"type": "integer", "minimum": 1},
    "leaderElection.retryPeriodSeconds": {"type": "integer", "minimum": 1},
    "leaderElection.buckets": {"type": "integer", "minimum": 1, "maximum": 1000},
}
"""Values whose type in values.yaml says too little (enums, ranges, int-or-string)."""


def _scalar_type(value: Any) -> str | None:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


def infer(value: Any, path: str) -> dict[str, Any]:
    """The schema of one value from its default, the tables above taking precedence."""
    if path in CONSTRAINTS:
        return CONSTRAINTS[path]
    if path in FREE_FORM_OBJECTS:
        return {"type": "object"}
    if path in FREE_FORM_LISTS:
        return {"type": "array", "items": {"type": "object"}}
    if isinstance(value, dict):
        return {"type": "object", "additionalProperties": False,
                "properties": {k: infer(v, f"{path}.{k}" if path else k) for k, v in value.items()}}
    if isinstance(value, list):
        types = {_scalar_type(v) for v in value}
        if len(types) == 1 and None not in types:
            return {"type": "array", "items": {"type": types.pop()}}
        raise ValueError(f"values.yaml: {path} is a list whose item type cannot be inferred; add it to "
                         "FREE_FORM_LISTS or CONSTRAINTS in deploy/helm/gen_schema.py")
    t = _scalar_type(value)
    if t is None:
        raise ValueError(f"values.yaml: {path} is null; give it a typed default or add it to CONSTRAINTS "
                         "in deploy/helm/gen_schema.py")
    return {"type": t}


def config_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The daemon config's schema without the chart-owned keys, and its definitions."""
    schema = DaemonConfig.model_json_schema()
    defs = schema.pop("$defs", {})
    for key in CHART_OWNED_CONFIG_KEYS:
        schema["properties"].pop(key)
    schema["description"] = ("The daemon configuration (kind DaemonConfig, `tidegate config schema`) without "
                             f"{', '.join(CHART_OWNED_CONFIG_KEYS)}, which the chart sets.")
    schema.pop("title", None)
    return schema, defs


def values_schema(values: dict[str, Any]) -> dict[str, Any]:
    schema = infer({k: v for k, v in values.items() if k != "config"}, "")
    config, defs = config_schema()
    schema["properties"]["config"] = config
    schema["properties"] = dict(sorted(schema["properties"].items()))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "Values of the tidegate Helm chart",
            "description": "Generated by deploy/helm/gen_schema.py from values.yaml and controller/config.py; do not edit.",
            **schema, "$defs": defs}


def render() -> str:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    return json.dumps(values_schema(values), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    parser.add_argument("--out", type=Path, default=CHART / "values.schema.json", help="where the schema goes")
    args = parser.parse_args(argv)
    try:
        text = render()
    except ValueError as e:
        print(f"gen_schema: {e}", file=sys.stderr)
        return 2
    return write_or_check(args.out, text, args.check, "python deploy/helm/gen_schema.py")


if __name__ == "__main__":
    sys.exit(main())
