"""A fleet of tidegate's own beside the one that runs: for shadow mode and counterfactual replay.

Both decide as if in charge while something else (an HPA, a person, the log's past) set the
replicas that actually ran. ``decide`` reads the current placement from the pools' states, so they
get the pools as tidegate's own fleet: its last placement as each pool's replicas, assumed ready
(provisioning is not modelled), with everything else as observed (availability, interruption
notices, live prices). A pool whose observed replicas already equal tidegate's keeps its observed
state whole, so a shadow or a replay that agrees with what ran decides exactly as it did.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from controller.core.model import ModelSignals, PoolState


def virtual_states(states: Mapping[str, PoolState], mine: Mapping[str, int] | None) -> dict[str, PoolState]:
    """``states`` with tidegate's placement ``mine`` as the replicas (``None``: as observed)."""
    if mine is None:
        return dict(states)
    out = {}
    for name, st in states.items():
        n = mine.get(name, 0)
        out[name] = st if st.replicas == n else replace(
            st, replicas=n, ready_replicas=n, scheduled_replicas=n, nodes=None,
            interrupted_replicas=min(st.interrupted_replicas, n))
    return out


def shadow_signals(signals: ModelSignals, mine: Mapping[str, int] | None) -> ModelSignals:
    """``signals`` with the pools as tidegate's own fleet (see the module docstring)."""
    return ModelSignals(signals.model, signals.at, samples=signals.samples,
                        pools=virtual_states(signals.pools, mine), degraded=signals.degraded)
