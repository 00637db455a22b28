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
- a connection becomes a tunnel only after the upstream answers 101. Until then what
  the client sent after an Upgrade request is held unparsed (one read at most: the
  client is not read meanwhile) and goes nowhere; an answer other than 101 hands it to
  the parser as the next request, under every rule any request meets. An Upgrade
  request with a body is refused (400): httptools skips the body of a request that
  asks to upgrade, so the router could not frame it;
- a chunked body's trailer section meets the head's limits (431 past them): its fields
  are counted as they are parsed and dropped (see headers), and reads that carry no
  body data after a chunk-size line are counted whole, which bounds a trailer field
  still growing inside the parser;
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
from time import monotonic
from typing import TYPE_CHECKING, Final, cast

import httptools

from keelway.router import responses
from keelway.router.exchange import Exchange, InFlight
from keelway.router.headers import CHUNKED, LENGTH, NONE, BadRequest, RequestHeadRewriter
from keelway.router.responses import (
    ACME_CHALLENGE,
    BAD_REQUEST,
    HEALTH_PATH,
    HEALTHY,
    NOT_FOUND,
)

if TYPE_CHECKING:
    from keelway.router.access_log import AccessLog
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
    BLOCK_UPGRADE: Final = 8

    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy
        self._options = proxy.options
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        # Set in connection_made, before any other callback; typed non-optional so the
        # hot path does not pay for a check that can never fail.
        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self.client_ip = b""
        # Where its exchanges' records go; None: the access log is off.
        self.access_log: AccessLog | None = proxy.access_log
        self._trusted = False
        self._https = False
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
        # After an Upgrade request until its answer: the exchange, and the client's bytes
        # after its head (b"" until the parser hands them over; None: no upgrade pending).
        self._upgrading: Exchange | None = None
        self._held: bytes | None = None
        self._tunnel = False  # the upstream answered 101: bytes pass through unparsed
        self._advancing = False
        self._client_done = False
        self._closed = False
        self._close_after_answer = False
        self._in_head = _NO_HEAD
        self._body_left = 0
        # Inside a chunked body, between a chunk-size line and the chunk's end; chunks
        # begun on this connection; the bytes of whole reads inside one chunk that
        # carried no body data (only the last chunk's trailer section can be so long).
        self._chunk_open = False
        self._chunks_begun = 0
        self._chunk_tail_bytes = 0
        self._lingering = False
        self._read_deadline = _NEVER
        self._upstream_deadline = _NEVER
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = _NEVER

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # TCP, by construction
        peer = transport.get_extra_info("peername")
        self.client_ip = str(peer[0]).encode() if peer else b"unknown"
        self._trusted = bool(peer) and str(peer[0]) in self._options.trusted_proxies
        # Came in on the HTTPS listener (router/tls.py): the app is told so.
        self._https = transport.get_extra_info("sslcontext") is not None
        self._proxy.connections.add(self)
        # A new connection must begin its first request as promptly as a head must end.
        self._read_deadline = self._loop.time() + self._options.header_timeout_s
        self._arm(self._read_deadline)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.fileno() >= self._proxy.fd_ceiling:
            self._proxy.fd_shortage.note("a client connection came in the reserve")
            self._refuse(responses.NO_DESCRIPTORS)

    def data_received(self, data: bytes) -> None:
        if self._tunnel:
            self._forward_raw(data)
            return
        if self._parser_dead:
            return
        if self._awaiting_head:
            self._unparsed_head_bytes += len(data)
        # If this read ends in the chunk it began in, with no body data, it was all
        # trailer section: no chunk began and the body budget did not move.
        chunks_begun = self._chunks_begun
        body_left = self._body_left
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            if self._held is not None and not self._parser_dead:
                self._held = data[exc.args[0] :]
                self.block_reading(self.BLOCK_UPGRADE)
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
                if (
                    self._chunk_open
                    and self._chunks_begun == chunks_begun
                    and self._body_left == body_left
                ):
                    self._chunk_tail_bytes += len(data)
                    self._check_trailers()
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
        if self._tunnel and current.upstream is not None:
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
        self._enqueue(ex)

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

    def on_chunk_header(self) -> None:
        self._chunk_open = True
        self._chunks_begun += 1
        self._chunk_tail_bytes = 0
        self.begin_trailers()

    def on_chunk_complete(self) -> None:
        self._chunk_open = False
        self._check_trailers()  # the last chunk completes after its trailer section

    def _check_trailers(self) -> None:
        options = self._options
        if (
            self.request_fields > options.max_header_count
            or self.head_bytes > options.max_header_bytes
            or self._chunk_tail_bytes > options.max_header_bytes
        ) and not self._parser_dead:
            self._refuse(responses.HEADERS_TOO_LARGE)

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
                method, self.client_ip, upgrade, self._trusted, self._https
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
        if upgrade and (framing is CHUNKED or self.request_length):
            self._refuse(BAD_REQUEST)  # the parser skips its body: it cannot be framed
            return None
        url = self.request_url
        close = not (http11 and keep_alive) or proxy.draining
        ex = Exchange(self, method == b"HEAD", close, http11)
        if upgrade:
            # What follows this head waits, unparsed, for the answer: forwarded raw
            # after a 101, parsed as the next request after anything else.
            self._upgrading = ex
            self._held = b""
        if url == HEALTH_PATH:
            return self._local(ex, HEALTHY, close)
        routing = proxy.routing
        target = routing.by_host.get(host)
        if target is None:
            target = routing.lookup(host)
        if target is None:
            return self._local(ex, NOT_FOUND, close)
        # Marked, not timed: Proxy.activity reads the clock, the hot path does not.
        target.hit = True
        ex.target = target
        if self.access_log is not None:
            # Only a routed request is recorded: the log is its instance's.
            ex.began = monotonic()
            ex.method = method
            ex.url = url
        if not self._https:
            # ACME's HTTP-01 challenge (a parked instance's too, waking nothing), and a
            # route that asks for HTTPS: answered here, never upstream.
            if target.force_https or url.startswith(ACME_CHALLENGE):
                answer = proxy.plain_http_answer(target, host, url)
                if answer is not None:
                    return self._local(ex, answer, close)
        elif target.hsts is not None:
            ex.hsts = target.hsts
        if not target.proxied:
            if target.holding and not upgrade and method != b"CONNECT" and proxy.hold(ex, target):
                # Parked: it goes upstream, or gets its answer, when a table decides.
                ex.held = True
                if framing is CHUNKED:
                    ex.chunked_request = True
                elif framing is NONE:
                    ex.retry_head = head
                ex.out.append(head)
                return ex
            if target.parked and (upgrade or method == b"CONNECT"):
                proxy.want_wake(target)  # not held (cannot be), but it still wakes it
            return self._local(ex, proxy.page_for(target), close)
        if method == b"CONNECT":
            return self._local(ex, BAD_REQUEST, True)
        if upgrade:
            ex.upgrade = True
        if framing is CHUNKED:
            ex.chunked_request = True
        elif framing is NONE and not upgrade:
            ex.retry_head = head
        ex.out.append(head)
        # Counted from here (a pipelined request too: it is bound for this instance as
        # surely as the one ahead of it) until the exchange ends, whatever ends it.
        in_flight = target.in_flight
        if in_flight is None or in_flight.take(ex):
            pool = target.pool
            ex.pool = pool if pool is not None else proxy.pool_for(target)
        elif proxy.wait_for_slot(ex, target):
            ex.held = True  # until the main process lends this worker more of the bound
        else:
            ex.out.clear()
            return self._local(ex, responses.AT_LIMIT, close)
        return ex

    @staticmethod
    def _local(ex: Exchange, canned: responses.Canned, close: bool) -> Exchange:
        ex.answer_with(canned, close)
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
            if not stale.response_started:
                stale.status = canned.status  # what its access-log line says it got
            stale.abandon()
            if stale is self.current:
                if stale.response_started:
                    self.close()
                    return
                self.current = None
            elif self._queue and self._queue[-1] is stale:
                self._queue.pop()
        self._enqueue(ex)

    # -- exchange sequencing ---------------------------------------------------------

    def _enqueue(self, ex: Exchange) -> None:
        """`ex` is answered in its turn: at once when nothing is being answered, else
        after the exchanges queued before it (pipelining), reading paused meanwhile."""
        if self.current is None:
            self.current = ex
            ex.start()
        else:
            self._queue.append(ex)
            self.block_reading(self.BLOCK_QUEUE)

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
        if ex is self._upgrading:  # answered without switching protocols
            self._upgrading = None
            self._loop.call_soon(self._parse_held)
        if self._advancing:
            return
        if self.read_blocks:
            self.unblock_reading(self.BLOCK_CONNECTING | self.BLOCK_UPSTREAM_FULL)
        queue = self._queue
        if not queue:
            if self._client_done and self._held is None:
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
                if self._client_done and self._held is None:
                    self.close()
                elif not self._in_head:
                    self._extend_read(self._options.idle_timeout_s)

    def start_tunnel(self) -> None:
        """The upstream switched protocols (101): the current exchange never ends; bytes
        pass through unparsed both ways until either side closes, starting with what the
        client sent after its Upgrade request."""
        self._tunnel = True
        self._upgrading = None
        held, self._held = self._held, None
        if held:
            self._forward_raw(held)
        self.unblock_reading(self.BLOCK_UPGRADE | self.BLOCK_QUEUE)

    def _forward_raw(self, data: bytes) -> None:
        ex = self.current
        upstream = ex.upstream if ex is not None else None
        if upstream is not None and upstream.transport is not None:
            upstream.transport.write(data)

    def _parse_held(self) -> None:
        """An Upgrade request was answered without a switch: what the client sent after
        it is HTTP, parsed now as the next request (httptools resumes after an upgrade),
        and reading resumes."""
        held, self._held = self._held, None
        if held is None or self._closed or self._parser_dead:
            return
        self.unblock_reading(self.BLOCK_UPGRADE)
        if held:
            self.data_received(held)
        if self._client_done and self.current is None and not self._queue:
            self.close()

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

    def slot_freed(self, in_flight: InFlight) -> None:
        self._proxy.slot_freed(in_flight)

    def note_fd_shortage(self, what: str) -> None:
        self._proxy.fd_shortage.note(what)

    def peer_gone(self) -> bool:
        """Whether the client closed or reset the connection while reading it is paused
        (a held request), judged by peeking at the socket as nginx checks a client
        waiting on its upstream. Bytes still unread (a body) hide a close behind them."""
        sock = self.transport.get_extra_info("socket")
        if sock is None or self._closed:
            return False
        try:
            fd = os.dup(sock.fileno())
        except OSError:
            return False  # out of descriptors: it cannot be told, so it waits on
        try:
            with socket.socket(fileno=fd) as probe:
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
        self._held = None
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
        if self._tunnel:
            return  # its traffic is the application's, untimed
        if self._in_head or self._parsing is not None:
            if self.read_blocks:  # the router paused reading: the client is not to blame
                timeout_s = options.header_timeout_s if self._in_head else options.body_timeout_s
                self._read_deadline = now + timeout_s
            else:
                self._refuse(responses.REQUEST_TIMEOUT)
        elif self.current is None and not self._queue:
            self.close()  # idle between requests: nothing is owed, close silently
