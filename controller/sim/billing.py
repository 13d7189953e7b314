"""Billing of the simulated fleet through the pricing module (``controller.core.pricing``): cloud
nodes from order to release (provisioning included), on-prem nodes while they hold a pod
(``onprem_cost="used"``) or always (``"always"``), spot at its live price where the run has one."""

from __future__ import annotations

from controller.core.pricing import S_PER_HOUR, pool_price
from controller.sim.nodes import N_GONE, _Pool
from controller.sim.state import SimState


class Billing(SimState):
    """What the fleet costs: per pool, integrated between changes of its billed nodes."""

    def _billable(self, pool: _Pool) -> int:
        if pool.onprem:
            if self.opt.onprem_cost == "always":
                return pool.spec.max_nodes
            return sum(1 for n in pool.nodes if n.state != N_GONE and n.pods)
        return sum(1 for n in pool.nodes if n.state != N_GONE)


    def _bill(self, pool: _Pool) -> None:
        t = min(self.now, self.end_s)
        if t > pool.bill_t:
            dt = t - pool.bill_t
            pool.node_s += pool.bill_n * dt
            pool.cost_usd += pool.bill_n * dt * self._node_price(pool, pool.bill_t) / S_PER_HOUR
            pool.bill_t = t
        pool.bill_n = self._billable(pool)


    def cost_per_hour(self) -> float:
        return sum(p.bill_n * self._node_price(p, self.now) for p in self.pools.values())


    def _node_price(self, pool: _Pool, t: float) -> float:
        live = self._live_price(pool.name, t)
        return pool_price(pool.spec, None) if live is None else live


    def _live_price(self, pool: str, t: float) -> float | None:
        walk = self.setup.spot_prices.get(pool)
        return walk.price_usd(t) if walk is not None else None

