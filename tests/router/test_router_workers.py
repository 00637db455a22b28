"""Router workers: several processes on one listening socket, one table for all."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from keelway.router.client import activity_sync, ping_sync, push_table_sync
from keelway.router.route_table import Handling, RouteEntry, RouteTable
from keelway.runtime import process


def _named_upstream(name: bytes) -> tuple[ThreadingHTTPServer, threading.Thread]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(name)))
            self.end_headers()
            self.wfile.write(name)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    return server, thread


@pytest.fixture
def upstreams() -> Iterator[tuple[str, str]]:
    servers = [_named_upstream(b"first"), _named_upstream(b"second")]
    try:
        yield tuple(f"127.0.0.1:{s.server_address[1]}" for s, _ in servers)  # type: ignore[misc]
    finally:
        for server, thread in servers:
            server.shutdown()
            server.server_close()
            thread.join(5)


class Workers:
    def __init__(self, workdir: Path, count: int) -> None:
        self.control = workdir / "c.sock"
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.port = listener.getsockname()[1]
        self.log = (workdir / "router.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "keelway.router", "--listen-fd", str(listener.fileno()),
             "--control", str(self.control), "--state", str(workdir / "r.json"),
             "--workers", str(count), "--drain-timeout", "3"],
            pass_fds=[listener.fileno()], stdout=self.log, stderr=self.log)
        listener.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                ping_sync(self.control, timeout_s=0.5)
                break
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    def children(self) -> list[int]:
        return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
                and (stat := process.read_stat(int(p.name))) is not None
                and _ppid(int(p.name)) == self.proc.pid and stat.state != "Z"]

    def get(self, host: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", "/", headers={"Host": host})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        finally:
            for child in self.children():
                os.kill(child, signal.SIGKILL)
            self.log.close()


def _ppid(pid: int) -> int:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return -1
    return int(raw[raw.rfind(b")") + 2:].split()[1])


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    router = Workers(tmp_path, 3)
    yield router
    router.stop()


def _route(upstream: str) -> dict[str, RouteEntry]:
    return {"a.test": RouteEntry(state=Handling.SERVING, upstream=upstream)}


def test_every_worker_serves_a_pushed_table_before_the_push_is_acknowledged(
    workers: Workers, upstreams: tuple[str, str]
) -> None:
    assert len(workers.children()) == 3  # and the main process accepts none itself
    push_table_sync(workers.control, RouteTable(version=1, routes=_route(upstreams[0])))
    assert {workers.get("a.test") for _ in range(30)} == {(200, b"first")}
    push_table_sync(workers.control, RouteTable(version=2, routes=_route(upstreams[1])))
    # New connections land on any of the three workers: none may still route to v1.
    assert {workers.get("a.test") for _ in range(30)} == {(200, b"second")}


def test_a_worker_that_dies_is_started_again_with_the_current_table(
    workers: Workers, upstreams: tuple[str, str]
) -> None:
    push_table_sync(workers.control, RouteTable(version=1, routes=_route(upstreams[0])))
    victim = workers.children()[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (victim in workers.children()
                                           or len(workers.children()) < 3):
        time.sleep(0.1)
    assert victim not in workers.children() and len(workers.children()) == 3
    assert {workers.get("a.test") for _ in range(30)} == {(200, b"first")}


def test_the_router_answers_its_control_socket_while_a_worker_is_dead(
    workers: Workers, upstreams: tuple[str, str]
) -> None:
    push_table_sync(workers.control, RouteTable(version=1, routes=_route(upstreams[0])))
    victim = workers.children()[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and victim in workers.children():
        time.sleep(0.01)
    # Before its parent spawns it again (within a second): the others still answer.
    assert set(activity_sync(workers.control)) == {"a.test"}
    assert workers.stop() == 0


def test_sigterm_stops_every_worker(workers: Workers) -> None:
    children = workers.children()
    assert workers.stop() == 0
    assert all(_ppid(child) == -1 or process.read_stat(child) is None for child in children)
