"""The certify operation's plan and rules without a CA (keelway/deploy/certify.py,
keelway/issuance.py): when a certificate is renewed, how failures back off (the CA's
real HTTP answer on loopback, included), which challenge `auto` takes, which names are
never sent to a public CA, the TLS-ALPN-01 challenge certificate, and the plan."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from keelway import certs, issuance
from keelway.deploy.certify import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    CertifyRequest,
    challenge_for,
    due,
    next_delay,
    plan_certify,
)
from keelway.deploy.errors import NotFoundError
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.testing.memory_store import MemoryStore


def test_a_certificate_is_renewed_two_thirds_through_its_life() -> None:
    assert not due(0, 90, 59.9)
    assert due(0, 90, 60)
    assert due(0, 90, 100)  # expired: long due


def test_failures_back_off_doubling_to_a_day_never_under_the_cas_ask() -> None:
    assert next_delay(1, None) == BACKOFF_FIRST_S
    assert next_delay(2, None) == 2 * BACKOFF_FIRST_S
    assert next_delay(40, None) == BACKOFF_MAX_S
    assert next_delay(1, 3600) == 3600  # a rate limit's Retry-After wins
    assert next_delay(5, 1) == 16 * BACKOFF_FIRST_S


def test_auto_takes_tls_alpn_only_where_https_alone_is_on_its_port() -> None:
    ca = issuance.CertificateAuthority()
    assert challenge_for(ca, 80, 443) == issuance.HTTP01
    assert challenge_for(ca, 8080, 443) == issuance.TLSALPN01
    assert challenge_for(ca, 8080, 8443) == issuance.HTTP01
    chosen = issuance.CertificateAuthority(challenge=issuance.TLSALPN01)
    assert challenge_for(chosen, 80, 443) == issuance.TLSALPN01


def test_special_use_names_are_never_sent_to_lets_encrypt() -> None:
    public = issuance.CertificateAuthority()
    for name in ("demo.localhost", "one.test", "a.example", "x.invalid", "box.local",
                 "db.internal", "nas.lan", "printer.home.arpa", "localhost"):
        assert not public.orders_for(name), name
    assert public.orders_for("shop.example.com") and public.orders_for("testing.dev")
    private = issuance.CertificateAuthority("https://127.0.0.1:14000/dir")
    assert private.orders_for("one.test")


def test_the_ca_setting_is_kept_and_off_is_kept_too(tmp_path: Path) -> None:
    home = Home(tmp_path / "h")
    home.ensure()
    assert issuance.saved_authority(home) == issuance.CertificateAuthority()
    chosen = issuance.CertificateAuthority("https://ca.test/dir", "ops@example.com",
                                           tmp_path / "root.pem", issuance.TLSALPN01)
    issuance.save_authority(home, chosen)
    assert issuance.saved_authority(home) == chosen
    assert issuance.settings_path(home).stat().st_mode & 0o777 == 0o600
    issuance.save_authority(home, None)
    assert issuance.saved_authority(home) is None


def test_backoffs_are_read_from_their_files(tmp_path: Path) -> None:
    home = Home(tmp_path / "h")
    home.ensure()
    assert certs.backoffs(home) == {}
    where = certs.backoff_dir(home)
    where.mkdir(parents=True)
    (where / "one.test.json").write_text(
        '{"name": "one.test", "error": "the CA said no", "failures": 2, "retry_at": 5}')
    (where / "bad.json").write_text("{not json")
    found = certs.backoffs(home)
    assert list(found) == ["one.test"] and found["one.test"].failures == 2


def test_the_tls_alpn_challenge_certificate_carries_the_digest(tmp_path: Path) -> None:
    pem = issuance.tlsalpn01_pem("one.test", "token.thumb")
    key = serialization.load_pem_private_key(pem, None)
    cert = x509.load_pem_x509_certificate(pem[pem.index(b"-----BEGIN CERTIFICATE"):])
    assert cert.public_key() == key.public_key()
    ext = cert.extensions.get_extension_for_oid(issuance.ACME_IDENTIFIER)
    assert ext.critical
    assert isinstance(ext.value, x509.UnrecognizedExtension)
    assert ext.value.value == b"\x04\x20" + hashlib.sha256(b"token.thumb").digest()
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert names.value.get_values_for_type(x509.DNSName) == ["one.test"]


class _RateLimited(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = (b'{"type": "urn:ietf:params:acme:error:rateLimited", '
                b'"detail": "too many new orders recently"}')
        self.send_response(429)
        self.send_header("Content-Type", "application/problem+json")
        self.send_header("Retry-After", "3600")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def rate_limited() -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _RateLimited)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/dir"
    finally:
        server.shutdown()
        server.server_close()


def test_a_rate_limit_says_what_the_ca_said_and_how_long_to_wait(
        tmp_path: Path, rate_limited: str) -> None:
    home = Home(tmp_path / "h")
    home.ensure()
    with pytest.raises(issuance.IssuanceError) as refused:
        issuance.client(home, issuance.CertificateAuthority(rate_limited))
    assert "too many new orders recently" in str(refused.value)
    assert refused.value.retry_after_s == 3600
    assert next_delay(1, refused.value.retry_after_s) == 3600


def test_the_plan_is_four_steps_with_failpoints_around_each() -> None:
    store = MemoryStore()
    with pytest.raises(NotFoundError):
        plan_certify(store, CertifyRequest("nobody.test", "nobody.test", "ca", "http-01"))
    store.apps.create_app("hello")
    store.instances.add_instances("hello", ["one.test"], {})
    plan = plan_certify(store, CertifyRequest("one.test", "www.one.test",
                                              "https://ca.test/dir", "http-01"))
    assert plan.kind is OpKind.CERTIFY and OpKind.CERTIFY.one_off
    assert [s.kind for s in plan.steps] == [StepKind.ORDER, StepKind.AUTHORIZE,
                                            StepKind.FINALIZE, StepKind.INSTALL]
    assert all(s.before and s.after for s in plan.steps)
    assert "www.one.test" in plan.lines()[1]
