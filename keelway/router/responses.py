"""The responses the router writes itself, rendered to bytes once.

Invariant: no body or header here names the software, its language, a path or an
upstream address — a visitor learns the status and a sentence, nothing about internals.
Refusals of a malformed or over-limit request (400, 408, 413, 431) always carry
`Connection: close`: the connection's framing can no longer be trusted.

A route that does not serve answers the page of its state (`refusal`), which says what
is true: "busy for a moment" only while requests are held for a wake or a hold-mode
swap; "restarting" (Retry-After: until the crash backoff's retry) for a crashed web;
"stopped", "not deployed yet" and "down for maintenance" (an import or a fence) for the
rest. Only a page whose wait is known carries Retry-After. A serving instance that has
as many requests in flight as its bound allows answers the rest `AT_LIMIT` (Retry-After
1: its slots free as its requests finish), the one page that is about load.
"""

from __future__ import annotations

import functools
from typing import Final, assert_never

from keelway.router.headers import status_line
from keelway.router.route_table import Handling


class Canned:
    """One local response in the four byte forms a request can need: keep the client
    connection or close it, with a body or (answering HEAD) without."""

    __slots__ = ("close", "close_head", "keep_alive", "keep_alive_head", "status")

    def __init__(self, status: int, text: str, extra_headers: bytes = b"") -> None:
        self.status: Final = status
        body = text.encode()
        head = (
            status_line(status)
            + b"Content-Type: text/plain; charset=utf-8\r\n"
            + b"Content-Length: %d\r\n" % len(body)
            + b"Cache-Control: no-store\r\n"
            + extra_headers
        )
        closing = head + b"Connection: close\r\n\r\n"
        self.keep_alive: Final = head + b"\r\n" + body
        self.keep_alive_head: Final = head + b"\r\n"
        self.close: Final = closing + body
        self.close_head: Final = closing

    def pick(self, head_request: bool, close: bool) -> bytes:
        if close:
            return self.close_head if head_request else self.close
        return self.keep_alive_head if head_request else self.keep_alive


HEALTH_PATH: Final = b"/_keelway/health"

HEALTHY: Final = Canned(200, "ok\n")
# Where ACME's HTTP-01 challenges are asked (RFC 8555 §8.3), on plain HTTP only.
ACME_CHALLENGE: Final = b"/.well-known/acme-challenge/"
NOT_FOUND: Final = Canned(404, "404 Not Found\n\nNo site is served at this address.\n")
BAD_REQUEST: Final = Canned(400, "400 Bad Request\n")
HEADERS_TOO_LARGE: Final = Canned(431, "431 Request Header Fields Too Large\n")
REQUEST_TIMEOUT: Final = Canned(408, "408 Request Timeout\n")
BODY_TOO_LARGE: Final = Canned(413, "413 Request Entity Too Large\n")
BAD_GATEWAY: Final = Canned(502, "502 Bad Gateway\n\nThe site did not answer. Try again soon.\n")
GATEWAY_TIMEOUT: Final = Canned(
    504, "504 Gateway Timeout\n\nThe site did not answer in time. Try again soon.\n"
)


_BUSY: Final = "503 Service Unavailable\n\nThe site is busy for a moment. Try again soon.\n"
_MAINTENANCE: Final = ("503 Service Unavailable\n\nThe site is down for maintenance. "
                       "Try again soon.\n")
_RESTARTING: Final = ("503 Service Unavailable\n\nThe site is restarting. "
                      "Try again in a moment.\n")
STOPPED: Final = Canned(503, "503 Service Unavailable\n\nThe site is stopped.\n")
NOT_DEPLOYED: Final = Canned(503, "503 Service Unavailable\n\nThe site is not deployed "
                                  "yet.\n")


@functools.lru_cache(maxsize=64)
def to_https(location: bytes) -> Canned:
    """A permanent redirect to the same request over HTTPS (308 keeps the method)."""
    return Canned(308, "308 Permanent Redirect\n\nThis site is served over HTTPS.\n",
                  b"Location: " + location + b"\r\n")


def challenge(key_authorization: str) -> Canned:
    return Canned(200, key_authorization)


def _with_retry(text: str, retry_after_s: int) -> Canned:
    return Canned(503, text, b"Retry-After: %d\r\n" % retry_after_s)


def unavailable(retry_after_s: int) -> Canned:
    """503 "busy for a moment" with Retry-After, cached per distinct delay (tables use
    a handful): what a held request gets when it can wait no longer."""
    return _with_retry(_BUSY, retry_after_s)


def refusal(state: Handling, retry_after_s: int) -> Canned:
    """The page a request gets from a route in `state` that does not serve it now."""
    match state:
        case Handling.STOPPED:
            return STOPPED
        case Handling.NO_RELEASE:
            return NOT_DEPLOYED
        case Handling.CRASHED:
            return _with_retry(_RESTARTING, retry_after_s)
        case Handling.GATED:
            return _with_retry(_MAINTENANCE, retry_after_s)
        case (Handling.HOLDING | Handling.PARKED | Handling.SERVING
              | Handling.DRAINING):
            # A proxied state's only refusal is a request that could not be held.
            return _with_retry(_BUSY, retry_after_s)
        case _:
            assert_never(state)


# Out of file descriptors: connections come and go by the second, so try again soon.
NO_DESCRIPTORS: Final = unavailable(1)

# An instance at its bound of requests in flight (keelway/router/concurrency.py).
AT_LIMIT: Final = Canned(
    503, "503 Service Unavailable\n\nThe site is at its limit of concurrent requests. "
         "Try again in a moment.\n", b"Retry-After: 1\r\n")
