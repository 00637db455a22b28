"""Stop grace: a generation is stopped after its own service's stop_grace, the one of
the release it runs, wherever it is stopped (SPEC §4: SIGTERM, SIGKILL after
`stop_grace`) — not after the grace of the release that replaces it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.deploy.apps import hello
from tests.e2e.harness import Keelway

pytestmark = pytest.mark.slow

# A web that ignores SIGTERM (the app's own handler is never installed): only the
# SIGKILL after its stop_grace ends it, so how long a stop takes shows which grace ran.
# exec: the leader itself ignores it (a shell leader would die and take its tree along).
IGNORES_SIGTERM = (
    "exec python3 -c \"import runpy, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "signal.signal = lambda *_: None; runpy.run_path('web.py', run_name='__main__')\""
)


def _with_web_grace(app: Path, grace: str) -> Path:
    toml = app / "keelway.toml"
    text = toml.read_text()
    head, sep, tail = text.partition("[services.worker]")
    toml.write_text(head.replace('stop_grace = "2s"', f'stop_grace = "{grace}"') + sep + tail)
    return app


def test_a_retired_generation_is_killed_after_its_own_stop_grace_not_its_successors(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    stubborn = _with_web_grace(hello(tmp_path, "v1", web_cmd=IGNORES_SIGTERM), "0.5s")
    kw.ok("deploy", "hello", str(stubborn), "--host", "one.test")
    patient = _with_web_grace(hello(tmp_path, "v2", greeting="hi from"), "30s")
    start = time.monotonic()
    kw.ok("deploy", "hello", str(patient), "--mode", "overlap")
    took_s = time.monotonic() - start
    assert kw.get("one.test")[1].startswith(b"hi from one.test (v2)")
    # v1's 0.5 s, not v2's 30 s: the deploy retires v1 well inside the successor's grace.
    assert took_s < 20, f"the deploy took {took_s:.1f} s"

