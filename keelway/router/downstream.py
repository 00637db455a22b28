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
  unless the upstream pool misses;
- a request the router refuses (malformed, over a limit, too slow) is answered in turn
  with `Connection: close`, and nothing after it on the connection is parsed or
  forwarded; a body already partly forwarded leaves with its upstream connection, which
  closes. The client is then lingered on (its further bytes read and dropped) for up to
  `close_linger_s`, so the kernel does not reset the connection over unread bytes and
  destroy the answer on its way;
- every timeout of a connection shares one timer handle. Each wait keeps a deadline
  (`_read_deadline`: idle, head or body; `_upstream_deadline`: the current exchange's
  first response byte) and the hot path only moves deadlines later, which costs a clock
  read; the handle is re-made only when it fires early (then it re-arms for the latest
  deadline) or a deadline moves earlier. When it fires, what is overdue is decided from
  the connection's state, not from the deadline alone, so a stale deadline only causes
  an early wake-up.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
from typing import TYPE_CHECKING, Final, cast

import httptools

from keelway.router import responses
from keelway.router.exchange import Exchange
from keelway.router.headers import CHUNKED, LENGTH, NONE, BadRequest, RequestHeadRewriter
from keelway.router.responses import BAD_REQUEST, HEALTH_PATH, HEALTHY, NOT_FOUND

if TYPE_CHECKING:
    from keelway.router.proxy import Proxy

log: Final = logging.getLogger("keelway.router")

_NEVER: Final = float("inf")

# `_in_head`: where the connection is in a request head.
_NO_HEAD: Final = 0  # between requests, or in a body
_HEAD_BEGUN: Final = 1  # first bytes parsed in this read; its deadline is not set yet
_HEAD_TIMED: Final = 2  # spans reads; its deadline runs from the first read


class ClientConnection(RequestHeadRewriter, asyncio.Protocol):
    """One client TCP connection; see the module header for its rules."""

    BLOCK_QUEUE: Final = 1
    BLOCK_UPSTREAM_FULL: Final = 2
    BLOCK_CONNECTING: Final = 4

    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy
        self._options = proxy.options
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        # Set in connection_made, before any other callback; typed non-optional so the
        # hot path does not pay for a check that can never fail.
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self._client_ip = b""
        self._trusted = False
        self.begin_request_head()
        self._unparsed_head_bytes = 0
        self._awaiting_head = True
        self._parser_dead = False
        self.current: Exchange | None = None
        self._parsing: Exchange | None = None
        self._queue: collections.deque[Exchange] = collections.deque()
        # Why reading from the client is paused: a bitmask of BLOCK_*, 0 when reading.
        self.read_blocks = 0
        self.write_paused = False
        self._upgrading: Exchange | None = None  # after an Upgrade request: raw bytes
        self._advancing = False
        self._client_done = False
        self._closed = False
        self._close_after_answer = False
        self._in_head = _NO_HEAD
        self._body_left = 0
        self._lingering = False
        self._read_deadline = _NEVER
        self._upstream_deadline = _NEVER
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = _NEVER

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # TCP, by construction
        peer = transport.get_extra_info("peername")
        self._client_ip = str(peer[0]).encode() if peer else b"unknown"
        self._trusted = bool(peer) and str(peer[0]) in self._options.trusted_proxies
        self._proxy.connections.add(self)
        # A new connection must begin its first request as promptly as a head must end.
        self._read_deadline = self._loop.time() + self._options.header_timeout_s
        self._arm(self._read_deadline)

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
            if not self._parser_dead:  # else a callback refused already: that answer stands
                self._refuse(responses.BAD_REQUEST)
        else:
            if self._parser_dead:
                pass
            elif self._awaiting_head and (
                self._unparsed_head_bytes > self._options.max_header_bytes
            ):
                self._refuse(responses.HEADERS_TOO_LARGE)
            elif self._in_head:
                if self._in_head == _HEAD_BEGUN:
                    self._in_head = _HEAD_TIMED
                    self._extend_read(self._options.header_timeout_s)
            elif self._parsing is not None:
                self._extend_read(self._options.body_timeout_s)
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
        timer = self._timer
        if timer is not None:
            self._timer = None
            timer.cancel()
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
        self._in_head = _HEAD_BEGUN
        self.begin_request_head()

    # on_url and on_header: RequestHeadRewriter's

    def on_headers_complete(self) -> None:
        if self._parser_dead:  # a refusal earlier in this read: parse nothing more
            return
        self._in_head = _NO_HEAD
        self._awaiting_head = False
        self._unparsed_head_bytes = 0
        self._body_left = self._options.max_body_bytes
        ex = self._route()
        if ex is None:
            return  # refused: the answer is queued, the connection ends after it
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
            # Counted for every body, so a chunked one is bounded too; a Content-Length
            # over the limit was refused before any of its body was read.
            self._body_left -= len(body)
            if self._body_left < 0:
                self._refuse(responses.BODY_TOO_LARGE)
                return
            ex.request_body(body)

    def on_message_complete(self) -> None:
        self._awaiting_head = True
        ex = self._parsing
        if ex is not None:
            self._parsing = None
            ex.request_complete()

    # -- routing ---------------------------------------------------------------------

    def _route(self) -> Exchange | None:
        """Decide what answers the request whose head just completed; None when the
        request is refused (the refusal is queued and nothing more is parsed)."""
        parser = self._parser
        proxy = self._proxy
        method = parser.get_method()
        keep_alive = parser.should_keep_alive()
        upgrade = parser.should_upgrade()
        options = self._options
        if (
            self.head_bytes > options.max_header_bytes
            or self.request_fields > options.max_header_count
        ):
            self._refuse(responses.HEADERS_TOO_LARGE)
            return None
        try:
            head, host, framing, has_connection = self.finish_request_head(
                method, self._client_ip, upgrade, self._trusted
            )
        except BadRequest:
            self._refuse(BAD_REQUEST)
            return None
        # Keep-alive without a Connection header can only be HTTP/1.1 (llhttp accepts
        # 0.9, 1.0, 1.1 and 2.0, and only 1.1 defaults to keep-alive); formatting the
        # version is the slow call, so it runs only when the answer is not implied.
        if keep_alive and not has_connection:
            http11 = True
        else:
            version = parser.get_http_version()
            http11 = version == "1.1"
            # HTTP/1.0 with Transfer-Encoding: RFC 9112 §6.1 calls its framing faulty.
            if not http11 and (version != "1.0" or framing is CHUNKED):
                self._refuse(BAD_REQUEST)
                return None
        if framing is LENGTH and self.request_length > options.max_body_bytes:
            self._refuse(responses.BODY_TOO_LARGE)
            return None
        url = self.request_url
        close = not (http11 and keep_alive) or proxy.draining or upgrade
        ex = Exchange(self, method == b"HEAD", close, http11)
        if upgrade:
            # Everything after this head is the upgraded protocol's, not HTTP: the
            # connection ends with this exchange unless the upstream switches (101).
            self._upgrading = ex
        if url == HEALTH_PATH:
            return self._local(ex, HEALTHY, close)
        routing = proxy.routing
        target = routing.by_host.get(host)
        if target is None:
            target = routing.lookup(host)
        if target is None:
            return self._local(ex, NOT_FOUND, close)
        if not target.proxied:
            if target.holding and not upgrade and method != b"CONNECT" and proxy.hold(ex, host):
                # Parked: it goes upstream, or gets its answer, when a table decides.
                ex.held = True
                if framing is CHUNKED:
                    ex.chunked_request = True
                elif framing is NONE:
                    ex.retry_head = head
                ex.out.append(head)
                return ex
            return self._local(ex, responses.unavailable(target.retry_after_s), close)
        if method == b"CONNECT":
            return self._local(ex, BAD_REQUEST, True)
        pool = target.pool
        ex.pool = pool if pool is not None else proxy.pool_for(target)
        if upgrade:
            ex.upgrade = True
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
        """A request that cannot be parsed, is over a limit or too slow: answer it in
        turn, then close. Nothing after it on this connection is parsed.

        The request being parsed, if any, is dropped with its upstream connection (part
        of its body may have gone; that connection closes, so the upstream sees a cut-off
        request, never a desynchronised one). Its answer takes that request's place,
        unless the upstream had begun answering it: then the client connection closes.
        """
        self._parser_dead = True
        self._awaiting_head = False
        self._in_head = _NO_HEAD
        ex = Exchange(self, head_request=False, close_client=True, chunked_ok=False)
        self._local(ex, canned, close=True)
        ex.request_done = True
        stale = self._parsing
        if stale is not None:  # its body never finished: it cannot be forwarded
            self._parsing = None
            stale.abandon()
            if stale is self.current:
                if stale.response_started:
                    self.close()
                    return
                self.current = None
            elif self._queue and self._queue[-1] is stale:
                self._queue.pop()
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
            if self._parser_dead:
                self._linger()
            else:
                self.close()
            return
        if self._advancing:
            return
        if self.read_blocks:
            self.unblock_reading(self.BLOCK_CONNECTING | self.BLOCK_UPSTREAM_FULL)
        queue = self._queue
        if not queue:
            if self._client_done:
                self.close()
            elif not self._in_head:
                self._extend_read(self._options.idle_timeout_s)
            return
        self._advancing = True
        try:
            while queue and self.current is None and not self._closed:
                nxt = queue.popleft()
                self.current = nxt
                nxt.start()
                if nxt.request_done and nxt.pool is not None and self.current is nxt:
                    self.await_upstream()
        finally:
            self._advancing = False
        if not queue:
            self.unblock_reading(self.BLOCK_QUEUE)
            if self.current is None and not self._closed:
                if self._client_done:
                    self.close()
                elif not self._in_head:
                    self._extend_read(self._options.idle_timeout_s)

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

    def block_reading(self, reason: int) -> None:
        if not self.read_blocks and not self._closed:
            self.transport.pause_reading()
        self.read_blocks |= reason

    def unblock_reading(self, reason: int) -> None:
        if self.read_blocks & reason:
            self.read_blocks &= ~reason
            if not self.read_blocks and not self._closed:
                self.transport.resume_reading()

    def unhold(self, ex: Exchange) -> None:
        self._proxy.unhold(ex)

    def peer_gone(self) -> bool:
        """Whether the client closed or reset the connection while reading it is paused
        (a held request), judged by peeking at the socket as nginx checks a client
        waiting on its upstream. Bytes still unread (a body) hide a close behind them."""
        sock = self.transport.get_extra_info("socket")
        if sock is None or self._closed:
            return False
        try:
            with socket.socket(fileno=os.dup(sock.fileno())) as probe:
                data = probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False  # nothing to read: still there, waiting
        except OSError:
            return True  # reset
        return data == b""

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

    def _linger(self) -> None:
        """After a refusal is written: send FIN, then read and drop what the client still
        sends until it closes or `close_linger_s` passes. Closing with unread bytes
        would make the kernel send a reset, which can destroy the refusal in flight."""
        if self._closed:
            return
        transport = self.transport
        if self._lingering or not transport.can_write_eof():
            self.close()
            return
        self._lingering = True
        self._upgrading = None
        transport.write_eof()  # after the buffered answer is flushed
        if self.read_blocks:
            self.read_blocks = 0
            transport.resume_reading()
        self._read_deadline = self._loop.time() + self._options.close_linger_s
        self._upstream_deadline = _NEVER
        self._arm(self._read_deadline)

    # -- timeouts --------------------------------------------------------------------

    def await_upstream(self) -> None:
        """The current exchange's request is complete: its upstream has
        `upstream_timeout_s` to begin answering."""
        self._upstream_deadline = deadline = self._loop.time() + self._options.upstream_timeout_s
        if deadline < self._timer_at:
            self._arm(deadline)

    def _extend_read(self, timeout_s: float) -> None:
        self._read_deadline = deadline = self._loop.time() + timeout_s
        if deadline < self._timer_at:
            self._arm(deadline)

    def _arm(self, deadline: float) -> None:
        """Make the timer fire no later than `deadline` (earlier is harmless)."""
        if deadline < self._timer_at and not self._closed:
            timer = self._timer
            if timer is not None:
                timer.cancel()
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        """Act on what is overdue, judged by the connection's state; re-arm for the rest."""
        self._timer = None
        self._timer_at = _NEVER
        if self._closed:
            return
        if self._lingering:
            self.close()
            return
        now = self._loop.time()
        if self._upstream_deadline <= now:
            self._upstream_deadline = _NEVER
            ex = self.current
            waiting = ex is not None and ex.pool is not None and ex.request_done
            if waiting and ex is not None and not ex.response_started:
                ex.upstream_timed_out()
                if self._closed or self._lingering:
                    return
        if self._read_deadline <= now:
            self._read_deadline = _NEVER
            self._read_overdue(now)
            if self._closed or self._lingering:
                return
        due = min(self._read_deadline, self._upstream_deadline)
        if due != _NEVER:
            self._arm(due)

    def _read_overdue(self, now: float) -> None:
        options = self._options
        if self._upgrading is not None and self._upgrading.response_started:
            return  # a tunnel: its traffic is the application's, untimed
        if self._in_head or self._parsing is not None:
            if self.read_blocks:  # the router paused reading: the client is not to blame
                timeout_s = options.header_timeout_s if self._in_head else options.body_timeout_s
                self._read_deadline = now + timeout_s
            else:
                self._refuse(responses.REQUEST_TIMEOUT)
        elif self.current is None and not self._queue:
            self.close()  # idle between requests: nothing is owed, close silently
