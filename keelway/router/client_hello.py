"""What the router reads of a TLS ClientHello before the handshake: the name it asks for
(SNI, RFC 6066) and the protocols it offers (ALPN, RFC 7301). Pure: bytes in, a value
out, no I/O (keelway/router/handshakes.py peeks the bytes off the socket).

Rules it keeps:
- Any input, however hostile, gives a value: `ClientHello`, `Incomplete` (more bytes
  could make it one, and how many are needed at least) or an `Unreadable`. Nothing
  raises, and the work is linear in the input, which the caller bounds (MAX_HELLO_BYTES).
- Every length is checked against the bytes it claims before they are read, and a
  field that overruns its parent is unreadable, never read past its end.
- A handshake message split over several records is put back together (a TLS record
  carries at most 16 KB); records of any other type before the hello are unreadable.
- Only SNI and ALPN are read; the rest is skipped by its lengths. A name that is not a
  plain DNS name in ASCII is reported as no name: it can name no host of the table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

_HANDSHAKE: Final = 22  # TLS record type
_CLIENT_HELLO: Final = 1  # handshake message type
_SERVER_NAME: Final = 0  # extension types
_ALPN: Final = 16
_HOST_NAME: Final = 0  # the one SNI name type
_RECORD_HEAD: Final = 5
_MESSAGE_HEAD: Final = 4
_MAX_RECORD: Final = 1 << 14  # a plaintext record's largest fragment
# What the router reads at most before it decides: far above a real hello (some 2 KB
# with post-quantum key shares), far below what a slow client could make it hold.
MAX_HELLO_BYTES: Final = 16 * 1024
_NAME_BYTES: Final = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789-.")
_MAX_NAME: Final = 253


@dataclass(frozen=True, slots=True)
class ClientHello:
    """What a whole ClientHello asked for: `server_name` lowercase, without a trailing
    dot (None: it named none, or nothing a DNS name can be); `alpn` the protocols it
    offered in its order (None: it sent no ALPN extension)."""

    server_name: str | None
    alpn: tuple[bytes, ...] | None


@dataclass(frozen=True, slots=True)
class Incomplete:
    """Not all of the hello is here yet: at least `needed_bytes` in all are."""

    needed_bytes: int


class Unreadable(enum.Enum):
    NOT_TLS = "the first bytes are not a TLS handshake record"
    MALFORMED = "a ClientHello that does not parse"
    TOO_LARGE = "a ClientHello longer than the router reads"


Peeked = ClientHello | Incomplete | Unreadable


def read_client_hello(data: bytes) -> Peeked:
    """Read the ClientHello at the start of `data`, the first bytes a client sent."""
    if not data:
        return Incomplete(_RECORD_HEAD)
    if data[0] != _HANDSHAKE:
        return Unreadable.NOT_TLS
    if len(data) >= _RECORD_HEAD + _MESSAGE_HEAD and data[1] == 3 and data[5] == _CLIENT_HELLO:
        # The usual case, read without copying the message: one record holds it all.
        length = (data[3] << 8) | data[4]
        wanted = _MESSAGE_HEAD + ((data[6] << 16) | (data[7] << 8) | data[8])
        if wanted <= length <= _MAX_RECORD and len(data) >= _RECORD_HEAD + length:
            return _hello(data[_RECORD_HEAD + _MESSAGE_HEAD:_RECORD_HEAD + wanted])
    message = bytearray()
    at = 0
    wanted = -1  # the whole message's length, once its head is in
    while wanted < 0 or len(message) < wanted:
        if len(data) < at + _RECORD_HEAD:
            return _incomplete(at + _RECORD_HEAD)
        if data[at] != _HANDSHAKE or data[at + 1] != 3:
            return Unreadable.NOT_TLS if at == 0 else Unreadable.MALFORMED
        length = (data[at + 3] << 8) | data[at + 4]
        if length == 0 or length > _MAX_RECORD:
            return Unreadable.MALFORMED
        end = at + _RECORD_HEAD + length
        if len(data) < end:
            return _incomplete(end)
        message += data[at + _RECORD_HEAD:end]
        at = end
        if wanted < 0 and len(message) >= _MESSAGE_HEAD:
            if message[0] != _CLIENT_HELLO:
                return Unreadable.MALFORMED
            wanted = _MESSAGE_HEAD + ((message[1] << 16) | (message[2] << 8) | message[3])
            if wanted > MAX_HELLO_BYTES:
                return Unreadable.TOO_LARGE
    return _hello(bytes(message[_MESSAGE_HEAD:wanted]))


def _incomplete(needed_bytes: int) -> Incomplete | Unreadable:
    return Unreadable.TOO_LARGE if needed_bytes > MAX_HELLO_BYTES else Incomplete(needed_bytes)


def _hello(body: bytes) -> ClientHello | Unreadable:
    """The body of a ClientHello message: version, random, session id, cipher suites,
    compression methods, then (optional before TLS 1.3) the extensions."""
    at = 2 + 32  # legacy_version, random
    at = _vector_end(body, at, 1)  # legacy_session_id
    at = _vector_end(body, at, 2)  # cipher_suites
    at = _vector_end(body, at, 1)  # legacy_compression_methods
    if at < 0:
        return Unreadable.MALFORMED
    if at == len(body):
        return ClientHello(None, None)  # no extensions at all
    end = _vector_end(body, at, 2)
    if end != len(body):
        return Unreadable.MALFORMED
    at += 2
    server_name: str | None = None
    alpn: tuple[bytes, ...] | None = None
    seen: set[int] = set()
    while at < end:
        if at + 4 > end:
            return Unreadable.MALFORMED
        kind = (body[at] << 8) | body[at + 1]
        length = (body[at + 2] << 8) | body[at + 3]
        start, at = at + 4, at + 4 + length
        if at > end:
            return Unreadable.MALFORMED
        if kind in seen:  # RFC 8446 4.2: an extension at most once
            return Unreadable.MALFORMED
        seen.add(kind)
        if kind == _SERVER_NAME:
            named = _server_name(body[start:at])
            if isinstance(named, Unreadable):
                return named
            server_name = named
        elif kind == _ALPN:
            offered = _protocols(body[start:at])
            if offered is None:
                return Unreadable.MALFORMED
            alpn = offered
    return ClientHello(server_name, alpn)


def _vector_end(data: bytes, at: int, width: int) -> int:
    """Where the vector at `at` with a `width`-byte length ends, or -1 past `data`."""
    if at < 0 or at + width > len(data):
        return -1
    length = int.from_bytes(data[at:at + width], "big")
    end = at + width + length
    return end if end <= len(data) else -1


def _server_name(data: bytes) -> str | Unreadable | None:
    """The host name of a server_name extension; an empty extension (a server's echo)
    or a name that is no DNS name is None, a broken one unreadable."""
    if not data:
        return None
    if _vector_end(data, 0, 2) != len(data):
        return Unreadable.MALFORMED
    at = 2
    name: str | None = None
    while at < len(data):
        if at + 3 > len(data):
            return Unreadable.MALFORMED
        kind = data[at]
        end = _vector_end(data, at + 1, 2)
        if end < 0:
            return Unreadable.MALFORMED
        if kind == _HOST_NAME and name is None:
            name = _dns_name(data[at + 3:end])
            if name is None:
                return None
        at = end
    return name


def _dns_name(raw: bytes) -> str | None:
    name = raw.lower()
    if name.endswith(b"."):
        name = name[:-1]
    if not name or len(name) > _MAX_NAME or not _NAME_BYTES.issuperset(name):
        return None
    return name.decode("ascii")


def _protocols(data: bytes) -> tuple[bytes, ...] | None:
    """The protocol names of an ALPN extension (none empty); None if it is broken."""
    if _vector_end(data, 0, 2) != len(data) or len(data) < 3:
        return None
    at = 2
    offered = []
    while at < len(data):
        end = _vector_end(data, at, 1)
        if end < 0 or end == at + 1:
            return None
        offered.append(data[at + 1:end])
        at = end
    return tuple(offered)
