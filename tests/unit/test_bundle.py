"""The bundle loader accepts the shipped bundle and rejects every kind of disagreement between the
manifest and the Triton model repository, with an error that names the file and both values."""

from __future__ import annotations

import itertools
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
    check_backend_parameters,
    check_daemon_config,
    check_model_config,
    load_backend_parameters,
    load_bundle,
    load_manifest,
    tensor_parallel_degree,
)
from controller.config import DaemonConfig, ModelConfig
from tests import pysource

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


def _repo(bundle: Path, model: str) -> Path:
    return bundle.parent / "repository" / model / "config.pbtxt"


def _drop_param(path: Path, key: str) -> None:
    """Remove one ``parameters { key: ... }`` block from a config.pbtxt."""
    text = path.read_text()
    new, n = re.subn(r'parameters \{\n(\s*#[^\n]*\n)*\s*key: "%s"\n\s*value: \{[^}]*\}\n\}\n' % re.escape(key), "", text)
    assert n == 1, f"no parameters block {key!r} in {path}"
    path.write_text(new)


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
    # What the pinned TensorRT-LLM backend reads (deploy/model/backend_parameters.yaml).
    *[(f"tensorrt_llm without {key} (read with no fallback)",
       (lambda k: lambda b: _drop_param(_trt(b), k))(key),
       ["tensorrt_llm/config.pbtxt", f"'{key}' (read at inflight_batcher_llm/src/model_instance_state.cc:{line})",
        f"Cannot find parameter with name: {key}", "25.06-trtllm-python-py3", "backend_parameters.yaml"])
      for key, line in (("tokenizer_dir", 413), ("xgrammar_tokenizer_info_path", 414),
                        ("guided_decoding_backend", 415), ("gpt_model_type", 62))],
    ("streaming input without the template's reshape",
     lambda b: _edit(_trt(b), 'dims: [ 1 ]\n    reshape: { shape: [ ] }\n    optional: true\n  }\n]',
                     'dims: [ 1 ]\n    optional: true\n  }\n]'),
     ["tensorrt_llm/config.pbtxt", "input 'streaming' has no reshape", "expects reshape: { shape: [] }",
      "all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt"]),
    ("input dims differ from the template",
     lambda b: _edit(_trt(b), 'name: "input_lengths"\n    data_type: TYPE_INT32\n    dims: [ 1 ]',
                     'name: "input_lengths"\n    data_type: TYPE_INT32\n    dims: [ -1 ]'),
     ["tensorrt_llm/config.pbtxt", "'input_lengths' has dims [-1]", "expects [1]"]),
    ("an input the template requires is missing",
     lambda b: (_edit(_ens(b), 'input_map { key: "request_output_len" value: "_REQUEST_OUTPUT_LEN" }\n', ""),
                _edit(_trt(b), '  {\n    name: "request_output_len"\n    data_type: TYPE_INT32\n    dims: [ 1 ]\n'
                      '    reshape: { shape: [ ] }\n  },\n', "")),
     ["tensorrt_llm/config.pbtxt", "input 'request_output_len' is missing"]),
    ("misspelt parameter (the backend would ignore it)",
     lambda b: _edit(_trt(b), '"kv_cache_free_gpu_mem_fraction"', '"kv_cache_free_gpu_memory_fraction"'),
     ["tensorrt_llm/config.pbtxt", "'kv_cache_free_gpu_memory_fraction' is not read", "no effect",
      "did you mean 'kv_cache_free_gpu_mem_fraction'"]),
    ("bool parameter that is not a bool",
     lambda b: _edit(_trt(b), 'key: "enable_kv_cache_reuse"\n  value: { string_value: "true" }',
                     'key: "enable_kv_cache_reuse"\n  value: { string_value: "yes" }'),
     ["tensorrt_llm/config.pbtxt", "'enable_kv_cache_reuse' is 'yes', not true or false", "model_instance_state.cc:170"]),
    ("scheduler policy the backend does not know",
     lambda b: _edit(_trt(b), '"guaranteed_no_evict"', '"guaranteed-no-evict"'),
     ["tensorrt_llm/config.pbtxt", "'guaranteed-no-evict'", "['max_utilization', 'guaranteed_no_evict']"]),
    ("guided decoding backend other than xgrammar",
     lambda b: _edit(_trt(b), 'key: "guided_decoding_backend"\n  value: { string_value: "" }',
                     'key: "guided_decoding_backend"\n  value: { string_value: "outlines" }'),
     ["tensorrt_llm/config.pbtxt", "'outlines'", "['', 'xgrammar']"]),
    ("unfilled template value",
     lambda b: _edit(_trt(b), 'string_value: "100" }', 'string_value: "${cancellation_check_period_ms}" }'),
     ["tensorrt_llm/config.pbtxt", "'cancellation_check_period_ms' is an unfilled template"]),
    ("preprocessing without tokenizer_dir",
     lambda b: _drop_param(_repo(b, "preprocessing"), "tokenizer_dir"),
     ["preprocessing/config.pbtxt", "'tokenizer_dir' (read at deploy/model/repository/preprocessing/1/model.py:21)",
      "python backend"]),
    ("image bumped without re-reading the backend",
     lambda b: _edit_manifest(b, lambda d: d["spec"]["runtime"].update(
         triton_image="nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3")),
     ["backend_parameters.yaml", "describes nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3",
      "pins nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3", "controller.backend_source"]),
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


# --- what the pinned backends read --------------------------------------------------------------

PARAMS = BUNDLE / "backend_parameters.yaml"


def _parameter_reads(model_py: Path) -> dict[str, tuple[bool, int]]:
    """What a bundle Python model reads from its config: name -> (required, line). ``params["x"]``
    fails without the key; ``params.get("x", ...)`` has a fallback."""
    import ast

    reads: dict[str, tuple[bool, int]] = {}
    for node in ast.walk(pysource.parse(model_py.read_text())):
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "params"
                and isinstance(node.slice, ast.Constant)):
            reads[node.slice.value] = (True, node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "params"):
            arg = node.args[0]
            assert isinstance(arg, ast.Constant)
            reads[arg.value] = (False, node.lineno)
    return reads


@pytest.mark.parametrize("model", ["preprocessing", "postprocessing"])
def test_python_models_read_what_the_list_says(model: str) -> None:
    """The list's entries for the bundle's own Python models are what their code reads, at the lines
    it names: a model.py edit that adds or drops a parameter fails here until the list follows."""
    spec = load_backend_parameters(PARAMS).models[model]
    model_py = BUNDLE / "repository" / model / "1" / "model.py"
    reads = _parameter_reads(model_py)
    assert reads, f"{model_py} reads no parameters?"
    listed = {k: (p.required, p.source) for k, p in spec.parameters.items()}
    assert listed == {k: (req, f"deploy/model/repository/{model}/1/model.py:{line}") for k, (req, line) in reads.items()}


def _tensor_names(model_py: Path) -> tuple[set[str], set[str]]:
    """Tensor names a Python model reads (get_input_tensor_by_name) and produces (pb_utils.Tensor)."""
    import ast

    read, produced = set(), set()
    for node in ast.walk(pysource.parse(model_py.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if node.func.attr == "get_input_tensor_by_name":
                read.update(args)
            elif node.func.attr == "Tensor":
                produced.update(args[:1])
    return read, produced


@pytest.mark.parametrize("model", ["preprocessing", "postprocessing"])
def test_python_models_use_the_tensors_their_config_declares(model: str) -> None:
    """The Python backend fails a request whose model reads an undeclared input or returns an
    undeclared output; every declared output must be produced for the ensemble's next step."""
    config = load_bundle(BUNDLE / "manifest.yaml").models[model].config
    read, produced = _tensor_names(BUNDLE / "repository" / model / "1" / "model.py")
    assert read and read <= {t.name for t in config.input}
    assert produced == {t.name for t in config.output}


def test_every_listed_source_is_a_file_and_line() -> None:
    params = load_backend_parameters(PARAMS)
    assert params.triton_image == load_manifest(BUNDLE / "manifest.yaml").spec.runtime.triton_image
    for model, spec in params.models.items():
        for key, p in spec.parameters.items():
            for src in [p.source] if isinstance(p.source, str) else p.source:
                assert re.fullmatch(r"[\w./-]+\.(cc|py):\d+(-\d+)?", src), (model, key, src)


_REQUIRED_TRT = sorted(k for k, p in load_backend_parameters(PARAMS).models["tensorrt_llm"].parameters.items()
                       if p.required)


@pytest.mark.parametrize("dropped", [set(c) for n in range(1, len(_REQUIRED_TRT) + 1)
                                     for c in itertools.combinations(_REQUIRED_TRT, n)], ids=str)
def test_any_missing_required_parameter_is_named(dropped: set[str]) -> None:
    """Whatever subset of the unguarded parameters is missing (all of them, exhaustively), the error
    names each of them with the line that reads it, and nothing else is blamed."""
    import dataclasses

    b = load_bundle(BUNDLE / "manifest.yaml")
    trt = b.models["tensorrt_llm"]
    config = model_config_pb2.ModelConfig()
    config.CopyFrom(trt.config)
    for key in dropped:
        del config.parameters[key]
    models = {**b.models, "tensorrt_llm": dataclasses.replace(trt, config=config)}
    with pytest.raises(BundleError) as err:
        check_backend_parameters(b.manifest, b.manifest_path, models, PARAMS)
    named = set(re.findall(r"'(\w+)' \(read at ", str(err.value)))
    assert named == dropped


def test_an_ensemble_step_must_request_the_outputs_the_backend_insists_on() -> None:
    import dataclasses

    b = load_bundle(BUNDLE / "manifest.yaml")
    ens = b.models["ensemble"]
    config = model_config_pb2.ModelConfig()
    config.CopyFrom(ens.config)
    step = next(s for s in config.ensemble_scheduling.step if s.model_name == "tensorrt_llm")
    del step.output_map["sequence_length"]
    models = {**b.models, "ensemble": dataclasses.replace(ens, config=config)}
    with pytest.raises(BundleError, match=r"ensemble/config.pbtxt: step 'tensorrt_llm' does not request output "
                                          r"'sequence_length'.*model_instance_state.cc:1079-1103"):
        check_backend_parameters(b.manifest, b.manifest_path, models, PARAMS)


# --- reading a backend checkout (controller.backend_source) ---------------------------------------

_CC = """\
// GetParameter<std::string>("in_a_comment") is not a read
void f()
{
    auto t = model_state_->GetParameter<std::string>("unguarded");
    try
    {
        x = model_state_->GetParameter<bool>("guarded");  // { unbalanced brace in a comment
    }
    catch (std::exception const& e)
    {
        TLLM_LOG_WARNING("guarded is not set, using } default");
    }
    std::string fieldName = "by_variable";
    try
    {
        n = model_state_->GetParameter<SizeType32>(fieldName);
    }
    catch (std::exception const& e)
    {
    }
    if (lookahead)
    {
        try
        {
            w = model_state_->GetParameter<uint32_t>("rethrown");
        }
        catch (std::exception const& e)
        {
            TLLM_THROW("rethrown is required");
        }
    }
}

template <>
int32_t ModelState::GetParameter<int32_t>(std::string const& name)
{
    return std::stoi(GetParameter<std::string>(name));
}
"""

_TEMPLATE = """\
name: "tensorrt_llm"
backend: "${triton_backend}"
max_batch_size: ${triton_max_batch_size}
dynamic_batching { preferred_batch_size: [ ${triton_max_batch_size} ] }
input [
  { name: "input_lengths" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } },
  { name: "draft_logits" data_type: ${logits_datatype} dims: [ -1, -1 ] optional: true }
]
output [ { name: "output_ids" data_type: TYPE_INT32 dims: [ -1, -1 ] } ]
parameters: { key: "tokenizer_dir" value: { string_value: "${tokenizer_dir}" } }
"""


def test_backend_source_tells_guarded_from_unguarded_reads(tmp_path: Path) -> None:
    from controller.backend_source import SOURCE_DIR, TEMPLATE, main, report

    (tmp_path / SOURCE_DIR).mkdir(parents=True)
    (tmp_path / SOURCE_DIR / "model_instance_state.cc").write_text(_CC)
    (tmp_path / TEMPLATE).parent.mkdir(parents=True)
    (tmp_path / TEMPLATE).write_text(_TEMPLATE)
    r = report(tmp_path)
    src = f"{SOURCE_DIR}/model_instance_state.cc"
    assert r["parameters"] == {
        "unguarded": {"required": True, "kind": "string", "source": [f"{src}:4"]},
        "guarded": {"required": False, "kind": "bool", "source": [f"{src}:7"]},
        "by_variable": {"required": False, "kind": "int", "source": [f"{src}:16"]},
        "rethrown": {"required": False, "kind": "int", "source": [f"{src}:25"], "catch_throws": True},
    }
    assert r["inputs"] == {
        "input_lengths": {"data_type": "TYPE_INT32", "dims": [1], "reshape": [], "optional": False},
        "draft_logits": {"data_type": "any", "dims": [-1, -1], "optional": True},
    }
    assert r["outputs"] == {"output_ids": {"data_type": "TYPE_INT32", "dims": [-1, -1]}}
    assert main([str(tmp_path)]) == 0
    assert main([str(tmp_path / "nothing")]) == 2
