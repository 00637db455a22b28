"""A crash-looping web through the real CLI and daemon: its backoff (3 quick tries, then
1, 2, 4, 8, 15 min) is persisted, so a control-plane restart neither resets it nor
restarts the web early; meanwhile `status` says when the next retry is and the route
answers 503 with a Retry-After instead of 502 (SPEC §4 Runtime)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, wait_until

pytestmark = pytest.mark.slow

# Serves (and passes its 0.2 s settle window), then dies 1.2 s after it started.
CRASHES_SOON = (
    "python3 -c \"import os, threading, time, runpy; "
    "threading.Thread(target=lambda: (time.sleep(1.2), os._exit(3)), daemon=True).start(); "
    "runpy.run_path('web.py', run_name='__main__')\""
)


def _instance(kw: Keelway) -> dict[str, Any]:
    return kw.ok("status", "--json").json()["apps"][0]["instances"][0]  # type: ignore[no-any-return]


def _web_crashes(kw: Keelway) -> int:
    events = kw.ok("events", "hello", "--json").json()["events"]
    return sum(1 for e in events if e["kind"] == "exit" and e["message"].startswith("web ")
               and "(code 3)" in e["message"])


def _slow_retry(kw: Keelway) -> dict[str, Any] | None:
    """The web's pending retry once the quick tries are spent (a minute away)."""
    crashed = [c for c in _instance(kw).get("crashed", []) if c["service"] == "web"]
    if crashed and crashed[0]["retry_at"] - time.time() > 30:
        return crashed[0]  # type: ignore[no-any-return]
    return None


def test_a_crash_loops_backoff_survives_a_control_plane_restart_and_gates_its_route(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    app = hello(tmp_path, "loop", settle="0.2s", web_cmd=CRASHES_SOON)
    kw.ok("deploy", "hello", str(app), "--host", "one.test")
    # Three quick retries (0.5, 1, 2 s), each crashing again: then a minute's wait.
    assert wait_until(lambda: _web_crashes(kw) >= 4, 30, 0.2)
    time.sleep(0.3)
    code, _body, headers = kw.get("one.test")
    assert code == 503, "a web waiting out its backoff must be gated, not a dead port"
    assert 30 < int(headers["Retry-After"]) <= 60
    retry = _slow_retry(kw)
    assert retry is not None and retry["failures"] == 4
    assert "web: crashed, next retry at" in kw.ok("status", "hello").out

    kw.kill_daemon()
    kw.up()
    after = _slow_retry(kw)
    assert after is not None, "the control-plane restart reset the backoff"
    assert (after["generation"], after["failures"], after["retry_at"]) == (
        retry["generation"], retry["failures"], retry["retry_at"])
    time.sleep(1.0)  # a restart at boot would be up (or crashed again) by now
    web = next(p for p in _instance(kw)["processes"] if p["service"] == "web")
    assert (web["id"], web["state"]) == (retry["generation"], "gone")
    assert kw.get("one.test")[0] == 503
