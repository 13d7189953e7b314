"""What each install carries: the daemon's (``pip install .``, the image) leaves the simulator's
libraries out, ``tidegate[sim]`` adds them, ``tidegate[test]`` (what ``make`` installs) pulls both.

``tidegate simulate`` on the daemon's install must say in one line which extra to install, not
stop on a traceback: that is run as a user runs it, with the extra's modules made unimportable.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from controller.sim import EXTRA_MODULES

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> set[str]:
    """Distribution names of PEP 508 requirement strings, extras dropped (``a[b]>=1`` -> ``a``)."""
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def _pip_installs(text: str) -> list[list[str]]:
    """The arguments after ``pip install`` on each line of a Dockerfile or Makefile that has one."""
    out = []
    for line in text.splitlines():
        words = shlex.split(line.split("#", 1)[0]) if "pip" in line else []
        for i, w in enumerate(words[:-1]):
            if w.endswith("pip") and words[i + 1] == "install":
                out.append([a for a in words[i + 2:] if not a.startswith("-")])
    return out


def test_the_daemon_install_leaves_the_simulator_libraries_out() -> None:
    base = _names(PYPROJECT["project"]["dependencies"])
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert base & set(EXTRA_MODULES) == set()
    assert _names(extras["sim"]) >= set(EXTRA_MODULES)
    assert "tidegate[sim]" in extras["test"]


def test_the_image_installs_the_daemon_only() -> None:
    installs = _pip_installs((ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8"))
    assert installs == [["."]], f"deploy/Dockerfile must install the package without extras: {installs}"


def test_make_installs_the_test_extra() -> None:
    installs = _pip_installs((ROOT / "Makefile").read_text(encoding="utf-8"))
    assert [".[test]"] in installs, installs


def test_simulate_without_the_sim_extra_names_the_extra() -> None:
    blocked = ", ".join(repr(m) for m in EXTRA_MODULES)
    code = (f"import sys\nfor m in ({blocked},): sys.modules[m] = None  # as if not installed\n"
            "from controller.cli import main\nsys.exit(main(['simulate', '--trace', 'requests.csv']))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        "tidegate: error: tidegate simulate needs numpy, matplotlib, tqdm, which this install lacks; "
        "install the simulator's extra: pip install 'tidegate[sim]'"]
