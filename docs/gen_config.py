"""Write docs/config.md, the configuration reference, from the daemon's config schema
(controller/config.py) and the installed pool providers (providers/registry.py).

    python docs/gen_config.py           # write docs/config.md
    python docs/gen_config.py --check   # exit 1 when the committed file is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS.parent))  # the repository root, for `controller` when run as a script

from controller.docs import config_reference, write_or_check  # noqa: E402
from providers.registry import ProviderRegistry  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    parser.add_argument("--out", type=Path, default=DOCS / "config.md", help="where the reference goes")
    args = parser.parse_args(argv)
    text = config_reference(ProviderRegistry.from_entry_points())
    return write_or_check(args.out, text, args.check, "python docs/gen_config.py")


if __name__ == "__main__":
    sys.exit(main())
