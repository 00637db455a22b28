"""One request and its response on a client connection: the link between the client
half (downstream) and the upstream half of the proxy.

Owns an exchange's progress flags and its request bytes on their way upstream.
Invariants: request bytes leave in order, after the head, once an upstream connection
is attached (until then they are buffered, and the client is not read past
_BUFFER_WHILE_CONNECTING_BYTES); a response is started at most once, by the upstream
or by the router itself (502), never both.

The request and response progress independently, so the state is a few flags rather
than one enum: a single state would be the product of the two.
"""

from __future__ import annotations

from time import monotonic
from typing import TYPE_CHECKING, Final

from keelway.router import responses

if TYPE_CHECKING:
    from keelway.router.downstream import ClientConnection
    from keelway.router.route_table import CompiledRoute
    from keelway.router.upstream import UpstreamConnection, UpstreamPool

_LAST_CHUNK: Final = b"0\r\n\r\n"
_CRLF: Final = b"\r\n"
_BUFFER_WHILE_CONNECTING_BYTES: Final = 256 * 1024
# The status an access-log line gives a request whose client left before its answer
# (nginx's word for it).
_CLIENT_GONE: Final = 499


class Tally:
    """One instance's responses to clients in this process (keelway/router/counts.py
    says what counts), kept across table swaps by the proxy. An app's answer costs two
    comparisons and an add on a native int: the hot path's whole share of counting."""

    __slots__ = ("other", "router", "s1xx", "s2xx", "s3xx", "s4xx", "s5xx")

    def __init__(self) -> None:
        self.s1xx = self.s2xx = self.s3xx = self.s4xx = self.s5xx = self.other = 0
        # The router's own answers by status: a handful of statuses, off the fast path.
        self.router: dict[int, int] = {}

    def app_answered(self, status: int) -> None:
        if status < 300:
            if status >= 200:
                self.s2xx += 1
            elif status >= 100:
                self.s1xx += 1
            else:
                self.other += 1
        elif status < 400:
            self.s3xx += 1
        elif status < 500:
            self.s4xx += 1
        elif status < 600:
            self.s5xx += 1
        else:
            self.other += 1

    def router_answered(self, status: int) -> None:
        self.router[status] = self.router.get(status, 0) + 1


class InFlight:
    """One instance's requests in flight in this process (through any of its hosts),
    kept across table swaps by the proxy; keelway/router/concurrency.py owns the policy.

    `limit` is how many this process may have without asking anyone: the instance's
    bound in a router of one process, what the main process lent it in a worker.
    `waiting` counts requests waiting for more of it, so the exchange that gives a slot
    back calls out of the hot path only when someone wants it. Taking and giving back
    cost a comparison and an add on a native int."""

    __slots__ = ("count", "instance", "limit", "waiting")

    def __init__(self, instance: str) -> None:
        self.instance: Final = instance
        self.count = 0
        self.limit = 0
        self.waiting = 0

    def take(self, ex: Exchange) -> bool:
        """Count `ex` in, if under the limit; it gives its slot back when it ends."""
        if self.count < self.limit:
            self.count += 1
            ex.in_flight = self
            return True
        return False


class Exchange:
    """One request and its response on a client connection.

    Either `local` holds the whole response the router writes itself, or `pool` names the
    upstream that answers. Request bytes for the upstream collect in `out` and leave once
    per client read (and when the upstream attaches), so a small request is one write.
    """

    __slots__ = (
        "abandoned",
        "began",
        "chunked_ok",
        "chunked_request",
        "client",
        "close_client",
        "head_request",
        "held",
        "held_s",
        "hsts",
        "in_flight",
        "local",
        "local_status",
        "method",
        "out",
        "pool",
        "request_done",
        "response_started",
        "retry_head",
        "sent",
        "status",
        "target",
        "upgrade",
        "upstream",
        "url",
    )

    def __init__(
        self,
        client: ClientConnection,
        head_request: bool,
        close_client: bool,
        chunked_ok: bool,
    ) -> None:
        self.client: Final = client
        self.head_request: Final = head_request
        self.close_client = close_client
        self.chunked_ok: Final = chunked_ok
        self.local: bytes | None = None
        self.local_status = 0  # the status of `local`
        self.pool: UpstreamPool | None = None
        self.upstream: UpstreamConnection | None = None
        self.out: list[bytes] = []
        self.retry_head: bytes | None = None
        # The Strict-Transport-Security line its response gets (an HTTPS request to a
        # route that asks for it), or None.
        self.hsts: bytes | None = None
        # How far the exchange has come, each a one-way step.
        self.request_done = self.response_started = self.abandoned = False
        self.chunked_request = self.upgrade = False
        # Waiting for its route to stop holding, or for a slot of its instance's bound;
        # the proxy resumes or answers it.
        self.held = False
        # The count it is in while it goes upstream (InFlight.take); left exactly once,
        # when it ends however it ends (answered, failed, or its client gone).
        self.in_flight: InFlight | None = None
        # Its route: while this is a connection's current exchange (a streaming
        # response, a tunnel, a held request), its host counts as open (Proxy.activity).
        self.target: CompiledRoute | None = None
        # For its access-log record (keelway/router/access_log.py): when its head
        # completed (monotonic; 0.0: nothing to record, the log is off or it is
        # written), its method and target, its answer's status and the bytes sent to
        # the client, and how long it was held (-1.0: never). Recorded once, when it
        # ends (`_record`).
        self.began = 0.0
        self.method = b""
        self.url = b""
        self.status = 0
        self.sent = 0
        self.held_s = -1.0

    def start(self) -> None:
        """Become the current exchange: send a local answer, or find an upstream."""
        pool = self.pool
        if pool is None:
            if self.held:
                # Its body stays in the kernel until the route resolves (bounded memory).
                self.client.block_reading(self.client.BLOCK_CONNECTING)
            elif self.request_done:
                self._answer_locally()
            return
        conn = pool.acquire()
        if conn is not None:
            conn.attach(self)
        else:
            pool.connect(self)

    def _answer_locally(self) -> None:
        local = self.local
        if local is not None:
            self.local = None
            self.response_started = True
            self.client.transport.write(local)
            self.sent = len(local)
            self.answered(self.local_status, True)
            self.response_complete(keep_client=True)

    def answer_with(self, canned: responses.Canned, close: bool) -> None:
        """Make `canned` the router's own answer to this request, sent in its turn."""
        self.close_client = close
        self.local = canned.pick(self.head_request, close)
        self.local_status = canned.status

    def answered(self, status: int, by_router: bool) -> None:
        """This request's answer (status `status`) goes to the client: the upstream's
        response head, or (`by_router`) one the router wrote itself."""
        self.status = status
        target = self.target
        if target is not None:
            tally = target.tally
            if tally is not None:
                if by_router:
                    tally.router_answered(status)
                else:
                    tally.app_answered(status)

    def request_body(self, body: bytes) -> None:
        if self.pool is None and not self.held:
            return  # a local answer ignores the body
        if self.chunked_request:
            self.out += (b"%x\r\n" % len(body), body, _CRLF)
        else:
            self.out.append(body)

    def request_complete(self) -> None:
        self.request_done = True
        if self.chunked_request:
            self.out.append(_LAST_CHUNK)
        if self.client.current is self and not self.held:
            if self.pool is None:
                self._answer_locally()
            else:
                self.client.await_upstream()

    def flush(self) -> None:
        """Send buffered request bytes upstream, or bound them while still connecting."""
        out = self.out
        if not out:
            return
        upstream = self.upstream
        if upstream is not None and upstream.transport is not None:
            upstream.transport.writelines(out)
            out.clear()
        elif sum(map(len, out)) > _BUFFER_WHILE_CONNECTING_BYTES:
            self.client.block_reading(self.client.BLOCK_CONNECTING)

    def retry(self) -> None:
        """The reused upstream connection died before answering a bodiless request:
        send it again on a fresh connection (at most once)."""
        head, self.retry_head = self.retry_head, None
        pool = self.pool
        if head is None or pool is None or self.abandoned:
            self.upstream_failed()
            return
        self.upstream = None
        self.out = [head]
        pool.connect(self)

    def upstream_failed(self, answer: responses.Canned | None = None) -> None:
        """The upstream could not be reached or broke off: `answer` (502 unless the
        router itself was short of something) if nothing was sent yet, otherwise the
        client connection closes (a truncated response is never dressed up as a
        complete one)."""
        self.upstream = None
        if self.abandoned:
            return
        if self.response_started:
            self.client.close()
            return
        self.response_started = True
        close = self.close_client or not self.request_done
        canned = responses.BAD_GATEWAY if answer is None else answer
        data = canned.pick(self.head_request, close)
        self.client.transport.write(data)
        self.sent = len(data)
        self.answered(canned.status, True)
        self.close_client = close
        self.response_complete(keep_client=self.request_done)

    def upstream_timed_out(self) -> None:
        """The upstream did not begin answering within its time: 504, and its connection
        closes (a late answer must never reach this client or a later request). Marked
        abandoned, so a connection still opening for it is pooled unused, not attached."""
        upstream = self.upstream
        self.upstream = None
        self.abandoned = True
        if upstream is not None:
            upstream.abandon()
        self.response_started = True
        close = self.close_client
        data = responses.GATEWAY_TIMEOUT.pick(self.head_request, close)
        self.client.transport.write(data)
        self.sent = len(data)
        self.answered(responses.GATEWAY_TIMEOUT.status, True)
        self.response_complete(keep_client=True)

    def response_complete(self, keep_client: bool) -> None:
        self.upstream = None
        self.leave_in_flight()
        if self.began:
            self._record(self.status)
        if not keep_client:
            self.close_client = True
        self.client.exchange_done(self)

    def resume(self, pool: UpstreamPool) -> None:
        """Its route serves again: go to `pool` as if it had never waited."""
        self.held = False
        if self.began:
            self.held_s = monotonic() - self.began
        self.pool = pool
        if self.client.current is self:
            self.start()
            if self.request_done:
                self.client.await_upstream()

    def answer_instead(self, canned: responses.Canned) -> None:
        """Its route will not serve it (gone, gated, or held too long): answer locally.

        Its unread body is never read: the answer says close, and the connection ends.
        """
        self.held = False
        if self.began:
            self.held_s = monotonic() - self.began
        self.out.clear()
        self.answer_with(canned, self.close_client or not self.request_done)
        if self.client.current is self:
            self.client.unblock_reading(self.client.BLOCK_CONNECTING)
            self.request_done = True  # what is left of the body is not read
            self._answer_locally()

    def leave_in_flight(self) -> None:
        """Give back its slot of its instance's bound (once; a no-op without one)."""
        counted = self.in_flight
        if counted is not None:
            self.in_flight = None
            counted.count -= 1
            if counted.waiting:
                self.client.slot_freed(counted)

    def abandon(self) -> None:
        """The client is gone: drop the upstream connection, whose state is now unknown."""
        if self.held:
            self.held = False
            self.client.unhold(self)
            if self.began:
                self.held_s = monotonic() - self.began
        self.leave_in_flight()
        if self.began:
            self._record(self.status or _CLIENT_GONE)
        self.abandoned = True
        upstream = self.upstream
        if upstream is not None:
            self.upstream = None
            upstream.abandon()

    def _record(self, status: int) -> None:
        """Hand its access-log record to the process's log (once: `began` is cleared).
        Its fields appended to a flat list are the request path's whole share; the log
        writes them in batches (keelway/router/access_log.py)."""
        began = self.began
        self.began = 0.0
        target = self.target
        access = self.client.access_log
        if access is None or target is None:
            return
        pending = access.pending
        pending += (target.instance, target.generation, began, monotonic(), self.method,
                    self.url, status, self.sent, self.held_s, self.client.client_ip)
        if len(pending) >= access.max_items:
            access.flush_soon()
