"""Suite-wide settings.

Hypothesis explores new examples on every local run (that is how it finds bugs), but under
``CI=true`` it is derandomized: a submission's verdict must not depend on the luck of the draw.
Counterexamples found locally are kept in ``.hypothesis/`` and replayed first.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
    settings.load_profile("ci")
