"""Connections to upstreams (apps on loopback) and the keep-alive pool per upstream address.

Owns the upstream half of an exchange: parsing the response, re-framing it for the client,
and deciding whether the connection may carry another request. Invariants:

- a connection carries at most one exchange at a time, and is idle in its pool only when
  the last response was complete, the request was fully sent, and both sides allow
  keep-alive; anything else closes it;
- a request whose upstream connection dies before any response byte is retried once on a
  fresh connection when it had no body (the reused-connection race: apps close idle
  keep-alive connections whenever they like); otherwise the client gets a 502, or, when
  the response had already started, its connection is closed, never a forged ending;
- the pool never blocks a request: a miss starts one connect, so the only per-request
  coroutine is on that path;
- a connect that fails because this process (EMFILE) or the system (ENFILE) is out of
  file descriptors is the router's shortage, not the upstream's: 503 with Retry-After,
  reported by the proxy's rate-limited shortage line, not as an upstream failure.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from typing import TYPE_CHECKING, Final, cast

import httptools

from keelway.router import responses
from keelway.router.headers import CHUNKED, ResponseHeadRewriter, status_line

if TYPE_CHECKING:
    from keelway.router.exchange import Exchange

log: Final = logging.getLogger("keelway.router")

_LAST_CHUNK: Final = b"0\r\n\r\n"
_CRLF: Final = b"\r\n"
_NO_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE})


class UpstreamConnection(ResponseHeadRewriter, asyncio.Protocol):
    """One TCP connection to an upstream; see the module header for its rules."""

    __slots__ = (
        "_chunk_out",
        "_complete",
        "_interim",
        "_keep_alive",
        "_out",
        "_parser",
        "_reading_paused",
        "_received",
        "_tunnel",
        "_until_close",
        "exchange",
        "idle_since",
        "pool",
        "reused",
        "transport",
        "write_paused",
    )

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.reused = False
        self.idle_since = 0.0
        self.write_paused = False
        self._reading_paused = False
        self._parser = httptools.HttpResponseParser(self)
        self.begin_response_head()
        self._out: list[bytes] = []
        # Where the current response stands, and how it is framed on its way out.
        self._received = self._complete = self._keep_alive = self._interim = False
        self._chunk_out = self._until_close = self._tunnel = False

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # TCP, by construction

    def data_received(self, data: bytes) -> None:
        ex = self.exchange
        if ex is None:  # an idle upstream talking out of turn: it cannot be trusted again
            self.close()
            return
        client = ex.client.transport
        if self._tunnel:
            client.write(data)
            return
        self._received = True
        upgraded = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            upgraded = ex.upgrade
            if not upgraded:
                self._fail(ex, "answered 101 to a request that did not ask to upgrade")
                return
            self._out.append(data[exc.args[0] :])
        except httptools.HttpParserError as exc:
            self._fail(ex, f"sent a malformed response ({exc})")
            return
        out = self._out
        if out:
            client.writelines(out)
            out.clear()
        if upgraded:
            self._tunnel = True
            ex.client.start_tunnel()
        elif self._complete:
            self._finish(ex)

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.forget(self)
        ex = self.exchange
        if ex is None:
            return
        self._detach()
        if self._tunnel:
            ex.client.close()
        elif ex.response_started and self._until_close and not self._complete:
            # The upstream delimited its body by closing: that is its ending.
            if self._chunk_out:
                ex.client.transport.write(_LAST_CHUNK)
            ex.response_complete(keep_client=True)
        elif not self._received and self.reused and ex.retry_head is not None:
            ex.retry()
        else:
            ex.upstream_failed()

    def pause_writing(self) -> None:
        self.write_paused = True
        ex = self.exchange
        if ex is not None:
            ex.client.block_reading(ex.client.BLOCK_UPSTREAM_FULL)

    def resume_writing(self) -> None:
        self.write_paused = False
        ex = self.exchange
        if ex is not None:
            ex.client.unblock_reading(ex.client.BLOCK_UPSTREAM_FULL)

    # -- httptools callbacks ---------------------------------------------------------

    def on_message_begin(self) -> None:
        # The head's state was made ready when the last head finished; a connection that
        # stops before a head finishes is closed, never reused.
        if self._complete:  # bytes after a complete response: never reuse this connection
            self._keep_alive = False

    # on_header: ResponseHeadRewriter's

    def on_headers_complete(self) -> None:
        ex = self.exchange
        if ex is None or self._complete:
            return
        status = self._parser.get_status_code()
        if status < 200 and status != 101:
            self._interim = True  # e.g. 100 Continue; the final response follows
            self.begin_response_head()
            if ex.chunked_ok:
                self._out.append(status_line(status) + _CRLF)
            return
        head, framing, until_close, close = self.finish_response_head(
            status, ex.head_request, ex.chunked_ok, ex.close_client
        )
        if ex.hsts is not None:
            head = head[:-2] + ex.hsts + b"\r\n"  # before the head's closing blank line
        ex.close_client = close
        ex.response_started = True
        ex.sent = len(head)
        ex.answered(status, False)
        self._chunk_out = framing is CHUNKED
        self._until_close = until_close
        self._out.append(head)
        if ex.head_request:
            # httptools cannot be told a response answers HEAD, so it would wait for a
            # body that never comes: the response ends here, and _finish swaps the parser.
            self._keep_alive = self._parser.should_keep_alive() and not until_close
            self._complete = True

    def on_body(self, body: bytes) -> None:
        if self._complete:
            return
        ex = self.exchange
        if ex is not None:
            ex.sent += len(body)
        if self._chunk_out:
            self._out += (b"%x\r\n" % len(body), body, _CRLF)
        else:
            self._out.append(body)

    def on_chunk_header(self) -> None:
        self.begin_trailers()

    def on_chunk_complete(self) -> None:
        self.end_trailers()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        if self._complete:  # HEAD answered with Content-Length: 0
            return
        if self._chunk_out:
            self._out.append(_LAST_CHUNK)
        self._keep_alive = self._parser.should_keep_alive()
        self._complete = True

    # -- exchange lifecycle ----------------------------------------------------------

    def attach(self, ex: Exchange) -> None:
        """Start carrying `ex`: its buffered request bytes go out now."""
        if self.exchange is None:
            self.pool.inflight += 1
        self.exchange = ex
        self._received = False
        ex.upstream = self
        client = ex.client
        if client.write_paused:
            self.pause_reading()
        ex.flush()
        if client.read_blocks:  # the request may have been held while this connected
            client.unblock_reading(client.BLOCK_CONNECTING)

    def _detach(self) -> None:
        """This connection no longer carries an exchange (answered, failed, abandoned)."""
        if self.exchange is not None:
            self.exchange = None
            self.pool.inflight -= 1

    def _finish(self, ex: Exchange) -> None:
        self._detach()
        self._complete = False
        reusable = self._keep_alive and ex.request_done and not ex.upgrade
        if ex.head_request:
            self._parser = httptools.HttpResponseParser(self)
        if self.write_paused:
            reusable = False
            ex.client.unblock_reading(ex.client.BLOCK_UPSTREAM_FULL)
        if reusable:
            if self._reading_paused:
                self.resume_reading()
            self.pool.release(self)
        else:
            self.close()
        ex.response_complete(keep_client=ex.request_done)

    def _fail(self, ex: Exchange, why: str) -> None:
        self._detach()
        self.close()
        self.pool.note_failure(why)
        ex.upstream_failed()

    def abandon(self) -> None:
        """The client went away mid-exchange: this connection's state is unknown, close."""
        self._detach()
        self.close()

    def pause_reading(self) -> None:
        if self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class UpstreamPool:
    """Idle keep-alive connections to one upstream address, most recently used first."""

    def __init__(
        self,
        host: str,
        port: int,
        key: str,
        max_idle: int,
        connect_timeout_s: float,
    ) -> None:
        self.host: Final = host
        self.port: Final = port
        self.key: Final = key
        self._max_idle = max_idle
        self._connect_timeout_s = connect_timeout_s
        self._idle: list[UpstreamConnection] = []
        # Requests this upstream is carrying or about to (connections still opening):
        # what a deploy waits to reach 0 before it stops the process behind it.
        self.inflight = 0
        self._retired = False
        self._last_failure_log = 0.0
        # A coarse clock, read when a connection goes idle and advanced by each sweep:
        # idle ages are only ever compared with limits many sweeps long.
        self._clock = time.monotonic()

    def acquire(self) -> UpstreamConnection | None:
        """An idle connection ready for a request, or None (then call `connect`)."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            transport = conn.transport
            if transport is not None and not transport.is_closing():
                conn.reused = True
                return conn
        return None

    def release(self, conn: UpstreamConnection) -> None:
        if self._retired or len(self._idle) >= self._max_idle:
            conn.close()
            return
        conn.idle_since = self._clock
        self._idle.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        if conn in self._idle:
            self._idle.remove(conn)

    def connect(self, ex: Exchange) -> None:
        """Open a new connection for `ex`; on failure `ex.upstream_failed()` runs."""
        self.inflight += 1  # handed to the connection's count in `_opened`
        task = asyncio.get_running_loop().create_task(self._open())
        task.add_done_callback(lambda t: self._opened(t, ex))

    async def _open(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._connect_timeout_s):
            _, conn = await loop.create_connection(
                lambda: UpstreamConnection(self), self.host, self.port
            )
        return conn

    def _opened(self, task: asyncio.Task[UpstreamConnection], ex: Exchange) -> None:
        self.inflight -= 1
        if task.cancelled():
            ex.upstream_failed()
            return
        exc = task.exception()
        if exc is not None:
            if isinstance(exc, OSError) and exc.errno in _NO_DESCRIPTORS:
                # Not the upstream's fault: this process (or the system) is out of them.
                ex.client.note_fd_shortage(f"a connect to upstream {self.key} failed")
                ex.upstream_failed(responses.NO_DESCRIPTORS)
                return
            self.note_failure(f"refused the connection ({exc.__class__.__name__}: {exc})")
            ex.upstream_failed()
            return
        conn = task.result()
        if ex.abandoned:
            self.release(conn)
        else:
            conn.attach(ex)

    def note_failure(self, why: str) -> None:
        """Log an upstream failure, at most once every 5 s per upstream."""
        now = time.monotonic()
        if now - self._last_failure_log >= 5.0:
            self._last_failure_log = now
            log.warning("upstream %s %s", self.key, why)

    def sweep(self, idle_limit_s: float) -> None:
        """Close connections idle for longer than `idle_limit_s` (as the sweep clock
        tells it: a connection released between sweeps counts from the last one, so it
        may go up to one sweep interval early)."""
        self._clock = now = time.monotonic()
        cutoff = now - idle_limit_s
        stale = [c for c in self._idle if c.idle_since < cutoff]
        for conn in stale:
            self._idle.remove(conn)
            conn.close()

    def retire(self) -> None:
        """No route names this upstream any more: close idle connections now and every
        busy one when its exchange ends."""
        self._retired = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
