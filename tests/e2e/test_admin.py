"""The admin listener against a real daemon and real traffic: /metrics parsed with
prometheus-client's parser, the token rule on a live listener, the headers a browser
needs, and the dashboard in headless Chromium checked against `status --json`."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from keelway.api.admin import SECURITY_HEADERS
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, free_port, wait_until

pytestmark = pytest.mark.slow

TOKEN = "an-admin-token-for-tests-0123456789"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def fetch(port: int, path: str, headers: dict[str, str] | None = None, method: str = "GET",
          body: str | None = None) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, answer.read(), dict(answer.getheaders())
    finally:
        conn.close()


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    status, body, headers = fetch(port, "/metrics")
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_count_what_was_sent_per_app_then_per_instance_across_an_up(
        kw: Keelway, tmp_path: Path) -> None:
    admin = free_port()
    kw.up("--admin", f"127.0.0.1:{admin}")
    kw.ok("deploy", "hello", str(hello(tmp_path, "h")), "--host", "a.test",
          "--host", "b.test")
    for _ in range(7):
        assert kw.get("a.test")[0] == 200
    for _ in range(3):
        assert kw.get("b.test")[0] == 200
    kw.ok("park", "b.test")
    assert kw.get("b.test")[0] == 200  # woken by the request
    kw.ok("stop", "hello", "--instance", "a.test")
    assert kw.get("a.test")[0] == 503  # the router's own answer
    got = scrape(admin)
    assert value(got, "keelway_router_up") == 1
    assert value(got, "keelway_http_requests_total", app="hello", source="app",
                 **{"class": "2xx"}) == 11
    assert value(got, "keelway_http_requests_total", app="hello", source="router",
                 **{"class": "5xx"}) == 1
    assert not any(dict(labels).get("instance") for _, labels in got)
    assert value(got, "keelway_instances", app="hello", state="running") == 1
    assert value(got, "keelway_instances", app="hello", state="stopped") == 1
    assert value(got, "keelway_operations_total", app="hello", kind="park",
                 outcome="succeeded") == 1
    assert value(got, "keelway_operations_total", app="hello", kind="wake",
                 outcome="succeeded") == 1
    assert value(got, "keelway_operations_total", app="hello", kind="deploy",
                 outcome="succeeded") == 2
    assert value(got, "keelway_wake_duration_seconds_count", app="hello") == 1
    assert value(got, "keelway_wake_duration_seconds_bucket", app="hello", le="+Inf") == 1
    assert 0 < value(got, "keelway_wake_duration_seconds_sum", app="hello") < 60

    # `down --keep-apps` keeps the router and its counts; the next `up`, not naming
    # --admin, serves where the last one asked, per instance now.
    kw.ok("down", "--keep-apps")
    kw.up("--metrics-per-instance")
    per = scrape(admin)
    assert value(per, "keelway_http_requests_total", app="hello", instance="a.test",
                 source="app", **{"class": "2xx"}) == 7
    assert value(per, "keelway_http_requests_total", app="hello", instance="b.test",
                 source="app", **{"class": "2xx"}) == 4
    assert value(per, "keelway_instance_state", app="hello", instance="a.test",
                 state="stopped") == 1
    # `--admin off` stops it, and the next `up` does not bring it back.
    kw.ok("down", "--keep-apps")
    kw.up("--admin", "off")
    with pytest.raises(OSError):
        fetch(admin, "/metrics")


def test_every_answer_carries_the_browser_headers_and_nothing_mutates(
        kw: Keelway) -> None:
    admin = free_port()
    kw.up("--admin", f"127.0.0.1:{admin}")
    for path in ("/", "/dashboard.js", "/metrics", "/api/overview", "/nothing-here",
                 "/api/instances/nobody.test"):
        _status, _body, headers = fetch(admin, path)
        for name, expected in SECURITY_HEADERS.items():
            assert headers.get(name) == expected, (path, name)
    status, body, _ = fetch(admin, "/")
    assert status == 200 and b"<script" in body
    # No inline script: every <script> names a file of this listener.
    assert all(b"src=" in tag for tag in re.findall(rb"<script[^>]*>", body))
    assert fetch(admin, "/api/overview", method="POST")[0] == 405
    assert fetch(admin, "/metrics", method="DELETE")[0] == 405


def test_with_a_token_set_the_listener_requires_it_and_never_says_it(
        kw: Keelway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEELWAY_ADMIN_TOKEN", TOKEN)
    admin = free_port()
    kw.up("--admin", f"127.0.0.1:{admin}")
    assert fetch(admin, "/metrics")[0] == 401
    assert fetch(admin, "/api/overview", {"Authorization": "Bearer wrong"})[0] == 401
    status, _, headers = fetch(admin, "/", {"Accept": "text/html"})
    assert (status, headers["Location"]) == (303, "/login")
    assert headers["Content-Security-Policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    assert fetch(admin, "/metrics", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert fetch(admin, "/login")[0] == 200  # the form, to anyone
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert fetch(admin, "/login", form, "POST", "token=wrong")[0] == 401
    status, _, headers = fetch(admin, "/login", form, "POST", f"token={TOKEN}")
    assert status == 303
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert fetch(admin, "/api/overview", {"Cookie": cookie.split(";")[0]})[0] == 200
    # Off loopback without it, `up` refuses before anything starts.
    monkeypatch.delenv("KEELWAY_ADMIN_TOKEN")
    kw.ok("down")
    refused = kw.run("up", "-d", "--admin", f"0.0.0.0:{free_port()}")
    assert refused.code == 2 and "KEELWAY_ADMIN_TOKEN" in refused.err
    logged = b"".join(p.read_bytes() for p in kw.home.rglob("*.log"))
    assert TOKEN.encode() not in logged


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium (.ci/run installs it)")
def test_the_dashboard_in_headless_chromium_shows_what_status_says(
        kw: Keelway, tmp_path: Path) -> None:
    admin = free_port()
    kw.up("--admin", f"127.0.0.1:{admin}")
    kw.ok("deploy", "hello", str(hello(tmp_path, "h")), "--host", "a.test",
          "--host", "b.test", "--host", "c.test")
    kw.ok("park", "b.test")
    kw.ok("stop", "hello", "--instance", "c.test")
    status = kw.ok("status", "--json").json()
    expected = {i["host"]: i["state"] for a in status["apps"] for i in a["instances"]}
    assert expected == {"a.test": "running", "b.test": "parked", "c.test": "stopped"}
    url = f"http://127.0.0.1:{admin}/"
    out = Path(os.environ.get("KEELWAY_ARTIFACTS") or tempfile.mkdtemp(prefix="kw-shot-"))
    out.mkdir(parents=True, exist_ok=True)
    profile = tmp_path / "chromium-profile"
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}",
            "--virtual-time-budget=8000", "--window-size=1280,900"]

    def dom() -> str:
        done = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True,
                              timeout=90)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    shown: dict[str, str] = {}

    journal: list[str] = []

    def rendered() -> bool:
        page = dom()
        shown.clear()
        shown.update(re.findall(r'<tr class="pick" data-host="([^"]+)" data-state="([^"]+)"',
                                page))
        journal[:] = re.findall(r'data-op="(\d+)"', page)
        return len(shown) == 3 and len(journal) >= 3

    assert wait_until(rendered, timeout_s=120, interval_s=1), shown
    assert shown == expected
    # The first app's journal, step by step: its deploy, park and stop.
    ops = kw.ok("ops", "hello", "--json").json()
    assert {str(op["id"]) for op in ops["operations"]} >= set(journal)
    shot = out / "dashboard.png"
    done = subprocess.run([*base, f"--screenshot={shot}", url], capture_output=True,
                          timeout=90)
    assert done.returncode == 0 and shot.stat().st_size > 1000, done.stderr[-2000:]
