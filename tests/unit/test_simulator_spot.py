"""Spot traces and models (controller.sim.spot): formats, replay semantics, windows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from controller.sim.scenario import SHARED_DATA
from controller.core.model import ModelSpec, PoolSpec, ReplicaCapacity, Tier
from controller.sim.scenario import parse_spot_args
from controller.sim.spot import (
    DEFAULT_NOTICE_S, SpotModel, SpotTrace, load_spot_trace, read_skypilot_trace, read_spotserve_trace,
)
from providers.kubernetes import OnPremProvider
from providers.registry import PoolProviderKind, ProviderRegistry, installed

_POOLS = {
    "o": PoolSpec("o", Tier.ONPREM, "onprem", "H100", 8, 2, 16.0),
    "a": PoolSpec("a", Tier.SPOT, "aws", "H100", 8, 2, 25.0),
    "g": PoolSpec("g", Tier.SPOT, "gcp", "H100", 8, 2, 25.0),
    "z": PoolSpec("z", Tier.SPOT, "azure", "H100", 8, 2, 25.0),
}


def _model(pools: str) -> ModelSpec:
    return ModelSpec("m", 8, "fp8", ("H100",), 60, {"H100": ReplicaCapacity(100, 1)}, tuple(pools))


def test_notice_periods_are_the_pool_providers() -> None:
    # Each spot pool is interrupted with its own provider's notice (AWS 2 min, GCP 30 s); a pool
    # given only capacity windows (on-prem here) gets the default.
    models = parse_spot_args([], ["o=0:10"], _POOLS, _model("oag"), seed=0, default_rate=1.0)
    assert {n: m.notice_s for n, m in models.items()} == {"o": DEFAULT_NOTICE_S, "a": 120.0, "g": 30.0}
    assert (installed().notice_s("aws"), installed().notice_s("gcp"), installed().notice_s("onprem")) == (120.0, 30.0, None)


class _Azure(PoolProviderKind):
    name = "azure"
    tiers = frozenset({Tier.SPOT, Tier.ONDEMAND})
    interruption_notice_s = 30.0


def test_a_provider_added_to_the_registry_brings_its_notice() -> None:
    # A provider the simulator has never heard of: nothing in it names a cloud, the registry says.
    reg = ProviderRegistry([OnPremProvider, _Azure])
    models = parse_spot_args([], [], _POOLS, _model("z"), seed=0, default_rate=2.0, providers=reg)
    assert models["z"].notice_s == 30.0 and models["z"].interruptions_per_node_hour == 2.0


def test_skypilot_trace(tmp_path: Path) -> None:
    d = tmp_path / "preemption" / "4-node"
    d.mkdir(parents=True)
    f = d / "zone.json"
    f.write_text(json.dumps({"metadata": {"gap_seconds": 300}, "data": [0, 4, 4, 2, 2, 4]}))
    tr = read_skypilot_trace(f)
    assert tr.preempts  # under preemption/
    assert tr.period_s == 1800
    assert tr.fraction_at(0) == 0 and tr.fraction_at(300) == 1.0 and tr.fraction_at(899) == 1.0
    assert tr.fraction_at(900) == 0.5 and tr.fraction_at(1500) == 1.0
    assert tr.fraction_at(1800 + 300) == 1.0  # wraps
    assert tr.next_change_after(300) == 900
    started = tr.start_at_first_capacity()
    assert started.fraction_at(0) == 1.0 and started.fraction_at(600) == 0.5
    avail = tmp_path / "availability" / "z.json"
    avail.parent.mkdir()
    avail.write_text(json.dumps({"metadata": {"gap_seconds": 60}, "data": [1, 0, 1]}))
    assert not load_spot_trace(avail).preempts
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [1]}))
    with pytest.raises(ValueError, match="not a SkyPilot spot trace"):
        read_skypilot_trace(bad)


def test_spotserve_csv_and_segments(tmp_path: Path) -> None:
    csv = tmp_path / "g.csv"
    csv.write_text("0,add,n1\n0,add,n2\n60000,add,n3\n120000,add,n4\n180000,remove,n1\n180000,remove,n2\n")
    tr = read_spotserve_trace(csv)
    assert tr.preempts
    assert tr.fraction_at(0) == 0.5 and tr.fraction_at(130) == 1.0 and tr.fraction_at(181) == 0.5
    seg = tmp_path / "trace_x.txt"
    seg.write_text('[0, "add", {"nodes": ["a", "b", "c", "d"]}]\n[60000, "remove", {"nodes": ["a"]}]\n'
                   '[300000, "DONE", {"nodes": []}]\n')
    s = load_spot_trace(seg)
    assert s.period_s == 300.0
    assert s.fraction_at(59) == 1.0 and s.fraction_at(61) == 0.75
    assert s.drops() == 1


def test_rolled_trace_starts_later() -> None:
    tr = SpotTrace("t", np.array([0.0, 100.0, 200.0]), np.array([1.0, 0.0, 0.5]), 300.0, True)
    r = tr.rolled(150.0)
    assert r.fraction_at(0) == 0.0 and r.fraction_at(60) == 0.5 and r.fraction_at(160) == 1.0
    assert r.mean_fraction == pytest.approx(tr.mean_fraction)


def test_spot_model_capacity_windows_and_lifetimes() -> None:
    tr = SpotTrace("t", np.array([0.0, 100.0]), np.array([1.0, 0.25]), 200.0, True)
    m = SpotModel(notice_s=120.0, trace=tr, scale_nodes=4, unavailable_windows=((50.0, 60.0),), pool="p", seed=1)
    assert m.capacity_nodes(10) == 4
    assert m.capacity_nodes(55) == 0 and "window" in m.limit_reason(55)
    assert m.capacity_nodes(150) == 1
    assert m.next_change_after(10) == 50 and m.next_change_after(55) == 60 and m.next_change_after(60) == 100
    none = SpotModel(notice_s=30.0, pool="q")
    assert none.capacity_nodes(1e6) is None and none.draw_lifetime_s() == math.inf
    rate = SpotModel(notice_s=30.0, interruptions_per_node_hour=2.0, pool="r", seed=3)
    lifetimes = [rate.draw_lifetime_s() for _ in range(2000)]
    assert np.mean(lifetimes) == pytest.approx(1800.0, rel=0.1)
    again = SpotModel(notice_s=30.0, interruptions_per_node_hour=2.0, pool="r", seed=3)
    assert again.draw_lifetime_s() == lifetimes[0]


@pytest.mark.skipif(not SHARED_DATA.exists(), reason=f"shared data folder {SHARED_DATA} is absent (fresh clone)")
def test_shared_spot_traces_read() -> None:
    g4dn = read_spotserve_trace(SHARED_DATA / "spotserve_traces" / "trace_full" / "g4dn.csv")
    assert g4dn.preempts and g4dn.drops() > 10
    assert g4dn.period_s == pytest.approx(10.8 * 3600, rel=0.02)
    pre = read_skypilot_trace(SHARED_DATA / "skypilot_spot_traces" / "preemption" / "4-node" / "aws-08-03-2023"
                              / "us-east-1f_v100_1.json")
    assert pre.preempts and set(np.unique(pre.fraction)) <= {0.0, 0.25, 0.5, 0.75, 1.0}
    av = read_skypilot_trace(SHARED_DATA / "skypilot_spot_traces" / "availability" / "1-node" / "aws-02-15-2023"
                             / "us-east-1a_v100_1.json")
    assert not av.preempts and 0.1 < av.mean_fraction < 0.3
