"""Rewriting the head of one proxied exchange, request side and response side. No I/O.

Owns which headers cross the proxy and how bodies are framed on each side. Rules:

- hop-by-hop headers never cross: Connection, Keep-Alive, Proxy-* (and `Proxy`, the
  httpoxy vector), TE, Trailer, Transfer-Encoding, Upgrade (unless this exchange upgrades),
  and any header the Connection header names — except the ones the proxy itself relies on
  (Host, Content-Length, X-Forwarded-*), so a client cannot strip framing by naming it;
- framing is re-derived, not copied: Content-Length passes through unchanged, a chunked
  body is re-chunked, a close-delimited response is chunked to an HTTP/1.1 client;
- X-Forwarded-For/-Proto/-Host cannot be spoofed: from an ordinary client they are
  discarded and the proxy's own are set (client address, "http", the Host). Only a
  trusted front proxy's are kept, X-Forwarded-For with the client address appended;
- a head that could frame differently in another parser is refused, never normalised:
  Content-Length must be plain digits and appear once; Transfer-Encoding must be exactly
  `chunked` (any letter case), appear once, and never with Content-Length; Host must
  appear once and be a hostname or IP literal with an optional port; a request target
  is origin-form (`/...`), `*` (OPTIONS only, as nginx has it), or absolute-form whose
  authority equals Host (then sent upstream as origin-form), so the router and the app
  always agree on the host;
- a trailer field (parsed after the head, at the end of a chunked body) never crosses
  and is never kept, on either side. A request's is only counted, from `begin_trailers`
  on, in the same `request_fields` and `head_bytes` the head was counted in, so the
  caller bounds the trailer section with the head's limits and its memory is freed
  field by field. A response's is dropped between `begin_trailers` and `end_trailers`:
  its head is finished (and the next one begun) before its body, so a kept trailer
  would land in the next response on that connection, which may be another client's.

Shape, chosen for the hot path: the rewriters are mixins whose `on_header` *is* the
httptools callback, so each field is classified once, as it is parsed, with no list of
pairs and no second loop. Kept fields collect as 4-item groups (name, ": ", value, CRLF)
in one flat list joined once; the rare Connection-token filter drops whole groups after
the fact. Raising inside an httptools callback would kill the parser, so a malformed
head is recorded and reported by the `finish_*` method instead.
"""

from __future__ import annotations

import enum
import re
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
_FORWARDED_PROTO: Final = 7
_FORWARDED_HOST: Final = 8

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
    b"x-forwarded-proto": _FORWARDED_PROTO,
    b"x-forwarded-host": _FORWARDED_HOST,
}
_RESPONSE_KINDS: Final = _COMMON
_KEEP: Final = 9  # any other field: it crosses as it came
_NO_RARE: Final[dict[int, bytes]] = {}
# Field names as clients and apps spell them, with their kind: the same few dozen names
# come in every message, so classifying a field costs one lookup, not a lower() and a
# prefix test. Bounded like _VALID_HOSTS; past the bound a name is classified each time.
_REQUEST_NAMES: Final[dict[bytes, int]] = {}
_RESPONSE_NAMES: Final[dict[bytes, int]] = {}
_NAMES_MAX: Final = 4096
# Connection tokens that are not header names, or name headers handled above.
_NOT_NOMINATABLE: Final = frozenset({b"close", *_REQUEST_KINDS})
_PLAIN_CONNECTION: Final = frozenset({b"keep-alive", b"close", b"upgrade"})
# The same values in the spellings apps use, so the usual Connection header needs no lower().
_PLAIN_CONNECTION_AS_SENT: Final = frozenset(
    {*_PLAIN_CONNECTION, b"Keep-Alive", b"Close", b"Upgrade"}
)

_SEP: Final = b": "
_CRLF: Final = b"\r\n"
_HTTP11: Final = b" HTTP/1.1\r\n"
_XFF: Final = b"X-Forwarded-For: "
_XFH: Final = b"\r\nX-Forwarded-Host: "
_END_PROTO_HTTP: Final = b"\r\nX-Forwarded-Proto: http\r\n\r\n"
_END_PROTO_HTTPS: Final = b"\r\nX-Forwarded-Proto: https\r\n\r\n"
_UPGRADE_CONNECTION: Final = b"Connection: upgrade\r\n"

# Host: a reg-name of unreserved characters or a bracketed IPv6 literal, and an optional
# port. Narrower than RFC 3986 allows (no percent-encoding, no sub-delims): no hostname
# that DNS can resolve needs them, and each one is a way to make two parsers disagree.
_HOST_SYNTAX: Final = re.compile(rb"(?:[A-Za-z0-9._~-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
# Hosts already found valid, so the common case costs a set lookup, not a regex. Bounded
# so that a stream of made-up hosts cannot grow it; past the bound each one pays the regex.
_VALID_HOSTS: Final[set[bytes]] = set()
_VALID_HOSTS_MAX: Final = 4096


def _name_kind(name: bytes, kinds: dict[bytes, int], seen: dict[bytes, int]) -> int:
    """A field's kind by its name in any letter case: one of `kinds`, else _DROP for the
    Proxy-* family (and `Proxy`, the httpoxy vector), else _KEEP. Remembered in `seen`."""
    lname = name.lower()
    kind = kinds.get(lname)
    if kind is None:
        kind = _DROP if lname[:5] == b"proxy" else _KEEP
    if len(seen) < _NAMES_MAX:
        seen[name] = kind
    return kind


class BadRequest(Exception):
    """The request head is malformed in a way the parser does not catch (client's fault)."""


def valid_host(host: bytes) -> bool:
    """Whether a Host value is a hostname or IP literal with an optional port."""
    if host in _VALID_HOSTS:
        return True
    if _HOST_SYNTAX.fullmatch(host) is None:
        return False
    if len(_VALID_HOSTS) < _VALID_HOSTS_MAX:
        _VALID_HOSTS.add(host)
    return True


def origin_form(url: bytes, method: bytes, host: bytes) -> bytes:
    """The request target to send upstream: origin-form, `*`, or CONNECT's authority
    (which the router refuses later). Absolute-form (RFC 9112 §3.2.2) is accepted only
    when its authority equals Host, ignoring letter case: RFC 9112 says the authority
    wins, but routing by one host while the app reads another is a confused deputy, and
    no client talking to an origin sends two different ones. Raises BadRequest."""
    if url == b"*":
        if method != b"OPTIONS":  # only OPTIONS can mean the server itself (RFC 9112 §3.2.4)
            raise BadRequest("asterisk-form target on a method other than OPTIONS")
        return url
    if method == b"CONNECT":
        return url
    lowered = url[:8].lower()
    if lowered.startswith(b"http://"):
        rest = url[7:]
    elif lowered == b"https://":
        rest = url[8:]
    else:
        raise BadRequest("request target is neither origin-form nor absolute-form")
    end = len(rest)
    for delimiter in (b"/", b"?", b"#"):
        at = rest.find(delimiter)
        if at != -1 and at < end:
            end = at
    authority, path = rest[:end], rest[end:]
    if authority.lower() != host.lower():
        raise BadRequest("absolute-form authority differs from Host")
    if path[:1] != b"/":
        path = b"/" + path
    return path


def _nominated(connection_value: bytes) -> frozenset[bytes]:
    """Header names a Connection value lists for removal (usually none)."""
    if connection_value in _PLAIN_CONNECTION_AS_SENT:
        return frozenset()  # the usual value, as apps spell it: no lower() needed
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
        "_rq_error",
        "_rq_framing",
        "_rq_host",
        "_rq_parts",
        "_rq_rare",
        "_rq_trailing",
        "head_bytes",
        "request_fields",
        "request_length",
        "request_url",
    )

    def begin_request_head(self) -> None:
        self._rq_parts: list[bytes] = [b"", b" ", b"", _HTTP11]  # method, target: at finish
        self.request_url = b""
        self._rq_host: bytes | None = None
        # Connection, Upgrade and X-Forwarded-* values by field kind, made only when a
        # request has one (most have none), so starting a head stays a few stores.
        self._rq_rare: dict[int, bytes] | None = None
        self._rq_framing = NONE
        self._rq_error = False
        self._rq_trailing = False
        self.request_fields = 0
        self.head_bytes = 0
        self.request_length = 0

    def on_url(self, url: bytes) -> None:
        self.request_url += url
        self.head_bytes += len(url)

    def begin_trailers(self) -> None:
        """The head is behind (a chunk began): from here a field is a trailer, counted
        from zero and dropped. Called at every chunk; only the last one has trailers."""
        self._rq_trailing = True
        self.request_fields = 0
        self.head_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.request_fields += 1
        self.head_bytes += len(name) + len(value) + 4
        if self._rq_trailing:
            return  # a trailer: counted for the limits, never kept nor forwarded
        kind = _REQUEST_NAMES.get(name)
        if kind is None:
            kind = _name_kind(name, _REQUEST_KINDS, _REQUEST_NAMES)
        if kind == _KEEP:
            self._rq_parts += (name, _SEP, value, _CRLF)
        elif kind == _HOST:
            if self._rq_host is not None:
                self._rq_error = True  # two Host headers: which one routes?
            self._rq_host = value
            self._rq_parts += (b"Host", _SEP, value, _CRLF)
        elif kind == _LENGTH:
            # A second Content-Length is refused even when equal (RFC 9112 §6.3 lets a
            # recipient fold identical ones; a proxy gains nothing by it), and so is
            # anything but digits: `+5`, `0x10`, `5,5`, `5 ` read differently elsewhere.
            if self._rq_framing is not NONE or not value.isdigit() or len(value) > 18:
                self._rq_error = True
            else:
                self.request_length = int(value)
            self._rq_framing = LENGTH
            self._rq_parts += (b"Content-Length", _SEP, value, _CRLF)
        elif kind == _CHUNKED:
            # Only `chunked` alone: a coding list (`gzip, chunked`), `identity`, padding
            # or a repeat is refused, not interpreted.
            if self._rq_framing is not NONE or value.lower() != b"chunked":
                self._rq_error = True
            self._rq_framing = CHUNKED
        elif kind != _DROP:
            rare = self._rq_rare
            if rare is None:
                rare = self._rq_rare = {}
            seen = rare.get(kind)
            if seen is None or kind == _UPGRADE:
                rare[kind] = value
            else:  # a list, as the repeated field would mean (RFC 9110 §5.3)
                rare[kind] = seen + (b"," if kind == _CONNECTION else b", ") + value

    def finish_request_head(
        self, method: bytes, client_ip: bytes, upgrade: bool, trusted: bool = False,
        https: bool = False,
    ) -> tuple[bytes, bytes, Framing, bool]:
        """The HTTP/1.1 request head to send upstream, the client's Host value, the
        request body's framing (NONE, LENGTH or CHUNKED; the upstream side uses the
        same), and whether the request had a Connection header. After return,
        `request_url` is the target as sent upstream (origin-form).

        `upgrade` says the parser saw a valid Upgrade request; only then do Upgrade and
        `Connection: upgrade` cross. `trusted` says the client is a front proxy whose
        X-Forwarded-* are kept; `https` that the request came over TLS (the scheme
        X-Forwarded-Proto says, unless a trusted proxy said one). Raises BadRequest for
        a missing, repeated or malformed Host, a bad request target, or framing headers
        that are malformed or conflict.
        """
        host = self._rq_host
        if host is None or self._rq_error:
            raise BadRequest("missing or repeated Host, or bad body framing")
        if host not in _VALID_HOSTS and not valid_host(host):
            raise BadRequest("Host is not a hostname with an optional port")
        url = self.request_url
        if url[:1] != b"/":
            url = self.request_url = origin_form(url, method, host)
        parts = self._rq_parts
        parts[0] = method
        parts[2] = url
        rare = self._rq_rare or _NO_RARE
        connection = rare.get(_CONNECTION)
        if connection is not None:
            nominated = _nominated(connection)
            if nominated:
                parts = _drop_nominated(parts, 4, nominated)
        upgrade_to = rare.get(_UPGRADE)
        if upgrade and upgrade_to is not None:
            parts += (b"Upgrade", _SEP, upgrade_to, _CRLF, _UPGRADE_CONNECTION)
        framing = self._rq_framing
        if framing is CHUNKED:
            parts.append(b"Transfer-Encoding: chunked\r\n")
        if trusted:
            parts += _trusted_forwarding(
                rare.get(_FORWARDED_FOR),
                rare.get(_FORWARDED_PROTO),
                rare.get(_FORWARDED_HOST),
                client_ip,
                host,
                b"https" if https else b"http",
            )
            parts.append(_CRLF)
        else:  # the head's last lines, in one step
            parts += (_XFF, client_ip, _XFH, host,
                      _END_PROTO_HTTPS if https else _END_PROTO_HTTP)
        return b"".join(parts), host, framing, connection is not None


def _trusted_forwarding(
    forwarded_for: bytes | None,
    forwarded_proto: bytes | None,
    forwarded_host: bytes | None,
    client_ip: bytes,
    host: bytes,
    scheme: bytes = b"http",
) -> tuple[bytes, ...]:
    """X-Forwarded-* header lines for a request from a trusted front proxy: what it said,
    the client address appended to X-Forwarded-For, the proxy's own where it said none."""
    if forwarded_for is not None:
        client_ip = forwarded_for + b", " + client_ip
    proto = forwarded_proto if forwarded_proto is not None else scheme
    original_host = forwarded_host if forwarded_host is not None else host
    return (
        b"X-Forwarded-For: ",
        client_ip,
        b"\r\nX-Forwarded-Host: ",
        original_host,
        b"\r\nX-Forwarded-Proto: ",
        proto,
        _CRLF,
    )


STATUS_LINES: Final = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in HTTPStatus
}


def status_line(status: int) -> bytes:
    line = STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


class ResponseHeadRewriter:
    """Mixin for an httptools response-parser protocol: rewrites the upstream's head
    for the client while it is parsed. Call `begin_response_head` before the first head
    and after an interim (1xx) one; `finish_response_head` makes ready for the next."""

    __slots__ = ("_rs_connection", "_rs_framing", "_rs_parts", "_rs_trailing", "_rs_upgrade_to")

    def begin_trailers(self) -> None:
        """A chunk began. Set for the whole of each chunk rather than for the trailer
        section alone, which the parser does not announce: only the last chunk has
        fields, so it is the same, and an unchunked response never pays for it."""
        self._rs_trailing = True

    def end_trailers(self) -> None:
        self._rs_trailing = False

    def begin_response_head(self) -> None:
        self._rs_parts: list[bytes] = [b""]  # the status line, at finish
        self._rs_connection: bytes | None = None
        self._rs_upgrade_to: bytes | None = None
        self._rs_framing = UNTIL_CLOSE
        self._rs_trailing = False  # a head, and before its body: no chunk yet

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._rs_trailing:
            return  # a trailer: dropped, never a field of the next head
        kind = _RESPONSE_NAMES.get(name)
        if kind is None:
            kind = _name_kind(name, _RESPONSE_KINDS, _RESPONSE_NAMES)
        if kind == _KEEP:
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
        line = STATUS_LINES.get(status)
        parts[0] = line if line is not None else status_line(status)
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
        head = b"".join(parts)
        self.begin_response_head()
        return head, framing, until_close, client_close
