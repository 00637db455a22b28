"""Client side of the router's control protocol, for the control plane and the CLI.

One request per connection: connect, send one line, read one line, close. Both an
asyncio flavour (the control plane's event loop) and a blocking stdlib-socket flavour
(CLI, tests) exist; both are bounded by `timeout_s` and raise one small tree:

    RouterControlError
      RouterUnreachable   no router answered on the socket (not running, timed out)
      RouterRefused       the router answered and said no; `.error` says why
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Final, NamedTuple

import msgspec

# The control protocol's messages, by the wire's own names (`wire.Ping`).
from keelway.router import control_wire as wire
from keelway.router.counts import ResponseCounts
from keelway.router.route_table import RouteTable, TableOffer

DEFAULT_TIMEOUT_S: Final = 5.0
SocketPath = str | os.PathLike[str]


class RouterControlError(Exception):
    """Base of the control client's errors."""


class RouterUnreachable(RouterControlError):
    """No answer from a router on the control socket."""


class RouterRefused(RouterControlError):
    """The router answered `ok: false`."""

    def __init__(self, error: str) -> None:
        super().__init__(f"router refused: {error}")
        self.error = error


def _check(reply_line: bytes) -> wire.Reply:
    try:
        reply = wire.reply_decoder.decode(reply_line)
    except msgspec.DecodeError as exc:
        raise RouterUnreachable(f"unreadable reply from the router: {exc}") from exc
    if not reply.ok:
        raise RouterRefused(reply.error or "no reason given")
    return reply


def _missing(what: str) -> RouterUnreachable:
    return RouterUnreachable(f"the router's reply has no {what}")


def _version_of(reply: wire.Reply) -> int:
    if reply.version is None:
        raise _missing("version")
    return reply.version


class Applied(NamedTuple):
    """What a router did with a pushed table: the version it serves now, and the hosts
    whose entries it refused (left out), each with its reason."""

    version: int
    refused: dict[str, str]


def _applied(reply: wire.Reply) -> Applied:
    return Applied(_version_of(reply), dict(reply.refused or {}))


def _table_of(reply: wire.Reply) -> RouteTable:
    if reply.table is None:
        raise _missing("table")
    return reply.table


# -- asyncio -------------------------------------------------------------------------


async def _call(sock_path: SocketPath, request: msgspec.Struct, timeout_s: float) -> wire.Reply:
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_unix_connection(
                str(sock_path), limit=wire.MAX_LINE_BYTES
            )
            try:
                writer.write(wire.encode_line(request))
                await writer.drain()
                line = await reader.readline()
            finally:
                writer.close()
    except TimeoutError as exc:
        raise RouterUnreachable(f"no answer on {sock_path} within {timeout_s} s") from exc
    except OSError as exc:
        raise RouterUnreachable(f"connect to {sock_path}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # a reply line past MAX_LINE_BYTES: not a router's answer
        raise RouterUnreachable(f"ask {sock_path}: {exc}") from exc
    if not line:
        raise RouterUnreachable(f"the router on {sock_path} closed without answering")
    return _check(line)


async def push_routes(
    sock_path: SocketPath, table: RouteTable, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Applied:
    """Send `table` to the router; returns the version it now serves (saved to disk) and
    the entries it refused, each alone (the rest apply).

    Raises RouterRefused for a stale table, RouterUnreachable otherwise.
    """
    return _applied(await _call(sock_path, wire.SetTable(table=TableOffer.of(table)), timeout_s))


async def push_table(
    sock_path: SocketPath, table: RouteTable, timeout_s: float = DEFAULT_TIMEOUT_S
) -> int:
    """`push_routes`, for a caller that needs only the version."""
    return (await push_routes(sock_path, table, timeout_s)).version


async def get_table(sock_path: SocketPath, timeout_s: float = DEFAULT_TIMEOUT_S) -> RouteTable:
    """The table the router serves now."""
    return _table_of(await _call(sock_path, wire.GetTable(), timeout_s))


async def inflight(
    sock_path: SocketPath, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, int]:
    """Requests in flight per upstream ("127.0.0.1:PORT"), as the router counts them."""
    reply = await _call(sock_path, wire.Inflight(), timeout_s)
    if reply.inflight is None:
        raise _missing("inflight")
    return reply.inflight


async def activity(
    sock_path: SocketPath, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, wire.HostActivity]:
    """Per route host, its idle time and open requests over every router worker."""
    return _activity_of(await _call(sock_path, wire.GetActivity(), timeout_s))


def _activity_of(reply: wire.Reply) -> dict[str, wire.HostActivity]:
    if reply.activity is None:
        raise _missing("activity")
    return reply.activity


async def responses(sock_path: SocketPath, timeout_s: float = DEFAULT_TIMEOUT_S) -> ResponseCounts:
    """Per instance, the responses the router sent its clients since it started, by status
    class, its own answers (502, 503, 504, ...) apart (keelway/router/counts.py). Two
    reports compare only within one incarnation: `later.since(earlier)`."""
    return _responses_of(await _call(sock_path, wire.GetResponses(), timeout_s))


def _responses_of(reply: wire.Reply) -> ResponseCounts:
    if reply.responses is None:
        raise _missing("responses")
    return reply.responses


# -- blocking ------------------------------------------------------------------------


def _call_sync(sock_path: SocketPath, request: msgspec.Struct, timeout_s: float) -> wire.Reply:
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(os.fspath(sock_path))
            sock.sendall(wire.encode_line(request))
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                if chunk.endswith(b"\n"):
                    break
    except TimeoutError as exc:
        raise RouterUnreachable(f"no answer on {sock_path} within {timeout_s} s") from exc
    except OSError as exc:
        raise RouterUnreachable(f"connect to {sock_path}: {exc.strerror or exc}") from exc
    line = b"".join(chunks)
    if not line:
        raise RouterUnreachable(f"the router on {sock_path} closed without answering")
    return _check(line)


def push_table_sync(
    sock_path: SocketPath, table: RouteTable, timeout_s: float = DEFAULT_TIMEOUT_S
) -> int:
    """Blocking `push_table`."""
    return _version_of(_call_sync(sock_path, wire.SetTable(table=TableOffer.of(table)), timeout_s))


def get_table_sync(sock_path: SocketPath, timeout_s: float = DEFAULT_TIMEOUT_S) -> RouteTable:
    """Blocking `get_table`."""
    return _table_of(_call_sync(sock_path, wire.GetTable(), timeout_s))


def activity_sync(
    sock_path: SocketPath, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, wire.HostActivity]:
    """Blocking `activity`."""
    return _activity_of(_call_sync(sock_path, wire.GetActivity(), timeout_s))


def responses_sync(sock_path: SocketPath, timeout_s: float = DEFAULT_TIMEOUT_S) -> ResponseCounts:
    """Blocking `responses`."""
    return _responses_of(_call_sync(sock_path, wire.GetResponses(), timeout_s))


def ping_sync(sock_path: SocketPath, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """The router's pid, proving it is up and serving its control socket."""
    reply = _call_sync(sock_path, wire.Ping(), timeout_s)
    if reply.pid is None:
        raise _missing("pid")
    return reply.pid


def table_format_sync(sock_path: SocketPath, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """The table format the router reads (route_table.TABLE_FORMAT); 1 for a router
    from before formats were numbered, which does not say."""
    return _call_sync(sock_path, wire.Ping(), timeout_s).table_format or 1


__all__ = [
    "Applied",
    "RouterControlError",
    "RouterRefused",
    "RouterUnreachable",
    "activity",
    "activity_sync",
    "get_table",
    "get_table_sync",
    "inflight",
    "ping_sync",
    "push_routes",
    "push_table",
    "push_table_sync",
    "responses",
    "responses_sync",
    "retire_over",
    "table_format_sync",
    "take_listener",
]


# -- handoff (a gapless restart) --------------------------------------------------------


def take_listener(
    sock_path: SocketPath, timeout_s: float = DEFAULT_TIMEOUT_S
) -> tuple[socket.socket, socket.socket, socket.socket | None]:
    """Ask the running router for its listening sockets.

    Returns (listener, connection, HTTPS listener or None): keep the connection open and
    `retire_over` it once serving, so the old router stops only after the new one
    accepts.
    """
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout_s)
    try:
        conn.connect(os.fspath(sock_path))
        conn.sendall(wire.encode_line(wire.Handoff()))
        data = b""
        fds: list[int] = []
        while not data.endswith(b"\n"):
            # close-on-exec from the moment it arrives: a descriptor received without
            # it is inherited by every process forked after (a tenant's app took
            # another tenant's requests off the router's listening socket that way)
            chunk, got, _flags, _addr = socket.recv_fds(
                conn, 65536, 4, socket.MSG_CMSG_CLOEXEC)
            if not chunk:
                break
            data += chunk
            fds.extend(got)
    except OSError as exc:
        conn.close()
        raise RouterUnreachable(f"handoff from {sock_path}: {exc}") from exc
    try:
        _check(data)
    except RouterControlError:
        conn.close()
        for fd in fds:
            os.close(fd)
        raise
    if len(fds) not in (1, 2):
        conn.close()
        for fd in fds:
            os.close(fd)
        raise RouterUnreachable("the router's handoff carried no listening socket")
    https = socket.socket(fileno=fds[1]) if len(fds) == 2 else None
    return socket.socket(fileno=fds[0]), conn, https


def retire_over(conn: socket.socket) -> None:
    """Tell the old router, on its handoff connection, to stop accepting and drain."""
    try:
        conn.sendall(wire.encode_line(wire.RetireRouter()))
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            reply += chunk
        _check(reply)
    finally:
        conn.close()
