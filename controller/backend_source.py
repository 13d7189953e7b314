"""Read a TensorRT-LLM Triton backend checkout: which model-config parameters the C++ backend
reads, whether a missing one is tolerated, and the tensors the ``inflight_batcher_llm`` template
declares for the ``tensorrt_llm`` model.

Why this exists: the backend reads its parameters with ``GetParameter<T>("name")``, which throws
"Cannot find parameter with name: ..." when the key is absent. Most reads sit in a ``try`` block
that falls back to a default; the few that do not make model-instance creation fail, and Triton
never becomes ready. Which is which changes between versions, so ``deploy/model/backend_parameters.yaml``
records it for the pinned version, and on a version bump this module prints the same facts for the
new source so the difference is a diff::

    python -m controller.backend_source /path/to/tensorrtllm_backend   # up to v0.19.x
    python -m controller.backend_source /path/to/TensorRT-LLM/triton_backend   # v0.20.0 and later

The scan is lexical, not a C++ parser: it strips comments and string literals, tracks braces, and
calls a read *guarded* when an enclosing block is a ``try`` block. A read whose ``catch`` throws
again is reported as ``catch_throws`` (required whenever that code runs). Review its output
against the source before editing the parameter list; every entry names the file and line.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

SOURCE_DIR = "inflight_batcher_llm/src"
TEMPLATE = "all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt"

# C++ type of GetParameter<T> -> the value kind the parameter list records.
_KINDS = {
    "std::string": "string", "bool": "bool", "float": "float",
    "int": "int", "int32_t": "int", "uint32_t": "int", "int64_t": "int", "uint64_t": "int",
    "size_t": "int", "SizeType32": "int", "executor::SizeType32": "int",
    "std::vector<int32_t>": "int_list",
    "executor::MedusaChoices": "nested_int_list", "executor::EagleChoices": "nested_int_list",
}
_CALL = re.compile(r"GetParameter<\s*([\w:<>\s]+?)\s*>\(\s*(\"[^\"]*\"|\w+)\s*\)")
_ASSIGN = re.compile(r"\b(\w+)\s*=\s*\"([^\"]*)\"")


@dataclass(frozen=True, slots=True)
class ParameterRead:
    name: str
    kind: str
    file: str
    line: int
    guarded: bool
    """Inside a ``try`` block: a missing parameter falls back to a default."""
    catch_throws: bool
    """The enclosing ``catch`` throws again: the parameter is required whenever this code runs."""


def _blank(text: str) -> str:
    """Comments and the insides of string/char literals replaced by spaces (newlines and the
    quotes kept), so braces and the keyword ``try`` are only found in code and lines stay put."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif text[i] in "\"'":
            quote, j = text[i], i + 1
            while j < n and text[j] != quote:
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                if out[k] != "\n":
                    out[k] = " "
            i = j + 1
            continue
        else:
            i += 1
            continue
        for k in range(i, j):
            if out[k] != "\n":
                out[k] = " "
        i = j
    return "".join(out)


def _blocks(code: str) -> list[tuple[int, int, str]]:
    """Every ``{...}`` block of blanked code as (open, close, kind): kind is ``try``, ``catch`` or
    ``other`` from the words just before the brace."""
    stack: list[tuple[int, str]] = []
    blocks: list[tuple[int, int, str]] = []
    for i, ch in enumerate(code):
        if ch == "{":
            head = code[max(0, i - 200):i].rstrip()
            if re.search(r"\btry$", head):
                kind = "try"
            elif re.search(r"\bcatch\s*\([^()]*\)$", head):
                kind = "catch"
            else:
                kind = "other"
            stack.append((i, kind))
        elif ch == "}" and stack:
            start, kind = stack.pop()
            blocks.append((start, i, kind))
    return blocks


def _catch_after(code: str, blocks: list[tuple[int, int, str]], try_end: int) -> tuple[int, int] | None:
    for start, end, kind in sorted(blocks):
        if kind == "catch" and start > try_end:
            between = code[try_end + 1:start]
            return (start, end) if re.fullmatch(r"\s*catch\s*\([^()]*\)\s*", between) else None
    return None


def scan_parameter_reads(text: str, file: str) -> list[ParameterRead]:
    """The ``GetParameter<T>(name)`` calls of one C++ source file (template definitions skipped)."""
    code = _blank(text)
    blocks = _blocks(code)
    reads: list[ParameterRead] = []
    for m in _CALL.finditer(text):
        if code[m.start()] == " ":  # inside a comment or literal
            continue
        ctype, arg = m.group(1).strip(), m.group(2)
        if arg.startswith('"'):
            name = arg.strip('"')
        else:
            # ``fieldName = "lora_cache_max_adapter_size"; ... GetParameter<T>(fieldName)``
            assigned = [a.group(2) for a in _ASSIGN.finditer(text[:m.start()]) if a.group(1) == arg]
            if not assigned:
                continue  # ``GetParameter<T>(name)``: the generic definitions themselves
            name = assigned[-1]
        tries = [(s, e) for s, e, k in blocks if k == "try" and s < m.start() < e]
        catch_throws = False
        if tries:
            s, e = max(tries)  # the innermost try
            catch = _catch_after(code, blocks, e)
            if catch is not None:
                catch_throws = bool(re.search(r"\bthrow\b|TLLM_THROW", code[catch[0]:catch[1]]))
        reads.append(ParameterRead(
            name=name, kind=_KINDS.get(ctype, ctype), file=file, line=text.count("\n", 0, m.start()) + 1,
            guarded=bool(tries), catch_throws=catch_throws))
    return reads


def scan_backend(root: Path) -> list[ParameterRead]:
    src = root / SOURCE_DIR
    reads: list[ParameterRead] = []
    for path in sorted(src.rglob("*.cc")) + sorted(src.rglob("*.cpp")):
        reads += scan_parameter_reads(path.read_text(), str(path.relative_to(root)))
    return reads


def _fill_placeholders(text: str) -> str:
    """A template with ``${var}`` left in unquoted fields, made parseable: a data type becomes
    TYPE_INVALID (recorded as "any"), a number or bool 0."""
    text = re.sub(r"(data_type\s*:\s*)\$\{\w+\}", r"\1TYPE_INVALID", text)
    return re.sub(r"(?<![\"\w])\$\{\w+\}(?![\"\w])", "0", text)


def tensor_table(tensors: Any) -> dict[str, dict[str, Any]]:
    """name -> {data_type, dims, reshape (when set), optional (inputs)}: the fields the list compares."""
    table: dict[str, dict[str, Any]] = {}
    for t in tensors:
        d = json_format.MessageToDict(t, preserving_proto_field_name=True)
        row: dict[str, Any] = {
            "data_type": "any" if t.data_type == model_config_pb2.TYPE_INVALID
            else model_config_pb2.DataType.Name(t.data_type),
            "dims": [int(x) for x in t.dims],
        }
        if "reshape" in d:
            row["reshape"] = [int(x) for x in t.reshape.shape]
        if isinstance(t, model_config_pb2.ModelInput):
            row["optional"] = t.optional
        table[t.name] = row
    return table


def read_template(root: Path) -> dict[str, Any]:
    config = text_format.Parse(_fill_placeholders((root / TEMPLATE).read_text()), model_config_pb2.ModelConfig())
    return {"inputs": tensor_table(config.input), "outputs": tensor_table(config.output)}


def report(root: Path) -> dict[str, Any]:
    """What ``deploy/model/backend_parameters.yaml`` records for the ``tensorrt_llm`` model."""
    params: dict[str, dict[str, Any]] = {}
    for r in scan_backend(root):
        entry = params.setdefault(r.name, {
            "required": not r.guarded, "kind": r.kind, "source": []})
        entry["required"] = entry["required"] or not r.guarded
        if r.catch_throws:
            entry["catch_throws"] = True
        entry["source"].append(f"{r.file}:{r.line}")
    return {"parameters": params, **read_template(root)}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / SOURCE_DIR).is_dir():
        print(f"usage: python -m controller.backend_source CHECKOUT  (a directory holding {SOURCE_DIR}/ "
              f"and {TEMPLATE})", file=sys.stderr)
        return 2
    print(yaml.safe_dump(report(Path(argv[0])), sort_keys=False, default_flow_style=None, width=110), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
