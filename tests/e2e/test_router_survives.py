"""Traffic never depends on the control plane, and the router restarts without a gap.

wrk drives two apps through the router (loopback only, bounded in time) while the
control plane is SIGKILLed and started again, or while the router hands its listening
socket to a new router process. Every request must succeed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from keelway.runtime import process
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway
from tests.invariants import router_violations

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")]

TWO_HOSTS = """
local hosts = {"one.test", "two.test"}
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", "/health", {["Host"] = hosts[(i % 2) + 1]})
end
"""


def _start_wrk(kw: Keelway, tmp_path: Path, seconds: int) -> subprocess.Popen[str]:
    script = tmp_path / "two_hosts.lua"
    script.write_text(TWO_HOSTS)
    return subprocess.Popen(
        ["wrk", "-t2", "-c16", f"-d{seconds}s", "--timeout", "5s", "-s", str(script),
         f"http://127.0.0.1:{kw.http_port}/"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _failures(output: str) -> tuple[int, int]:
    """(requests, failed) from wrk's summary: non-2xx responses plus socket errors."""
    total = int(re.search(r"(\d+) requests in", output).group(1))  # type: ignore[union-attr]
    failed = 0
    if match := re.search(r"Non-2xx or 3xx responses: (\d+)", output):
        failed += int(match.group(1))
    if match := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                          r"timeout (\d+)", output):
        failed += sum(int(g) for g in match.groups())
    return total, failed


def _under_load(kw: Keelway, tmp_path: Path, seconds: int, settle_s: float,
                action: Callable[[], None]) -> str:
    """Run `action` `settle_s` into a `seconds`-long wrk run; wrk's whole output."""
    load = _start_wrk(kw, tmp_path, seconds)
    try:
        time.sleep(settle_s)
        action()
        output, _ = load.communicate(timeout=30)
    finally:
        if load.poll() is None:
            load.kill()
            load.wait()
    return output


def _two_apps(kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "one")), "--host", "one.test")
    kw.ok("deploy", "other", str(hello(tmp_path, "two")), "--host", "two.test")


def test_killing_the_control_plane_under_load_fails_no_request(
    kw: Keelway, tmp_path: Path
) -> None:
    _two_apps(kw, tmp_path)
    kw.started_pids.extend(kw.app_pids())

    def kill_and_restart() -> None:
        kw.kill_daemon()
        time.sleep(1.0)  # the control plane stays dead for a while under load
        kw.up()

    output = _under_load(kw, tmp_path, 6, 1.5, kill_and_restart)
    total, failed = _failures(output)
    assert total > 1000 and failed == 0, output


def test_a_router_restart_under_load_fails_no_request(kw: Keelway, tmp_path: Path) -> None:
    _two_apps(kw, tmp_path)
    before = (kw.home / "router" / "router.pid").read_text().split()[0]
    replies: list[dict[str, int]] = []

    def restart_router() -> None:
        replies.append(kw.ok("router", "restart", "--json").json())

    output = _under_load(kw, tmp_path, 6, 1.5, restart_router)
    handed = replies[0]
    assert str(handed["old_pid"]) == before and handed["new_pid"] != handed["old_pid"]
    assert process.read_stat(handed["old_pid"]) is None or process.read_stat(
        handed["old_pid"]).state == "Z"  # type: ignore[union-attr]
    total, failed = _failures(output)
    assert total > 1000 and failed == 0, output
    assert kw.get("one.test")[0] == 200 and kw.get("two.test")[0] == 200


def test_a_hold_mode_web_swap_under_load_holds_requests_and_fails_none(
    kw: Keelway, tmp_path: Path
) -> None:
    _two_apps(kw, tmp_path)
    again = str(hello(tmp_path, "one-again", greeting="again"))

    def deploy_in_hold_mode() -> None:
        # The old web stops before the new one starts: the route holds meanwhile.
        kw.ok("deploy", "hello", again, "--mode", "hold")

    output = _under_load(kw, tmp_path, 6, 1.0, deploy_in_hold_mode)
    total, failed = _failures(output)
    assert total > 1000 and failed == 0, output
    assert kw.get("one.test")[1].startswith(b"again")


def test_up_with_new_router_settings_restarts_the_running_router_without_a_gap(
    kw: Keelway, tmp_path: Path
) -> None:
    """The control plane dies; the router it leaves serves on. `up` with other router
    settings adopts it, sees the recorded settings differ, and restarts it gaplessly."""
    _two_apps(kw, tmp_path)
    kw.started_pids.extend(kw.app_pids())
    before = int((kw.home / "router" / "router.pid").read_text().split()[0])
    kw.kill_daemon()
    output = _under_load(kw, tmp_path, 5, 1.0,
                         lambda: kw.up("--router-workers", "1", "--trusted-proxy", "10.0.0.1"))
    total, failed = _failures(output)
    assert total > 1000 and failed == 0, output
    after = int((kw.home / "router" / "router.pid").read_text().split()[0])
    assert after != before
    settings = json.loads((kw.home / "router" / "settings.json").read_text())
    assert (settings["workers"], settings["trusted_proxies"]) == (1, ["10.0.0.1"])
    assert router_violations(kw.home) == []
    assert kw.get("one.test")[0] == 200 and kw.get("two.test")[0] == 200


def test_down_keep_apps_then_up_under_load_fails_no_request(
    kw: Keelway, tmp_path: Path
) -> None:
    """Upgrading keelway is `down --keep-apps`, then `up`: the router and the apps serve
    on meanwhile, and the new control plane adopts them."""
    _two_apps(kw, tmp_path)
    kw.started_pids.extend(kw.app_pids())
    before = (kw.home / "router" / "router.pid").read_text()

    def down_and_up() -> None:
        kw.ok("down", "--keep-apps")
        time.sleep(1.0)  # no control plane for a while under load
        kw.up()

    output = _under_load(kw, tmp_path, 6, 1.5, down_and_up)
    total, failed = _failures(output)
    assert total > 1000 and failed == 0, output
    assert (kw.home / "router" / "router.pid").read_text() == before
    assert router_violations(kw.home) == []
