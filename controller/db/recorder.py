"""The daemon's ``controller.controller.Recorder``: decisions, outcomes, history and overrides
through the decision log (``Repository``)."""

from __future__ import annotations

from datetime import datetime
from typing import Sequence

from controller.core.model import Action, Decision, History, ModelSignals, Override
from controller.db.repo import Repository


class RepositoryRecorder:
    """Each decision is one row (outcome ``pending``) and then its actions and outcome."""

    def __init__(self, repo: Repository) -> None:
        self.repo = repo

    def history(self, model: str, now: datetime, horizon_s: float) -> History:
        return self.repo.rebuild_history(model, now, horizon_s)

    def overrides(self, model: str, now: datetime) -> Sequence[Override]:
        return self.repo.active_overrides(now, model=model)

    def decision(self, decision: Decision, signals: ModelSignals, dry_run: bool) -> int:
        return self.repo.record_decision(decision, signals, dry_run)

    def outcome(self, decision_id: int, actions: Sequence[Action], outcome: str, detail: str | None) -> None:
        self.repo.record_actions(decision_id, actions, outcome, detail)
