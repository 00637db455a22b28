"""A tenant's limits through the real CLI (issue #20): one tenant allocating without
bound is killed at its own memory limit, said as such in `status` and `events`, and
restarted with backoff, while another tenant's requests keep their latency and the
router and control plane carry on; a fork bomb stops at its process limit, said as
such; `doctor` says which limits the box enforces."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from pathlib import Path

import pytest

from keelway.router.client import get_table_sync
from tests.e2e.harness import Keelway, wait_until

pytestmark = pytest.mark.slow

# A web whose /hog allocates up to 400 MB (8 MB at a time, every page touched) and then
# answers; everything else answers at once.
HOG_WEB = '''\
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/hog":
            chunks = [bytearray(8 << 20) for _ in range(50)]
        if self.path == "/bomb":
            # Forks up to 200 sleepers (each gone within 5 s), then the web exits as a
            # crash: its tree's process limit is what it ran into.
            for _ in range(200):
                try:
                    if os.fork() == 0:
                        import time
                        time.sleep(5)
                        os._exit(0)
                except OSError:
                    break
            os._exit(3)
        body = b"ok " + os.environ["KEELWAY_INSTANCE"].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
'''


def _app(root: Path, name: str, memory: str) -> Path:
    app = root / name
    app.mkdir(parents=True)
    (app / "web.py").write_text(HOG_WEB)
    (app / "Procfile").write_text("web: python3 web.py\n")
    (app / "keelway.toml").write_text(
        f'[services.web]\nsettle = "0.2s"\nstop_grace = "2s"\nmemory = "{memory}"\n'
        "pids = 64\nnofile = 1024\n")
    return app


def _latencies(kw: Keelway, host: str, n: int) -> list[float]:
    took = []
    for _ in range(n):
        began = time.perf_counter()
        status, _body, _ = kw.get(host, "/")
        assert status == 200
        took.append(time.perf_counter() - began)
    return took


def test_a_tenant_past_its_memory_limit_is_killed_alone_and_said_so(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    checks = {c["check"]: c for c in kw.run("doctor", "--json").json()["checks"]}
    if not checks["memory limit"]["ok"]:
        pytest.skip(f"this box enforces no memory limit: {checks['memory limit']['detail']}")
    kw.ok("deploy", "hog", str(_app(tmp_path, "hog", "64M")), "--host", "hog.test")
    kw.ok("deploy", "calm", str(_app(tmp_path, "calm", "256M")), "--host", "calm.test")
    before = _latencies(kw, "calm.test", 40)

    during: list[float] = []
    hogging = threading.Thread(target=lambda: kw.get("hog.test", "/hog", timeout_s=20))
    hogging.start()
    during += _latencies(kw, "calm.test", 40)
    hogging.join(30)

    # Killed at its own limit, and said so; the other tenant never noticed.
    def killed() -> bool:
        inst = kw.ok("status", "--json").json()["apps"]
        hog = next(a for a in inst if a["name"] == "hog")["instances"][0]
        return any(p["exit_cause"] == "killed: out of memory at its 64M limit"
                   for p in hog["processes"])

    assert wait_until(killed, 20)
    events = kw.ok("events", "hog", "--json").json()["events"]
    assert any("killed: out of memory at its 64M limit" in e["message"] for e in events)
    p99 = statistics.quantiles(before + during, n=100)[98]
    assert max(during) <= max(2 * p99, 0.25), (before, during)
    # Restarted after its backoff, serving again; the router and the control plane stay.
    assert wait_until(lambda: kw.get("hog.test", "/")[0] == 200, 30)
    assert kw.ok("status", "--json").json()["router"]["state"] == "serving"
    assert kw.get("calm.test", "/")[0] == 200


def test_a_fork_bomb_stops_at_its_process_limit_said_so_and_hurts_no_one_else(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    checks = {c["check"]: c for c in kw.run("doctor", "--json").json()["checks"]}
    if not checks["pids limit"]["ok"]:
        pytest.skip(f"this box enforces no process limit: {checks['pids limit']['detail']}")
    kw.ok("deploy", "bomb", str(_app(tmp_path, "bomb", "256M")), "--host", "bomb.test")
    kw.ok("deploy", "calm", str(_app(tmp_path, "calm", "256M")), "--host", "calm.test")
    with contextlib.suppress(OSError):
        kw.get("bomb.test", "/bomb", timeout_s=20)  # the web exits before it answers

    def said() -> bool:
        apps = kw.ok("status", "--json").json()["apps"]
        bomb = next(a for a in apps if a["name"] == "bomb")["instances"][0]
        return any(p["exit_cause"] == "hit its limit of 64 processes"
                   for p in bomb["processes"])

    assert wait_until(said, 20)
    events = kw.ok("events", "bomb", "--json").json()["events"]
    assert any("hit its limit of 64 processes" in e["message"] for e in events)
    # The other tenant, the router and the control plane carry on; the bomb's web is
    # restarted after its backoff.
    assert kw.get("calm.test", "/")[0] == 200
    assert kw.ok("status", "--json").json()["router"]["state"] == "serving"
    assert wait_until(lambda: kw.get("bomb.test", "/")[0] == 200, 30)


def test_an_apps_http_max_concurrency_reaches_the_router_for_every_host_of_it(
        kw: Keelway, tmp_path: Path) -> None:
    """`[http] max_concurrency` in keelway.toml is the bound the router holds each of the
    app's instances to, on the instance's own host and its aliases alike; an app that
    sets none gets the router's default (no bound in its entries)."""
    kw.up()
    bounded = _app(tmp_path, "bounded", "256M")
    with (bounded / "keelway.toml").open("a") as toml:
        toml.write("[http]\nmax_concurrency = 3\n")
    kw.ok("deploy", "bounded", str(bounded), "--host", "b.test")
    kw.ok("domains", "add", "b.test", "www.b.test")
    kw.ok("deploy", "plain", str(_app(tmp_path, "plain", "256M")), "--host", "p.test")
    routes = get_table_sync(kw.home / "router" / "control.sock").routes
    assert routes["b.test"].max_concurrency == 3
    assert routes["www.b.test"].max_concurrency == 3
    assert routes["p.test"].max_concurrency is None
