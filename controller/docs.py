"""Reference tables for the README, generated from the pydantic schemas and the signal table (one
schema, one truth).

``python -m controller.docs`` rewrites the marked sections of README.md; a test fails when the
README drifts from the schemas.
"""

from __future__ import annotations

import enum
import re
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from controller.config import DaemonConfig
from controller.core import signals as signal_table
from controller.core.spec import ScalingPolicy


def _type_name(tp: object) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (list, tuple, set):
        return f"list[{_type_name(args[0])}]" if args else "list"
    if origin is dict:
        return f"map[{_type_name(args[0])}, {_type_name(args[1])}]"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " \\| ".join(str(m.value) for m in tp)
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _models_in(tp: object) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    for a in typing.get_args(tp):
        found += _models_in(a)
    return found


def _default(field: typing.Any) -> str:
    if field.default is not PydanticUndefined:
        d = field.default
        if isinstance(d, enum.Enum):
            d = d.value
        if isinstance(d, BaseModel):
            return "(section)"
        return f"`{d!r}`" if d is not None else "`null`"
    if field.default_factory is not None:
        try:
            v = field.default_factory()
        except TypeError:
            return "(computed)"
        return "(section)" if isinstance(v, BaseModel) else f"`{v!r}`"
    return "**required**"


def fields_table(model: type[BaseModel], prefix: str = "") -> list[str]:
    rows: list[str] = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        subs = _models_in(field.annotation)
        desc = field.description or ((subs[0].__doc__ or "").strip().split("\n")[0] if subs else "")
        rows.append(f"| `{path}` | {_type_name(field.annotation)} | {_default(field)} | {desc} |")
        for sub in _models_in(field.annotation):
            is_list = typing.get_origin(field.annotation) in (list, tuple) or (
                typing.get_origin(field.annotation) in (typing.Union, types.UnionType) and
                any(typing.get_origin(a) in (list, tuple) for a in typing.get_args(field.annotation)))
            nested.append((f"{path}[]." if is_list else f"{path}.", sub))
    for sub_prefix, sub in nested:
        rows += fields_table(sub, sub_prefix)
    return rows


def table(model: type[BaseModel]) -> str:
    head = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    seen: set[str] = set()
    body = [r for r in fields_table(model) if not (r in seen or seen.add(r))]  # type: ignore[func-returns-value]
    return "\n".join(head + body)


def signals_table() -> str:
    """The signal table (``controller.core.signals``), one row per signal."""
    rows = ["| signal | unit | pools combine | meaning | when missing | default PromQL |",
            "| --- | --- | --- | --- | --- | --- |"]
    for s in signal_table.SIGNALS:
        query = "`" + s.promql.replace("|", "\\|") + "`" if s.promql else "none (computed)"
        where = "" if s.model_signal else " Per pool only, not a `ModelSignals` sample."
        rows.append(f"| `{s.name}` | {s.unit} | {s.combine.value} | {s.description}{where} | {s.missing} | {query} |")
    return "\n".join(rows)


SECTIONS = {"config-fields": lambda: table(DaemonConfig), "policy-fields": lambda: table(ScalingPolicy),
            "signals": signals_table}


def render_readme(text: str) -> str:
    for key, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- {key}:start -->\n)(?:.*?\n)?(<!-- {key}:end -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"README has no <!-- {key}:start --> ... <!-- {key}:end --> section")
        text = pattern.sub(lambda m: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    path = Path((argv or sys.argv[1:] or ["README.md"])[0])
    new = render_readme(path.read_text())
    path.write_text(new)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
