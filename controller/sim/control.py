"""How controllers meet the simulated world: the autoscaler slot (``Autoscaler``: tidegate, a
``Baseline``, or ``DrivenFromOutside`` when the daemon's own clock drives the world), what a
baseline sees (``Observation``) and the simulator's recorder (``MemoryRecorder``). The providers
over a ``Simulation`` and ``Baseline`` are ``controller.sim.engine``'s."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Collection, Literal, Mapping, Protocol, Sequence

from controller.controller import Controller, Outcome, PendingIntent, RecordedIntents
from controller.core.model import Decision, History, ModelSignals, Override
from controller.sim.setup import SimSetup


@dataclass(frozen=True)
class Observation:
    """What a controller sees at a tick."""

    now_s: float
    at: datetime
    signals: ModelSignals
    """The last scrape's samples and the live pool states (as ``decide`` takes them)."""
    requests_in_window: int
    """Requests that arrived in the last ``rate_window_s`` (a load balancer's own count)."""
    pending_by_pool: Mapping[str, int]
    ready_by_pool: Mapping[str, int]
    desired_by_pool: Mapping[str, int]
    pending_requests: float | None = None
    """The last scrape's requests waiting or in flight (gateway queue plus every replica's batch):
    the queue metric users give KEDA for Triton."""


class Autoscaler(Protocol):
    """A scaling algorithm under test: tidegate's pipeline or a baseline. It runs as a
    ``controller.controller.Controller`` over the simulation's providers (``controller()``), the
    same tick the daemon runs."""

    name: str
    interval_s: float
    node_mode: Literal["direct", "autoscaler"]

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        """Replicas per pool at time 0 (ready from the start: the fleet was already running).
        ``need`` is what the first minutes of load require at the SLO."""
        ...

    def controller(self, sim: Any) -> Controller | None:
        """The tick, over ``sim``'s (the ``controller.sim.engine.Simulation``'s) clock, metrics, pool
        providers and recorder (after ``initial``);
        ``None``: a driver outside ticks (``DrivenFromOutside``)."""
        ...


class DrivenFromOutside:
    """The autoscaler slot of a world a driver outside moves (``Simulation.advance_to``): the
    daemon over ``controller.sim.world``'s providers. It manages nodes directly (the ``nodes`` of
    each ``scale``), starts from ``initial`` and marks a tick every ``interval_s``."""

    name = "external"
    node_mode: Literal["direct", "autoscaler"] = "direct"

    def __init__(self, interval_s: float, initial: Mapping[str, int]) -> None:
        self.interval_s = interval_s
        self._initial = dict(initial)

    def initial(self, setup: SimSetup, need: int) -> dict[str, int]:
        return dict(self._initial)

    def controller(self, sim: object) -> None:
        return None


class MemoryRecorder:
    """The simulator's ``Recorder``: no overrides, an empty history at start, and counts of what
    was decided (``reasons``) instead of a decision log."""

    def __init__(self) -> None:
        self.decisions = 0
        self.reasons: dict[str, int] = {}

    def histories(self, horizons: Mapping[str, float], now: datetime) -> Mapping[str, History]:
        return {}

    def overrides(self, now: datetime) -> Sequence[Override]:
        return ()

    def flush(self, now: datetime) -> bool:
        return True

    def pending(self, models: Sequence[str], since: datetime) -> Sequence[PendingIntent]:
        return ()

    def intents(self, items: Sequence[tuple[Decision, ModelSignals]], dry_run: bool,
                shadow: Collection[str] = frozenset()) -> RecordedIntents:
        for decision, _ in items:
            self.reasons[decision.reason] = self.reasons.get(decision.reason, 0) + 1
        first = self.decisions + 1
        self.decisions += len(items)
        return RecordedIntents(ids=range(first, self.decisions + 1))

    def outcomes(self, items: Sequence[Outcome]) -> None:
        return None
