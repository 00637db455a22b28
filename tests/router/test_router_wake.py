"""Parked routes: requests are held while the router asks the control plane to wake the
instance, once per instance however many requests and workers wait; and the activity
op the park sweep reads. The control plane here is a real unix socket server that
records wake requests and, when told, pushes a serving table over the control socket.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from keelway.router.client import activity_sync, push_table_sync
from keelway.router.control_wire import HostActivity
from keelway.router.proxy import ProxyOptions
from keelway.router.route_table import Handling, RouteEntry, RouteTable
from keelway.router.waker import WakeAnswer, Waker, outcome_of, wake_request
from tests.router.conftest import InProcessRouter, RouterProcess, Seen, Upstream, make_handler

HOST = "blog.test"
GET = f"GET /woken HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()


def parked(retry_after_s: int = 7) -> RouteEntry:
    return RouteEntry(state=Handling.PARKED, retry_after_s=retry_after_s)


class FakeControlPlane:
    """The control plane's API socket as far as a wake goes: records each request line,
    answers `status` (or, with `answer=False`, never), and calls `on_wake` first."""

    def __init__(self, path: Path, status: int = 202, answer: bool = True,
                 on_wake: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.wakes: list[str] = []
        self.bodies: list[bytes] = []
        # Wake requests open at once, per request line (so per host), and the most seen.
        self.open_now: dict[str, int] = {}
        self.most_open = 0
        self._lock = threading.Lock()
        self._release = threading.Event()
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(1000).decode()
                with fake._lock:
                    fake.open_now[line] = n = fake.open_now.get(line, 0) + 1
                    fake.most_open = max(fake.most_open, n)
                try:
                    length = 0
                    while (header := self.rfile.readline(1000)) not in (b"\r\n", b""):
                        name, _, value = header.decode().partition(":")
                        if name.lower() == "content-length":
                            length = int(value)
                    body = self.rfile.read(length)
                    with fake._lock:
                        fake.wakes.append(line.strip())
                        fake.bodies.append(body)
                    if on_wake is not None:
                        on_wake(line.split()[1])
                    if not answer:  # sit on it until the router hangs up
                        self.request.settimeout(0.05)
                        while not fake._release.is_set():
                            try:
                                if not self.request.recv(1):
                                    return
                            except TimeoutError:
                                continue
                            except OSError:
                                return
                        return
                    self.wfile.write(f"HTTP/1.1 {status} X\r\nContent-Length: 2\r\n"
                                     "Connection: close\r\n\r\n{}".encode())
                finally:
                    with fake._lock:
                        fake.open_now[line] -= 1

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05})
        self.thread.start()

    def stop(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        self.path.unlink(missing_ok=True)


class WideUpstream(ThreadingHTTPServer):
    # 50 held requests released at once connect at once: the stdlib's backlog of 5
    # would drop their SYNs and stall them for a retransmit.
    request_queue_size = 128
    daemon_threads = True


@pytest.fixture
def wide_upstream() -> Iterator[Upstream]:
    seen = Seen()
    server = WideUpstream(("127.0.0.1", 0), make_handler(seen))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield Upstream(server.server_address[1], seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def api_sock(tmp_path: Path) -> Path:
    return tmp_path / "api.sock"


def fetch(port: int, request: bytes = GET, timeout_s: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:") and (
                            len(body) >= int(line.split(b":")[1])):
                        return data


def fetch_all(port: int, n: int, request: bytes = GET
              ) -> tuple[list[bytes], list[threading.Thread]]:
    replies: list[bytes] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            reply = fetch(port, request.replace(b"Host:", b"Connection: close\r\nHost:"))
        except OSError as exc:
            reply = f"error {exc}".encode()
        with lock:
            replies.append(reply)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for thread in threads:
        thread.start()
    return replies, threads


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def open_of(router: RouterProcess, host: str = HOST) -> int:
    seen = activity_sync(router.control).get(host)
    return seen.open if seen is not None else 0


def serving(upstream: Upstream) -> dict[str, RouteEntry]:
    return {HOST: RouteEntry(state=Handling.SERVING, upstream=upstream.address)}


def start_parked(start_router: type[RouterProcess], api: Path, workers: int = 2,
                 hold_s: float = 10.0) -> RouterProcess:
    router = start_router(extra_argv=("--workers", str(workers), "--wake-socket", str(api),
                                      f"--hold-timeout={hold_s}"))
    router.push(1, {HOST: parked()})
    return router


@pytest.mark.slow
def test_fifty_requests_to_a_parked_host_make_one_wake_and_all_get_200(
    start_router: type[RouterProcess], wide_upstream: Upstream, api_sock: Path
) -> None:
    upstream = wide_upstream
    cp = FakeControlPlane(api_sock)
    try:
        router = start_parked(start_router, api_sock)
        replies, threads = fetch_all(router.port, 50)
        wait_for(lambda: open_of(router) == 50)  # all held, in both workers
        assert cp.wakes == [f"POST /v1/instances/{HOST}/wake HTTP/1.1"]
        assert cp.bodies == [b"{}"]
        push_table_sync(router.control, RouteTable(version=2, routes=serving(upstream)))
        for thread in threads:
            thread.join(10)
        assert len(replies) == 50
        assert [r for r in replies if not r.startswith(b"HTTP/1.1 200 ")] == []
        assert len(upstream.seen.requests) == 50
        assert len(cp.wakes) == 1
    finally:
        cp.stop()


@pytest.mark.slow
def test_a_wake_past_the_hold_bound_answers_503_with_retry_after(
    start_router: type[RouterProcess], api_sock: Path
) -> None:
    cp = FakeControlPlane(api_sock)  # takes the wake, and never publishes the route
    try:
        router = start_parked(start_router, api_sock, hold_s=0.5)
        started = time.monotonic()
        reply = fetch(router.port)
        waited = time.monotonic() - started
        assert reply.startswith(b"HTTP/1.1 503 ")
        assert b"\r\nRetry-After: 7\r\n" in reply
        assert 0.45 <= waited < 3.0
        assert len(cp.wakes) == 1
    finally:
        cp.stop()


@pytest.mark.slow
def test_a_request_held_while_the_control_plane_is_down_is_answered_once_it_is_back(
    start_router: type[RouterProcess], upstream: Upstream, api_sock: Path
) -> None:
    router = start_parked(start_router, api_sock, hold_s=10.0)

    def publish(_path: str) -> None:
        push_table_sync(router.control, RouteTable(version=2, routes=serving(upstream)))

    replies, threads = fetch_all(router.port, 3)
    wait_for(lambda: open_of(router) == 3)
    time.sleep(0.5)  # the router finds no control plane and keeps asking
    cp = FakeControlPlane(api_sock, on_wake=publish)
    try:
        started = time.monotonic()
        for thread in threads:
            thread.join(10)
        assert time.monotonic() - started < 2.0
        assert all(r.startswith(b"HTTP/1.1 200 ") for r in replies), replies
        assert len(cp.wakes) == 1
    finally:
        cp.stop()


@pytest.mark.slow
def test_a_refused_wake_answers_the_held_requests_503_at_once(
    start_router: type[RouterProcess], api_sock: Path
) -> None:
    cp = FakeControlPlane(api_sock, status=503)  # fenced
    try:
        router = start_parked(start_router, api_sock, hold_s=10.0)
        started = time.monotonic()
        reply = fetch(router.port)
        assert reply.startswith(b"HTTP/1.1 503 ") and b"\r\nRetry-After: 7\r\n" in reply
        assert time.monotonic() - started < 2.0
    finally:
        cp.stop()


def answered_503(reply: bytes, retry_after_s: int = 7) -> bool:
    """A whole 503 with its Retry-After (not a connection closed with nothing)."""
    return reply.startswith(b"HTTP/1.1 503 ") and (
        f"\r\nRetry-After: {retry_after_s}\r\n".encode() in reply)


@pytest.mark.slow
def test_requests_held_when_the_routers_main_process_is_killed_all_get_503_with_retry_after(
    start_router: type[RouterProcess], api_sock: Path
) -> None:
    cp = FakeControlPlane(api_sock)  # takes the wake, and never publishes the route
    try:
        router = start_parked(start_router, api_sock, workers=2, hold_s=20.0)
        replies, threads = fetch_all(router.port, 40)
        wait_for(lambda: open_of(router) == 40)  # all held, across the workers
        os.kill(router.pid, signal.SIGKILL)
        started = time.monotonic()
        for thread in threads:
            thread.join(15)
        assert len(replies) == 40
        assert [r for r in replies if not answered_503(r)] == []
        # At once, not when the hold bound or a drain deadline runs out.
        assert time.monotonic() - started < 3.0
    finally:
        cp.stop()


@pytest.mark.slow
def test_a_router_stopped_while_it_holds_requests_answers_them_503_at_once(
    start_router: type[RouterProcess], api_sock: Path
) -> None:
    cp = FakeControlPlane(api_sock)
    try:
        router = start_parked(start_router, api_sock, workers=1, hold_s=20.0)
        replies, threads = fetch_all(router.port, 5)
        wait_for(lambda: open_of(router) == 5)
        started = time.monotonic()
        router.proc.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(15)
        assert [r for r in replies if not answered_503(r)] == []
        assert time.monotonic() - started < 3.0  # the drain deadline is 5 s
        assert router.proc.wait(10) == 0
    finally:
        cp.stop()


@pytest.mark.slow
def test_the_hold_bound_of_a_host_counts_every_worker_and_leaves_other_hosts_alone(
    start_router: type[RouterProcess], wide_upstream: Upstream, api_sock: Path
) -> None:
    other = "other.test"
    cp = FakeControlPlane(api_sock)  # takes every wake; the test publishes
    try:
        router = start_router(extra_argv=(
            "--workers", "2", "--wake-socket", str(api_sock), "--hold-timeout=20",
            "--max-held-per-host=20"))
        router.push(1, {HOST: parked(), other: parked()})
        replies, threads = fetch_all(router.port, 30)
        # The excess over the bound is answered at once, whichever worker it landed in.
        wait_for(lambda: len(replies) >= 10 and open_of(router) == 20)
        time.sleep(0.3)
        assert len(replies) == 10
        assert [r for r in replies if not answered_503(r)] == []
        assert open_of(router) == 20
        # Another parked host still has its own bound: held too, none refused.
        others, other_threads = fetch_all(router.port, 5, GET.replace(HOST.encode(),
                                                                       other.encode()))
        wait_for(lambda: open_of(router, other) == 5)
        assert others == [] and len(replies) == 10
        push_table_sync(router.control, RouteTable(version=2, routes={
            HOST: RouteEntry(state=Handling.SERVING, upstream=wide_upstream.address),
            other: RouteEntry(state=Handling.SERVING, upstream=wide_upstream.address)}))
        for thread in [*threads, *other_threads]:
            thread.join(10)
        assert len(replies) == 30 and len(others) == 5
        assert sum(r.startswith(b"HTTP/1.1 200 ") for r in replies) == 20
        assert all(r.startswith(b"HTTP/1.1 200 ") for r in others)
        assert len(wide_upstream.seen.requests) == 25
    finally:
        cp.stop()


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_the_hold_slots_of_a_worker_that_died_are_free_again(
    start_router: type[RouterProcess], api_sock: Path
) -> None:
    cp = FakeControlPlane(api_sock)
    try:
        router = start_router(extra_argv=(
            "--workers", "2", "--wake-socket", str(api_sock), "--hold-timeout=20",
            "--max-held-per-host=4"))
        router.push(1, {HOST: parked()})
        _closed, threads = fetch_all(router.port, 4)
        wait_for(lambda: open_of(router) == 4)
        workers = _children(router.pid)
        assert len(workers) == 2
        for pid in workers:
            os.kill(pid, signal.SIGKILL)  # their held requests close with them
        for thread in threads:
            thread.join(10)
        wait_for(lambda: len(set(_children(router.pid)) - set(workers)) == 2, 15)
        wait_for(lambda: open_of(router) == 0)
        # Every slot the dead workers had is free: four more are held, none refused.
        again, threads = fetch_all(router.port, 4)
        wait_for(lambda: open_of(router) == 4)
        time.sleep(0.3)
        assert again == []
    finally:
        cp.stop()


class TunnelUpstream:
    """An upstream that switches every request to a tunnel (101) and echoes."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\n\r\n")
            while chunk := conn.recv(4096):
                conn.sendall(chunk)

    def close(self) -> None:
        self.sock.close()


UPGRADE = (b"GET /ws HTTP/1.1\r\nHost: ws.test\r\nConnection: Upgrade\r\n"
           b"Upgrade: websocket\r\n\r\n")


@pytest.mark.slow
def test_activity_counts_open_websockets_and_idle_time_across_workers(
    start_router: type[RouterProcess], upstream: Upstream
) -> None:
    tunnels = TunnelUpstream()
    router = start_router(extra_argv=("--workers", "2"))
    try:
        router.push(1, {"ws.test": RouteEntry(state=Handling.SERVING, upstream=tunnels.address),
                        "quiet.test": RouteEntry(state=Handling.SERVING,
                                            upstream=upstream.address)})
        first = activity_sync(router.control)
        assert set(first) == {"ws.test", "quiet.test"}
        assert first["ws.test"].open == 0
        clients = []
        for _ in range(6):  # the kernel spreads them over both workers' accepts
            client = socket.create_connection(("127.0.0.1", router.port), timeout=5)
            client.sendall(UPGRADE)
            assert client.recv(4096).startswith(b"HTTP/1.1 101 ")
            clients.append(client)
        time.sleep(0.6)
        seen = activity_sync(router.control)
        assert seen["ws.test"] == HostActivity(idle_s=0.0, open=6)
        assert seen["quiet.test"].open == 0 and seen["quiet.test"].idle_s >= 0.5
        for client in clients:
            client.close()
        wait_for(lambda: activity_sync(router.control)["ws.test"].open == 0)
        time.sleep(0.5)
        assert activity_sync(router.control)["ws.test"].idle_s >= 0.4
        assert fetch(router.port, GET.replace(HOST.encode(), b"quiet.test")).startswith(
            b"HTTP/1.1 200 ")
        assert activity_sync(router.control)["quiet.test"].idle_s < 0.3
    finally:
        router.stop()
        tunnels.close()


@pytest.fixture
def hostile(api_sock: Path) -> Iterator[tuple[InProcessRouter, FakeControlPlane, Waker]]:
    cp = FakeControlPlane(api_sock, answer=False)  # takes the wake and sits on it
    options = ProxyOptions(hold_timeout_s=1.5, max_held=64, max_held_per_host=20,
                           drain_timeout_s=0.1)
    router = InProcessRouter({HOST: parked(), "other.test": parked()}, options)

    async def attach() -> Waker:
        return Waker(router.proxy, api_sock)

    waker = asyncio.run_coroutine_threadsafe(attach(), router.loop).result(5)
    try:
        yield router, cp, waker
    finally:
        asyncio.run_coroutine_threadsafe(waker.close(), router.loop).result(5)
        router.stop()
        cp.stop()


@pytest.mark.slow
def test_a_flood_to_a_parked_host_stays_in_its_bound_and_makes_one_wake(
    hostile: tuple[InProcessRouter, FakeControlPlane, Waker]
) -> None:
    router, cp, waker = hostile

    async def held() -> dict[str, int]:
        return router.proxy.held_counts()

    replies, threads = fetch_all(router.port, 200)
    most = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        counts = asyncio.run_coroutine_threadsafe(held(), router.loop).result(5)
        most = max(most, counts.get(HOST, 0))
        time.sleep(0.02)
    assert 0 < most <= 20
    # Another parked host still has room: the flood took only its own host's share.
    assert fetch(router.port, GET.replace(HOST.encode(), b"other.test"),
                 timeout_s=5).startswith(b"HTTP/1.1 503 ")
    for thread in threads:
        thread.join(10)
    assert len(replies) == 200
    assert all(r.startswith(b"HTTP/1.1 503 ") for r in replies)
    # One wake open at a time. A wake nobody answers is asked again only after it timed
    # out at the bound of the requests held when it was sent, while later ones wait.
    # A post sent just before the bound reaches the fake's thread a moment after the
    # waker counted it: under load (CI) that thread may not have recorded it yet.
    deadline = time.monotonic() + 5
    while len([w for w in cp.wakes if HOST in w]) < waker.posts[HOST] and (
            time.monotonic() < deadline):
        time.sleep(0.02)
    assert cp.most_open == 1
    host_wakes = [w for w in cp.wakes if HOST in w]
    assert host_wakes[0] == f"POST /v1/instances/{HOST}/wake HTTP/1.1"
    assert 1 <= len(host_wakes) == waker.posts[HOST] <= 3


@pytest.mark.slow
def test_a_wake_taken_by_a_control_plane_that_then_died_is_asked_of_its_successor(
    start_router: type[RouterProcess], upstream: Upstream, api_sock: Path
) -> None:
    router = start_parked(start_router, api_sock, workers=1, hold_s=10.0)
    first = FakeControlPlane(api_sock)  # takes the wake, then dies before publishing
    replies, threads = fetch_all(router.port, 2)
    wait_for(lambda: len(first.wakes) == 1)
    first.stop()

    def publish(_path: str) -> None:
        push_table_sync(router.control, RouteTable(version=2, routes=serving(upstream)))

    second = FakeControlPlane(api_sock, on_wake=publish)
    started = time.monotonic()
    try:
        for thread in threads:
            thread.join(10)
        # Asked again because the socket is a new one, not after WAKE_REASK_S.
        assert time.monotonic() - started < 2.0
        assert all(r.startswith(b"HTTP/1.1 200 ") for r in replies), replies
        assert len(second.wakes) == 1
    finally:
        second.stop()


@pytest.mark.parametrize(("line", "outcome"), [
    (b"HTTP/1.1 202 Accepted\r\n", WakeAnswer.ACCEPTED),
    (b"HTTP/1.1 200 OK\r\n", WakeAnswer.ACCEPTED),
    (b"HTTP/1.1 409 Conflict\r\n", WakeAnswer.REFUSED),
    (b"HTTP/1.1 503 Service Unavailable\r\n", WakeAnswer.REFUSED),
    (b"HTTP/1.1 500 Internal Server Error\r\n", WakeAnswer.UNREACHABLE),
    (b"", WakeAnswer.UNREACHABLE),
    (b"garbage\r\n", WakeAnswer.UNREACHABLE),
])
def test_what_a_wake_answer_means(line: bytes, outcome: WakeAnswer) -> None:
    assert outcome_of(line)[0] is outcome


def test_the_wake_request_is_a_post_of_an_empty_object() -> None:
    assert wake_request("blog.test") == (
        b"POST /v1/instances/blog.test/wake HTTP/1.1\r\nHost: keelway\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")


ALIAS = "www.blog.test"


@pytest.mark.slow
def test_requests_to_an_alias_of_a_parked_instance_wake_the_instance_by_its_own_name(
    start_router: type[RouterProcess], wide_upstream: Upstream, api_sock: Path
) -> None:
    cp = FakeControlPlane(api_sock)
    try:
        router = start_parked(start_router, api_sock)
        router.push(2, {HOST: parked(), ALIAS: RouteEntry(state=Handling.PARKED,
                                                     retry_after_s=7, instance=HOST)})
        by_alias = GET.replace(HOST.encode(), ALIAS.encode())
        replies, threads = fetch_all(router.port, 10, by_alias)
        more, more_threads = fetch_all(router.port, 10)
        # Held, counted and woken as the instance, whichever host they named.
        wait_for(lambda: open_of(router) == 20)
        assert ALIAS not in activity_sync(router.control)
        assert cp.wakes == [f"POST /v1/instances/{HOST}/wake HTTP/1.1"]
        push_table_sync(router.control, RouteTable(version=3, routes={
            HOST: RouteEntry(state=Handling.SERVING, upstream=wide_upstream.address),
            ALIAS: RouteEntry(state=Handling.SERVING, upstream=wide_upstream.address,
                         instance=HOST)}))
        for thread in threads + more_threads:
            thread.join(10)
        assert all(r.startswith(b"HTTP/1.1 200 ") for r in replies + more), replies + more
    finally:
        cp.stop()


@pytest.mark.slow
@pytest.mark.parametrize(("status", "page"), [(409, b"down for maintenance"),
                                              (503, b"restarting")])
def test_a_refused_wake_answers_an_alias_with_the_page_of_the_refusal(
    start_router: type[RouterProcess], api_sock: Path, status: int, page: bytes
) -> None:
    cp = FakeControlPlane(api_sock, status=status)
    try:
        router = start_parked(start_router, api_sock, hold_s=10.0)
        router.push(2, {HOST: parked(), ALIAS: RouteEntry(state=Handling.PARKED,
                                                     retry_after_s=7, instance=HOST)})
        started = time.monotonic()
        reply = fetch(router.port, GET.replace(HOST.encode(), ALIAS.encode()))
        assert answered_503(reply) and page in reply and b"busy" not in reply, reply
        assert time.monotonic() - started < 2.0
        assert cp.wakes == [f"POST /v1/instances/{HOST}/wake HTTP/1.1"]
    finally:
        cp.stop()
