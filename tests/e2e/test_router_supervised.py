"""The control plane supervises the router: a dead router serves again at once, on the
same address; `down --keep-apps` leaves it serving; `up` keeps its address; `router
restart` and `up -d` start a router that is down; boot starts one that died while the
control plane was down."""

from __future__ import annotations

import http.client
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from keelway.runtime import process
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, gone, wait_until
from tests.invariants import router_violations

pytestmark = pytest.mark.slow


def _router_pid(kw: Keelway) -> int:
    return int((kw.home / "router" / "router.pid").read_text().split()[0])


def _router(kw: Keelway) -> dict[str, Any]:
    router: dict[str, Any] = kw.ok("status", "--json").json()["router"]
    return router


def _kill_router(kw: Keelway) -> int:
    pid = _router_pid(kw)
    os.kill(pid, signal.SIGKILL)
    return pid


def _answers_200(port: int, host: str, path: str = "/") -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _serving_another(kw: Keelway, old_pid: int) -> bool:
    router = _router(kw)
    return router["state"] == "serving" and router["pid"] not in (None, old_pid)


def test_a_sigkilled_router_serves_a_deployed_app_again_within_a_second(
    kw: Keelway, tmp_path: Path
) -> None:
    # One worker: no second router process serves on while the main one is dead, so
    # what is timed is the control plane noticing the death and starting a successor.
    kw.up("--router-workers", "1")
    kw.ok("deploy", "hello", str(hello(tmp_path, "one")), "--host", "one.test")
    killed = _kill_router(kw)
    start = time.monotonic()
    deadline = start + 10
    while not _answers_200(kw.http_port, "one.test") and time.monotonic() < deadline:
        time.sleep(0.005)
    took_s = time.monotonic() - start
    print(f"\na SIGKILLed router served a deployed app again after {took_s * 1000:.0f} ms")
    assert took_s < 1.0
    assert kw.daemon_pid is not None and process.read_stat(kw.daemon_pid) is not None
    router = _router(kw)
    assert router["state"] == "serving" and router["pid"] not in (None, killed)
    assert router["restarts"] == 1 and "SIGKILL" in router["last_restart_reason"]
    assert router["death_watch"] == "pidfd"
    assert router_violations(kw.home) == []
    assert "router: serving" in kw.ok("status").out


def _crash_loop_until_backoff(kw: Keelway) -> int:
    """Kill the router each time it is back, until the control plane waits out a
    backoff instead of starting it at once; the last pid killed."""
    killed = 0
    for _ in range(3):
        assert wait_until(lambda last=killed: _serving_another(kw, last), timeout_s=15)
        killed = _kill_router(kw)
    assert wait_until(lambda: _router(kw)["next_retry_at"] is not None, timeout_s=5)
    return killed


def test_a_crash_looping_router_waits_a_bounded_backoff_and_router_restart_starts_it_now(
    kw: Keelway,
) -> None:
    kw.up("--router-workers", "1")
    killed = _crash_loop_until_backoff(kw)
    router = _router(kw)
    assert router["state"] == "down" and router["pid"] is None
    assert router["next_retry_at"] > time.time() + 1  # a backoff, not a respawn loop
    assert "router: DOWN" in kw.ok("status").out
    log = (kw.home / "logs" / "keelway.log").read_text()
    assert "next try in" in log
    started = kw.ok("router", "restart", "--json").json()
    assert started["was_dead"] and started["old_pid"] == killed
    assert _router(kw)["pid"] == started["new_pid"] == _router_pid(kw)
    assert _answers_200(kw.http_port, "any.test", "/_keelway/health")
    assert router_violations(kw.home) == []


def test_up_with_the_control_plane_running_starts_its_router_if_it_is_down(
    kw: Keelway,
) -> None:
    kw.up("--router-workers", "1")
    _crash_loop_until_backoff(kw)
    result = kw.ok("up", "-d", "--http", f"127.0.0.1:{kw.http_port}")
    assert "router was down" in result.out
    assert _router(kw)["state"] == "serving"
    assert _answers_200(kw.http_port, "any.test", "/_keelway/health")
    # With its router serving, a second `up` is refused as before.
    assert kw.run("up", "-d", "--http", f"127.0.0.1:{kw.http_port}").code == 3


def test_down_keep_apps_keeps_the_router_serving_and_up_adopts_it(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "one")), "--host", "one.test")
    kw.started_pids.extend(kw.app_pids())
    router = _router_pid(kw)
    kw.ok("down", "--keep-apps")
    assert kw.daemon_pid is not None and gone(kw.daemon_pid)
    assert _answers_200(kw.http_port, "one.test")  # traffic flows with no control plane
    kw.up()
    assert _router_pid(kw) == router and _router(kw)["adopted"]
    assert _answers_200(kw.http_port, "one.test")


def test_a_router_that_died_while_the_control_plane_was_down_is_started_again_by_up(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "one")), "--host", "one.test")
    apps = kw.app_pids()
    kw.started_pids.extend(apps)
    kw.ok("down", "--keep-apps")
    killed = _kill_router(kw)
    assert gone(killed)
    kw.up()  # its workers may still drain on the port: boot waits for it
    assert _router_pid(kw) != killed
    assert _answers_200(kw.http_port, "one.test")
    assert kw.app_pids() == apps
    assert router_violations(kw.home) == []


def test_up_without_http_keeps_the_address_the_router_serves(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    router = _router_pid(kw)
    kw.ok("down", "--keep-apps")
    info = kw.ok("up", "-d", "--json").json()
    kw.daemon_pid = info["pid"]
    assert info["http"] == f"127.0.0.1:{kw.http_port}"
    assert _router_pid(kw) == router
    assert _answers_200(kw.http_port, "any.test", "/_keelway/health")
