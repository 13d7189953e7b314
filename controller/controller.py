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
   A provider that fails yields an unknown pool (``replicas=None``), which the core holds on.
3. **Decide**: the decision function, once per model, with the recorder's overrides. One model's
   failure spares the others.
4. **Act**: nodes per pool are summed over every model's newest placement (models do not share
   nodes); each model's pools are scaled growing ones first (make before break). A failed call is
   logged with what it had already done (``partial``); in dry-run nothing is called.
5. **Record**: the decision (with its signals) and its actions and outcome go to the recorder.

The recorder has two writes per decision, ``decision`` (outcome ``pending``) and ``outcome``. Both
happen after the model's provider calls today (the order the daemon has always had); the split is
there so that the decision (the intent) can move before the calls, and a tick's writes can be
batched, without changing the recorder's shape.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Callable, Mapping, Protocol, Sequence

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
)
from controller.core.pipeline import decide as pipeline_decide
from controller.core.policy import EffectivePolicy
from controller.core.pricing import OnPremCost, with_cost
from controller.core.reasons import Reason
from controller.errors import ProviderError
from controller.logs import log
from controller.protocols import Clock, MeasuresPower, MetricsSource, PoolProvider, PriceSource, degraded_models

logger = logging.getLogger("tidegate.controller")

DEFAULT_HISTORY_HORIZON_S = 1800.0
"""How far back history is rebuilt for a model without a policy yet (30 min)."""

DecisionFunction = Callable[..., Decision]
"""Called with the keyword arguments of ``controller.core.pipeline.decide`` (``model``, ``pools``,
``signals``, ``policy``, ``history``, ``overrides``, ``now``, ``paused``); returns a ``Decision``."""


class Recorder(Protocol):
    """Where decisions go and history comes from: the decision log (``controller.db.recorder``) for
    the daemon, memory for the simulator."""

    def history(self, model: str, now: datetime, horizon_s: float) -> History:
        """The model's history as the last decision before ``now`` left it, ``horizon_s`` back."""
        ...

    def overrides(self, model: str, now: datetime) -> Sequence[Override]:
        """Operator overrides in force for ``model`` at ``now``."""
        ...

    def decision(self, decision: Decision, signals: ModelSignals, dry_run: bool) -> int:
        """Store one decision with its signals, outcome ``pending``; returns its id."""
        ...

    def outcome(self, decision_id: int, actions: Sequence[Action], outcome: str, detail: str | None) -> None:
        """Store the calls made for a decision and what came of them."""
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
    ) -> None:
        self.models = dict(models)
        self.pools = dict(pools)
        self.clock = clock
        self.metrics_source = metrics_source
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
        self.observed_once: set[str] = set()
        """Models that have had a decision past ``NotObservedYet`` (readiness waits for them)."""
        self._history_loaded = False

    # ------------------------------------------------------------------ history
    def forget_history(self) -> None:
        """Rebuild history from the recorder at the next tick (after another daemon was leader)."""
        self._history_loaded = False

    def _ensure_history(self, now: datetime) -> None:
        if self._history_loaded:
            return
        policies = self.policies()
        for name in self.models:
            self.histories[name] = self.recorder.history(name, now, history_horizon_s(policies.get(name)))
        self._history_loaded = True

    # ------------------------------------------------------------------ observe
    def observe(self, now: datetime) -> dict[str, ModelSignals]:
        """Every model's signals with its pools' states, live prices and cost filled in."""
        specs = list(self.models.values())
        try:
            raw = dict(self.metrics_source.observe(specs, now))
            self.listener.component("metrics", None, now)
        except ProviderError as e:  # a metrics source should not raise, but never trust it
            log(logger, logging.WARNING, "metrics source failed; all signals missing", error=str(e))
            self.listener.component("metrics", str(e), now)
            raw = {}
        prices = self._prices(now)
        degraded_all = degraded_models(self.metrics_source)
        out: dict[str, ModelSignals] = {}
        for name, model in self.models.items():
            sig = raw.get(name) or ModelSignals(model=name, at=now)
            states = {pool_name: self._pool_state(model, pool_name, prices, now) for pool_name in model.pools}
            sig = ModelSignals(sig.model, sig.at, samples=sig.samples, pools=states,
                               degraded=degraded_all.get(name) or sig.degraded)
            # Prometheus knows tokens and power, providers know replicas and prices: the pricing
            # module prices the pools (the budget stage uses these prices) and the cost per token.
            sig = self._with_cost(sig, model, now)
            out[name] = sig
        return out

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

    def _with_cost(self, sig: ModelSignals, model: ModelSpec, now: datetime) -> ModelSignals:
        source = self.metrics_source
        power = source.power_kw(model.name) if isinstance(source, MeasuresPower) else None
        return with_cost(sig, model, self.pools, now, onprem=self.onprem_cost, power_kw=power)

    # ------------------------------------------------------------------ decide
    def _decide(self, name: str, model: ModelSpec, signals: ModelSignals, policies: Mapping[str, EffectivePolicy],
                now: datetime, paused: bool, report: TickReport) -> Decision | None:
        policy = policies.get(name)
        if policy is None and self.policy_required:
            report.errors[name] = "no valid policy for this model"
            return None
        try:
            decision = self.decide(
                model=model, pools=self.pools, signals=signals, policy=policy,
                history=self.histories.get(name, History()), overrides=self.recorder.overrides(name, now),
                now=now, paused=paused,
            )
        except Exception as e:  # noqa: BLE001 - isolate models from each other
            logger.exception("decision failed", extra={"fields": {"model": name}})
            report.errors[name] = f"{type(e).__name__}: {e}"
            return None
        if decision.reason != Reason.NOT_OBSERVED_YET.value:
            self.observed_once.add(name)
        return decision

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

    def act(self, decision: Decision, nodes: Mapping[str, int], now: datetime) -> tuple[list[Action], str, str | None]:
        """Apply one decision: ``(actions, outcome, detail)``, outcome one of ``skipped``,
        ``dry-run``, ``applied``, ``partial``, ``failed``."""
        model = self.models[decision.model]
        if not decision.actuate:
            return [], "skipped", decision.reason
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
                actions.append(Action(provider="dry-run", call="scale", pool=pool_name, model=model.name,
                                      arguments={"replicas": want, "nodes": nodes.get(pool_name, 0)},
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
        return actions, "applied", None

    # ------------------------------------------------------------------ tick
    def tick(self, now: datetime | None = None, *, paused: bool = False) -> TickReport:
        """One pass over all models at ``now`` (default: the clock's). ``paused``: decide (and
        record) but act on nothing, as the core's pause stage says."""
        now = self.clock.now() if now is None else now
        report = TickReport(at=now)
        self._ensure_history(now)
        signals = self.observe(now)
        policies = self.policies()
        decisions: dict[str, Decision] = {}
        for name, model in self.models.items():
            decision = self._decide(name, model, signals[name], policies, now, paused, report)
            if decision is not None:
                decisions[name] = decision
        # nodes per pool from every model's newest placement
        placements: dict[str, Mapping[str, int]] = {n: d.placement for n, d in decisions.items()}
        for n, d in self.last_decisions.items():
            placements.setdefault(n, d.placement)
        nodes = self.pool_nodes(placements)
        for name, decision in decisions.items():
            self._act_and_record(decision, signals[name], nodes, now, report)
        return report

    def _act_and_record(self, decision: Decision, sig: ModelSignals, nodes: Mapping[str, int], now: datetime,
                        report: TickReport) -> None:
        name = decision.model
        try:
            actions, outcome, detail = self.act(decision, nodes, now)
            report.transient_failures += sum(a.status is ActionStatus.FAILED_TRANSIENT for a in actions)
            decision_id = self.recorder.decision(decision, sig, self.dry_run)
            self.recorder.outcome(decision_id, actions, outcome, detail)
        except Exception as e:  # noqa: BLE001 - the next model still gets its tick
            logger.exception("act/record failed", extra={"fields": {"model": name}})
            report.errors[name] = f"{type(e).__name__}: {e}"
            return
        with self.state_lock:
            self.histories[name] = decision.history
            self.last_decisions[name] = decision
            self.last_decision_ids[name] = decision_id
            self.last_signals[name] = sig
        report.decisions[name] = decision
        report.decision_ids[name] = decision_id
        if outcome in ("failed", "partial"):
            report.errors[name] = detail or outcome
        self.listener.decided(decision, sig, outcome)
