"""The ``bench/`` scripts as modules, for the tests of what they generate (they are scripts, not a
package: loaded from their files)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str) -> ModuleType:
    """``bench/<name>.py`` as a fresh module."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # registered before it runs: dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def run(name: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python bench/<name>.py ARGS`` as a user runs it: its exit status, stdout and stderr."""
    return subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *args], capture_output=True, text=True,
                          timeout=timeout)
