"""`up` against windows a busy box opens wide: the router's start sweeps `router/` while
the control plane is writing the router's pid file there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.apps import hello
from tests.e2e.harness import Keelway

pytestmark = pytest.mark.slow


def test_up_succeeds_while_the_routers_pid_file_write_is_held_open(
        kw: Keelway, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # every write of router.pid waits 1 s between its temp file and the rename, so the
    # router's start-up sweep of router/ certainly runs inside the window
    monkeypatch.setenv("KEELWAY_FAILPOINTS", "write.rename.router.pid=1")
    kw.up()
    pid_file = kw.home / "router" / "router.pid"
    assert pid_file.exists()
    app = hello(tmp_path, "hello")
    kw.ok("deploy", "hello", str(app), "--host", "hello.test")
    status, body, _ = kw.get("hello.test")
    assert status == 200, body
