"""The retention job: decisions older than ``RetentionConfig.full_days`` become hourly rollups.

Scheduled on the daemon's scheduler (``Daemon.add_job``), apart from the tick: each batch is one
short transaction (``Repository.compact_decisions``), so a tick waits at most one batch for the
log's write lock. The cutoff is rounded down to the hour, so an hour is compacted whole.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Callable

from controller.config import RetentionConfig
from controller.db.repo import Repository
from controller.db.rollup import hour_of
from controller.logs import log
from controller.protocols import Clock

logger = logging.getLogger("tidegate.retention")

__all__ = ["prune", "retention_job"]


def prune(repo: Repository, clock: Clock, cfg: RetentionConfig) -> int:
    """Compact every full decision older than the retention period (at most ``max_batches``
    batches); returns how many were compacted."""
    cutoff = hour_of(clock.now() - timedelta(days=cfg.full_days))
    total = 0
    for _ in range(cfg.max_batches):
        n = repo.compact_decisions(cutoff, cfg.batch)
        total += n
        if n < cfg.batch:
            break
    if total:
        log(logger, logging.INFO, "old decisions compacted into hourly rollups", decisions=total,
            before=cutoff.isoformat())
    return total


def retention_job(repo: Repository, clock: Clock, cfg: RetentionConfig) -> Callable[[], None]:
    """A zero-argument callable for ``Daemon.add_job``; failures are logged, never raised (the
    next run tries again)."""

    def run() -> None:
        try:
            prune(repo, clock, cfg)
        except Exception as e:  # noqa: BLE001 - the database may be away; the next run retries
            log(logger, logging.WARNING, "retention job failed; next run retries", error=f"{type(e).__name__}: {e}")

    return run
