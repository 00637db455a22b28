"""The router against hostile requests, as raw-socket transcripts.

Each test writes exact bytes to the router, reads what comes back, and checks three
things: the status the client got (and that the page names no internals), that the
upstream — a recorder that notes every request it parses, with a different (lenient)
parser than the router's — never saw a desynchronised or smuggled request, and that the
router still serves a normal request on a new connection afterwards.

Most tests run the router's real Proxy in-process on its own uvloop thread, so that
limits and timeouts can be set small (0.3 s) through ProxyOptions; a few run the router
process itself to show the defaults hold end to end.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import pytest

from keelway.router.proxy import ProxyOptions
from keelway.router.route_table import Handling, RouteEntry
from tests.router.conftest import InProcessRouter

T = TypeVar("T")

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: blog.test\r\n\r\n"
INTERNALS = (b"keelway", b"python", b"traceback", b"httptools", b"/work", b".py", b"127.0.0.1:")
FAST = ProxyOptions(
    max_header_bytes=8 * 1024,
    max_body_bytes=64 * 1024,
    header_timeout_s=0.3,
    body_timeout_s=0.3,
    idle_timeout_s=0.3,
    upstream_timeout_s=0.3,
    close_linger_s=0.3,
    drain_timeout_s=0.1,
)


# -- the recording upstream -----------------------------------------------------------


@dataclass
class Record:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass
class Recorder:
    """Every request the upstream parsed, in arrival order, whatever its method."""

    requests: list[Record] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def targets(self) -> list[str]:
        with self.lock:
            return [r.target for r in self.requests]


def recording_handler(recorder: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def parse_request(self) -> bool:
            if not super().parse_request():
                return False
            headers = {k.lower(): v for k, v in self.headers.items()}
            self.record = Record(self.command, self.path, headers)
            with recorder.lock:
                recorder.requests.append(self.record)
            return True

        def _read_body(self) -> bytes:
            """Lenient on purpose (int() takes ' 5' and '+5'): a parser that differs from
            the router's is the one a smuggled request would fool."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                body = b""
                while True:
                    size = int(self.rfile.readline(100).split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline(1000) not in (b"\r\n", b"\n", b""):
                            pass
                        return body
                    body += self.rfile.read(size)
                    self.rfile.readline(10)
            return self.rfile.read(int(self.headers.get("Content-Length", "0")))

        def _answer(self) -> None:
            try:
                self.record.body = self._read_body()
            except ValueError:
                self.close_connection = True
                return
            payload = json.dumps({"target": self.path, "size": len(self.record.body)})
            body = payload.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_HEAD = do_OPTIONS = _answer

    return Handler


@dataclass
class Upstream:
    port: int
    recorder: Recorder

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    recorder = Recorder()
    server = ThreadingHTTPServer(("127.0.0.1", 0), recording_handler(recorder))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
    thread.start()
    try:
        yield Upstream(server.server_address[1], recorder)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def silent_upstream() -> Iterator[str]:
    """An address whose kernel completes the handshake and takes the bytes, and whose
    application never answers (nothing calls accept)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


# -- the router, in-process --------------------------------------------------------------


@pytest.fixture
def start_proxy() -> Iterator[Any]:
    started: list[InProcessRouter] = []

    def start(routes: dict[str, RouteEntry], options: ProxyOptions = FAST) -> InProcessRouter:
        router = InProcessRouter(routes, options)
        started.append(router)
        return router

    try:
        yield start
    finally:
        for router in started:
            router.stop()


@pytest.fixture
def proxy(start_proxy: Any, upstream: Upstream, silent_upstream: str) -> InProcessRouter:
    router: InProcessRouter = start_proxy(
        {"blog.test": serving(upstream.address), "silent.test": serving(silent_upstream)}
    )
    return router


@pytest.fixture
def no_errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Nothing hostile may reach the router's internal-error path (a traceback)."""
    with caplog.at_level(logging.WARNING, logger="keelway.router"):
        yield
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


# -- transcripts --------------------------------------------------------------------------


def serving(upstream: str) -> RouteEntry:
    return RouteEntry(state=Handling.SERVING, upstream=upstream)


def read_all(sock: socket.socket, timeout_s: float) -> bytes:
    """Read until the peer closes or `timeout_s` passes."""
    chunks = []
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            chunks.append(b"<reset>")
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def exchange(port: int, data: bytes, timeout_s: float = 3.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        return read_all(sock, timeout_s)


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    raw: bytes


def parse_reply(raw: bytes) -> Reply:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.decode().strip().lower()] = value.decode().strip()
    return Reply(status, headers, body, raw)


def assert_refused(raw: bytes, status: int) -> Reply:
    """One clean refusal page: the status, exact framing, `Connection: close`, then EOF,
    and not a word about internals."""
    assert raw.startswith(b"HTTP/1.1 %d " % status), raw[:200]
    reply = parse_reply(raw)
    assert reply.headers["connection"] == "close"
    assert int(reply.headers["content-length"]) == len(reply.body)
    assert reply.body.startswith(b"%d " % status)
    for word in INTERNALS:
        assert word not in raw.lower()
    return reply


def assert_still_serves(port: int, upstream: Upstream) -> None:
    raw = exchange(port, b"GET /after HTTP/1.1\r\nHost: blog.test\r\nConnection: close\r\n\r\n")
    reply = parse_reply(raw)
    assert reply.status == 200
    assert json.loads(reply.body)["target"] == "/after"
    assert "/after" in upstream.recorder.targets()


def assert_nothing_smuggled(upstream: Upstream, allowed: set[str]) -> None:
    time.sleep(0.05)  # anything the router did forward has reached the recorder by now
    targets = upstream.recorder.targets()
    assert "/smuggled" not in targets
    assert set(targets) <= allowed | {"/after"}


def post(headers: bytes, body: bytes = b"", target: bytes = b"/upload") -> bytes:
    return b"POST " + target + b" HTTP/1.1\r\nHost: blog.test\r\n" + headers + b"\r\n" + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# -- smuggling: each refused with 400, nothing hidden reaches the upstream ------------------

CL_TE_BODY = b"0\r\n\r\n" + SMUGGLED
TE_CL_BODY = chunk(SMUGGLED) + b"0\r\n\r\n"

REFUSED_HEADS = {
    # framing that two parsers could read two ways
    "cl-then-te": post(
        b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % len(CL_TE_BODY), CL_TE_BODY
    ),
    "te-then-cl": post(b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", TE_CL_BODY),
    "duplicate-equal-cl": post(b"Content-Length: 5\r\nContent-Length: 5\r\n", b"hello"),
    "duplicate-differing-cl": post(
        b"Content-Length: 0\r\nContent-Length: %d\r\n" % len(SMUGGLED), SMUGGLED
    ),
    "cl-plus": post(b"Content-Length: +44\r\n", SMUGGLED),
    "cl-hex": post(b"Content-Length: 0x2c\r\n", SMUGGLED),
    "cl-list": post(b"Content-Length: 44,44\r\n", SMUGGLED),
    "cl-negative": post(b"Content-Length: -1\r\n", SMUGGLED),
    "cl-trailing-space": post(b"Content-Length: 44 \r\n", SMUGGLED),
    "cl-overflow": post(b"Content-Length: 99999999999999999999999\r\n", SMUGGLED),
    "te-chunked-identity": post(b"Transfer-Encoding: chunked, identity\r\n", CL_TE_BODY),
    "te-gzip-chunked": post(b"Transfer-Encoding: gzip, chunked\r\n", CL_TE_BODY),
    "te-xchunked": post(b"Transfer-Encoding: xchunked\r\n", CL_TE_BODY),
    "te-identity": post(b"Transfer-Encoding: identity\r\n", CL_TE_BODY),
    "te-trailing-space": post(b"Transfer-Encoding: chunked \r\n", CL_TE_BODY),
    "te-twice": post(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", CL_TE_BODY),
    "te-on-http10": b"POST /upload HTTP/1.0\r\nHost: blog.test\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n" + CL_TE_BODY,
    "te-space-before-colon": post(b"Transfer-Encoding : chunked\r\n", CL_TE_BODY),
    "cl-space-before-colon": post(b"Content-Length : 44\r\n", SMUGGLED),
    "te-obs-fold": post(b"Transfer-Encoding:\r\n chunked\r\n", CL_TE_BODY),
    "obs-fold": b"GET / HTTP/1.1\r\nHost: blog.test\r\nX-A: b\r\n\tc\r\n\r\n",
    "bare-cr": b"GET / HTTP/1.1\r\nHost: blog.test\rX-A: b\r\n\r\n",
    "bare-lf": b"GET / HTTP/1.1\nHost: blog.test\n\n",
    "nul-in-value": b"GET / HTTP/1.1\r\nHost: blog.test\r\nX-A: a\x00b\r\n\r\n",
    # request lines
    "version-1.2": b"GET / HTTP/1.2\r\nHost: blog.test\r\n\r\n",
    "version-2.0": b"GET / HTTP/2.0\r\nHost: blog.test\r\n\r\n",
    "version-0.9": b"GET /\r\n\r\n",
    "version-garbled": b"GET / HTTX/1.1\r\nHost: blog.test\r\n\r\n",
    "version-no-dot": b"GET / HTTP/11\r\nHost: blog.test\r\n\r\n",
    "space-in-target": b"GET /a b HTTP/1.1\r\nHost: blog.test\r\n\r\n",
    "relative-target": b"GET upload HTTP/1.1\r\nHost: blog.test\r\n\r\n",
    # Host
    "host-missing": b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n",
    "host-twice": b"GET / HTTP/1.1\r\nHost: blog.test\r\nHost: other.test\r\n\r\n",
    "host-empty": b"GET / HTTP/1.1\r\nHost: \r\n\r\n",
    "host-with-path": b"GET / HTTP/1.1\r\nHost: blog.test/../x\r\n\r\n",
    "host-with-userinfo": b"GET / HTTP/1.1\r\nHost: evil@blog.test\r\n\r\n",
    "host-with-space": b"GET / HTTP/1.1\r\nHost: blog.test evil\r\n\r\n",
    "host-bad-port": b"GET / HTTP/1.1\r\nHost: blog.test:8o\r\n\r\n",
    "host-long-port": b"GET / HTTP/1.1\r\nHost: blog.test:123456\r\n\r\n",
    "host-space-before-colon": b"GET / HTTP/1.1\r\nHost : blog.test\r\n\r\n",
    "absolute-form-other-host": b"GET http://other.test/x HTTP/1.1\r\nHost: blog.test\r\n\r\n",
    "absolute-form-userinfo": b"GET http://evil@blog.test/x HTTP/1.1\r\nHost: blog.test\r\n\r\n",
    "absolute-form-other-scheme": b"GET ftp://blog.test/x HTTP/1.1\r\nHost: blog.test\r\n\r\n",
}


@pytest.mark.parametrize("raw", REFUSED_HEADS.values(), ids=REFUSED_HEADS.keys())
def test_a_malformed_head_is_refused_with_400_and_never_forwarded(
    proxy: InProcessRouter, upstream: Upstream, raw: bytes, no_errors_logged: None
) -> None:
    assert_refused(exchange(proxy.port, raw), 400)
    assert_nothing_smuggled(upstream, allowed=set())
    assert_still_serves(proxy.port, upstream)


BROKEN_CHUNKS = {
    "non-hex-size": b"zz\r\n" + SMUGGLED,
    "negative-size": b"-5\r\nhello\r\n0\r\n\r\n" + SMUGGLED,
    "overlong-size": b"ffffffffffffffffff\r\nhello\r\n0\r\n\r\n" + SMUGGLED,
    "size-with-space": b"5 \r\nhello\r\n0\r\n\r\n" + SMUGGLED,
    "missing-crlf-after-data": b"5\r\nhelloXX0\r\n\r\n" + SMUGGLED,
    "bare-lf-after-size": b"5\nhello\r\n0\r\n\r\n" + SMUGGLED,
    "data-longer-than-size": b"3\r\nhello\r\n0\r\n\r\n" + SMUGGLED,
}


@pytest.mark.parametrize("body", BROKEN_CHUNKS.values(), ids=BROKEN_CHUNKS.keys())
def test_a_broken_chunked_body_is_refused_with_400_and_its_upstream_connection_dropped(
    proxy: InProcessRouter, upstream: Upstream, body: bytes, no_errors_logged: None
) -> None:
    """The head was valid, so it may already be upstream (bodies stream); the body is
    cut off with the upstream connection, and the hidden request never follows."""
    raw = exchange(proxy.port, post(b"Transfer-Encoding: chunked\r\n", body))
    assert_refused(raw, 400)
    assert_nothing_smuggled(upstream, allowed={"/upload"})
    with upstream.recorder.lock:
        assert all(r.body == b"" for r in upstream.recorder.requests)
    assert_still_serves(proxy.port, upstream)


def test_a_pipelined_good_request_is_answered_before_the_refusal_of_the_next(
    proxy: InProcessRouter, upstream: Upstream, no_errors_logged: None
) -> None:
    good = b"GET /first HTTP/1.1\r\nHost: blog.test\r\n\r\n"
    raw = exchange(proxy.port, good + REFUSED_HEADS["cl-then-te"])
    first, _, rest = raw.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 ")
    assert b'"/first"' in rest
    assert_refused(rest[rest.index(b"HTTP/1.1 ") :], 400)
    assert_nothing_smuggled(upstream, allowed={"/first"})
    assert_still_serves(proxy.port, upstream)


# -- what is accepted, and how it is forwarded --------------------------------------------


@pytest.mark.parametrize(
    ("head", "body", "seen_body"),
    [
        (b"Transfer-Encoding: Chunked\r\n", chunk(b"hello") + b"0\r\n\r\n", b"hello"),
        (b"Transfer-Encoding:\tchunked\r\n", chunk(b"hello") + b"0\r\n\r\n", b"hello"),
        (b"Content-Length:   5\r\n", b"hello", b"hello"),
        (b"Content-Length: 0\r\n", b"", b""),
    ],
    ids=["te-any-case", "te-leading-tab", "cl-leading-spaces", "cl-zero"],
)
def test_well_formed_framing_is_forwarded_in_canonical_form(
    proxy: InProcessRouter, upstream: Upstream, head: bytes, body: bytes, seen_body: bytes
) -> None:
    """Leading whitespace is syntax (RFC 9110 §5.5 OWS), not part of the value: every
    parser strips it, so it cannot desynchronise; the upstream gets clean values."""
    raw = exchange(proxy.port, post(head + b"Connection: close\r\n", body))
    assert parse_reply(raw).status == 200
    (record,) = upstream.recorder.requests
    assert record.body == seen_body
    assert record.headers.get("transfer-encoding", "chunked") == "chunked"
    assert record.headers.get("content-length", "5").isdigit()


def test_absolute_form_naming_the_host_is_forwarded_in_origin_form(
    proxy: InProcessRouter, upstream: Upstream
) -> None:
    raw = exchange(
        proxy.port,
        b"GET HTTP://Blog.Test/x?y=1 HTTP/1.1\r\nHost: blog.test\r\nConnection: close\r\n\r\n"
        b"GET http://blog.test?q HTTP/1.1\r\nHost: blog.test\r\nConnection: close\r\n\r\n",
    )
    assert parse_reply(raw).status == 200
    raw = exchange(
        proxy.port,
        b"GET https://blog.test HTTP/1.1\r\nHost: BLOG.test\r\nConnection: close\r\n\r\n",
    )
    assert parse_reply(raw).status == 200
    assert upstream.recorder.targets() == ["/x?y=1", "/"]
    assert upstream.recorder.requests[1].headers["host"] == "BLOG.test"


def test_a_valid_host_with_port_or_ip_literal_is_routed_or_answered_404(
    proxy: InProcessRouter, upstream: Upstream
) -> None:
    for host, status in [
        (b"blog.test:8080", 200),
        (b"BLOG.TEST", 200),
        (b"10.0.0.1:80", 404),
        (b"[::1]:8080", 404),
        (b"under_score.test", 404),
    ]:
        raw = exchange(
            proxy.port, b"GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host
        )
        assert parse_reply(raw).status == status, host


# -- limits ----------------------------------------------------------------------------------


def test_a_header_block_over_the_limit_is_refused_with_431(
    proxy: InProcessRouter, upstream: Upstream, no_errors_logged: None
) -> None:
    big = b"X-Big: " + b"a" * 10_000 + b"\r\n"
    assert_refused(exchange(proxy.port, b"GET / HTTP/1.1\r\nHost: blog.test\r\n" + big), 431)
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(200))
    raw = exchange(proxy.port, b"GET / HTTP/1.1\r\nHost: blog.test\r\n" + many + b"\r\n")
    assert_refused(raw, 431)
    assert upstream.recorder.targets() == []
    assert_still_serves(proxy.port, upstream)


def test_a_content_length_over_the_body_limit_is_refused_with_413_before_any_body(
    proxy: InProcessRouter, upstream: Upstream, no_errors_logged: None
) -> None:
    started = time.monotonic()
    raw = exchange(proxy.port, post(b"Content-Length: %d\r\n" % (64 * 1024 + 1), b"x" * 1000))
    assert_refused(raw, 413)
    assert time.monotonic() - started < 1.0  # answered at once, not after a body timeout
    assert upstream.recorder.targets() == []
    assert_still_serves(proxy.port, upstream)


def test_a_chunked_body_is_counted_and_refused_with_413_past_the_limit(
    proxy: InProcessRouter, upstream: Upstream, no_errors_logged: None
) -> None:
    piece = b"y" * 16 * 1024
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as sock:
        sock.sendall(post(b"Transfer-Encoding: chunked\r\n"))
        try:
            for _ in range(5):  # 80 KiB: over the 64 KiB limit
                sock.sendall(chunk(piece))
        except OSError:
            pass  # the router may already have stopped reading
        raw = read_all(sock, 3)
    assert_refused(raw, 413)
    with upstream.recorder.lock:
        assert all(len(r.body) <= 64 * 1024 for r in upstream.recorder.requests)
    assert_still_serves(proxy.port, upstream)


def test_a_chunked_body_exactly_at_the_limit_is_forwarded_whole(
    proxy: InProcessRouter, upstream: Upstream
) -> None:
    body = b"".join(chunk(b"z" * 16 * 1024) for _ in range(4)) + b"0\r\n\r\n"
    raw = exchange(proxy.port, post(b"Transfer-Encoding: chunked\r\nConnection: close\r\n", body))
    assert json.loads(parse_reply(raw).body)["size"] == 64 * 1024


# -- timeouts (0.3 s each here) ---------------------------------------------------------------


def test_a_head_that_does_not_arrive_in_time_gets_408_even_when_it_trickles(
    proxy: InProcessRouter, upstream: Upstream, no_errors_logged: None
) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as sock:
        started = time.monotonic()
        sock.sendall(b"GET / HTTP/1.1\r\nHost: blog.test\r\n")
        for i in range(8):  # a byte every 0.1 s: progress, but the head never ends
            time.sleep(0.1)
            try:
                sock.sendall(b"X-%d: 1\r\n" % i)
            except OSError:
                break
        raw = read_all(sock, 3)
        elapsed = time.monotonic() - started
    assert_refused(raw, 408)
    assert 0.25 < elapsed < 2.0
    assert upstream.recorder.targets() == []
    assert_still_serves(proxy.port, upstream)


def test_a_body_that_stalls_gets_408_and_the_partial_request_is_cut_off_upstream(
    proxy: InProcessRouter, upstream: Upstream, no_errors_logged: None
) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as sock:
        sock.sendall(post(b"Content-Length: 10\r\n", b"abc"))
        raw = read_all(sock, 3)
    assert_refused(raw, 408)
    assert_nothing_smuggled(upstream, allowed={"/upload"})
    assert_still_serves(proxy.port, upstream)


def test_a_slow_but_steady_body_is_not_timed_out(
    proxy: InProcessRouter, upstream: Upstream
) -> None:
    """The body timeout is a gap between reads, not a deadline for the whole body."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as sock:
        sock.sendall(post(b"Content-Length: 8\r\nConnection: close\r\n"))
        for byte in b"abcdefgh":  # 0.8 s in all, never 0.3 s without a byte
            time.sleep(0.1)
            sock.sendall(bytes([byte]))
        raw = read_all(sock, 3)
    assert parse_reply(raw).status == 200
    assert upstream.recorder.requests[0].body == b"abcdefgh"


def test_an_idle_keep_alive_connection_is_closed_silently(
    proxy: InProcessRouter, upstream: Upstream
) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as sock:
        sock.sendall(b"GET /one HTTP/1.1\r\nHost: blog.test\r\n\r\n")
        reply = b""
        # One recv may return part of the answer: read it whole (by its Content-Length)
        # so that what follows is only what the idle close says, which must be nothing.
        while b"\r\n\r\n" not in reply or not _whole(reply):
            reply += sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        rest = read_all(sock, 3)
        elapsed = time.monotonic() - started
    assert rest == b""  # closed, with nothing said
    assert 0.25 < elapsed < 2.0


def _whole(reply: bytes) -> bool:
    head, _, body = reply.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return True


def test_a_connection_that_never_sends_a_byte_is_closed_silently(
    proxy: InProcessRouter,
) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as sock:
        started = time.monotonic()
        assert read_all(sock, 3) == b""
        assert time.monotonic() - started < 2.0


def test_a_busy_keep_alive_connection_outlives_the_idle_timeout(
    proxy: InProcessRouter, upstream: Upstream
) -> None:
    """Each request moves the deadlines on: 1.2 s of requests 0.1 s apart, one connection."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as sock:
        for i in range(12):
            sock.sendall(b"GET /n%d HTTP/1.1\r\nHost: blog.test\r\n\r\n" % i)
            reply = b""
            while not reply.endswith(b"}"):
                piece = sock.recv(65536)
                assert piece, f"closed before answer {i}"
                reply += piece
            assert reply.startswith(b"HTTP/1.1 200 ")
            time.sleep(0.1)
    assert len(upstream.recorder.requests) == 12


def test_an_upstream_that_does_not_answer_gives_504_and_the_connection_stays_usable(
    proxy: InProcessRouter, upstream: Upstream, no_errors_logged: None
) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=3) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /wait HTTP/1.1\r\nHost: silent.test\r\n\r\n")
        reply = b""
        while b"again soon.\n" not in reply:
            piece = sock.recv(65536)
            assert piece
            reply += piece
        assert 0.25 < time.monotonic() - started < 2.0
        assert parse_reply(reply).status == 504
        for word in INTERNALS:
            assert word not in reply.lower()
        sock.sendall(b"GET /next HTTP/1.1\r\nHost: blog.test\r\nConnection: close\r\n\r\n")
        assert parse_reply(read_all(sock, 3)).status == 200
    assert upstream.recorder.targets() == ["/next"]


def test_an_upstream_that_refuses_connections_gives_502(
    start_proxy: Any, upstream: Upstream
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    router = start_proxy({"dead.test": serving(dead), "blog.test": serving(upstream.address)})
    raw = exchange(router.port, b"GET / HTTP/1.1\r\nHost: dead.test\r\nConnection: close\r\n\r\n")
    reply = parse_reply(raw)
    assert reply.status == 502
    assert dead.encode() not in raw
    assert_still_serves(router.port, upstream)


def test_timeouts_leave_no_connection_behind(proxy: InProcessRouter) -> None:
    socks = [socket.create_connection(("127.0.0.1", proxy.port), timeout=3) for _ in range(5)]
    try:
        socks[0].sendall(b"GET / HTTP/1.1\r\n")  # a head that never ends
        socks[1].sendall(post(b"Content-Length: 10\r\n", b"ab"))  # a body that stalls
        deadline = time.monotonic() + 3
        while proxy.connections() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.connections() == 0
    finally:
        for sock in socks:
            sock.close()


# -- forwarding headers ------------------------------------------------------------------------

SPOOFED = (
    b"X-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: https\r\n"
    b"X-Forwarded-Host: public.example\r\n"
)


def test_forwarding_headers_from_an_ordinary_client_are_replaced(
    proxy: InProcessRouter, upstream: Upstream
) -> None:
    raw = exchange(
        proxy.port,
        b"GET / HTTP/1.1\r\nHost: blog.test\r\n" + SPOOFED + b"Connection: close\r\n\r\n",
    )
    assert parse_reply(raw).status == 200
    headers = upstream.recorder.requests[0].headers
    assert headers["x-forwarded-for"] == "127.0.0.1"
    assert headers["x-forwarded-proto"] == "http"
    assert headers["x-forwarded-host"] == "blog.test"


def test_forwarding_headers_from_a_trusted_proxy_are_kept_and_appended_to(
    start_proxy: Any, upstream: Upstream
) -> None:
    options = ProxyOptions(trusted_proxies=frozenset({"127.0.0.1"}), drain_timeout_s=0.1)
    router = start_proxy({"blog.test": serving(upstream.address)}, options)
    raw = exchange(
        router.port,
        b"GET / HTTP/1.1\r\nHost: blog.test\r\n" + SPOOFED + b"Connection: close\r\n\r\n",
    )
    assert parse_reply(raw).status == 200
    raw = exchange(router.port, b"GET / HTTP/1.1\r\nHost: blog.test\r\nConnection: close\r\n\r\n")
    assert parse_reply(raw).status == 200
    kept, own = (r.headers for r in upstream.recorder.requests)
    assert kept["x-forwarded-for"] == "203.0.113.7, 127.0.0.1"
    assert kept["x-forwarded-proto"] == "https"
    assert kept["x-forwarded-host"] == "public.example"
    assert (own["x-forwarded-for"], own["x-forwarded-proto"], own["x-forwarded-host"]) == (
        "127.0.0.1",
        "http",
        "blog.test",
    )


# -- the router process, with its defaults ---------------------------------------------------


@pytest.mark.parametrize("name", ["cl-then-te", "te-then-cl", "te-gzip-chunked", "host-twice"])
def test_the_router_process_refuses_smuggling_with_its_defaults(
    router: Any, upstream: Upstream, name: str
) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    assert_refused(exchange(router.port, REFUSED_HEADS[name]), 400)
    assert_nothing_smuggled(upstream, allowed=set())
    assert_still_serves(router.port, upstream)


def test_the_router_process_replaces_spoofed_forwarding_headers(
    router: Any, upstream: Upstream
) -> None:
    router.push(1, {"blog.test": serving(upstream.address)})
    raw = exchange(
        router.port,
        b"GET / HTTP/1.1\r\nHost: blog.test\r\n" + SPOOFED + b"Connection: close\r\n\r\n",
    )
    assert parse_reply(raw).status == 200
    headers = upstream.recorder.requests[0].headers
    assert (headers["x-forwarded-for"], headers["x-forwarded-host"]) == ("127.0.0.1", "blog.test")


# -- byte for byte: an upstream that keeps every byte it was sent ------------------------------

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
SWITCH = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\nConnection: upgrade\r\n\r\n"
FORWARDED = b"X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Host: %s\r\nX-Forwarded-Proto: http\r\n\r\n"


@dataclass
class RawUpstream:
    """Keeps, per connection, exactly the bytes the router sent. Answers each request it
    can frame (Content-Length or a chunked body) with ANSWER; with `switch`, answers an
    Upgrade request with SWITCH and "from the app", then only records (a tunnel)."""

    port: int
    received: list[bytearray]
    lock: threading.Lock

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def connections(self) -> list[bytes]:
        time.sleep(0.05)  # anything the router did forward has arrived by now
        with self.lock:
            return [bytes(c) for c in self.received]


def _serve_raw(conn: socket.socket, received: bytearray, lock: threading.Lock,
               switch: bool) -> None:
    buffer = b""
    tunnel = False
    with conn:
        while data := conn.recv(65536):
            with lock:
                received += data
            if tunnel:
                continue
            buffer += data
            while (end := buffer.find(b"\r\n\r\n")) >= 0:
                head, rest = buffer[: end + 4].lower(), buffer[end + 4 :]
                if switch and b"\r\nupgrade:" in head:
                    conn.sendall(SWITCH + b"from the app")
                    tunnel = True
                    break
                if b"transfer-encoding: chunked" in head:
                    last = rest.find(b"0\r\n\r\n")
                    if last < 0:
                        break
                    size = last + 5
                else:
                    length = b"0"
                    for line in head.split(b"\r\n"):
                        if line.startswith(b"content-length:"):
                            length = line.split(b":")[1].strip()
                    size = int(length)
                    if len(rest) < size:
                        break
                buffer = rest[size:]
                conn.sendall(ANSWER)


@pytest.fixture
def start_raw_upstream() -> Iterator[Any]:
    listeners: list[socket.socket] = []

    def start(switch: bool = False) -> RawUpstream:
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)
        upstream = RawUpstream(listener.getsockname()[1], [], threading.Lock())

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return  # closed at teardown
                received = bytearray()
                with upstream.lock:
                    upstream.received.append(received)
                threading.Thread(target=_serve_raw, daemon=True,
                                 args=(conn, received, upstream.lock, switch)).start()

        threading.Thread(target=accept, daemon=True).start()
        return upstream

    try:
        yield start
    finally:
        for listener in listeners:
            listener.close()


def statuses(raw: bytes) -> list[int]:
    """The status of each response in a transcript (bodies here never say HTTP/1.1)."""
    return [int(part.split(maxsplit=1)[0]) for part in raw.split(b"HTTP/1.1 ")[1:]]


# -- Upgrade: a tunnel only after 101 ---------------------------------------------------------

UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: blog.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: k\r\n\r\n"
)
UPGRADE_SENT = (
    b"GET /ws HTTP/1.1\r\nHost: blog.test\r\nSec-WebSocket-Key: k\r\n"
    b"Upgrade: websocket\r\nConnection: upgrade\r\n" + FORWARDED % b"blog.test"
)
AFTER_UPGRADE = {
    # (what the client pipelines after the Upgrade request, statuses it gets, what each
    # upstream connection of blog.test then received, and other.test's)
    "forged-forwarding": (
        b"GET /second HTTP/1.1\r\nHost: blog.test\r\nX-Forwarded-For: 203.0.113.7\r\n"
        b"Connection: close\r\n\r\n",
        [200, 200],
        [UPGRADE_SENT, b"GET /second HTTP/1.1\r\nHost: blog.test\r\n" + FORWARDED % b"blog.test"],
        [],
    ),
    "another-host": (
        b"GET /second HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n",
        [200, 200],
        [UPGRADE_SENT],
        [b"GET /second HTTP/1.1\r\nHost: other.test\r\n" + FORWARDED % b"other.test"],
    ),
    "unknown-host": (
        b"GET /second HTTP/1.1\r\nHost: nobody.test\r\nConnection: close\r\n\r\n",
        [200, 404],
        [UPGRADE_SENT],
        [],
    ),
    "too-many-headers": (
        b"GET /second HTTP/1.1\r\nHost: blog.test\r\n"
        + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
        [200, 431],
        [UPGRADE_SENT],
        [],
    ),
    "oversized-body": (
        post(b"Content-Length: %d\r\n" % (64 * 1024 + 1), b"x" * 1000),
        [200, 413],
        [UPGRADE_SENT],
        [],
    ),
    "smuggling-framing": (REFUSED_HEADS["cl-then-te"], [200, 400], [UPGRADE_SENT], []),
}


@pytest.mark.parametrize(
    ("after", "expected_statuses", "blog_sees", "other_sees"),
    AFTER_UPGRADE.values(),
    ids=AFTER_UPGRADE.keys(),
)
def test_bytes_after_an_upgrade_answered_200_are_parsed_as_the_next_request(
    start_proxy: Any,
    start_raw_upstream: Any,
    after: bytes,
    expected_statuses: list[int],
    blog_sees: list[bytes],
    other_sees: list[bytes],
    no_errors_logged: None,
) -> None:
    """The app answers the Upgrade request with 200, not 101: what the client pipelined
    behind it meets every rule (forwarding headers, routing by its own Host, limits),
    and each app receives exactly what the router means to send, nothing raw."""
    blog, other = start_raw_upstream(), start_raw_upstream()
    router = start_proxy({"blog.test": serving(blog.address), "other.test": serving(other.address)})
    raw = exchange(router.port, UPGRADE + after)
    assert statuses(raw) == expected_statuses, raw
    assert blog.connections() == blog_sees
    assert other.connections() == other_sees


def test_an_upgrade_pipelined_behind_another_request_waits_its_turn_then_its_answer(
    start_proxy: Any, start_raw_upstream: Any, no_errors_logged: None
) -> None:
    app = start_raw_upstream()
    router = start_proxy({"blog.test": serving(app.address)})
    first = b"GET /first HTTP/1.1\r\nHost: blog.test\r\n\r\n"
    last = (b"GET /last HTTP/1.1\r\nHost: blog.test\r\nX-Forwarded-For: 203.0.113.7\r\n"
            b"Connection: close\r\n\r\n")
    raw = exchange(router.port, first + UPGRADE + last)
    assert statuses(raw) == [200, 200, 200]
    # /first's connection is pooled and carries the Upgrade request next; an upgrading
    # connection is never reused, so /last opens another.
    assert app.connections() == [
        b"GET /first HTTP/1.1\r\nHost: blog.test\r\n" + FORWARDED % b"blog.test" + UPGRADE_SENT,
        b"GET /last HTTP/1.1\r\nHost: blog.test\r\n" + FORWARDED % b"blog.test",
    ]


@pytest.mark.parametrize("host", [b"nobody.test", b"blog.test"])
def test_an_upgrade_the_router_answers_itself_leaves_what_follows_to_the_parser(
    start_proxy: Any, start_raw_upstream: Any, host: bytes, no_errors_logged: None
) -> None:
    """A 404 (no such site) or the health page is written before the parser hands over
    the bytes after the head: they are still parsed, in order, as the next request."""
    app = start_raw_upstream()
    router = start_proxy({"blog.test": serving(app.address)})
    target = b"/ws" if host == b"nobody.test" else b"/_keelway/health"
    upgrade = UPGRADE.replace(b"Host: blog.test", b"Host: " + host).replace(b"/ws", target)
    raw = exchange(router.port, upgrade + b"GET /next HTTP/1.1\r\nHost: blog.test\r\n"
                   b"Connection: close\r\n\r\n")
    assert statuses(raw) == [404 if host == b"nobody.test" else 200, 200]
    assert app.connections() == [
        b"GET /next HTTP/1.1\r\nHost: blog.test\r\n" + FORWARDED % b"blog.test"
    ]


def test_bytes_sent_before_the_101_go_through_the_tunnel_after_it_both_ways(
    start_proxy: Any, start_raw_upstream: Any, no_errors_logged: None
) -> None:
    app = start_raw_upstream(switch=True)
    router = start_proxy({"blog.test": serving(app.address)})
    with socket.create_connection(("127.0.0.1", router.port), timeout=3) as sock:
        sock.sendall(UPGRADE + b"early, not HTTP")
        got = b""
        while not got.endswith(b"from the app"):
            piece = sock.recv(65536)
            assert piece, got
            got += piece
        assert got == SWITCH + b"from the app"
        sock.sendall(b"GET /not-parsed HTTP/1.1\r\n\r\n")
        time.sleep(0.1)
    tunnelled = b"early, not HTTP" + b"GET /not-parsed HTTP/1.1\r\n\r\n"
    assert app.connections() == [UPGRADE_SENT + tunnelled]


def test_an_upgrade_request_waits_for_its_answer_before_anything_after_it_is_read(
    start_proxy: Any, upstream: Upstream, silent_upstream: str, no_errors_logged: None
) -> None:
    """While the app has not answered, nothing the client sent after the Upgrade request
    reaches any upstream; when the app never answers, the client gets 504 and then its
    pipelined request is served."""
    router = start_proxy({"silent.test": serving(silent_upstream),
                          "blog.test": serving(upstream.address)})
    upgrade = UPGRADE.replace(b"Host: blog.test", b"Host: silent.test")
    raw = exchange(router.port, upgrade + b"GET /next HTTP/1.1\r\nHost: blog.test\r\n"
                   b"Connection: close\r\n\r\n")
    assert statuses(raw) == [504, 200]
    assert upstream.recorder.targets() == ["/next"]


def test_an_upgrade_request_with_a_body_is_refused_with_400(
    start_proxy: Any, start_raw_upstream: Any, no_errors_logged: None
) -> None:
    """httptools skips the body of a request that asks to upgrade, so it cannot be framed."""
    app = start_raw_upstream()
    router = start_proxy({"blog.test": serving(app.address)})
    for framing, body in [
        (b"Content-Length: %d\r\n" % len(SMUGGLED), SMUGGLED),
        (b"Transfer-Encoding: chunked\r\n", chunk(SMUGGLED) + b"0\r\n\r\n"),
    ]:
        head = UPGRADE.replace(b"GET /ws", b"POST /ws").replace(b"\r\n\r\n", b"\r\n" + framing
                                                                + b"\r\n")
        assert_refused(exchange(router.port, head + body), 400)
    assert app.connections() == []


# -- trailers: bounded like a head, never kept, never forwarded --------------------------------

CHUNKED_SENT = (
    b"POST /upload HTTP/1.1\r\nHost: blog.test\r\nTransfer-Encoding: chunked\r\n"
    + FORWARDED % b"blog.test"
    + b"5\r\nhello\r\n0\r\n\r\n"
)


def test_trailers_within_the_limits_are_dropped_and_the_body_forwarded_exactly(
    start_proxy: Any, start_raw_upstream: Any
) -> None:
    app = start_raw_upstream()
    router = start_proxy({"blog.test": serving(app.address)})
    trailers = b"X-Checksum: 1\r\nHost: other.test\r\n" + b"".join(
        b"X-T%d: %s\r\n" % (i, b"v" * 40) for i in range(100)
    )
    raw = exchange(router.port, post(b"Transfer-Encoding: chunked\r\n", chunk(b"hello")
                                     + b"0\r\n" + trailers + b"\r\n"
                                     + b"GET /x HTTP/1.1\r\nHost: blog.test\r\n"
                                     b"Connection: close\r\n\r\n"))
    assert statuses(raw) == [200, 200]
    assert app.connections() == [
        CHUNKED_SENT + b"GET /x HTTP/1.1\r\nHost: blog.test\r\n" + FORWARDED % b"blog.test"
    ]


TRAILER_FLOODS = {
    "too-many-fields": b"".join(b"X-T%d: 1\r\n" % i for i in range(200)) + b"\r\n",
    "too-many-bytes": b"".join(b"X-T%d: %s\r\n" % (i, b"v" * 1000) for i in range(20)) + b"\r\n",
    "one-endless-field": b"X-Long: " + b"v" * (200 * 1024),
}


@pytest.mark.parametrize("trailers", TRAILER_FLOODS.values(), ids=TRAILER_FLOODS.keys())
@pytest.mark.parametrize("reads", ["one-read", "many-reads"])
def test_a_trailer_section_over_the_head_limits_is_refused_with_431(
    start_proxy: Any, start_raw_upstream: Any, trailers: bytes, reads: str,
    no_errors_logged: None,
) -> None:
    app = start_raw_upstream()
    router = start_proxy({"blog.test": serving(app.address)})
    with socket.create_connection(("127.0.0.1", router.port), timeout=3) as sock:
        sock.sendall(post(b"Transfer-Encoding: chunked\r\n", chunk(b"hello") + b"0\r\n"))
        step = len(trailers) if reads == "one-read" else 1000
        try:
            for at in range(0, len(trailers), step):
                sock.sendall(trailers[at : at + step])
                if reads == "many-reads":
                    time.sleep(0.001)
        except OSError:
            pass  # the router may have refused and closed already
        assert_refused(read_all(sock, 3), 431)
    # The head and the body went ahead (bodies stream); the refusal cut that connection.
    (received,) = app.connections()
    assert CHUNKED_SENT.startswith(received)
    assert_still_serves_raw(router.port)


def assert_still_serves_raw(port: int) -> None:
    raw = exchange(port, b"GET /after HTTP/1.1\r\nHost: blog.test\r\nConnection: close\r\n\r\n")
    assert statuses(raw) == [200]


def test_a_read_that_ends_one_chunked_body_and_begins_another_is_not_counted_as_trailers(
    start_proxy: Any, start_raw_upstream: Any, no_errors_logged: None
) -> None:
    """Both empty bodies leave the body budget where it was, and the read is larger than
    the head limit: only the chunk count tells it began a new chunk, not a trailer."""
    app = start_raw_upstream()
    router = start_proxy({"blog.test": serving(app.address)})
    big = b"X-Big: " + b"b" * 6000 + b"\r\n"
    reads = [
        post(b"Transfer-Encoding: chunked\r\n", b"0\r\n"),
        b"X-T: " + b"t" * 3000 + b"\r\n\r\n" + post(b"Transfer-Encoding: chunked\r\n" + big,
                                                  b"0\r\n"),
        b"\r\nGET /x HTTP/1.1\r\nHost: blog.test\r\nConnection: close\r\n\r\n",
    ]
    with socket.create_connection(("127.0.0.1", router.port), timeout=3) as sock:
        for data in reads:
            sock.sendall(data)
            time.sleep(0.05)
        raw = read_all(sock, 3)
    assert statuses(raw) == [200, 200, 200]


@pytest.mark.slow
def test_a_50_mb_trailer_flood_is_refused_and_the_router_does_not_grow(
    router: Any, start_raw_upstream: Any
) -> None:
    """The issue's reproduction: ~210 MB of trailer lines grew a worker from 29 to 254 MB
    for good. Now the section is refused at the head limit and nothing of it is kept."""
    app = start_raw_upstream()
    router.push(1, {"blog.test": serving(app.address)})
    assert_still_serves_raw(router.port)
    rss_before = router.rss_bytes()
    line = b"X-Trailer: " + b"t" * 50 + b"\r\n"
    block = line * (1024 * 1024 // len(line))
    sent = 0
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
        sock.sendall(post(b"Transfer-Encoding: chunked\r\n", chunk(b"hello") + b"0\r\n"))
        try:
            while sent < 50 * 1024 * 1024:
                sock.sendall(block)
                sent += len(block)
        except OSError:
            pass  # refused, lingered on, then closed
        raw = read_all(sock, 5)
    assert statuses(raw) == [431]
    assert_still_serves_raw(router.port)
    growth = router.rss_bytes() - rss_before
    print(f"trailer flood: sent {sent / 2**20:.0f} MiB; router RSS {rss_before / 2**20:.1f} MiB "
          f"before, {growth / 2**20:+.1f} MiB after")
    assert growth < 4 * 1024 * 1024


# -- request targets --------------------------------------------------------------------------


@pytest.mark.parametrize("method", [b"GET", b"POST", b"HEAD", b"DELETE"])
def test_an_asterisk_target_on_a_method_other_than_options_is_refused_with_400(
    proxy: InProcessRouter, upstream: Upstream, method: bytes, no_errors_logged: None
) -> None:
    raw = exchange(proxy.port, method + b" * HTTP/1.1\r\nHost: blog.test\r\n"
                   b"Content-Length: 0\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 400 ")
    assert upstream.recorder.targets() == []
    assert_still_serves(proxy.port, upstream)


def test_options_asterisk_is_forwarded_as_it_came(
    start_proxy: Any, start_raw_upstream: Any
) -> None:
    app = start_raw_upstream()
    router = start_proxy({"blog.test": serving(app.address)})
    raw = exchange(
        router.port, b"OPTIONS * HTTP/1.1\r\nHost: blog.test\r\nConnection: close\r\n\r\n"
    )
    assert statuses(raw) == [200]
    assert app.connections() == [b"OPTIONS * HTTP/1.1\r\nHost: blog.test\r\n"
                                 + FORWARDED % b"blog.test"]


def test_an_apps_response_trailers_never_reach_the_next_response_on_its_connection(
    start_proxy: Any,
) -> None:
    """Trailers come after the head was rewritten: they must be dropped, not collected
    into the head of the next response on that (pooled, shared) upstream connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nfirst\r\n0\r\nSet-Cookie: session=first-client\r\nX-Cache: stale\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond",
    ]

    def app() -> None:
        conn, _ = listener.accept()
        with conn:
            for answer in answers:
                buffer = b""
                while b"\r\n\r\n" not in buffer:
                    buffer += conn.recv(65536)
                conn.sendall(answer)
            conn.recv(65536)

    thread = threading.Thread(target=app, daemon=True)
    thread.start()
    try:
        router = start_proxy({"blog.test": serving(f"127.0.0.1:{listener.getsockname()[1]}")})
        get = b"GET / HTTP/1.1\r\nHost: blog.test\r\nConnection: close\r\n\r\n"
        first, second = exchange(router.port, get), exchange(router.port, get)
    finally:
        listener.close()
    assert first == (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                     b"5\r\nfirst\r\n0\r\n\r\n")
    assert second == b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsecond"
