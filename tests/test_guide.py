"""docs/guide.md, run: its `sh` blocks, in order, as one bash script (`set -e`, so any
command that fails, or any `grep` that finds nothing, fails the test), against a real
daemon in a temp KEELWAY_HOME, with the ports and the ACME CA this test chose given as
the environment variables the guide reads (`${HTTP_PORT:-8080}`, `$ACME_DIRECTORY`, …).

The guide's two apps build once each (the suite's shared dependency cache, so a run
that already installed Django or Flask for another test installs nothing here).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keelway.builds.cache import CACHE_ENV
from tests.acme_server import pebble
from tests.e2e.harness import Keelway, free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"
# A fence that opens a block this test runs; any other (a plain ```) is only shown.
_RUN = re.compile(r"^```sh\s*$")
BUDGET_S = 170.0


def shell_blocks(text: str) -> list[str]:
    """The guide's ```sh blocks, in order, each as written."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if current is None:
            if _RUN.match(line):
                current = []
        elif line.startswith("```"):
            blocks.append("\n".join(current))
            current = None
        else:
            current.append(line)
    assert current is None, "an unclosed ```sh block"
    return blocks


def test_the_guide_names_its_blocks_as_this_test_reads_them() -> None:
    doc = "a\n```sh\nkeelway up -d\n```\nshown only:\n```\npip install\n```\n```sh\nx\ny\n```\n"
    assert shell_blocks(doc) == ["keelway up -d", "x\ny"]
    # Every part of the guide the issue asks for has a block that runs.
    guide = "\n".join(shell_blocks(GUIDE.read_text()))
    for command in ("keelway deploy notes", "keelway deploy polls", "keelway config notes set",
                    "keelway rollback", "keelway instances add", "keelway domains add",
                    "keelway park", "keelway freeze", "keelway db snapshot",
                    "keelway db restore", "keelway seed import", "keelway seed rollback",
                    "keelway run", "--https", "keelway certs import", "--acme-directory"):
        assert command in guide, command


@pytest.mark.timeout(300)  # its first run on a box installs Django, Flask and gunicorn
def test_the_guide_runs_from_nothing_to_https(kw: Keelway, tmp_path: Path,
                                              deps_cache: Path) -> None:
    if shutil.which("curl") is None or shutil.which("openssl") is None:
        pytest.skip("the guide uses curl and openssl")
    script = "\n\n".join(shell_blocks(GUIDE.read_text()))
    # Run where its files land (openssl's), with the apps where the guide says they are.
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    https_port = free_port()
    with pebble(tmp_path / "pebble", kw.http_port, https_port) as ca:
        env = {**os.environ,
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               "KEELWAY_HOME": str(kw.home), "HTTP_PORT": str(kw.http_port),
               "HTTPS_PORT": str(https_port), "ACME_DIRECTORY": ca.directory,
               "ACME_CA_BUNDLE": str(ca.ca_bundle), CACHE_ENV: str(deps_cache)}
        started = time.monotonic()
        try:
            done = subprocess.run(["bash", "-euo", "pipefail", "-xc", script], cwd=work,
                                  env=env, capture_output=True, text=True,
                                  timeout=BUDGET_S, stdin=subprocess.DEVNULL)
        finally:
            _adopt_daemon(kw)
        took = time.monotonic() - started
    assert done.returncode == 0, f"the guide failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    assert "Hello from keelway" in done.stdout and "1 votes" in done.stdout
    print(f"the guide ran in {took:.1f} s")


def _adopt_daemon(kw: Keelway) -> None:
    """Hand the daemon the guide started to the fixture, whose teardown stops it."""
    try:
        kw.daemon_pid = int((kw.home / "keelway.lock").read_text().strip())
    except (OSError, ValueError):
        kw.daemon_pid = None
