"""``python -m tests.integration.daemon_process CONFIG LOAD``: a real daemon process, as ``tidegate
run`` builds and schedules it (wall clock, APScheduler), whose metrics source reads the queue depth
from the file ``LOAD`` (the test writes it; an empty or missing file: no data). For tests that kill
the process (``kill -9``) and start another on the same database."""

from __future__ import annotations

import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import Mapping, Sequence

import yaml

from controller.config import DaemonConfig
from controller.core.model import ModelSignals, ModelSpec, Sample
from controller.runtime import build_runtime


class FileLoad:
    """A ``MetricsSource``: the queue depth written in a file, fresh at every observation."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def observe(self, models: Sequence[ModelSpec], now: datetime) -> Mapping[str, ModelSignals]:
        try:
            q = Sample(float(self.path.read_text()), now)
        except (OSError, ValueError):
            q = Sample.missing("NoData: no load written yet")
        return {m.name: ModelSignals(model=m.name, at=now, queue_depth=q) for m in models}


def main(config: str, load: str) -> None:
    cfg = DaemonConfig.model_validate(yaml.safe_load(Path(config).read_text()))
    rt = build_runtime(cfg, environ={})
    rt.daemon.metrics_source = FileLoad(Path(load))
    rt.daemon.start()
    print("daemon started", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(*sys.argv[1:3])
