"""A fleet of many models on cloud pools, run by the daemon as ``tidegate run`` builds it, over moto
(behind ``AwsPeer``'s recording proxy), the local compute server and kmock: what
``tests/integration/test_cloud_reads.py`` and ``bench/cloud_calls.py`` count the daemon's cloud API
calls on.

``CloudFleet``: ``models`` models (TP 2, ``queue-depth`` at one waiting request per replica, no
stabilization), each with a Deployment in three pools of 4-GPU nodes: ``aws-spot`` and ``aws-od``
(Auto Scaling groups in one region) and ``gcp-spot`` (a zonal managed instance group), plus the
SQS interruption queue. One waiting request puts each model's one replica on the cheapest pool,
``aws-spot``, one node each (models do not share nodes); two spread each model over both spot
pools. ``catch_up`` plays the clouds and the cluster: instances join as nodes, pods follow their
Deployments. Once caught up, a tick at the same load decides nothing new, so the daemon's cloud
calls are its reads.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controller.daemon import TickReport
from providers.clock import ManualClock
from tests.integration.gcp_server import GcpComputeServer, GcpRequest
from tests.integration.kube_fleet import FAST_RETRY, T0, TICK_S, ScriptedLoad, build_daemon, model_entry, write_policies
from tests.integration.peers import AWS_REGION, AwsPeer, AwsRequest, KubeControllers, KubePeer, asg_instances, create_asg

POOLS = ("aws-spot", "gcp-spot", "aws-od")
PROJECT = "tidegate-fleet"
ZONE = "us-central1-a"


def cloud_calls(aws: Sequence[AwsRequest], gcp: Sequence[GcpRequest]) -> Counter[str]:
    """Calls by cloud and action (``aws:DescribeAutoScalingGroups``, ``gcp:listManagedInstances``...)."""
    return Counter([f"aws:{r.action}" for r in aws] + [f"gcp:{r.verb}" for r in gcp])


class CloudFleet:
    """``models`` x 3 cloud pools on the peers, and the daemon that runs them."""

    def __init__(self, kube: KubePeer, aws: AwsPeer, gcp: GcpComputeServer, tmp: Path, *, models: int) -> None:
        aws.reset()
        gcp.reset()
        self.aws, self.gcp, self.kube = aws, gcp, kube
        tag = uuid.uuid4().hex[:6]
        self.ns = f"cloud-{tag}"
        self.ctl = KubeControllers(kube.api_client())
        self.clock = ManualClock(T0)
        self.load = ScriptedLoad()
        self.labels = {p: {"tidegate.io/pool": f"{p}-{tag}"} for p in POOLS}
        self.models = [f"m{i:04d}" for i in range(models)]
        self.asg = {"aws-spot": f"spot-{tag}", "aws-od": f"od-{tag}"}
        max_nodes = 2 * models  # room for an operator's extra node
        for pool, name in self.asg.items():
            create_asg(aws, name, max_size=max_nodes, spot=pool == "aws-spot")
        self.queue_url = aws.client("sqs", direct=True).create_queue(QueueName=f"itn-{tag}")["QueueUrl"]
        self.mig = gcp.add_mig(PROJECT, f"spot-{tag}", zone=ZONE)
        for m in self.models:
            for p in POOLS:
                self.ctl.add_deployment(self.ns, f"{m}-{p}", {"app": m, "pool": p}, 0, gpus=2,
                                        node_selector=self.labels[p])
        policies = write_policies(tmp, tag, self.models)
        pool = {"gpu_type": "A100-80GB", "gpus_per_node": 4, "max_nodes": max_nodes, "provisioning_delay_s": 120}
        self.raw: dict[str, Any] = {
            "policies_dir": str(policies),
            "database": {"url": f"sqlite:///{tmp / f'tidegate-{tag}.db'}"},
            "api": {"enabled": False},
            "providers": {"type": "real", "settings": {
                "prometheus": {"url": "http://127.0.0.1:9"},  # never queried: the load is scripted
                "kubernetes": {"host": kube.url, "retry": FAST_RETRY},
                "aws": {"endpoint_url": aws.url, "retry": FAST_RETRY, "interruption_queue_url": self.queue_url},
                "gcp": {"api_endpoint": gcp.url, "credentials": "anonymous", "retry": FAST_RETRY},
            }},
            "pools": [
                {"name": "aws-spot", "tier": "spot", "provider": "aws", **pool, "price_per_node_hour_usd": 4.0,
                 "kubernetes": {"node_selector": self.labels["aws-spot"]},
                 "aws": {"region": AWS_REGION, "auto_scaling_group": self.asg["aws-spot"]}},
                {"name": "gcp-spot", "tier": "spot", "provider": "gcp", **pool, "price_per_node_hour_usd": 5.0,
                 "kubernetes": {"node_selector": self.labels["gcp-spot"]},
                 "gcp": {"project": PROJECT, "zone": ZONE, "instance_group_manager": self.mig.name}},
                {"name": "aws-od", "tier": "ondemand", "provider": "aws", **pool, "price_per_node_hour_usd": 12.0,
                 "kubernetes": {"node_selector": self.labels["aws-od"]},
                 "aws": {"region": AWS_REGION, "auto_scaling_group": self.asg["aws-od"]}},
            ],
            "models": [model_entry(m, {p: {"namespace": self.ns, "name": f"{m}-{p}"} for p in POOLS})
                       for m in self.models],
        }
        self.runtime = build_daemon(self.raw, self.clock, self.load)

    def close(self) -> None:
        self.runtime.stop()

    def catch_up(self) -> None:
        """The clouds and the cluster do what was asked: instances run and join as nodes, pods
        are scheduled onto them."""
        for pool, name in self.asg.items():
            self.ctl.sync_nodes(asg_instances(self.aws, name), self.labels[pool], 4)
        self.gcp.settle(self.mig)
        self.ctl.sync_nodes(self.gcp.running(self.mig), self.labels["gcp-spot"], 4)
        self.ctl.reconcile(self.clock.now())

    def desired(self, pool: str) -> int:
        """The node group's desired capacity / target size, read by the test (not counted)."""
        if pool == "gcp-spot":
            return self.mig.target_size
        g = self.aws.client("autoscaling", direct=True).describe_auto_scaling_groups(AutoScalingGroupNames=[self.asg[pool]])
        return int(g["AutoScalingGroups"][0]["DesiredCapacity"])

    def tick(self, queue: float | None = None) -> tuple[TickReport, list[AwsRequest], list[GcpRequest]]:
        """Advance the clock, tick once; the report and the daemon's AWS and GCP calls in the tick
        (what reaches the peers: every attempt, retries included)."""
        if queue is not None:
            self.load.queue = queue
        self.clock.advance(TICK_S)
        amark, gmark = self.aws.mark(), self.gcp.mark()
        report = self.runtime.daemon.tick()
        return report, self.aws.requests_since(amark), self.gcp.requests_since(gmark)
