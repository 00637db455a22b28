"""The router process proxying real traffic to a real loopback upstream.

Each test is a transcript: a client on a real socket, the real router process, a real
upstream that records what reached it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

from websockets.sync.client import connect as ws_connect

from keelway.router.route_table import Handling, RouteEntry


def serving(upstream: str) -> RouteEntry:
    return RouteEntry(state=Handling.SERVING, upstream=upstream)


def request(
    port: int,
    method: str,
    path: str,
    host: str = "blog.test",
    body: bytes | Iterator[bytes] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, body=body, headers={"Host": host, **(headers or {})})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response, data


def raw_exchange(port: int, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send raw bytes; read until the router closes or `timeout_s` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        chunks = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def seen_headers(record: dict[str, object]) -> dict[str, str]:
    pairs = record["headers"]
    assert isinstance(pairs, list)
    return {name.lower(): value for name, value in pairs}


def test_get_is_proxied_by_host_whatever_its_case_and_port(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    response, body = request(router.port, "GET", "/page?x=1", host="BLOG.Test:8080")
    assert response.status == 200
    record = json.loads(body)
    assert (record["method"], record["path"]) == ("GET", "/page?x=1")


def test_post_with_content_length_reaches_the_upstream_intact(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    payload = os.urandom(300_000)
    response, body = request(router.port, "POST", "/echo", body=payload)
    record = json.loads(body)
    assert response.status == 200
    assert record["body_size"] == len(payload)
    assert record["body_sha256"] == hashlib.sha256(payload).hexdigest()


def test_a_chunked_request_body_is_streamed_through_chunked(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    pieces = [b"first,", b"second,", os.urandom(100_000)]
    _response, body = request(router.port, "POST", "/echo", body=iter(pieces))
    record = json.loads(body)
    assert record["body_sha256"] == hashlib.sha256(b"".join(pieces)).hexdigest()
    assert seen_headers(record)["transfer-encoding"] == "chunked"


def test_chunked_and_close_delimited_responses_arrive_whole(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    response, body = request(router.port, "GET", "/chunked")
    assert (response.status, body) == (200, b"alpha-beta-gamma")
    assert response.getheader("Transfer-Encoding") == "chunked"
    response, body = request(router.port, "GET", "/close")
    assert (response.status, body) == (200, b"until the end")


def test_keep_alive_reuses_one_connection_on_each_side(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=10)
    sockets = set()
    for i in range(5):
        conn.request("GET", f"/n{i}", headers={"Host": "blog.test"})
        response = conn.getresponse()
        assert response.status == 200
        response.read()
        sockets.add(id(conn.sock))
    conn.request("HEAD", "/head", headers={"Host": "blog.test"})
    response = conn.getresponse()
    assert (response.status, response.getheader("Content-Length"), response.read()) == (
        200,
        "42",
        b"",
    )
    conn.close()
    assert len(sockets) == 1
    assert upstream.seen.connections == 1
    assert len(upstream.seen.requests) == 6


def test_pipelined_requests_are_answered_in_order(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    raw = (
        b"".join(b"GET /p%d HTTP/1.1\r\nHost: blog.test\r\n\r\n" % i for i in range(3))
        + b"GET /_keelway/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    reply = raw_exchange(router.port, raw)
    assert reply.count(b"HTTP/1.1 200 OK") == 4
    positions = [reply.index(b'"/p%d"' % i) for i in range(3)]
    assert positions == sorted(positions)
    assert reply.endswith(b"ok\n")


def test_hop_by_hop_headers_are_stripped_and_forwarding_headers_set(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    response, body = request(
        router.port,
        "GET",
        "/",
        host="blog.test:8080",
        headers={
            "Connection": "keep-alive, X-Private",
            "X-Private": "1",
            "Keep-Alive": "300",
            "Proxy-Authorization": "secret",
            "TE": "trailers",
            "X-Forwarded-For": "203.0.113.7",
            "X-Forwarded-Proto": "https",
        },
    )
    seen = seen_headers(json.loads(body))
    for name in ("x-private", "keep-alive", "proxy-authorization", "te", "connection"):
        assert name not in seen
    # The client is not a trusted front proxy: its X-Forwarded-For is replaced (#4).
    assert seen["x-forwarded-for"] == "127.0.0.1"
    assert seen["x-forwarded-proto"] == "http"
    assert seen["x-forwarded-host"] == "blog.test:8080"
    response, _ = request(router.port, "GET", "/hop")
    names = {name.lower() for name, _ in response.getheaders()}
    assert "x-kept" in names
    assert not names & {"x-secret", "keep-alive", "proxy-authenticate"}


def test_an_unknown_host_gets_404_naming_no_internals(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    response, body = request(router.port, "GET", "/", host="nobody.test")
    assert response.status == 404
    everything = (body + str(response.getheaders()).encode()).lower()
    for secret in (b"keelway", b"python", b"127.0.0.1", b"/work", b"route"):
        assert secret not in everything


def test_a_gated_route_answers_503_with_retry_after(router) -> None:
    router.push(1, {"blog.test": RouteEntry(state=Handling.GATED, retry_after_s=7)})
    response, _ = request(router.port, "GET", "/")
    assert (response.status, response.getheader("Retry-After")) == (503, "7")


def test_an_upstream_that_refuses_connections_gives_502(router) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    router.push(1, {"blog.test": serving(dead)})
    response, body = request(router.port, "GET", "/")
    assert response.status == 502
    assert dead.encode() not in body


def test_health_answers_ok_on_any_host(router) -> None:
    for host in ("anything.test", "blog.test", "10.1.2.3:99"):
        response, body = request(router.port, "GET", "/_keelway/health", host=host)
        assert (response.status, body) == (200, b"ok\n")


def test_content_length_with_transfer_encoding_is_refused_with_400(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    reply = raw_exchange(
        router.port,
        b"POST / HTTP/1.1\r\nHost: blog.test\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    )
    assert reply.startswith(b"HTTP/1.1 400 ")
    assert upstream.seen.requests == []


def test_oversized_headers_are_refused_with_431(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    big = b"X-Big: " + b"a" * 70_000 + b"\r\n"
    reply = raw_exchange(router.port, b"GET / HTTP/1.1\r\nHost: blog.test\r\n" + big + b"\r\n")
    assert reply.startswith(b"HTTP/1.1 431 ")
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(200))
    reply = raw_exchange(router.port, b"GET / HTTP/1.1\r\nHost: blog.test\r\n" + many + b"\r\n")
    assert reply.startswith(b"HTTP/1.1 431 ")
    assert upstream.seen.requests == []


def test_twenty_megabytes_stream_both_ways_without_the_router_holding_them(
    router, upstream
) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    size = 20 * 1024 * 1024
    rss_before = router.rss_bytes()
    block = os.urandom(256 * 1024)
    response, body = request(
        router.port, "POST", "/sink", body=iter([block] * (size // len(block)))
    )
    assert json.loads(body)["body_size"] == size
    conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=20)
    conn.request("GET", f"/big/{size}", headers={"Host": "blog.test"})
    response = conn.getresponse()
    received = 0
    while piece := response.read(1024 * 1024):
        received += len(piece)
    conn.close()
    assert received == size
    assert router.rss_bytes() - rss_before < 8 * 1024 * 1024


def test_websocket_upgrade_is_spliced_both_ways(router) -> None:
    import asyncio

    from websockets.asyncio.server import serve

    ready = threading.Event()
    stop = threading.Event()
    port_box: list[int] = []

    async def echo(ws) -> None:  # type: ignore[no-untyped-def]
        async for message in ws:
            await ws.send(f"echo:{message}")

    async def run_server() -> None:
        async with serve(echo, "127.0.0.1", 0) as server:
            port_box.append(server.sockets[0].getsockname()[1])
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)

    thread = threading.Thread(target=lambda: asyncio.run(run_server()))
    thread.start()
    try:
        assert ready.wait(5)
        router.push(1, {"ws.test": serving(f"127.0.0.1:{port_box[0]}")})
        sock = socket.create_connection(("127.0.0.1", router.port), timeout=5)
        with ws_connect("ws://ws.test/chat", sock=sock, open_timeout=5) as ws:
            for text in ("one", "two", "x" * 100_000):
                ws.send(text)
                assert ws.recv(timeout=5) == f"echo:{text}"
    finally:
        stop.set()
        thread.join(timeout=5)


def test_sigterm_lets_an_in_flight_request_finish_then_exits_zero(router, upstream) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    result: list[tuple[int, bytes]] = []

    def slow_request() -> None:
        response, body = request(router.port, "GET", "/slow")
        result.append((response.status, body))

    client = threading.Thread(target=slow_request)
    client.start()
    deadline = time.monotonic() + 5
    while not upstream.seen.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert router.stop() == 0
    client.join(timeout=5)
    assert result == [(200, b"slow done")]


def test_a_client_that_half_closes_after_its_request_still_gets_the_answer(
    router, upstream
) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
        sock.sendall(b"GET /half HTTP/1.1\r\nHost: blog.test\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200 OK")
    assert b'"/half"' in reply


def _read_head(conn: socket.socket) -> bytes:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        buffer += conn.recv(65536)
    return buffer


@contextlib.contextmanager
def scripted_upstream(
    answer: Callable[[socket.socket, Callable[[], bytes]], None],
) -> Iterator[tuple[str, list[int]]]:
    """A raw upstream on loopback: `answer(conn, read_head)` plays each accepted
    connection, `read_head()` returning the next request head. Yields its address and
    a list that grows by one per accepted connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                accepted.append(1)
                conn.settimeout(5)
                answer(conn, functools.partial(_read_head, conn))

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def test_a_pooled_connection_the_upstream_dropped_is_retried_on_a_fresh_one(router) -> None:
    """The upstream answers with keep-alive, then closes each connection anyway (as app
    servers with short idle timeouts do): the next request must not become a 502."""

    def one_answer_per_connection(conn: socket.socket, read_head: Callable[[], bytes]) -> None:
        read_head()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        time.sleep(0.05)  # then close, without having said so

    with scripted_upstream(one_answer_per_connection) as (address, accepted):
        router.push(1, {"blog.test": serving(address)})
        for _ in range(3):
            response, body = request(router.port, "GET", "/")
            assert (response.status, body) == (200, b"ok")
        assert len(accepted) == 3


def test_an_interim_response_leaves_nothing_in_the_final_head_or_the_next_one(router) -> None:
    """An upstream that sends 100 Continue (with a header of its own) before each final
    answer, twice on one pooled connection: each client sees the interim line, then a
    final head with only the final response's fields, and the second exchange carries
    nothing over from the first."""

    def interim_then_final(conn: socket.socket, read_head: Callable[[], bytes]) -> None:
        for n in (1, 2):
            read_head()
            conn.sendall(
                b"HTTP/1.1 100 Continue\r\nX-Interim: yes\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nX-Final: %d\r\nContent-Length: 2\r\n\r\nok" % n
            )

    with scripted_upstream(interim_then_final) as (address, accepted):
        router.push(1, {"blog.test": serving(address)})
        with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
            for n in (1, 2):
                sock.sendall(b"GET / HTTP/1.1\r\nHost: blog.test\r\n\r\n")
                reply = b""
                while not reply.endswith(b"ok"):
                    chunk = sock.recv(65536)
                    assert chunk, reply
                    reply += chunk
                interim, final = reply.split(b"\r\n\r\n", 1)
                assert interim == b"HTTP/1.1 100 Continue"
                final_head = final.split(b"\r\n\r\n")[0]
                assert final_head.startswith(b"HTTP/1.1 200 OK\r\n")
                assert b"X-Final: %d" % n in final_head
                assert b"X-Interim" not in final_head
                assert b"X-Final: %d" % (3 - n) not in final_head
        assert len(accepted) == 1  # the second exchange reused the pooled connection
