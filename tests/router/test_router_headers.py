"""Head rewriting as transcripts: what the parser hands over, what crosses the proxy."""

from __future__ import annotations

import contextlib

import httptools
import pytest

from keelway.router.headers import (
    CHUNKED,
    LENGTH,
    NONE,
    UNTIL_CLOSE,
    BadRequest,
    Framing,
    RequestHeadRewriter,
    ResponseHeadRewriter,
)

# The rewriters are used as they are, not subclassed: compiled (mypyc), they cannot be
# subclassed by interpreted classes, and they need no more than a begin_* call.


def rewrite_request(raw: bytes, client_ip: bytes = b"10.0.0.9") -> tuple[bytes, bytes, Framing]:
    head = RequestHeadRewriter()
    head.begin_request_head()
    parser = httptools.HttpRequestParser(head)
    with contextlib.suppress(httptools.HttpParserUpgrade):
        parser.feed_data(raw)
    rewritten, host, framing, _ = head.finish_request_head(
        parser.get_method(), client_ip, parser.should_upgrade()
    )
    return rewritten, host, framing


def rewrite_response(
    raw: bytes, head_request: bool = False, chunked_ok: bool = True, close: bool = False
) -> tuple[bytes, Framing, bool, bool]:
    head = ResponseHeadRewriter()
    head.begin_response_head()
    parser = httptools.HttpResponseParser(head)
    with contextlib.suppress(httptools.HttpParserUpgrade):
        parser.feed_data(raw)
    return head.finish_response_head(parser.get_status_code(), head_request, chunked_ok, close)


def test_request_loses_hop_by_hop_headers_and_gains_forwarding_headers() -> None:
    out, host, framing = rewrite_request(
        b"GET /a?b=1 HTTP/1.1\r\nHost: Blog.test:8080\r\nConnection: keep-alive, X-Drop\r\n"
        b"X-Drop: 1\r\nKeep-Alive: 300\r\nTE: trailers\r\nTrailer: X\r\nProxy: evil\r\n"
        b"Proxy-Authorization: secret\r\nUpgrade: h2c\r\nX-Forwarded-Proto: https\r\n"
        b"X-Forwarded-Host: spoof\r\nX-Forwarded-For: 1.2.3.4\r\nAccept: */*\r\n\r\n"
    )
    assert host == b"Blog.test:8080"
    assert framing is NONE
    assert out == (
        b"GET /a?b=1 HTTP/1.1\r\nHost: Blog.test:8080\r\nAccept: */*\r\n"
        # An untrusted client's X-Forwarded-For is replaced, never appended to (#4).
        b"X-Forwarded-For: 10.0.0.9\r\nX-Forwarded-Host: Blog.test:8080\r\n"
        b"X-Forwarded-Proto: http\r\n\r\n"
    )


def test_connection_cannot_nominate_the_headers_the_proxy_relies_on() -> None:
    out, _, framing = rewrite_request(
        b"POST / HTTP/1.1\r\nHost: a.test\r\nConnection: Content-Length, Host\r\n"
        b"Content-Length: 3\r\n\r\nabc"
    )
    assert framing is LENGTH
    assert b"Content-Length: 3\r\n" in out
    assert b"Host: a.test\r\n" in out


def test_a_chunked_request_is_forwarded_chunked_and_http10_becomes_http11() -> None:
    out, _, framing = rewrite_request(
        b"POST /up HTTP/1.0\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    assert framing is CHUNKED
    assert out.startswith(b"POST /up HTTP/1.1\r\n")
    assert b"Transfer-Encoding: chunked\r\n" in out


def test_a_websocket_upgrade_keeps_upgrade_and_connection_upgrade() -> None:
    out, _, _ = rewrite_request(
        b"GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Key: k\r\n\r\n"
    )
    assert b"Upgrade: websocket\r\nConnection: upgrade\r\n" in out
    assert b"Sec-WebSocket-Key: k\r\n" in out


@pytest.mark.parametrize(
    "raw",
    [
        b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
    ],
)
def test_a_missing_or_repeated_host_is_a_bad_request(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        rewrite_request(raw)


def test_response_loses_hop_by_hop_headers_and_keeps_the_rest() -> None:
    out, framing, until_close, close = rewrite_response(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\n"
        b"Keep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\nX-Kept: yes\r\n"
        b"Content-Length: 2\r\n\r\nok"
    )
    assert out == b"HTTP/1.1 200 OK\r\nX-Kept: yes\r\nContent-Length: 2\r\n\r\n"
    assert (framing, until_close, close) == (LENGTH, False, False)


def test_a_close_delimited_response_is_chunked_to_an_http11_client() -> None:
    out, framing, until_close, close = rewrite_response(b"HTTP/1.0 200 OK\r\nX-A: 1\r\n\r\n")
    assert out == b"HTTP/1.1 200 OK\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert (framing, until_close, close) == (CHUNKED, True, False)


def test_a_chunked_response_to_an_http10_client_is_close_delimited() -> None:
    out, framing, until_close, close = rewrite_response(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", chunked_ok=False
    )
    assert out == b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
    assert (framing, until_close, close) == (UNTIL_CLOSE, False, True)


@pytest.mark.parametrize(
    ("raw", "head_request"),
    [
        (b"HTTP/1.1 204 No Content\r\n\r\n", False),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", True),
    ],
)
def test_responses_without_a_body_are_not_reframed(raw: bytes, head_request: bool) -> None:
    out, framing, _, _ = rewrite_response(raw, head_request=head_request)
    assert framing is NONE
    assert b"Transfer-Encoding" not in out
    assert out.endswith(b"\r\n\r\n")
