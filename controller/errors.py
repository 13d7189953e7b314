"""Every exception tidegate raises on purpose, in one tree::

    TidegateError
    ├── ProviderError
    │   ├── PermanentProviderError
    │   └── TransientProviderError
    │       └── ConflictError
    └── UserError
        ├── AddressUnavailable
        ├── ApiError
        ├── BundleError (ValueError)
        ├── ConfigError
        ├── CronError (ValueError)
        ├── DatabaseError
        ├── ManifestError (ValueError)
        ├── ScenarioError (ValueError)
        ├── SchemaNotCurrentError (RuntimeError)
        ├── UnknownPolicyKind (KeyError)
        └── UnknownProvider (KeyError)

(``render_tree()`` draws it from the classes; ``tests/unit/test_errors.py`` checks that the drawing
and the classes agree, and that no other module of the project defines a public exception: a
private one, ``_Name``, may serve as control flow inside its module and never leaves it.)

- A :class:`UserError` is raised where tidegate meets input it cannot use (a config file, a
  database URL, a port, a missing file, a policy or a bundle) and carries a message that says what
  is wrong, where (the file, the field, the URL or the address) and how to fix it. The command line
  prints each line of it after ``tidegate: error:`` on stderr and exits non-zero, without a
  traceback (``tidegate --debug`` shows one).
- A :class:`ProviderError` is a failed call to the outside (Kubernetes, a cloud, Prometheus):
  transient ones are retried with backoff and jitter, permanent ones are surfaced and not retried.
  Adapters translate their library's errors into these (``raise ... from e``).

Anything else that escapes is a bug and keeps its traceback. A class that older code caught as a
built-in (``ValueError``, ``KeyError``, ``RuntimeError``) keeps that base too. The modules that
raise them re-export them under their old import paths (``controller.runtime.ConfigError``,
``policies.cron.CronError``, ``controller.protocols.ProviderError``...). This module imports
nothing of the project's, so the pure core and the policies may raise these too.
"""

from __future__ import annotations

from typing import Iterable

__all__ = [
    "TidegateError", "UserError", "AddressUnavailable", "ApiError", "BundleError", "ConfigError", "CronError",
    "DatabaseError", "ManifestError", "ScenarioError", "SchemaNotCurrentError", "UnknownPolicyKind", "UnknownProvider",
    "ProviderError", "PermanentProviderError", "TransientProviderError", "ConflictError", "render_tree",
]


class TidegateError(Exception):
    """The root: every error tidegate raises on purpose."""


# --- input a person can fix ---------------------------------------------------------------------


class UserError(TidegateError):
    """Input tidegate cannot use; ``str(e)``: one line per problem (what, where, how to fix)."""

    exit_code = 2
    """Process exit status of the command that stops on it."""


class ConfigError(UserError):
    """A config file that cannot be used, with every problem listed (one per line)."""


class AddressUnavailable(UserError):
    """The admin API cannot listen on its address (taken, or not an address of this host)."""

    def __init__(self, message: str, *, in_use: bool) -> None:
        super().__init__(message)
        self.in_use = in_use


class ApiError(UserError):
    """A call to a daemon's admin API failed (unreachable, refused, not found); ``exit_code`` is the
    one ``controller.client.EXIT_CODES`` documents for it."""

    def __init__(self, message: str, *, exit_code: int = 2, status: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status


class DatabaseError(UserError):
    """The decision log's database cannot be used; the message says why and what to do."""


class SchemaNotCurrentError(UserError, RuntimeError):
    """The database is not at the newest migration: run ``tidegate db upgrade``."""


class BundleError(UserError, ValueError):
    """A bundle manifest or model repository that tidegate must not run with."""


class ScenarioError(UserError, ValueError):
    """A simulator input is missing or invalid (the message says which and why)."""


class CronError(UserError, ValueError):
    """A cron expression that cannot be parsed or can never fire; the message says where."""


class ManifestError(UserError, ValueError):
    """An HPA or ScaledObject manifest ``tidegate import`` cannot read; the message says where."""


class UnknownPolicyKind(UserError, KeyError):
    """A policy names a kind that no installed entry point provides."""

    def __init__(self, kind: str, known: Iterable[str]) -> None:
        super().__init__(kind)
        self.kind = kind
        self.known = sorted(known)

    def __str__(self) -> str:
        return f"unknown policy kind {self.kind!r} (known: {', '.join(self.known)})"


class UnknownProvider(UserError, KeyError):
    """A pool names a provider that no installed entry point provides."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        super().__init__(name)
        self.name = name
        self.known = sorted(known)

    def __str__(self) -> str:
        return f"unknown pool provider {self.name!r} (installed: {', '.join(self.known)})"


# --- calls to the outside -----------------------------------------------------------------------


class ProviderError(TidegateError):
    """Base of every error a provider raises."""

    retryable: bool = False


class TransientProviderError(ProviderError):
    """Throttling, 5xx, timeouts, 409 conflicts: try again (with backoff and jitter)."""

    retryable = True


class PermanentProviderError(ProviderError):
    """Bad configuration, 404 for a configured object, permission denied: surface, do not retry."""

    retryable = False


class ConflictError(TransientProviderError):
    """409 from the API server: the object changed since it was read; re-read and retry."""


def render_tree(root: type[BaseException] = TidegateError) -> str:
    """The class tree under ``root`` as drawn in this module's docstring: children in name order,
    built-in bases other than the tree's in parentheses."""
    lines = [root.__name__]

    def walk(cls: type[BaseException], prefix: str) -> None:
        children = sorted(cls.__subclasses__(), key=lambda c: c.__name__)
        for i, child in enumerate(children):
            last = i == len(children) - 1
            extra = [b.__name__ for b in child.__bases__ if b.__module__ == "builtins"]
            label = child.__name__ + (f" ({', '.join(extra)})" if extra else "")
            lines.append(f"{prefix}{'└── ' if last else '├── '}{label}")
            walk(child, prefix + ("    " if last else "│   "))

    walk(root, "")
    return "\n".join(lines)
