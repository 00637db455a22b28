"""HTTPS through the real CLI, daemon and router (issue #21, your own certificates): `up
--https` serves an instance's host and aliases with the certificate `certs import` laid
down, the app told https; a name keelway does not serve, or serves with no
certificate, fails its handshake; bad imports change nothing; HTTPS survives `up`
again, a router restart and a router's death, and `--https off` ends it."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import ssl
import time
from pathlib import Path

import pytest
import trustme

from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, free_port, wait_until

pytestmark = pytest.mark.slow

HOST = "one.test"
ALIAS = "www.one.test"


def _request(port: int, name: str, ca: trustme.CA) -> tuple[bytes, bytes]:
    """GET /, over TLS named `name`; the response bytes and the certificate shown."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=name) as tls:
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := tls.recv(65536):
            reply += chunk
        return reply, tls.getpeercert(binary_form=True) or b""


def _refused(port: int, name: str) -> bool:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=name):
            return False
    except ssl.SSLError:
        return True


def _files(tmp_path: Path, ca: trustme.CA, *names: str,
           days: int | None = None) -> tuple[str, str]:
    ends = (None if days is None else
            datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=days))
    issued = ca.issue_cert(*names, not_after=ends) if ends else ca.issue_cert(*names)
    cert, key = tmp_path / f"{names[0]}.pem", tmp_path / f"{names[0]}.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


def test_an_instance_is_served_over_https_with_its_own_certificate(
        kw: Keelway, tmp_path: Path) -> None:
    ca = trustme.CA()
    port = free_port()
    kw.up("--https", f"127.0.0.1:{port}")
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", HOST)
    kw.ok("domains", "add", HOST, ALIAS)
    assert _refused(port, HOST)  # served, but no certificate yet

    # Bad imports are refused and change nothing.
    cert, key = _files(tmp_path, ca, HOST, ALIAS)
    _other_cert, other_key = _files(tmp_path, ca, "elsewhere.test")
    for args, said in ((("nothere.test", cert, key), "serves no host nothere.test"),
                       ((HOST, cert, other_key), "not this certificate's key"),
                       ((HOST, _other_cert, other_key), "does not cover one.test")):
        done = kw.run("certs", "import", *args)
        assert done.code != 0 and said in done.err, done.err
        assert Path(key).read_text() not in done.err + done.out
    assert kw.ok("certs", "list", "--json").json()["certificates"] == []

    said = kw.ok("certs", "import", HOST, cert, key).out
    assert f"{HOST} is served with the certificate" in said
    kw.ok("certs", "import", ALIAS, cert, key)
    for name in (HOST, ALIAS):
        reply, shown = _request(port, name, ca)
        assert reply.startswith(b"HTTP/1.1 200") and b"hello from" in reply
        assert shown == ssl.PEM_cert_to_DER_cert(Path(cert).read_text())
    assert _refused(port, "evil.test") and _refused(port, "127.0.0.1")
    listed = kw.ok("certs", "list", "--json").json()["certificates"]
    assert sorted(c["name"] for c in listed) == [HOST, ALIAS]
    assert all(c["served"] and c["names"] == [HOST, ALIAS] for c in listed)
    assert Path(key).read_text() not in kw.ok("certs", "list", "--json").out
    assert HOST in kw.ok("certs", "list").out

    # `up` again keeps HTTPS where it was; a router restart and a router's death too.
    kw.ok("down", "--keep-apps")
    kw.up()
    assert _request(port, HOST, ca)[0].startswith(b"HTTP/1.1 200")
    kw.ok("router", "restart")
    assert _request(port, HOST, ca)[0].startswith(b"HTTP/1.1 200")
    router_pid = int((kw.home / "router" / "router.pid").read_text().split()[0])
    os.kill(router_pid, signal.SIGKILL)

    def back() -> bool:
        try:
            return _request(port, HOST, ca)[0].startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    assert wait_until(back, 30, 0.2)

    # `--https off` ends it; plain HTTP goes on.
    kw.ok("down", "--keep-apps")
    kw.up("--https", "off")
    with pytest.raises(OSError):
        _request(port, HOST, ca)
    assert kw.get(HOST, "/")[0] == 200


def test_an_app_that_asks_for_https_is_redirected_there_and_told_hsts(
        kw: Keelway, tmp_path: Path) -> None:
    import http.client

    ca = trustme.CA()
    port = free_port()
    kw.up("--https", f"127.0.0.1:{port}")
    app = hello(tmp_path, "v1")
    with (app / "keelway.toml").open("a") as toml:
        toml.write('[http]\nforce_https = true\nhsts = "1y"\n')
    kw.ok("deploy", "hello", str(app), "--host", HOST)
    kw.ok("certs", "import", HOST, *_files(tmp_path, ca, HOST, days=5))
    # A certificate near its end is said in status, with when.
    (app_view,) = kw.ok("status", "--json").json()["apps"]
    (inst,) = app_view["instances"]
    assert inst["certificates"][HOST] > time.time() + 4 * 86400
    assert f"{HOST}: its certificate expires in 4 days" in kw.ok("status").out
    conn = http.client.HTTPConnection("127.0.0.1", kw.http_port, timeout=10)
    conn.request("GET", "/here?x=1", headers={"Host": HOST})
    response = conn.getresponse()
    assert response.status == 308
    assert response.getheader("Location") == f"https://{HOST}:{port}/here?x=1"
    conn.close()
    reply, _ = _request(port, HOST, ca)
    assert reply.startswith(b"HTTP/1.1 200")
    assert b"\r\nStrict-Transport-Security: max-age=31536000\r\n" in reply
