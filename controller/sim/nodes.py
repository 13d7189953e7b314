"""The simulated fleet's parts: nodes, pods and pools, as plain mutable records (the state
machines that move them are ``controller.sim.fleet``'s)."""

from __future__ import annotations

import math

from controller.core.model import ModelSpec, PoolSpec
from controller.sim.service import Replica
from controller.sim.spot import SpotModel

INF = math.inf

# pod states
P_PENDING, P_STARTING, P_READY, P_DRAINING, P_GONE = range(5)
# node states
N_PROV, N_READY, N_GONE = range(3)


class _Node:
    __slots__ = ("id", "pool", "state", "launched_s", "ready_s", "noticed", "gpus_used", "pods", "empty_since")

    def __init__(self, nid: int, pool: "_Pool", launched_s: float, ready_s: float, state: int) -> None:
        self.id = nid
        self.pool = pool
        self.state = state
        self.launched_s = launched_s
        self.ready_s = ready_s
        self.noticed = False
        self.gpus_used = 0
        self.pods: list[_Pod] = []
        self.empty_since = launched_s


class _Pod:
    __slots__ = ("id", "pool", "node", "state", "created_s", "ready_s", "replica", "gpu")

    def __init__(self, pid: int, pool: "_Pool", created_s: float) -> None:
        self.id = pid
        self.pool = pool
        self.node: _Node | None = None
        self.state = P_PENDING
        self.created_s = created_s
        self.ready_s = INF
        self.replica: Replica | None = None
        self.gpu = pool.spec.gpu_type


class _Pool:
    __slots__ = ("spec", "name", "onprem", "spot_pool", "tp", "per_node", "nodes", "pods", "desired", "spot",
                 "blocked", "blocked_reason", "blocked_until", "backoff_until", "notices", "bill_n", "bill_t", "cost_usd",
                 "node_s", "launch_failures", "interrupted_nodes", "killed_pods", "want_nodes", "unmade")

    def __init__(self, spec: PoolSpec, model: ModelSpec, spot: SpotModel | None) -> None:
        self.spec = spec
        self.name = spec.name
        self.onprem = spec.tier.is_onprem
        self.spot_pool = spec.tier.is_spot
        self.tp = model.tp_degree
        self.per_node = spec.replicas_per_node(model)
        self.nodes: list[_Node] = []
        self.pods: list[_Pod] = []
        self.desired = 0
        self.want_nodes = 0
        """Nodes the controller asked this pool to hold (``node_mode="direct"``)."""
        self.spot = spot
        self.blocked = False
        self.blocked_reason = ""
        self.blocked_until = -INF
        """A launch that found no capacity marks the pool unavailable until then (at least; after
        it, until the capacity is back), as the cloud providers' marks do."""
        self.backoff_until = -INF
        self.notices: list[float] = []
        """When each interruption notice came, oldest first, within the window (a list: most pools never
        get one, and an empty deque is 760 bytes)."""
        self.bill_n = 0
        self.bill_t = 0.0
        self.cost_usd = 0.0
        self.node_s = 0.0
        self.launch_failures = 0
        self.interrupted_nodes = 0
        self.killed_pods = 0
        self.unmade = 0
        """On-prem nodes the pool owns that no pod has needed yet: made (ready, in order) when
        binding needs one (``Fleet._bind``), so a model's world holds the nodes it uses rather than
        every node of a pool that a thousand models share."""

    def may_reopen(self, now: float) -> bool:
        """A blocked spot pool is offered again once its window has passed and the capacity holds
        more nodes than it has live (not gone, not noticed)."""
        if not self.blocked or self.spot is None or now < self.blocked_until:
            return False
        cap = self.spot.capacity_nodes(now)
        return cap is None or cap > sum(1 for n in self.nodes if n.state != N_GONE and not n.noticed)

    def alive_nodes(self) -> list[_Node]:
        return [n for n in self.nodes if n.state != N_GONE]

    def node_count(self) -> int:
        """Nodes the pool has (not gone), the on-prem ones not made yet included."""
        return sum(1 for n in self.nodes if n.state != N_GONE) + self.unmade
