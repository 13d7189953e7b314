"""One tick: observe -> decide -> act -> record, for every model, over the provider protocols.

``Controller`` is the only loop around a decision function (``controller.core.pipeline.decide``
for tidegate; a baseline's for the simulator's comparisons). The daemon (``controller.daemon``)
wraps it with scheduling, leader election, backoff, metrics, status and readiness; the simulator
(``controller.sim.engine``) wraps the same class with a simulated clock and simulated providers and
an in-memory recorder. So make-before-break, node sums across models, the cost signal, dry-run and
the handling of failed provider calls are one piece of code wherever a decision is made.

A tick, in order:

1. **History** (first tick, or after ``forget_history()``): each model's ``History`` is rebuilt from
   the recorder over the longest window its policy looks back, so a restart does not reset
   stabilization windows or rate limits.
2. **Observe**: the metrics source reads every model's signals at once; each pool provider reports
   its pool's state for each model it serves; live prices fill pools without a price of their own;
   the cost per million tokens is computed from pool states and prices when the source has none.
   Providers that can share their reads (``controller.protocols.SharesReads``) share them for the
   whole tick, act included, and no longer: Kubernetes lists each namespace once, not each model's
   objects in each pool, and each cloud node group is read once (again after a write of its own).
   A provider that fails yields an unknown pool (``replicas=None``), which the core holds on.
3. **Decide**: the decision function, once per model, with the recorder's overrides. One model's
   failure spares the others.
4. **Act**: nodes per pool are summed over every model's newest placement (models do not share
   nodes); each model's pools are scaled growing ones first (make before break). A failed call is
   logged with what it had already done (``partial``); in dry-run no provider is called (this is
   the only dry-run there is: providers have none of their own). A model in
   shadow mode (its policy's ``mode: shadow`` or the daemon's) decided on a fleet of its own
   (``controller.core.virtual``: its last placement in place of what runs) and is never acted on;
   its decision is recorded with the signals as observed, outcome ``skipped``, ``SHADOW_DETAIL``,
   in its intent: never ``pending``, so a daemon killed mid-tick leaves no shadow decision for
   reconciliation to judge against the pools that run (they are not tidegate's).
5. **Record**: intent before effect. Every model's decision (with its signals) is written as one
   batch, outcome ``pending``, *before* the first provider call; the actions and outcomes of all
   models follow as one more batch after the calls. A recorder that cannot reach its database
   journals the intents locally (``RecordedIntents.journaled``): the tick then acts only on pools
   that grow (capacity it released without a record could not be accounted for). A recorder that
   can store nothing raises: the tick acts on nothing.

On the first tick (and after ``forget_history()``), before history is rebuilt, decisions left
``pending`` by a daemon that died between its intent and its outcome are reconciled against what
the providers report now (``reconcile``): applied, partly applied or not applied. The recorder
stores the result and corrects the recorded scale step to what was applied, so the rebuilt
stabilization window and rate-limit history count every step that reached the cluster. An intent
older than the history window is settled the same way when it is its model's newest decision
(nothing acted on the model since its daemon died; its detail gives its age); a tick whose outcomes
could not be written has its models' history rebuilt, and their intents reconciled, at the next
tick. So no decision of a configured model stays ``pending``.
"""

from __future__ import annotations

import logging
import threading
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Callable, Collection, Mapping, Protocol, Sequence, cast

from controller.core.model import (
    Action,
    ActionStatus,
    Decision,
    History,
    ModelSignals,
    ModelSpec,
    Override,
    PoolSpec,
    PoolState,
    Sample,
)
from controller.core.pipeline import decide as pipeline_decide
from controller.core.policy import EffectivePolicy
from controller.core.pricing import OnPremCost, with_cost
from controller.core.reasons import Reason
from controller.core.spec import Mode
from controller.core.virtual import shadow_signals
from controller.errors import ProviderError
from controller.logs import log
from controller.protocols import (
    Clock, EvaluatesQueries, MeasuresPower, MetricsSource, PoolProvider, PriceSource, degraded_models,
)

logger = logging.getLogger("tidegate.controller")

SHADOW_DETAIL = "shadow mode: decided as if in charge, not acting"
"""The outcome detail of a shadow decision (outcome ``skipped``): ``controller.shadow`` finds them by it."""

DEFAULT_HISTORY_HORIZON_S = 1800.0
"""How far back history is rebuilt for a model without a policy yet (30 min)."""

HELD = "database unavailable: pools held, not released"
"""Outcome detail of a decision acted on from the journal only: the pools that would not grow."""

DecisionFunction = Callable[..., Decision]
"""Called with the keyword arguments of ``controller.core.pipeline.decide`` (``model``, ``pools``,
``signals``, ``policy``, ``history``, ``overrides``, ``now``, ``paused``); returns a ``Decision``."""


@dataclass(frozen=True)
class Outcome:
    """What came of one recorded intent: the calls made and the outcome (``controller.db.models.
    OUTCOMES``). ``applied_replicas``: set by reconciliation only, the total replicas found applied
    (the recorder corrects the decision's scale step to it)."""

    decision_id: int
    actions: Sequence[Action]
    outcome: str
    detail: str | None = None
    applied_replicas: int | None = None


@dataclass(frozen=True)
class RecordedIntents:
    """Ids of a tick's intents, in the order given. ``journaled``: the database could not take
    them and they wait in the recorder's local journal (to be replayed when it returns), so only
    growing pools may be acted on."""

    ids: Sequence[int]
    journaled: bool = False
    behind_replay: bool = False
    """Journaled because an earlier journal is still being replayed (a slice a tick), not because
    the database refused them."""


@dataclass(frozen=True)
class PendingIntent:
    """A recorded intent with no outcome: its daemon died (or lost the database) between the
    intent and the outcome."""

    decision_id: int
    model: str
    at: datetime
    placement: Mapping[str, int]
    previous_placement: Mapping[str, int]
    dry_run: bool


class Recorder(Protocol):
    """Where decisions go and history comes from: the decision log (``controller.db.recorder``) for
    the daemon, memory for the simulator. Every method covers all the tick's models at once (one
    query or one transaction)."""

    def histories(self, horizons: Mapping[str, float], now: datetime) -> Mapping[str, History]:
        """Each model's history as the last decision before ``now`` left it, ``horizons[model]``
        seconds back."""
        ...

    def overrides(self, now: datetime) -> Sequence[Override]:
        """Operator overrides in force at ``now``, every model's."""
        ...

    def flush(self, now: datetime) -> bool:
        """Write what the recorder holds locally (a journal of intents the database refused) to
        its store; True when nothing is left waiting."""
        ...

    def pending(self, models: Sequence[str], since: datetime) -> Sequence[PendingIntent]:
        """Intents of these models still ``pending`` (oldest first): those made at or after
        ``since``, and each model's newest decision when it is older and still pending (its daemon
        died, and nothing acted on the model for longer than the history window)."""
        ...

    def intents(self, items: Sequence[tuple[Decision, ModelSignals]], dry_run: bool,
                shadow: Collection[str] = frozenset()) -> RecordedIntents:
        """Store the tick's decisions with their signals, outcome ``pending``, durably, before any
        call; raises when they can be stored nowhere. The decisions of the models in ``shadow``
        are never acted on: their outcome (``skipped``, ``SHADOW_DETAIL``) is stored with them,
        so no shadow decision is ever left ``pending`` (nor judged against the pools that run)."""
        ...

    def outcomes(self, items: Sequence[Outcome]) -> None:
        """Store the calls made for the tick's decisions and what came of them."""
        ...


class Listener(Protocol):
    """What the tick tells its owner (the daemon: health, metrics, logs; the simulator: nothing)."""

    def component(self, name: str, error: str | None, now: datetime) -> None:
        """A component (``metrics``, ``prices``, ``pool/NAME``) answered (``error is None``) or not."""
        ...

    def actions(self, actions: Sequence[Action]) -> None:
        """Calls made (or that would have been, in dry-run) for one decision."""
        ...

    def decided(self, decision: Decision, signals: ModelSignals, outcome: str) -> None:
        """One model's decision is acted on and recorded."""
        ...


class Silent:
    """A ``Listener`` that ignores everything (the simulator's)."""

    def component(self, name: str, error: str | None, now: datetime) -> None:
        return None

    def actions(self, actions: Sequence[Action]) -> None:
        return None

    def decided(self, decision: Decision, signals: ModelSignals, outcome: str) -> None:
        return None


@dataclass
class TickReport:
    at: datetime
    decisions: dict[str, Decision] = field(default_factory=dict)
    decision_ids: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    skipped: str | None = None
    transient_failures: int = 0
    """Provider calls that failed with a retryable error (the daemon backs off on them)."""
    journaled: bool = False
    """The tick's intents went to the local journal (the database could not take them, or
    ``behind_replay``)."""
    behind_replay: bool = False
    """They went there behind a journal still being replayed a slice a tick (the database took
    the slice)."""

    @property
    def ok(self) -> bool:
        return self.skipped is None and not self.errors


def history_horizon_s(policy: EffectivePolicy | None) -> float:
    """The longest window a policy's behaviour looks back (stabilization, cooldowns, rate-limit
    periods; at least 60 s)."""
    if policy is None:
        return DEFAULT_HISTORY_HORIZON_S
    b = policy.spec.behavior
    periods = [rl.period_s for rl in (*b.scale_up.policies, *b.scale_down.policies)]
    return max([b.scale_up.stabilization_s, b.scale_down.stabilization_s,
                b.scale_up.cooldown_s, b.scale_down.cooldown_s, *periods, 60.0])


class Controller:
    """Observe, decide, act and record once per ``tick()`` for every model (see the module doc).

    ``policies`` is read at each tick (the daemon's policy store reloads files behind it). With
    ``policy_required`` (the default), a model without a policy is an error of that tick; a
    baseline's decision function that needs none is called with ``policy=None``. ``state_lock``
    guards the per-model state others read (``last_decisions``, ``last_signals``...)."""

    def __init__(
        self,
        *,
        models: Mapping[str, ModelSpec],
        pools: Mapping[str, PoolSpec],
        clock: Clock,
        metrics_source: MetricsSource,
        pool_providers: Mapping[str, PoolProvider],
        recorder: Recorder,
        policies: Callable[[], Mapping[str, EffectivePolicy]],
        price_source: PriceSource | None = None,
        decide: DecisionFunction = pipeline_decide,
        policy_required: bool = True,
        dry_run: bool = False,
        onprem_cost: OnPremCost | None = None,
        listener: Listener | None = None,
        state_lock: threading.RLock | None = None,
        shadow_all: bool = False,
    ) -> None:
        self.models = dict(models)
        self.pools = dict(pools)
        self.clock = clock
        self.metrics_source = metrics_source
        self._kinds_of: object = None
        self._kinds = (False, False)
        self.pool_providers = dict(pool_providers)
        self.price_source = price_source
        self.recorder = recorder
        self.policies = policies
        self.decide = decide
        self.policy_required = policy_required
        self.dry_run = dry_run
        self.onprem_cost = onprem_cost
        self.listener: Listener = listener or Silent()
        self.state_lock = state_lock or threading.RLock()
        self.histories: dict[str, History] = {}
        self.last_decisions: dict[str, Decision] = {}
        self.last_decision_ids: dict[str, int] = {}
        self.last_signals: dict[str, ModelSignals] = {}
        self.shadow_all = shadow_all
        """Every model in shadow mode (the daemon's ``mode: shadow``), whatever its policy says."""
        self.observed_once: set[str] = set()
        """Models that have had a decision past ``NotObservedYet`` (readiness waits for them)."""
        self._history_loaded = False
        self._stale_history: set[str] = set()
        self._unwritten: set[str] = set()
        """Models whose last outcomes could not be written (reconciled at the next tick)."""
        self._last_overrides: list[Override] = []

    # ------------------------------------------------------------------ history
    def forget_history(self, models: Collection[str] | None = None) -> None:
        """Rebuild history from the recorder at the next tick (after another daemon was leader),
        for every model or only ``models`` (those this replica just took over from another)."""
        if models is None:
            self._history_loaded = False
        else:
            self._stale_history.update(models)

    def forget(self, models: Collection[str]) -> None:
        """Drop the per-model state of ``models`` (another replica acts on them now)."""
        with self.state_lock:
            for name in models:
                for state in (self.histories, self.last_decisions, self.last_decision_ids, self.last_signals):
                    state.pop(name, None)  # type: ignore[attr-defined]
                self.observed_once.discard(name)

    def _ensure_history(self, signals: Mapping[str, ModelSignals], now: datetime) -> None:
        """Reconcile pending intents with what was just observed, then rebuild every model's
        history in one read (first tick, or after ``forget_history()``; only the models in
        ``forget_history(models)`` when a sharded replica gained them)."""
        if self._history_loaded and not self._stale_history:
            return
        names = [n for n in self.models if n in signals and (not self._history_loaded or n in self._stale_history)]
        policies = self.policies()
        horizons = {name: history_horizon_s(policies.get(name)) for name in names}
        self.recorder.flush(now)  # a journal's intents first: they may be the pending ones
        self.reconcile({n: signals[n] for n in names}, now - timedelta(seconds=max(horizons.values(), default=0.0)))
        self.histories.update(self.recorder.histories(horizons, now))
        self._history_loaded = True
        self._stale_history.clear()
        self._unwritten.clear()

    def reconcile(self, signals: Mapping[str, ModelSignals], since: datetime) -> list[Outcome]:
        """Settle the intents left ``pending`` (a daemon killed between its intent and its outcome)
        against the pools' observed replicas; returns what was recorded. Those made since ``since``
        weigh on the rebuilt windows and rate limits; an older one (its model's newest decision:
        nothing acted on the model since) weighs on none, but is settled all the same, its detail
        saying how old it was when judged by what runs now: no intent stays ``pending``."""
        found = []
        for p in self.recorder.pending([m for m in self.models if m in signals], since):
            outcome = reconcile_intent(p, signals.get(p.model), self._occasion(p.model))
            if p.at < since:
                age = (signals[p.model].at - p.at).total_seconds()
                outcome = replace(outcome, detail=f"{outcome.detail} ({age:.0f} s after the intent, older than "
                                                  f"the history window; judged by what runs now)")
            found.append(outcome)
            log(logger, logging.WARNING, "pending decision reconciled", model=p.model, decision_id=p.decision_id,
                outcome=outcome.outcome, detail=outcome.detail, applied_replicas=outcome.applied_replicas)
        if found:
            self.recorder.outcomes(found)
        return found

    def _occasion(self, model: str) -> str:
        """Why a model's pending intents are being reconciled now, in the words of the detail."""
        if not self._history_loaded:
            return "at start"
        if model in self._unwritten:
            return "after its outcome could not be written"
        return "on taking the model over"

    # ------------------------------------------------------------------ observe
    def observe(self, now: datetime, models: Collection[str] | None = None) -> dict[str, ModelSignals]:
        """Every model's (or ``models``') signals with its pools' states, live prices and cost filled in."""
        chosen = self.models if models is None else {n: self.models[n] for n in models}
        specs = list(chosen.values())
        evaluates, measures_power = self._source_kinds()
        if evaluates:  # the PromQL the rules need this tick
            cast(EvaluatesQueries, self.metrics_source).set_queries({n: tuple(q for r in p.rules for q in r.queries())
                                             for n, p in self.policies().items() if n in chosen})
        try:
            raw = dict(self.metrics_source.observe(specs, now))
            self.listener.component("metrics", None, now)
        except ProviderError as e:  # a metrics source should not raise, but never trust it
            log(logger, logging.WARNING, "metrics source failed; all signals missing", error=str(e))
            self.listener.component("metrics", str(e), now)
            raw = {}
        prices = self._prices(now)
        degraded_all = degraded_models(self.metrics_source)
        power_of = cast(MeasuresPower, self.metrics_source).power_kw if measures_power else None
        out: dict[str, ModelSignals] = {}
        for name, model in chosen.items():
            sig = raw.get(name) or ModelSignals(model=name, at=now)
            states = {pool_name: self._pool_state(model, pool_name, prices, now) for pool_name in model.pools}
            sig = ModelSignals(sig.model, sig.at, samples=sig.samples, pools=states,
                               degraded=degraded_all.get(name) or sig.degraded, queries=sig.queries)
            # Prometheus knows tokens and power, providers know replicas and prices: the pricing
            # module prices the pools (the budget stage uses these prices) and the cost per token.
            sig = self._with_cost(sig, model, now, power_of)
            out[name] = sig
        return out

    def _source_kinds(self) -> tuple[bool, bool]:
        """Whether the metrics source evaluates the rules' queries and measures power: asked once
        per source, not per tick: a runtime-checkable protocol's ``isinstance`` costs ~7 us
        (``python -m timeit``), and the simulator's week at 50 replicas runs 120,959 ticks."""
        source = self.metrics_source
        if self._kinds_of is not source:
            self._kinds = (isinstance(source, EvaluatesQueries), isinstance(source, MeasuresPower))
            self._kinds_of = source
        return self._kinds

    def _prices(self, now: datetime) -> Mapping[str, float]:
        if self.price_source is None:
            return {}
        try:
            prices = self.price_source.prices(list(self.pools.values()), now)
            self.listener.component("prices", None, now)
            return prices
        except ProviderError as e:
            log(logger, logging.WARNING, "price source failed; static prices used", error=str(e))
            self.listener.component("prices", str(e), now)
            return {}

    def _pool_state(self, model: ModelSpec, pool_name: str, prices: Mapping[str, float], now: datetime) -> PoolState:
        provider = self.pool_providers.get(pool_name)
        if provider is None:
            return PoolState(pool=pool_name, replicas=None, available=False,
                             unavailable_reason="no provider configured", at=now)
        try:
            st = provider.state(model, now)
            self.listener.component(f"pool/{pool_name}", None, now)
        except ProviderError as e:
            # Unknown capacity: the core holds (NotObservedYet) rather than guess.
            log(logger, logging.WARNING, "pool state unavailable", model=model.name, pool=pool_name, error=str(e))
            self.listener.component(f"pool/{pool_name}", str(e), now)
            st = PoolState(pool=pool_name, replicas=None, available=False,
                           unavailable_reason=f"state failed: {e}", at=now)
        if pool_name in prices and st.price_per_node_hour_usd is None:
            st = replace(st, price_per_node_hour_usd=prices[pool_name])
        return st

    def _with_cost(self, sig: ModelSignals, model: ModelSpec, now: datetime,
                   power_of: Callable[[str], Mapping[str, Sample]] | None) -> ModelSignals:
        power = power_of(model.name) if power_of is not None else None
        return with_cost(sig, model, self.pools, now, onprem=self.onprem_cost, power_kw=power)

    # ------------------------------------------------------------------ decide
    def _decide(self, name: str, model: ModelSpec, signals: ModelSignals, policies: Mapping[str, EffectivePolicy],
                overrides: Mapping[str, Sequence[Override]], now: datetime, paused: bool,
                report: TickReport) -> Decision | None:
        policy = policies.get(name)
        if policy is None and self.policy_required:
            report.errors[name] = "no valid policy for this model"
            return None
        if self.is_shadow(policy):
            # As if in charge: tidegate's own fleet (its last placement) in place of what runs.
            last = self.last_decisions.get(name)
            signals = shadow_signals(signals, None if last is None else last.placement)
        try:
            decision = self.decide(
                model=model, pools=self.pools, signals=signals, policy=policy,
                history=self.histories.get(name, History()), overrides=overrides.get(name, ()),
                now=now, paused=paused,
            )
        except Exception as e:  # noqa: BLE001 - isolate models from each other
            logger.exception("decision failed", extra={"fields": {"model": name}})
            report.errors[name] = f"{type(e).__name__}: {e}"
            return None
        if decision.reason != Reason.NOT_OBSERVED_YET.value:
            self.observed_once.add(name)
        return decision

    def is_shadow(self, policy: EffectivePolicy | None) -> bool:
        """Shadow mode: decide as if in charge, never act (the daemon's mode or the policy's)."""
        return self.shadow_all or (policy is not None and policy.spec.mode is Mode.SHADOW)

    # ------------------------------------------------------------------ act
    def pool_nodes(self, placements: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
        """Nodes each pool must hold for every model's placement (models do not share nodes)."""
        nodes: dict[str, int] = {}
        for model_name, placement in placements.items():
            model = self.models[model_name]
            for pool_name, replicas in placement.items():
                pool = self.pools[pool_name]
                nodes[pool_name] = nodes.get(pool_name, 0) + pool.nodes_for(model, replicas)
        for pool_name, pool in self.pools.items():
            nodes[pool_name] = max(nodes.get(pool_name, 0), pool.min_nodes)
        return nodes

    def act(self, decision: Decision, nodes: Mapping[str, int], now: datetime, *,
            grow_only: bool = False) -> tuple[list[Action], str, str | None]:
        """Apply one decision: ``(actions, outcome, detail)``, outcome one of ``skipped``,
        ``dry-run``, ``applied``, ``partial``, ``failed``. ``grow_only`` (the intent is only in the
        local journal): pools that would not grow are left as they are."""
        model = self.models[decision.model]
        if not decision.actuate:
            return [], "skipped", decision.reason
        held = sorted(p for p, n in decision.placement.items() if n <= decision.previous_placement.get(p, 0)) \
            if grow_only else []
        if held:
            decision = replace(decision, placement={p: n for p, n in decision.placement.items() if p not in held})
            if not decision.placement:
                return [], "skipped", f"{HELD}: {', '.join(held)}"
        # make before break: pools that grow first, then pools that shrink
        order = sorted(
            decision.placement,
            key=lambda p: (decision.placement[p] <= decision.previous_placement.get(p, 0), p),
        )
        actions: list[Action] = []
        failed: list[str] = []
        for pool_name in order:
            want = decision.placement[pool_name]
            provider = self.pool_providers.get(pool_name)
            if provider is None:
                continue
            if self.dry_run:
                # the one place dry-run is implemented: no provider is called at all (providers
                # have no dry-run of their own), so no provider can act in dry-run by mistake
                actions.append(Action(provider="dry-run", call="scale", pool=pool_name, model=model.name,
                                      arguments={"replicas": want, "nodes": nodes.get(pool_name, 0),
                                                 "previous_replicas": decision.previous_placement.get(pool_name)},
                                      status=ActionStatus.DRY_RUN))
                continue
            try:
                actions.extend(provider.scale(model, want, nodes.get(pool_name, 0), now))
            except ProviderError as e:
                # A scale that failed part-way may already have changed something (nodes ordered,
                # then the replica patch failed): the calls it made ride on the error (see
                # providers.base.actions_of) and go to the log before the failure row.
                actions.extend(getattr(e, "actions", ()))
                status = ActionStatus.FAILED_TRANSIENT if e.retryable else ActionStatus.FAILED_PERMANENT
                actions.append(Action(provider=type(provider).__name__, call="scale", pool=pool_name,
                                      model=model.name, arguments={"replicas": want}, status=status,
                                      error=f"{type(e).__name__}: {e}"))
                self.listener.component(f"pool/{pool_name}", f"scale failed: {type(e).__name__}: {e}", now)
                failed.append(pool_name)
        if actions:
            self.listener.actions(actions)
        for a in actions:
            if a.status in (ActionStatus.FAILED_TRANSIENT, ActionStatus.FAILED_PERMANENT) and a.pool not in failed:
                failed.append(a.pool)
        if self.dry_run:
            return actions, "dry-run", None
        if failed:
            outcome = "failed" if len(failed) == len(order) else "partial"
            return actions, outcome, f"failed pools: {', '.join(sorted(set(failed)))}"
        if held:
            return actions, "partial", f"{HELD}: {', '.join(held)}"
        return actions, "applied", None

    # ------------------------------------------------------------------ tick
    def tick(self, now: datetime | None = None, *, paused: bool = False, models: Collection[str] | None = None,
             others: Mapping[str, Mapping[str, int]] | None = None) -> TickReport:
        """One pass over all models (or only ``models``: a sharded replica's) at ``now`` (default:
        the clock's). ``paused``: decide (and record) but act on nothing, as the core's pause stage
        says. ``others``: the latest placements of models another replica acts on (their nodes
        count in the pools' node sums)."""
        now = self.clock.now() if now is None else now
        with ExitStack() as shared:  # providers' reads shared for this tick, and for no other
            for provider in self.pool_providers.values():
                # SharesReads, checked by attribute (as degraded_models does): typing's isinstance
                # would cost ~7 us a pool a tick, seconds over the simulator's week of ticks
                share = getattr(provider, "sharing_reads", None)
                if share is not None:
                    shared.enter_context(share())
            return self._tick(now, paused, models, others)

    def _tick(self, now: datetime, paused: bool, models: Collection[str] | None,
              others: Mapping[str, Mapping[str, int]] | None) -> TickReport:
        report = TickReport(at=now)
        signals = self.observe(now, models)
        try:
            self._ensure_history(signals, now)
            overrides = self._overrides(now)
        except Exception as e:  # noqa: BLE001 - no history, no decision: nothing is acted on
            logger.exception("history could not be read; nothing decided")
            report.errors.update({name: f"history: {type(e).__name__}: {e}" for name in signals})
            return report
        policies = self.policies()
        decisions: dict[str, Decision] = {}
        for name in signals:
            model = self.models[name]
            decision = self._decide(name, model, signals[name], policies, overrides, now, paused, report)
            if decision is not None:
                decisions[name] = decision
        if not decisions:
            return report
        shadows = {n for n in self.models if self.is_shadow(policies.get(n))}  # never carried out
        try:
            recorded = self.recorder.intents([(d, signals[n]) for n, d in decisions.items()], self.dry_run, shadows)
        except Exception as e:  # noqa: BLE001 - an intent stored nowhere is never acted on
            logger.exception("decisions could not be recorded; nothing acted on")
            report.errors.update({name: f"record: {type(e).__name__}: {e}" for name in decisions})
            return report
        ids = dict(zip(decisions, recorded.ids))
        report.journaled = recorded.journaled
        report.behind_replay = recorded.behind_replay
        placements = self._placements(decisions, grow_only=recorded.journaled)
        for n, p in (others or {}).items():  # models other replicas act on share the node groups
            placements.setdefault(n, p)
        nodes = self.pool_nodes({n: p for n, p in placements.items() if n not in shadows})
        outcomes = [Outcome(ids[name], [], "skipped", SHADOW_DETAIL) if name in shadows
                    else self._act(decision, ids[name], nodes, now, report, grow_only=recorded.journaled)
                    for name, decision in decisions.items()]
        try:
            self.recorder.outcomes(outcomes)
        except Exception as e:  # noqa: BLE001 - the intents are pending: reconciled at the next tick
            logger.exception("outcomes could not be recorded; the next tick reconciles the intents")
            report.errors.update({name: f"record: {type(e).__name__}: {e}" for name in decisions})
            self.forget_history(decisions)
            self._unwritten.update(decisions)
        for (name, decision), outcome in zip(decisions.items(), outcomes):
            self._remember(decision, signals[name], ids[name], outcome, report)
        return report

    def overrides_in_force(self, now: datetime) -> list[Override]:
        """The overrides the last tick read, less those expired by ``now``: what stays in force
        while the recorder cannot answer."""
        return [o for o in self._last_overrides if o.expires_at is None or o.expires_at > now]

    def _overrides(self, now: datetime) -> dict[str, list[Override]]:
        """Every model's overrides, read once per tick; while the recorder cannot answer, the last
        ones read stay in force (a pin must not lapse because the database is away)."""
        try:
            found = self.recorder.overrides(now)
        except Exception as e:  # noqa: BLE001
            log(logger, logging.WARNING, "overrides unreadable; the last ones read stay in force", error=str(e))
            found = self.overrides_in_force(now)
        self._last_overrides = list(found)
        out: dict[str, list[Override]] = {}
        for o in found:
            out.setdefault(o.model, []).append(o)
        return out

    def _placements(self, decisions: Mapping[str, Decision], *, grow_only: bool) -> dict[str, Mapping[str, int]]:
        """Each model's newest placement, for the node sums; ``grow_only``: no pool below what it
        had (nothing is released)."""
        placements: dict[str, Mapping[str, int]] = {}
        for n, d in decisions.items():
            placements[n] = {p: max(r, d.previous_placement.get(p, 0)) for p, r in d.placement.items()} \
                if grow_only else d.placement
        for n, d in self.last_decisions.items():
            placements.setdefault(n, d.placement)
        return placements

    def _act(self, decision: Decision, decision_id: int, nodes: Mapping[str, int], now: datetime,
             report: TickReport, *, grow_only: bool) -> Outcome:
        try:
            actions, outcome, detail = self.act(decision, nodes, now, grow_only=grow_only)
        except Exception as e:  # noqa: BLE001 - the next model still gets its tick
            logger.exception("act failed", extra={"fields": {"model": decision.model}})
            return Outcome(decision_id, [], "failed", f"{type(e).__name__}: {e}")
        report.transient_failures += sum(a.status is ActionStatus.FAILED_TRANSIENT for a in actions)
        return Outcome(decision_id, actions, outcome, detail)

    def _remember(self, decision: Decision, sig: ModelSignals, decision_id: int, outcome: Outcome,
                  report: TickReport) -> None:
        name = decision.model
        with self.state_lock:
            self.histories[name] = decision.history
            self.last_decisions[name] = decision
            self.last_decision_ids[name] = decision_id
            self.last_signals[name] = sig
        report.decisions[name] = decision
        report.decision_ids[name] = decision_id
        held = (outcome.detail or "").startswith(HELD)  # the journal's rule, not a failure
        if outcome.outcome in ("failed", "partial") and not held and name not in report.errors:
            report.errors[name] = outcome.detail or outcome.outcome
        self.listener.decided(decision, sig, outcome.outcome)


def reconcile_intent(intent: PendingIntent, observed: ModelSignals | None, when: str = "at start") -> Outcome:
    """What became of a pending intent, judged by the pools' replicas now: every changed pool at
    its target (``applied``), none moved (``failed``, not applied), or anything between or unknown
    (``partial``, counted as applied where unknown: the conservative reading for rate limits).
    ``when``: the occasion, in the detail (``reconciled at start: applied``)."""
    if intent.dry_run:
        return Outcome(intent.decision_id, [], "dry-run", f"reconciled {when}")
    pools = observed.pools if observed is not None else {}
    changed = [p for p, n in intent.placement.items() if n != intent.previous_placement.get(p, 0)]
    applied, untouched, unknown, total = [], [], [], 0
    for p, want in intent.placement.items():
        seen = pools[p].replicas if p in pools else None
        total += want if seen is None else seen
        if p not in changed:
            continue
        if seen is None:
            unknown.append(p)
        elif seen == want:
            applied.append(p)
        elif seen == intent.previous_placement.get(p, 0):
            untouched.append(p)
    if len(applied) == len(changed):
        return Outcome(intent.decision_id, [], "applied", f"reconciled {when}: applied", total)
    if len(untouched) == len(changed):
        return Outcome(intent.decision_id, [], "failed", f"reconciled {when}: not applied", total)
    detail = f"reconciled {when}: partly applied (applied: {','.join(applied) or '-'}; unknown: " \
             f"{','.join(unknown) or '-'}; not applied: {','.join(untouched) or '-'})"
    return Outcome(intent.decision_id, [], "partial", detail, total)
