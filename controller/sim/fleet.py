"""The simulated fleet: nodes ordered, provisioned, released and interrupted; pods created,
bound first-fit (fullest node first), started after the cold start, drained and removed; the node
modes (``direct``: the controller's ``nodes``; ``autoscaler``: an emulated cluster-autoscaler); spot
notices, node losses and capacity windows. The rules are ``controller.sim.engine``'s docstring's."""

from __future__ import annotations

from controller.sim.billing import Billing
from controller.sim.nodes import INF, N_GONE, N_PROV, N_READY, P_DRAINING, P_GONE, P_PENDING, P_READY, P_STARTING, _Node, _Pod, _Pool
from controller.sim.service import Replica
from controller.sim.spot import SpotModel
from controller.sim.state import EV_CAP, EV_NODE_GONE, EV_NODE_READY, EV_NOTICE, EV_POD_READY


class Fleet(Billing):
    """Nodes and pods of every pool, moved by the events and by the controller's scaling."""

    # The request service's (``controller.sim.serving``, layered on the fleet): a pod's end hands
    # its requests back to the gateway, a new ready pod takes some.
    def _dispatch(self) -> None:
        raise NotImplementedError

    def _requeue(self, reqs: list[int]) -> None:
        raise NotImplementedError

    def _fluid_lost(self, pod: _Pod) -> None:
        raise NotImplementedError

    def _new_node(self, pool: _Pool, ready_s: float, state: int) -> _Node:
        self.version += 1
        self.node_ids += 1
        node = _Node(self.node_ids, pool, self.now, ready_s, state)
        pool.nodes.append(node)
        if state == N_PROV:
            self._push(ready_s, EV_NODE_READY, node)
        if pool.spot is not None and pool.spot_pool:
            life = pool.spot.draw_lifetime_s()
            if life < INF:
                self._push(self.now + life, EV_NOTICE, node)
        return node


    def _make_onprem_node(self, pool: _Pool) -> _Node:
        """One of the on-prem nodes the pool owns from the start (ready at time 0), made now."""
        pool.unmade -= 1
        self.version += 1
        self.node_ids += 1
        node = _Node(self.node_ids, pool, 0.0, 0.0, N_READY)
        pool.nodes.append(node)
        return node


    def _launch(self, pool: _Pool, count: int) -> int:
        """Order ``count`` nodes; returns how many the cloud accepted."""
        if count <= 0 or pool.onprem:
            return 0
        self.version += 1
        self._bill(pool)
        alive = [n for n in pool.nodes if n.state != N_GONE]
        room = pool.spec.max_nodes - len(alive)
        want = min(count, max(0, room))
        launched = 0
        if pool.spot is not None:
            cap = pool.spot.capacity_nodes(self.now)
            if cap is not None:
                live = sum(1 for n in alive if not n.noticed)
                allowed = max(0, cap - live)
                if allowed < want:
                    pool.launch_failures += want - allowed
                    pool.blocked = True
                    pool.blocked_reason = pool.spot.limit_reason(self.now)
                    pool.blocked_until = self.now + self.opt.capacity_unavailable_s
                    want = allowed
        for _ in range(want):
            self._new_node(pool, self.now + pool.spec.provisioning_delay_s, N_PROV)
            launched += 1
        if launched and pool.blocked and launched == count:
            pool.blocked = False
        self._bill(pool)
        return launched


    def _release_node(self, node: _Node) -> None:
        self.version += 1
        self._remove_node(node, recreate=False)

    def _remove_node(self, node: _Node, *, recreate: bool) -> None:
        """Bill the pool up to now, mark ``node`` gone with its pods (recreated elsewhere or not)
        and take it out of its pool."""
        pool = node.pool
        self._bill(pool)
        node.state = N_GONE
        for pod in list(node.pods):
            self._kill_pod(pod, recreate=recreate)
        pool.nodes.remove(node)
        self._bill(pool)


    def _bind(self, pool: _Pool) -> None:
        pending = [p for p in pool.pods if p.state == P_PENDING]
        if not pending:
            return
        tp = pool.tp
        cap = pool.spec.gpus_per_node
        nodes = [n for n in pool.nodes if n.state == N_READY and not n.noticed and cap - n.gpus_used >= tp]
        if not nodes and not (pool.unmade and cap >= tp):
            return
        changed = False
        cold = self.model.cold_start_s
        for pod in pending:
            best: _Node | None = None
            for n in nodes:
                if cap - n.gpus_used >= tp and (best is None or n.gpus_used > best.gpus_used):
                    best = n
            if best is None and pool.unmade and cap >= tp:
                # the next on-prem node in order: empty, so what the first-fit would pick if it were made
                best = self._make_onprem_node(pool)
                nodes.append(best)
            if best is None:
                break
            if not best.pods:
                changed = True
            self.version += 1
            best.gpus_used += tp
            best.pods.append(pod)
            pod.node = best
            pod.state = P_STARTING
            pod.ready_s = self.now + cold
            self._push(pod.ready_s, EV_POD_READY, pod)
        if changed and pool.onprem:
            self._bill(pool)


    def _pod_ready(self, pod: _Pod) -> None:
        self.version += 1
        if pod.state != P_STARTING:
            return
        pod.state = P_READY
        if self.mode == "requests":
            assert self.book is not None
            pod.replica = Replica(self.setup.profiles[pod.gpu], self.book, self.now)
        self.ready_pods.append(pod)
        if self.mode == "requests":
            self._dispatch()


    def _unbind(self, pod: _Pod) -> None:
        self.version += 1
        node = pod.node
        if node is None:
            return
        node.gpus_used -= pod.pool.tp
        node.pods.remove(pod)
        pod.node = None
        if not node.pods:
            node.empty_since = self.now
            if pod.pool.onprem:
                self._bill(pod.pool)


    def _kill_pod(self, pod: _Pod, recreate: bool) -> None:
        """The pod's node vanished (or was released): its requests go back to the gateway."""
        self.version += 1
        if pod.state == P_GONE:
            return
        was_serving = pod.state in (P_READY, P_DRAINING)
        if pod.state in (P_READY, P_DRAINING, P_STARTING):
            pod.pool.killed_pods += 1
        if was_serving:
            if pod in self.ready_pods:
                self.ready_pods.remove(pod)
            if pod.replica is not None:
                self._requeue(pod.replica.kill(self.now))
                pod.replica = None
            elif self.mode == "fluid":
                self._fluid_lost(pod)
        self._unbind(pod)
        if recreate and pod.state != P_DRAINING:
            pod.state = P_PENDING
            pod.ready_s = INF
        else:
            pod.state = P_GONE
            pod.pool.pods.remove(pod)


    def _remove_pod(self, pod: _Pod) -> None:
        """Scale-in of one pod: Pending/starting ones go at once, ready ones drain first."""
        self.version += 1
        if pod.state == P_READY:
            self.ready_pods.remove(pod)
            if self.mode == "requests" and pod.replica is not None and pod.replica.in_flight > 0:
                pod.state = P_DRAINING
                return
        pod.state = P_GONE
        self._unbind(pod)
        pod.pool.pods.remove(pod)


    def _pod_drained(self, pod: _Pod) -> None:
        self.version += 1
        pool = pod.pool
        pod.state = P_GONE
        pod.replica = None
        self._unbind(pod)
        pool.pods.remove(pod)
        if self.ctrl.node_mode == "direct":
            self._reconcile_nodes(pool)


    def _set_desired(self, pool: _Pool, n: int) -> None:
        self.version += 1
        n = max(0, int(n))
        active = [p for p in pool.pods if p.state in (P_PENDING, P_STARTING, P_READY)]
        pool.desired = n
        if n > len(active):
            for _ in range(n - len(active)):
                self.pod_ids += 1
                pool.pods.append(_Pod(self.pod_ids, pool, self.now))
        elif n < len(active):
            k = len(active) - n
            for _ in range(k):
                victim = min(active, key=self._removal_key)
                active.remove(victim)
                self._remove_pod(victim)


    @staticmethod
    def _removal_key(p: _Pod) -> tuple[float, float, float]:
        if p.state == P_PENDING:
            return (0, -p.created_s, 0)
        if p.node is not None and p.node.noticed:
            return (1, -p.created_s, 0)
        if p.state == P_STARTING:
            return (2, -p.created_s, 0)
        active_on_node = sum(1 for q in p.node.pods if q.state in (P_STARTING, P_READY)) if p.node else 0
        held = p.replica.in_flight if p.replica is not None else 0
        return (3, active_on_node, held - p.created_s * 1e-9)


    def _reconcile_nodes(self, pool: _Pool) -> None:
        """Direct node management: hold the nodes the controller asked for (``nodes`` of its last
        ``scale``: every model's placement in this pool, at least ``min_nodes``) live; release
        empty surplus."""
        if pool.onprem:
            return
        need = pool.want_nodes
        live = [n for n in pool.nodes if n.state != N_GONE and not n.noticed]
        if len(live) < need:
            self._launch(pool, need - len(live))
        elif len(live) > need:
            surplus = len(live) - need
            cands = sorted((n for n in live if not n.pods),
                           key=lambda n: (n.state != N_PROV, -n.launched_s))
            for n in cands[:surplus]:
                self._release_node(n)
        # noticed nodes with nothing on them are of no use: release them now
        for n in [n for n in pool.nodes if n.noticed and n.state != N_GONE and not n.pods]:
            self._release_node(n)


    def _ca_scan(self) -> None:
        """cluster-autoscaler: order nodes for Pending pods, remove nodes empty long enough."""
        for pool in self.pools.values():
            if pool.onprem:
                continue
            pending = sum(1 for p in pool.pods if p.state == P_PENDING)
            if pending and self.now >= pool.backoff_until:
                free = 0
                for n in pool.nodes:
                    if n.state == N_PROV or (n.state == N_READY and not n.noticed):
                        free += (pool.spec.gpus_per_node - n.gpus_used) // pool.tp
                missing = pending - free
                if missing > 0 and pool.per_node > 0:
                    want = -(-missing // pool.per_node)
                    got = self._launch(pool, want)
                    if got < want:
                        pool.backoff_until = self.now + self.opt.ca_backoff_s
            for n in [n for n in pool.nodes if n.state == N_READY and not n.pods]:
                if n.noticed or self.now - n.empty_since >= self.opt.ca_unneeded_s:
                    self._release_node(n)


    def _notice(self, node: _Node) -> None:
        self.version += 1
        if node.state == N_GONE or node.noticed:
            return
        pool = node.pool
        node.noticed = True
        pool.notices.append(self.now)
        pool.interrupted_nodes += 1
        assert pool.spot is not None
        if node.state == N_PROV:
            # not booted yet: the launch simply fails
            self._release_node(node)
        else:
            self._push(self.now + pool.spot.notice_s, EV_NODE_GONE, node)
        if self.ctrl.node_mode == "direct":
            self._reconcile_nodes(pool)


    def _node_gone(self, node: _Node) -> None:
        self.version += 1
        if node.state == N_GONE:
            return
        pool = node.pool
        self._remove_node(node, recreate=True)
        self._bind(pool)
        if self.ctrl.node_mode == "direct":
            self._reconcile_nodes(pool)


    def _capacity_change(self, pool: _Pool) -> None:
        self.version += 1
        spot = pool.spot
        assert spot is not None
        cap = spot.capacity_nodes(self.now)
        if cap is not None and spot.trace_preempts:
            live = [n for n in pool.nodes if n.state != N_GONE and not n.noticed]
            excess = len(live) - cap
            if excess > 0:
                ties = spot.tie_break(len(live))
                order = sorted(range(len(live)), key=lambda i: (live[i].state != N_PROV, -live[i].launched_s, ties[i]))
                for i in order[:excess]:
                    self._notice(live[i])
        if pool.may_reopen(self.now):
            pool.blocked = False
            pool.backoff_until = -INF
            if self.ctrl.node_mode == "direct":
                self._reconcile_nodes(pool)
        nxt = spot.next_change_after(self.now)
        if nxt < self.end_s + self.opt.drain_s:
            self._push(nxt, EV_CAP, pool)


    def _spot_model(self, pool: _Pool) -> SpotModel:
        """The pool's capacity and interruption model, made (no windows, no drawn interruptions,
        the provider's notice) for a pool that had none."""
        if pool.spot is None:
            from providers.registry import installed

            notice = installed().notice_s(pool.spec.provider)
            pool.spot = SpotModel(notice_s=notice or 0.0, seed=self.setup.seed, pool=pool.name)
        return pool.spot


    def add_unavailable_window(self, name: str, start_s: float, end_s: float) -> None:
        """From ``start_s`` to ``end_s`` the cloud has no capacity for pool ``name``: node orders
        fail and the pool reads as unavailable (what ``--unavailable`` replays)."""
        pool = self.pools[name]
        spot = self._spot_model(pool)
        spot.unavailable_windows = (*spot.unavailable_windows, (start_s, end_s))
        self._push(max(start_s, self.now), EV_CAP, pool)


    def interrupt(self, name: str) -> bool:
        """An interruption notice now for pool ``name``'s newest serving node (what a spot trace
        or the drawn lifetimes do); ``False`` when the pool has no node to interrupt."""
        pool = self.pools[name]
        while pool.unmade:  # every node is a candidate (the newest one of an idle pool is chosen)
            self._make_onprem_node(pool)
        live = [n for n in pool.nodes if n.state == N_READY and not n.noticed]
        if not live:
            return False
        self._spot_model(pool)
        self._notice(max(live, key=lambda n: (bool(n.pods), n.launched_s, n.id)))
        return True

