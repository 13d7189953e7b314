"""Parse Python source in a test, robust to CPython 3.11.7's shared AST recursion counter.

On 3.11.7 ``ast.parse`` keeps its recursion depth in interpreter-wide state; a parse in another
thread at the same moment (formatting a traceback parses source lines for its carets) makes one
of them raise ``SystemError: AST constructor recursion depth mismatch`` (gh-106905). The error
says nothing about the source, so parse again, a few times, before letting it through.
"""

from __future__ import annotations

import ast
import time

_TRIES = 5


def parse(source: str, filename: str = "<src>") -> ast.Module:
    for attempt in range(_TRIES):
        try:
            return ast.parse(source, filename)
        except SystemError:
            if attempt == _TRIES - 1:
                raise
            time.sleep(0.01 * (attempt + 1))
    raise AssertionError("unreachable")
