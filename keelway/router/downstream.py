"""Client connections: parsing requests, routing them, and ordering the answers.

Owns the client half of every exchange. Invariants:

- responses leave in request order: one exchange is *current* (being answered); requests
  pipelined behind it wait in a queue, and the client is not read while one waits, so a
  pipelining client buffers at most one read in the router;
- an exchange ends when both its request and its response are complete; a response that
  completes before its request (an upstream answering early, a local error) ends the
  client connection after it, because the rest of that request cannot be framed;
- reading from the client pauses while the upstream's write buffer is full, while a
  request is being buffered for an upstream still connecting, or while pipelined requests
  wait; one bitmask holds these reasons so that one clearing never resumes another's pause;
- the hot path is callbacks only: an exchange costs one small object and no coroutine,
  unless the upstream pool misses.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Final, cast

import httptools

from keelway.router import responses
from keelway.router.exchange import Exchange
from keelway.router.headers import CHUNKED, NONE, BadRequest, RequestHeadRewriter
from keelway.router.responses import BAD_REQUEST, HEALTH_PATH, HEALTHY, NOT_FOUND
from keelway.router.responses import HEADERS_TOO_LARGE as TOO_LARGE

if TYPE_CHECKING:
    from keelway.router.proxy import Proxy

log: Final = logging.getLogger("keelway.router")


class ClientConnection(RequestHeadRewriter, asyncio.Protocol):
    """One client TCP connection; see the module header for its rules."""

    BLOCK_QUEUE: Final = 1
    BLOCK_UPSTREAM_FULL: Final = 2
    BLOCK_CONNECTING: Final = 4

    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy
        self._parser = httptools.HttpRequestParser(self)
        # Set in connection_made, before any other callback; typed non-optional so the
        # hot path does not pay for a check that can never fail.
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self._client_ip = b""
        self.begin_request_head()
        self._unparsed_head_bytes = 0
        self._awaiting_head = True
        self._parser_dead = False
        self.current: Exchange | None = None
        self._parsing: Exchange | None = None
        self._queue: collections.deque[Exchange] = collections.deque()
        self._blocks = 0
        self.write_paused = False
        self._upgrading: Exchange | None = None  # after an Upgrade request: raw bytes
        self._advancing = False
        self._client_done = False
        self._closed = False
        self._close_after_answer = False

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # TCP, by construction
        peer = transport.get_extra_info("peername")
        self._client_ip = str(peer[0]).encode() if peer else b"unknown"
        self._proxy.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._upgrading is not None:
            self._forward_raw(data)
            return
        if self._parser_dead:
            return
        if self._awaiting_head:
            self._unparsed_head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            rest = data[exc.args[0] :]
            if rest:
                self._forward_raw(rest)
        except httptools.HttpParserCallbackError:
            # A bug of ours inside a callback: log it, and end only this connection.
            log.exception("closing a client connection after an internal error")
            self.close()
            return
        except httptools.HttpParserError:
            self._refuse(responses.BAD_REQUEST)
        else:
            if self._awaiting_head and (
                self._unparsed_head_bytes > self._proxy.options.max_header_bytes
            ):
                self._refuse(responses.HEADERS_TOO_LARGE)
        current = self.current
        if current is not None and current.out:
            current.flush()

    def eof_received(self) -> bool | None:
        """The client is done sending: answer what it asked, then close. In a tunnel,
        pass the half-close on to the upstream."""
        current = self.current
        if current is None:
            return None  # nothing owed: close now
        self._client_done = True
        if self._upgrading is current and current.upstream is not None:
            transport = current.upstream.transport
            if transport is not None and transport.can_write_eof():
                transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._proxy.connections.discard(self)
        current = self.current
        if current is not None:
            self.current = None
            current.abandon()
        for ex in self._queue:
            ex.abandon()
        self._queue.clear()

    def pause_writing(self) -> None:
        self.write_paused = True
        current = self.current
        if current is not None and current.upstream is not None:
            current.upstream.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        current = self.current
        if current is not None and current.upstream is not None:
            current.upstream.resume_reading()

    # -- httptools callbacks ---------------------------------------------------------

    def on_message_begin(self) -> None:
        self.begin_request_head()

    # on_url and on_header: RequestHeadRewriter's

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._unparsed_head_bytes = 0
        ex = self._route()
        self._parsing = ex
        if self.current is None:
            self.current = ex
            ex.start()
        else:
            self._queue.append(ex)
            self.block_reading(self.BLOCK_QUEUE)

    def on_body(self, body: bytes) -> None:
        ex = self._parsing
        if ex is not None:
            ex.request_body(body)

    def on_message_complete(self) -> None:
        self._awaiting_head = True
        ex = self._parsing
        if ex is not None:
            self._parsing = None
            ex.request_complete()

    # -- routing ---------------------------------------------------------------------

    def _route(self) -> Exchange:
        """Decide what answers the request whose head just completed."""
        parser = self._parser
        proxy = self._proxy
        method = parser.get_method()
        keep_alive = parser.should_keep_alive()
        upgrade = parser.should_upgrade()
        options = proxy.options
        if (
            self.head_bytes > options.max_header_bytes
            or self.request_fields > options.max_header_count
        ):
            return self._local(Exchange(self, method == b"HEAD", True, False), TOO_LARGE, True)
        url = self.request_url
        try:
            head, host, framing, has_connection = self.finish_request_head(
                method, self._client_ip, upgrade
            )
        except BadRequest:
            return self._local(Exchange(self, method == b"HEAD", True, False), BAD_REQUEST, True)
        # Keep-alive without a Connection header can only be HTTP/1.1; formatting the
        # version is the slow call, so it runs only when the answer is not implied.
        http11 = (keep_alive and not has_connection) or parser.get_http_version() == "1.1"
        close = not (http11 and keep_alive) or proxy.draining or upgrade
        ex = Exchange(self, method == b"HEAD", close, http11)
        if upgrade:
            # Everything after this head is the upgraded protocol's, not HTTP: the
            # connection ends with this exchange unless the upstream switches (101).
            self._upgrading = ex
        if url == HEALTH_PATH:
            return self._local(ex, HEALTHY, close)
        target = proxy.routing.lookup(host)
        if target is None:
            return self._local(ex, NOT_FOUND, close)
        if not target.proxied:
            return self._local(ex, responses.unavailable(target.retry_after_s), close)
        if method == b"CONNECT":
            return self._local(ex, BAD_REQUEST, True)
        ex.pool = proxy.pool_for(target)
        ex.upgrade = upgrade
        if framing is CHUNKED:
            ex.chunked_request = True
        elif framing is NONE and not upgrade:
            ex.retry_head = head
        ex.out.append(head)
        return ex

    @staticmethod
    def _local(ex: Exchange, canned: responses.Canned, close: bool) -> Exchange:
        ex.close_client = close
        ex.local = canned.pick(ex.head_request, close)
        return ex

    def _refuse(self, canned: responses.Canned) -> None:
        """A request that cannot be parsed: answer it in turn, then close. Nothing after
        it on this connection is read."""
        self._parser_dead = True
        self._awaiting_head = False
        ex = Exchange(self, head_request=False, close_client=True, chunked_ok=False)
        self._local(ex, canned, close=True)
        ex.request_done = True
        stale = self._parsing
        if stale is not None:  # its body never finished: it cannot be forwarded
            self._parsing = None
            stale.abandon()
            if stale is self.current:
                self.close()
                return
        if self.current is None:
            self.current = ex
            ex.start()
        else:
            self._queue.append(ex)
            self.block_reading(self.BLOCK_QUEUE)

    # -- exchange sequencing ---------------------------------------------------------

    def exchange_done(self, ex: Exchange) -> None:
        """`ex` (the current exchange) is answered: close, or start the next one.

        Re-entrant without recursion: a queued exchange answered locally inside `start`
        calls back here, which only clears `current`; the outer loop moves on.
        """
        if self.current is not ex:
            return
        self.current = None
        # While the router drains, an answer parsed before the drain began carried no
        # `Connection: close`: closing now would hand the client an EOF it was not told
        # about. It stays open; its next request is answered with close. Only a
        # connection the drain found busy (`_close_after_answer`) closes here.
        if ex.close_client or self._close_after_answer:
            self.close()
            return
        if self._advancing:
            return
        if self._blocks:
            self.unblock_reading(self.BLOCK_CONNECTING | self.BLOCK_UPSTREAM_FULL)
        queue = self._queue
        if not queue:
            if self._client_done:
                self.close()
            return
        self._advancing = True
        try:
            while queue and self.current is None and not self._closed:
                nxt = queue.popleft()
                self.current = nxt
                nxt.start()
        finally:
            self._advancing = False
        if not queue:
            self.unblock_reading(self.BLOCK_QUEUE)
            if self._client_done and self.current is None:
                self.close()

    def start_tunnel(self) -> None:
        """The upstream switched protocols (101): the current exchange never ends; bytes
        pass through unparsed both ways until either side closes."""
        self.unblock_reading(self.BLOCK_QUEUE)

    def _forward_raw(self, data: bytes) -> None:
        ex = self._upgrading
        if ex is None or ex.pool is None:
            return  # an upgrade answered locally: the connection closes after the answer
        upstream = ex.upstream
        if upstream is not None and upstream.transport is not None and not ex.out:
            upstream.transport.write(data)
        else:
            ex.out.append(data)
            if ex is self.current:
                ex.flush()

    # -- flow control and closing ----------------------------------------------------

    @property
    def blocked(self) -> bool:
        return self._blocks != 0

    def block_reading(self, reason: int) -> None:
        if not self._blocks and not self._closed:
            self.transport.pause_reading()
        self._blocks |= reason

    def unblock_reading(self, reason: int) -> None:
        if self._blocks & reason:
            self._blocks &= ~reason
            if not self._blocks and not self._closed:
                self.transport.resume_reading()

    def drain(self) -> None:
        """The router is stopping: close now if idle, else after the current answer."""
        if self.current is None:
            self.close()
        else:
            self._close_after_answer = True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.transport.close()
