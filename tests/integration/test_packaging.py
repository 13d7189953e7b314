"""The daemon's install runs without the simulator's extra (``tidegate[sim]``): the daemon's
modules, every real adapter and a short ``tidegate demo`` import neither matplotlib nor tqdm.

numpy is not checked here: the daemon's install carries it as a dependency of ``tritonclient``
(``controller.bundle`` reads Triton's model config through it), and the simulated world the demo
runs on (``controller.sim``, behind ``providers.sim``) uses it; outside ``controller.sim`` the
project's modules never import it, which the import-linter contract "The daemon carries no
simulator libraries" checks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DAEMON_MODULES = (
    "controller.cli", "controller.runtime", "controller.daemon", "controller.api", "controller.demo",
    "providers.real", "providers.cloudpool", "providers.kubernetes", "providers.aws", "providers.gcp",
    "providers.prometheus", "providers.triton", "providers.leader", "providers.sim", "providers.karpenter",
    "controller.importer",
)


def test_the_daemon_and_the_demo_import_no_plotting(tmp_path: Path) -> None:
    code = (
        "import importlib, json, sys\n"
        f"for m in {DAEMON_MODULES!r}: importlib.import_module(m)\n"
        "from controller.cli import main\n"
        f"rc = main(['demo', '--duration-s', '2', '--speedup', '240', '--port', '0', '--quiet', "
        f"'--workdir', {str(tmp_path / 'demo')!r}])\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'tqdm'})))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    assert "decisions recorded" in r.stdout, r.stdout + r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == [], "the daemon's path imported the simulator's libraries"
