"""The ``ScalingPolicy`` custom resource: its definition, generated from the policy file's model.

A policy can be a file in ``policies_dir`` or a ``ScalingPolicy`` object in the cluster
(``tidegate.dev/v1alpha1``, namespaced). Both are one format: the object's ``spec`` is the file's
``spec`` (``controller.core.spec.PolicySpec``), so its OpenAPI v3 schema is generated from that
pydantic model here, and the daemon turns each object back into a file document
(``object_document``) that ``controller.policyfile.PolicyStore`` validates, merges, versions and
keeps last-good exactly as it does files. The status the daemon writes is a pydantic model too
(``PolicyStatus``), so its schema comes from the same place as its values.

The shipped definition (``deploy/helm/tidegate/crds/``) is written by ``deploy/helm/gen_crd.py``;
``tests/unit/test_crd.py`` fails when it drifts from these models.

Two things the API server would otherwise do are kept out of the schema on purpose:

* no ``default``: the API server would store every default in the object, and the policy merge
  rules count the fields a document *sets* (bounds intersect only where set; ``behavior`` comes
  from the highest-priority document that sets it), so stored defaults would change what a
  policy means. The defaults are in each field's description and applied by the daemon;
* ``rules[].params`` is kept as written (``x-kubernetes-preserve-unknown-fields``): each policy
  kind validates its own params in the daemon, and the object's ``Ready`` condition names the
  field when they are wrong.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

import yaml  # type: ignore[import-untyped, unused-ignore]
from pydantic import BaseModel, ConfigDict, Field

from controller.core.spec import API_VERSION as FILE_API_VERSION
from controller.core.spec import PolicySpec

GROUP = "tidegate.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ScalingPolicy"
PLURAL = "scalingpolicies"
SINGULAR = "scalingpolicy"
SHORT_NAMES = ("tsp",)
CRD_NAME = f"{PLURAL}.{GROUP}"

CONDITION_TYPES = ("Ready", "Active", "AbleToScale", "ScalingLimited", "Degraded")
"""The conditions the daemon keeps on each object, in the order they are listed."""


# --------------------------------------------------------------------------------------------------
# status: what the daemon writes through the status subresource


class _Status(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Condition(_Status):
    """One condition, as Kubernetes objects report them (``metav1.Condition``)."""

    type: str = Field(description="Ready, Active, AbleToScale, ScalingLimited or Degraded.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason code (the decision log's, where one applies).")
    message: str = Field(description="What happened, with the numbers.")
    lastTransitionTime: str = Field(description="When status last changed (RFC 3339, the daemon's clock).")


class PoolReplicas(_Status):
    """One pool of the policy's model."""

    desired: int | None = Field(None, description="Replicas the last decision placed in the pool.")
    current: int | None = Field(None, description="spec.replicas of the pool's Deployment as observed.")
    ready: int | None = Field(None, description="Ready replicas of the pool's Deployment as observed.")
    managed: bool = Field(True, description="False while the daemon leaves the pool alone (another autoscaler scales its Deployment).")


class DecisionRef(_Status):
    id: int | None = Field(None, description="Decision id in the decision log (GET /v1/decisions/{id}; `tidegate why`).")
    time: str = Field(description="When it was decided (RFC 3339).")
    reason: str = Field(description="The decision's reason code.")


class PolicyStatus(_Status):
    """``status`` of a ScalingPolicy object."""

    observedGeneration: int | None = Field(None, description="metadata.generation of the spec this status describes.")
    policyVersion: str | None = Field(None, description="Content hash of the model's policy in force (the decision log stores it with every decision).")
    model: str | None = Field(None, description="The model the policy scales.")
    desiredReplicas: int | None = Field(None, description="Replicas the last decision wants in total.")
    currentReplicas: int | None = Field(None, description="Replicas set across the pools before that decision.")
    pools: dict[str, PoolReplicas] = Field(default_factory=dict, description="Per pool: desired, current and ready replicas.")
    lastDecision: DecisionRef | None = Field(None, description="The decision that last changed this status (not every tick's: status is written only when it changes).")
    costPerHourUSD: str | None = Field(None, description="Cost of the placement per hour, USD, two decimals.")
    costPerMillionTokensUSD: str | None = Field(None, description="Observed cost per million output tokens, USD, two significant digits (rounded so that a steady fleet does not rewrite its status every tick).")
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Active, AbleToScale, ScalingLimited, Degraded.")


# --------------------------------------------------------------------------------------------------
# JSON Schema (pydantic) -> OpenAPI v3 structural schema (Kubernetes)


def _structural(node: Any, defs: Mapping[str, Any]) -> Any:
    """One pydantic JSON Schema node as Kubernetes accepts it in a CRD: ``$ref`` inlined,
    ``anyOf [X, null]`` as ``X`` with ``nullable``, JSON Schema 2020's numeric
    ``exclusiveMinimum`` as OpenAPI 3.0's boolean one, ``const`` as a one-value ``enum``, free-form
    objects preserved, no ``title`` and no ``default`` (see the module docstring)."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    ref = node.pop("$ref", None)
    if ref is not None:
        target = _structural(defs[ref.rsplit("/", 1)[-1]], defs)
        node = {**target, **{k: v for k, v in node.items() if k == "description"}}
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        kept = [a for a in any_of if a.get("type") != "null"]
        if len(kept) != 1:
            raise ValueError(f"cannot express anyOf {any_of} in a structural schema")
        merged = {**_structural(kept[0], defs), **{k: v for k, v in node.items()}}
        if len(kept) < len(any_of):
            merged["nullable"] = True
        node = merged
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "default", "$defs"):
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        elif key == "additionalProperties" and value is False:
            continue  # closed objects: the API server prunes unknown fields (kubectl warns on them)
        elif key == "additionalProperties" and value is True:
            continue  # free-form: preserved below
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s JSON Schema as a Kubernetes structural OpenAPI v3 schema."""
    raw = model.model_json_schema()
    return dict(_structural(raw, raw.get("$defs", {})))


def crd_manifest() -> dict[str, Any]:
    """The ``CustomResourceDefinition`` of ``ScalingPolicy``."""
    spec = openapi_schema(PolicySpec)
    spec["description"] = ("The policy: the same fields as the spec of a policy file "
                           "(tidegate policy schema prints their JSON Schema).")
    status = openapi_schema(PolicyStatus)
    root = {
        "type": "object",
        "description": "How tidegate scales one model: bounds, SLO, rules, behaviour, placement, budget.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    columns = [
        {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
        {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
        {"name": "Able", "type": "string", "jsonPath": '.status.conditions[?(@.type=="AbleToScale")].status'},
        {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
        {"name": "Cost/h", "type": "string", "jsonPath": ".status.costPerHourUSD"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": SINGULAR,
                      "shortNames": list(SHORT_NAMES)},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": root},
            }],
        },
    }


# --------------------------------------------------------------------------------------------------
# objects <-> policy documents


def object_source_name(namespace: str, name: str) -> str:
    """How the policy store (and its errors, and ``/v1/policies``) names an object."""
    return f"{KIND} {namespace}/{name}"


def object_document(obj: Mapping[str, Any]) -> str:
    """A ScalingPolicy object as the policy file document it stands for: the same ``spec``, its
    name, the file format's ``apiVersion``. A wrong ``apiVersion`` or ``kind`` is kept, so the
    store reports it."""
    meta = obj.get("metadata") or {}
    api = obj.get("apiVersion")
    doc = {
        "apiVersion": FILE_API_VERSION if api == API_VERSION else api,
        "kind": obj.get("kind"),
        "metadata": {"name": meta.get("name")},
        "spec": obj.get("spec"),
    }
    return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True))


__all__ = [
    "API_VERSION", "CONDITION_TYPES", "CRD_NAME", "Condition", "DecisionRef", "GROUP", "KIND", "PLURAL",
    "PolicyStatus", "PoolReplicas", "VERSION", "crd_manifest", "object_document", "object_source_name",
    "openapi_schema",
]
