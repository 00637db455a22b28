"""The router counts its responses per instance and status class, its own answers
apart, across all its workers (issue #19: a rollout is judged on them)."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from keelway.router.client import responses_sync
from keelway.router.counts import InstanceCounts, ResponseCounts, summed
from keelway.router.proxy import ProxyOptions
from keelway.router.route_table import Handling, RouteEntry
from tests.router.conftest import InProcessRouter, RouterProcess, free_port


class StatusHandler(BaseHTTPRequestHandler):
    """`GET /NNN` answers status NNN; `/slow` answers 200 after half a second."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(0.5)
            status = 200
        else:
            status = int(self.path.strip("/") or "200")
        self.send_response(status)
        if status in (204, 304):  # no body, by their definition
            self.end_headers()
            return
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def app() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StatusHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _routes(app: str) -> dict[str, RouteEntry]:
    return {
        "a.test": RouteEntry(state=Handling.SERVING, upstream=app),
        "www.a.test": RouteEntry(state=Handling.SERVING, upstream=app, instance="a.test"),
        "b.test": RouteEntry(state=Handling.SERVING, upstream=app),
        "stopped.test": RouteEntry(state=Handling.STOPPED),
        "down.test": RouteEntry(state=Handling.SERVING, upstream=f"127.0.0.1:{free_port()}"),
        "held.test": RouteEntry(state=Handling.HOLDING, retry_after_s=3),
    }


def get(port: int, host: str, path: str = "/") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _traffic(port: int) -> None:
    """Requests of every kind, the same in every test; EXPECTED is what they count."""
    for path in ("/200", "/200", "/204", "/404", "/302"):
        get(port, "a.test", path)
    get(port, "WWW.A.test:80", "/500")  # an alias, in another spelling: a.test's
    get(port, "www.a.test", "/503")  # the app's own 503, never the router's
    get(port, "b.test", "/201")
    get(port, "b.test", "/600")  # outside 100..599: counted, as "other"
    assert get(port, "stopped.test") == 503
    assert get(port, "stopped.test") == 503
    assert get(port, "down.test") == 502
    assert get(port, "held.test") == 503  # waits out --hold-timeout
    # Counted for no instance: no route, the health path, what the router refuses.
    assert get(port, "nobody.test") == 404
    assert get(port, "a.test", "/_keelway/health") == 200
    assert raw(port, b"GET / HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400")  # no Host
    assert raw(port, b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n").startswith(
        b"HTTP/1.1 400")
    assert raw(port, b"GET / HTTP/1.1\r\nHost: a.test\r\nX: " + b"y" * 70_000
               + b"\r\n\r\n").startswith(b"HTTP/1.1 431")
    assert raw(port, b"BREW /pot HTCPCP/1.0\r\nHost: a.test\r\n\r\n").startswith(
        b"HTTP/1.1 400")


EXPECTED = {
    "a.test": InstanceCounts(app={"2xx": 3, "3xx": 1, "4xx": 1, "5xx": 2}),
    "b.test": InstanceCounts(app={"2xx": 1, "other": 1}),
    "stopped.test": InstanceCounts(router={"503": 2}),
    "down.test": InstanceCounts(router={"502": 1}),
    "held.test": InstanceCounts(router={"503": 1}),
}


def _nonzero(report: ResponseCounts) -> dict[str, InstanceCounts]:
    return {i: c for i, c in report.instances.items() if c.total()}


def worker_pids(router: RouterProcess) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if int(fields[1]) == router.pid and fields[0] != b"Z":
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_responses_are_counted_per_instance_and_class_across_workers(
    start_router: type[RouterProcess], app: str, workers: int
) -> None:
    router = start_router(extra_argv=("--workers", str(workers), "--hold-timeout", "0.3"))
    router.push(1, _routes(app))
    before = responses_sync(router.control)
    assert _nonzero(before) == {}
    assert abs(before.started_at - time.time()) < 60 and before.worker_restarts == 0
    _traffic(router.port)
    after = responses_sync(router.control)
    assert after.incarnation == before.incarnation
    assert _nonzero(after) == EXPECTED
    # An alias never has counts of its own; every instance of the table is named.
    assert set(after.instances) == {"a.test", "b.test", "stopped.test", "down.test",
                                    "held.test"}
    a = after.of("a.test")
    assert (a.app_5xx(), a.router_5xx(), a.total()) == (2, 0, 7)
    assert after.of("stopped.test").router_5xx() == 2
    assert after.of("nobody.test") == InstanceCounts()
    assert after.since(before) == {**{i: InstanceCounts() for i in after.instances},
                                   **EXPECTED}
    # Reading the counts changes none of them.
    assert responses_sync(router.control).instances == after.instances


def test_counts_survive_a_worker_killed_and_started_again(
    start_router: type[RouterProcess], app: str
) -> None:
    router = start_router(extra_argv=("--workers", "2", "--hold-timeout", "0.3"))
    router.push(1, _routes(app))
    # Enough requests that both workers take some (each new connection goes to one).
    for _ in range(40):
        assert get(router.port, "a.test", "/200") == 200
    counted = responses_sync(router.control)
    assert counted.of("a.test").app == {"2xx": 40}
    victim = worker_pids(router)[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while True:
        report = responses_sync(router.control)
        # Never fewer than before, however the report falls against the death.
        assert report.of("a.test").app == {"2xx": 40}
        pids = worker_pids(router)
        if victim not in pids and len(pids) == 2 and report.worker_restarts == 1:
            break
        assert time.monotonic() < deadline, "the worker was not started again"
        time.sleep(0.05)
    for _ in range(10):
        assert get(router.port, "www.a.test", "/500") == 500
    report = responses_sync(router.control)
    assert report.of("a.test").app == {"2xx": 40, "5xx": 10}
    assert report.incarnation == counted.incarnation


def test_a_restarted_router_is_a_new_incarnation_counting_from_zero(
    start_router: type[RouterProcess], app: str, tmp_path: Path
) -> None:
    first = start_router(extra_argv=("--hold-timeout", "0.3"))
    first.push(1, _routes(app))
    get(first.port, "a.test", "/200")
    before = responses_sync(first.control)
    assert before.of("a.test").app == {"2xx": 1}
    assert first.stop() == 0
    second = start_router(extra_argv=("--hold-timeout", "0.3"))  # the same table file
    get(second.port, "a.test", "/200")
    after = responses_sync(second.control)
    assert after.incarnation != before.incarnation and after.started_at >= before.started_at
    assert after.of("a.test").app == {"2xx": 1}
    assert after.since(before) is None  # what came between cannot be told


def test_a_request_held_across_a_swap_counts_for_its_instance(
    start_router: type[RouterProcess], app: str
) -> None:
    router = start_router(extra_argv=("--hold-timeout", "5"))
    held = {"c.test": RouteEntry(state=Handling.HOLDING),
            "www.c.test": RouteEntry(state=Handling.HOLDING, instance="c.test")}
    router.push(1, held)
    answers: list[int] = []
    waiting = threading.Thread(target=lambda: answers.append(
        get(router.port, "www.c.test", "/200")))
    waiting.start()
    time.sleep(0.3)
    router.push(2, {"c.test": RouteEntry(state=Handling.SERVING, upstream=app),
                    "www.c.test": RouteEntry(state=Handling.SERVING, upstream=app,
                                        instance="c.test")})
    waiting.join(10)
    assert answers == [200]
    assert _nonzero(responses_sync(router.control)) == {
        "c.test": InstanceCounts(app={"2xx": 1})}


def test_the_routers_504_is_its_own_answer(app: str) -> None:
    proxy = InProcessRouter({"slow.test": RouteEntry(state=Handling.SERVING, upstream=app)},
                            ProxyOptions(upstream_timeout_s=0.1))
    try:
        assert get(proxy.port, "slow.test", "/slow") == 504
        assert get(proxy.port, "slow.test", "/500") == 500
        assert proxy.proxy.response_counts() == {
            "slow.test": InstanceCounts(app={"5xx": 1}, router={"504": 1})}
    finally:
        proxy.stop()


def test_reports_sum_and_subtract_by_key() -> None:
    one = {"a.test": InstanceCounts(app={"2xx": 2}, router={"503": 1})}
    two = {"a.test": InstanceCounts(app={"2xx": 1, "5xx": 1}),
           "b.test": InstanceCounts(app={"4xx": 1})}
    total = summed(one, two)
    assert total == {"a.test": InstanceCounts(app={"2xx": 3, "5xx": 1}, router={"503": 1}),
                     "b.test": InstanceCounts(app={"4xx": 1})}
    later = ResponseCounts(incarnation="x", started_at=0.0, instances=total)
    earlier = ResponseCounts(incarnation="x", started_at=0.0, instances=one)
    assert later.since(earlier) == {"a.test": InstanceCounts(app={"2xx": 1, "5xx": 1}),
                                    "b.test": InstanceCounts(app={"4xx": 1})}
