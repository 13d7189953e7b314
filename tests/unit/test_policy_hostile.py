"""Hostile and broken policy files: each is refused with one clear error naming the file, at a
bounded cost, without stalling the readers of the store; files outside the policies directory are
never read; a model keeps its last good policy whatever the files are called; `policy validate`
checks each path on its own."""

from __future__ import annotations

import io
import json
import os
import threading
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import field_validator

from controller.core.model import Recommendation
from controller.core.spec import MAX_REPLICAS
from controller.policyfile import (
    PolicyError,
    PolicyLimits,
    PolicyStore,
    load_policy_files,
    parse_policy_text,
    validate_files,
)
from policies.base import PolicyContext, PolicyKind, Registry, StrictParams
from policies.slo_guard import SloGuard
from tests.unit.hostile_files import SECRET, configmap_mount, laughs
from tests.unit.test_policyfile import policy

MODEL = "llama3-70b-fp8"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.from_entry_points()


def only_error(path: Path, registry: Registry, limits: PolicyLimits = PolicyLimits()) -> PolicyError:
    result = load_policy_files([path], registry, limits=limits)
    assert result.policies == {}
    (err,) = result.errors
    assert str(err).startswith(f"{path}:"), str(err)  # the file is named
    return err


def only_error_and_peak(path: Path, registry: Registry) -> tuple[PolicyError, int]:
    """``only_error``, and the peak of Python memory allocated meanwhile, bytes."""
    tracemalloc.start()
    try:
        err = only_error(path, registry)
        return err, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- limits: each refused with one clear error naming the file ---------------------------------------

HOSTILE = [
    # 111,110 strings behind 50 aliases: over the node limit (the old line map walked every one)
    pytest.param(policy(body="priority: 0\n") + "\n".join(f"# {i}" for i in range(3)) + "\n---\n" + laughs(5),
                 f"more than {PolicyLimits().max_nodes} YAML nodes (an alias counts as the nodes it stands for)",
                 id="laughs"),
    pytest.param("a: " + "[" * 5000 + "]" * 5000 + "\n", "nest deeper than 64 levels", id="deep"),
    pytest.param("a: &x [1, *x]\n", "alias *x is used inside the node it names", id="recursive"),
    pytest.param("a: &x [1]\nb: [" + ", ".join(["*x"] * 1001) + "]\n", "more than 1000 aliases", id="aliases"),
    pytest.param("a: " + "9" * 5000 + "\n", "ValueError: Exceeds the limit (4300 digits)", id="5000-digits"),
    pytest.param("a: 2026-13-45\n", "ValueError: month must be in 1..12", id="bad-date"),
]


@pytest.mark.parametrize("text,needle", HOSTILE)
def test_hostile_yaml_is_one_clear_error_naming_the_file(tmp_path: Path, registry: Registry,
                                                         text: str, needle: str) -> None:
    f = tmp_path / "hostile.yaml"
    f.write_text(text)
    err = only_error(f, registry)
    assert needle in err.message


def test_the_classic_billion_laughs_costs_little(tmp_path: Path, registry: Registry) -> None:
    f = tmp_path / "lol.yaml"
    f.write_text(laughs(9, 9))  # 9 ** 9 = 387,420,489 strings in under 500 bytes
    assert f.stat().st_size < 500
    err, peak = only_error_and_peak(f, registry)
    assert f"more than {PolicyLimits().max_nodes} YAML nodes" in err.message
    assert peak < 20 * 2**20, f"peak {peak} bytes"


def test_a_file_over_the_size_limit_is_refused_after_a_bounded_read(tmp_path: Path, registry: Registry) -> None:
    f = tmp_path / "big.yaml"
    with f.open("w") as out:  # 3 MiB of comments, then a valid policy
        line = "# " + "x" * 1021 + "\n"
        out.write(line * 3 * 1024 + policy())
    err, peak = only_error_and_peak(f, registry)
    assert err.message == (f"refused: the file is {f.stat().st_size} bytes, over the limit of 1048576 bytes "
                           "(policy_max_file_bytes in the daemon config); split it into smaller files")
    assert peak < 3 * 2**20, f"peak {peak} bytes: the whole file was read"


def test_the_size_limit_is_configurable(tmp_path: Path, registry: Registry) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(policy(body="priority: 0\n" + "# padding\n" * 300))
    assert load_policy_files([f], registry).ok
    err = only_error(f, registry, PolicyLimits(max_file_bytes=2048))
    assert "over the limit of 2048 bytes" in err.message


def test_no_exception_escapes_a_reload_and_the_error_is_in_the_status(tmp_path: Path, registry: Registry) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(policy())
    for param in HOSTILE:
        (tmp_path / f"{param.id}.yaml").write_text(param.values[0])
    store = PolicyStore(registry)
    report = store.reload(tmp_path)
    assert set(store.policies()) == {MODEL}  # the good file still loads
    status = store.status()
    json.dumps(status)
    assert status["ok"] is False and status["files"][str(good)]["ok"] is True
    for param in HOSTILE:
        (entry,) = status["files"][str(tmp_path / f"{param.id}.yaml")]["errors"]
        assert param.values[1] in entry["message"]
    assert len(report.errors) == len(HOSTILE)


# property: whatever YAML-ish text, a result with PolicyErrors and never an exception

FRAGMENTS = ["a: ", "b:\n", "- ", "  ", "\n", "[", "]", "{", "}", ", ", "&x ", "*x", "&y ", "*y", "<<: ",
             "!!str ", "!!python/object ", "? ", "|\n ", "'", '"', "#", "---\n", "...\n", "%YAML 1.1\n",
             "1e12", ".nan", ".inf", "-.inf", "0x1F", "0o17", "2026-13-45", "2026-11-23", "12:30:00",
             "9" * 4400, "null", "~", "true", "\t", "\x00", "\ufeff", "é"]
FIELDS = ["max_replicas", "min_replicas", "priority"]


@settings(max_examples=300, deadline=None)
@given(noise=st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join),
       field=st.sampled_from(FIELDS), as_value=st.booleans())
def test_any_text_loads_or_gives_policy_errors_never_an_exception(noise: str, field: str, as_value: bool) -> None:
    registry = Registry([SloGuard])
    text = (policy(body=f"bounds: {{{field}: {noise}}}\n") if as_value else noise)
    result = parse_policy_text("f.yaml", text, registry)
    assert all(isinstance(e, PolicyError) and e.file == "f.yaml" and e.message and "\n" not in str(e)
               for e in result.errors)
    assert result.documents == () or not result.opaque


# --- the schema's bounds ------------------------------------------------------------------------------

@pytest.mark.parametrize("body,path,needle", [
    ("bounds: {max_replicas: 1000000000000}\n", "spec.bounds.max_replicas", f"less than or equal to {MAX_REPLICAS}"),
    ("bounds: {max_replicas: 1.0e+12}\n", "spec.bounds.max_replicas", f"less than or equal to {MAX_REPLICAS}"),
    ("bounds: {max_replicas: 1e12}\n", "spec.bounds.max_replicas", "valid integer"),  # YAML 1.1: a string
    ("bounds: {min_replicas: 20000}\n", "spec.bounds.min_replicas", f"less than or equal to {MAX_REPLICAS}"),
    ("budget: {max_cost_per_hour_usd: .inf}\n", "spec.budget.max_cost_per_hour_usd", "finite number"),
    ("slo: {p99_latency_ms: .nan}\n", "spec.slo.p99_latency_ms", "finite number"),
    ("behavior: {scale_down: {stabilization_s: 1e9}}\n", "spec.behavior.scale_down.stabilization_s", "less than or equal to 604800"),
    ("priority: 10000000000000000000000\n", "spec.priority", "less than or equal to 1000000"),
    ("rules: [{kind: forecast, params: {max_replicas: 1000000}}]\n", "spec.rules[0].params.max_replicas", "less than or equal to 10000"),
    ("rules: [{kind: forecast, params: {history_s: 1e10}}]\n", "spec.rules[0].params.history_s", "less than or equal to 604800"),
    ("rules: [{kind: queue-depth, params: {target_per_replica: .inf}}]\n", "spec.rules[0].params.target_per_replica", "finite number"),
])
def test_absurd_numbers_are_rejected_with_a_clear_message(tmp_path: Path, registry: Registry,
                                                          body: str, path: str, needle: str) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(policy(body=body))
    err = only_error(f, registry)
    assert err.path == path and needle in err.message and err.line == 7, str(err)


# --- reading only inside the policies directory --------------------------------------------------------

def test_a_configmap_mount_loads(tmp_path: Path, registry: Registry) -> None:
    d = tmp_path / "policies"
    configmap_mount(d, {"llama.yaml": policy("llama"), "mistral.yaml": policy("mistral", model="mistral-7b-int8")})
    store = PolicyStore(registry)
    report = store.reload(d)
    assert report.ok, report.errors
    assert set(store.policies()) == {MODEL, "mistral-7b-int8"}
    assert store.policies()[MODEL].sources == (str(d / "llama.yaml"),)


@pytest.mark.parametrize("target_text", [SECRET + "\n", "kind: [" + SECRET + "\n", policy() + SECRET + "\n"])
def test_a_link_leaving_the_directory_is_refused_without_showing_the_target(
        tmp_path: Path, registry: Registry, target_text: str) -> None:
    secret = tmp_path / "elsewhere" / "credentials"
    secret.parent.mkdir()
    secret.write_text(target_text)
    d = tmp_path / "policies"
    configmap_mount(d, {"good.yaml": policy("good", model="mistral-7b-int8")})
    (d / "creds.yaml").symlink_to(secret)
    (d / "relative.yaml").symlink_to(Path("..") / "elsewhere" / "credentials")
    store = PolicyStore(registry)
    report = store.reload(d)
    assert set(store.policies()) == {"mistral-7b-int8"}
    assert {e.file for e in report.errors} == {str(d / "creds.yaml"), str(d / "relative.yaml")}
    for e in report.errors:
        assert e.message == (f"refused: a symbolic link that leads outside the policies directory {d} "
                             "(only files inside it are read; copy the file in)")
    shown = json.dumps(store.status()) + "".join(map(str, store.errors()))
    assert "wJalrXUtnFEMI" not in shown and "aws_secret" not in shown and str(secret) not in shown


def test_a_link_to_a_fifo_is_reported_not_opened_for_ever(tmp_path: Path, registry: Registry) -> None:
    os.mkfifo(tmp_path / ".pipe")
    (tmp_path / "pipe.yaml").symlink_to(".pipe")
    (err,) = load_policy_files(tmp_path, registry).errors
    assert (err.file, err.message) == (str(tmp_path / "pipe.yaml"), "cannot read the file: not a regular file")


# --- the last good policy, whatever the file names -----------------------------------------------------

@pytest.mark.parametrize("broken", [
    pytest.param("apiVersion: tidegate/v1\nkind: [\n", id="syntax-error"),
    pytest.param(policy("a", body="bounds: {min_replicas: 9, max_replicas: 3}\n"), id="invalid-spec"),
    pytest.param(policy("a", body="bounds: {max_replicas: 3}\n").replace("metadata:\n  name: a", "metadata: {}"),
                 id="no-name"),
    pytest.param(laughs(9, 9), id="billion-laughs"),
])
def test_renaming_a_good_file_to_a_broken_one_keeps_the_policy(tmp_path: Path, registry: Registry,
                                                               broken: str) -> None:
    a = tmp_path / "a.yaml"
    a.write_text(policy("a", body="bounds: {max_replicas: 24}\n"))
    store = PolicyStore(registry)
    store.reload(tmp_path)
    good = store.policies()[MODEL]
    a.rename(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").write_text(broken)
    report = store.reload(tmp_path)
    assert store.policies()[MODEL] is good
    assert report.kept_previous == (MODEL,) and report.removed == ()
    assert store.status()["models"][MODEL]["kept_previous"] is True
    # fixed under its new name: the new version comes into force
    (tmp_path / "b.yaml").write_text(policy("a", body="bounds: {max_replicas: 12}\n"))
    report = store.reload(tmp_path)
    assert report.ok and store.policies()[MODEL].spec.bounds.max_replicas == 12


def test_a_file_deleted_while_another_for_the_model_is_broken_keeps_the_policy(tmp_path: Path, registry: Registry) -> None:
    a = tmp_path / "a.yaml"
    a.write_text(policy("a", body="rules: [{kind: slo-guard}]\n"))
    c = tmp_path / "c.yaml"
    c.write_text(policy("c", body="budget: {max_cost_per_hour_usd: 100}\n"))
    store = PolicyStore(registry)
    store.reload(tmp_path)
    good = store.policies()[MODEL]
    c.write_text(policy("c", body="budget: {max_cost_per_hour_usd: -1}\n"))
    a.unlink()
    report = store.reload(tmp_path)
    assert store.policies()[MODEL] is good and report.kept_previous == (MODEL,)
    # once every file is clean, what the files say is what is in force: c.yaml alone
    c.write_text(policy("c", body="budget: {max_cost_per_hour_usd: 50}\n"))
    store.reload(tmp_path)
    assert store.policies()[MODEL].sources == (str(c),)


def test_a_model_named_by_no_file_in_a_clean_directory_loses_its_policy(tmp_path: Path, registry: Registry) -> None:
    (tmp_path / "a.yaml").write_text(policy("a"))
    m = tmp_path / "m.yaml"
    m.write_text(policy("m", model="mistral-7b-int8"))
    store = PolicyStore(registry)
    store.reload(tmp_path)
    m.unlink()
    (tmp_path / "junk.yaml").write_text("apiVersion: [\n")  # an unrelated broken file: keep it
    assert store.reload(tmp_path).kept_previous == ("mistral-7b-int8",)
    (tmp_path / "junk.yaml").unlink()  # everything clean: mistral was removed on purpose
    assert store.reload(tmp_path).removed == ("mistral-7b-int8",)
    assert set(store.policies()) == {MODEL}


# --- a reload never makes a reader wait ------------------------------------------------------------

class _Gate:
    entered = threading.Event()
    release = threading.Event()


class Slow(PolicyKind):
    """A kind whose params validation blocks until the test releases it: a reload stuck parsing."""

    name = "slow"
    description = "test kind"

    class Params(StrictParams):
        gate: str = "closed"

        @field_validator("gate")
        @classmethod
        def _wait(cls, v: str) -> str:
            _Gate.entered.set()
            _Gate.release.wait(30)
            return v

    def recommend(self, ctx: PolicyContext) -> Recommendation:  # pragma: no cover - never ticks
        raise NotImplementedError


def test_readers_do_not_wait_for_a_reload_that_is_parsing(tmp_path: Path) -> None:
    store = PolicyStore(Registry([SloGuard, Slow]))
    f = tmp_path / "a.yaml"
    f.write_text(policy())
    store.reload(tmp_path)
    before = store.policies()[MODEL]
    f.write_text(policy(body="rules: [{kind: slow, params: {gate: open}}]\n"))
    _Gate.entered.clear()
    _Gate.release.clear()
    reloading = threading.Thread(target=store.reload, args=(tmp_path,))
    reloading.start()
    try:
        assert _Gate.entered.wait(10), "the reload never started parsing"
        seen: dict[str, object] = {}
        reader = threading.Thread(target=lambda: seen.update(
            policies=store.policies(), status=store.status(), errors=store.errors()))
        reader.start()
        reader.join(2)
        assert not reader.is_alive(), "a reader waited for the reload"
        assert seen["policies"] == {MODEL: before} and seen["errors"] == []
    finally:
        _Gate.release.set()
        reloading.join(10)
    assert [r.name for r in store.policies()[MODEL].rules] == ["slow"]


# --- `tidegate policy validate`: each path on its own ------------------------------------------------

def test_validate_checks_each_path_on_its_own(tmp_path: Path, registry: Registry) -> None:
    # four teams' copies of one policy, in four folders: together they would clash (same
    # metadata.name, same rule names); each on its own is valid
    files = []
    for team in ("a", "b", "c", "d"):
        (tmp_path / team).mkdir()
        files.append(tmp_path / team / "policy.yaml")
        files[-1].write_text(policy("shared", body=f"bounds: {{max_replicas: {ord(team)}}}\n"))
    out = io.StringIO()
    assert validate_files(files, registry, out) == 0, out.getvalue()
    lines = out.getvalue().splitlines()
    assert [line.split(": OK: ")[0] for line in lines[:4]] == [str(f) for f in files]
    assert lines[-1] == "4 of 4 path(s) valid, each checked on its own"

    # a mix: each file gets its own result, the exit code says one failed
    files[1].write_text(policy("shared", body="bounds: {max_replicas: 1e12}\n"))
    out = io.StringIO()
    assert validate_files(files, registry, out) == 1
    text = out.getvalue()
    assert f"{files[1]}:7: spec.bounds.max_replicas: " in text
    assert f"{files[1]}: FAILED: 1 error(s) in 1 of 1 file(s)" in text
    for f in (files[0], files[2], files[3]):
        assert f"{f}: OK: 1 file(s), 1 document(s) valid" in text
    assert text.splitlines()[-1] == "3 of 4 path(s) valid, each checked on its own"


def test_validate_a_directory_still_merges_its_files(tmp_path: Path, registry: Registry) -> None:
    (tmp_path / "a.yaml").write_text(policy("same"))
    (tmp_path / "b.yaml").write_text(policy("same"))
    out = io.StringIO()
    assert validate_files([tmp_path], registry, out) == 1  # as the daemon would load them
    assert "metadata.name 'same' is already used by" in out.getvalue()


def test_the_laughs_helper_is_what_it_says() -> None:
    lol = yaml.safe_load(laughs(3, 4))  # PyYAML itself builds the shared structure cheaply
    assert len(lol["l2"]) == 4 and len(lol["l2"][0]) == 4 and lol["l2"][0][0] == ["lol"] * 4
