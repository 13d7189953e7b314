"""``tidegate simulate``: replay real traffic and spot traces through the same decision core.

Operators ask "what would this policy have cost, and would it have kept the SLO?" before tidegate
touches a cluster. This package answers on a simulated clock: a workload (``workload``) is served by
a fleet of continuous-batching replicas (``service``) on pools whose nodes take time to provision,
start cold and, on spot, get interrupted (``spot``); every decision interval a controller sets the
replicas per pool. The controller is either tidegate itself, running
``controller.core.pipeline.decide`` exactly as the daemon does, or one of the baselines people use
today (``baselines``). ``engine`` runs the event loop, ``report`` and ``plot`` turn a run into JSON,
a table and a timeline, and ``cli.simulate_main`` is the command.
"""
