"""Certificates by ACME (keelway/issuance.py) from a real ACME server on loopback
(pebble), its HTTP-01 challenge answered by the real router from the store, for a
parked instance's host, waking nothing; the certificate then served over HTTPS."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from keelway import certs, issuance
from keelway.home import Home
from keelway.router.route_table import Handling, RouteEntry
from tests.acme_server import pebble
from tests.router.conftest import RouterProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_parked_hosts_certificate_is_issued_by_http01_and_served(
        tmp_path: Path, start_router: type[RouterProcess]) -> None:
    home = Home(tmp_path / "home")
    home.ensure()
    https_port = free_port()
    router = start_router(extra_argv=("--https-listen", f"127.0.0.1:{https_port}",
                                      "--certs", str(home.certs_dir)))
    router.push(1, {"one.test": RouteEntry(state=Handling.PARKED)})
    with pebble(tmp_path / "pebble", router.port, https_port) as ca:
        authority = issuance.CertificateAuthority(ca.directory, "ops@example.com",
                                                  ca.ca_bundle)
        acme = issuance.client(home, authority)
        chain, key = issuance.issue(home, acme, "one.test")
        # The same account the next time: the key is the home's.
        again = issuance.client(home, authority)
        assert again.net.account is not None and acme.net.account is not None
        assert again.net.account.uri == acme.net.account.uri
        with pytest.raises(issuance.IssuanceError, match="could not validate"):
            issuance.issue(home, acme, "nobody.test")  # the router serves no such host
    info = certs.check_pair("one.test", chain, key)
    assert info.names == ("one.test",)
    certs.lay_down(home, "one.test", chain, key)
    assert list((home.certs_dir / ".acme-challenges").iterdir()) == []  # cleaned up
    assert (home.root / "acme" / "account.json").stat().st_mode & 0o777 == 0o600
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", https_port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="one.test") as tls:
        shown = tls.getpeercert(binary_form=True)
    assert shown == ssl.PEM_cert_to_DER_cert(chain.decode().split("-----END CERTIFICATE-----")[0]
                                             + "-----END CERTIFICATE-----\n")
