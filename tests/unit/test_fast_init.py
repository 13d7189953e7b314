"""``model.fast_init``: the hand-built ``__init__`` of the frozen dataclasses the pipeline builds
every decision behaves as the generated one (parameters, defaults, factories, repr, equality,
hashing, pickling, frozenness)."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from controller.core.model import History, Recommendation, Stage, fast_init


@dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: str = "x"
    c: dict[str, Any] = field(default_factory=dict)


@fast_init
@dataclass(frozen=True, slots=True)
class _Fast:
    a: int
    b: str = "x"
    c: dict[str, Any] = field(default_factory=dict)


def test_same_values_repr_and_signature_as_the_generated_init() -> None:
    cases: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((1,), {}), ((1, "y"), {}), ((), {"a": 2, "c": {"k": 1}}), ((3,), {"b": "z"})]
    for args, kw in cases:
        plain, fast = _Plain(*args, **kw), _Fast(*args, **kw)
        assert repr(fast).replace("_Fast", "_Plain") == repr(plain)
        assert dataclasses.astuple(fast) == dataclasses.astuple(plain)
    assert str(inspect.signature(_Fast)) == "(a, b='x', c=<factory>)"
    assert _Fast(1).c is not _Fast(1).c  # a fresh default per instance, as the factory gives


def test_equality_hashing_pickling_and_frozenness_stay_the_dataclass_s() -> None:
    s = Stage("bounds", 3, "WithinBounds", "3 within [1, 5]")
    assert s == Stage("bounds", 3, "WithinBounds", "3 within [1, 5]") and hash(s) == hash(Stage(*dataclasses.astuple(s)))
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.replicas = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        Stage("bounds")  # type: ignore[call-arg]
    assert History().rule_state == {} and History().rule_state is not History().rule_state
    assert Recommendation(rule="r", kind="k", replicas=1, reason="x").state == {}


def test_refuses_what_it_does_not_handle() -> None:
    @dataclass(frozen=True, slots=True)
    class WithPostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclass(frozen=True, slots=True)
    class KeywordOnly:
        a: int = field(kw_only=True)

    for cls in (WithPostInit, NotFrozen, KeywordOnly):
        with pytest.raises(TypeError):
            fast_init(cls)
