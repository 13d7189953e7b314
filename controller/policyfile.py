"""Policy files on disk: load, validate with line numbers, merge per model, version, hot-reload.

Operators edit ``ScalingPolicy`` YAML files (``controller.core.spec``); this module turns them into
one ``EffectivePolicy`` per model. It exists apart from the pure core because it reads files, and
because the rules about *files* live here:

* every problem is a ``PolicyError(file, line, path, message)``: ``path`` is the dotted field path
  (``spec.rules[0].params.target``) and ``line`` comes from the YAML node marks, so
  ``tidegate policy validate`` prints ``FILE:LINE: PATH: message`` like a compiler;
* several documents may configure one model (a team's rules, a platform-wide budget): rules are
  unioned, bounds intersected, the budget is the strictest per field, and ``behavior``,
  ``placement``, ``missing_data``, ``slo`` and ``capacity`` come from the highest-``priority`` document that sets
  them (a tie is an error, not a coin toss);
* a model's ``version`` is a content hash of its documents (canonical YAML, so comments and key
  order do not count), stored with every decision;
* ``PolicyStore`` keeps the last good policy of each model in force when an edit breaks it, exposes
  the errors for ``/v1/policies``, and leaves models whose files are fine alone;
* a file is untrusted input: it is read with a size limit, parsed by a loader that stops at
  ``PolicyLimits`` (nesting depth, nodes with aliases counted at their expanded size, aliases), read
  only from inside the policies directory, and whatever goes wrong becomes a ``PolicyError``; the
  store parses outside the lock its readers (the tick) take, so a slow file never stalls a tick.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import threading
import types
import typing
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping, NamedTuple, Protocol, Sequence, Union

import yaml  # type: ignore[import-untyped, unused-ignore]
from pydantic import BaseModel, ValidationError

from controller.core.policy import EffectivePolicy
from controller.core.spec import API_VERSION, Bounds, Budget, PolicySpec, ScalingPolicy, interned
from policies.base import PolicyKind, Registry, UnknownPolicyKind

__all__ = [
    "LoadResult",
    "PolicyError",
    "PolicyLimits",
    "PolicySource",
    "PolicyStore",
    "PolicyVersion",
    "ReloadReport",
    "expand_paths",
    "json_schema",
    "load_policy_files",
    "parse_policy_text",
    "validate_files",
]

logger = logging.getLogger("tidegate.policies")

POLICY_KIND = "ScalingPolicy"
YAML_SUFFIXES = (".yaml", ".yml")
PathLike = Union[str, "os.PathLike[str]"]
Loc = tuple[Union[str, int], ...]

_LOCS: dict[Loc, Loc] = {}
_LOCS_MAX = 8192
"""Field paths shared by every document's line map: the same ~40 paths recur in every policy
file (2.8 MB of tuples at 1,000 files otherwise). Bounded, so odd files cannot grow it."""


def _loc(path: Loc) -> Loc:
    if len(_LOCS) < _LOCS_MAX:
        return _LOCS.setdefault(path, path)
    return _LOCS.get(path, path)


_SHAPES: dict[tuple[Loc, ...], tuple[Loc, ...]] = {}
_SHAPES_MAX = 1024
"""The paths of a document's line map, in order, shared by documents of the same shape (bounded
like :data:`_LOCS`)."""


class _Lines(Mapping[Loc, int]):
    """A valid document's line map as it is kept (read only to place a merge error): its paths
    (a tuple shared by documents of the same shape) and their lines in an array, ~0.3 KB where the
    dict it is made from takes ~2.1 KB (tracemalloc, 1,000 policy files of bench/control_plane.py).
    Lookups scan the paths: they happen only when a file is wrong."""

    __slots__ = ("_paths", "_numbers")

    def __init__(self, lines: Mapping[Loc, int]) -> None:
        paths = tuple(lines)
        self._paths = _SHAPES.setdefault(paths, paths) if len(_SHAPES) < _SHAPES_MAX else _SHAPES.get(paths, paths)
        self._numbers = array("I", lines.values())

    def __getitem__(self, loc: Loc) -> int:
        try:
            return self._numbers[self._paths.index(loc)]
        except ValueError:
            raise KeyError(loc) from None

    def __iter__(self) -> Iterator[Loc]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


# Sections taken whole from the highest-priority document that sets them.
_PRIORITY_SECTIONS = ("slo", "behavior", "placement", "missing_data", "mode", "capacity")


# --------------------------------------------------------------------------------------------------
# values


@dataclass(frozen=True, slots=True)
class PolicyLimits:
    """How much of one policy file the loader reads and builds before it refuses the file.

    Policy files are small (the largest example, ``policies/examples/llama3-70b-slo.yaml``, is
    2,314 bytes, 138 YAML nodes and 7 levels deep); the limits make a hostile or broken file cost
    bounded time and memory instead of stalling the daemon (a "billion laughs" file of a few
    hundred bytes stands for 10^9 nodes)."""

    max_file_bytes: int = 1 << 20
    """Largest file read, bytes (the daemon config's ``policy_max_file_bytes``). At most one byte
    more is read to tell that a file is too large."""
    max_depth: int = 64
    """Deepest nesting of mappings and sequences."""
    max_nodes: int = 20_000
    """Most YAML nodes in one file, an alias counting as the nodes it stands for: what anything
    walking the loaded data (validation, the line map, the canonical dump) would visit."""
    max_aliases: int = 1_000
    """Most alias references (``*name``) in one file."""


@dataclass(frozen=True, slots=True)
class PolicyError:
    """One problem in one file, as precisely located as the YAML allows."""

    file: str
    line: int | None
    """1-based line; ``None`` when the file could not be read at all."""
    path: str
    """Dotted field path (``spec.bounds``, ``spec.rules[1].params.target``); empty for the file."""
    message: str
    model: str | None = None
    """The model the problem affects, when it can be told."""

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "path": self.path, "message": self.message,
                "model": self.model}


@dataclass(frozen=True)
class PolicyDocument:
    """One valid ``ScalingPolicy`` document, with its rules built."""

    file: str
    index: int
    """Position of the document in its file (multi-document YAML)."""
    line: int
    policy: ScalingPolicy
    rules: tuple[PolicyKind, ...]
    canonical: str
    """The document as canonical YAML (sorted keys, no comments): what the version hashes."""
    lines: Mapping[Loc, int]

    @property
    def model(self) -> str:
        return self.policy.spec.model

    def line_of(self, *loc: str | int) -> int:
        return _line_for(self.lines, loc, self.line)


@dataclass(frozen=True)
class FileResult:
    """What one file yielded: valid documents, errors, and which models it concerns."""

    file: str
    sha256: str
    documents: tuple[PolicyDocument, ...]
    errors: tuple[PolicyError, ...]
    models: frozenset[str]
    """Every model a document of this file names (valid or not)."""
    error_models: frozenset[str]
    """Models with an error in this file: they get no new policy from this load."""
    opaque: bool
    """Some error could not be tied to a model (unreadable file, YAML syntax error, a document
    without a readable ``spec.model``): every model this file fed before is suspect."""


class PolicyVersion(NamedTuple):
    """A policy version that was put in force, for the decision log's ``policy_versions`` table
    (a tuple: ``model, version, sources, canonical_yaml = v`` works)."""

    model: str
    version: str
    sources: tuple[str, ...]
    canonical_yaml: str


@dataclass(frozen=True)
class LoadResult:
    """The outcome of loading a set of files: a policy per model that is fully valid, and every
    error found."""

    policies: Mapping[str, EffectivePolicy]
    canonical: Mapping[str, str]
    """Per model: the canonical YAML text its version hashes."""
    errors: tuple[PolicyError, ...]
    files: tuple[FileResult, ...]
    failed_models: frozenset[str]
    """Models named by some document but given no policy because of an error."""

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def opaque_files(self) -> frozenset[str]:
        return frozenset(f.file for f in self.files if f.opaque)


# --------------------------------------------------------------------------------------------------
# YAML with line numbers


class _LimitExceeded(Exception):
    """A file went over one of the ``PolicyLimits`` while being composed."""

    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.message = message
        self.line: int | None = None if mark is None else mark.line + 1


# libyaml's event parser when PyYAML was built with it (the usual wheel), else PyYAML's own: the
# composer below stays PyYAML's Python one either way, so that every node passes through it.
_EventParser: Any
try:
    from yaml.cyaml import CParser as _EventParser  # type: ignore[attr-defined, import-untyped, unused-ignore]
except ImportError:  # pragma: no cover - a PyYAML built without libyaml
    _EventParser = type("_PyEventParser", (yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser), {})
_LIBYAML = _EventParser.__name__ == "CParser"


def _too_deep(limits: PolicyLimits) -> str:
    return f"mappings and sequences nest deeper than {limits.max_depth} levels; a policy needs far fewer"


class _BoundedLoader(yaml.composer.Composer, _EventParser, yaml.constructor.SafeConstructor,  # type: ignore[misc, unused-ignore]
                     yaml.resolver.Resolver):
    """PyYAML's safe loader, counting as it composes: nesting depth, alias references, and nodes
    with each alias counted at the size of the node it points to. It stops at the first limit
    passed, before anything walks the (possibly exponential) expanded data. A recursive alias
    (a node that contains an alias to itself) is refused: nothing downstream expects a cycle."""

    def __init__(self, text: str, limits: PolicyLimits) -> None:
        if _LIBYAML:
            _EventParser.__init__(self, text)
        else:
            yaml.reader.Reader.__init__(self, text)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._limits = limits
        self._depth = 0
        self._nodes = 0
        self._aliases = 0
        self._sizes: dict[int, tuple[Any, int]] = {}
        """id(anchored node) -> (the node, kept alive so its id stays unique; its expanded size)."""

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > self._limits.max_nodes:
            raise _LimitExceeded(
                f"the file holds more than {self._limits.max_nodes} YAML nodes (an alias counts as "
                "the nodes it stands for); a policy file needs far fewer: remove repeated aliases "
                "or split the file", mark)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > self._limits.max_aliases:
                raise _LimitExceeded(f"the file uses more than {self._limits.max_aliases} aliases "
                                     "(*name); write the values out or split the file",
                                     event.start_mark)
            target = self.anchors.get(event.anchor)
            if target is not None:  # an undefined alias is PyYAML's own error below
                sized = self._sizes.get(id(target))
                if sized is None:
                    raise _LimitExceeded(f"alias *{event.anchor} is used inside the node it names "
                                         "(a recursive structure); a policy cannot be recursive",
                                         event.start_mark)
                self._count(sized[1], event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > self._limits.max_depth:
            raise _LimitExceeded(_too_deep(self._limits), event.start_mark)
        before = self._nodes
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        if event.anchor is not None:
            self._sizes[id(node)] = (node, self._nodes - before)
        return node

    def compose_document(self) -> Any:
        node = super().compose_document()
        self._sizes.clear()  # anchors are per document
        return node


def _line_map(node: yaml.Node) -> tuple[dict[Loc, int], list[tuple[Loc, int, int]]]:
    """Field path -> 1-based line of its key (or sequence item), plus duplicate keys found as
    ``(path, line, first_line)`` (PyYAML would silently keep the last one).

    A node reached again through an alias is not walked again (fields under an alias are reported
    at the alias's line): the walk visits each node once, however often aliases repeat it."""
    lines: dict[Loc, int] = {(): node.start_mark.line + 1}
    dups: list[tuple[Loc, int, int]] = []
    walked: set[int] = set()
    stack: list[tuple[yaml.Node, Loc]] = [(node, ())]
    while stack:  # iterative: depth is bounded by the loader, but a stack costs nothing here
        n, path = stack.pop()
        if id(n) in walked:
            continue
        walked.add(id(n))
        children: list[tuple[yaml.Node, Loc]] = []
        if isinstance(n, yaml.MappingNode):
            seen: dict[str, int] = {}
            for k, v in n.value:
                if not isinstance(k, yaml.ScalarNode):
                    continue
                key = str(k.value)
                p = _loc(path + (key,))
                line = k.start_mark.line + 1
                if key in seen:
                    dups.append((p, line, seen[key]))
                    continue
                seen[key] = line
                lines[p] = line
                children.append((v, p))
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                p = _loc(path + (i,))
                lines[p] = item.start_mark.line + 1
                children.append((item, p))
        stack.extend(reversed(children))  # document order, as a recursive walk would go
    return lines, dups


def _line_for(lines: Mapping[Loc, int], loc: Sequence[str | int], default: int) -> int:
    """The line of ``loc``, or of its nearest ancestor present in the file (a missing key is
    reported at its parent)."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get((), default)


def format_path(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _short(value: Any, limit: int = 80) -> str:
    return _clip(repr(value), limit)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _model_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The pydantic model class found at ``loc`` under ``root`` (to list allowed keys)."""
    tp: Any = root
    for part in loc:
        tp = _unwrap(tp, part)
        if tp is None:
            return None
    tp = _unwrap(tp, None)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp: Any, part: str | int | None) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0], part)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            if arg is not type(None):
                found = _unwrap(arg, part)
                if found is not None:
                    return found
        return None
    if part is None:
        return tp
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        f = tp.model_fields.get(str(part))
        return None if f is None else f.annotation
    if origin in (tuple, list, set, frozenset) and isinstance(part, int):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return args[0] if args else None
    if origin is dict:
        return typing.get_args(tp)[1]
    return None


def _pydantic_errors(exc: ValidationError, root: type[BaseModel], file: str,
                     lines: Mapping[Loc, int], prefix: Loc, doc_line: int,
                     model: str | None, what: str = "") -> list[PolicyError]:
    """Translate pydantic errors into ``PolicyError``s with paths, lines and clear messages."""
    out = []
    raw = exc.errors(include_url=False)
    locs = [tuple(err["loc"]) for err in raw]
    for err in raw:
        loc: Loc = tuple(err["loc"])
        kind = err["type"]
        if kind == "too_short" and any(len(o) > len(loc) and o[: len(loc)] == loc for o in locs):
            # A list whose items failed also reports "too short" (the failed items do not count):
            # the item errors say what is wrong.
            continue
        if kind == "extra_forbidden":
            owner = _model_at(root, loc[:-1])
            allowed = f"; allowed: {', '.join(owner.model_fields)}" if owner else ""
            message = f"unknown key {loc[-1]!r} (extra fields not permitted{allowed})"
        elif kind == "missing":
            message = f"required key {loc[-1]!r} is missing"
        elif kind in ("value_error", "assertion_error"):
            message = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        else:
            value = err.get("input")
            shown = "" if isinstance(value, (dict, list)) else f" (got {_short(value)})"
            message = f"{err['msg']}{shown}"
        full = prefix + loc
        out.append(PolicyError(file, _line_for(lines, full, doc_line), format_path(full),
                               what + message, model))
    return out


_UNBROKEN = re.compile(r"[A-Za-z0-9._:/@*+-]{1,100}")
_SPACED = re.compile(r"[A-Za-z0-9 ._:/@*+-]{1,24}")
_FAST_DUMPER: Any = getattr(yaml, "CSafeDumper", None)


def _short_and_plain(data: Any, depth: int = 0) -> bool:
    """Whether every string (key or value) needs no escapes (only ``[A-Za-z0-9 ._:/@*+-]``) and
    cannot be folded: without a space (emitters fold at spaces) up to 100 characters, with spaces
    up to 24, nested at most 6 levels (12 columns of indent and two quoted strings of 26 stay
    within the 80-column fold). Escapes and folds are where libyaml's emitter and PyYAML's differ."""
    if depth > 6:
        return False
    if isinstance(data, str):
        return _UNBROKEN.fullmatch(data) is not None or _SPACED.fullmatch(data) is not None
    if isinstance(data, dict):
        return all(_short_and_plain(k, depth) and _short_and_plain(v, depth + 1) for k, v in data.items())
    if isinstance(data, list):
        return all(_short_and_plain(v, depth + 1) for v in data)
    return True


def _canonical(data: Any) -> str:
    """The document as canonical YAML (sorted keys, block style): what its version hashes. The C
    emitter (libyaml, ~5x faster: 1,000 policy files were 5.5 s of a start, issue 13) writes the
    same text as PyYAML's for documents of short plain strings (tests/unit/test_policyfile_canonical.py);
    any other document takes PyYAML's, so versions never change with the emitter."""
    dumper = _FAST_DUMPER if _FAST_DUMPER is not None and _short_and_plain(data) else yaml.SafeDumper
    return str(yaml.dump(data, Dumper=dumper, sort_keys=True, default_flow_style=False, allow_unicode=True))


# --------------------------------------------------------------------------------------------------
# parsing one file


def parse_policy_text(file: str, text: str, registry: Registry,
                      known_models: set[str] | frozenset[str] | None = None,
                      limits: PolicyLimits = PolicyLimits()) -> FileResult:
    """Parse and validate one file's text (every document in it). Pure: no file access.

    Never raises: whatever goes wrong (a limit, a syntax error, a value PyYAML cannot build such
    as a 5000-digit integer or the date 2026-13-45, anything) is a ``PolicyError``. A file with an
    error that cannot be tied to a model is *opaque* and yields no documents at all: a model is
    never given a policy built from part of a file."""
    sha = hashlib.sha256(text.encode()).hexdigest()
    docs: list[PolicyDocument] = []
    errors: list[PolicyError] = []
    models: set[str] = set()
    error_models: set[str] = set()
    opaque = False
    loader: _BoundedLoader | None = None
    index = 0
    doc_line: int | None = None
    try:
        loader = _BoundedLoader(text, limits)  # checks the characters: may raise ReaderError
        while loader.check_node():
            node = loader.get_node()
            if node is None:  # pragma: no cover - check_node said there is one
                break
            doc_line = node.start_mark.line + 1
            doc, doc_errors, model = _parse_document(file, index, node, loader, registry, known_models)
            index += 1
            if model is not None:
                models.add(model)
            if doc is not None:
                docs.append(doc)
            if doc_errors:
                errors.extend(doc_errors)
                if model is None:
                    opaque = True
                else:
                    error_models.add(model)
            doc_line = None
    except _LimitExceeded as e:
        errors.append(PolicyError(file, e.line, "", f"refused: {e.message}"))
        opaque = True
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        context = getattr(e, "context", None)
        detail = " ".join((f"{context}, {problem}" if context else str(problem)).split())  # one line
        if "maximum nesting depth" in detail:  # libyaml's own limit (1,000 levels in PyYAML 6.0.4's)
            detail = f"refused: {_too_deep(limits)}"
        else:
            detail = f"YAML syntax error: {detail}"
        errors.append(PolicyError(file, None if mark is None else mark.line + 1, "", detail))
        opaque = True
    except Exception as e:  # noqa: BLE001 - a file must never crash a reload, whatever it holds
        errors.append(PolicyError(file, doc_line, "", f"cannot load the document: "
                                  f"{type(e).__name__}: {_clip(str(e), 200)}"))
        opaque = True
    finally:
        if loader is not None:
            loader.dispose()
    if index == 0 and not errors:
        errors.append(PolicyError(file, 1, "", "the file holds no YAML document"))
        opaque = True
    return FileResult(file, sha, () if opaque else tuple(docs), tuple(errors), frozenset(models),
                      frozenset(error_models), opaque)


def _parse_document(file: str, index: int, node: yaml.Node, loader: yaml.SafeLoader,
                    registry: Registry, known_models: set[str] | frozenset[str] | None,
                    ) -> tuple[PolicyDocument | None, list[PolicyError], str | None]:
    lines, dups = _line_map(node)
    doc_line = lines[()]
    data = loader.construct_document(node)
    errors: list[PolicyError] = []
    spec_raw = data.get("spec") if isinstance(data, dict) else None
    model_raw = spec_raw.get("model") if isinstance(spec_raw, dict) else None
    model = model_raw if isinstance(model_raw, str) else None

    for path, line, first in dups:
        earlier = "earlier on the same line" if first == line else f"first at line {first}"
        errors.append(PolicyError(file, line, format_path(path),
                                  f"duplicate key {path[-1]!r} ({earlier})", model))
    if data is None:
        # An empty document (e.g. a trailing '---'): nothing to load, nothing wrong.
        return None, errors, model
    if not isinstance(data, dict):
        errors.append(PolicyError(file, doc_line, "", f"a policy document must be a mapping "
                                  f"(got {type(data).__name__})"))
        return None, errors, None

    api, kind = data.get("apiVersion"), data.get("kind")
    if api != API_VERSION:
        got = "it is missing" if api is None else f"got {_short(api)}"
        errors.append(PolicyError(file, _line_for(lines, ("apiVersion",), doc_line), "apiVersion",
                                  f"apiVersion must be {API_VERSION!r} ({got})", model))
    if kind != POLICY_KIND:
        got = "it is missing" if kind is None else f"got {_short(kind)}"
        errors.append(PolicyError(file, _line_for(lines, ("kind",), doc_line), "kind",
                                  f"kind must be {POLICY_KIND!r} ({got})", model))
    if api != API_VERSION or kind != POLICY_KIND:
        # Not a policy document (or not one we understand): checking its fields would only add
        # noise about a schema the author did not mean.
        return None, errors, model

    policy: ScalingPolicy | None = None
    try:
        policy = interned(ScalingPolicy.model_validate(data))
    except ValidationError as e:
        errors.extend(_pydantic_errors(e, ScalingPolicy, file, lines, (), doc_line, model))

    # Rule params are validated against their kind even when other fields failed (from the raw
    # data then), so that one run of `tidegate policy validate` shows every problem. When the
    # document is valid its rules come from the validated spec, which includes the default rule.
    rules: list[PolicyKind] = []
    raw_rules: Any
    if policy is not None:
        raw_rules = [r.model_dump() for r in policy.spec.rules]
    else:
        raw_rules = spec_raw.get("rules") if isinstance(spec_raw, dict) else None
    if isinstance(raw_rules, list):
        for i, raw in enumerate(raw_rules):
            if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str):
                continue  # the ScalingPolicy errors above already say what is wrong
            params = raw.get("params", {})
            if params is None:
                params = {}
            if not isinstance(params, dict):
                continue
            rule_name = raw.get("name") if isinstance(raw.get("name"), str) else None
            loc: Loc = ("spec", "rules", i)
            try:
                kind_cls = registry.get(raw["kind"])
            except UnknownPolicyKind as e:
                errors.append(PolicyError(file, _line_for(lines, loc + ("kind",), doc_line),
                                          format_path(loc + ("kind",)), str(e), model))
                continue
            try:
                rules.append(kind_cls(interned(kind_cls.Params.model_validate(params)), rule_name))
            except ValidationError as e:
                errors.extend(_pydantic_errors(
                    e, kind_cls.Params, file, lines, loc + ("params",), doc_line, model,
                    what=f"invalid params for kind {kind_cls.name!r}: "))

    if known_models is not None and model is not None and model not in known_models:
        known = ", ".join(sorted(known_models)) or "none configured"
        errors.append(PolicyError(file, _line_for(lines, ("spec", "model"), doc_line), "spec.model",
                                  f"unknown model {model!r} (known: {known})", model))

    if errors or policy is None:
        return None, errors, model
    doc = PolicyDocument(file, index, doc_line, policy, tuple(rules), _canonical(data), _Lines(lines))
    return doc, errors, model


# --------------------------------------------------------------------------------------------------
# assembling files into per-model policies


class _Source(NamedTuple):
    file: str
    root: str | None
    """The directory the file was listed from (it is read only if it resolves inside it); ``None``
    for a file named on its own, which is read wherever it is."""
    text: str | None = None
    """The document's text when it is not a file (a ScalingPolicy object from the cluster)."""


class PolicySource(Protocol):
    """Policy documents that are not files (``providers.kubeobjects``: ScalingPolicy objects),
    loaded by ``PolicyStore.reload`` beside the files under the same rules."""

    name: str
    """What an error about the source as a whole names (``ScalingPolicy objects``)."""

    def texts(self) -> Mapping[str, str]:
        """Document name (unique, shown as the error's file) -> its YAML text. Raises when the
        documents cannot be read: every policy then stays as it was."""
        ...

    def reloaded(self, errors: Sequence[PolicyError], policies: Mapping[str, EffectivePolicy]) -> None:
        """After each reload: the errors and the policies in force (to report them on the objects)."""
        ...


def _sources(paths: PathLike | Iterable[PathLike]) -> list[_Source]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: dict[str, _Source] = {}
    for p in paths:
        path = Path(p)
        if path.is_dir():
            # Hidden names are skipped: editor lock/backup files, and the ``..data`` machinery of
            # a mounted ConfigMap. Symbolic links are listed whatever they point to, so that one
            # leading outside the directory (or nowhere) is reported, not silently skipped.
            for c in sorted(path.iterdir()):
                if c.suffix in YAML_SUFFIXES and not c.name.startswith(".") and (
                        c.is_symlink() or c.is_file()):
                    out.setdefault(str(c), _Source(str(c), str(path)))
        else:
            out.setdefault(str(path), _Source(str(path), None))
    return list(out.values())


def expand_paths(paths: PathLike | Iterable[PathLike]) -> list[str]:
    """Files to read: each file as given, each directory's ``*.yaml``/``*.yml`` (not recursive,
    not hidden), in name order."""
    return [s.file for s in _sources(paths)]


class _Unreadable(Exception):
    """A file that is not read at all; the message is safe to show (it quotes nothing of the
    file's content, nor of a symbolic link's target)."""


def _read_text(src: _Source, max_bytes: int) -> str:
    """The file's text, read with a bounded read. A file listed from a directory is read only
    when its real path (every symbolic link followed, as a Kubernetes ConfigMap mount's
    ``name.yaml -> ..data/name.yaml`` and ``..data -> ..2026_...`` are) stays inside that
    directory; only regular files are read (a FIFO would block the reload forever)."""
    path = src.file
    if src.text is not None:
        if len(src.text.encode()) > max_bytes:
            raise _Unreadable(f"refused: the document is over the limit of {max_bytes} bytes "
                              "(policy_max_file_bytes in the daemon config)")
        return src.text
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    if src.root is not None:
        root = os.path.realpath(src.root)
        real = os.path.realpath(path)
        if os.path.commonpath([root, real]) != root:
            raise _Unreadable("refused: a symbolic link that leads outside the policies directory "
                              f"{src.root} (only files inside it are read; copy the file in)")
        path = real
        flags |= getattr(os, "O_NOFOLLOW", 0)  # the real path has no link left to follow
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise _Unreadable(f"cannot read the file: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _Unreadable("cannot read the file: not a regular file")
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise _Unreadable(f"cannot read the file: {e.strerror or e}") from None
    if len(data) > max_bytes:
        size = max(info.st_size, len(data))
        raise _Unreadable(f"refused: the file is {size} bytes, over the limit of {max_bytes} bytes "
                          "(policy_max_file_bytes in the daemon config); split it into smaller "
                          "files")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Unreadable(f"cannot read the file: not UTF-8 text (byte {e.start})") from None


def _load_source(src: _Source, registry: Registry, known_models: set[str] | frozenset[str] | None,
                 limits: PolicyLimits, cache: dict[str, FileResult] | None = None) -> FileResult:
    """Read and parse one file; ``cache`` (file -> last result) skips parsing unchanged text."""
    try:
        text = _read_text(src, limits.max_file_bytes)
    except _Unreadable as e:
        if cache is not None:
            cache.pop(src.file, None)
        return FileResult(src.file, "", (), (PolicyError(src.file, None, "", str(e)),),
                          frozenset(), frozenset(), True)
    if cache is not None:
        cached = cache.get(src.file)
        if cached is not None and cached.sha256 == hashlib.sha256(text.encode()).hexdigest():
            return cached
    result = parse_policy_text(src.file, text, registry, known_models, limits)
    if cache is not None:
        cache[src.file] = result
    return result


def load_policy_files(paths: PathLike | Iterable[PathLike], registry: Registry,
                      known_models: set[str] | frozenset[str] | None = None,
                      limits: PolicyLimits = PolicyLimits()) -> LoadResult:
    """Read, validate and merge policy files (directories expand to their YAML files)."""
    return _assemble([_load_source(s, registry, known_models, limits) for s in _sources(paths)])


def load_policy_text(file: str, text: str, registry: Registry,
                     known_models: set[str] | frozenset[str] | None = None) -> LoadResult:
    """``load_policy_files`` for one file's text already in hand (a policy sent to the API)."""
    return _assemble([parse_policy_text(file, text, registry, known_models)])


def _sort_key(doc: PolicyDocument) -> tuple[str, str, int]:
    return (os.path.basename(doc.file), doc.file, doc.index)


def _assemble(files: Sequence[FileResult]) -> LoadResult:
    errors: list[PolicyError] = [e for f in files for e in f.errors]
    failed: set[str] = set().union(*(f.error_models for f in files)) if files else set()

    # metadata.name is unique across every file: the first (in file name order) keeps it.
    names: dict[str, PolicyDocument] = {}
    docs = sorted((d for f in files for d in f.documents), key=_sort_key)
    for d in docs:
        name = d.policy.metadata.name
        first = names.get(name)
        if first is None:
            names[name] = d
            continue
        errors.append(PolicyError(
            d.file, d.line_of("metadata", "name"), "metadata.name",
            f"metadata.name {name!r} is already used by {first.file}:{first.line_of('metadata', 'name')}",
            d.model))
        failed.add(d.model)

    by_model: dict[str, list[PolicyDocument]] = {}
    for d in docs:
        by_model.setdefault(d.model, []).append(d)
    policies: dict[str, EffectivePolicy] = {}
    canonical: dict[str, str] = {}
    for model, model_docs in by_model.items():
        if model in failed:
            continue
        merged, merge_errors = _merge(model, model_docs)
        if merge_errors or merged is None:
            errors.extend(merge_errors)
            failed.add(model)
            continue
        policies[model], canonical[model] = merged
    return LoadResult(policies, canonical, tuple(errors), tuple(files), frozenset(failed))


def _where(d: PolicyDocument, *loc: str | int) -> str:
    return f"{d.file}:{d.line_of(*loc)}"


def _merge(model: str, docs: list[PolicyDocument],
           ) -> tuple[tuple[EffectivePolicy, str] | None, list[PolicyError]]:
    """Merge one model's documents (already in file-name order) into its effective policy."""
    errors: list[PolicyError] = []

    rules: list[PolicyKind] = []
    rule_specs = []
    seen_rules: dict[str, tuple[PolicyDocument, int]] = {}
    # Rules are the union over the documents that state rules; a document that says nothing about
    # rules (a budget-only file) adds no default rule. With none stating any, the default applies.
    rule_docs = [d for d in docs if "rules" in d.policy.spec.model_fields_set] or docs[:1]
    for d in rule_docs:
        for i, (spec, built) in enumerate(zip(d.policy.spec.rules, d.rules)):
            name = spec.name or spec.kind
            if name in seen_rules:
                od, oi = seen_rules[name]
                field_name = "name" if spec.name else "kind"
                errors.append(PolicyError(
                    d.file, d.line_of("spec", "rules", i, field_name), f"spec.rules[{i}].{field_name}",
                    f"rule name {name!r} is already defined in {_where(od, 'spec', 'rules', oi)} for "
                    f"model {model!r}; rule names must be unique across a model's files "
                    "(set a distinct 'name')", model))
                continue
            seen_rules[name] = (d, i)
            rules.append(built)
            rule_specs.append(spec)

    # Bounds: intersect, counting only the fields each document sets (defaults do not narrow).
    min_from: PolicyDocument | None = None
    max_from: PolicyDocument | None = None
    default_bounds = Bounds.model_validate({})
    min_r, max_r = default_bounds.min_replicas, default_bounds.max_replicas
    for d in docs:
        bounds = d.policy.spec.bounds
        if "bounds" not in d.policy.spec.model_fields_set:
            continue
        if "min_replicas" in bounds.model_fields_set and (min_from is None or bounds.min_replicas > min_r):
            min_r, min_from = bounds.min_replicas, d
        if "max_replicas" in bounds.model_fields_set and (max_from is None or bounds.max_replicas < max_r):
            max_r, max_from = bounds.max_replicas, d
    if min_r > max_r:
        culprit = max(
            (x for x in (min_from, max_from) if x is not None), key=_sort_key)
        min_where = _where(min_from, "spec", "bounds", "min_replicas") if min_from else "the default"
        max_where = _where(max_from, "spec", "bounds", "max_replicas") if max_from else "the default"
        errors.append(PolicyError(
            culprit.file, culprit.line_of("spec", "bounds"), "spec.bounds",
            f"the bounds of model {model!r} do not intersect: min_replicas ({min_r}, from {min_where}) "
            f"is greater than max_replicas ({max_r}, from {max_where})", model))

    # Budget: the strictest ceiling per field.
    budget_values: dict[str, float] = {}
    for d in docs:
        for fname, value in d.policy.spec.budget.model_dump().items():
            if value is not None:
                budget_values[fname] = min(value, budget_values.get(fname, value))

    # Whole sections from the highest-priority document that sets them.
    sections: dict[str, Any] = {}
    for section in _PRIORITY_SECTIONS:
        setters = [d for d in docs if section in d.policy.spec.model_fields_set]
        if not setters:
            continue
        top = max(d.policy.spec.priority for d in setters)
        winners = [d for d in setters if d.policy.spec.priority == top]
        if len(winners) > 1:
            first, second = winners[0], winners[1]
            errors.append(PolicyError(
                second.file, second.line_of("spec", section), f"spec.{section}",
                f"spec.{section} for model {model!r} is set by both {_where(first, 'spec', section)} "
                f"and {_where(second, 'spec', section)} at priority {top}; give one of them a higher "
                "spec.priority or remove one", model))
            continue
        sections[section] = getattr(winners[0].policy.spec, section)

    if errors:
        return None, errors

    merged: PolicySpec
    if len(docs) == 1:
        merged = docs[0].policy.spec
    else:
        merged = PolicySpec(
            model=model,
            priority=max(d.policy.spec.priority for d in docs),
            bounds=Bounds(min_replicas=min_r, max_replicas=max_r),
            rules=tuple(rule_specs),
            budget=Budget(**budget_values),
            adopt=any(d.policy.spec.adopt for d in docs),
            **sections,
        )
    text = "".join(
        f"---\n# source: {os.path.basename(d.file)} document {d.index}\n{d.canonical}" for d in docs
    )
    version = hashlib.sha256(text.encode()).hexdigest()[:16]
    sources = tuple(dict.fromkeys(d.file for d in docs))
    return (EffectivePolicy(model, merged, tuple(rules), version, sources), text), []


# --------------------------------------------------------------------------------------------------
# the store: last good version per model, hot reload


@dataclass(frozen=True)
class ReloadReport:
    """What one ``PolicyStore.reload`` did."""

    changed: bool
    """False when no file changed since the last reload (nothing was re-parsed)."""
    new_versions: tuple[PolicyVersion, ...] = ()
    """Versions put in force by this reload: the daemon records each with its hash."""
    removed: tuple[str, ...] = ()
    """Models whose every policy document is gone: no policy is in force for them any more."""
    kept_previous: tuple[str, ...] = ()
    """Models with errors whose previous good version stays in force."""
    errors: tuple[PolicyError, ...] = ()
    """Every problem in the files as this reload found them; empty when nothing changed since
    the previous reload (``PolicyStore.errors()`` always has the current ones)."""

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass
class _State:
    policies: dict[str, EffectivePolicy] = field(default_factory=dict)
    errors: tuple[PolicyError, ...] = ()
    files: dict[str, FileResult] = field(default_factory=dict)
    kept_previous: frozenset[str] = frozenset()
    failed: frozenset[str] = frozenset()


class PolicyStore:
    """The policies in force, per model, with hot reload that never makes things worse.

    ``reload`` is cheap when nothing changed: files are read and hashed (they are small), and
    parsed only when their hash changed. (Not ``stat``-based: a rewrite within the file system's
    timestamp granularity would go unseen.) A model keeps its last good version until a valid one
    for it appears, whatever the files are called: a model with any error, fed before by a file
    that can no longer be read or parsed, or left without documents while some file's errors
    cannot be tied to a model (a file renamed and broken at once), keeps its previous version.
    Only when every file is clean does a model that no file names any more lose its policy.

    Thread-safe: the reload job and the API may call it concurrently. Reloads take turns on a
    lock of their own and read, parse and merge without the lock the readers (the tick) take;
    the readers' lock only guards the swap to the new state, so a slow or hostile file never
    makes a tick wait.
    """

    def __init__(self, registry: Registry, known_models: set[str] | frozenset[str] | None = None,
                 limits: PolicyLimits = PolicyLimits()) -> None:
        self._registry = registry
        self._known = None if known_models is None else frozenset(known_models)
        self._limits = limits
        self._lock = threading.Lock()
        """Guards ``_state`` and ``_versions``: held only to read them or to swap in new ones."""
        self._reload_lock = threading.Lock()
        """One reload at a time; guards ``_cache``, ``_fingerprint`` and ``_seen``."""
        self._cache: dict[str, FileResult] = {}
        self._state = _State()
        self._fingerprint: tuple[tuple[str, str], ...] | None = None
        self._versions: list[PolicyVersion] = []
        self._seen: set[tuple[str, str]] = set()
        self._extra: list[PolicySource] = []

    def add_source(self, source: PolicySource) -> None:
        """Load ``source``'s documents at every reload, beside the files (same validation,
        merging, versions and last-good rules)."""
        with self._reload_lock:
            self._extra.append(source)
            self._fingerprint = None

    # --- reading ---

    def policies(self) -> dict[str, EffectivePolicy]:
        with self._lock:
            return dict(self._state.policies)

    def get(self, model: str) -> EffectivePolicy | None:
        with self._lock:
            return self._state.policies.get(model)

    def errors(self) -> list[PolicyError]:
        with self._lock:
            return list(self._state.errors)

    def versions_seen(self) -> list[PolicyVersion]:
        """Every version put in force since the store was created, oldest first."""
        with self._lock:
            return list(self._versions)

    def status(self) -> dict[str, Any]:
        """JSON-able view for ``/v1/policies``: per model the version in force, its sources and
        rules (and whether it is a kept previous version); per file ok or its errors."""
        with self._lock:
            st = self._state
            def model_errors(model: str, sources: tuple[str, ...]) -> list[dict[str, Any]]:
                # Its own errors, and those of its files that could not be tied to a model
                # (a YAML syntax error in a file it came from).
                return [e.to_dict() for e in st.errors
                        if e.model == model or (e.model is None and e.file in sources)]

            models: dict[str, Any] = {
                m: {
                    "version": p.version,
                    "sources": list(p.sources),
                    "rules": [{"name": r.rule, "kind": r.name} for r in p.rules],
                    "mode": p.spec.mode.value,
                    "kept_previous": m in st.kept_previous,
                    "errors": model_errors(m, p.sources),
                }
                for m, p in sorted(st.policies.items())
            }
            for m in sorted(st.failed - set(st.policies)):
                # Never had a good version: nothing in force, only errors.
                models[m] = {"version": None, "sources": [], "rules": [], "kept_previous": False,
                             "errors": model_errors(m, ())}
            by_file: dict[str, list[dict[str, Any]]] = {}
            for e in st.errors:
                by_file.setdefault(e.file, []).append(
                    {"line": e.line, "path": e.path, "message": e.message, "model": e.model})
            files = {
                name: {
                    "ok": name not in by_file,
                    "sha256": fr.sha256,
                    "models": sorted(fr.models),
                    "errors": by_file.get(name, []),
                }
                for name, fr in sorted(st.files.items())
            }
            for name, errs in by_file.items():  # errors for paths that are not files (a bad dir)
                files.setdefault(name, {"ok": False, "sha256": "", "models": [], "errors": errs})
            return {
                "ok": not st.errors,
                "models": models,
                "files": files,
                "errors": [e.to_dict() for e in st.errors],
            }

    # --- reloading ---

    def reload(self, paths: PathLike | Iterable[PathLike]) -> ReloadReport:
        """Re-read the files (a directory means its ``*.yaml``/``*.yml``) and update the
        policies in force; see the class docstring for what is kept on errors. Never raises:
        a failure of the reload itself is reported as an error and keeps every policy."""
        with self._reload_lock:
            source_errors: list[PolicyError] = []
            try:
                if isinstance(paths, (str, os.PathLike)) and not Path(paths).exists():
                    source_errors.append(PolicyError(str(paths), None, "", "no such file or directory"))
                    sources: list[_Source] = []
                else:
                    sources = _sources(paths)
                sources += self._extra_sources(source_errors)
                results = [_load_source(s, self._registry, self._known, self._limits, self._cache)
                           for s in sources]
                listed = {s.file for s in sources}
                for f in list(self._cache):
                    if f not in listed:
                        del self._cache[f]
                fingerprint = tuple((r.file, r.sha256 or str(r.errors[0])) for r in results)
                fingerprint += tuple((e.file, e.message) for e in source_errors)
                if fingerprint == self._fingerprint:
                    # Nothing new to report (the current errors stay visible in errors()/status()),
                    # so a caller that logs every reported error does not repeat itself every poll.
                    return ReloadReport(changed=False)
                loaded = _assemble(results)
            except Exception as e:  # noqa: BLE001 - a reload must never take the daemon down
                # Nothing can be trusted: keep every policy, and try again from scratch next time.
                self._cache.clear()
                self._fingerprint = None
                what = str(paths) if isinstance(paths, (str, os.PathLike)) else "policy files"
                source_errors = [PolicyError(what, None, "", f"the reload failed and every policy "
                                             f"stays as it was: {type(e).__name__}: {_clip(str(e), 200)}")]
                loaded = _assemble([])
            else:
                self._fingerprint = fingerprint
            state, report, first_seen = self._next_state(loaded, source_errors)
            with self._lock:
                self._state = state
                self._versions.extend(first_seen)
            self._tell_sources(state)
            return report

    def _extra_sources(self, source_errors: list[PolicyError]) -> list[_Source]:
        out: list[_Source] = []
        for src in self._extra:
            try:
                out += [_Source(name, None, text) for name, text in sorted(src.texts().items())]
            except Exception as e:  # noqa: BLE001 - an unreadable source keeps every policy as it was
                source_errors.append(PolicyError(src.name, None, "", f"cannot be read; every policy stays "
                                                 f"as it was: {type(e).__name__}: {_clip(str(e), 200)}"))
        return out

    def _tell_sources(self, state: _State) -> None:
        for src in self._extra:
            try:
                src.reloaded(state.errors, dict(state.policies))
            except Exception:  # noqa: BLE001 - reporting must never undo a reload
                logger.exception("policy source report failed", extra={"fields": {"source": src.name}})

    def _next_state(self, result: LoadResult, source_errors: list[PolicyError],
                    ) -> tuple[_State, ReloadReport, list[PolicyVersion]]:
        """The state after ``result``, what to report, and the versions never seen before."""
        prev = self._state  # only reloads replace it, and they take turns
        opaque = {r.file for r in result.files if r.opaque}
        # Models fed before by a file that now cannot be read or parsed: their documents may be
        # in it, so the new set of documents may be incomplete.
        suspect = {m for m, p in prev.policies.items() if opaque.intersection(p.sources)}
        if opaque:
            # A file whose models cannot be told may be where a model's documents went (renamed
            # and broken at once): a model left without documents keeps its version.
            suspect |= {m for m in prev.policies if m not in result.policies}
        if source_errors:
            suspect |= set(prev.policies)  # the whole directory vanished: keep everything
        failed = set(result.failed_models) | suspect

        policies: dict[str, EffectivePolicy] = {}
        new_versions: list[PolicyVersion] = []
        first_seen: list[PolicyVersion] = []
        kept: set[str] = set()
        for model, pol in result.policies.items():
            if model in failed:
                continue
            policies[model] = pol
            old = prev.policies.get(model)
            if old is None or old.version != pol.version or old.sources != pol.sources:
                v = PolicyVersion(model, pol.version, pol.sources, result.canonical[model])
                new_versions.append(v)
                if (model, pol.version) not in self._seen:
                    self._seen.add((model, pol.version))
                    first_seen.append(v)
        for model in failed:
            if model in prev.policies:
                policies[model] = prev.policies[model]
                kept.add(model)
        removed = sorted(m for m in prev.policies if m not in policies)

        errors = tuple(source_errors) + result.errors
        state = _State(
            policies=policies,
            errors=errors,
            files={r.file: r for r in result.files},
            kept_previous=frozenset(kept),
            failed=frozenset(failed),
        )
        report = ReloadReport(True, tuple(new_versions), tuple(removed), tuple(sorted(kept)), errors)
        return state, report, first_seen


# --------------------------------------------------------------------------------------------------
# schema and the `tidegate policy` commands


def json_schema(registry: Registry) -> dict[str, Any]:
    """JSON Schema of a ScalingPolicy document, with each registered kind's ``Params`` schema
    under ``$defs`` keyed by kind name, and ``rules[].params`` tied to ``rules[].kind``
    (so editors complete and check params per kind)."""
    schema = ScalingPolicy.model_json_schema()
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    conditions = []
    for kind in registry.names():
        cls = registry.get(kind)
        sub = cls.Params.model_json_schema(ref_template=f"#/$defs/{kind}.{{model}}")
        for name, d in sub.pop("$defs", {}).items():
            defs[f"{kind}.{name}"] = d
        sub.setdefault("description", cls.description or cls.__doc__ or "")
        defs[kind] = sub
        conditions.append({
            "if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]},
            "then": {"properties": {"params": {"$ref": f"#/$defs/{kind}"}}},
        })
    rule = defs.get("RuleSpec")
    if rule is not None and conditions:
        rule["allOf"] = conditions
        rule["properties"]["kind"]["enum"] = registry.names()
    return schema


def validate_files(paths: PathLike | Iterable[PathLike], registry: Registry, out: IO[str],
                   known_models: set[str] | frozenset[str] | None = None,
                   limits: PolicyLimits = PolicyLimits()) -> int:
    """``tidegate policy validate PATH...``: each path is checked on its own (a file alone, a
    directory as the daemon loads it, its files merged per model); print ``FILE:LINE: PATH:
    message`` per problem and a summary per path; 0 when every path is valid, else 1."""
    args = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    failed = 0
    for arg in args:
        prefix = f"{arg}: " if len(args) > 1 else ""
        files = expand_paths(arg)
        result = load_policy_files(arg, registry, known_models, limits)
        errors = result.errors
        for e in sorted(errors, key=lambda e: (e.file, e.line or 0, e.path)):
            print(str(e), file=out)
        n_docs = sum(len(f.documents) for f in result.files)
        if not errors:
            models = ", ".join(f"{m} ({p.version})" for m, p in sorted(result.policies.items()))
            print(f"{prefix}OK: {len(files)} file(s), {n_docs} document(s) valid; models: "
                  f"{models or 'none'}", file=out)
            continue
        failed += 1
        bad_files = len({e.file for e in errors})
        print(f"{prefix}FAILED: {len(errors)} error(s) in {bad_files} of {len(files)} file(s)",
              file=out)
    if len(args) > 1:
        print(f"{len(args) - failed} of {len(args)} path(s) valid, each checked on its own", file=out)
    return 1 if failed else 0
