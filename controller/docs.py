"""Reference tables, generated from the pydantic schemas, the signal table and the provider
registry (one schema, one truth).

``python -m controller.docs`` rewrites the marked sections of README.md; ``python
docs/gen_config.py`` writes docs/config.md, the config reference (:func:`config_reference`). Tests
fail when either drifts from the schemas.
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
from controller.core.model import Tier
from controller.core.spec import ScalingPolicy
from policies.promql import PromQL


def write_or_check(out: Path, text: str, check: bool, command: str) -> int:
    """What the generators (``docs/gen_config.py``, ``deploy/helm/gen_schema.py``,
    ``deploy/helm/gen_crd.py``) do with their text: write it to ``out``, or with ``check`` exit 1
    when the committed file differs, naming ``command`` to regenerate it."""
    if check:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: run `{command}` and commit the result", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


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


def _reachable(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[type[BaseModel]]:
    """``model`` and every model its fields hold, however deep."""
    seen = set() if seen is None else seen
    if model not in seen:
        seen.add(model)
        for field in model.model_fields.values():
            for sub in _models_in(field.annotation):
                _reachable(sub, seen)
    return seen


def _notice(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds:g} s"


def providers_section(registry: typing.Any) -> list[str]:
    """One row per installed pool provider kind (``providers.registry``), then the tables of the
    settings sections that the config schema does not already hold (a provider from a package)."""
    in_schema = _reachable(DaemonConfig)
    lines = ["| provider | tiers | spot interruption notice | settings | per pool | what it holds |",
             "| --- | --- | --- | --- | --- | --- |"]
    extra: list[str] = []
    for name in registry.names():
        kind = registry.get(name)
        tiers = ", ".join(t.value for t in sorted(kind.tiers, key=list(Tier).index))
        sections = []
        for cls, where in ((kind.Settings, f"providers.settings.{name}"), (kind.PoolSettings, f"pools[].{name}")):
            sections.append(f"`{where}`" if cls is not None else "none")
            if cls is not None and cls not in in_schema:
                extra += ["", f"### `{where}` ({name}, installed from a package)", "",
                          "\n".join(["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
                                    + fields_table(cls, f"{where}."))]
        lines.append(f"| `{name}` | {tiers} | {_notice(kind.interruption_notice_s)} | {sections[0]} | {sections[1]} | "
                     f"{kind.description} |")
    return lines + extra


def config_reference(registry: typing.Any) -> str:
    """docs/config.md: every field of the daemon config, and the installed pool providers."""
    return "\n".join([
        "# Configuration reference",
        "",
        "<!-- Generated by `python docs/gen_config.py` from controller/config.py and the installed pool "
        "providers; do not edit. -->",
        "",
        "`tidegate run --config FILE` reads a `DaemonConfig` YAML file; `tidegate config validate FILE` "
        "checks one and `tidegate config schema` prints its JSON Schema. The README's "
        "[Configuration](../README.md#configuration) section explains pools, tiers and providers; this page "
        "lists every field.",
        "",
        "## Every field",
        "",
        table(DaemonConfig),
        "",
        "## Pool providers",
        "",
        "The installed `tidegate.providers` entry points (providers/registry.py). A pool names one in "
        "`provider:`; its settings go under `providers.settings.NAME` and each of its pools' under "
        "`pools[].NAME`.",
        "",
        *providers_section(registry),
    ]) + "\n"


SECTIONS = {"policy-fields": lambda: table(ScalingPolicy), "signals": signals_table,
            "promql-params": lambda: table(PromQL.Params)}


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
