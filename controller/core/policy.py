"""The compiled policy of one model: what the pipeline runs with.

``controller.policyfile`` builds it from one or more ScalingPolicy files (validated, merged, hashed);
the pipeline only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.core.spec import PolicySpec
from policies.base import PolicyKind


@dataclass(frozen=True)
class EffectivePolicy:
    model: str
    spec: PolicySpec
    """The merged spec (bounds intersected, strictest budget, rules unioned)."""
    rules: tuple[PolicyKind, ...]
    """Built rule instances, in file order."""
    version: str
    """Content hash of the sources (sha256, first 16 hex digits): stored with every decision."""
    sources: tuple[str, ...] = ()
    """The files it came from."""
