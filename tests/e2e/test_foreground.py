"""`keelway up` in the foreground, as the README's quick start runs it, and `logs -f`."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
import time

import pytest

from keelway.runtime import process
from tests.e2e.harness import EXAMPLE, Keelway, wait_until

pytestmark = pytest.mark.slow


def test_up_in_the_foreground_serves_the_demo_and_ctrl_c_stops_everything(kw: Keelway) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "keelway.cli.main", "up", "--demo", "--http",
         f"127.0.0.1:{kw.http_port}"],
        env=kw.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    kw.daemon_pid = proc.pid
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.strip() == "ready":
                break
        output = "".join(lines)
        assert f"http://demo.localhost:{kw.http_port}/" in output, output
        assert kw.get("demo.localhost")[0] == 200
        pids = kw.app_pids()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert wait_until(lambda: not any(process.is_alive(p, t) for p, t in pids), 10)
        router_pidfile = kw.home / "router" / "router.pid"
        assert not router_pidfile.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_logs_follow_prints_new_lines_as_they_come(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")
    follower = subprocess.Popen(
        [sys.executable, "-m", "keelway.cli.main", "logs", "hello", "-f", "-n", "0",
         "--service", "web"],
        env=kw.env(), stdout=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        assert follower.stdout is not None
        # A request until the follower shows one: it follows from its own start (-n 0),
        # which on a loaded box can come after the first request's line was written.
        deadline = time.monotonic() + 60
        while not select.select([follower.stdout], [], [], 0)[0]:
            assert time.monotonic() < deadline, "logs -f printed no line"
            kw.get("one.test", "/followed-path")
            select.select([follower.stdout], [], [], 1.0)
        line = follower.stdout.readline()
        assert "one.test web." in line and "/followed-path" in line
    finally:
        follower.kill()
        follower.wait()
        if follower.stdout is not None:
            follower.stdout.close()
