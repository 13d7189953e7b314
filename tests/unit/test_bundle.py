"""The bundle loader accepts the shipped bundle and rejects every kind of disagreement between the
manifest and the Triton model repository, with an error that names the file and both values."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Callable

import pytest
import yaml
from google.protobuf import text_format
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2

from controller.bundle import (
    BundleError,
    BundleManifest,
    bundle_to_model_config,
    check_daemon_config,
    check_model_config,
    load_bundle,
    load_manifest,
    tensor_parallel_degree,
)
from controller.config import DaemonConfig, ModelConfig

BUNDLE = Path(__file__).resolve().parents[2] / "deploy" / "model"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A writable copy of the shipped bundle (manifest + repository)."""
    dst = tmp_path / "model"
    shutil.copytree(BUNDLE, dst, ignore=shutil.ignore_patterns("k8s", "__pycache__"))
    return dst / "manifest.yaml"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def _edit_manifest(path: Path, fn: Callable[[dict], None]) -> None:
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data))


def test_shipped_bundle_loads_and_agrees() -> None:
    b = load_bundle(BUNDLE / "manifest.yaml")
    spec = b.manifest.spec
    assert set(b.models) == {"preprocessing", "tensorrt_llm", "postprocessing", "ensemble"}
    trt = b.models["tensorrt_llm"]
    assert trt.backend == "tensorrtllm"
    assert trt.tp_degree == spec.tp_degree == spec.gpus_per_replica == 2
    assert b.models["ensemble"].platform == "ensemble"
    assert spec.quantization == "fp8"
    assert spec.served_model in b.models


def _trt(bundle: Path) -> Path:
    return bundle.parent / "repository" / "tensorrt_llm" / "config.pbtxt"


def _ens(bundle: Path) -> Path:
    return bundle.parent / "repository" / "ensemble" / "config.pbtxt"


# (mutation, substrings the error must contain: the file and both values)
CASES: list[tuple[str, Callable[[Path], None], list[str]]] = [
    ("config TP 4 vs manifest 2",
     lambda b: _edit(_trt(b), 'string_value: "0,1" }', 'string_value: "0,1,2,3" }'),
     ["tensorrt_llm/config.pbtxt", "'0,1,2,3'", "degree 4", "tp_degree 2", "gpus_per_replica 2"]),
    ("manifest TP 4 vs config 2",
     lambda b: _edit_manifest(b, lambda d: d["spec"].update(tp_degree=4, gpus_per_replica=4)),
     ["tensorrt_llm/config.pbtxt", "degree 2", "tp_degree 4", "gpus_per_replica 4", "manifest.yaml"]),
    ("manifest gpus_per_replica disagrees with its tp_degree",
     lambda b: _edit_manifest(b, lambda d: d["spec"].update(gpus_per_replica=4)),
     ["manifest.yaml", "gpus_per_replica (4)", "tp_degree (2)"]),
    ("no gpu_device_ids",
     lambda b: _edit(_trt(b), 'key: "gpu_device_ids"', 'key: "gpu_device_ids_unused"'),
     ["tensorrt_llm/config.pbtxt", "no gpu_device_ids"]),
    ("unfilled template",
     lambda b: _edit(_trt(b), 'string_value: "0,1" }', 'string_value: "${gpu_device_ids}" }'),
     ["tensorrt_llm/config.pbtxt", "unfilled template"]),
    ("two instances per pod",
     lambda b: _edit(_trt(b), 'string_value: "0,1" }', 'string_value: "0,1;2,3" }'),
     ["tensorrt_llm/config.pbtxt", "2 model instances"]),
    ("instance count 2",
     lambda b: _edit(_trt(b), "count: 1", "count: 2"),
     ["tensorrt_llm/config.pbtxt", "count is 2"]),
    ("batch size differs from the engine build",
     lambda b: _edit(_trt(b), "max_batch_size: 64", "max_batch_size: 128"),
     ["tensorrt_llm/config.pbtxt", "max_batch_size 128", "build.max_batch_size 64"]),
    ("engine path differs",
     lambda b: _edit(_trt(b), '"/engines/llama3-70b-fp8"', '"/engines/other"'),
     ["tensorrt_llm/config.pbtxt", "'/engines/other'", "'/engines/llama3-70b-fp8'"]),
    ("tokenizer path differs",
     lambda b: _edit(b.parent / "repository" / "postprocessing" / "config.pbtxt",
                     '"/tokenizer/llama3-70b-fp8"', '"/tok"'),
     ["postprocessing/config.pbtxt", "'/tok'", "'/tokenizer/llama3-70b-fp8'"]),
    ("syntax error",
     lambda b: _edit(_trt(b), "max_batch_size: 64", "max_batch_size 64 {"),
     ["tensorrt_llm/config.pbtxt", "not a valid Triton model config"]),
    ("name differs from directory",
     lambda b: _edit(_trt(b), 'name: "tensorrt_llm"', 'name: "trtllm"'),
     ["tensorrt_llm/config.pbtxt", "'trtllm'", "'tensorrt_llm'"]),
    ("ensemble calls a missing model",
     lambda b: _edit(_ens(b), 'model_name: "postprocessing"', 'model_name: "detokenize"'),
     ["ensemble/config.pbtxt", "'detokenize'"]),
    ("ensemble feeds a wrong data type",
     lambda b: _edit(_ens(b), 'name: "max_tokens"\n    data_type: TYPE_INT32', 'name: "max_tokens"\n    data_type: TYPE_FP32'),
     ["ensemble/config.pbtxt", "TYPE_FP32", "TYPE_INT32"]),
    ("ensemble reads a tensor nobody produces",
     lambda b: _edit(_ens(b), 'input_map { key: "TOKENS_BATCH" value: "_TOKENS_BATCH" }',
                     'input_map { key: "TOKENS_BATCH" value: "_TOKENS" }'),
     ["ensemble/config.pbtxt", "'_TOKENS'"]),
    ("served model missing",
     lambda b: _edit_manifest(b, lambda d: d["spec"].update(served_model="chat")),
     ["manifest.yaml", "'chat'"]),
    ("capacity missing for a GPU type",
     lambda b: _edit_manifest(b, lambda d: d["spec"]["gpu_types"].append("A100-80GB")),
     ["manifest.yaml", "A100-80GB"]),
    ("wrong kind",
     lambda b: _edit_manifest(b, lambda d: d.update(kind="ScalingPolicy")),
     ["manifest.yaml", "ModelBundle"]),
]


@pytest.mark.parametrize(("mutate", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mismatched_bundle_is_rejected(bundle: Path, mutate: Callable[[Path], None], expected: list[str]) -> None:
    load_bundle(bundle)  # the unmodified copy is fine
    mutate(bundle)
    with pytest.raises(BundleError) as err:
        load_bundle(bundle)
    for part in expected:
        assert part in str(err.value), f"{part!r} missing from: {err.value}"


def _trt_config(ids: str, count: int = 1) -> object:
    text = (f'name: "tensorrt_llm"\nbackend: "tensorrtllm"\nmax_batch_size: 8\n'
            f'instance_group [{{ count: {count} kind: KIND_CPU }}]\n'
            f'parameters {{ key: "gpu_device_ids" value {{ string_value: "{ids}" }} }}\n')
    return text_format.Parse(text, model_config_pb2.ModelConfig())


@given(st.lists(st.integers(min_value=0, max_value=15), min_size=1, max_size=16, unique=True))
def test_tp_degree_is_the_number_of_gpu_ids(ids: list[int]) -> None:
    cfg = _trt_config(",".join(map(str, ids)))
    assert tensor_parallel_degree(cfg, Path("config.pbtxt")) == len(ids)


@pytest.mark.parametrize("ids", ["0,0", "a,b", "0,1;2,3", ""])
def test_bad_gpu_device_ids(ids: str) -> None:
    with pytest.raises(BundleError, match="config.pbtxt"):
        tensor_parallel_degree(_trt_config(ids), Path("config.pbtxt"))


def test_bundle_to_model_config_feeds_the_daemon_config() -> None:
    path = BUNDLE / "manifest.yaml"
    manifest = load_manifest(path)
    entry = bundle_to_model_config(path)
    mc = ModelConfig.model_validate(entry)
    spec = mc.to_spec()
    assert spec.name == manifest.name
    assert spec.tp_degree == spec.gpus_per_replica == manifest.spec.gpus_per_replica
    assert spec.quantization == manifest.spec.quantization
    assert set(spec.gpu_types) == set(manifest.spec.gpu_types)
    for gpu, cap in manifest.spec.capacity.items():
        assert spec.capacity[gpu].output_tokens_per_s == cap.output_tokens_per_s
        assert spec.capacity[gpu].requests_per_s == cap.requests_per_s
    assert set(spec.pools) == set(manifest.spec.deployments)
    assert mc.bundle_manifest == path
    check_model_config(mc, manifest, path)
    # Pool names belong to the daemon config: a caller can substitute its own Deployments.
    other = bundle_to_model_config(manifest, deployments={"lab": {"namespace": "x", "name": "y"}})
    assert other["deployments"] == {"lab": {"namespace": "x", "name": "y"}}
    assert "bundle_manifest" not in other


@pytest.mark.parametrize(("change", "expected"), [
    ({"tp_degree": 4}, ["tp_degree 4", "tp_degree 2"]),
    ({"quantization": "int4-awq"}, ["'int4-awq'", "'fp8'"]),
    ({"gpu_types": ["A100-80GB"], "capacity": {"A100-80GB": {"output_tokens_per_s": 1, "requests_per_s": 1}}},
     ["A100-80GB", "H100-80GB"]),
    ({"name": "llama3-8b"}, ["'llama3-8b'", "'llama3-70b-fp8'"]),
])
def test_daemon_model_entry_must_agree_with_its_bundle(change: dict, expected: list[str]) -> None:
    path = BUNDLE / "manifest.yaml"
    manifest = load_manifest(path)
    mc = ModelConfig.model_validate({**bundle_to_model_config(path), **change})
    with pytest.raises(BundleError) as err:
        check_model_config(mc, manifest, path)
    for part in [*expected, "manifest.yaml"]:
        assert part in str(err.value)


def test_check_daemon_config_resolves_relative_to_the_config_file(tmp_path: Path) -> None:
    shutil.copy(BUNDLE / "manifest.yaml", tmp_path / "bundle.yaml")
    entry = {**bundle_to_model_config(BUNDLE / "manifest.yaml"), "bundle_manifest": "bundle.yaml",
             "deployments": {"p": {"name": "d"}}}
    pools = [{"name": "p", "kind": "onprem", "gpu_type": "H100-80GB", "gpus_per_node": 8, "max_nodes": 1,
              "price_per_node_hour_usd": 10}]
    cfg = DaemonConfig.model_validate({"pools": pools, "models": [entry]})
    check_daemon_config(cfg, tmp_path / "config.yaml")
    bad = DaemonConfig.model_validate({"pools": pools, "models": [{**entry, "tp_degree": 1}]})
    with pytest.raises(BundleError, match=re.escape(str(tmp_path / "bundle.yaml"))):
        check_daemon_config(bad, tmp_path / "config.yaml")


def test_manifest_schema_round_trips() -> None:
    manifest = load_manifest(BUNDLE / "manifest.yaml")
    again = BundleManifest.model_validate(manifest.model_dump(mode="json"))
    assert again == manifest
