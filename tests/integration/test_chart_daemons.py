"""The daemons the Helm chart runs, run for real from the chart's render.

``helm template`` renders the chart; each pod is rebuilt from the render the way the kubelet
would: the ConfigMaps are written where the Deployment mounts them (the emptyDirs become
temporary folders), the container's env is set (``POD_NAME`` from the pod's name), and the
container's own command runs (``tidegate run --config ...``) as a subprocess. The cluster is kmock,
reached through a kubeconfig (``KUBECONFIG``) as a pod reaches its API server in-cluster.

Shown:

- the default install (two replicas, SQLite): the chart configures a Lease in the daemon's config,
  named as its Role allows; two daemons on one SQLite file and one cluster: exactly one acts
  (scales), the other stands by; kill the leader (SIGKILL: nothing is released) and the other acts
  within the lease time;
- three pods and six buckets (``replicaCount: 3``, ``leaderElection.buckets: 6``), twelve models on
  one SQLite file: the pods split the bucket Leases two each (every Lease used is named by the
  chart's Role) and own every model once; each Deployment set back to 0 is scaled back by exactly
  one pod, the holder of its model's bucket;
- the default install becomes Ready: the rendered default config answers ``/readyz`` 200 within
  10 s (ticks and readiness run on one clock);
- a PostgreSQL outage (a TCP proxy in front of the server, stopped) turns ``/readyz`` 503 with the
  reason, logged at WARNING, and back to 200 when the database returns.
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client as k8s

from controller.config import DaemonConfig
from controller.demo import demo_config_path
from controller.runtime import build_runtime
from providers.clock import ManualClock
from controller.shards import bucket_lease_name, bucket_of, members_lease_name
from tests.integration.peers import KubeControllers, KubePeer
from tests.integration.test_deploy import CHART, KUBE_VERSIONS, _run, helm  # noqa: F401 - helm: the fixture

RELEASE = "tg"
STARTUP_S = 30.0
"""Longest wait for a subprocess daemon's first answer (imports and migrations on a busy CI node)."""


# --- pods from the render ----------------------------------------------------------------------


def render(helm: Path, namespace: str, *args: str) -> list[dict[str, Any]]:
    out = _run([helm, "template", RELEASE, CHART, "--namespace", namespace,
                "--kube-version", f"{KUBE_VERSIONS[-1]}.0", *args])
    return [d for d in yaml.safe_load_all(out) if d]


def _one(docs: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pod:
    """One replica of the chart's Deployment as a local process."""

    def __init__(self, docs: list[dict[str, Any]], root: Path, name: str, *, shared: dict[str, Path],
                 environ: dict[str, str]) -> None:
        self.name = name
        dep = _one(docs, "Deployment")
        spec = dep["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        cms = {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "ConfigMap"}
        mounts: dict[str, Path] = {}
        for m in container["volumeMounts"]:
            vol = volumes[m["name"]]
            if "configMap" in vol:
                data = cms[vol["configMap"]["name"]]
                if "subPath" in m:
                    target = root / name / m["name"] / m["subPath"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(data[m["subPath"]])
                else:
                    target = root / name / m["name"]
                    target.mkdir(parents=True, exist_ok=True)
                    for file, text in data.items():
                        (target / file).write_text(text)
            else:  # an emptyDir: the pod's own, unless the test shares it (one SQLite file)
                target = shared.get(m["mountPath"]) or root / name / m["name"]
                target.mkdir(parents=True, exist_ok=True)
            mounts[m["mountPath"]] = target
        self.mounts = mounts
        config_path = mounts[container["args"][container["args"].index("--config") + 1]]
        text = config_path.read_text()
        # one pass, longest mount first, whole path components only (a replaced path is not rescanned)
        pattern = "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))
        text = re.sub(rf"(?<![\w.-])({pattern})(?=/|$|\s)", lambda m: str(mounts[m.group(1)]), text, flags=re.M)
        cfg = yaml.safe_load(text)
        self.port = free_port()  # each pod has its own IP; here each gets its own port
        cfg["api"].update(host="127.0.0.1", port=self.port)
        config_path.write_text(yaml.safe_dump(cfg))
        self.config = DaemonConfig.model_validate(cfg)
        env = dict(environ)
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[e["name"]] = name
            elif not e.get("valueFrom", {}).get("secretKeyRef", {}).get("optional"):
                raise AssertionError(f"env {e['name']} has a source this test does not provide: {e}")
        self.log_path = root / f"{name}.log"
        self._log = self.log_path.open("w")
        self.command = [sys.executable, "-c", "from controller.cli import main; raise SystemExit(main())",
                        *container["args"]]
        self.command[self.command.index("--config") + 1] = str(config_path)
        assert container["command"] == ["tidegate"]
        self.proc = subprocess.Popen(self.command, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def readyz(self) -> httpx.Response | None:
        try:
            return httpx.get(f"{self.base}/readyz", timeout=2)
        except httpx.TransportError:
            return None

    def wait_listening(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while self.readyz() is None:
            assert self.proc.poll() is None, f"{self.name} exited {self.proc.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"{self.name} does not answer:\n{self.log()}"
            time.sleep(0.1)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def log_records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, the Lease is not released."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def kubeconfig(path: Path, url: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "kmock", "user": {}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}],
    }))
    return path


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for p in started:
        p.stop()


def _base_env(tmp_path: Path, kube: KubePeer) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDEGATE_", "KUBERNETES_", "POD_"))}
    env["KUBECONFIG"] = str(kubeconfig(tmp_path / "kubeconfig", kube.url))
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    return env


# --- two pods, one leader ----------------------------------------------------------------------


def test_default_chart_two_pods_one_acts_and_the_other_takes_over_within_the_lease_time(
        helm: Path, kube: KubePeer, tmp_path: Path, pods: list[Pod]) -> None:
    ns = f"c-{uuid.uuid4().hex[:6]}"
    # Only what a cluster would provide differs from the defaults: the real providers on the
    # emulated cluster (Prometheus is absent: signals are missing and the policy's bounds still
    # ask for one replica), and acting instead of dry-run. Replicas and election are the chart's.
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": {"dry_run": False, "providers": {
        "type": "real", "settings": {"prometheus": {"url": "http://127.0.0.1:9"}}}}}))
    docs = render(helm, ns, "-f", str(values))
    dep = _one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    role = _one(docs, "Role", "-leader-election")
    (lease_name,) = [n for r in role["rules"] for n in r.get("resourceNames", [])]
    assert role["metadata"]["namespace"] == ns

    model = yaml.safe_load(_one(docs, "ConfigMap", "-config")["data"]["config.yaml"])["models"][0]
    ((pool, ref),) = model["deployments"].items()
    ctl = KubeControllers(kube.api_client())
    ctl.add_deployment(ref["namespace"], ref["name"], {"app": model["name"]}, 0, gpus=model["tp_degree"])
    ctl.add_node(f"{ns}-node-0", {}, 8)
    apps = k8s.AppsV1Api(kube.api_client())
    leases = k8s.CoordinationV1Api(kube.api_client())

    def replicas() -> int:
        return int(apps.read_namespaced_deployment(ref["name"], ref["namespace"]).spec.replicas)

    def scale_writes() -> int:
        return sum(1 for r in kube.writes() if r.path.endswith(f"/deployments/{ref['name']}/scale"))

    def wait_for(what: str, cond: Any, timeout_s: float) -> float:
        start = time.monotonic()
        while not cond():
            assert all(p.proc.poll() is None for p in pods if p.name != killed), [p.log() for p in pods]
            assert time.monotonic() - start < timeout_s, f"{what} within {timeout_s} s:\n" + "\n".join(p.log()[-3000:] for p in pods)
            time.sleep(0.1)
        return time.monotonic() - start

    killed = ""
    shared = {"/var/lib/tidegate": tmp_path / "data"}  # both pods on one SQLite file
    env = _base_env(tmp_path, kube)
    for i in range(2):
        pods.append(Pod(docs, tmp_path, f"{RELEASE}-tidegate-{i}", shared=shared, environ=env))
    for p in pods:
        assert p.config.leader_election.backend == "lease" and p.config.leader_election.name == lease_name
        assert p.config.database.url.startswith(f"sqlite:///{shared['/var/lib/tidegate']}")

    wait_for("the leader scales the Deployment to the policy's minimum", lambda: replicas() == 1, STARTUP_S)
    for p in pods:
        p.wait_listening()
    holder = leases.read_namespaced_lease(lease_name, ns).spec.holder_identity
    leader, follower = sorted(pods, key=lambda p: p.name != holder)
    assert leader.name == holder
    # a few more ticks of both: the follower never acts, the leader scaled once
    interval_s = leader.config.loop.interval_s
    time.sleep(interval_s + 1)
    assert scale_writes() == 1
    acted = {p.name: [r for r in p.log_records() if r.get("msg") == "decision"] for p in pods}
    assert acted[leader.name] and not acted[follower.name], acted
    body = follower.readyz()
    assert body is not None and body.status_code == 200 and body.json()["role"] == "standby", body and body.text

    killed = leader.name
    leader.kill()
    t_kill = time.monotonic()
    apps.patch_namespaced_deployment_scale(ref["name"], ref["namespace"], {"spec": {"replicas": 0}})
    lease_s = follower.config.leader_election.lease_duration_s
    budget_s = lease_s + follower.config.leader_election.retry_period_s + interval_s + 2
    wait_for("the standby takes over and scales", lambda: replicas() == 1, budget_s)
    took_s = time.monotonic() - t_kill
    print(f"the standby acted {took_s:.1f} s after the leader was killed")  # shown by pytest -rP
    assert leases.read_namespaced_lease(lease_name, ns).spec.holder_identity == follower.name
    wait_for("the new leader logs its decision",  # written just after the scale call returns
             lambda: [r for r in follower.log_records() if r.get("msg") == "decision"], 5)
    # it waited for the lease to run out: the dead leader's Lease was never released
    assert took_s >= lease_s - interval_s - 1, took_s


# --- three pods, models sharded over bucket Leases ---------------------------------------------

SHARD_MODELS = [f"m{i:02d}" for i in range(12)]
SHARD_POLICY = """apiVersion: tidegate/v1
kind: ScalingPolicy
metadata: {{name: {name}}}
spec:
  model: {name}
  bounds: {{min_replicas: 1, max_replicas: 2}}
  slo: {{p99_latency_ms: 2500, queue_depth_per_replica: 4}}
  rules: [{{kind: slo-guard}}]
"""


def test_chart_with_three_pods_and_six_buckets_acts_on_each_model_from_exactly_one_pod(
        helm: Path, kube: KubePeer, tmp_path: Path, pods: list[Pod]) -> None:
    """``replicaCount: 3`` and ``leaderElection.buckets: 6``, 12 models: the three pods from the
    render share the models (each owns those of the bucket Leases it holds; together all, none
    twice); every Lease they use is one the chart's Role names; after every Deployment is set back
    to 0 each is scaled back by exactly one pod, the holder of its model's bucket."""
    ns = f"b-{uuid.uuid4().hex[:6]}"
    models = [{"name": m, "tp_degree": 1, "quantization": "fp8", "gpu_types": ["H100-80GB"], "cold_start_s": 30,
               "capacity": {"H100-80GB": {"output_tokens_per_s": 2000, "requests_per_s": 8.0}},
               "deployments": {"onprem-h100": {"namespace": ns, "name": f"{m}-onprem"}}} for m in SHARD_MODELS]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "replicaCount": 3, "leaderElection": {"buckets": 6},
        "config": {"dry_run": False, "models": models,
                   "providers": {"type": "real", "settings": {"prometheus": {"url": "http://127.0.0.1:9"}}}},
        "rbac": {"managedNamespaces": [ns]},
        "policies": {"llama3-70b-fp8.yaml": None, **{f"{m}.yaml": SHARD_POLICY.format(name=m) for m in SHARD_MODELS}},
    }))
    docs = render(helm, ns, "-f", str(values))
    assert _one(docs, "Deployment")["spec"]["replicas"] == 3
    role = _one(docs, "Role", "-leader-election")
    allowed = {n for r in role["rules"] for n in r.get("resourceNames", [])}

    ctl = KubeControllers(kube.api_client())
    for m in SHARD_MODELS:
        ctl.add_deployment(ns, f"{m}-onprem", {"app": m}, 0, gpus=1)
    ctl.add_node(f"{ns}-node-0", {}, 8)
    ctl.add_node(f"{ns}-node-1", {}, 8)
    apps = k8s.AppsV1Api(kube.api_client())
    leases = k8s.CoordinationV1Api(kube.api_client())

    def replicas(m: str) -> int:
        return int(apps.read_namespaced_deployment(f"{m}-onprem", ns).spec.replicas)

    def wait_for(what: str, cond: Any, timeout_s: float) -> None:
        start = time.monotonic()
        while not cond():
            assert all(p.proc.poll() is None for p in pods), [p.log()[-3000:] for p in pods]
            assert time.monotonic() - start < timeout_s, f"{what} within {timeout_s} s:\n" + "\n".join(
                p.log()[-3000:] for p in pods)
            time.sleep(0.2)

    shared = {"/var/lib/tidegate": tmp_path / "data"}  # the three pods on one SQLite file
    env = _base_env(tmp_path, kube)
    for i in range(3):
        pods.append(Pod(docs, tmp_path, f"{RELEASE}-tidegate-{i}", shared=shared, environ=env))
    cfg = pods[0].config.leader_election
    assert all(p.config.leader_election == cfg for p in pods) and cfg.backend == "lease" and cfg.buckets == 6
    assert all([m.name for m in p.config.models] == SHARD_MODELS for p in pods)

    def bucket_holders() -> dict[int, str | None]:
        out: dict[int, str | None] = {}
        for b in range(cfg.buckets):
            try:
                out[b] = leases.read_namespaced_lease(bucket_lease_name(cfg.name, b, cfg.buckets), ns) \
                    .spec.holder_identity
            except k8s.ApiException:
                out[b] = None
        return out

    def owned() -> dict[str, int]:
        answers = {p.name: p.readyz() for p in pods}
        return {n: int(r.json().get("owned_models", -1)) for n, r in answers.items() if r is not None}

    def balanced() -> bool:
        holders = Counter(bucket_holders().values())
        counts = owned()
        return holders == {p.name: 2 for p in pods} and len(counts) == 3 and sum(counts.values()) == len(SHARD_MODELS)

    wait_for("every Deployment at the policies' minimum", lambda: all(replicas(m) == 1 for m in SHARD_MODELS),
             STARTUP_S + 30)
    wait_for("the three pods hold two buckets each and own every model once", balanced, 60)
    used = {lease.metadata.name for lease in leases.list_namespaced_lease(ns).items}
    assert used == {*(bucket_lease_name(cfg.name, b, cfg.buckets) for b in range(cfg.buckets)),
                    members_lease_name(cfg.name)}
    assert used <= allowed, f"Leases the Role does not name: {sorted(used - allowed)}"
    holders = bucket_holders()
    owner = {m: holders[bucket_of(m, cfg.buckets)] for m in SHARD_MODELS}
    assert all(owned()[p.name] == sum(1 for o in owner.values() if o == p.name) > 0 for p in pods), (owned(), owner)

    # every Deployment back to 0: each pod scales back exactly the models of its buckets, once each
    seen = {p.name: len(p.log_records()) for p in pods}
    mark = kube.mark()
    for m in SHARD_MODELS:
        apps.patch_namespaced_deployment_scale(f"{m}-onprem", ns, {"spec": {"replicas": 0}})
    wait_for("every Deployment scaled back to 1", lambda: all(replicas(m) == 1 for m in SHARD_MODELS), 30)
    time.sleep(2 * pods[0].config.loop.interval_s)  # a few more ticks of every pod
    assert bucket_holders() == holders, "the buckets stayed where they were"
    scaled = Counter(r.path.split("/deployments/")[1].split("/")[0] for r in kube.requests_since(mark)
                     if r.is_write and not r.by_test and r.path.endswith("/scale"))
    assert scaled == {f"{m}-onprem": 1 for m in SHARD_MODELS}, scaled
    acted: dict[str, set[str]] = {m: set() for m in SHARD_MODELS}
    for p in pods:
        for r in p.log_records()[seen[p.name]:]:
            if r.get("msg") == "decision" and r.get("model") in acted:
                acted[r["model"]].add(p.name)
    assert acted == {m: {owner[m]} for m in SHARD_MODELS}, acted


# --- the default install becomes Ready ---------------------------------------------------------


def test_default_render_run_as_tidegate_run_is_ready_within_its_startup_window(
        helm: Path, kube: KubePeer, tmp_path: Path, pods: list[Pod]) -> None:
    """Ready before the rendered startup probe would give up on the pod (periodSeconds x
    failureThreshold, 60 s by default): a deadline the kubelet sets, not one chosen for this
    machine's speed (a fixed 10 s failed on a loaded CI node)."""
    docs = render(helm, f"r-{uuid.uuid4().hex[:6]}")
    (container,) = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    startup = container["startupProbe"]
    window_s = startup["periodSeconds"] * startup["failureThreshold"]
    pod = Pod(docs, tmp_path, f"{RELEASE}-tidegate-0", shared={}, environ=_base_env(tmp_path, kube))
    pods.append(pod)
    assert pod.config.providers.type == "simulated"
    start = time.monotonic()
    answers: list[int] = []
    while time.monotonic() - start < window_s:
        r = pod.readyz()
        if r is not None:
            answers.append(r.status_code)
            if r.status_code == 200:
                break
        assert pod.proc.poll() is None, pod.log()
        time.sleep(0.2)
    assert answers and answers[-1] == 200, (answers, r.text if r is not None else None, pod.log()[-3000:])
    body = r.json()
    assert body["ready"] is True and body["reasons"] == [] and body["role"] == "leader"
    # and it stays ready: ticks keep pace with the clock readiness measures
    for _ in range(10):
        time.sleep(0.3)
        again = pod.readyz()
        assert again is not None and again.status_code == 200, again and again.text


# --- a PostgreSQL outage -----------------------------------------------------------------------


class TcpProxy:
    """127.0.0.1:PORT -> a target; ``stop()`` closes the listener and every open connection (the
    database host is gone), ``start()`` listens again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "TcpProxy":
        lst = socket.socket()
        lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lst.bind(("127.0.0.1", self.port))
        lst.listen(16)
        self._listener = lst
        self._thread = threading.Thread(target=self._accept, args=(lst,), daemon=True)
        self._thread.start()
        return self

    def _accept(self, lst: socket.socket) -> None:
        while True:
            try:
                client, _ = lst.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=3)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([a, b], [], [], 1.0)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def stop(self) -> None:
        if self._listener is not None:
            try:  # wakes the thread blocked in accept() (closing alone would not, on Linux)
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
            if self._thread is not None:
                self._thread.join(5)
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@pytest.mark.postgres
def test_postgres_outage_turns_readyz_unready_with_the_reason_and_a_warning(
        pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from sqlalchemy.engine import make_url

    url = make_url(pg_url)
    proxy = TcpProxy((url.host or "127.0.0.1", url.port or 5432)).start()
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    raw = yaml.safe_load(demo_config_path().read_text())
    raw["policies_dir"] = str(demo_config_path().parent / raw.get("policies_dir", "policies"))
    raw["database"] = {"url": proxied}
    raw["leader_election"] = {"backend": "database", "name": f"t-{uuid.uuid4().hex}"}
    raw["api"] = {"host": "127.0.0.1", "port": 0}
    cfg = DaemonConfig.model_validate(raw)
    clock = ManualClock(datetime(2026, 11, 2, tzinfo=timezone.utc))
    rt = build_runtime(cfg, clock=clock, environ={})
    try:
        rt.daemon.reload_policies()
        rt.serve_api("127.0.0.1", 0)
        readyz = f"http://127.0.0.1:{rt.api_port}/readyz"
        for _ in range(3):
            clock.advance(cfg.loop.interval_s)
            assert rt.daemon.tick().skipped is None
        ok = httpx.get(readyz, timeout=5)
        assert ok.status_code == 200, ok.text
        assert ok.json()["providers"]["leader"]["ok"] and ok.json()["providers"]["database"]["ok"]

        caplog.set_level(logging.WARNING, logger="tidegate.daemon")
        proxy.stop()  # the database host is gone: open sessions break, new ones are refused
        clock.advance(cfg.loop.interval_s)
        report = rt.daemon.tick()
        assert report.skipped == "not the leader"  # a lock that cannot be checked is not held
        down = httpx.get(readyz, timeout=10)
        assert down.status_code == 503, down.text
        body = down.json()
        assert any(r.startswith("leader lock unreachable: ") for r in body["reasons"]), body["reasons"]
        assert any(r.startswith("database unreachable: ") for r in body["reasons"]), body["reasons"]
        leader = body["providers"]["leader"]
        assert not leader["ok"] and leader["last_error"] and leader["last_error_at"] == clock.now().isoformat()
        warnings = {r.getMessage() for r in caplog.records if r.levelno == logging.WARNING}
        assert {"leader unreachable; this daemon is unready", "database unreachable; this daemon is unready"} <= warnings, warnings

        proxy.start()  # back: the next tick takes the lock again and the daemon is ready
        clock.advance(cfg.loop.interval_s)
        assert rt.daemon.tick().skipped is None
        back = httpx.get(readyz, timeout=10)
        assert back.status_code == 200, back.text
        assert back.json()["providers"]["leader"]["last_error"] == leader["last_error"]  # kept, with its time
    finally:
        rt.stop()
        proxy.stop()
