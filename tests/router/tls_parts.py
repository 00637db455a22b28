"""Real parts for the router's HTTPS tests: a store of certificates from a throwaway CA
(trustme), TLS-ALPN-01 challenge files as the control plane writes them (RFC 8737: a
self-signed certificate for the name with the critical acmeIdentifier extension, its
key first, 0600), and a stand-in for the control plane's API socket that answers
certificate demands by laying a certificate down, as the control plane would after
its order (it stands in for the control plane, not for the CA)."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ACME_IDENTIFIER = x509.ObjectIdentifier("1.3.6.1.5.5.7.1.31")


def lay_down(root: Path, ca: trustme.CA, *names: str) -> None:
    """A certificate for each name as keelway's store keeps them (the chain last, as
    keelway/certs.py renames it in: the router looks for the chain)."""
    for name in names:
        issued = ca.issue_cert(name)
        where = root / name
        where.mkdir(parents=True, exist_ok=True)
        issued.private_key_pem.write_to_path(str(where / "privkey.pem"))
        issued.cert_chain_pems[0].write_to_path(str(where / ".fullchain.pem"))
        (where / ".fullchain.pem").replace(where / "fullchain.pem")


def der_of(root: Path, name: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert((root / name / "fullchain.pem").read_text())


def tlsalpn01_pem(name: str, key_authorization: str) -> bytes:
    """RFC 8737's challenge certificate for `name`: its key PEM, then the certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    digest = hashlib.sha256(key_authorization.encode()).digest()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            # The extension's value is the DER OCTET STRING of the digest.
            .add_extension(x509.UnrecognizedExtension(ACME_IDENTIFIER, b"\x04\x20" + digest),
                           critical=True)
            .sign(key, hashes.SHA256()))
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
            + cert.public_bytes(serialization.Encoding.PEM))


def write_challenge(certs: Path, name: str, pem: bytes) -> Path:
    """Where and how the control plane leaves a TLS-ALPN-01 challenge for the router."""
    where = certs / ".acme-challenges" / "tls-alpn-01"
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = where / f"{name}.pem"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    return path


def shown_certificate(port: int, name: str | None, alpn: list[str] | None = None,
                      timeout_s: float = 10.0) -> tuple[bytes, str | None]:
    """A handshake naming `name` (None: no SNI) offering `alpn`, trusting anything: the
    DER of the certificate shown and the protocol chosen. Raises SSLError (or an
    OSError) when the router refuses it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as raw, \
            context.wrap_socket(raw, server_hostname=name) as tls:
        return tls.getpeercert(binary_form=True) or b"", tls.selected_alpn_protocol()


@dataclass
class FakeControlPlane:
    """Answers `POST /v1/certs/NAME/demand` on a unix socket: after `delay_s`,
    lays NAME's certificate down from `ca` into `certs` unless one is there already (a
    demand is idempotent: each router worker asks for itself) and answers `status`
    (only when it is 2xx does it lay one down). Records every request's path."""

    path: Path
    certs: Path
    ca: trustme.CA
    status: int = 200
    delay_s: float = 0.0
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def demands(self) -> list[str]:
        with self.lock:
            return list(self.requests)


def _handler(plane: FakeControlPlane) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def address_string(self) -> str:
            return "unix"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with plane.lock:
                plane.requests.append(self.path)
            parts = self.path.split("/")
            time.sleep(plane.delay_s)
            if (len(parts) == 5 and parts[:3] == ["", "v1", "certs"]
                    and parts[4] == "demand" and 200 <= plane.status < 300):
                with plane.lock:
                    if not (plane.certs / parts[3] / "fullchain.pem").exists():
                        lay_down(plane.certs, plane.ca, parts[3])
            body = b"{}"
            with contextlib.suppress(OSError):  # a router that gave up and left
                self.send_response(plane.status)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

    return Handler


@contextmanager
def fake_control_plane(where: Path, certs: Path, ca: trustme.CA, status: int = 200,
                       delay_s: float = 0.0) -> Iterator[FakeControlPlane]:
    plane = FakeControlPlane(where, certs, ca, status, delay_s)
    server = socketserver.ThreadingUnixStreamServer(str(where), _handler(plane))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield plane
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        where.unlink(missing_ok=True)
