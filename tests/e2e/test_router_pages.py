"""The router's own pages say what is true, through the real CLI, daemon and router: a
stopped app says "stopped", an instance nothing was deployed to "not deployed yet" (at
its aliases too, not a 404 that says no site is there), and "busy for a moment" is only
what a request held for a hold-mode swap gets when it waited its bound out. The crash
page ("restarting", with the backoff's Retry-After) and the fence's are in
test_alias_states.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from keelway.router.client import get_table_sync
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, wait_until

pytestmark = pytest.mark.slow

SLOW_BOOT = ("python3 -c \"import time, runpy; time.sleep(3); "
             "runpy.run_path('web.py', run_name='__main__')\"")


def _state(kw: Keelway, host: str) -> str:
    return get_table_sync(kw.home / "router" / "control.sock").routes[host].state.value


def test_the_router_says_stopped_not_deployed_yet_and_busy_only_while_it_holds(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up("--hold-timeout", "1")

    # Nothing deployed yet: the instance and its alias say so, with no Retry-After
    # (nothing will change by waiting).
    kw.ok("apps", "create", "blank")
    kw.ok("instances", "add", "blank", "blank.test")
    kw.ok("domains", "add", "blank.test", "www.blank.test")
    for host in ("blank.test", "www.blank.test"):
        status, body, headers = kw.get(host, "/")
        assert status == 503 and b"not deployed yet" in body, (host, body)
        assert "Retry-After" not in headers
    assert kw.get("nobody.test", "/")[0] == 404

    # Busy for a moment: a request held through a hold-mode swap, past its bound.
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1", worker_mode="overlap")),
          "--host", "one.test")
    deploying = threading.Thread(target=kw.ok, args=(
        "deploy", "hello", str(hello(tmp_path, "v2", web_cmd=SLOW_BOOT, web_mode="hold",
                                     worker_mode="overlap"))))
    deploying.start()
    try:
        assert wait_until(lambda: _state(kw, "one.test") == "holding", 30, 0.02)
        began = time.monotonic()
        status, body, headers = kw.get("one.test", "/", timeout_s=30)
        if status == 503:  # held for its 1 s bound while v2 boots
            assert b"busy for a moment" in body and "Retry-After" in headers, body
            assert time.monotonic() - began >= 0.9
        else:  # the swap ended inside the bound on a slow box: served
            assert status == 200
    finally:
        deploying.join(60)
    assert kw.get("one.test", "/")[1].startswith(b"hello from one.test (v2)")

    # Stopped by its user: says so, and is not "busy".
    kw.ok("stop", "hello")
    status, body, headers = kw.get("one.test", "/")
    assert status == 503 and b"stopped" in body and b"busy" not in body, body
    assert "Retry-After" not in headers
    kw.ok("start", "hello")
    assert kw.get("one.test", "/health")[0] == 200
