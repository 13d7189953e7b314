"""The canonical YAML a policy version hashes is the same text whichever emitter writes it: the
fast C emitter is used only for documents where it provably agrees with PyYAML's (short plain
strings, shallow nesting), so a policy's version never depends on whether libyaml is installed."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.policyfile import _canonical, _short_and_plain

pytestmark = pytest.mark.skipif(not getattr(yaml, "__with_libyaml__", False), reason="PyYAML without libyaml")

plain = st.one_of(st.text("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 ._:/@*+-", min_size=1, max_size=24),
                  st.text("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789._:/@*+-", min_size=20, max_size=100))
scalars = st.one_of(plain, st.integers(), st.floats(allow_nan=False), st.booleans(), st.none(),
                    st.sampled_from(["yes", "no", "on", "null", "~", "1e3", "0x1F", "12:30", "2026-01-01",
                                     "*/5 * * * *", "@daily", "- x", "a: b", " lead", "trail "]))
docs = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(plain, inner, max_size=5)), max_leaves=40)


def pyyaml(data: Any) -> str:
    return str(yaml.dump(data, Dumper=yaml.SafeDumper, sort_keys=True, default_flow_style=False, allow_unicode=True))


@settings(max_examples=400)
@given(doc=st.dictionaries(plain, docs, min_size=1, max_size=6))
def test_the_fast_emitter_writes_pyyamls_text_whenever_it_is_used(doc: dict[str, Any]) -> None:
    assert _canonical(doc) == pyyaml(doc)


def test_documents_the_emitters_disagree_on_take_pyyamls() -> None:
    # where libyaml folds or escapes differently: long strings, tabs and newlines, empty keys
    for doc in ({"a": "x y" * 40}, {"a": "x" * 101}, {"a": "tab\there\nline"}, {"": 1}, {"a": "q\"uote"}):
        assert not _short_and_plain(doc)
        assert _canonical(doc) == pyyaml(doc)
