"""The router's HTTPS listener (keelway/router/tls.py), on the real router process: a
handshake gets the certificate of the host it names, only of a host the table serves,
and never another's; what the app sees says https; a renewed certificate is served at
the next handshake; every worker and a successor that takes over serve HTTPS too.
Certificates come from a throwaway CA (trustme); everything is on loopback."""

from __future__ import annotations

import http.client
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trustme

from keelway.router.client import RouterUnreachable, ping_sync
from keelway.router.route_table import Handling, RouteEntry
from tests.router.conftest import REPO, RouterProcess, Upstream, free_port

pytestmark = pytest.mark.timeout(60)


def _store(root: Path, ca: trustme.CA, *names: str) -> None:
    """Lay down a certificate for each name as keelway's store keeps them."""
    for name in names:
        issued = ca.issue_cert(name)
        where = root / name
        where.mkdir(parents=True, exist_ok=True)
        issued.private_key_pem.write_to_path(str(where / "privkey.pem"))
        issued.cert_chain_pems[0].write_to_path(str(where / "fullchain.pem"))


def _routes(upstream: Upstream) -> dict[str, RouteEntry]:
    serving = RouteEntry(state=Handling.SERVING, upstream=upstream.address)
    return {"a.test": serving, "b.test": serving, "nocert.test": serving}


def _client(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


def _get(port: int, name: str, context: ssl.SSLContext) -> tuple[int, bytes, bytes]:
    """GET / over HTTPS naming `name` (SNI and Host); the status, body and the DER of
    the certificate the router showed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        # Dialled by address, named by SNI (http.client would name the address).
        tls = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                  server_hostname=name)
        conn.sock = tls
        shown = tls.getpeercert(binary_form=True) or b""
        conn.request("GET", "/", headers={"Host": name})
        response = conn.getresponse()
        return response.status, response.read(), shown
    finally:
        conn.close()


def _handshake(port: int, name: str | None) -> None:
    """A handshake naming `name` (None: no SNI) that trusts anything; raises SSLError
    when the router refuses it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name):
        pass


class _Https:
    def __init__(self, tmp_path: Path, start_router: type[RouterProcess],
                 workers: int) -> None:
        self.ca = trustme.CA()
        self.certs = tmp_path / "certs"
        _store(self.certs, self.ca, "a.test", "b.test", "elsewhere.test")
        self.port = free_port()
        self.router = start_router(extra_argv=(
            "--https-listen", f"127.0.0.1:{self.port}", "--certs", str(self.certs),
            "--workers", str(workers)))


@pytest.fixture(params=[1, 2], ids=["one-process", "two-workers"])
def https(request: pytest.FixtureRequest, tmp_path: Path,
          start_router: type[RouterProcess]) -> _Https:
    return _Https(tmp_path, start_router, request.param)


def _proto(seen: dict[str, object]) -> str:
    """The X-Forwarded-Proto the upstream saw in one request."""
    headers = seen["headers"]
    assert isinstance(headers, list)
    return str(dict(headers)["X-Forwarded-Proto"])


def _der(root: Path, name: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert((root / name / "fullchain.pem").read_text())


def test_each_host_gets_its_own_certificate_and_the_app_is_told_https(
        https: _Https, upstream: Upstream) -> None:
    https.router.push(1, _routes(upstream))
    client = _client(https.ca)
    for name in ("a.test", "b.test"):
        status, _body, shown = _get(https.port, name, client)
        assert status == 200 and shown == _der(https.certs, name)
    assert {_proto(r) for r in upstream.seen.requests} == {"https"}


def test_a_handshake_for_a_name_not_served_or_not_certified_or_unnamed_fails(
        https: _Https, upstream: Upstream) -> None:
    https.router.push(1, _routes(upstream))
    # elsewhere.test has a certificate in the store but no route: still refused.
    for name in ("evil.test", "nocert.test", "elsewhere.test", None):
        with pytest.raises(ssl.SSLError):
            _handshake(https.port, name)
    assert upstream.seen.requests == []
    # The listener is fine after all of them.
    assert _get(https.port, "a.test", _client(https.ca))[0] == 200


def test_a_renewed_certificate_is_served_at_the_next_handshake(
        https: _Https, upstream: Upstream) -> None:
    https.router.push(1, _routes(upstream))
    client = _client(https.ca)
    before = _get(https.port, "a.test", client)[2]
    staged = https.certs.parent / "staged"
    _store(staged, https.ca, "a.test")
    time.sleep(0.01)  # a distinct modification time even on a coarse clock
    # As keelway's store replaces one: the new file renamed over the old.
    for part in ("privkey.pem", "fullchain.pem"):
        shutil.move(staged / "a.test" / part, https.certs / "a.test" / f".{part}")
        (https.certs / "a.test" / f".{part}").replace(https.certs / "a.test" / part)
    deadline = time.monotonic() + 5
    while (after := _get(https.port, "a.test", client)[2]) == before:
        assert time.monotonic() < deadline, "the old certificate is still served"
    assert after == _der(https.certs, "a.test")


def test_a_router_that_takes_over_serves_https_on_the_same_socket(
        https: _Https, upstream: Upstream, tmp_path: Path) -> None:
    old = https.router
    old.push(1, _routes(upstream))
    log = tmp_path / "successor.log"
    with log.open("ab") as out:
        successor = subprocess.Popen(
            [sys.executable, "-m", "keelway.router", "--takeover", str(old.control),
             "--control", str(old.control), "--state", str(old.state),
             "--certs", str(https.certs)], cwd=REPO, stdout=out, stderr=out)
    try:
        old.proc.wait(timeout=20)  # retired once the successor serves
        deadline = time.monotonic() + 10
        while True:
            try:
                ping_sync(old.control, timeout_s=0.5)
                break
            except RouterUnreachable:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        status, _body, shown = _get(https.port, "a.test", _client(https.ca))
        assert status == 200 and shown == _der(https.certs, "a.test")
    finally:
        successor.terminate()
        successor.wait(timeout=15)


def test_plain_http_still_says_http(router_and_upstream: tuple[RouterProcess, Upstream]
                                    ) -> None:
    router, upstream = router_and_upstream
    router.push(1, {"a.test": RouteEntry(state=Handling.SERVING, upstream=upstream.address)})
    conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=10)
    conn.request("GET", "/", headers={"Host": "a.test"})
    assert conn.getresponse().status == 200
    conn.close()
    assert _proto(upstream.seen.requests[-1]) == "http"


@pytest.fixture
def router_and_upstream(router: RouterProcess, upstream: Upstream
                        ) -> tuple[RouterProcess, Upstream]:
    return router, upstream


def _plain(port: int, name: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": name})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


TOKEN = "evaGxfADs6pSRb2LAv9IZf17Dt3juxGJ-PCt92wr-oA"


def test_a_route_that_asks_for_https_redirects_plain_http_and_gets_hsts(
        https: _Https, upstream: Upstream) -> None:
    entry = RouteEntry(state=Handling.SERVING, upstream=upstream.address, force_https=True,
                       hsts_s=31536000)
    https.router.push(1, {"a.test": entry, "b.test": _routes(upstream)["b.test"]})
    status, headers, _ = _plain(https.router.port, "a.test:8080", "/cart?item=3")
    assert status == 308
    assert headers["Location"] == f"https://a.test:{https.port}/cart?item=3"
    assert upstream.seen.requests == []  # answered by the router
    # A route that does not ask is served over plain HTTP as before, with no HSTS.
    assert _plain(https.router.port, "b.test", "/")[0] == 200
    context = _client(https.ca)
    conn = http.client.HTTPConnection("127.0.0.1", https.port, timeout=10)
    conn.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", https.port)),
                                    server_hostname="a.test")
    conn.request("GET", "/", headers={"Host": "a.test"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Strict-Transport-Security") == "max-age=31536000"
    conn.close()


@pytest.mark.parametrize("state", [Handling.SERVING, Handling.PARKED])
def test_an_acme_challenge_is_answered_by_the_router_for_its_host_only(
        https: _Https, upstream: Upstream, state: Handling) -> None:
    entry = (RouteEntry(state=state, upstream=upstream.address, force_https=True)
             if state is Handling.SERVING else RouteEntry(state=state))
    https.router.push(1, {"a.test": entry, "b.test": _routes(upstream)["b.test"]})
    store = https.certs / ".acme-challenges"
    store.mkdir()
    (store / TOKEN).write_text(f"a.test\n{TOKEN}.thumbprint\n")
    path = f"/.well-known/acme-challenge/{TOKEN}"
    # Not redirected, and a parked instance answers at once, waking nothing.
    status, _, body = _plain(https.router.port, "a.test", path)
    assert (status, body) == (200, f"{TOKEN}.thumbprint".encode())
    assert _plain(https.router.port, "b.test", path)[0] == 404  # another host's
    assert _plain(https.router.port, "a.test", "/.well-known/acme-challenge/x")[0] == 404
    assert _plain(https.router.port, "a.test",
                  "/.well-known/acme-challenge/..%2f..%2fprivkey.pem")[0] == 404
    assert upstream.seen.requests == []


def test_a_session_resumes_on_any_worker_with_one_ticket_key(
        https: _Https, upstream: Upstream) -> None:
    https.router.push(1, _routes(upstream))
    context = _client(https.ca)
    context.maximum_version = ssl.TLSVersion.TLSv1_2  # a ticket at once, with the handshake
    session: ssl.SSLSession | None = None
    reused = []
    for _ in range(16):  # new connections: the kernel spreads them over the workers
        with socket.create_connection(("127.0.0.1", https.port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname="a.test", session=session) as tls:
            reused.append(tls.session_reused)
            session = tls.session
    assert reused == [False] + [True] * 15
    keys = https.certs / ".ticket-keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600 and len(keys.read_bytes()) == 80
