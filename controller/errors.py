"""Mistakes a person can fix, told in one line each.

A :class:`UserError` is raised where tidegate meets input it cannot use (a config file, a database
URL, a port, a missing file) and carries a message that says what is wrong, where (the file, the
field, the URL or the address) and how to fix it. The command line prints each line of it after
``tidegate: error:`` on stderr and exits non-zero, without a traceback (``tidegate --debug`` shows
one). Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """Input tidegate cannot use; ``str(e)``: one line per problem (what, where, how to fix)."""

    exit_code = 2
    """Process exit status of the command that stops on it."""
