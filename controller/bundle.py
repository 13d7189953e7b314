"""Model bundles: the manifest the daemon reads and the Triton model repository it describes.

A bundle (``deploy/model/``) is what tidegate scales: a TensorRT-LLM engine, quantized and tensor
parallel, served by Triton as the usual ensemble (preprocessing -> tensorrt_llm -> postprocessing),
plus ``manifest.yaml`` (``apiVersion: tidegate/v1``, ``kind: ModelBundle``) that states the facts
the decision core needs: TP degree = GPUs per replica, GPU types with engines, cold start, and the
capacity of one replica per GPU type.

The manifest is the one source of truth for those facts: the daemon config's model entry points at
it (``ModelConfig.bundle_manifest``) and must agree with it (``check_model_config``), the simulator
builds its profile from it (``bundle_to_model_config``), and ``load_bundle`` parses every
``config.pbtxt`` with Triton's own protobuf schema and rejects a repository whose tensor-parallel
settings, batch size, paths or ensemble wiring disagree with the manifest, or that the pinned
image's backends could not load (``check_backend_parameters``, against the parameter list the
manifest names). ``check_engine_build_job`` holds each engine-build Job to the trtllm-build flags
its GPU generation supports and to offline, pre-staged calibration. Every error names the file and
both values, so the fix is obvious from the message.

How the TensorRT-LLM backend expresses tensor parallelism: ``config.pbtxt`` has no TP field (the
engine carries its mapping, and the multi-GPU launch starts one MPI rank per GPU). Its
``gpu_device_ids`` parameter lists the GPUs of each model instance (``"0,1"``; instances are
separated by ``;``). tidegate requires it to be set explicitly, so the repository itself states the
TP degree and a mismatch is caught before any GPU is involved.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, TypeVar

import yaml
from google.protobuf import text_format
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tritonclient.grpc import model_config_pb2

from controller.config import DaemonConfig, ModelConfig
from controller.errors import BundleError  # re-exported: raised here

TENSORRT_LLM_BACKEND = "tensorrtllm"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceSpec(_Strict):
    model: str = Field(description="Checkpoint the engines are built from, e.g. a Hugging Face id.")
    revision: str | None = Field(None, description="Checkpoint revision (commit) pinned for reproducible engines.")
    license: str | None = Field(None, description="License and access terms of the checkpoint.")


class BuildSpec(_Strict):
    max_batch_size: int = Field(gt=0, description="trtllm-build --max_batch_size; the tensorrt_llm config.pbtxt must use the same.")
    max_input_len: int = Field(gt=0, description="Longest prompt, tokens.")
    max_seq_len: int = Field(gt=0, description="Longest prompt plus completion, tokens.")
    max_num_tokens: int = Field(gt=0, description="Most tokens in one in-flight batch iteration.")
    calib_dataset: str | None = Field(
        None, description="Calibration data for quantization: a directory in the model store, as the build Jobs mount "
        "it, staged before the build (quantize.py --calib_dataset); the build never downloads one.")

    @model_validator(mode="after")
    def _lengths(self) -> "BuildSpec":
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(f"max_input_len ({self.max_input_len}) must be less than max_seq_len ({self.max_seq_len})")
        return self


class RuntimeSpec(_Strict):
    triton_image: str = Field(description="Triton image with the TensorRT-LLM backend that serves the engines.")
    tensorrt_llm_image: str | None = Field(None, description="TensorRT-LLM image that builds the engines (same TensorRT-LLM version as the Triton image).")
    engine_dir: str = Field(description="Path where a Triton pod mounts its GPU type's engine; tensorrt_llm's gpt_model_path.")
    tokenizer_dir: str = Field(description="Path where a Triton pod mounts the tokenizer; pre/postprocessing's tokenizer_dir.")
    backend_parameters: str | None = Field(
        None, description="What the pinned image's backends read from each config.pbtxt (a BackendParameters file, "
        "relative to the manifest); load_bundle checks the repository against it.")


class CapacitySpec(_Strict):
    output_tokens_per_s: float = Field(gt=0, description="Output tokens per second one replica sustains at the SLO.")
    requests_per_s: float = Field(gt=0, description="Requests per second one replica sustains at the SLO.")


class DeploymentSpec(_Strict):
    namespace: str = Field("default", description="Namespace of the pool's Triton Deployment.")
    name: str = Field(description="Name of the pool's Triton Deployment.")


class BundleSpec(_Strict):
    source: SourceSpec
    quantization: str = Field(description="Engine quantization: fp8, int8-weight-only, int4-awq, ...")
    quantization_detail: str | None = Field(None, description="How it was quantized (scales, calibration, KV cache).")
    tp_degree: int = Field(ge=1, le=16, description="Tensor-parallel degree of the engines.")
    gpus_per_replica: int = Field(ge=1, le=16, description="GPUs one replica (one Triton pod) takes; equals tp_degree.")
    gpu_types: list[str] = Field(min_length=1, description="GPU types engines are built for (one engine-build Job each).")
    cold_start_s: float = Field(ge=0, description="Pod start plus engine load until ready, seconds.")
    capacity: dict[str, CapacitySpec] = Field(description="Per GPU type: what one replica sustains at the SLO.")
    build: BuildSpec
    runtime: RuntimeSpec
    repository: str = Field("repository", description="Triton model repository, relative to the manifest.")
    served_model: str = Field("ensemble", description="The model clients call (the ensemble).")
    deployments: dict[str, DeploymentSpec] = Field(default_factory=dict, description="Per pool name: the Triton Deployment serving this bundle there.")

    @model_validator(mode="after")
    def _consistent(self) -> "BundleSpec":
        # A replica is one pod on one node: pipeline parallelism across pods is not modelled.
        if self.gpus_per_replica != self.tp_degree:
            raise ValueError(
                f"gpus_per_replica ({self.gpus_per_replica}) must equal tp_degree ({self.tp_degree})")
        missing = [g for g in self.gpu_types if g not in self.capacity]
        if missing:
            raise ValueError(f"capacity has no profile for gpu_types {missing} (has {sorted(self.capacity)})")
        extra = sorted(set(self.capacity) - set(self.gpu_types))
        if extra:
            raise ValueError(f"capacity has profiles {extra} for GPU types not in gpu_types {self.gpu_types}")
        return self


class BundleMetadata(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="Bundle name = the daemon config's model name.")
    labels: dict[str, str] = Field(default_factory=dict)


class BundleManifest(_Strict):
    """One YAML document: ``apiVersion: tidegate/v1``, ``kind: ModelBundle``."""

    apiVersion: Literal["tidegate/v1"]
    kind: Literal["ModelBundle"]
    metadata: BundleMetadata
    spec: BundleSpec

    @property
    def name(self) -> str:
        return self.metadata.name


@dataclass(frozen=True, slots=True)
class TritonModel:
    """One model of the repository, as parsed from its ``config.pbtxt``."""

    name: str
    config_path: Path
    config: Any
    """The parsed ``inference.ModelConfig`` protobuf message."""
    backend: str
    platform: str
    max_batch_size: int
    tp_degree: int | None
    """Tensor-parallel degree (GPUs per instance) for TensorRT-LLM models, else ``None``."""


@dataclass(frozen=True, slots=True)
class Bundle:
    manifest: BundleManifest
    manifest_path: Path
    repository: Path
    models: Mapping[str, TritonModel]


_Doc = TypeVar("_Doc", bound=BaseModel)


def _load_document(path: Path, schema: type[_Doc], kind: str) -> _Doc:
    """Read and validate one tidegate YAML document of ``kind``; errors name the file."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise BundleError(f"{path}: cannot read the {kind} file: {e}") from e
    except yaml.YAMLError as e:
        raise BundleError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise BundleError(f"{path}: expected a {kind} mapping, got {type(data).__name__}")
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise BundleError(f"{path}: invalid {kind}: {e}") from e


def load_manifest(path: Path | str) -> BundleManifest:
    """Read and validate a bundle manifest (``kind: ModelBundle``)."""
    return _load_document(Path(path), BundleManifest, "ModelBundle")


def parse_model_config(path: Path) -> Any:
    """Parse one ``config.pbtxt`` with Triton's ``ModelConfig`` protobuf (text format)."""
    try:
        return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    except text_format.ParseError as e:
        raise BundleError(f"{path}: not a valid Triton model config: {e}") from e


def _param(config: Any, key: str) -> str | None:
    return config.parameters[key].string_value if key in config.parameters else None


def tensor_parallel_degree(config: Any, path: Path) -> int:
    """GPUs per instance of a TensorRT-LLM model, from its ``gpu_device_ids`` parameter.

    One instance per pod: tidegate counts a pod as one replica of ``tp_degree`` GPUs, so several
    instances (``"0,1;2,3"`` or an instance_group count above 1) are rejected.
    """
    raw = _param(config, "gpu_device_ids")
    if raw is None or not raw.strip():
        raise BundleError(
            f"{path}: TensorRT-LLM model {config.name!r} has no gpu_device_ids parameter; tidegate needs "
            f"it to know the tensor-parallel degree (list the instance's GPUs, e.g. \"0,1\" for TP=2)")
    if "${" in raw:
        raise BundleError(f"{path}: gpu_device_ids is an unfilled template ({raw!r})")
    groups = [g for g in raw.split(";") if g.strip()]
    if len(groups) != 1:
        raise BundleError(
            f"{path}: gpu_device_ids {raw!r} declares {len(groups)} model instances; a tidegate replica is "
            f"one instance per pod (use one group of GPU ids)")
    try:
        ids = [int(x) for x in groups[0].split(",")]
    except ValueError as e:
        raise BundleError(f"{path}: gpu_device_ids {raw!r} is not a comma-separated list of GPU ids") from e
    if len(set(ids)) != len(ids):
        raise BundleError(f"{path}: gpu_device_ids {raw!r} repeats a GPU id")
    count = sum(g.count for g in config.instance_group) if config.instance_group else 1
    if count != 1:
        raise BundleError(
            f"{path}: instance_group count is {count}; a TensorRT-LLM model must have one instance per pod")
    return len(ids)


def _load_repository(repo: Path) -> dict[str, TritonModel]:
    if not repo.is_dir():
        raise BundleError(f"{repo}: the model repository does not exist")
    models: dict[str, TritonModel] = {}
    for cfg_path in sorted(repo.glob("*/config.pbtxt")):
        config = parse_model_config(cfg_path)
        dirname = cfg_path.parent.name
        if config.name and config.name != dirname:
            raise BundleError(f"{cfg_path}: model name {config.name!r} differs from its directory {dirname!r}")
        if not any(p.is_dir() and p.name.isdigit() for p in cfg_path.parent.iterdir()):
            raise BundleError(f"{cfg_path.parent}: no numeric version directory (e.g. 1/); Triton would not load it")
        tp = tensor_parallel_degree(config, cfg_path) if config.backend == TENSORRT_LLM_BACKEND else None
        models[dirname] = TritonModel(
            name=dirname, config_path=cfg_path, config=config, backend=config.backend,
            platform=config.platform, max_batch_size=config.max_batch_size, tp_degree=tp)
    if not models:
        raise BundleError(f"{repo}: no */config.pbtxt found")
    return models


def _dtype(t: Any) -> str:
    return model_config_pb2.DataType.Name(t.data_type)


def _check_ensemble(ens: TritonModel, models: Mapping[str, TritonModel]) -> None:
    """The ensemble's steps exist, every mapped tensor exists with the same data type, every tensor
    a step reads was produced before it, and every ensemble output is produced."""
    path = ens.config_path
    available = {t.name: _dtype(t) for t in ens.config.input}
    for i, step in enumerate(ens.config.ensemble_scheduling.step):
        target = models.get(step.model_name)
        if target is None:
            raise BundleError(f"{path}: step {i} calls model {step.model_name!r}, which is not in the repository {sorted(models)}")
        if target.max_batch_size < ens.max_batch_size:
            raise BundleError(
                f"{path}: ensemble max_batch_size {ens.max_batch_size} exceeds {step.model_name!r}'s "
                f"{target.max_batch_size} ({target.config_path})")
        inputs = {t.name: _dtype(t) for t in target.config.input}
        outputs = {t.name: _dtype(t) for t in target.config.output}
        for key, value in step.input_map.items():
            if key not in inputs:
                raise BundleError(f"{path}: step {step.model_name!r} maps input {key!r}, which {target.config_path} does not declare")
            if value not in available:
                raise BundleError(f"{path}: step {step.model_name!r} reads {value!r}, which no earlier step or ensemble input provides")
            if available[value] != inputs[key]:
                raise BundleError(
                    f"{path}: step {step.model_name!r} feeds {value!r} ({available[value]}) into {key!r} ({inputs[key]})")
        for key, value in step.output_map.items():
            if key not in outputs:
                raise BundleError(f"{path}: step {step.model_name!r} maps output {key!r}, which {target.config_path} does not declare")
            available[value] = outputs[key]
    for out in ens.config.output:
        if out.name not in available:
            raise BundleError(f"{path}: ensemble output {out.name!r} is produced by no step")
        if available[out.name] != _dtype(out):
            raise BundleError(f"{path}: ensemble output {out.name!r} is {_dtype(out)} but its step produces {available[out.name]}")


def check_repository(manifest: BundleManifest, manifest_path: Path, models: Mapping[str, TritonModel]) -> None:
    """Cross-check the parsed repository against the manifest."""
    spec = manifest.spec
    trt = [m for m in models.values() if m.backend == TENSORRT_LLM_BACKEND]
    if not trt:
        raise BundleError(f"{manifest_path}: the repository has no {TENSORRT_LLM_BACKEND!r} model (models: {sorted(models)})")
    for m in trt:
        if m.tp_degree != spec.tp_degree or m.tp_degree != spec.gpus_per_replica:
            raise BundleError(
                f"{m.config_path}: gpu_device_ids {_param(m.config, 'gpu_device_ids')!r} give tensor-parallel degree "
                f"{m.tp_degree}, but {manifest_path} says tp_degree {spec.tp_degree} and gpus_per_replica "
                f"{spec.gpus_per_replica}")
        if m.max_batch_size != spec.build.max_batch_size:
            raise BundleError(
                f"{m.config_path}: max_batch_size {m.max_batch_size} differs from the engine's build.max_batch_size "
                f"{spec.build.max_batch_size} in {manifest_path}")
        engine = _param(m.config, "gpt_model_path")
        if engine != spec.runtime.engine_dir:
            raise BundleError(
                f"{m.config_path}: gpt_model_path {engine!r} differs from runtime.engine_dir "
                f"{spec.runtime.engine_dir!r} in {manifest_path}")
    for m in models.values():
        tok = _param(m.config, "tokenizer_dir")
        if tok is not None and tok != spec.runtime.tokenizer_dir:
            raise BundleError(
                f"{m.config_path}: tokenizer_dir {tok!r} differs from runtime.tokenizer_dir "
                f"{spec.runtime.tokenizer_dir!r} in {manifest_path}")
    served = models.get(spec.served_model)
    if served is None:
        raise BundleError(f"{manifest_path}: served_model {spec.served_model!r} is not in the repository {sorted(models)}")
    for m in models.values():
        if m.platform == "ensemble":
            _check_ensemble(m, models)


# --- what the pinned backends read ----------------------------------------------------------------

ParameterKind = Literal["string", "bool", "int", "float", "int_list", "nested_int_list"]

# GetParameter<bool> accepts True/true/TRUE/1 and False/false/FALSE/0 (the TensorRT-LLM backend's
# model_state.cc); the bundle's Python models compare the lower-cased value with "true", so "1" would
# mean false there: only the spellings both read alike are accepted.
_BOOLS = {"True", "true", "TRUE", "False", "false", "FALSE"}
_KIND_CHECKS: dict[str, tuple[str, Any]] = {
    "bool": ("true or false", lambda v: v in _BOOLS),
    "int": ("an integer", lambda v: re.fullmatch(r"-?\d+", v) is not None),
    "float": ("a number", lambda v: re.fullmatch(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", v) is not None),
    "int_list": ("comma-separated integers", lambda v: re.fullmatch(r"-?\d+(,-?\d+)*", v) is not None),
    "nested_int_list": ("a list like {0,1},{0,2}", lambda v: re.fullmatch(r"[{}\d,\s]+", v) is not None),
}


class ParameterSpec(_Strict):
    required: bool = Field(description="Read with no fallback: without it the model fails to load.")
    kind: ParameterKind = Field(description="What the value must parse as; another value is ignored or fails.")
    source: str | list[str] = Field(description="Where the backend reads it (file:line in the backend source).")
    values: list[str] | None = Field(None, description="The accepted values, where another is ignored or fails.")
    catch_throws: bool = Field(False, description="Read in a try whose catch throws: required whenever that code runs.")


class TensorSpec(_Strict):
    data_type: str = Field(description="TYPE_*, or 'any' where the template leaves it to a variable.")
    dims: list[int]
    reshape: list[int] | None = Field(None, description="The template's reshape (an empty list: a scalar per request).")
    optional: bool = Field(False, description="Inputs: the template marks it optional.")
    required: bool = Field(False, description="Outputs: the backend fails a request that does not ask for it.")
    source: str | None = None


class ModelParameters(_Strict):
    backend: str | None = None
    platform: str | None = None
    template: str | None = Field(None, description="The backend's template this entry's tensors come from.")
    required_one_of: list[list[str]] = Field(default_factory=list, description="Groups of which one must be set.")
    parameters: dict[str, ParameterSpec]
    inputs: dict[str, TensorSpec] = Field(default_factory=dict, description="Empty: the model's tensors are not checked.")
    outputs: dict[str, TensorSpec] = Field(default_factory=dict)


class BackendParameters(_Strict):
    """One YAML document: ``apiVersion: tidegate/v1``, ``kind: BackendParameters``."""

    apiVersion: Literal["tidegate/v1"]
    kind: Literal["BackendParameters"]
    triton_image: str = Field(description="The image whose backends this list describes; must be the manifest's.")
    tensorrt_llm_version: str
    source: dict[str, str] = Field(description="Which tag and commit each part was read from.")
    models: dict[str, ModelParameters]


def load_backend_parameters(path: Path) -> BackendParameters:
    return _load_document(path, BackendParameters, "BackendParameters")


def _tensor_row(t: Any) -> tuple[str, list[int], list[int] | None]:
    return _dtype(t), [int(d) for d in t.dims], [int(d) for d in t.reshape.shape] if t.HasField("reshape") else None


def _check_tensors(m: TritonModel, spec: ModelParameters, where: str, what: str) -> None:
    declared = {t.name: t for t in (m.config.input if what == "input" else m.config.output)}
    table = spec.inputs if what == "input" else spec.outputs
    if not table:
        return
    template = spec.template or "the template"
    for name, t in declared.items():
        want = table.get(name)
        if want is None:
            raise BundleError(f"{m.config_path}: {what} {name!r} is not an {what} of {where} ({template} declares {sorted(table)})")
        dtype, dims, reshape = _tensor_row(t)
        if want.data_type != "any" and dtype != want.data_type:
            raise BundleError(f"{m.config_path}: {what} {name!r} is {dtype}; {where} expects {want.data_type} ({template})")
        if dims != want.dims:
            raise BundleError(f"{m.config_path}: {what} {name!r} has dims {dims}; {where} expects {want.dims} ({template})")
        if reshape != want.reshape:
            shown = "no reshape" if reshape is None else f"reshape {reshape}"
            expected = "no reshape" if want.reshape is None else f"reshape: {{ shape: {want.reshape} }}"
            raise BundleError(f"{m.config_path}: {what} {name!r} has {shown}; {where} expects {expected} ({template})")
    for name, want in table.items():
        if name not in declared and ((what == "input" and not want.optional) or (what == "output" and want.required)):
            raise BundleError(
                f"{m.config_path}: {what} {name!r} is missing; {where} requires it ({want.source or template})")


def _check_parameters(m: TritonModel, spec: ModelParameters, where: str, list_path: Path) -> None:
    present = {k: v.string_value for k, v in m.config.parameters.items()}
    missing = [(k, p) for k, p in spec.parameters.items() if p.required and k not in present]
    if missing:
        names = ", ".join(f"{k!r} (read at {p.source})" for k, p in missing)
        first = missing[0][0]
        raise BundleError(
            f"{m.config_path}: missing parameter{'s' if len(missing) > 1 else ''} {names}: {where} reads "
            f"{'them' if len(missing) > 1 else 'it'} with no fallback, so the model fails to load with "
            f"\"Cannot find parameter with name: {first}\"; add each as parameters {{ key: \"{first}\" "
            f"value: {{ string_value: \"...\" }} }} (what each means: {list_path})")
    for group in spec.required_one_of:
        if not any(k in present and present[k] for k in group):
            raise BundleError(f"{m.config_path}: set one of the parameters {group}; {where} needs one of them")
    for key, value in present.items():
        p = spec.parameters.get(key)
        if p is None:
            close = difflib.get_close_matches(key, list(spec.parameters), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise BundleError(
                f"{m.config_path}: parameter {key!r} is not read by {where}, so it has no effect{hint}; "
                f"the parameters it reads are in {list_path}")
        if "${" in value:
            raise BundleError(f"{m.config_path}: parameter {key!r} is an unfilled template value ({value!r})")
        if p.kind in _KIND_CHECKS:
            expected, ok = _KIND_CHECKS[p.kind]
            if not ok(value):
                raise BundleError(
                    f"{m.config_path}: parameter {key!r} is {value!r}, not {expected}; {where} would ignore it "
                    f"or fail ({p.source})")
        if p.values is not None and value not in p.values:
            raise BundleError(
                f"{m.config_path}: parameter {key!r} is {value!r}; {where} accepts {p.values} ({p.source})")


def check_backend_parameters(
    manifest: BundleManifest, manifest_path: Path, models: Mapping[str, TritonModel], list_path: Path,
) -> None:
    """Every model of the repository against what the pinned image's backend reads (see
    ``deploy/model/backend_parameters.yaml``): required parameters set, no parameter it does not
    read, values of the right kind, tensors declared as the backend's template declares them, and
    the outputs the backend insists on requested by every ensemble step that calls the model."""
    params = load_backend_parameters(list_path)
    image = manifest.spec.runtime.triton_image
    if params.triton_image != image:
        raise BundleError(
            f"{list_path}: describes {params.triton_image}, but {manifest_path} pins {image}; read the backend "
            f"source of the new version (python -m controller.backend_source) and update the list")
    for name, m in models.items():
        spec = params.models.get(name)
        if spec is None:
            raise BundleError(f"{m.config_path}: model {name!r} has no entry in {list_path} (it has {sorted(params.models)})")
        kind = f"backend {m.backend!r}" if m.backend else f"platform {m.platform!r}"
        if (spec.backend or None) != (m.backend or None) or (spec.platform or None) != (m.platform or None):
            raise BundleError(f"{m.config_path}: {kind} differs from the {list_path} entry for {name!r}")
        where = f"the {m.backend or m.platform} {kind.split()[0]} of {image} (TensorRT-LLM {params.tensorrt_llm_version})"
        _check_parameters(m, spec, where, list_path)
        _check_tensors(m, spec, where, "input")
        _check_tensors(m, spec, where, "output")
    for ens in (m for m in models.values() if m.platform == "ensemble"):
        for step in ens.config.ensemble_scheduling.step:
            spec = params.models.get(step.model_name)
            for out, want in (spec.outputs.items() if spec else ()):
                if want.required and out not in step.output_map:
                    raise BundleError(
                        f"{ens.config_path}: step {step.model_name!r} does not request output {out!r}, which the "
                        f"backend fails a request without ({want.source})")


# --- engine-build Jobs: flags per GPU generation, calibration from the model store ----------------

_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
"""Set in every container that quantizes or builds: the Hugging Face libraries then read only what
is on disk and fail instead of downloading (a checkpoint, a tokenizer or calibration data)."""

# quantize.py picks its calibration set by name (TensorRT-LLM's quantize_by_modelopt
# get_calib_dataloader): "pileval" and anything containing one of these is fetched from a hub or a URL.
_HUB_DATASET_NAMES = ("cnn_dailymail", "scienceqa", "science_qa")


class FlagRule(_Strict):
    generations: list[str] = Field(min_length=1, description="GPU generations the flag may be turned on for.")
    off_values: list[str] = Field(default_factory=list, description="Values that turn the flag off (allowed everywhere).")
    source: str = Field(description="Where the restriction is documented.")


class GpuTypeSpec(_Strict):
    generation: str
    sm: int = Field(description="CUDA compute capability x10 (90 = sm_90).")


class GpuBuildFlags(_Strict):
    """One YAML document: ``apiVersion: tidegate/v1``, ``kind: GpuBuildFlags``."""

    apiVersion: Literal["tidegate/v1"]
    kind: Literal["GpuBuildFlags"]
    gpu_types: dict[str, GpuTypeSpec]
    quantization: dict[str, FlagRule] = Field(description="Per manifest quantization: the generations that run it.")
    flags: dict[str, FlagRule] = Field(description="trtllm-build flags limited to some generations.")


def load_gpu_build_flags(path: Path) -> GpuBuildFlags:
    return _load_document(path, GpuBuildFlags, "GpuBuildFlags")


def command_flags(script: str, program: str) -> dict[str, str] | None:
    """The ``--flag value`` arguments of the first ``program`` command in a shell script (``None``
    when it does not run it); a flag without a value maps to ``""``."""
    for line in re.sub(r"\\\n", " ", script).splitlines():
        if program not in line:
            continue
        tokens = shlex.split(line, comments=True)
        at = next((i for i, t in enumerate(tokens) if t == program or t.endswith("/" + program)), None)
        if at is None:
            continue
        flags: dict[str, str] = {}
        args = tokens[at + 1:]
        for i, tok in enumerate(args):
            if tok in ("&&", "||", ";", "|"):
                break
            if tok.startswith("--"):
                nxt = args[i + 1] if i + 1 < len(args) else ""
                flags[tok] = "" if nxt.startswith("--") or nxt in ("&&", "||", ";", "|") else nxt
        return flags
    return None


def check_engine_build_job(job: Mapping[str, Any], manifest: BundleManifest, table: GpuBuildFlags, where: str) -> None:
    """One engine-build Job: every trtllm-build flag is valid for the generation of the GPU the Job
    builds for, the bundle's quantization runs there, and nothing it runs can reach a model hub:
    the Hugging Face libraries are offline and quantize.py calibrates on the manifest's
    pre-staged ``build.calib_dataset``."""
    gpu = job.get("metadata", {}).get("labels", {}).get("tidegate.io/gpu-type")
    gen = table.gpu_types.get(gpu) if gpu else None
    if gen is None:
        raise BundleError(f"{where}: label tidegate.io/gpu-type {gpu!r} is not in the GPU table ({sorted(table.gpu_types)})")
    quant = table.quantization.get(manifest.spec.quantization)
    if quant is None or gen.generation not in quant.generations:
        raise BundleError(
            f"{where}: {gpu} ({gen.generation}, sm_{gen.sm}) cannot run {manifest.spec.quantization} engines"
            + (f" ({quant.source})" if quant else ""))
    pod = job["spec"]["template"]["spec"]
    calib = manifest.spec.build.calib_dataset
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        script = " ".join([*c.get("command", []), *c.get("args", [])])
        build = command_flags(script, "trtllm-build")
        quantize = command_flags(script, "quantize.py")
        if build is None and quantize is None:
            continue
        name = f"{where}: container {c['name']!r}"
        for flag, value in (build or {}).items():
            rule = table.flags.get(flag)
            if rule is not None and gen.generation not in rule.generations and value not in rule.off_values:
                raise BundleError(
                    f"{name}: trtllm-build {flag} {value} is not supported on {gpu} ({gen.generation}, sm_{gen.sm}); "
                    f"only on {rule.generations} ({rule.source})")
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        unset = [f"{k}={v}" for k, v in _OFFLINE_ENV.items() if env.get(k) != v]
        if unset:
            raise BundleError(f"{name} may download from a model hub: set {', '.join(unset)} in its env")
        if quantize is not None:
            dataset = quantize.get("--calib_dataset")
            if dataset is None:
                raise BundleError(
                    f"{name}: quantize.py without --calib_dataset calibrates on its default, a Hugging Face "
                    f"dataset; pass the pre-staged build.calib_dataset ({calib})")
            if calib is None or dataset != calib:
                raise BundleError(f"{name}: --calib_dataset {dataset!r} differs from the manifest's build.calib_dataset {calib!r}")
            mounts = [m["mountPath"] for m in c.get("volumeMounts", [])]
            if (not dataset.startswith("/") or dataset == "pileval"
                    or any(n in dataset.lower() for n in _HUB_DATASET_NAMES)
                    or not any(dataset.startswith(m.rstrip("/") + "/") for m in mounts)):
                raise BundleError(
                    f"{name}: --calib_dataset {dataset!r} must be a directory on a mounted volume (the model store) "
                    f"and must not contain {list(_HUB_DATASET_NAMES)}, which quantize.py fetches from the hub")


def load_bundle(manifest_path: Path | str) -> Bundle:
    """Load the manifest and its repository and check that they agree; raise ``BundleError``."""
    manifest_path = Path(manifest_path)
    manifest = load_manifest(manifest_path)
    repo = (manifest_path.parent / manifest.spec.repository).resolve()
    models = _load_repository(repo)
    check_repository(manifest, manifest_path, models)
    if manifest.spec.runtime.backend_parameters is not None:
        check_backend_parameters(
            manifest, manifest_path, models, manifest_path.parent / manifest.spec.runtime.backend_parameters)
    return Bundle(manifest=manifest, manifest_path=manifest_path, repository=repo, models=models)


def bundle_to_model_config(
    manifest: BundleManifest | Path | str,
    *,
    deployments: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """The daemon config's model entry for a bundle (a dict ``ModelConfig.model_validate`` accepts).

    Given a path, the entry also points back at it (``bundle_manifest``). ``deployments`` replaces
    the manifest's per-pool Deployments (pool names are the daemon config's).
    """
    path: Path | None = None
    if not isinstance(manifest, BundleManifest):
        path = Path(manifest)
        manifest = load_manifest(path)
    spec = manifest.spec
    deps = deployments if deployments is not None else {p: d.model_dump() for p, d in spec.deployments.items()}
    entry: dict[str, Any] = {
        "name": manifest.name,
        "tp_degree": spec.tp_degree,
        "quantization": spec.quantization,
        "gpu_types": list(spec.gpu_types),
        "cold_start_s": spec.cold_start_s,
        "capacity": {g: c.model_dump() for g, c in spec.capacity.items()},
        "deployments": {p: dict(d) for p, d in deps.items()},
    }
    if path is not None:
        entry["bundle_manifest"] = str(path)
    return entry


def check_model_config(model: ModelConfig, manifest: BundleManifest, manifest_path: Path | str) -> None:
    """A daemon-config model entry must agree with its bundle: same name, TP, quantization, and only
    GPU types the bundle has engines for."""
    spec = manifest.spec
    where = f"model {model.name!r} (bundle {manifest_path})"
    if model.name != manifest.name:
        raise BundleError(f"{where}: name {model.name!r} differs from the bundle's metadata.name {manifest.name!r}")
    if model.tp_degree != spec.tp_degree:
        raise BundleError(f"{where}: tp_degree {model.tp_degree} differs from the bundle's tp_degree {spec.tp_degree}")
    if model.quantization != spec.quantization:
        raise BundleError(f"{where}: quantization {model.quantization!r} differs from the bundle's {spec.quantization!r}")
    unknown = [g for g in model.gpu_types if g not in spec.gpu_types]
    if unknown:
        raise BundleError(f"{where}: gpu_types {unknown} have no engine in the bundle (it has {spec.gpu_types})")


def check_daemon_config(config: DaemonConfig, config_path: Path | str) -> None:
    """Check every model entry that references a bundle manifest (relative paths are relative to
    the config file). Only the manifest is read: the daemon's pod has no model repository."""
    base = Path(config_path).parent
    for model in config.models:
        if model.bundle_manifest is None:
            continue
        path = model.bundle_manifest if model.bundle_manifest.is_absolute() else base / model.bundle_manifest
        check_model_config(model, load_manifest(path), path)
