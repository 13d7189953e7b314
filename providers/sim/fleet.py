"""One simulated pool: its node group, the pods of each model's Deployment, and spot interruptions.

This is the part of the simulated world that Kubernetes and the cloud would be: a node group with a
desired size (nodes take ``provisioning_delay_s`` to become schedulable), one Deployment per model
whose pods are bound first-fit to ready nodes with free GPUs (TP GPUs per pod, never across nodes)
and become ready ``cold_start_s`` after binding, and, for spot pools, interruptions: a Poisson
process per node-hour, announced ``notice_s`` before the node vanishes.

It is a plain state machine on float seconds since the world's epoch (``t``); the world drives it
forward event by event (``next_event_after`` / ``process``) and integrates the queues in between.
The rules mirror the real systems closely enough that the decision core meets the same situations:

- Deployments keep their desired count: a pod whose node vanishes is recreated Pending (modelled
  as the same pod unbinding) and waits for room; replicas beyond what the nodes hold stay Pending.
- A node group keeps its desired size: an interrupted node is replaced (a new order, with the
  provisioning delay) unless a capacity shortage is in force, in which case orders wait for its end.
- Nodes under an interruption notice are cordoned (no new pods) but their pods keep serving until
  the node vanishes; they are the first removed on scale-in, as are their pods (what a termination
  handler setting pod-deletion-cost achieves).
- Scale-in of a Deployment removes Pending pods first, then pods on noticed nodes, then pods still
  starting (newest first), then ready pods on the emptiest nodes, so that nodes empty out and a
  following node-group scale-in releases idle nodes rather than busy ones.
- Node-group scale-in releases noticed nodes first, then nodes still provisioning, then the nodes
  with the fewest GPUs in use (newest first); pods on released nodes go Pending and are rescheduled
  at once where there is room (with a fresh cold start).
- On-prem pools have no node group: their ``max_nodes`` nodes exist and are ready from the start.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from controller.core.model import ModelSpec, PoolSpec
from providers.registry import installed

INF = math.inf



@dataclass(slots=True, eq=False)
class Node:
    serial: int
    created_s: float
    ready_s: float
    """Schedulable from this time (creation plus the provisioning delay)."""
    notice_s: float = INF
    """Interruption notice time (spot only; ``INF``: never)."""
    gone_s: float = INF
    """Time the node vanishes (notice plus the notice period)."""
    used_gpus: int = 0
    pods: list["Pod"] = field(default_factory=list)
    notice_recorded: bool = False

    def ready(self, t: float) -> bool:
        return t >= self.ready_s

    def noticed(self, t: float) -> bool:
        return t >= self.notice_s


@dataclass(slots=True, eq=False)
class Pod:
    serial: int
    model: str
    gpus: int
    created_s: float
    node: Node | None = None
    ready_s: float = INF
    """Ready (serving) from this time: binding plus the model's cold start; ``INF`` while Pending."""

    def ready(self, t: float) -> bool:
        return self.node is not None and t >= self.ready_s


@dataclass(frozen=True, slots=True)
class Shortage:
    """A stretch of time during which the cloud has no capacity for this pool's instance type."""

    start_s: float
    end_s: float


class PoolFleet:
    """Nodes and pods of one pool. All times are float seconds since the world's epoch."""

    def __init__(
        self,
        spec: PoolSpec,
        models: dict[str, ModelSpec],
        *,
        seed: int,
        interruptions_per_node_hour: float,
        t0: float = 0.0,
    ) -> None:
        self.spec = spec
        self.models = models
        """Models that have a Deployment in this pool, by name."""
        self._seed = seed
        self.notice_s = installed().notice_s(spec.provider) or 0.0
        self._interrupt_rate_per_s = interruptions_per_node_hour / 3600.0 if spec.tier.is_spot else 0.0
        self._next_node_serial = 0
        self._next_pod_serial = 0
        self.nodes: list[Node] = []
        self.pods: dict[str, list[Pod]] = {m: [] for m in models}
        self.notices: list[float] = []
        """Times of every interruption notice received by this pool (for recent counts)."""
        self.shortages: list[Shortage] = []
        self.has_node_group = not spec.tier.is_onprem
        self.desired_nodes = spec.min_nodes if self.has_node_group else spec.max_nodes
        # The world as found: the starting nodes are up already.
        for _ in range(self.desired_nodes):
            self._add_node(created_s=t0, ready_s=t0)

    # -- queries ----------------------------------------------------------------------------------

    def desired_replicas(self, model: str) -> int:
        return len(self.pods[model])

    def ready_pods(self, model: str, t: float) -> int:
        return sum(1 for p in self.pods[model] if p.ready(t))

    def interrupted_pods(self, model: str, t: float) -> int:
        """Pods (ready or starting) on nodes that have received an interruption notice."""
        return sum(1 for p in self.pods[model] if p.node is not None and p.node.noticed(t))

    def recent_notices(self, t: float, window_s: float) -> int:
        return sum(1 for n in self.notices if t - window_s < n <= t)

    def in_shortage(self, t: float) -> bool:
        return any(s.start_s <= t < s.end_s for s in self.shortages)

    # -- actuation --------------------------------------------------------------------------------

    def set_desired_nodes(self, nodes: int, t: float) -> None:
        """Resize the node group (declarative). The caller validated 0 <= nodes <= max_nodes."""
        self.desired_nodes = nodes
        excess = len(self.nodes) - nodes
        if excess > 0:
            ranked = sorted(self.nodes, key=lambda n: (
                0 if n.noticed(t) else 1, 1 if n.ready(t) else 0, n.used_gpus, -n.serial))
            for node in ranked[:excess]:
                self._remove_node(node)
        self.process(t)

    def set_desired_replicas(self, model: str, replicas: int, t: float) -> None:
        """Scale one model's Deployment (declarative). The caller validated replicas >= 0."""
        pods = self.pods[model]
        spec = self.models[model]
        while len(pods) < replicas:
            pods.append(Pod(self._next_pod_serial, model, spec.tp_degree, t))
            self._next_pod_serial += 1
        excess = len(pods) - replicas
        if excess > 0:
            def rank(p: Pod) -> tuple[int, int, int]:
                if p.node is None:
                    return (0, 0, -p.serial)
                if p.node.noticed(t):
                    return (1, 0, -p.serial)
                if not p.ready(t):
                    return (2, 0, -p.serial)
                return (3, p.node.used_gpus, -p.serial)

            for pod in sorted(pods, key=rank)[:excess]:
                self._unbind(pod)
                pods.remove(pod)
        self.process(t)

    def mark_ready(self, t: float) -> None:
        """Treat every bound pod as already warm at ``t`` (the world as found at start-up)."""
        for pods in self.pods.values():
            for p in pods:
                if p.node is not None:
                    p.ready_s = min(p.ready_s, t)

    def add_shortage(self, start_s: float, end_s: float) -> None:
        if end_s > start_s:
            self.shortages.append(Shortage(start_s, end_s))

    # -- time -------------------------------------------------------------------------------------

    def next_event_after(self, t: float) -> float:
        """The earliest time after ``t`` at which something in this pool changes by itself."""
        nxt = INF
        for n in self.nodes:
            for x in (n.ready_s, n.notice_s, n.gone_s):
                if t < x < nxt:
                    nxt = x
        for pods in self.pods.values():
            for p in pods:
                if t < p.ready_s < nxt:
                    nxt = p.ready_s
        for s in self.shortages:
            for x in (s.start_s, s.end_s):
                if t < x < nxt:
                    nxt = x
        return nxt

    def process(self, t: float) -> None:
        """Apply everything due at or before ``t``: notices, node losses, replacement orders and
        scheduling of Pending pods. Idempotent for a given ``t``."""
        for node in list(self.nodes):
            if node.noticed(t) and not node.notice_recorded:
                node.notice_recorded = True
                self.notices.append(node.notice_s)
            if t >= node.gone_s:
                self._remove_node(node)
        if len(self.nodes) < self.desired_nodes and not self.in_shortage(t):
            # The node group replaces what it lost and fulfils new orders; during a shortage the
            # orders wait (the cloud answers InsufficientInstanceCapacity).
            for _ in range(self.desired_nodes - len(self.nodes)):
                self._add_node(created_s=t, ready_s=t + self.spec.provisioning_delay_s)
        self._schedule(t)

    # -- internals --------------------------------------------------------------------------------

    def _add_node(self, created_s: float, ready_s: float) -> None:
        node = Node(self._next_node_serial, created_s, ready_s)
        if self._interrupt_rate_per_s > 0:
            # Memoryless lifetime drawn once per node from a generator keyed by the node's identity:
            # the same node gets the same fate whatever else happened in the run.
            rng = random.Random(f"tidegate-interrupt/{self._seed}/{self.spec.name}/{node.serial}")
            node.notice_s = ready_s + rng.expovariate(self._interrupt_rate_per_s)
            node.gone_s = node.notice_s + self.notice_s
        self._next_node_serial += 1
        self.nodes.append(node)

    def _remove_node(self, node: Node) -> None:
        for pod in list(node.pods):
            self._unbind(pod)
        self.nodes.remove(node)

    @staticmethod
    def _unbind(pod: Pod) -> None:
        node = pod.node
        if node is not None:
            node.pods.remove(pod)
            node.used_gpus -= pod.gpus
        pod.node = None
        pod.ready_s = INF

    def _schedule(self, t: float) -> None:
        """Bind Pending pods, oldest first, to the first ready, uncordoned node with room."""
        pending = [p for pods in self.pods.values() for p in pods if p.node is None]
        if not pending:
            return
        pending.sort(key=lambda p: (p.created_s, p.serial))
        free = [n for n in self.nodes if n.ready(t) and not n.noticed(t)]
        for pod in pending:
            for node in free:
                if self.spec.gpus_per_node - node.used_gpus >= pod.gpus:
                    node.pods.append(pod)
                    node.used_gpus += pod.gpus
                    pod.node = node
                    pod.ready_s = t + self.models[pod.model].cold_start_s
                    break
