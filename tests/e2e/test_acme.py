"""Certificates by ACME through the real CLI, daemon and router, from a real ACME server on
loopback (Debian's pebble; tests/acme_server.py), issue #21: the keeper orders a new
host's certificate by itself and the router serves it; a parked instance's HTTP-01 is
answered without waking it; a certificate two thirds through its life is renewed; an
unknown name orders nothing; a CA that is down fails `certs renew` with what happened,
backs off (said in `certs list`, `status` and `doctor`) and the old certificate stays
served."""

from __future__ import annotations

import datetime
import socket
import ssl
import time
from pathlib import Path

import pytest
import trustme
from cryptography import x509

from tests.acme_server import pebble
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, free_port, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

HOST = "one.test"
ALIAS = "www.one.test"


def _shown(port: int, name: str) -> x509.Certificate | None:
    """The certificate shown for `name`; None: the handshake was refused."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=name) as tls:
            der = tls.getpeercert(binary_form=True)
    except (ssl.SSLError, ConnectionError):
        return None
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _issuer(port: int, name: str) -> str | None:
    leaf = _shown(port, name)
    return None if leaf is None else leaf.issuer.rfc4514_string()


def _get(port: int, name: str) -> bytes:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name) as tls:
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := tls.recv(65536):
            reply += chunk
    return reply


def _short_lived(tmp_path: Path, name: str) -> tuple[str, str]:
    """A certificate for `name` 90% through its life (due for renewal at two thirds)."""
    now = datetime.datetime.now(datetime.UTC)
    issued = trustme.CA().issue_cert(name, not_before=now - datetime.timedelta(days=9),
                                     not_after=now + datetime.timedelta(days=1))
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


def test_certificates_are_ordered_renewed_and_kept_through_a_ca_outage(
        kw: Keelway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEELWAY_CERT_SWEEP_S", "0.5")
    port = free_port()
    with pebble(tmp_path / "pebble", kw.http_port, port) as ca:
        kw.up("--https", f"127.0.0.1:{port}", "--acme-directory", ca.directory,
              "--acme-ca-bundle", str(ca.ca_bundle), "--acme-email", "ops@example.com",
              "--acme-challenge", "http-01")
        kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", HOST)

        # The keeper orders the new host's certificate by itself; the router serves it.
        assert wait_until(lambda: "Pebble" in (_issuer(port, HOST) or ""), 60, 0.3), \
            kw.ok("certs", "list").out
        assert _get(port, HOST).startswith(b"HTTP/1.1 200")
        listed = kw.ok("certs", "list", "--json").json()
        assert listed["acme"]["directory"] == ca.directory and listed["failing"] == []
        ops = kw.ok("ops", "hello", "--json").json()["operations"]
        certify = [op for op in ops if op["kind"] == "certify"]
        assert certify and certify[0]["state"] == "succeeded"
        assert not list((kw.home / "acme" / "orders").iterdir())  # nothing left under way

        # A name keelway does not serve is refused and orders nothing.
        assert _shown(port, "evil.test") is None
        assert not (kw.home / "acme" / "orders" / "evil.test").exists()
        assert kw.run("certs", "renew", "evil.test").code != 0

        # A parked instance's challenge is answered without waking it.
        kw.ok("park", HOST)
        renewed = kw.ok("certs", "renew", HOST).out
        assert "served with a new certificate" in renewed
        state = kw.ok("status", "--json").json()["apps"][0]["instances"][0]["state"]
        assert state == "parked"

        # An alias whose certificate is two thirds through its life is renewed.
        kw.ok("domains", "add", HOST, ALIAS)
        kw.ok("certs", "import", ALIAS, *_short_lived(tmp_path, ALIAS))
        assert wait_until(lambda: "Pebble" in (_issuer(port, ALIAS) or ""), 60, 0.3), \
            kw.ok("certs", "list").out
        dry = kw.ok("certs", "renew", HOST, "--dry-run").out
        assert "order a certificate for one.test" in dry and "install" in dry

    # The CA is down: a renewal fails saying so, backs off, and HTTPS serves on.
    before = _issuer(port, HOST)
    failed = kw.run("certs", "renew", HOST)
    assert failed.code != 0 and "no new certificate for one.test" in failed.err, failed.err
    assert _issuer(port, HOST) == before and _get(port, HOST).startswith(b"HTTP/1.1 200")
    failing = kw.ok("certs", "list", "--json").json()["failing"]
    assert [f["name"] for f in failing] == [HOST] and failing[0]["failures"] == 1
    assert "tried again after" in kw.ok("certs", "list").out
    assert "no certificate from the CA yet" in kw.ok("status").out
    doctor = kw.run("doctor", "--json").json()["checks"]
    assert any(c["check"] == "certificates" and not c["ok"] for c in doctor)
    # The keeper leaves it alone within its back-off (a minute after the first failure).
    time.sleep(2)
    again = kw.ok("certs", "list", "--json").json()["failing"]
    assert again[0]["failures"] == 1


def test_an_alias_added_later_gets_its_certificate_at_its_first_handshake_by_tls_alpn(
        kw: Keelway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The keeper waits an hour: what orders here is the handshake itself.
    monkeypatch.setenv("KEELWAY_CERT_SWEEP_S", "3600")
    port = free_port()
    with pebble(tmp_path / "pebble", kw.http_port, port) as ca:
        kw.up("--https", f"127.0.0.1:{port}", "--acme-directory", ca.directory,
              "--acme-ca-bundle", str(ca.ca_bundle), "--acme-challenge", "tls-alpn-01")
        kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", HOST)
        kw.ok("park", HOST)  # its challenge is answered parked, waking nothing
        kw.ok("domains", "add", HOST, ALIAS)
        started = time.monotonic()
        assert "Pebble" in (_issuer(port, ALIAS) or "")  # the first handshake waited
        print(f"on-demand certificate in {time.monotonic() - started:.2f} s")
        state = kw.ok("status", "--json").json()["apps"][0]["instances"][0]["state"]
        assert state == "parked"
        ops = kw.ok("ops", "hello", "--json").json()["operations"]
        certify = [op for op in ops if op["kind"] == "certify"]
        assert len(certify) == 1 and certify[0]["state"] == "succeeded"
        assert any("tls-alpn-01" in (s["detail"] or "") for s in certify[0]["steps"])
        # A name keelway does not serve is refused and orders nothing.
        assert _shown(port, "stranger.test") is None
        assert not (kw.home / "acme" / "orders" / "stranger.test").exists()
        assert len([op for op in kw.ok("ops", "hello", "--json").json()["operations"]
                    if op["kind"] == "certify"]) == 1
        # The challenge file is gone once the order ended.
        assert not list((kw.home / "certs" / ".acme-challenges").rglob("*.pem"))
