"""The signal table is the one place signals are defined: a row added to it reaches ModelSignals,
the decision log's encoding and the pipeline's partial-data guard with no other edit, and no module
but the table, the sources that measure signals and the code that reads them spells a signal name.

(``tests/integration/test_api.py`` shows the same row reaching ``/v1/status`` and ``/metrics`` of a
running daemon.)"""

from __future__ import annotations

import ast
from datetime import datetime, timezone
from pathlib import Path

import pytest

from controller.core import signals as signal_table
from controller.core.model import ModelSignals, Sample
from controller.core.reasons import Reason
from controller.core.signals import Combine, Signal
from controller.db import codec
from tests import pysource
from tests.unit.test_pipeline import fixed, policy, run, signals, stage

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 2, 12, 0, tzinfo=timezone.utc)

FAKE = Signal(
    "gpu_temperature_c", "degrees C", Combine.MAX, "Hottest GPU of the model.", "Missing data.",
    Reason.UTILIZATION_ABOVE_TARGET,
    promql="max by (${model}, ${pool}) (DCGM_FI_DEV_GPU_TEMP)", promql_help="DCGM's GPU temperature.",
)
"""A signal the project does not have, added as the README's "Adding a signal" says: one row."""


@pytest.fixture
def with_fake_signal(monkeypatch: pytest.MonkeyPatch) -> Signal:
    monkeypatch.setattr(signal_table, "SIGNALS", signal_table.SIGNALS + (FAKE,))
    return FAKE


def test_a_new_row_is_a_model_signals_sample_missing_until_measured(with_fake_signal: Signal) -> None:
    measured = ModelSignals("m", NOW, gpu_temperature_c=Sample(71.5, NOW))
    assert measured.gpu_temperature_c == Sample(71.5, NOW)
    assert measured.sample("gpu_temperature_c").value == 71.5
    unmeasured = ModelSignals("m", NOW, queue_depth=Sample(3.0, NOW))
    assert unmeasured.gpu_temperature_c.value is None and unmeasured.gpu_temperature_c.reason == "NoData"
    assert list(unmeasured.samples)[-1] == "gpu_temperature_c"


def test_a_name_the_table_lacks_is_refused_like_an_unknown_field() -> None:
    with pytest.raises(TypeError, match="no signal 'gpu_temperature_c'.*queue_depth"):
        ModelSignals("m", NOW, gpu_temperature_c=Sample(71.5, NOW))
    with pytest.raises(AttributeError):
        ModelSignals("m", NOW).gpu_temperature_c  # noqa: B018


def test_a_new_row_is_written_to_the_decision_log_and_older_rows_still_decode(with_fake_signal: Signal) -> None:
    sig = ModelSignals("m", NOW, queue_depth=Sample(3.0, NOW), gpu_temperature_c=Sample(71.5, NOW, "hot"))
    data = codec.signals_to_json(sig)
    assert data["gpu_temperature_c"] == {"value": 71.5, "at": NOW.isoformat(), "reason": "hot"}
    assert codec.signals_from_json(data) == sig
    # a row written before the signal existed: the new signal reads as missing, never as zero
    older = {k: v for k, v in data.items() if k != "gpu_temperature_c"}
    back = codec.signals_from_json(older)
    assert back.gpu_temperature_c.value is None and back.queue_depth == sig.queue_depth


def test_a_row_written_with_a_signal_since_removed_still_decodes() -> None:
    data = codec.signals_to_json(ModelSignals("m", NOW, queue_depth=Sample(3.0, NOW)))
    data["gpu_temperature_c"] = {"value": 71.5, "at": NOW.isoformat(), "reason": None}
    back = codec.signals_from_json(data)
    assert back.queue_depth.value == 3.0 and "gpu_temperature_c" not in back.samples


def test_a_new_pooled_signal_covering_only_some_pools_holds_scale_down(with_fake_signal: Signal) -> None:
    sig = signals({"onprem": 4, "spot-a": 2}, gpu_temperature_c=Sample(80.0, NOW, "Partial: pool spot-a NaN"))
    d = run(policy(fixed(2)), sig=sig)
    assert d.replicas == 6 and stage(d, "missing-data").reason == Reason.HOLD_ON_MISSING_DATA.value
    assert "gpu_temperature_c" in stage(d, "missing-data").message


def test_combine_rules() -> None:
    assert [c.apply([2.0, 6.0]) for c in (Combine.SUM, Combine.MAX, Combine.MEAN)] == [8.0, 6.0, 4.0]
    with pytest.raises(ValueError, match="model-wide"):
        Combine.MODEL.apply([2.0, 6.0])


# Modules allowed to spell signal names: the table, the sources that measure signals (their
# values are their own), the pricing module (it computes the cost per token), and the code that reads particular signals (policy kinds, the simulator's
# baselines, benchmarks).
SPELLERS = {
    "controller/core/signals.py",
    "providers/prometheus.py", "providers/triton.py", "controller/core/pricing.py",
    "controller/sim/scrape.py",
    "controller/sim/baselines.py",
}
SPELLER_DIRS = ("policies/", "bench/")


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def test_no_other_module_spells_a_signal_name() -> None:
    """Neither as a string (a list of names, a lookup by name) nor as a keyword building
    ``ModelSignals``; reading one signal as ``signals.<name>`` for a purpose of its own (a gauge of
    the p99) is fine."""
    names = {s.name for s in signal_table.SIGNALS}
    found = []
    for path in sorted(p for d in ("controller", "providers", "policies", "bench") for p in (ROOT / d).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in SPELLERS or rel.startswith(SPELLER_DIRS):
            continue
        for node in ast.walk(pysource.parse(path.read_text(), rel)):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
            elif isinstance(node, ast.Call) and _callee(node) in ("ModelSignals", "replace_samples"):
                found += [f"{rel}:{node.lineno}: {k.arg}=" for k in node.keywords if k.arg in names]
    assert not found, "signal names spelled outside the signal table; derive them from it:\n" + "\n".join(found)
