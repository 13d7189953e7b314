"""The engine-build Jobs use only trtllm-build flags the GPU they build for supports (checked
against deploy/model/gpu_build_flags.yaml, which names its sources), and never reach a model hub
while quantizing or building: the Hugging Face libraries are offline and calibration reads the
pre-staged directory the manifest names."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from controller.bundle import BundleError, check_engine_build_job, command_flags, load_gpu_build_flags, load_manifest

MODEL = Path(__file__).resolve().parents[2] / "deploy" / "model"
MANIFEST = load_manifest(MODEL / "manifest.yaml")
TABLE = load_gpu_build_flags(MODEL / "gpu_build_flags.yaml")


def _jobs() -> dict[str, dict[str, Any]]:
    jobs = {}
    for path in sorted((MODEL / "k8s").glob("engine-build-*.yaml")):
        (job,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
        jobs[job["metadata"]["labels"]["tidegate.io/gpu-type"]] = job
    return jobs


JOBS = _jobs()


def _containers(job: dict[str, Any]) -> list[dict[str, Any]]:
    pod = job["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def _script(job: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in _containers(job) if c["name"] == name)


def test_every_gpu_type_of_the_bundle_has_a_generation_and_a_job() -> None:
    assert set(MANIFEST.spec.gpu_types) <= set(TABLE.gpu_types)
    assert set(JOBS) == set(MANIFEST.spec.gpu_types)


@pytest.mark.parametrize("gpu", sorted(JOBS))
def test_shipped_jobs_pass(gpu: str) -> None:
    check_engine_build_job(JOBS[gpu], MANIFEST, TABLE, f"engine-build ({gpu})")


def test_the_calibration_path_is_in_the_model_store_the_jobs_mount() -> None:
    calib = MANIFEST.spec.build.calib_dataset
    assert calib is not None and calib.startswith("/store/calib/")
    quantize = command_flags(" ".join(_script(JOBS["H100-80GB"], "quantize")["args"]), "quantize.py")
    assert quantize is not None and quantize["--calib_dataset"] == calib


def _set_build_flag(flag: str, value: str) -> Callable[[dict[str, Any]], None]:
    def mutate(job: dict[str, Any]) -> None:
        c = _script(job, "build")
        c["args"] = [c["args"][0].replace("trtllm-build \\\n", f"trtllm-build {flag} {value} \\\n", 1)]
    return mutate


def _drop_env(container: str, name: str) -> Callable[[dict[str, Any]], None]:
    def mutate(job: dict[str, Any]) -> None:
        c = _script(job, container)
        c["env"] = [e for e in c["env"] if e["name"] != name]
    return mutate


def _edit_script(container: str, old: str, new: str) -> Callable[[dict[str, Any]], None]:
    def mutate(job: dict[str, Any]) -> None:
        c = _script(job, container)
        assert old in c["args"][0]
        c["args"] = [c["args"][0].replace(old, new)]
    return mutate


# (gpu, mutation, substrings the error must contain)
CASES: list[tuple[str, str, Callable[[dict[str, Any]], None], list[str]]] = [
    ("L40S", "FP8 context FMHA on Ada (the issue's L40S Job)", _set_build_flag("--use_fp8_context_fmha", "enable"),
     ["'build'", "--use_fp8_context_fmha enable is not supported on L40S (ada, sm_89)", "perf-best-practices.md"]),
    ("L40S", "FP8 GEMM+SwiGLU fusion on Ada", _set_build_flag("--gemm_swiglu_plugin", "fp8"),
     ["--gemm_swiglu_plugin fp8 is not supported on L40S", "['hopper']"]),
    ("L40S", "build without offline datasets", _drop_env("build", "HF_DATASETS_OFFLINE"),
     ["'build' may download from a model hub", "HF_DATASETS_OFFLINE=1"]),
    ("H100-80GB", "quantize without --calib_dataset (its default is a hub dataset)",
     _edit_script("quantize", "--calib_dataset /store/calib/llama3-70b-fp8 \\\n", ""),
     ["'quantize'", "without --calib_dataset", "Hugging Face dataset", "/store/calib/llama3-70b-fp8"]),
    ("H100-80GB", "calibration from a hub dataset name",
     _edit_script("quantize", "--calib_dataset /store/calib/llama3-70b-fp8", "--calib_dataset cnn_dailymail"),
     ["'cnn_dailymail' differs from the manifest's build.calib_dataset"]),
    ("H100-80GB", "quantize online", _drop_env("quantize", "HF_HUB_OFFLINE"),
     ["'quantize' may download from a model hub", "HF_HUB_OFFLINE=1"]),
    ("H100-80GB", "unknown GPU type label",
     lambda j: j["metadata"]["labels"].update({"tidegate.io/gpu-type": "A100-80GB"}),
     ["'A100-80GB' is not in the GPU table"]),
]


@pytest.mark.parametrize(("gpu", "mutate", "expected"), [c[:1] + c[2:] for c in CASES], ids=[c[1] for c in CASES])
def test_bad_jobs_are_rejected(gpu: str, mutate: Callable[[dict[str, Any]], None], expected: list[str]) -> None:
    job = copy.deepcopy(JOBS[gpu])
    mutate(job)
    with pytest.raises(BundleError) as err:
        check_engine_build_job(job, MANIFEST, TABLE, f"engine-build ({gpu})")
    for part in expected:
        assert part in str(err.value), f"{part!r} missing from: {err.value}"


def test_fp8_context_fmha_stays_allowed_on_hopper_and_off_is_allowed_everywhere() -> None:
    for gpu, value in (("H100-80GB", "enable"), ("L40S", "disable")):
        job = copy.deepcopy(JOBS[gpu])
        if "--use_fp8_context_fmha" not in (command_flags(_script(job, "build")["args"][0], "trtllm-build") or {}):
            _set_build_flag("--use_fp8_context_fmha", value)(job)
        check_engine_build_job(job, MANIFEST, TABLE, gpu)


def test_a_calibration_path_outside_the_store_is_refused() -> None:
    manifest = MANIFEST.model_copy(update={"spec": MANIFEST.spec.model_copy(update={
        "build": MANIFEST.spec.build.model_copy(update={"calib_dataset": "/tmp/cnn_dailymail"})})})
    job = copy.deepcopy(JOBS["H100-80GB"])
    _edit_script("quantize", "--calib_dataset /store/calib/llama3-70b-fp8", "--calib_dataset /tmp/cnn_dailymail")(job)
    with pytest.raises(BundleError, match=r"must be a directory on a mounted volume .* must not contain \['cnn_dailymail'"):
        check_engine_build_job(job, manifest, TABLE, "engine-build (H100-80GB)")


@pytest.mark.parametrize(("script", "expected"), [
    ("trtllm-build --a 1 \\\n  --b \\\n  --c x && echo --d", {"--a": "1", "--b": "", "--c": "x"}),
    ("# trtllm-build --commented 1\necho hi", None),
    ("python3 /app/examples/quantize.py --calib_dataset /store/calib/x", {"--calib_dataset": "/store/calib/x"}),
])
def test_command_flags(script: str, expected: dict[str, str] | None) -> None:
    program = "quantize.py" if "quantize" in script else "trtllm-build"
    assert command_flags(script, program) == expected
