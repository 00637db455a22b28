"""The real CLI when the real control plane is SIGKILLed during its request: no
traceback, what is known, where to look, and an exit code of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from keelway.cli.output import EXIT_LOST
from tests.deploy.apps import SLOW_BOOT, hello
from tests.e2e.harness import Keelway, wait_until

pytestmark = pytest.mark.slow

HOST = "one.test"


def test_a_wake_whose_control_plane_is_killed_mid_request_says_it_may_have_completed(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "slow", web_cmd=SLOW_BOOT)), "--host", HOST)
    kw.ok("park", HOST)
    waking = subprocess.Popen([sys.executable, "-m", "keelway.cli.main", "wake", HOST],
                              env=kw.env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wake_journaled() -> bool:
        ops = kw.ok("ops", "hello", "--json").json()["operations"]
        return bool(ops) and ops[0]["kind"] == "wake" and ops[0]["state"] == "running"

    try:
        assert wait_until(wake_journaled, 20), "the wake never started"
        kw.kill_daemon()  # the web takes 2 s to boot: the wake is still waiting for it
        _out, err = waking.communicate(timeout=60)
    finally:
        if waking.poll() is None:
            waking.kill()
            waking.wait()
    assert "Traceback" not in err, err
    assert waking.returncode == EXIT_LOST, err
    assert "the control plane went away during the request" in err
    assert "may or may not have completed" in err and "`keelway status`" in err

    # Where it stands, once it is back: the wake it had begun is carried through.
    kw.up()
    assert wait_until(lambda: kw.get(HOST, "/health", timeout_s=30)[0] == 200, 30)
