"""The per-instance bound on requests in flight: past it 503 + Retry-After for that
instance only; every slot comes back however its request ends; one bound across workers.

Real parts only: the router (in this process, or as its own process with workers), and
loopback upstreams, one of which keeps its `/gate` requests until the test opens the
gate (each waits 10 s at most), counting how many it has at once.
"""

from __future__ import annotations

import functools
import socket
import socketserver
import statistics
import struct
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from keelway.router.client import activity_sync, responses_sync
from keelway.router.concurrency import FULL_HOLDOFF_S
from keelway.router.proxy import ProxyOptions
from keelway.router.route_table import Handling, RouteEntry, RouteTable
from tests.router.conftest import InProcessRouter, RouterProcess, Upstream, free_port

OPTIONS = ProxyOptions(drain_timeout_s=0.1, hold_timeout_s=5.0)
GATE_WAIT_S = 10.0


class _WideServer(ThreadingHTTPServer):
    request_queue_size = 128  # a burst connects at once: the stdlib's 5 would drop SYNs
    daemon_threads = True


class GateUpstream:
    """`GET /gate` waits for `opened` (at most GATE_WAIT_S); anything else answers at once.
    `now` and `most`: gate requests it has at once, now and at most."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self._lock = threading.Lock()
        self.now = self.most = 0
        gate = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if self.path == "/gate":
                    with gate._lock:
                        gate.now += 1
                        gate.most = max(gate.most, gate.now)
                    try:
                        gate.opened.wait(GATE_WAIT_S)
                    finally:
                        with gate._lock:
                            gate.now -= 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = _WideServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05})
        self.thread.start()
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.opened.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class BreakingUpstream(socketserver.ThreadingTCPServer):
    """Reads a request head, begins a 100-byte answer, and closes after 7 of them."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := self.request.recv(4096)):
                    data += chunk
                self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05})
        self.thread.start()
        self.address = f"127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(5)


class TunnelUpstream:
    """Answers every request 101 and then echoes, until the client closes."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

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
            conn.settimeout(GATE_WAIT_S)
            try:
                data = b""
                while b"\r\n\r\n" not in data and (chunk := conn.recv(4096)):
                    data += chunk
                conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                             b"Connection: Upgrade\r\n\r\n")
                while chunk := conn.recv(4096):
                    conn.sendall(chunk)
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def gate() -> Iterator[GateUpstream]:
    upstream = GateUpstream()
    yield upstream
    upstream.close()


def serving(upstream: str, max_concurrency: int | None = None,
            instance: str | None = None) -> RouteEntry:
    return RouteEntry(state=Handling.SERVING, upstream=upstream,
                      max_concurrency=max_concurrency, instance=instance)


class Answer:
    def __init__(self, status: int, head: bytes, body: bytes, elapsed_s: float) -> None:
        self.status, self.head, self.body, self.elapsed_s = status, head, body, elapsed_s


def get(port: int, host: str, path: str = "/", timeout_s: float = 15.0) -> Answer:
    """One GET on its own connection, read to the end of its answer."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    return Answer(status, head, body, time.monotonic() - started)


def _length(data: bytes) -> int:
    for line in data.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def in_background(call: Callable[[], Answer]) -> tuple[list[Answer], threading.Thread]:
    answers: list[Answer] = []
    thread = threading.Thread(target=lambda: answers.append(call()))
    thread.start()
    return answers, thread


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def at_limit(answer: Answer) -> bool:
    return (answer.status == 503 and b"\r\nRetry-After: 1" in answer.head
            and b"limit of concurrent requests" in answer.body)


def in_flight(router: InProcessRouter) -> dict[str, int]:
    async def read() -> dict[str, int]:
        return router.proxy.concurrency.counts()

    return router._run(read())


def swap(router: InProcessRouter, version: int, routes: dict[str, RouteEntry]) -> None:
    async def apply() -> None:
        router.proxy.swap(RouteTable(version=version, routes=routes))

    router._run(apply())


def test_an_instance_at_its_bound_gets_503_at_once_while_another_is_answered_promptly(
    gate: GateUpstream, upstream: Upstream
) -> None:
    router = InProcessRouter({"slow.test": serving(gate.address, max_concurrency=3),
                              "www.slow.test": serving(gate.address, instance="slow.test"),
                              "fast.test": serving(upstream.address)}, OPTIONS)
    try:
        waiting = [in_background(lambda: get(router.port, "slow.test", "/gate"))
                   for _ in range(3)]
        wait_for(lambda: gate.now == 3)
        # An alias is the same instance: it is refused too, at once.
        refused = [get(router.port, host, "/gate") for host in ("slow.test", "www.slow.test")]
        assert all(at_limit(r) and r.elapsed_s < 1.0 for r in refused)
        latencies = []
        for _ in range(20):
            answer = get(router.port, "fast.test")
            assert answer.status == 200
            latencies.append(answer.elapsed_s)
        assert statistics.median(latencies) < 0.1 and max(latencies) < 1.0, latencies
        gate.opened.set()
        for answers, thread in waiting:
            thread.join(GATE_WAIT_S)
            assert answers[0].status == 200
        assert gate.most == 3
        assert in_flight(router) == {}
        counts = router.proxy.response_counts()  # its loop is idle: nothing in flight
        assert counts["slow.test"].router == {"503": 2}
        assert counts["slow.test"].app == {"2xx": 3}
    finally:
        router.stop()


def _send(port: int, host: str, request: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(f"{request}Host: {host}\r\n\r\n".encode())
    return sock


GATED = "GET /gate HTTP/1.1\r\n"
UPGRADE = "GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"


def _end_two(ending: str, port: int, gate: GateUpstream) -> None:
    """Two requests of a.test at once (its whole bound), ending as `ending` says."""
    if ending == "client reset":
        clients = [_send(port, "a.test", GATED) for _ in range(2)]
        wait_for(lambda: gate.now == 2)
        for sock in clients:  # gone with a reset, as a killed client goes
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
    elif ending == "tunnel closed":
        tunnels = [_send(port, "a.test", UPGRADE) for _ in range(2)]
        for sock in tunnels:
            assert sock.recv(4096).startswith(b"HTTP/1.1 101 ")
            sock.sendall(b"ping")
            assert sock.recv(4096) == b"ping"
        for sock in tunnels:
            sock.close()
    else:
        both = [in_background(lambda: get(port, "a.test", "/gate")) for _ in range(2)]
        for answers, thread in both:
            thread.join(5)
            # One that broke off is cut off: its head went, its body never ended.
            assert (answers[0].status, answers[0].body) in {
                "answered": [(200, b"ok")], "upstream broke off": [(200, b"partial")],
                "upstream refused": [(502, answers[0].body)],
                "upstream too slow": [(504, answers[0].body)]}[ending]


ENDINGS = ["answered", "client reset", "upstream refused", "upstream broke off",
           "upstream too slow", "tunnel closed"]


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_slot_comes_back_however_its_request_ends(gate: GateUpstream, ending: str) -> None:
    breaking = BreakingUpstream()
    tunnels = TunnelUpstream()
    address = {"upstream refused": f"127.0.0.1:{free_port()}",
               "upstream broke off": breaking.address,
               "tunnel closed": tunnels.address}.get(ending, gate.address)
    options = ProxyOptions(drain_timeout_s=0.1, upstream_timeout_s=0.3)
    router = InProcessRouter({"a.test": serving(address, max_concurrency=2)}, options)
    try:
        if ending == "answered":
            gate.opened.set()
        _end_two(ending, router.port, gate)
        wait_for(lambda: in_flight(router) == {})
        # The whole bound is there again, for the same instance after a swap too.
        gate.opened.set()
        wait_for(lambda: gate.now == 0)  # the gate's own threads, done with the above
        gate.opened.clear()
        swap(router, 2, {"a.test": serving(gate.address, max_concurrency=2)})
        waiting = [in_background(lambda: get(router.port, "a.test", "/gate"))
                   for _ in range(2)]
        wait_for(lambda: gate.now == 2)
        assert at_limit(get(router.port, "a.test", "/gate"))
        gate.opened.set()
        for answers, thread in waiting:
            thread.join(GATE_WAIT_S)
            assert answers[0].status == 200
        assert in_flight(router) == {}
    finally:
        router.stop()
        breaking.close()
        tunnels.close()


def test_an_open_tunnel_holds_its_slot_until_it_closes(gate: GateUpstream) -> None:
    tunnels = TunnelUpstream()
    router = InProcessRouter({"ws.test": serving(tunnels.address, max_concurrency=1)}, OPTIONS)
    try:
        with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
            sock.sendall(b"GET /ws HTTP/1.1\r\nHost: ws.test\r\nConnection: Upgrade\r\n"
                         b"Upgrade: websocket\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 101 ")
            time.sleep(0.1)
            assert at_limit(get(router.port, "ws.test", "/"))
        wait_for(lambda: in_flight(router) == {})
        swap(router, 2, {"ws.test": serving(gate.address, max_concurrency=1)})
        gate.opened.set()
        assert get(router.port, "ws.test", "/").status == 200
    finally:
        router.stop()
        tunnels.close()


def test_held_requests_released_into_a_bound_go_upstream_only_within_it(
    gate: GateUpstream,
) -> None:
    router = InProcessRouter({"a.test": RouteEntry(state=Handling.HOLDING)}, OPTIONS)
    try:
        held = [in_background(lambda: get(router.port, "a.test", "/gate")) for _ in range(3)]
        wait_for(lambda: router._run(_held(router)) == {"a.test": 3})
        swap(router, 2, {"a.test": serving(gate.address, max_concurrency=1)})
        wait_for(lambda: gate.now == 1)
        wait_for(lambda: sum(len(answers) for answers, _ in held) == 2)
        assert all(at_limit(a) for answers, _ in held for a in answers)
        gate.opened.set()
        for _answers, thread in held:
            thread.join(GATE_WAIT_S)
        assert sorted(a.status for answers, _ in held for a in answers) == [200, 503, 503]
        assert gate.most == 1
    finally:
        router.stop()


async def _held(router: InProcessRouter) -> dict[str, int]:
    return router.proxy.held_counts()


def _fill(port: int, host: str, gate: GateUpstream, bound: int) -> list[
        tuple[list[Answer], threading.Thread]]:
    """Open gated requests one at a time until the upstream has `bound` of them: none
    is refused, whichever worker holds the slots it lands beside."""
    waiting = []
    for n in range(1, bound + 1):
        answers, thread = in_background(lambda: get(port, host, "/gate"))
        wait_for(functools.partial(_reached_or_answered, gate, n, answers))
        assert answers == [], f"request {n} of {bound} was answered {answers[0].status}"
        waiting.append((answers, thread))
    return waiting


def _reached_or_answered(gate: GateUpstream, n: int, answers: list[Answer]) -> bool:
    return gate.now >= n or bool(answers)


def test_the_bound_holds_across_workers_and_every_slot_comes_back(
    start_router: type[RouterProcess], gate: GateUpstream, upstream: Upstream
) -> None:
    # The route names no bound: the router's own (--max-concurrency) is every worker's.
    router = start_router(extra_argv=("--workers", "2", "--max-concurrency", "4"))
    tunnels = TunnelUpstream()
    router.push(1, {"slow.test": serving(gate.address), "fast.test": serving(upstream.address),
                    "ws.test": serving(tunnels.address, max_concurrency=1)})
    refused = 0
    for _round in range(2):  # the second finds every slot of the first back
        gate.opened.clear()
        time.sleep(FULL_HOLDOFF_S)  # a worker that just refused asks again after it
        waiting = _fill(router.port, "slow.test", gate, 4)
        # Past the bound, whichever worker a request lands in: 503 at once.
        burst = [in_background(lambda: get(router.port, "slow.test", "/gate"))
                 for _ in range(6)]
        for answers, thread in burst:
            thread.join(5)
            assert at_limit(answers[0]) and answers[0].elapsed_s < 1.0
        refused += len(burst)
        latencies = [get(router.port, "fast.test") for _ in range(10)]
        assert all(a.status == 200 for a in latencies)
        assert max(a.elapsed_s for a in latencies) < 1.0
        assert gate.most == 4
        gate.opened.set()
        for answers, thread in waiting:
            thread.join(GATE_WAIT_S)
            assert answers[0].status == 200
    counts = responses_sync(router.control).of("slow.test")
    assert counts.router == {"503": refused} and counts.app == {"2xx": 8}
    # A tunnel holds its slot while open, in whichever worker; once closed, the next
    # one gets it, whichever worker that lands in (an upgrade may wait for a lease too).
    try:
        for _ in range(2):
            with _send(router.port, "ws.test", UPGRADE) as tunnel:
                assert tunnel.recv(4096).startswith(b"HTTP/1.1 101 ")
                assert at_limit(get(router.port, "ws.test", "/ws"))
            wait_for(lambda: activity_sync(router.control)["ws.test"].open == 0)
            time.sleep(FULL_HOLDOFF_S)
    finally:
        tunnels.close()
