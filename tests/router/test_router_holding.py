"""A holding route: requests wait for the next table, bounded in time and count.

Used while a hold-mode swap has no process serving, and (later) while a parked instance
wakes: the first requests must not get a 503 the moment nothing serves.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from keelway.router.proxy import ProxyOptions
from keelway.router.route_table import Handling, RouteEntry, RouteTable
from tests.router.conftest import InProcessRouter, Upstream

HOLD = ProxyOptions(hold_timeout_s=0.6, max_held=2, drain_timeout_s=0.1)


def holding() -> RouteEntry:
    return RouteEntry(state=Handling.HOLDING, retry_after_s=7)


@pytest.fixture
def held_router() -> Iterator[InProcessRouter]:
    router = InProcessRouter({"blog.test": holding()}, HOLD)
    yield router
    router.stop()


def swap(router: InProcessRouter, version: int, routes: dict[str, RouteEntry]) -> None:
    async def apply() -> None:
        router.proxy.swap(RouteTable(version=version, routes=routes))

    asyncio.run_coroutine_threadsafe(apply(), router.loop).result(5)


def send(port: int, request: bytes, replies: list[bytes]) -> threading.Thread:
    def run() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(request)
            data = b""
            while b"\r\n\r\n" not in data or not _complete(data):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            replies.append(data)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return True


GET = b"GET /held HTTP/1.1\r\nHost: blog.test\r\n\r\n"


def test_a_held_request_goes_upstream_when_the_route_serves_again(
    held_router: InProcessRouter, upstream: Upstream
) -> None:
    replies: list[bytes] = []
    started = time.monotonic()
    client = send(held_router.port, GET, replies)
    time.sleep(0.3)
    assert replies == []  # still waiting, not refused
    swap(held_router, 2, {"blog.test": RouteEntry(state=Handling.SERVING,
                                             upstream=upstream.address)})
    client.join(5)
    assert replies[0].startswith(b"HTTP/1.1 200")
    assert time.monotonic() - started >= 0.3
    assert [r["path"] for r in upstream.seen.requests] == ["/held"]


def test_a_held_request_body_reaches_the_upstream_whole(
    held_router: InProcessRouter, upstream: Upstream
) -> None:
    body = b"x" * 200_000
    replies: list[bytes] = []
    client = send(held_router.port, b"POST /upload HTTP/1.1\r\nHost: blog.test\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body), replies)
    time.sleep(0.2)
    swap(held_router, 2, {"blog.test": RouteEntry(state=Handling.SERVING,
                                             upstream=upstream.address)})
    client.join(5)
    assert replies[0].startswith(b"HTTP/1.1 200")
    assert upstream.seen.requests[-1]["body_size"] == len(body)


def test_a_request_held_too_long_gets_503_with_retry_after(
    held_router: InProcessRouter,
) -> None:
    replies: list[bytes] = []
    started = time.monotonic()
    send(held_router.port, GET, replies).join(5)
    assert replies[0].startswith(b"HTTP/1.1 503")
    assert b"Retry-After: 7" in replies[0]
    assert 0.5 <= time.monotonic() - started < 3


def test_held_requests_beyond_the_bound_are_refused_at_once(
    held_router: InProcessRouter,
) -> None:
    replies: list[bytes] = []
    waiting = [send(held_router.port, GET, replies) for _ in range(2)]
    time.sleep(0.2)
    started = time.monotonic()
    send(held_router.port, GET, replies).join(5)
    assert replies[0].startswith(b"HTTP/1.1 503") and time.monotonic() - started < 0.3
    for thread in waiting:
        thread.join(5)


@pytest.mark.parametrize(("routes", "status"), [
    ({"blog.test": RouteEntry(state=Handling.GATED, retry_after_s=3)}, b"503"),
    ({}, b"404"),
])
def test_a_held_request_gets_the_answer_of_the_route_that_replaces_the_hold(
    held_router: InProcessRouter, routes: dict[str, RouteEntry], status: bytes
) -> None:
    replies: list[bytes] = []
    client = send(held_router.port, GET, replies)
    time.sleep(0.2)
    swap(held_router, 2, routes)
    client.join(5)
    assert replies[0].startswith(b"HTTP/1.1 " + status)


def test_a_client_that_gives_up_while_held_frees_its_place_by_the_hold_timeout(
    held_router: InProcessRouter, upstream: Upstream
) -> None:
    # Its going away is seen at the next sweep (a peek at its socket) when nothing of it
    # is unread; the hold timeout bounds how long its place stays taken in any case.
    for _ in range(3):  # more than max_held, one after the other
        with socket.create_connection(("127.0.0.1", held_router.port), timeout=5) as sock:
            sock.sendall(GET)
            time.sleep(0.05)
    time.sleep(HOLD.hold_timeout_s + 0.4)
    replies: list[bytes] = []
    client = send(held_router.port, GET, replies)
    time.sleep(0.1)
    swap(held_router, 2, {"blog.test": RouteEntry(state=Handling.SERVING,
                                             upstream=upstream.address)})
    client.join(5)
    assert replies[0].startswith(b"HTTP/1.1 200")


def test_a_client_that_closes_while_held_frees_its_place_at_the_next_sweep(
    held_router: InProcessRouter, upstream: Upstream
) -> None:
    """Two clients take both places and hang up; well before the hold timeout, a third
    still finds a place (the router peeks at each held client's socket as it sweeps)."""
    for _ in range(HOLD.max_held):
        with socket.create_connection(("127.0.0.1", held_router.port), timeout=5) as sock:
            sock.sendall(GET)
            time.sleep(0.05)
    time.sleep(0.35)  # more than a sweep (0.25 s), less than the hold timeout (0.6 s)
    replies: list[bytes] = []
    client = send(held_router.port, GET, replies)
    time.sleep(0.05)
    swap(held_router, 2, {"blog.test": RouteEntry(state=Handling.SERVING,
                                             upstream=upstream.address)})
    client.join(5)
    assert replies[0].startswith(b"HTTP/1.1 200"), replies
