"""The control plane with a fake of danger, for the fail-closed tests:

    python -m keelway.testing.daemon --unkillable 3,7 [the daemon's own arguments]

runs keelway/api/daemon.py's `main` whole, with generations 3 and 7 refusing to die
(keelway/testing/danger.py). The test harness (tests/e2e/harness.py) starts it where
`keelway up -d` would start the real one.
"""

from __future__ import annotations

import argparse
import sys

from keelway.api.daemon import main
from keelway.testing.danger import unkillable


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="keelway-test-daemon")
    parser.add_argument("--unkillable", default="",
                        help="comma-separated generation ids that refuse to die")
    args, rest = parser.parse_known_args(argv)
    ids = {int(part) for part in args.unkillable.split(",") if part.strip()}
    return main(rest, refuses_to_die=unkillable(ids))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
