"""``tidegate import hpa|keda FILE``: a tidegate ScalingPolicy from an ``autoscaling/v2``
HorizontalPodAutoscaler or a ``keda.sh/v1alpha1`` ScaledObject manifest.

What carries over: the bounds (``minReplicas``/``maxReplicas``, KEDA's ``minReplicaCount``/
``maxReplicaCount``), the behaviour (stabilization windows, rate-limit policies, ``selectPolicy``;
for KEDA under ``advanced.horizontalPodAutoscalerConfig``), and the metrics that match a tidegate
signal (``controller.core.signals``): a queue (Triton's pending count, TensorRT-LLM's waiting
requests), GPU utilization (DCGM) and request rate, by the metric's name. A KEDA ``prometheus``
trigger keeps its query as a ``promql`` rule. Everything else (CPU and memory, other triggers,
KEDA's fallback and cooldown...) is listed in a comment at the top of the output, one line per
field, saying why; the printed policy passes ``tidegate policy validate``. With ``--object`` it is
the ScalingPolicy custom resource (``controller.crd``) in the manifest's namespace, to
``kubectl apply``.

The model: a policy names the model's bundle (the daemon config's ``models[].name``), which a
manifest does not know; the scaled Deployment's name stands in, with a comment to check it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import yaml

from controller.core import signals as signal_table
from controller.core.signals import Combine, Signal
from controller.errors import ManifestError

HPA = ("autoscaling/v2", "HorizontalPodAutoscaler")
KEDA = ("keda.sh/v1alpha1", "ScaledObject")

_HPA_WINDOW = {"scale_up": 0, "scale_down": 300}
_HPA_POLICIES: Mapping[str, tuple[Mapping[str, Any], ...]] = {
    "scale_up": ({"type": "percent", "value": 100, "period_s": 15}, {"type": "replicas", "value": 4, "period_s": 15}),
    "scale_down": ({"type": "percent", "value": 100, "period_s": 15},),
}
"""HPA's defaults per direction (the Kubernetes documentation's), for a behavior given in part."""
_SUFFIX = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 1024.0, "Mi": 1024.0 ** 2, "Gi": 1024.0 ** 3}


@dataclass
class _Out:
    """The policy being built and the notes on what did not carry over."""

    where: str
    notes: list[str] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)

    def skip(self, path: str, why: str) -> None:
        self.notes.append(f"{path}: {why}")


def quantity(raw: Any, where: str) -> float:
    """A Kubernetes quantity (``10``, ``"500m"``, ``"1.5k"``) as a number."""
    text = str(raw).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)(m|k|M|G|Ki|Mi|Gi)?", text)
    if m is None:
        raise ManifestError(f"{where}: {text!r} is not a quantity (e.g. 10, 500m, 1.5k)")
    return float(m[1]) * _SUFFIX.get(m[2] or "", 1.0)


def _signal_of(name: str) -> Signal | None:
    """The signal a metric of this name carries (the table's ``imported_from``), if any."""
    return next((s for s in signal_table.SIGNALS if s.model_signal and s.imported_from and re.search(s.imported_from, name, re.I)),
                None)


def _behavior(raw: Any, path: str, out: _Out) -> dict[str, Any] | None:
    """HPA ``behavior`` -> tidegate ``behavior`` (tolerance stays HPA's 0.1)."""
    if not isinstance(raw, Mapping):
        return None
    result: dict[str, Any] = {}
    for hpa_key, key in (("scaleUp", "scale_up"), ("scaleDown", "scale_down")):
        rules = raw.get(hpa_key)
        if not isinstance(rules, Mapping):
            continue
        # a direction given in part keeps HPA's defaults for the rest (tidegate's ScalingRules
        # defaults are no window and no limit)
        mine: dict[str, Any] = {"stabilization_s": int(rules.get("stabilizationWindowSeconds", _HPA_WINDOW[key]))}
        mine["policies"] = [dict(p) for p in _HPA_POLICIES[key]]
        if "policies" in rules:
            mine["policies"] = []
            for i, p in enumerate(rules.get("policies") or []):
                kind = {"Pods": "replicas", "Percent": "percent"}.get(str(p.get("type")))
                if kind is None:
                    out.skip(f"{path}.{hpa_key}.policies[{i}]", f"type {p.get('type')!r} is not Pods or Percent")
                    continue
                mine["policies"].append({"type": kind, "value": int(p["value"]), "period_s": int(p["periodSeconds"])})
        if "selectPolicy" in rules:
            mine["select"] = str(rules["selectPolicy"]).lower()
        for extra in sorted(set(rules) - {"stabilizationWindowSeconds", "policies", "selectPolicy"}):
            out.skip(f"{path}.{hpa_key}.{extra}", "no tidegate equivalent")
        result[key] = mine
    for extra in sorted(set(raw) - {"scaleUp", "scaleDown"}):
        out.skip(f"{path}.{extra}", "no tidegate equivalent")
    return result or None


def _metric_rule(name: str, target: Mapping[str, Any], path: str, out: _Out) -> None:
    """A rule for an HPA metric named ``name`` with ``target``, or a note why there is none."""
    found = _signal_of(name)
    if found is None:
        known = ", ".join(s.name for s in signal_table.SIGNALS if s.imported_from)
        out.skip(path, f"metric {name!r} matches no tidegate signal ({known}); a promql rule on its query can replace it")
        return
    sig = found.name
    kind = target.get("type")
    raw = target.get("averageValue") if kind == "AverageValue" else target.get("value") if kind == "Value" else None
    if raw is None:
        out.skip(path, f"target type {kind!r} of {name!r} has no tidegate equivalent (AverageValue or Value)")
        return
    value = quantity(raw, f"{out.where}: {path}.target")
    if value <= 0:
        out.skip(path, f"target {raw!r} of {name!r} is not above 0")
        return
    total = found.combine is Combine.SUM
    if total:  # HPA's AverageValue on a total over replicas: ceil(total / target), queue-depth's arithmetic
        rule: dict[str, Any] = {"kind": "queue-depth", "params": {"signal": sig, "target_per_replica": value}}
    else:  # already a per-replica level (a mean, a percentage): HPA's ratio on it
        rule = {"kind": "target-utilization", "params": {"signal": sig, "target": value}}
    if kind == "Value" and total:
        out.skip(f"{path}.target.value", "a Value target on a total is read as a target per replica")
    out.rules.append({"name": f"{sig.replace('_', '-')}-{len(out.rules)}", **rule})


def _hpa_metrics(metrics: Any, out: _Out) -> None:
    for i, m in enumerate(metrics or []):
        path = f"spec.metrics[{i}]"
        kind = m.get("type") if isinstance(m, Mapping) else None
        if kind in ("Pods", "Object", "External"):
            body = m.get(kind[0].lower() + kind[1:]) or {}
            name = str((body.get("metric") or {}).get("name", ""))
            _metric_rule(name, body.get("target") or {}, path, out)
            if (body.get("metric") or {}).get("selector"):
                out.skip(f"{path}.metric.selector", "tidegate's queries select the model and pool by label")
        elif kind in ("Resource", "ContainerResource"):
            res = (m.get("resource") or m.get("containerResource") or {}).get("name")
            out.skip(path, f"{kind} {res}: tidegate scales on serving signals, not on {res}")
        else:
            out.skip(path, f"metric type {kind!r} is unknown")


def _keda_triggers(triggers: Any, out: _Out) -> None:
    for i, t in enumerate(triggers or []):
        path = f"spec.triggers[{i}]"
        ttype = t.get("type") if isinstance(t, Mapping) else None
        md = t.get("metadata") or {} if isinstance(t, Mapping) else {}
        if ttype != "prometheus":
            out.skip(path, f"trigger type {ttype!r}: only prometheus triggers carry over (as promql rules)")
            continue
        if "query" not in md or "threshold" not in md:
            raise ManifestError(f"{out.where}: {path}.metadata needs query and threshold (a KEDA prometheus trigger)")
        params: dict[str, Any] = {"query": str(md["query"]).strip(),
                                  "target_per_replica": quantity(md["threshold"], f"{out.where}: {path}.metadata.threshold")}
        if "activationThreshold" in md:
            params["activation_threshold"] = quantity(md["activationThreshold"], f"{out.where}: {path}.metadata.activationThreshold")
        if str(md.get("ignoreNullValues", "true")).lower() == "true":
            out.skip(f"{path}.metadata.ignoreNullValues", "KEDA reads an empty result as 0; tidegate holds on missing "
                                                          "data (set params.missing_as_zero: true for KEDA's reading)")
        if t.get("metricType", "AverageValue") != "AverageValue":
            out.skip(f"{path}.metricType", f"{t.get('metricType')}: the promql rule divides by a target per replica")
        for key in sorted(set(md) - {"query", "threshold", "activationThreshold", "ignoreNullValues"}):
            out.skip(f"{path}.metadata.{key}", "the daemon's own Prometheus settings apply" if key in (
                "serverAddress", "namespace", "customHeaders", "unsafeSsl") else "no tidegate equivalent")
        if t.get("authenticationRef"):
            out.skip(f"{path}.authenticationRef", "the daemon's own Prometheus settings apply")
        name = str(t.get("name") or f"prometheus-{i}")
        out.rules.append({"name": name, "kind": "promql", "params": params})


def _load(text: str, source: str, want: tuple[str, str], other: str) -> Mapping[str, Any]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise ManifestError(f"{source}{line}: not YAML ({getattr(e, 'problem', None) or e}); give one "
                            f"{want[1]} manifest") from None
    found = [d for d in docs if isinstance(d, Mapping) and (d.get("apiVersion"), d.get("kind")) == want]
    if not found:
        seen = ", ".join(f"{d.get('apiVersion')} {d.get('kind')}" for d in docs if isinstance(d, Mapping)) or "nothing"
        raise ManifestError(f"{source}: no {want[0]} {want[1]} in it (found {seen}); "
                            f"for the other kind use `tidegate import {other}`")
    if len(found) > 1:
        raise ManifestError(f"{source}: {len(found)} {want[1]} documents; give one per import")
    doc = found[0]
    if not isinstance(doc.get("spec"), Mapping):
        raise ManifestError(f"{source}: {want[1]} has no spec")
    return doc


def _bounds(lo: Any, hi: Any, names: tuple[str, str], where: str) -> dict[str, int]:
    try:
        return {"min_replicas": int(lo), "max_replicas": int(hi)}
    except (TypeError, ValueError):
        raise ManifestError(f"{where}: spec.{names[0]} ({lo!r}) and spec.{names[1]} ({hi!r}) must be whole numbers") from None


def _render(doc: Mapping[str, Any], target: str, spec: dict[str, Any], out: _Out, what: str, as_object: bool) -> str:
    meta = doc.get("metadata") or {}
    name = str(meta.get("name") or target).lower()
    name = re.sub(r"[^a-z0-9.-]+", "-", name).strip("-.") or "imported"
    policy: dict[str, Any] = {"apiVersion": "tidegate/v1", "kind": "ScalingPolicy", "metadata": {"name": name}, "spec": spec}
    if as_object:  # the ScalingPolicy custom resource, in the manifest's namespace (controller.crd)
        from controller.crd import API_VERSION

        policy["apiVersion"] = API_VERSION
        if meta.get("namespace"):
            policy["metadata"]["namespace"] = str(meta["namespace"])
    head = [f"# Imported from {what} {name} by `tidegate import`.",
            f"# spec.model is the scaled Deployment's name ({target}): set it to the model's bundle name in the",
            "# daemon config if they differ."]
    if out.notes:
        head.append("# Not carried over:")
        head += [f"#   {n}" for n in out.notes]
    return "\n".join(head) + "\n" + yaml.safe_dump(policy, sort_keys=False, width=120)


def _finish(spec: dict[str, Any], out: _Out) -> None:
    if out.rules:
        spec["rules"] = out.rules
    else:
        out.skip("spec (rules)", "no metric carried over: the default slo-guard rule applies; give it spec.slo targets")


def import_hpa(text: str, source: str = "-", *, as_object: bool = False) -> str:
    """The policy for an ``autoscaling/v2`` HorizontalPodAutoscaler manifest, as YAML text."""
    doc = _load(text, source, HPA, "keda")
    s = doc["spec"]
    out = _Out(source)
    target = str((s.get("scaleTargetRef") or {}).get("name") or "")
    if not target or "maxReplicas" not in s:
        raise ManifestError(f"{source}: spec.scaleTargetRef.name and spec.maxReplicas are required in a HorizontalPodAutoscaler")
    spec: dict[str, Any] = {"model": target,
                            "bounds": _bounds(s.get("minReplicas", 1), s["maxReplicas"], ("minReplicas", "maxReplicas"), source)}
    _hpa_metrics(s.get("metrics"), out)
    behavior = _behavior(s.get("behavior"), "spec.behavior", out)
    if behavior:
        spec["behavior"] = behavior
    _finish(spec, out)
    return _render(doc, target, spec, out, "HorizontalPodAutoscaler", as_object)


def import_keda(text: str, source: str = "-", *, as_object: bool = False) -> str:
    """The policy for a ``keda.sh/v1alpha1`` ScaledObject manifest, as YAML text."""
    doc = _load(text, source, KEDA, "hpa")
    s = doc["spec"]
    out = _Out(source)
    target = str((s.get("scaleTargetRef") or {}).get("name") or "")
    if not target:
        raise ManifestError(f"{source}: spec.scaleTargetRef.name is required in a ScaledObject")
    spec: dict[str, Any] = {"model": target, "bounds": _bounds(s.get("minReplicaCount", 0), s.get("maxReplicaCount", 100),
                                                               ("minReplicaCount", "maxReplicaCount"), source)}
    _keda_triggers(s.get("triggers"), out)
    advanced = s.get("advanced") or {}
    behavior = _behavior((advanced.get("horizontalPodAutoscalerConfig") or {}).get("behavior"),
                         "spec.advanced.horizontalPodAutoscalerConfig.behavior", out)
    if behavior:
        spec["behavior"] = behavior
    for key, why in (("pollingInterval", "tidegate reads every model once per tick (loop.interval_s)"),
                     ("cooldownPeriod", "scale-to-zero waits on the scale-down stabilization window instead"),
                     ("idleReplicaCount", "no idle count: min_replicas is the floor"),
                     ("fallback", "tidegate holds the current replicas on missing data (missing_data.on_missing)"),
                     ("initialCooldownPeriod", "no tidegate equivalent")):
        if key in s:
            out.skip(f"spec.{key}", why)
    for key in sorted(set(advanced) - {"horizontalPodAutoscalerConfig"}):
        out.skip(f"spec.advanced.{key}", "no tidegate equivalent")
    _finish(spec, out)
    return _render(doc, target, spec, out, "ScaledObject", as_object)


IMPORTERS: Mapping[str, Callable[..., str]] = {"hpa": import_hpa, "keda": import_keda}
"""``tidegate import`` sources by name."""
