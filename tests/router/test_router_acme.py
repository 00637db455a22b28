"""Certificates by ACME (keelway/issuance.py) from a real ACME server on loopback
(pebble), its HTTP-01 challenge answered by the real router from the store, for a
parked instance's host, waking nothing; the certificate then served over HTTPS. And a
TLS-ALPN-01 validation (RFC 8737) by the same server, answered by the router's HTTPS
listener from the challenge file laid where the control plane lays it (the order driven
here by the `acme` library directly, as keelway/issuance.py drives it)."""

from __future__ import annotations

import datetime
import socket
import ssl
from pathlib import Path
from typing import cast

import josepy
import pytest
from acme import challenges, crypto_util, messages
from acme import client as acme_client
from acme import errors as acme_errors
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from keelway import certs, issuance
from keelway.home import Home
from keelway.router.route_table import Handling, RouteEntry
from tests.acme_server import Pebble, pebble
from tests.router.conftest import RouterProcess, Upstream, free_port
from tests.router.tls_parts import tlsalpn01_pem, write_challenge

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


def _order_by_tls_alpn_01(ca: Pebble, certs: Path, name: str) -> messages.OrderResource:
    """A new account orders a certificate for `name`, answering its authorization's
    TLS-ALPN-01 challenge with a challenge file in `certs`; the order as it ended."""
    account = josepy.JWKRSA(key=rsa.generate_private_key(public_exponent=65537,
                                                         key_size=2048))
    net = acme_client.ClientNetwork(account, user_agent="keelway-tests",
                                    verify_ssl=cast(bool, str(ca.ca_bundle)), timeout=20)
    acme = acme_client.ClientV2(acme_client.ClientV2.get_directory(ca.directory, net), net)
    acme.new_account(messages.NewRegistration.from_data(email="ops@example.com",
                                                        terms_of_service_agreed=True))
    key = ec.generate_private_key(ec.SECP256R1())
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    order = acme.new_order(crypto_util.make_csr(key_pem, [name]))
    thumbprint = josepy.json_util.encode_b64jose(account.thumbprint(hash_function=hashes.SHA256))
    for authz in order.authorizations:
        # The library no longer knows TLS-ALPN-01: the CA's own JSON says its token.
        chall = next(c for c in authz.body.challenges
                     if isinstance(c.chall, challenges.UnrecognizedChallenge)
                     and c.chall.jobj.get("type") == "tls-alpn-01")
        token = cast(challenges.UnrecognizedChallenge, chall.chall).jobj["token"]
        write_challenge(certs, name, tlsalpn01_pem(name, f"{token}.{thumbprint}"))
        acme.answer_challenge(chall, challenges.HTTP01Response())  # its body is {}
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=60)
    return acme.poll_and_finalize(order, deadline)


def test_a_parked_hosts_tls_alpn_01_challenge_is_validated_against_the_router(
        tmp_path: Path, start_router: type[RouterProcess], upstream: Upstream) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    https_port = free_port()
    router = start_router(extra_argv=("--https-listen", f"127.0.0.1:{https_port}",
                                      "--certs", str(certs), "--workers", "2"))
    router.push(1, {"alpn.test": RouteEntry(state=Handling.PARKED),
                    "web.test": RouteEntry(state=Handling.SERVING,
                                           upstream=upstream.address)})
    with pebble(tmp_path / "pebble", router.port, https_port) as ca:
        order = _order_by_tls_alpn_01(ca, certs, "alpn.test")
        assert order.fullchain_pem is not None and "BEGIN CERTIFICATE" in order.fullchain_pem
        # A name the router does not serve gets no challenge answered, file or not.
        with pytest.raises(acme_errors.ValidationError, match="tls-alpn-01"):
            _order_by_tls_alpn_01(ca, certs, "nobody.test")
    assert upstream.seen.requests == []
