"""Certificates by ACME (RFC 8555), with certbot's `acme` and `josepy`, never JWS by hand
(issue #21): the home's account, and one name's certificate by HTTP-01, which the router
answers from the certificate store (keelway/router/proxy.py), a parked instance's too.

This is the client's part. The journaled operation that carries an issuance through a
crash without ordering twice, renewal at two thirds of a certificate's life, on-demand
issuance and TLS-ALPN-01 build on it (issue #21's next part); what it returns goes into
the store by keelway/certs.py `lay_down`.

Rules it keeps:
- One account key per home (`acme/account.json`, 0600 in a 0700 directory), made once
  and kept: a CA knows the home by it. Registering again with it finds the same account.
- A certificate's key is new for each order (ECDSA P-256) and leaves this module only
  with its certificate, for the store.
- A challenge file names the host it is for, so the router answers it for that host
  only; each is removed once its order ended, whatever the outcome.
- The library is blocking: callers run these in a thread.
- Its failpoints come with the operation that journals it: nothing here writes what a
  crash could leave half done but the challenge files, which an order's end removes.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from acme import challenges, crypto_util, errors, messages
from acme import client as acme_client
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from josepy.jwk import JWKRSA

from keelway.durable import PRIVATE_FILE_MODE, write_atomic
from keelway.home import PRIVATE_DIR_MODE, Home
from keelway.router.tls import CHALLENGES

LETS_ENCRYPT = "https://acme-v02.api.letsencrypt.org/directory"
USER_AGENT = "keelway"
ORDER_TIMEOUT_S = 90.0


class IssuanceError(Exception):
    """The CA refused or failed an order; the message says what it said."""


@dataclass(frozen=True)
class CertificateAuthority:
    """Where certificates are asked for: its directory URL, the contact it is given,
    and the roots to trust its API with (None: the system's)."""

    directory: str = LETS_ENCRYPT
    email: str | None = None
    ca_bundle: Path | None = None


def account_key(home: Home) -> JWKRSA:
    """The home's account key, made on first use."""
    where = home.root / "acme"
    where.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    path = where / "account.json"
    try:
        loaded = JWKRSA.json_loads(path.read_text())
        assert isinstance(loaded, JWKRSA)
        return loaded
    except FileNotFoundError:
        pass
    key = JWKRSA(key=rsa.generate_private_key(public_exponent=65537, key_size=2048))
    write_atomic(path, key.json_dumps().encode(), PRIVATE_FILE_MODE)
    return key


def client(home: Home, ca: CertificateAuthority) -> acme_client.ClientV2:
    """A client signed in as the home's account (registered with the CA if it is not)."""
    key = account_key(home)
    # requests takes a bundle's path where the library's hint says bool.
    verify = cast(bool, str(ca.ca_bundle)) if ca.ca_bundle is not None else True
    net = acme_client.ClientNetwork(key, user_agent=USER_AGENT, verify_ssl=verify)
    try:
        directory = acme_client.ClientV2.get_directory(ca.directory, net)
    except Exception as exc:  # the library's and requests' errors alike: the CA is away
        raise IssuanceError(f"the CA's directory {ca.directory}: {exc}") from exc
    acme = acme_client.ClientV2(directory, net=net)
    registration = messages.NewRegistration.from_data(email=ca.email,
                                                      terms_of_service_agreed=True)
    try:
        acme.new_account(registration)
    except errors.ConflictError as exc:
        # Registered before with this key: that account, as the CA keeps it.
        net.account = acme.query_registration(messages.RegistrationResource(
            uri=exc.location, body=messages.Registration()))
    return acme


def issue(home: Home, acme: acme_client.ClientV2, name: str,
          timeout_s: float = ORDER_TIMEOUT_S) -> tuple[bytes, bytes]:
    """A certificate for `name` by HTTP-01: (its chain, its key), both PEM.
    IssuanceError when the CA refuses it or it is not done within `timeout_s`."""
    key = ec.generate_private_key(ec.SECP256R1())
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    challenge_dir = home.certs_dir / CHALLENGES
    challenge_dir.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    written: list[Path] = []
    try:
        order = acme.new_order(crypto_util.make_csr(key_pem, [name]))
        for authorization in order.authorizations:
            if authorization.body.status == messages.STATUS_VALID:
                continue  # the CA remembers this name validated for this account
            http01 = next((c for c in authorization.body.challenges
                           if isinstance(c.chall, challenges.HTTP01)), None)
            if http01 is None:
                raise IssuanceError(f"the CA offers no HTTP-01 challenge for {name}")
            response, validation = http01.response_and_validation(acme.net.key)
            token = http01.chall.encode("token")
            path = challenge_dir / token
            write_atomic(path, f"{authorization.body.identifier.value}\n{validation}\n"
                         .encode(), PRIVATE_FILE_MODE)
            written.append(path)
            acme.answer_challenge(http01, response)
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
        done = acme.poll_and_finalize(order, deadline=deadline)
    except IssuanceError:
        raise
    except errors.ValidationError as exc:
        said = "; ".join(str(a.body.challenges[0].error or a.body.status)
                         for a in exc.failed_authzrs)
        raise IssuanceError(f"the CA could not validate {name}: {said}") from exc
    except errors.TimeoutError as exc:
        raise IssuanceError(f"the order for {name} was not done in {timeout_s:g}s") from exc
    except Exception as exc:  # the library's and requests' errors alike
        raise IssuanceError(f"the CA refused the order for {name}: {exc}") from exc
    finally:
        for path in written:
            path.unlink(missing_ok=True)
    return done.fullchain_pem.encode(), key_pem
