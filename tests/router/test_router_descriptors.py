"""The router process against running out of file descriptors, with a small RLIMIT_NOFILE
given at its start (64): it says so in its log, once per report interval, answers 503
where it can, never spins on accept, and serves again as soon as descriptors free up.
"""

from __future__ import annotations

import os
import re
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.router.route_table import Handling, RouteEntry
from tests.router.conftest import RouterProcess, Upstream

LIMIT = 64
SHORTAGE_LINE = "out of file descriptors (open-files limit 64)"


def serving(address: str) -> RouteEntry:
    return RouteEntry(state=Handling.SERVING, upstream=address)


def open_fds(router: RouterProcess) -> int:
    return len(os.listdir(f"/proc/{router.pid}/fd"))


def settled_fds(router: RouterProcess) -> int:
    """The router's open descriptors once a transient one (a control connection just
    answered) has gone: the same count twice, 50 ms apart."""
    count = open_fds(router)
    for _ in range(40):
        time.sleep(0.05)
        count, before = open_fds(router), count
        if count == before:
            break
    return count


def shortage_lines(router: RouterProcess) -> list[str]:
    return [line for line in router.log.read_text().splitlines() if SHORTAGE_LINE in line]


def served(router: RouterProcess) -> bool:
    with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: blog.test\r\nConnection: close\r\n\r\n")
        return sock.recv(65536).startswith(b"HTTP/1.1 200 ")


def first_answers(socks: list[socket.socket], window_s: float) -> list[bytes]:
    """What each socket says first within one shared window: its bytes, b"" for a close
    or reset, b"<nothing>" for silence."""
    answers = [b"<nothing>"] * len(socks)
    waiting = dict(enumerate(socks))
    deadline = time.monotonic() + window_s
    while waiting and (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select(list(waiting.values()), [], [], left)
        for i, sock in list(waiting.items()):
            if sock in readable:
                try:
                    answers[i] = sock.recv(65536)
                except ConnectionResetError:
                    answers[i] = b""
                del waiting[i]
    return answers


@pytest.fixture
def small_router(start_router: type[RouterProcess], upstream: Upstream) -> RouterProcess:
    router = start_router(open_files=(LIMIT, LIMIT))
    router.push(1, {"blog.test": serving(upstream.address)})
    assert served(router)
    return router


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        yield socks
    finally:
        for sock in socks:
            sock.close()


def test_the_router_raises_its_open_files_limit_to_the_hard_limit_at_start(
    start_router: type[RouterProcess],
) -> None:
    router = start_router(open_files=(100, 200))
    limits = Path(f"/proc/{router.pid}/limits").read_text()
    assert re.search(r"Max open files\s+200\s+200\s", limits), limits
    assert "open-files limit 200" in router.log.read_text()


def test_connections_past_the_descriptor_limit_get_503_and_one_log_line_then_it_serves_again(
    small_router: RouterProcess, clients: list[socket.socket]
) -> None:
    """Past the reserve a new client gets 503 at once; past the limit itself the kernel
    refuses the accept and libuv closes the waiting connections. Neither spins the CPU,
    and the report is one line, not one per connection."""
    for _ in range(2 * LIMIT):
        clients.append(socket.create_connection(("127.0.0.1", small_router.port), timeout=5))
    cpu_before = small_router.cpu_seconds()
    answers = first_answers(clients, 0.5)
    time.sleep(0.5)  # out of descriptors, with refused clients lingering: it must idle
    busy_s = small_router.cpu_seconds() - cpu_before
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503 ")]
    assert refused, answers
    assert all(b"Retry-After: 1\r\n" in a and b"Connection: close\r\n" in a for a in refused)
    # Accepted ones wait for their request (nothing), the rest were closed unanswered.
    assert all(a in (b"<nothing>", b"") or a in refused for a in answers)
    assert busy_s < 0.25, f"the router used {busy_s:.2f} s of CPU in 1 s out of descriptors"
    assert small_router.proc.poll() is None
    assert len(shortage_lines(small_router)) == 1, small_router.log.read_text()
    for sock in clients:
        sock.close()
    clients.clear()
    deadline = time.monotonic() + 10
    while open_fds(small_router) > 20 and time.monotonic() < deadline:
        time.sleep(0.1)  # refused connections linger up to 2 s on their way out
    assert served(small_router)


def test_an_upstream_connect_without_a_descriptor_left_gets_503(
    small_router: RouterProcess, clients: list[socket.socket], upstream: Upstream
) -> None:
    """Clients accepted below the reserve, each asking a silent upstream (which holds its
    connection open): once the upstream sockets have used the reserve, a connect fails
    with EMFILE, and that client gets 503, not a 502 blaming the app."""
    silent = socket.create_server(("127.0.0.1", 0), backlog=128)
    try:
        small_router.push(2, {"blog.test": serving(upstream.address),
                              "silent.test": serving(f"127.0.0.1:{silent.getsockname()[1]}")})
        base = settled_fds(small_router)
        below_reserve = LIMIT - 16 - base - 2
        for _ in range(below_reserve):
            clients.append(socket.create_connection(("127.0.0.1", small_router.port), timeout=5))
        deadline = time.monotonic() + 5
        while open_fds(small_router) < base + below_reserve and time.monotonic() < deadline:
            time.sleep(0.02)  # all accepted: each holds a descriptor below the reserve
        for sock in clients:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: silent.test\r\n\r\n")
        answers = first_answers(clients, 0.5)
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503 ")]
        assert refused, answers
        assert all(b"Retry-After: 1\r\n" in a for a in refused)
        assert all(a == b"<nothing>" or a in refused for a in answers)  # the rest wait
        lines = shortage_lines(small_router)
        assert len(lines) == 1 and "a connect to upstream" in lines[0], lines
        assert "refused the connection" not in small_router.log.read_text()
        # A client that closes while its request is upstream is answered first (it may
        # have only half-closed): the silent app going away is what ends those waits.
        silent.close()
        for sock in clients:
            sock.close()
        clients.clear()
        deadline = time.monotonic() + 10
        while open_fds(small_router) > 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert served(small_router)
    finally:
        silent.close()
