"""The control plane finds the router by its control socket, whatever its records say.

A control plane killed while starting the router, or while recording it, must not make
the next `up` bind a second router (the port is taken) or lose the one serving; a
running router whose settings differ from what `up` asks for is restarted without a gap.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from keelway.runtime import process
from tests.e2e.harness import Keelway, wait_until
from tests.invariants import router_violations

pytestmark = pytest.mark.slow


def _up_dies_at(kw: Keelway, point: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "keelway.cli.main", "up", "-d", "--http",
         f"127.0.0.1:{kw.http_port}", "--json"],
        env={**kw.env(), "KEELWAY_FAILPOINTS": point}, capture_output=True, text=True,
        timeout=60, stdin=subprocess.DEVNULL,
    )
    assert done.returncode != 0, done.stdout
    lock = kw.home / "keelway.lock"
    daemon = int(lock.read_text().strip())
    assert wait_until(lambda: process.read_stat(daemon) is None
                      or process.read_stat(daemon).state == "Z")  # type: ignore[union-attr]


@pytest.mark.parametrize("point", ["router.spawn.before", "router.spawn.after",
                                   "router.recorded"])
def test_a_crash_while_starting_the_router_is_recovered_by_the_next_up(
    kw: Keelway, point: str
) -> None:
    _up_dies_at(kw, point)
    kw.up()
    assert router_violations(kw.home) == []
    status, body, _ = kw.get("any.test", "/_keelway/health")
    assert (status, body) == (200, b"ok\n")
