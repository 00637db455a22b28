"""Real parts for router tests: a loopback upstream (stdlib http.server) that records what
it saw, and the real router process started with an inherited listening socket, the way
the control plane starts it. Every loop here is bounded; every process is stopped by pid.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest
import uvloop

from keelway.router.client import RouterUnreachable, ping_sync, push_table_sync
from keelway.router.proxy import Proxy, ProxyOptions
from keelway.router.route_table import RouteEntry, RouteTable

REPO = Path(__file__).resolve().parents[2]
HOP_BY_HOP_FROM_UPSTREAM = {
    "Connection": "X-Secret",
    "X-Secret": "must-not-cross",
    "Keep-Alive": "timeout=5",
    "Proxy-Authenticate": "Basic",
    "X-Kept": "yes",
}


@dataclass
class Seen:
    """What the upstream observed, for assertions."""

    connections: int = 0
    requests: list[dict[str, object]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _read_body(handler: BaseHTTPRequestHandler) -> tuple[int, str]:
    """Read a request body (Content-Length or chunked) in pieces; returns size and sha256."""
    digest = hashlib.sha256()
    size = 0
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        while True:
            line = handler.rfile.readline(100)
            length = int(line.split(b";")[0].strip(), 16)
            if length == 0:
                while handler.rfile.readline(1000) not in (b"\r\n", b"\n", b""):
                    pass
                break
            remaining = length
            while remaining:
                piece = handler.rfile.read(min(remaining, 65536))
                digest.update(piece)
                size += len(piece)
                remaining -= len(piece)
            handler.rfile.readline(10)
    else:
        remaining = int(handler.headers.get("Content-Length", "0"))
        while remaining:
            piece = handler.rfile.read(min(remaining, 65536))
            if not piece:
                break
            digest.update(piece)
            size += len(piece)
            remaining -= len(piece)
    return size, digest.hexdigest()


def make_handler(seen: Seen) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            with seen.lock:
                seen.connections += 1

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _record(self, body_size: int, body_sha: str) -> dict[str, object]:
            record: dict[str, object] = {
                "method": self.command,
                "path": self.path,
                "headers": [[k, v] for k, v in self.headers.items()],
                "body_size": body_size,
                "body_sha256": body_sha,
            }
            with seen.lock:
                seen.requests.append(record)
            return record

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_HEAD(self) -> None:
            self._record(0, "")
            self._send(200, b"x" * 42)

        def do_GET(self) -> None:
            record = self._record(0, "")
            if self.path == "/chunked":
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for piece in (b"alpha-", b"beta-", b"gamma"):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.write(b"0\r\n\r\n")
            elif self.path == "/close":
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(b"until the end")
                self.close_connection = True
            elif self.path == "/hop":
                self._send(200, b"hop", HOP_BY_HOP_FROM_UPSTREAM)
            elif self.path.startswith("/big/"):
                size = int(self.path.rsplit("/", 1)[1])
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                block = b"z" * 65536
                while size:
                    n = min(size, len(block))
                    self.wfile.write(block[:n])
                    size -= n
            elif self.path == "/slow":
                time.sleep(0.5)
                self._send(200, b"slow done")
            else:
                self._send(200, json.dumps(record).encode(), {"Content-Type": "application/json"})

        def do_POST(self) -> None:
            size, sha = _read_body(self)
            record = self._record(size, sha)
            self._send(200, json.dumps(record).encode(), {"Content-Type": "application/json"})

    return Handler


@dataclass
class Upstream:
    port: int
    seen: Seen

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    seen = Seen()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(seen))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield Upstream(server.server_address[1], seen)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def free_port() -> int:
    """A loopback port with nothing listening on it (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RouterProcess:
    """The real router, `python -m keelway.router --listen-fd N`, bound by the test.
    `open_files` (soft, hard) is the RLIMIT_NOFILE it starts with (default: the test's)."""

    def __init__(
        self, workdir: Path, state: Path | None = None, open_files: tuple[int, int] | None = None,
        extra_argv: tuple[str, ...] = (),
    ) -> None:
        self.control = workdir / "router.sock"
        self.state = state if state is not None else workdir / "routes.json"
        self.log = workdir / "router.log"
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.port: int = listener.getsockname()[1]
        argv = [sys.executable, "-m", "keelway.router", "--listen-fd", str(listener.fileno())]
        argv += ["--control", str(self.control), "--state", str(self.state)]
        argv += ["--drain-timeout", "5", *extra_argv]
        def limit_open_files() -> None:
            if open_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, open_files)

        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, pass_fds=[listener.fileno()], stderr=log, stdout=log,
                preexec_fn=limit_open_files if open_files is not None else None,
            )
        listener.close()  # the router holds its own copy
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"router exited at start:\n{self.log.read_text()}")
            try:
                ping_sync(self.control, timeout_s=0.5)
                return
            except RouterUnreachable:
                time.sleep(0.02)
        raise RuntimeError(f"router not ready within {timeout_s} s:\n{self.log.read_text()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def push(self, version: int, routes: dict[str, RouteEntry]) -> int:
        return push_table_sync(self.control, RouteTable(version=version, routes=routes))

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self) -> float:
        """User plus system CPU time the router process has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout_s`; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
        return self.proc.wait(timeout=5)


@pytest.fixture
def start_router(tmp_path: Path) -> Iterator[type[RouterProcess]]:
    """Start routers with `start_router(workdir)`; all are stopped at teardown."""
    started: list[RouterProcess] = []

    class Tracked(RouterProcess):
        def __init__(
            self,
            workdir: Path = tmp_path,
            state: Path | None = None,
            open_files: tuple[int, int] | None = None,
            extra_argv: tuple[str, ...] = (),
        ) -> None:
            super().__init__(workdir, state, open_files, extra_argv)
            started.append(self)

    try:
        yield Tracked
    finally:
        for router in started:
            router.stop()


@pytest.fixture
def router(start_router: type[RouterProcess]) -> RouterProcess:
    return start_router()


T = TypeVar("T")


class InProcessRouter:
    """The router's Proxy on a uvloop loop in a thread, listening on a loopback port."""

    def __init__(self, routes: dict[str, RouteEntry], options: ProxyOptions) -> None:
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxy, self.server = self._run(self._start(routes, options))
        self.port: int = self.server.sockets[0].getsockname()[1]

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    @staticmethod
    async def _start(
        routes: dict[str, RouteEntry], options: ProxyOptions
    ) -> tuple[Proxy, asyncio.Server]:
        proxy = Proxy(RouteTable(version=1, routes=routes), options)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(proxy.protocol, "127.0.0.1", 0)
        return proxy, server

    def connections(self) -> int:
        async def count() -> int:
            return len(self.proxy.connections)

        return self._run(count())

    def stop(self) -> None:
        async def stop() -> None:
            self.server.close()
            await self.proxy.drain()
            await asyncio.sleep(0.01)  # let closing transports finish

        try:
            self._run(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
            self.loop.close()
