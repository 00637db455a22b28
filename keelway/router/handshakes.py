"""The HTTPS listener's accept path: each connection's ClientHello is read before the
handshake, the TLS context chosen from it (keelway/router/tls.py), and only then the
connection handed to the event loop's TLS, with the proxy's protocol, as any other.

Why not `create_server(ssl=...)` with an SNI callback: Python's callback runs inside the
handshake, cannot wait (for a certificate on demand, on_demand.py), and never sees the
protocols the client offers (ALPN), which ACME's TLS-ALPN-01 is chosen by.

Rules it keeps:
- A connection is read, never consumed, before the handoff: the hello is peeked
  (MSG_PEEK), so the TLS library reads it again from the first byte.
- What is read is bounded: MAX_HELLO_BYTES of hello, within HANDSHAKE_TIMEOUT_S of the
  accept (one sweep every SWEEP_EVERY_S closes the late), and a wait for a certificate
  on demand within ON_DEMAND_WAIT_S of the hello. While a hello is partial, the socket's
  receive low-water mark is the bytes still missing, so a slow client costs no wakeups.
- A connection is refused (the hello's bytes read, a fatal TLS alert, closed) when its
  first byte is no TLS handshake, its hello does not parse, it names no host or a host
  the table does not serve or has no certificate for, or it asks for ACME's TLS-ALPN-01
  and no challenge is laid down. Nothing that arrives here is ever given another
  name's certificate.
- Every accepted socket is non-blocking and close-on-exec (Python's accept4 sets it).
- The handed-over connection is what `create_server` made: the proxy's protocol on the
  loop's TLS transport, whose `sslcontext` tells the proxy it came in over HTTPS.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any, Final, assert_never

from keelway.router.client_hello import (
    MAX_HELLO_BYTES,
    ClientHello,
    Incomplete,
    Unreadable,
    read_client_hello,
)
from keelway.router.on_demand import ON_DEMAND_WAIT_S, OnDemand
from keelway.router.proxy import SHORTAGE_REPORT_S
from keelway.router.tls import ACME_TLS_ALPN, HANDSHAKE_TIMEOUT_S, Certificates

log: Final = logging.getLogger("keelway.router.handshakes")

ACCEPT_BATCH: Final = 64  # accepts per wakeup of the listener: others' turn after
SWEEP_EVERY_S: Final = 0.5
ACCEPT_PAUSE_S: Final = 0.1
_CHALLENGE_ALPN: Final = (ACME_TLS_ALPN.encode(),)
_RECORD_ALERT: Final = 21
_FATAL: Final = 2
# A connection that ended before its accept: the next one may be fine.
_CLIENT_LEFT: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR})


def alert(description: int) -> bytes:
    """A fatal TLS alert record, as a server sends one before its ServerHello."""
    return bytes((_RECORD_ALERT, 3, 3, 0, 2, _FATAL, description))


_HANDSHAKE_FAILURE: Final = alert(ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE)
_UNRECOGNIZED_NAME: Final = alert(ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME)
_NO_APPLICATION_PROTOCOL: Final = alert(120)  # RFC 7301's; Python's ssl names none


class _PendingHello:
    """A connection not handed over yet: the time it must be decided by, and what its
    hello is waiting for (more bytes: `peeked` of them so far, with a reader on it)."""

    __slots__ = ("deadline", "low_water", "peeked", "reading", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.peeked = 0
        self.reading = False
        self.low_water = False


def _handshake_done(task: asyncio.Task[Any]) -> None:
    # A failed handshake is the client's affair (the transport is closed already);
    # taking the exception keeps asyncio from logging it as never retrieved.
    if not task.cancelled():
        task.exception()


class Handshakes:
    """Accepts on the HTTPS `listener` and hands each connection to `protocol` over TLS
    with the context `certificates` give its hello; `on_demand` (None: off) gets
    certificates for served names that have none."""

    def __init__(self, listener: socket.socket, protocol: Callable[[], asyncio.Protocol],
                 certificates: Certificates, on_demand: OnDemand | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._listener = listener
        self._fd = listener.fileno()
        self._protocol = protocol
        self._certificates = certificates
        self._on_demand = on_demand
        self._buffer = bytearray(MAX_HELLO_BYTES)
        self._view = memoryview(self._buffer)
        self._waiting: dict[int, _PendingHello] = {}  # by descriptor
        # Connections waiting for a certificate on demand, by the answer they wait for.
        self._demanding: dict[asyncio.Future[bool], tuple[str, list[_PendingHello]]] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._paused: asyncio.TimerHandle | None = None
        self._pauses = 0
        self._paused_said_at = -SHORTAGE_REPORT_S
        self._closed = False
        self.refused = 0  # connections refused before a handshake (tests, logs)

    def start(self) -> None:
        self._loop.add_reader(self._fd, self._accept)

    def close(self) -> None:
        """Accept no more; close what is not handed over yet. Handed-over connections
        are the proxy's (Proxy.drain); the listener is closed, as a server's is."""
        if self._closed:
            return
        self._closed = True
        if self._paused is not None:
            self._paused.cancel()
        else:
            self._loop.remove_reader(self._fd)
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._on_demand is not None:
            self._on_demand.close()
        for waiting in list(self._waiting.values()):
            self._forget(waiting)
            waiting.sock.close()
        self._demanding.clear()
        self._listener.close()

    # -- accepting --------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _CLIENT_LEFT:
                    continue
                # Short of descriptors or memory (or worse): the listener stays readable,
                # so accepting pauses rather than spinning on it; said once a while.
                self._pauses += 1
                now = self._loop.time()
                if now - self._paused_said_at >= SHORTAGE_REPORT_S:
                    log.warning("HTTPS accepts paused %d times for %.1f s each since the "
                                "last report: %s", self._pauses, ACCEPT_PAUSE_S, exc)
                    self._paused_said_at, self._pauses = now, 0
                self._loop.remove_reader(self._fd)
                self._paused = self._loop.call_later(ACCEPT_PAUSE_S, self._resume)
                return
            sock.setblocking(False)
            self._peek(sock, None)

    def _resume(self) -> None:
        self._paused = None
        if not self._closed:
            self._loop.add_reader(self._fd, self._accept)

    def _readable(self, fd: int) -> None:
        waiting = self._waiting.get(fd)
        if waiting is not None:
            self._peek(waiting.sock, waiting)

    def _peek(self, sock: socket.socket, waiting: _PendingHello | None) -> None:
        try:
            # Into one buffer kept for all: a bytes object as large as the bound, made
            # and shrunk for every connection, costs more than the copy of what came.
            peeked_bytes = sock.recv_into(self._buffer, MAX_HELLO_BYTES, socket.MSG_PEEK)
        except BlockingIOError:
            data = None
        except OSError:
            self._drop(sock, waiting)
            return
        else:
            data = bytes(self._view[:peeked_bytes])
        if data is None:
            needed = 1
        else:
            if not data or (waiting is not None and waiting.low_water
                            and len(data) <= waiting.peeked):
                # The client left (or sent its FIN) before its hello was whole.
                self._drop(sock, waiting)
                return
            peeked = read_client_hello(data)
            match peeked:
                case ClientHello():
                    self._choose(sock, waiting, peeked)
                    return
                case Incomplete(needed_bytes=needed):
                    pass
                case Unreadable.NOT_TLS:
                    self._refuse(sock, waiting, None)  # not TLS: no alert it could read
                    return
                case Unreadable.MALFORMED | Unreadable.TOO_LARGE:
                    self._refuse(sock, waiting, _HANDSHAKE_FAILURE)
                    return
                case _:
                    assert_never(peeked)
        if waiting is None:
            waiting = self._wait(sock, self._loop.time() + HANDSHAKE_TIMEOUT_S)
        if not waiting.reading:
            self._loop.add_reader(sock.fileno(), self._readable, sock.fileno())
            waiting.reading = True
        if data is not None:
            waiting.peeked = len(data)
            # Readable again only once the bytes still missing are in (or at its end):
            # the peeked bytes stay queued, so the mark counts them too.
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, needed)
            except OSError:
                self._drop(sock, waiting)
                return
            waiting.low_water = True

    # -- deciding ---------------------------------------------------------------------

    def _choose(self, sock: socket.socket, waiting: _PendingHello | None,
                hello: ClientHello) -> None:
        name = hello.server_name
        if name is None:
            self._refuse(sock, waiting, _HANDSHAKE_FAILURE)
            return
        if hello.alpn == _CHALLENGE_ALPN:
            context = self._certificates.challenge_context(name)
            if context is None:
                self._refuse(sock, waiting, _NO_APPLICATION_PROTOCOL)
            else:
                self._hand_over(sock, waiting, context)
            return
        context = self._certificates.context_for(name)
        if context is not None:
            self._hand_over(sock, waiting, context)
            return
        answer = (self._on_demand.ask(name) if self._on_demand is not None
                  and not self._certificates.has_certificate(name) else None)
        if answer is None:
            self._refuse(sock, waiting, _UNRECOGNIZED_NAME)
            return
        # Wait for the answer: no reader (the hello is in), the demand's own deadline.
        deadline = self._loop.time() + ON_DEMAND_WAIT_S
        if waiting is None:
            waiting = self._wait(sock, deadline)
        else:
            self._stop_reading(waiting)
            waiting.deadline = deadline
        demanding = self._demanding.get(answer)
        if demanding is None:
            self._demanding[answer] = (name, [waiting])
            answer.add_done_callback(self._demanded)
        else:
            demanding[1].append(waiting)

    def _demanded(self, answer: asyncio.Future[bool]) -> None:
        name, waiters = self._demanding.pop(answer, ("", []))
        got = not answer.cancelled() and answer.result()
        context = self._certificates.context_for(name) if got else None
        for waiting in waiters:
            if self._waiting.get(waiting.sock.fileno()) is not waiting:
                continue  # swept: it waited too long
            if context is None:
                self._refuse(waiting.sock, waiting, _UNRECOGNIZED_NAME)
            else:
                self._hand_over(waiting.sock, waiting, context)

    def _hand_over(self, sock: socket.socket, waiting: _PendingHello | None,
                   context: ssl.SSLContext) -> None:
        if waiting is not None:
            self._forget(waiting)
            if waiting.low_water:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
                except OSError:
                    sock.close()
                    return
        # connect_accepted_socket is uvloop's one public way to put TLS on a socket we
        # accepted, and a coroutine: it sets the transport up at once, then waits for the
        # handshake. Its task costs some 5 us against a handshake's 250 and more, so the
        # coroutine is not driven by hand; the done callback only takes its outcome.
        task = self._loop.create_task(self._loop.connect_accepted_socket(
            self._protocol, sock, ssl=context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S))
        task.add_done_callback(_handshake_done)

    def _refuse(self, sock: socket.socket, waiting: _PendingHello | None,
                said: bytes | None) -> None:
        """Read what was peeked (so the close is a FIN, not a reset that could overtake
        the alert), send the alert, close."""
        self.refused += 1
        if waiting is not None:
            self._forget(waiting)
        try:
            sock.recv(MAX_HELLO_BYTES)
            if said is not None:
                sock.send(said)
        except OSError:
            pass
        sock.close()

    def _drop(self, sock: socket.socket, waiting: _PendingHello | None) -> None:
        if waiting is not None:
            self._forget(waiting)
        sock.close()

    # -- waiting ----------------------------------------------------------------------

    def _wait(self, sock: socket.socket, deadline: float) -> _PendingHello:
        waiting = _PendingHello(sock, deadline)
        self._waiting[sock.fileno()] = waiting
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(SWEEP_EVERY_S, self._sweep)
        return waiting

    def _stop_reading(self, waiting: _PendingHello) -> None:
        if waiting.reading:
            self._loop.remove_reader(waiting.sock.fileno())
            waiting.reading = False

    def _forget(self, waiting: _PendingHello) -> None:
        self._stop_reading(waiting)
        self._waiting.pop(waiting.sock.fileno(), None)

    def _sweep(self) -> None:
        self._sweeper = None
        now = self._loop.time()
        late = [w for w in self._waiting.values() if w.deadline <= now]
        for waiting in late:
            self._drop(waiting.sock, waiting)
        if self._waiting and not self._closed:
            self._sweeper = self._loop.call_later(SWEEP_EVERY_S, self._sweep)
