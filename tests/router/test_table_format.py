"""Which router reads this keelway's tables: a router answers `ping` with the table
format it reads, and one that says an older format (or none: format 1) is replaced
before anything is pushed to it. The routers here are real unix sockets answering
`ping` as a router of each format did."""

from __future__ import annotations

import asyncio
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from keelway.home import Home
from keelway.router.control import ControlServer
from keelway.router.control_wire import Reply
from keelway.router.proxy import Proxy
from keelway.router.route_table import EMPTY_TABLE, TABLE_FORMAT
from keelway.runtime.router import reads_current_tables


@contextmanager
def answering(path: Path, reply: bytes) -> Iterator[None]:
    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            self.rfile.readline()
            self.wfile.write(reply)

    path.parent.mkdir(parents=True, exist_ok=True)
    server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        path.unlink(missing_ok=True)


def test_a_router_of_the_format_before_is_not_one_that_reads_this_keelways_tables(
        tmp_path: Path) -> None:
    home = Home(tmp_path)
    with answering(home.router_socket, b'{"ok":true,"pid":4242}\n'):
        assert not reads_current_tables(home)
    with answering(home.router_socket,
                   b'{"ok":true,"pid":4242,"table_format":%d}\n' % TABLE_FORMAT):
        assert reads_current_tables(home)


def test_a_router_that_does_not_answer_is_left_to_serve_as_it_is(tmp_path: Path) -> None:
    # Stopped or starved: a handoff from it could not succeed either.
    assert reads_current_tables(Home(tmp_path))


def test_this_router_says_the_format_it_reads() -> None:
    async def ping() -> Reply:
        return await ControlServer(Proxy(EMPTY_TABLE), None).handle(b'{"op":"ping"}\n')

    reply = asyncio.run(ping())
    assert reply.ok and reply.table_format == TABLE_FORMAT
