"""``tidegate simulate``: replay real traffic and spot traces through the same decision core.

Operators ask "what would this policy have cost, and would it have kept the SLO?" before tidegate
touches a cluster. This package answers on a simulated clock: a workload (``workload``) is served by
a fleet of continuous-batching replicas (``service``) on pools whose nodes take time to provision,
start cold and, on spot, get interrupted (``spot``); every decision interval a controller sets the
replicas per pool. The controller is either tidegate itself, running
``controller.core.pipeline.decide`` exactly as the daemon does, or one of the baselines people use
today (``baselines``). ``engine`` runs the event loop (its concerns layered in ``state``,
``billing``, ``fleet``, ``serving``, ``scrape`` and ``results``), ``report`` and ``plot`` turn a run
into JSON, a table and a timeline, and ``cli.simulate_main`` is the command.

The same world serves the daemon: ``world`` builds it from a simulated config for a clock outside
it (the demo's, the tests'), and ``providers.sim`` puts the provider protocols over it.
"""

from __future__ import annotations

import importlib

EXTRA_MODULES = ("numpy", "matplotlib", "tqdm")
"""What the simulator imports beyond the daemon's install: the ``sim`` extra of ``pyproject.toml``
(``pip install 'tidegate[sim]'``). This package's ``__init__`` imports none of them, so the command
line can ask :func:`missing_extras` before importing the simulator itself."""


def missing_extras() -> list[str]:
    """The modules of :data:`EXTRA_MODULES` that cannot be imported here, in that order."""
    missing = []
    for name in EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing
