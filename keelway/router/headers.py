"""Rewriting the head of one proxied exchange, request side and response side. No I/O.

Owns which headers cross the proxy and how bodies are framed on each side. Rules:

- hop-by-hop headers never cross: Connection, Keep-Alive, Proxy-* (and `Proxy`, the
  httpoxy vector), TE, Trailer, Transfer-Encoding, Upgrade (unless this exchange upgrades),
  and any header the Connection header names — except the ones the proxy itself relies on
  (Host, Content-Length, X-Forwarded-*), so a client cannot strip framing by naming it;
- framing is re-derived, not copied: Content-Length passes through unchanged, a chunked
  body is re-chunked, a close-delimited response is chunked to an HTTP/1.1 client;
- X-Forwarded-For appends the client address to what the client sent; X-Forwarded-Proto
  and X-Forwarded-Host are the proxy's own, whatever the client sent.

Shape, chosen for the hot path: the rewriters are mixins whose `on_header` *is* the
httptools callback, so each field is classified once, as it is parsed, with no list of
pairs and no second loop. Kept fields collect as 4-item groups (name, ": ", value, CRLF)
in one flat list joined once; the rare Connection-token filter drops whole groups after
the fact. Raising inside an httptools callback would kill the parser, so a malformed
head is recorded and reported by the `finish_*` method instead.
"""

from __future__ import annotations

import enum
from http import HTTPStatus
from typing import Final


class Framing(enum.Enum):
    """How a message body is delimited on one side of the proxy."""

    NONE = "none"
    LENGTH = "length"
    CHUNKED = "chunked"
    UNTIL_CLOSE = "until-close"


# Naming an Enum member costs a lookup through its metaclass (~170 ns on CPython 3.11);
# the per-header code below would pay it several times per field, so it uses these
# module-level aliases and plain-int field kinds instead.
NONE: Final = Framing.NONE
LENGTH: Final = Framing.LENGTH
CHUNKED: Final = Framing.CHUNKED
UNTIL_CLOSE: Final = Framing.UNTIL_CLOSE

_DROP: Final = 0
_HOST: Final = 1
_LENGTH: Final = 2
_CHUNKED: Final = 3
_FORWARDED_FOR: Final = 4
_CONNECTION: Final = 5
_UPGRADE: Final = 6

_COMMON: Final = {
    b"connection": _CONNECTION,
    b"keep-alive": _DROP,
    b"te": _DROP,
    b"trailer": _DROP,
    b"transfer-encoding": _CHUNKED,
    b"upgrade": _UPGRADE,
    b"content-length": _LENGTH,
}
_REQUEST_KINDS: Final = {
    **_COMMON,
    b"host": _HOST,
    b"x-forwarded-for": _FORWARDED_FOR,
    b"x-forwarded-proto": _DROP,
    b"x-forwarded-host": _DROP,
}
_RESPONSE_KINDS: Final = _COMMON
# Connection tokens that are not header names, or name headers handled above.
_NOT_NOMINATABLE: Final = frozenset({b"close", *_REQUEST_KINDS})
_PLAIN_CONNECTION: Final = frozenset({b"keep-alive", b"close", b"upgrade"})

_SEP: Final = b": "
_CRLF: Final = b"\r\n"
_HTTP11: Final = b" HTTP/1.1\r\n"
_PROTO_HTTP: Final = b"X-Forwarded-Proto: http\r\n"
_UPGRADE_CONNECTION: Final = b"Connection: upgrade\r\n"


class BadRequest(Exception):
    """The request head is malformed in a way the parser does not catch (client's fault)."""


def _nominated(connection_value: bytes) -> frozenset[bytes]:
    """Header names a Connection value lists for removal (usually none)."""
    lowered = connection_value.lower()
    if lowered in _PLAIN_CONNECTION:
        return frozenset()
    tokens = {t.strip() for t in lowered.split(b",")}
    return frozenset(tokens - _NOT_NOMINATABLE)


def _drop_nominated(parts: list[bytes], start: int, names: frozenset[bytes]) -> list[bytes]:
    """Remove the 4-item groups from `start` on whose header name is in `names`."""
    kept = parts[:start]
    for i in range(start, len(parts), 4):
        if parts[i].lower() not in names:
            kept += parts[i : i + 4]
    return kept


class RequestHeadRewriter:
    """Mixin for an httptools request-parser protocol: rewrites the client's head for
    the upstream while it is parsed. Call `begin_request_head` at message begin."""

    __slots__ = (
        "_rq_connection",
        "_rq_error",
        "_rq_fields",
        "_rq_forwarded_for",
        "_rq_framing",
        "_rq_host",
        "_rq_parts",
        "_rq_upgrade_to",
        "_rq_url",
        "head_bytes",
    )

    def begin_request_head(self) -> None:
        self._rq_parts: list[bytes] = [b"", b" ", b"", _HTTP11]  # method, target: at finish
        self._rq_url = b""
        self._rq_host: bytes | None = None
        self._rq_forwarded_for: bytes | None = None
        self._rq_connection: bytes | None = None
        self._rq_upgrade_to: bytes | None = None
        self._rq_framing = NONE
        self._rq_error = False
        self._rq_fields = 0
        self.head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._rq_url += url
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._rq_fields += 1
        self.head_bytes += len(name) + len(value) + 4
        lname = name.lower()
        kind = _REQUEST_KINDS.get(lname)
        if kind is None:
            if lname[:5] != b"proxy":
                self._rq_parts += (name, _SEP, value, _CRLF)
        elif kind == _HOST:
            if self._rq_host is not None:
                self._rq_error = True  # two Host headers: which one routes?
            self._rq_host = value
            self._rq_parts += (b"Host", _SEP, value, _CRLF)
        elif kind == _LENGTH:
            if self._rq_framing is not NONE:
                self._rq_error = True
            self._rq_framing = LENGTH
            self._rq_parts += (b"Content-Length", _SEP, value, _CRLF)
        elif kind == _CHUNKED:
            if self._rq_framing is LENGTH:
                self._rq_error = True
            self._rq_framing = CHUNKED
        elif kind == _FORWARDED_FOR:
            seen = self._rq_forwarded_for
            self._rq_forwarded_for = value if seen is None else seen + b", " + value
        elif kind == _CONNECTION:
            seen = self._rq_connection
            self._rq_connection = value if seen is None else seen + b"," + value
        elif kind == _UPGRADE:
            self._rq_upgrade_to = value

    @property
    def request_url(self) -> bytes:
        return self._rq_url

    @property
    def request_fields(self) -> int:
        return self._rq_fields

    def finish_request_head(
        self, method: bytes, client_ip: bytes, upgrade: bool
    ) -> tuple[bytes, bytes, Framing, bool]:
        """The HTTP/1.1 request head to send upstream, the client's Host value, the
        request body's framing (NONE, LENGTH or CHUNKED; the upstream side uses the
        same), and whether the request had a Connection header.

        `upgrade` says the parser saw a valid Upgrade request; only then do Upgrade and
        `Connection: upgrade` cross. Raises BadRequest for a missing or repeated Host,
        or for conflicting framing headers.
        """
        host = self._rq_host
        if host is None or self._rq_error:
            raise BadRequest("missing or repeated Host, or conflicting body framing")
        parts = self._rq_parts
        parts[0] = method
        parts[2] = self._rq_url
        connection = self._rq_connection
        if connection is not None:
            nominated = _nominated(connection)
            if nominated:
                parts = _drop_nominated(parts, 4, nominated)
        if upgrade and self._rq_upgrade_to is not None:
            parts += (b"Upgrade", _SEP, self._rq_upgrade_to, _CRLF, _UPGRADE_CONNECTION)
        framing = self._rq_framing
        if framing is CHUNKED:
            parts.append(b"Transfer-Encoding: chunked\r\n")
        forwarded_for = self._rq_forwarded_for
        if forwarded_for is not None:
            client_ip = forwarded_for + b", " + client_ip
        parts += (b"X-Forwarded-For: ", client_ip, b"\r\nX-Forwarded-Host: ", host, _CRLF)
        parts += (_PROTO_HTTP, _CRLF)
        return b"".join(parts), host, framing, connection is not None


STATUS_LINES: Final = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus
}


def status_line(status: int) -> bytes:
    line = STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


class ResponseHeadRewriter:
    """Mixin for an httptools response-parser protocol: rewrites the upstream's head
    for the client while it is parsed. Call `begin_response_head` before each head."""

    __slots__ = ("_rs_connection", "_rs_framing", "_rs_parts", "_rs_upgrade_to")

    def begin_response_head(self) -> None:
        self._rs_parts: list[bytes] = [b""]  # the status line, at finish
        self._rs_connection: bytes | None = None
        self._rs_upgrade_to: bytes | None = None
        self._rs_framing = UNTIL_CLOSE

    def on_header(self, name: bytes, value: bytes) -> None:
        lname = name.lower()
        kind = _RESPONSE_KINDS.get(lname)
        if kind is None:
            if lname[:5] != b"proxy":
                self._rs_parts += (name, _SEP, value, _CRLF)
        elif kind == _LENGTH:
            self._rs_framing = LENGTH
            self._rs_parts += (b"Content-Length", _SEP, value, _CRLF)
        elif kind == _CONNECTION:
            seen = self._rs_connection
            self._rs_connection = value if seen is None else seen + b"," + value
        elif kind == _UPGRADE:
            self._rs_upgrade_to = value
        elif kind == _CHUNKED:
            self._rs_framing = CHUNKED

    def finish_response_head(
        self, status: int, head_request: bool, client_chunked_ok: bool, client_close: bool
    ) -> tuple[bytes, Framing, bool, bool]:
        """The response head to send the client, how the client-side body is framed,
        whether the upstream delimits the body by closing, and whether the client
        connection must close after this response.

        LENGTH passes through; CHUNKED and UNTIL_CLOSE become CHUNKED when
        `client_chunked_ok` (HTTP/1.1), else UNTIL_CLOSE and the client connection
        closes. Responses that cannot have a body (1xx, 204, 304, answers to HEAD) get
        NONE and keep their Content-Length as sent.
        """
        parts = self._rs_parts
        parts[0] = status_line(status)
        connection = self._rs_connection
        if connection is not None:
            nominated = _nominated(connection)
            if nominated:
                parts = _drop_nominated(parts, 1, nominated)
        framing = self._rs_framing
        until_close = False
        if status < 200 or status == 204 or status == 304 or head_request:
            framing = NONE
            if status == 101 and self._rs_upgrade_to is not None:
                parts += (b"Upgrade", _SEP, self._rs_upgrade_to, _CRLF, _UPGRADE_CONNECTION)
        elif framing is not LENGTH:
            until_close = framing is UNTIL_CLOSE
            if client_chunked_ok:
                framing = CHUNKED
                parts.append(b"Transfer-Encoding: chunked\r\n")
            else:
                framing = UNTIL_CLOSE
                client_close = True
        if client_close and status >= 200:
            parts.append(b"Connection: close\r\n")
        parts.append(_CRLF)
        return b"".join(parts), framing, until_close, client_close
