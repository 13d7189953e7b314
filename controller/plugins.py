"""Plugins found through Python entry points: policy kinds (``tidegate.policies``) and pool
providers (``tidegate.providers``) are both classes with a ``name``, registered under that name."""

from __future__ import annotations

from importlib import metadata
from typing import Iterator, TypeVar

K = TypeVar("K", bound=type)


def entry_point_kinds(group: str, base: K, what: str) -> Iterator[K]:
    """Each class installed under ``group``; ``TypeError`` for an entry point that is not a
    subclass of ``base`` or whose class names itself otherwise (``what`` says which name)."""
    for ep in metadata.entry_points(group=group):
        kind = ep.load()
        if not (isinstance(kind, type) and issubclass(kind, base)):
            raise TypeError(f"entry point {ep.name} = {ep.value} is not a {base.__name__} subclass")
        if kind.name != ep.name:  # type: ignore[attr-defined]
            raise TypeError(f"entry point {ep.name} loads {what} named {kind.name!r}")  # type: ignore[attr-defined]
        yield kind  # type: ignore[misc]
