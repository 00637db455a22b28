"""The router's control server: route table updates over a unix socket.

Owns the order of an update: validate each entry -> refuse a stale version -> persist ->
swap -> reply. An entry that fails validation is refused alone and named in the reply;
the rest of the table applies, so one bad route never blocks every other app's. Updates
run one at a time (a lock), so the version check and the swap see the same current
table. Crash windows: after the file is written and before the swap, a
restart loads the new table and the control plane, which got no reply, pushes again
(same version: accepted); a failed write swaps nothing and replies an error, so memory
and disk never disagree.

Handoff (a gapless restart): a new router asks for the listening socket (`handoff`),
which is sent with the reply on the same connection (SCM_RIGHTS); both routers then
accept on that one socket, so no connection attempt finds it closed. The new router
takes over the control path by an atomic rename and sends `retire`: this one stops
accepting, drains and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, assert_never

import msgspec

from keelway.router.control_wire import (
    MAX_LINE_BYTES,
    GetActivity,
    GetResponses,
    GetTable,
    Handoff,
    HostActivity,
    Inflight,
    Ping,
    Reply,
    RetireRouter,
    SetTable,
    encode_line,
    request_decoder,
)
from keelway.router.counts import ResponseCounts, summed
from keelway.router.proxy import Proxy
from keelway.router.route_table import TABLE_FORMAT, TableOffer, accept
from keelway.router.table_file import save_table
from keelway.router.workers import WorkerSet

log: Final = logging.getLogger("keelway.router")
# Up to this many routes, a pushed table is saved on the loop (router/table_file.py).
INLINE_SAVE_ROUTES: Final = 1000


@dataclass(eq=False)
class ControlServer:
    """Serves the control protocol for one `Proxy`, persisting accepted tables to
    `state_path`; hands `listener` off when asked, calls `on_retire` on a retire, and
    sums in-flight, activity and response counts over `workers` when it has them.
    `incarnation` and `started_at` name this router's life: its response counts began
    with it (a reader that sees another incarnation knows the router restarted)."""

    proxy: Proxy
    state_path: Path | None
    listener: socket.socket | None = None
    on_retire: Callable[[], None] | None = None
    workers: WorkerSet | None = None
    # Handed off beside `listener`, second, when the router serves HTTPS.
    https_listener: socket.socket | None = None
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: float = field(default_factory=time.time)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)
    _server: asyncio.AbstractServer | None = field(default=None, init=False)

    async def start(self, sock_path: Path) -> None:
        """Listen on `sock_path` (mode 0600), replacing whatever socket is there.

        It binds a temp name and renames it over `sock_path`, so a client connecting
        during a handoff reaches the old router or the new one, never nothing.
        """
        temp = sock_path.with_name(f".{sock_path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        old_umask = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=str(temp), limit=MAX_LINE_BYTES
            )
        finally:
            os.umask(old_umask)
        os.replace(temp, sock_path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # longer than MAX_LINE_BYTES: framing is lost
                    writer.write(encode_line(Reply(ok=False, error="request line too long")))
                    await writer.drain()
                    return
                if not line:
                    return
                if not line.strip():
                    continue
                reply = await self.handle(line)
                if isinstance(request_or_none(line), Handoff) and reply.ok:
                    await writer.drain()
                    self._send_listener(writer, encode_line(reply))
                    continue
                writer.write(encode_line(reply))
                await writer.drain()
                if isinstance(request_or_none(line), RetireRouter) and self.on_retire:
                    self.on_retire()
        except ConnectionError:
            return
        finally:
            writer.close()

    async def handle(self, line: bytes) -> Reply:
        """The reply to one request line. Never raises for bad input."""
        try:
            request = request_decoder.decode(line)
        except msgspec.DecodeError as exc:
            return Reply(ok=False, error=f"bad request: {exc}")
        match request:
            case SetTable(table=table):
                return await self.apply(table)
            case GetTable():
                return Reply(ok=True, table=self.proxy.routing.table)
            case Ping():
                return Reply(ok=True, pid=os.getpid(), table_format=TABLE_FORMAT)
            case Handoff():
                if self.listener is None:
                    return Reply(ok=False, error="this router has no listening socket to hand off")
                # Asked by a successor about to take over, or by a control plane keeping a copy
                # so it can start one if this router dies; only a `retire` means we stop.
                log.info("lending a copy of the listening socket")
                return Reply(ok=True, pid=os.getpid())
            case Inflight():
                counts = self.proxy.inflight()
                if self.workers is not None:
                    for key, n in (await self.workers.inflight()).items():
                        counts[key] = counts.get(key, 0) + n
                return Reply(ok=True, inflight=counts)
            case GetActivity():
                seen = self.proxy.activity()
                if self.workers is not None:
                    for host, (idle_s, n) in (await self.workers.activity()).items():
                        mine = seen.get(host)
                        seen[host] = (idle_s, n) if mine is None else (
                            min(mine[0], idle_s), mine[1] + n)
                return Reply(ok=True, activity={
                    host: HostActivity(idle_s=round(idle_s, 3), open=n)
                    for host, (idle_s, n) in seen.items()})
            case GetResponses():
                own = self.proxy.response_counts()
                workers = self.workers
                report = own if workers is None else summed(own, await workers.responses())
                return Reply(ok=True, responses=ResponseCounts(
                    incarnation=self.incarnation, started_at=self.started_at,
                    instances=report,
                    worker_restarts=0 if workers is None else workers.restarts))
            case RetireRouter():
                if self.on_retire is None:
                    return Reply(ok=False, error="this router cannot retire")
                log.info("retiring: a new router took over")
                return Reply(ok=True, pid=os.getpid())
            case _:
                assert_never(request)

    def _send_listener(self, writer: asyncio.StreamWriter, line: bytes) -> None:
        """The reply line and the listening sockets (HTTP, then HTTPS if served) in one
        message, so no fd can be separated from the bytes that announce it."""
        assert self.listener is not None
        fds = [self.listener.fileno()]
        if self.https_listener is not None:
            fds.append(self.https_listener.fileno())
        conn_fd = writer.get_extra_info("socket").fileno()
        # The dup shares the transport's non-blocking file description, so its blocking
        # mode is left alone; a short line into an idle unix socket does not block.
        with socket.socket(fileno=os.dup(conn_fd)) as conn:
            for _ in range(100):
                try:
                    socket.send_fds(conn, [line], fds)
                    return
                except BlockingIOError:
                    time.sleep(0.01)
            raise OSError("could not hand off the listening socket: the peer is not reading")

    async def apply(self, offer: TableOffer) -> Reply:
        """Persist then swap the valid part of `offer` unless its version is older than
        the current one; the reply names every refused entry with its reason."""
        table, refused = accept(offer)
        for host, why in refused.items():
            log.warning("route table v%d: refused the route for %r: %s", offer.version, host,
                        why)
        async with self._lock:
            current = self.proxy.routing.table
            if table.version < current.version:
                log.warning(
                    "refused route table v%d: older than current v%d",
                    table.version,
                    current.version,
                )
                return Reply(
                    ok=False,
                    error=f"stale version {table.version}: current is {current.version}",
                )
            if self.state_path is not None:
                loop = asyncio.get_running_loop()
                try:
                    # A small table is written in place: a thread's round trip costs
                    # more than its few kilobytes, and a wake waits for this answer.
                    if len(table.routes) <= INLINE_SAVE_ROUTES:
                        save_table(self.state_path, table)
                    else:
                        await loop.run_in_executor(None, save_table, self.state_path, table)
                except OSError as exc:
                    log.error("could not save route table v%d: %s", table.version, exc)
                    return Reply(ok=False, error=f"could not save the table: {exc.strerror}")
            # The workers first: with workers, this process serves no client, and the
            # table it answers `get` with must be one every worker routes by, so whoever
            # reads a route's state here (a test, an operator) sees what requests meet.
            reloaded = self.workers is None or await self.workers.reload()
            self.proxy.swap(table)
            if not reloaded:
                # Not acknowledged: the caller must not act as if every worker routes by
                # it (a deploy would stop a process a worker still sends requests to).
                log.error("route table v%d: a worker did not apply it", table.version)
                return Reply(ok=False, error="a router worker did not apply the table")
            log.info("route table v%d applied (%d routes)", table.version, len(table.routes))
            return Reply(ok=True, version=table.version, refused=refused or None)


def request_or_none(line: bytes) -> object:
    try:
        return request_decoder.decode(line)
    except msgspec.DecodeError:
        return None
