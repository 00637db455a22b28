"""The control plane finds the router by its control socket, whatever its records say.

A control plane killed while starting the router, or while recording it, must not make
the next `up` bind a second router (the port is taken) or lose the one serving; a
running router whose settings differ from what `up` asks for is restarted without a gap.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from keelway.runtime import process
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, gone, wait_until
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
    assert gone(int(lock.read_text().strip()))


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


def test_a_router_too_slow_to_answer_at_boot_does_not_stop_up_and_is_caught_up_later(
    kw: Keelway, tmp_path: Path
) -> None:
    """A router that is alive but cannot answer in time (here: stopped with SIGSTOP; in
    CI: a worker still starting on a starved box) must not make boot's publish kill the
    control plane. `up` succeeds, and the periodic pass pushes the table once the
    router answers again."""
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "one")), "--host", "one.test")
    kw.kill_daemon()
    pid, ticks = (int(x) for x in (kw.home / "router" / "router.pid").read_text().split())
    process.signal_session(pid, ticks, signal.SIGSTOP)
    try:
        kw.up()
    finally:
        process.signal_session(pid, ticks, signal.SIGCONT)
    assert wait_until(lambda: kw.get("one.test")[0] == 200, timeout_s=15)
    assert router_violations(kw.home) == []
