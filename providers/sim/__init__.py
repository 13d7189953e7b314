"""Simulated providers: a seeded, self-consistent world behind the provider protocols.

The demo, the tests and the daemon's offline mode run on these; the real Prometheus, Kubernetes,
AWS and GCP adapters implement the same protocols (``controller.protocols``). Build everything at
once with ``build_simulated_providers(config, clock)``.
"""

from providers.sim.load import LoadCurve, LoadShape
from providers.sim.prices import SpotPriceWalk
from providers.sim.world import (
    CALL_RESIZE_NODE_GROUP, CALL_SCALE_DEPLOYMENT, PROVIDER, ModelTotals, SimMetrics, SimPoolProvider,
    SimPrices, SimProviders, SimWorld, build_simulated_providers, mmc_p99_s, mmc_wait_s,
)

__all__ = [
    "CALL_RESIZE_NODE_GROUP", "CALL_SCALE_DEPLOYMENT", "PROVIDER", "LoadCurve", "LoadShape",
    "ModelTotals", "SimMetrics", "SimPoolProvider", "SimPrices", "SimProviders", "SimWorld",
    "SpotPriceWalk", "build_simulated_providers", "mmc_p99_s", "mmc_wait_s",
]
