"""The decision core stays made of small stages (STYLE.md, "Small stages"; HPA's one function per step).

An AST scan over every module in ``controller/core``: no function longer than ``MAX_LINES`` lines
(decorators and docstring included, as the source shows it) and none with a cyclomatic complexity
above ``MAX_COMPLEXITY`` (McCabe's count: 1, plus one per ``if``/``elif``, conditional expression,
loop, ``except``, comprehension ``for`` and ``if``, ``case``, and each extra operand of ``and``/``or``).
Both scanners are tested against known-bad snippets so that a silent scanner cannot pass.
"""

from __future__ import annotations

import ast
from pathlib import Path
from tests import pysource

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "controller" / "core"
MAX_LINES = 60
MAX_COMPLEXITY = 12

_Function = (ast.FunctionDef, ast.AsyncFunctionDef)
_BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.match_case)


def _own_nodes(fn: ast.AST) -> list[ast.AST]:
    """The nodes of ``fn``'s body, not those of the functions and classes nested in it."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (*_Function, ast.ClassDef, ast.Lambda)):
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    score = 1
    for node in _own_nodes(fn):
        if isinstance(node, _BRANCHES):
            score += 1
        elif isinstance(node, ast.comprehension):
            score += 1 + len(node.ifs)
        elif isinstance(node, ast.BoolOp):
            score += len(node.values) - 1
    return score


def functions(source: str, filename: str) -> list[tuple[str, int, int]]:
    """``(file:line name, lines, complexity)`` for every function and method in ``source``."""
    out = []
    for node in ast.walk(pysource.parse(source, filename)):
        if isinstance(node, _Function):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            out.append((f"{filename}:{node.lineno} {node.name}", node.end_lineno - first + 1, complexity(node)))
    return out


def core_functions() -> list[tuple[str, int, int]]:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 8, files  # the scan sees the core, not an empty folder
    return [f for p in files for f in functions(p.read_text(), str(p.relative_to(ROOT)))]


def test_no_function_in_the_core_is_longer_than_a_screen() -> None:
    long = [f"{where}: {lines} lines" for where, lines, _ in core_functions() if lines > MAX_LINES]
    assert not long, f"split these into stages of at most {MAX_LINES} lines:\n" + "\n".join(long)


def test_no_function_in_the_core_has_many_branches() -> None:
    tangled = [f"{where}: complexity {c}" for where, _, c in core_functions() if c > MAX_COMPLEXITY]
    assert not tangled, f"split these (cyclomatic complexity above {MAX_COMPLEXITY}):\n" + "\n".join(tangled)


def test_the_scanners_see_long_and_branchy_functions() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    long_fn = f"@decorator\ndef long(x):\n{body}    return x\n"
    assert functions(long_fn, "t.py") == [("t.py:2 long", MAX_LINES + 3, 1)]
    branchy = (
        "def branchy(xs, a, b, c):\n"
        "    for x in xs:\n"                          # +1
        "        if x and a or b:\n"                  # +1 if, +2 and/or
        "            continue\n"
        "        elif x is None:\n"                   # +1
        "            pass\n"
        "    try:\n"
        "        y = [v for v in xs if v if c]\n"     # +1 for, +2 ifs
        "    except ValueError:\n"                    # +1
        "        y = a if b else c\n"                 # +1
        "    while y:\n"                              # +1
        "        y.pop()\n"
        "    def inner(z):\n"                         # not counted here: a function of its own
        "        return z if z else 0\n"
        "    return y\n"
    )
    assert sorted(c for _, _, c in functions(branchy, "t.py")) == [2, 12]
