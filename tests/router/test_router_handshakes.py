"""The HTTPS accept path (keelway/router/handshakes.py) on the real router process: the
hello is read before the handshake, so a TLS-ALPN-01 validation gets its challenge
certificate (and a browser never does), a served host with no certificate waits while
the control plane gets one on demand (once per name however many wait; never for a
name the table does not serve; not again soon after a failure), and what is not a
hello, or arrives too slowly, is closed. Everything on loopback, with one process and
with two workers."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import trustme

from keelway.router.route_table import Handling, RouteEntry
from tests.router.conftest import RouterProcess, Upstream, free_port
from tests.router.tls_parts import (
    der_of,
    fake_control_plane,
    lay_down,
    shown_certificate,
    tlsalpn01_pem,
    write_challenge,
)

pytestmark = pytest.mark.timeout(60)


def _router(start_router: type[RouterProcess], certs: Path, workers: int = 1,
            on_demand: Path | None = None) -> tuple[RouterProcess, int]:
    port = free_port()
    argv = ["--https-listen", f"127.0.0.1:{port}", "--certs", str(certs),
            "--workers", str(workers)]
    if on_demand is not None:
        argv += ["--on-demand", "--wake-socket", str(on_demand)]
    return start_router(extra_argv=tuple(argv)), port


def _serving(upstream: Upstream) -> RouteEntry:
    return RouteEntry(state=Handling.SERVING, upstream=upstream.address)


def _refused(port: int, name: str | None, alpn: list[str] | None = None) -> bool:
    try:
        shown_certificate(port, name, alpn)
    except (ssl.SSLError, ConnectionError):
        return True
    return False


# -- TLS-ALPN-01 -------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_a_tls_alpn_01_validation_gets_the_challenge_certificate_of_a_parked_host(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream,
        workers: int) -> None:
    ca = trustme.CA()
    certs = tmp_path / "certs"
    lay_down(certs, ca, "served.test")
    router, port = _router(start_router, certs, workers)
    router.push(1, {"parked.test": RouteEntry(state=Handling.PARKED),
                    "served.test": _serving(upstream)})
    pem = tlsalpn01_pem("parked.test", "token.thumbprint")
    write_challenge(certs, "parked.test", pem)
    challenge = ssl.PEM_cert_to_DER_cert(pem.decode()[pem.decode().index("-----BEGIN CERT"):])
    for _ in range(4):  # whichever worker takes it
        assert shown_certificate(port, "parked.test", ["acme-tls/1"]) == (
            challenge, "acme-tls/1")
    # A browser asking for the same name never gets it (the host has no certificate).
    assert _refused(port, "parked.test", ["http/1.1"])
    assert _refused(port, "parked.test", ["acme-tls/1", "http/1.1"])
    assert _refused(port, "parked.test")
    # Nor does a served host's browser, which gets its own certificate as ever.
    write_challenge(certs, "served.test", tlsalpn01_pem("served.test", "t.t"))
    assert shown_certificate(port, "served.test", ["http/1.1"]) == (
        der_of(certs, "served.test"), "http/1.1")
    assert upstream.seen.requests == []  # nothing was woken or asked


def test_a_tls_alpn_01_hello_without_a_challenge_or_for_an_unserved_name_is_refused(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream) -> None:
    ca = trustme.CA()
    certs = tmp_path / "certs"
    lay_down(certs, ca, "served.test")
    router, port = _router(start_router, certs)
    router.push(1, {"served.test": _serving(upstream)})
    assert _refused(port, "served.test", ["acme-tls/1"])  # a certificate, no challenge
    write_challenge(certs, "other.test", tlsalpn01_pem("other.test", "t.t"))
    assert _refused(port, "other.test", ["acme-tls/1"])  # a challenge, not a host of ours
    write_challenge(certs, "served.test", tlsalpn01_pem("served.test", "t.t"))
    assert shown_certificate(port, "served.test", ["acme-tls/1"])[1] == "acme-tls/1"
    (certs / ".acme-challenges" / "tls-alpn-01" / "served.test.pem").unlink()
    assert _refused(port, "served.test", ["acme-tls/1"])  # removed: refused again


# -- what is not a hello ----------------------------------------------------------------


def test_bytes_that_are_not_tls_are_closed_and_the_listener_goes_on(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream) -> None:
    ca = trustme.CA()
    certs = tmp_path / "certs"
    lay_down(certs, ca, "a.test")
    router, port = _router(start_router, certs)
    router.push(1, {"a.test": _serving(upstream)})
    for garbage in (b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
                    b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00",  # not a ClientHello
                    b"\x16\x03\x01\x00\x00"):  # an empty record
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(garbage)
            try:
                while raw.recv(100):  # an alert at most, then the end
                    pass
            except ConnectionResetError:
                pass
    assert shown_certificate(port, "a.test")[0] == der_of(certs, "a.test")


def test_a_hello_sent_a_few_bytes_at_a_time_is_read_whole(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream) -> None:
    ca = trustme.CA()
    certs = tmp_path / "certs"
    lay_down(certs, ca, "a.test")
    router, port = _router(start_router, certs)
    router.push(1, {"a.test": _serving(upstream)})
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = context.wrap_bio(incoming, outgoing, server_hostname="a.test")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    hello = outgoing.read()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for at in range(0, len(hello), 97):
            raw.sendall(hello[at:at + 97])
            time.sleep(0.005)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.do_handshake()
                break
            except ssl.SSLWantReadError:
                if outgoing.pending:
                    raw.sendall(outgoing.read())
                assert time.monotonic() < deadline
                incoming.write(raw.recv(65536))
        assert client.getpeercert(binary_form=True) == der_of(certs, "a.test")


@pytest.mark.slow
def test_a_client_that_sends_no_hello_is_closed_at_the_handshake_bound(
        tmp_path: Path, start_router: type[RouterProcess]) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    _router_process, port = _router(start_router, certs)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as silent, \
            socket.create_connection(("127.0.0.1", port), timeout=20) as partial:
        partial.sendall(b"\x16\x03\x01\x02\x00\x01")  # a hello that never ends
        began = time.monotonic()
        assert silent.recv(100) == b""
        with contextlib.suppress(ConnectionResetError):  # its bytes unread: a reset
            assert partial.recv(100) == b""
        assert 9 < time.monotonic() - began < 13  # HANDSHAKE_TIMEOUT_S, swept each 0.5 s


# -- certificates on demand -------------------------------------------------------------


class _OnDemand:
    def __init__(self, tmp_path: Path, start_router: type[RouterProcess],
                 upstream: Upstream, workers: int = 1) -> None:
        self.ca = trustme.CA()
        self.certs = tmp_path / "certs"
        lay_down(self.certs, self.ca, "have.test")
        self.socket = tmp_path / "api.sock"
        self.router, self.port = _router(start_router, self.certs, workers, self.socket)
        self.router.push(1, {"have.test": _serving(upstream),
                             "new.test": _serving(upstream),
                             "parked.test": RouteEntry(state=Handling.PARKED)})


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_a_served_host_without_a_certificate_waits_for_one_on_demand(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream,
        workers: int) -> None:
    there = _OnDemand(tmp_path, start_router, upstream, workers)
    with fake_control_plane(there.socket, there.certs, there.ca, delay_s=0.3) as plane:
        began = time.monotonic()
        shown, alpn = shown_certificate(there.port, "new.test", ["http/1.1"])
        assert time.monotonic() - began >= 0.3
        assert (shown, alpn) == (der_of(there.certs, "new.test"), "http/1.1")
        # Once it is there, the next handshakes ask nothing, in any worker.
        for _ in range(4):
            assert shown_certificate(there.port, "new.test")[0] == shown
        assert shown_certificate(there.port, "have.test")[0] == der_of(there.certs,
                                                                      "have.test")
        assert plane.demands() == ["/v1/certs/new.test/demand"]


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_handshakes_waiting_for_one_name_share_one_request(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream,
        workers: int) -> None:
    there = _OnDemand(tmp_path, start_router, upstream, workers)
    with fake_control_plane(there.socket, there.certs, there.ca, delay_s=1.0) as plane, \
            ThreadPoolExecutor(12) as pool:
        shown = list(pool.map(lambda _: shown_certificate(there.port, "parked.test")[0],
                              range(12)))
        assert shown == [der_of(there.certs, "parked.test")] * 12
        # One request per process that waited: each worker asks for itself.
        demands = plane.demands()
        assert demands and set(demands) == {"/v1/certs/parked.test/demand"}
        assert len(demands) <= workers


def test_a_name_the_table_does_not_serve_never_asks_for_a_certificate(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream) -> None:
    there = _OnDemand(tmp_path, start_router, upstream)
    with fake_control_plane(there.socket, there.certs, there.ca) as plane:
        for name in ("evil.test", "new.test.evil", "127.0.0.1", None):
            assert _refused(there.port, name)
        assert plane.demands() == []
        assert upstream.seen.requests == []


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_a_failed_demand_fails_its_handshakes_and_is_not_asked_again_soon(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream,
        workers: int) -> None:
    there = _OnDemand(tmp_path, start_router, upstream, workers)
    with fake_control_plane(there.socket, there.certs, there.ca, status=503,
                            delay_s=1.0) as plane:
        assert _refused(there.port, "new.test")
        began = time.monotonic()
        for _ in range(6):
            assert _refused(there.port, "new.test")
        # In the hold-off, refused without asking: at most one request per process,
        # and in one process none of these waited for an answer.
        assert set(plane.demands()) == {"/v1/certs/new.test/demand"}
        assert len(plane.demands()) <= workers
        if workers == 1:
            assert time.monotonic() - began < 1.0
        # Another name is its own: asked, and served.
        plane.status = 200
        assert shown_certificate(there.port, "parked.test")[0] == der_of(there.certs,
                                                                        "parked.test")


def test_without_an_answer_from_the_control_plane_the_handshake_fails(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream) -> None:
    there = _OnDemand(tmp_path, start_router, upstream)  # nothing listens on its socket
    assert _refused(there.port, "new.test")
    assert _refused(there.port, "have.test") is False


def test_without_on_demand_a_served_host_without_a_certificate_is_refused(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream) -> None:
    ca = trustme.CA()
    certs = tmp_path / "certs"
    lay_down(certs, ca, "have.test")
    socket_path = tmp_path / "api.sock"
    router, port = _router(start_router, certs)
    router.push(1, {"have.test": _serving(upstream), "new.test": _serving(upstream)})
    with fake_control_plane(socket_path, certs, ca) as plane:
        assert _refused(port, "new.test")
        assert plane.demands() == []


def test_out_of_descriptors_the_https_listener_pauses_instead_of_spinning(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream) -> None:
    ca = trustme.CA()
    certs = tmp_path / "certs"
    lay_down(certs, ca, "a.test")
    port = free_port()
    router = start_router(open_files=(64, 64), extra_argv=(
        "--https-listen", f"127.0.0.1:{port}", "--certs", str(certs)))
    router.push(1, {"a.test": _serving(upstream)})
    silent: list[socket.socket] = []
    try:
        for _ in range(128):  # each waits for its hello with a descriptor of the router's
            silent.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.3)
        cpu_before = router.cpu_seconds()
        time.sleep(1.0)
        busy_s = router.cpu_seconds() - cpu_before
        assert busy_s < 0.25, f"the router used {busy_s:.2f} s of CPU in 1 s"
        said = [line for line in router.log.read_text().splitlines()
                if "HTTPS accepts paused" in line]
        assert len(said) == 1, router.log.read_text()
    finally:
        for sock in silent:
            sock.close()
    deadline = time.monotonic() + 10
    while True:  # the silent ones' descriptors free as their ends are read
        try:
            assert shown_certificate(port, "a.test", timeout_s=2)[0] == der_of(certs, "a.test")
            break
        except (ssl.SSLError, OSError):
            assert time.monotonic() < deadline, router.log.read_text()
            time.sleep(0.1)
    assert router.proc.poll() is None
