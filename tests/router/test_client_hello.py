"""The ClientHello reader (keelway/router/client_hello.py): real hellos written by
Python's own TLS client (OpenSSL) read back to the name and protocols they were made
with, split over records and cut short; and hostile bytes, fuzzed, never raise, never
read past what they claim, and never make a whole hello out of a partial one."""

from __future__ import annotations

import ssl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keelway.router.client_hello import (
    MAX_HELLO_BYTES,
    ClientHello,
    Incomplete,
    Unreadable,
    read_client_hello,
)

pytestmark = pytest.mark.timeout(60)


def _hello(name: str | None, alpn: list[str] | None = None,
           maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED) -> bytes:
    """The first flight of Python's TLS client: its ClientHello record(s)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.maximum_version = maximum
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def _split(record: bytes, size: int) -> bytes:
    """The same handshake message carried by records of at most `size` bytes each."""
    message = record[5:]
    out = b""
    for at in range(0, len(message), size):
        piece = message[at:at + size]
        out += record[:3] + len(piece).to_bytes(2, "big") + piece
    return out


REAL = [
    ("a.test", None),
    ("a.test", ["http/1.1"]),
    ("Blog.Example.TEST", ["h2", "http/1.1"]),
    ("x" * 63 + "." + "y" * 63 + ".test", ["acme-tls/1"]),
    (None, ["http/1.1"]),
]


@pytest.mark.parametrize(("name", "alpn"), REAL)
@pytest.mark.parametrize("maximum", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_a_real_hello_gives_back_the_name_and_protocols_it_was_made_with(
        name: str | None, alpn: list[str] | None, maximum: ssl.TLSVersion) -> None:
    read = read_client_hello(_hello(name, alpn, maximum))
    assert read == ClientHello(
        name.lower() if name is not None else None,
        tuple(p.encode() for p in alpn) if alpn is not None else None)


def test_a_client_dialling_an_address_names_no_host() -> None:
    # Python sends no SNI for an IP address (RFC 6066 allows names only).
    assert read_client_hello(_hello("127.0.0.1", ["http/1.1"])) == ClientHello(
        None, (b"http/1.1",))


@pytest.mark.parametrize("size", [1, 3, 4, 5, 100])
def test_a_hello_split_over_records_is_put_back_together(size: int) -> None:
    whole = _hello("a.test", ["acme-tls/1"])
    assert read_client_hello(_split(whole, size)) == read_client_hello(whole)


def test_every_prefix_of_a_hello_asks_for_more_and_never_less_than_it_has() -> None:
    whole = _split(_hello("a.test", ["h2", "http/1.1"]), 200)
    for cut in range(len(whole)):
        read = read_client_hello(whole[:cut])
        assert isinstance(read, Incomplete), cut
        assert cut < read.needed_bytes <= len(whole)


def test_the_first_byte_of_anything_but_a_handshake_is_not_tls() -> None:
    assert read_client_hello(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n") is Unreadable.NOT_TLS
    assert read_client_hello(b"\x16\x02\x00\x00\x05hello") is Unreadable.NOT_TLS


def test_a_hello_longer_than_the_bound_is_refused_before_it_is_read() -> None:
    head = b"\x16\x03\x01\x40\x00" + b"\x01" + (MAX_HELLO_BYTES).to_bytes(3, "big")
    assert read_client_hello(head) is Unreadable.TOO_LARGE


def test_a_name_that_is_no_dns_name_is_no_name() -> None:
    whole = _hello("a.test", None)
    at = whole.index(b"a.test")
    for bad in (b"a/tes", b"a\x00tes", b"..\\xy", b"a tes", b"\xc3\xa9test"[:6]):
        forged = whole[:at] + bad.ljust(6, b"x") + whole[at + 6:]
        assert read_client_hello(forged) == ClientHello(None, None), bad


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=600))
def test_any_bytes_give_a_value_and_never_an_exception(data: bytes) -> None:
    read = read_client_hello(data)
    assert isinstance(read, ClientHello | Incomplete | Unreadable)
    if isinstance(read, Incomplete):
        assert len(data) < read.needed_bytes <= MAX_HELLO_BYTES


@settings(max_examples=1500, deadline=None)
@given(st.data())
def test_a_real_hello_with_bytes_changed_gives_a_value_and_never_an_exception(
        data: st.DataObject) -> None:
    base = bytearray(_split(_hello("a.test", ["http/1.1", "acme-tls/1"]),
                            data.draw(st.sampled_from([64, 300, 20000]))))
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, len(base) - 1))
        base[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(base)))
    read = read_client_hello(bytes(base[:cut]))
    assert isinstance(read, ClientHello | Incomplete | Unreadable)
    if isinstance(read, ClientHello) and read.server_name is not None:
        assert read.server_name.isascii() and "/" not in read.server_name
