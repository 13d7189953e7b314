"""tidegate as a member of the cluster: ScalingPolicy objects, their status, Events, annotations, and
refusing to scale a Deployment that another autoscaler scales.

Why it exists: a platform engineer who runs HPA and KEDA looks at ``kubectl``. With
``providers.settings.kubernetes_objects.enabled`` the daemon

* reads ``ScalingPolicy`` objects (``tidegate.dev/v1alpha1``, ``controller.crd``) in the namespaces
  of its models' Deployments at every policy reload, beside the files: ``KubeObjects`` is a
  ``controller.policyfile.PolicySource``, so the same validation, merge, version hash and
  last-good-version rules apply to both;
* writes each object's status through the status subresource (``controller.kubestatus``: the
  conditions, replicas per pool, the last decision, cost), only when it changed, at most once per
  tick per object, and only from the leader's tick;
* creates Events (``SuccessfulRescale: 6 -> 9 on aws-spot: ...``) on the scaled Deployments and on
  the ScalingPolicy objects, through ``controller.kubestatus.EventCorrelator`` (no storm on a
  flapping signal), and annotates each Deployment it scales with its policy and decision id, so
  ``kubectl describe deployment`` says who scaled it and why;
* before acting on a pool, looks for an ``autoscaling/v2`` HorizontalPodAutoscaler or a KEDA
  ``ScaledObject`` whose ``scaleTargetRef`` is the pool's Deployment, and for another tidegate
  policy's claim on it (``CLAIM_ANNOTATION``). ``GuardedPool`` then reports the pool unavailable
  (the placement puts nothing new there, ``/v1/status`` shows why) and makes no call to it, and
  the objects say ``AbleToScale=False``, until the other autoscaler is gone or the policy says
  ``adopt: true``. When the check cannot be made before the first success, the pools are left
  alone too: acting blind could start the fight the check is there to avoid.

In dry-run nothing is written to the cluster (no status, no Event, no annotation).
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass, field, replace
from functools import partial
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller import crd
from controller.core.model import Action, ActionStatus, Decision, ModelSignals, ModelSpec, PoolState
from controller.core.policy import EffectivePolicy
from controller.core.spec import Mode
from controller.errors import ProviderError
from controller.kubestatus import Event, EventCorrelator, Refusal, decided_status, error_status, rescale_events
from controller.logs import log
from controller.policyfile import PolicyError
from providers.kubernetes import DeploymentRef, translate_api_error

if TYPE_CHECKING:
    from controller.protocols import Clock, PoolProvider

logger = logging.getLogger("tidegate.providers.kubeobjects")

PROVIDER = "kubeobjects"
CLAIM_ANNOTATION = "tidegate.dev/claimed-by"
"""``<claim_id>/<model>``: the tidegate installation and model that scale the Deployment."""
POLICY_ANNOTATION = "tidegate.dev/scaling-policy"
"""The ScalingPolicy objects (``namespace/name``) or files of the model, comma-separated."""
DECISION_ANNOTATION = "tidegate.dev/decision-id"
"""The decision that last scaled the Deployment (``tidegate why ID``, ``/v1/decisions/{id}``)."""
HPA = "HorizontalPodAutoscaler"
SCALED_OBJECT = "ScaledObject"
KEDA_GROUP, KEDA_VERSION, KEDA_PLURAL = "keda.sh", "v1alpha1", "scaledobjects"


class KubeObjectsSettings(BaseModel):
    """``providers.settings.kubernetes_objects``: ScalingPolicy objects, their status, Events and
    the refusal to fight other autoscalers (see ``providers.kubeobjects``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Read ScalingPolicy objects (tidegate.dev/v1alpha1) in the namespaces of the models' Deployments, write their status, create Events, annotate scaled Deployments and leave alone Deployments another autoscaler scales. Needs the chart's CRD and RBAC (deploy/examples/hybrid-fleet turns it on).")
    claim_id: str = Field("tidegate", min_length=1, max_length=63, description="Names this installation in the claim annotation (tidegate.dev/claimed-by) on the Deployments it scales; another installation's claim is a conflict.")
    conflict_check_s: float = Field(30.0, ge=0, description="How often (daemon clock, seconds) the HorizontalPodAutoscalers, ScaledObjects and Deployment claims are listed; 0: every tick.")
    event_burst: int = Field(25, ge=1, description="Events one object may receive at once (the kubelet's spam filter allows 25).")
    event_refill_s: float = Field(300.0, gt=0, description="Seconds until an object may receive one more Event beyond the burst (the kubelet's: 300).")
    event_dedupe_s: float = Field(600.0, ge=0, description="An Event identical to one sent this recently (same object, reason and message) is not sent again, seconds.")


@dataclass
class _Object:
    namespace: str
    name: str
    model: str | None
    generation: int | None
    status: crd.PolicyStatus | None
    """The status as last written (or as found on the object)."""
    errors: tuple[str, ...] = ()
    version: str | None = None
    warned: tuple[str, ...] = ()
    """The errors an InvalidPolicy Event was sent for."""

    @property
    def source(self) -> str:
        return crd.object_source_name(self.namespace, self.name)


@dataclass
class _Conflicts:
    at: datetime | None = None
    refusals: dict[tuple[str, str], Refusal] = field(default_factory=dict)
    """(model, pool) -> why the pool's Deployment is someone else's."""
    error: str | None = None


def _status_of(raw: Any) -> crd.PolicyStatus | None:
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        return crd.PolicyStatus.model_validate(raw)
    except ValidationError:
        return None  # someone else's or an older shape: rewritten at the next change


class KubeObjects:
    """The objects side of one daemon (see the module docstring). ``deployments``: per model, per
    pool, its Deployment. ``policies``: the policies in force (the daemon's policy store)."""

    name = "ScalingPolicy objects"

    def __init__(self, api_client: Any, settings: KubeObjectsSettings,
                 deployments: Mapping[str, Mapping[str, DeploymentRef]], *, clock: "Clock",
                 policies: Callable[[], Mapping[str, EffectivePolicy]], dry_run: bool = False,
                 request_timeout_s: float = 5.0, registry: CollectorRegistry | None = None,
                 shadow_all: bool = False) -> None:
        from kubernetes import client as k8s

        self.settings = settings
        self.deployments = {m: dict(p) for m, p in deployments.items()}
        self.namespaces = sorted({ref.namespace for pools in deployments.values() for ref in pools.values()})
        self.clock = clock
        self.policies = policies
        self.shadow_all = shadow_all
        """The daemon's ``mode: shadow``: no model fights anyone."""
        self.dry_run = dry_run
        self.timeout = request_timeout_s
        self.custom = k8s.CustomObjectsApi(api_client)
        self.autoscaling = k8s.AutoscalingV2Api(api_client)
        self.apps = k8s.AppsV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.correlator = EventCorrelator(settings.event_burst, settings.event_refill_s, settings.event_dedupe_s)
        self.objects: dict[str, _Object] = {}
        self.conflicts = _Conflicts()
        self._lock = threading.Lock()
        self._absent: set[str] = set()
        """APIs answered 404 (not installed): logged once."""
        self._pending_reload = False
        self._claimed: set[tuple[str, str]] = set()
        """(model, pool) whose Deployment carries this daemon's claim."""
        self._actions: dict[str, list[Action]] = {}
        self._checked_once = False
        """Whether the conflict check has succeeded once."""
        r = registry or CollectorRegistry()
        self.writes = Counter("tidegate_kubernetes_writes", "Writes to the cluster for ScalingPolicy objects, by kind "
                              "(status, event, annotation) and result (ok, failed; dropped: an Event the correlator held back).",
                              ["kind", "result"], registry=r)
        self.refused = Gauge("tidegate_pool_refused", "1 while the daemon leaves a model's Deployment in a pool alone "
                             "because another autoscaler scales it, by reason.", ["model", "pool", "reason"], registry=r)

    # ------------------------------------------------------------------ calls
    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn()
        except (ApiException, OSError, ValueError) as e:
            raise translate_api_error(e, what) from e
        except Exception as e:  # noqa: BLE001 - urllib3 errors and the like: one translation
            raise translate_api_error(e, what) from e

    def _list(self, what: str, fn: Callable[[], Any]) -> list[Any] | None:
        """Items, or ``None`` when the API is not served (404: its CRD is not installed)."""
        from kubernetes.client.exceptions import ApiException

        try:
            out = self._call(what, fn)
        except ProviderError as e:
            if isinstance(e.__cause__, ApiException) and e.__cause__.status == 404:
                if what not in self._absent:
                    self._absent.add(what)
                    log(logger, logging.WARNING, "API not served; treated as holding no objects", what=what)
                return None
            raise
        items = out.get("items") if isinstance(out, dict) else getattr(out, "items", None)
        return list(items or [])

    # ------------------------------------------------------------------ PolicySource
    def texts(self) -> dict[str, str]:
        """Every ScalingPolicy object in the managed namespaces, as policy documents."""
        out: dict[str, str] = {}
        seen: dict[str, _Object] = {}
        for ns in self.namespaces:
            items = self._list(f"ScalingPolicies in {ns}", partial(
                self.custom.list_namespaced_custom_object, crd.GROUP, crd.VERSION, ns, crd.PLURAL,
                _request_timeout=self.timeout))
            for obj in items or []:
                meta = obj.get("metadata") or {}
                name = str(meta.get("name") or "")
                spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
                model = spec.get("model") if isinstance(spec.get("model"), str) else None
                ref = crd.object_source_name(ns, name)
                with self._lock:
                    old = self.objects.get(ref)
                seen[ref] = _Object(ns, name, model, meta.get("generation"),
                                    old.status if old else _status_of(obj.get("status")),
                                    old.errors if old else (), old.version if old else None,
                                    old.warned if old else ())
                out[ref] = crd.object_document(obj)
        with self._lock:
            self.objects = seen
        return out

    def reloaded(self, errors: Sequence[PolicyError], policies: Mapping[str, EffectivePolicy]) -> None:
        """Note each object's errors and version; the leader's next tick writes them."""
        with self._lock:
            for obj in self.objects.values():
                pol = policies.get(obj.model) if obj.model else None
                own = [f"{e.path}: {e.message}" if e.path else e.message for e in errors if e.file == obj.source]
                if not own and (pol is None or obj.source not in pol.sources):
                    # valid on its own, but the model's documents together are not (a priority
                    # tie with a file, a name used twice): say which document is wrong
                    own = [str(e) for e in errors if e.model is not None and e.model == obj.model]
                obj.errors = tuple(own)
                obj.version = pol.version if pol is not None else None
            self._pending_reload = True

    # ------------------------------------------------------------------ conflicts
    def refusals(self, model: str, now: datetime) -> list[Refusal]:
        """The pools of ``model`` the daemon must leave alone now (empty with ``adopt: true``, and in
        shadow mode, which never acts: its decisions must see the pool as the other autoscaler runs it)."""
        self._check_conflicts(now)
        pol = self.policies().get(model)
        if self.shadow_all or (pol is not None and (pol.spec.adopt or pol.spec.mode is Mode.SHADOW)):
            return []
        with self._lock:
            return [r for (m, _), r in sorted(self.conflicts.refusals.items()) if m == model]

    def _check_conflicts(self, now: datetime) -> None:
        c = self.conflicts
        if c.at is not None and (now == c.at or (now - c.at).total_seconds() < self.settings.conflict_check_s):
            return  # at most once per tick (the tick's calls share its ``now``)
        try:
            found = self._find_conflicts()
        except ProviderError as e:
            log(logger, logging.WARNING, "cannot check for other autoscalers", error=str(e))
            with self._lock:
                c.at, c.error = now, str(e)
                if not c.refusals and not self._checked_once:
                    # never checked: leave every pool alone rather than risk a fight
                    c.refusals = {(m, p): Refusal(p, ref.namespace, ref.name, "AutoscalerCheckFailed",
                                                  f"an unchecked autoscaler ({e})")
                                  for m, pools in self.deployments.items() for p, ref in pools.items()}
            return
        with self._lock:
            gone = set(c.refusals.items()) - set(found.items())
            c.at, c.error, c.refusals = now, None, found
            self._checked_once = True
        for (model, pool), r in gone:
            self.refused.remove(model, pool, r.reason)
        for (model, pool), r in found.items():
            self.refused.labels(model=model, pool=pool, reason=r.reason).set(1)

    def _find_conflicts(self) -> dict[tuple[str, str], Refusal]:
        owners: dict[tuple[str, str], str] = {}
        claims: dict[tuple[str, str], str] = {}
        for ns in self.namespaces:
            deployments = self._call(f"Deployments in {ns}", partial(
                self.apps.list_namespaced_deployment, ns, _request_timeout=self.timeout)).items
            for d in deployments or []:
                claim = ((d.metadata.annotations if d.metadata else None) or {}).get(CLAIM_ANNOTATION)
                if claim is not None:
                    claims[(ns, d.metadata.name)] = claim
            hpas = self._list(f"HorizontalPodAutoscalers in {ns}", partial(
                self.autoscaling.list_namespaced_horizontal_pod_autoscaler, ns, _request_timeout=self.timeout))
            for h in hpas or []:
                ref = h.spec.scale_target_ref if h.spec else None
                if ref is not None and ref.kind == "Deployment":
                    owners.setdefault((ns, ref.name), f"{HPA} {ns}/{h.metadata.name}")
            sos = self._list(f"ScaledObjects in {ns}", partial(
                self.custom.list_namespaced_custom_object, KEDA_GROUP, KEDA_VERSION, ns, KEDA_PLURAL,
                _request_timeout=self.timeout))
            for so in sos or []:
                ref = (so.get("spec") or {}).get("scaleTargetRef") or {}
                if ref.get("kind", "Deployment") == "Deployment" and ref.get("name"):
                    owners.setdefault((ns, ref["name"]), f"{SCALED_OBJECT} {ns}/{(so.get('metadata') or {}).get('name')}")
        out: dict[tuple[str, str], Refusal] = {}
        for model, pools in self.deployments.items():
            for pool, ref in pools.items():
                by = owners.get((ref.namespace, ref.name)) or self._other_claim(
                    model, pool, claims.get((ref.namespace, ref.name)))
                if by is not None:
                    reason = ("HorizontalPodAutoscalerActive" if by.startswith(HPA) else
                              "ScaledObjectActive" if by.startswith(SCALED_OBJECT) else "ClaimedByAnotherPolicy")
                    out[(model, pool)] = Refusal(pool, ref.namespace, ref.name, reason, by)
        return out

    def _claim(self, model: str) -> str:
        return f"{self.settings.claim_id}/{model}"

    def _other_claim(self, model: str, pool: str, claim: str | None) -> str | None:
        """Who else claims the pool's Deployment, from its claim annotation (``None``: nobody)."""
        if claim is None or claim == self._claim(model):
            if claim is not None:
                self._claimed.add((model, pool))
            return None
        return f"tidegate policy {claim} (annotation {CLAIM_ANNOTATION})"

    # ------------------------------------------------------------------ writes
    def _write_status(self, obj: _Object, status: crd.PolicyStatus) -> None:
        if obj.status == status or self.dry_run:
            return
        body = {"status": status.model_dump(mode="json")}
        try:
            self._call(f"status of {obj.source}", lambda: self.custom.patch_namespaced_custom_object_status(
                crd.GROUP, crd.VERSION, obj.namespace, crd.PLURAL, obj.name, body, _request_timeout=self.timeout))
        except ProviderError as e:
            log(logger, logging.WARNING, "cannot write the status of a ScalingPolicy", object=obj.source, error=str(e))
            self.writes.labels(kind="status", result="failed").inc()
            return
        self.writes.labels(kind="status", result="ok").inc()
        obj.status = status

    def emit(self, events: Sequence[Event], now: datetime) -> None:
        """Create ``events`` that pass the correlator (never in dry-run)."""
        for e in events:
            if self.dry_run:
                continue
            if not self.correlator.admit(e, now):
                self.writes.labels(kind="event", result="dropped").inc()
                continue
            body: Any = _event_body(e, now)  # the client sends a dict as it is
            try:
                self._call(f"Event on {e.kind} {e.namespace}/{e.name}",
                           lambda: self.core.create_namespaced_event(e.namespace, body, _request_timeout=self.timeout))
            except ProviderError as err:
                log(logger, logging.WARNING, "cannot create an Event", object=f"{e.kind} {e.namespace}/{e.name}",
                    reason=e.reason, error=str(err))
                self.writes.labels(kind="event", result="failed").inc()
                continue
            self.writes.labels(kind="event", result="ok").inc()

    def annotate(self, model: str, pool: str, decision_id: int | None) -> None:
        ref = self.deployments.get(model, {}).get(pool)
        if ref is None or self.dry_run:
            return
        annotations = {CLAIM_ANNOTATION: self._claim(model), POLICY_ANNOTATION: self._policy_names(model)}
        if decision_id is not None:
            annotations[DECISION_ANNOTATION] = str(decision_id)
        body = {"metadata": {"annotations": annotations}}
        try:
            self._call(f"annotations of Deployment {ref.namespace}/{ref.name}", lambda: self.apps.patch_namespaced_deployment(
                ref.name, ref.namespace, body, _request_timeout=self.timeout))
        except ProviderError as e:
            log(logger, logging.WARNING, "cannot annotate a Deployment", deployment=f"{ref.namespace}/{ref.name}",
                error=str(e))
            self.writes.labels(kind="annotation", result="failed").inc()
            return
        self.writes.labels(kind="annotation", result="ok").inc()
        self._claimed.add((model, pool))

    def _policy_names(self, model: str) -> str:
        pol = self.policies().get(model)
        if pol is None:
            return ""
        prefix = f"{crd.KIND} "
        return ",".join(s.removeprefix(prefix) for s in pol.sources)

    def _model_objects(self, model: str) -> list[_Object]:
        with self._lock:
            return [o for o in self.objects.values() if o.model == model]

    # ------------------------------------------------------------------ Listener (the leader's tick)
    def component(self, name: str, error: str | None, now: datetime) -> None:
        # The metrics source answers first in every tick, on the leader only: the moment to
        # report what the last policy reload found (a refused object, a new version).
        if name != "metrics" or not self._pending_reload:
            return
        self._pending_reload = False
        with self._lock:
            objects = list(self.objects.values())
        in_force = self.policies()
        for obj in objects:
            if obj.model not in in_force:
                # no decision will come for it this tick: its status is written here (a model with
                # a policy in force gets its objects' status, errors included, from its decision,
                # so that no object is written twice in one tick)
                self._write_status(obj, error_status(obj.errors, obj.version, obj.generation, obj.status, now))
            if obj.errors and obj.errors != obj.warned:
                obj.warned = obj.errors
                self.emit([Event("ScalingPolicy", obj.namespace, obj.name, "InvalidPolicy",
                                 f"InvalidPolicy: {'; '.join(obj.errors)}"[:1000], "Warning")], now)
            elif not obj.errors:
                obj.warned = ()

    def actions(self, actions: Sequence[Action]) -> None:
        for a in actions:
            self._actions.setdefault(a.model, []).append(a)

    def decided(self, decision: Decision, signals: ModelSignals, outcome: str, decision_id: int | None) -> None:
        model, now = decision.model, decision.at
        actions = self._actions.pop(model, [])
        refusals = self.refusals(model, now)
        failed = sorted({a.pool for a in actions if a.status in (ActionStatus.FAILED_TRANSIENT,
                                                                 ActionStatus.FAILED_PERMANENT)})
        detail = f"failed pools: {', '.join(failed)}" if failed else None
        objects = self._model_objects(model)
        for obj in objects:
            self._write_status(obj, decided_status(decision, decision_id, signals, outcome, detail, refusals,
                                                   obj.errors, obj.version, obj.generation, obj.status))
        refs = {p: (r.namespace, r.name) for p, r in self.deployments.get(model, {}).items()}
        policy_refs = [(o.namespace, o.name) for o in objects]
        events = [Event("Deployment", r.namespace, r.deployment, r.reason, f"{r.reason}: {r.message}", "Warning")
                  for r in refusals]
        events += [Event("ScalingPolicy", ns, name, r.reason, f"{r.reason}: {r.message}", "Warning")
                   for r in refusals for ns, name in policy_refs]
        if outcome in ("applied", "partial", "failed"):
            events += rescale_events(decision, refs, policy_refs, failed)
            refused = {r.pool for r in refusals}
            for pool in refs:
                moved = decision.placement.get(pool) != decision.previous_placement.get(pool)
                if pool not in refused and pool not in failed and (moved or (model, pool) not in self._claimed):
                    self.annotate(model, pool, decision_id)
        self.emit(events, now)


def _event_body(e: Event, now: datetime) -> dict[str, Any]:
    """A core/v1 Event, named as the kubelet names its own (object name and a unique suffix)."""
    t = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    api = "apps/v1" if e.kind == "Deployment" else crd.API_VERSION
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{e.name}.{uuid.uuid4().hex[:16]}", "namespace": e.namespace},
        "involvedObject": {"apiVersion": api, "kind": e.kind, "namespace": e.namespace, "name": e.name},
        "reason": e.reason, "message": e.message[:1024], "type": e.type,
        "source": {"component": "tidegate"}, "reportingComponent": "tidegate.dev/daemon",
        "reportingInstance": "tidegate", "firstTimestamp": t, "lastTimestamp": t, "count": 1,
    }


class GuardedPool:
    """A ``PoolProvider`` that leaves alone the models whose Deployment in this pool another
    autoscaler scales: their state says unavailable (why, in ``unavailable_reason``), and
    ``scale`` makes no call (one ``skipped`` row says why). Other models pass through."""

    def __init__(self, inner: "PoolProvider", objects: KubeObjects) -> None:
        self.inner = inner
        self.pool = inner.pool
        self.objects = objects

    def _refusal(self, model: str, now: datetime) -> Refusal | None:
        return next((r for r in self.objects.refusals(model, now) if r.pool == self.pool.name), None)

    def state(self, model: ModelSpec, now: datetime) -> PoolState:
        st = self.inner.state(model, now)
        r = self._refusal(model.name, now)
        return st if r is None else replace(st, available=False, unavailable_reason=r.message)

    def scale(self, model: ModelSpec, replicas: int, nodes: int, now: datetime) -> Sequence[Action]:
        r = self._refusal(model.name, now)
        if r is None:
            return self.inner.scale(model, replicas, nodes, now)
        return [Action(provider=PROVIDER, call="scale", pool=self.pool.name, model=model.name,
                       arguments={"replicas": replicas, "refused_by": r.by}, status=ActionStatus.SKIPPED,
                       error=r.message)]

    def __getattr__(self, name: str) -> Any:  # the wrapped provider's own parts (marks, settings...)
        return getattr(self.inner, name)


class DecisionListener:
    """The ``controller.controller.Listener`` that hands the daemon's decisions to ``KubeObjects``
    beside the daemon's own listener (``first``), with the decision's id from the controller."""

    def __init__(self, first: Any, objects: KubeObjects, decision_ids: Callable[[], Mapping[str, int]]) -> None:
        self.first = first
        self.objects = objects
        self.decision_ids = decision_ids

    def component(self, name: str, error: str | None, now: datetime) -> None:
        self.first.component(name, error, now)
        self.objects.component(name, error, now)

    def actions(self, actions: Sequence[Action]) -> None:
        self.first.actions(actions)
        self.objects.actions(actions)

    def decided(self, decision: Decision, signals: ModelSignals, outcome: str) -> None:
        self.first.decided(decision, signals, outcome)
        try:
            self.objects.decided(decision, signals, outcome, self.decision_ids().get(decision.model))
        except Exception:  # noqa: BLE001 - reporting in the cluster must never fail a tick
            logger.exception("ScalingPolicy status/Events failed", extra={"fields": {"model": decision.model}})


def attach(daemon: Any, api_client: Any, settings: KubeObjectsSettings) -> KubeObjects:
    """Wire ``KubeObjects`` into a built daemon: its policy store reads the objects, its pools are
    guarded, its controller's listener reports to them."""
    cfg = daemon.config
    deployments = {m.name: dict(m.deployments) for m in cfg.models}
    objects = KubeObjects(api_client, settings, deployments, clock=daemon.clock,
                          policies=daemon.policy_store.policies, dry_run=daemon.dry_run,
                          request_timeout_s=cfg.providers.settings.kubernetes.request_timeout_s,
                          registry=daemon.metrics.core, shadow_all=cfg.mode is Mode.SHADOW)
    daemon.policy_store.add_source(objects)
    daemon.pool_providers = {name: GuardedPool(p, objects) for name, p in daemon.pool_providers.items()}
    ctl = daemon.controller
    ctl.listener = DecisionListener(ctl.listener, objects, lambda: ctl.last_decision_ids)
    return objects


__all__ = [
    "CLAIM_ANNOTATION", "DECISION_ANNOTATION", "DecisionListener", "GuardedPool", "KubeObjects",
    "KubeObjectsSettings", "POLICY_ANNOTATION", "attach",
]
