"""Certificates by ACME (RFC 8555), with certbot's `acme` and `josepy`, never JWS by hand
(issue #21): the home's account, and one name's order carried through its phases, each
resumable from what the last one left on disk, so the journaled operation that drives
them (keelway/deploy/certify.py) survives a crash at any step without ordering twice.

An order's phases, for one name:
- `place_order`: the order's key (new ECDSA P-256 per name and order) and then the
  order at the CA, its URL kept in `acme/orders/NAME/order.json`. An order found there
  (a crash came after it was placed) is used again while the CA still has it pending or
  ready; one the CA has ended (invalid, expired, gone) is discarded and another placed.
- `answer_challenges`: each authorization not yet valid gets its challenge's response
  where the router answers it, and the CA is told to validate it:
  HTTP-01 as `certs/.acme-challenges/TOKEN` (the host it is for, then the key
  authorization; router/proxy.py answers it for that host only, a parked instance's
  too, waking nothing), or TLS-ALPN-01 (RFC 8737) as
  `certs/.acme-challenges/tls-alpn-01/NAME.pem` (the challenge key, then its
  self-signed certificate carrying the key authorization's digest; router/handshakes.py
  serves it to a hello that offers only `acme-tls/1`). Both are 0600.
- `finish_order`: the authorizations polled until valid, the order finalized with the
  key's CSR, and the certificate fetched into `acme/orders/NAME/fullchain.pem`. Its
  challenge files are removed, whatever the outcome.
- `take`: what the install lays down (keelway/certs.py `lay_down`); `discard` then
  removes the order's directory.

The one window a crash can cost an order in: between the CA's answer to a new order and
`order.json` on disk. Nothing else places one. (Let's Encrypt hands back an account's
pending order for the same names rather than a new one, which closes it there too.)

Rules it keeps:
- One account key per home (`acme/account.json`, 0600 in a 0700 directory), made once and
  kept: a CA knows the home by it. Registering again with it finds the same account.
- Keys leave this module only into their files (0600) and to keelway/certs.py.
- The CA's `Retry-After` on any answer is kept (`IssuanceError.retry_after_s`), so a
  failure backs off at least as long as the CA asks (keelway/deploy/certify.py).
- The library is blocking: callers run these in a thread.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

import requests
from acme import challenges, crypto_util, errors, messages
from acme import client as acme_client
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID
from josepy.jwk import JWKRSA

from keelway.durable import PRIVATE_FILE_MODE, fsync_dir, write_atomic
from keelway.home import PRIVATE_DIR_MODE, Home
from keelway.router.tls import CHALLENGES

LETS_ENCRYPT: Final = "https://acme-v02.api.letsencrypt.org/directory"
LETS_ENCRYPT_STAGING: Final = "https://acme-staging-v02.api.letsencrypt.org/directory"
USER_AGENT: Final = "keelway"
ORDER_TIMEOUT_S: Final = 90.0
HTTP01: Final = "http-01"
TLSALPN01: Final = "tls-alpn-01"
CHALLENGE_TYPES: Final = ("auto", HTTP01, TLSALPN01)
# Where the router finds a TLS-ALPN-01 challenge's key and certificate, under the store.
TLSALPN_DIR: Final = "tls-alpn-01"
# RFC 8737's id-pe-acmeIdentifier: the SHA-256 of the key authorization, critical.
ACME_IDENTIFIER: Final = x509.ObjectIdentifier("1.3.6.1.5.5.7.1.31")
_POLL_S: Final = 0.2
# Special-use names (RFC 2606, 6761, 6762, 8375) no public CA ever issues for: asking
# Let's Encrypt for one is a failed order that counts toward its rate limits. A private
# CA (`--acme-directory`) may issue for any name it can reach.
_NOT_PUBLIC: Final = ("localhost", "test", "example", "invalid", "local", "internal",
                      "lan", "home.arpa")


class IssuanceError(Exception):
    """The CA refused or failed an order, or could not be reached; the message says what
    it said. `retry_after_s`: how long it asked to be left alone, if it said."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class CertificateAuthority:
    """Where certificates are asked for: its directory URL, the contact it is given, the
    roots to trust its API with (None: the system's) and the challenge to answer
    (`auto`: HTTP-01 unless the router serves HTTPS on 443 and plain HTTP not on 80)."""

    directory: str = LETS_ENCRYPT
    email: str | None = None
    ca_bundle: Path | None = None
    challenge: str = "auto"

    def orders_for(self, name: str) -> bool:
        """Whether this CA is ever asked for `name` (see `_NOT_PUBLIC`)."""
        if self.directory not in (LETS_ENCRYPT, LETS_ENCRYPT_STAGING):
            return True
        return not any(name == tld or name.endswith("." + tld) for tld in _NOT_PUBLIC)

    def view(self) -> dict[str, object]:
        return {"directory": self.directory, "email": self.email,
                "ca_bundle": str(self.ca_bundle) if self.ca_bundle else None,
                "challenge": self.challenge}


# -- the CA the home uses, kept across `keelway up`s ------------------------------------


def settings_path(home: Home) -> Path:
    return home.root / "acme" / "ca.json"


def saved_authority(home: Home) -> CertificateAuthority | None:
    """The CA `keelway up` last set (None: ACME is off); Let's Encrypt when never set."""
    try:
        kept = json.loads(settings_path(home).read_text())
    except FileNotFoundError:
        return CertificateAuthority()
    except (OSError, ValueError):
        return CertificateAuthority()
    if not kept.get("directory"):
        return None
    bundle = kept.get("ca_bundle")
    return CertificateAuthority(str(kept["directory"]), kept.get("email"),
                                Path(bundle) if bundle else None,
                                str(kept.get("challenge") or "auto"))


def save_authority(home: Home, ca: CertificateAuthority | None) -> None:
    where = settings_path(home)
    where.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    kept = {"directory": None} if ca is None else ca.view()
    write_atomic(where, json.dumps(kept).encode(), PRIVATE_FILE_MODE)


# -- the account -------------------------------------------------------------------------


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


class _Network(acme_client.ClientNetwork):
    """The library's network, keeping the last answer's Retry-After: its errors do not
    carry it, and a rate limit's is what the back-off must honour."""

    retry_after_s: float | None = None

    def _send_request(self, method: str, url: str, *args: Any,
                      **kwargs: Any) -> requests.Response:
        response = super()._send_request(method, url, *args, **kwargs)
        said = response.headers.get("Retry-After")
        self.retry_after_s = None
        if said is not None:
            try:
                self.retry_after_s = max(0.0, float(said))
            except ValueError:
                self.retry_after_s = None  # an HTTP date: the back-off's own rule stands
        return response


def client(home: Home, ca: CertificateAuthority) -> acme_client.ClientV2:
    """A client signed in as the home's account (registered with the CA if it is not)."""
    key = account_key(home)
    # requests takes a bundle's path where the library's hint says bool.
    verify = cast(bool, str(ca.ca_bundle)) if ca.ca_bundle is not None else True
    net = _Network(key, user_agent=USER_AGENT, verify_ssl=verify, timeout=30)
    try:
        directory = acme_client.ClientV2.get_directory(ca.directory, net)
        acme = acme_client.ClientV2(directory, net=net)
        registration = messages.NewRegistration.from_data(email=ca.email,
                                                          terms_of_service_agreed=True)
        try:
            acme.new_account(registration)
        except errors.ConflictError as exc:
            # Registered before with this key: that account, as the CA keeps it.
            net.account = acme.query_registration(messages.RegistrationResource(
                uri=exc.location, body=messages.Registration()))
    except Exception as exc:  # the library's and requests' errors alike: the CA is away
        raise IssuanceError(f"the CA at {ca.directory}: {_said(exc)}",
                            net.retry_after_s) from exc
    return acme


# -- one name's order ----------------------------------------------------------------------


def order_dir(home: Home, name: str) -> Path:
    return home.root / "acme" / "orders" / name


def order_under_way(home: Home, name: str) -> str | None:
    """The URL of the order `name` has at the CA, if one was placed and not yet ended."""
    try:
        return str(json.loads((order_dir(home, name) / "order.json").read_text())["url"])
    except (OSError, ValueError, KeyError):
        return None


def place_order(home: Home, acme: acme_client.ClientV2, ca: CertificateAuthority,
                name: str) -> str:
    """The order for `name` placed, or the one placed before found again: says which."""
    where = order_dir(home, name)
    where.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    kept = _read_json(where / "order.json")
    if kept is not None and kept.get("directory") == ca.directory:
        try:
            order = _fetch_order(acme, str(kept["url"]))
        except IssuanceError:
            order = None
        if order is not None and order.status in (messages.STATUS_PENDING,
                                                  messages.STATUS_READY,
                                                  messages.STATUS_PROCESSING,
                                                  messages.STATUS_VALID):
            return f"resumed order {kept['url']}"
    for stale in ("order.json", "fullchain.pem"):
        (where / stale).unlink(missing_ok=True)
    key_pem = _order_key(where)
    try:
        order_r = acme.new_order(crypto_util.make_csr(key_pem, [name]))
    except Exception as exc:
        raise IssuanceError(f"the CA refused an order for {name}: {_said(exc)}",
                            _retry_after(acme)) from exc
    write_atomic(where / "order.json", json.dumps(
        {"url": order_r.uri, "directory": ca.directory, "name": name}).encode(),
        PRIVATE_FILE_MODE)
    return f"placed order {order_r.uri}"


def answer_challenges(home: Home, acme: acme_client.ClientV2, name: str,
                      challenge: str) -> str:
    """Each authorization of `name`'s order not yet valid answered by `challenge`
    (HTTP01 or TLSALPN01), its response where the router serves it; says what it did."""
    url = _order_url(home, name)
    order = _fetch_order(acme, url)
    answered = []
    try:
        for authz_url in order.authorizations:
            authz = _fetch_authorization(acme, authz_url)
            status = authz.body.status
            if status == messages.STATUS_VALID:
                continue  # the CA remembers the name validated for this account
            if status != messages.STATUS_PENDING:
                raise IssuanceError(f"the CA ended the authorization of {name} as {status}")
            chall = next((c for c in authz.body.challenges if _typ(c) == challenge), None)
            if chall is None:
                offered = ", ".join(sorted(_typ(c) for c in authz.body.challenges))
                raise IssuanceError(f"the CA offers no {challenge} challenge for {name} "
                                    f"(it offers {offered})")
            token = _token(chall)
            key_authorization = f"{token}.{_thumbprint(acme)}"
            host = str(authz.body.identifier.value)
            if challenge == HTTP01:
                _write_http01(home, host, token, key_authorization)
            else:
                _write_tlsalpn01(home, host, key_authorization)
            if chall.status == messages.STATUS_PENDING:
                acme.answer_challenge(chall, challenges.HTTP01Response())
            answered.append(f"{challenge} for {host}")
    except IssuanceError:
        raise
    except Exception as exc:
        raise IssuanceError(f"answering {name}'s challenge: {_said(exc)}",
                            _retry_after(acme)) from exc
    return ("answered " + ", ".join(answered)) if answered else "already validated"


def finish_order(home: Home, acme: acme_client.ClientV2, name: str,
                 timeout_s: float = ORDER_TIMEOUT_S) -> str:
    """`name`'s order seen valid (its authorizations validated, finalized with the
    order's key) and its certificate kept beside it; its challenge files removed,
    whatever the outcome."""
    where = order_dir(home, name)
    deadline = time.monotonic() + timeout_s
    try:
        if (where / "fullchain.pem").exists():
            return "certificate fetched before"
        url = _order_url(home, name)
        order = _fetch_order(acme, url)
        for authz_url in order.authorizations:
            while True:
                authz = _fetch_authorization(acme, authz_url)
                if authz.body.status == messages.STATUS_VALID:
                    break
                if authz.body.status != messages.STATUS_PENDING:
                    said = "; ".join(str(c.error) for c in authz.body.challenges
                                     if c.error is not None) or authz.body.status
                    # The order can never be valid now: the next try places another.
                    _forget_order(where)
                    raise IssuanceError(f"the CA could not validate {name}: {said}")
                _wait(acme, deadline, name, timeout_s)
        finalized = False
        while True:
            order = _fetch_order(acme, url)
            if order.status == messages.STATUS_VALID and order.certificate:
                chain = acme._post_as_get(order.certificate).text
                write_atomic(where / "fullchain.pem", chain.encode(), PRIVATE_FILE_MODE)
                return f"certificate fetched ({_expiry(chain.encode())})"
            if order.status == messages.STATUS_READY and not finalized:
                csr = crypto_util.make_csr((where / "key.pem").read_bytes(), [name])
                acme._post(order.finalize,
                           messages.CertificateRequest(csr=x509.load_pem_x509_csr(csr)))
                finalized = True
                continue
            if order.status == messages.STATUS_INVALID:
                _forget_order(where)
                raise IssuanceError(f"the CA ended the order for {name}: "
                                    f"{order.error or 'invalid'}")
            _wait(acme, deadline, name, timeout_s)
    except IssuanceError:
        raise
    except Exception as exc:
        raise IssuanceError(f"finishing the order for {name}: {_said(exc)}",
                            _retry_after(acme)) from exc
    finally:
        remove_challenges(home, name)


def take(home: Home, name: str) -> tuple[bytes, bytes] | None:
    """The certificate `finish_order` fetched for `name` and its key, if it did."""
    where = order_dir(home, name)
    try:
        return (where / "fullchain.pem").read_bytes(), (where / "key.pem").read_bytes()
    except FileNotFoundError:
        return None


def discard(home: Home, name: str) -> None:
    """`name`'s order forgotten here (installed, or given up) and its challenges gone."""
    remove_challenges(home, name)
    where = order_dir(home, name)
    if where.exists():
        shutil.rmtree(where)
        fsync_dir(where.parent)


def remove_challenges(home: Home, name: str) -> None:
    """Every challenge response the router would serve for `name`."""
    root = home.certs_dir / CHALLENGES
    (root / TLSALPN_DIR / f"{name}.pem").unlink(missing_ok=True)
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return
    for entry in entries:
        if not entry.is_file():
            continue
        try:
            with open(entry.path, "rb") as f:
                first = f.readline().strip().decode(errors="replace")
        except OSError:
            continue
        if first == name:
            Path(entry.path).unlink(missing_ok=True)


def issue(home: Home, acme: acme_client.ClientV2, name: str,
          timeout_s: float = ORDER_TIMEOUT_S, challenge: str = HTTP01,
          ca: CertificateAuthority | None = None) -> tuple[bytes, bytes]:
    """A certificate for `name` in one go: (its chain, its key), both PEM. The phases
    one after another, the order forgotten once fetched (the operation's path installs
    before it forgets, keelway/deploy/certify.py)."""
    authority = ca if ca is not None else CertificateAuthority(directory="(this client's)")
    try:
        place_order(home, acme, authority, name)
        answer_challenges(home, acme, name, challenge)
        finish_order(home, acme, name, timeout_s)
        got = take(home, name)
        assert got is not None
        return got
    finally:
        discard(home, name)


# -- helpers -------------------------------------------------------------------------------


def _order_key(where: Path) -> bytes:
    path = where / "key.pem"
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    write_atomic(path, pem, PRIVATE_FILE_MODE)
    return pem


def _order_url(home: Home, name: str) -> str:
    url = order_under_way(home, name)
    if url is None:
        raise IssuanceError(f"{name} has no order under way (a crash before it was placed); "
                            "the next try places one")
    return url


def _forget_order(where: Path) -> None:
    for part in ("order.json", "fullchain.pem"):
        (where / part).unlink(missing_ok=True)


def _fetch_order(acme: acme_client.ClientV2, url: str) -> messages.Order:
    try:
        response = acme._post_as_get(url)  # the library has no public read
        found: messages.Order = messages.Order.from_json(response.json())
        return found
    except Exception as exc:
        raise IssuanceError(f"reading the order {url}: {_said(exc)}",
                            _retry_after(acme)) from exc


def _fetch_authorization(acme: acme_client.ClientV2,
                         url: str) -> messages.AuthorizationResource:
    response = acme._post_as_get(url)
    return messages.AuthorizationResource(
        body=messages.Authorization.from_json(response.json()), uri=url)


def _wait(acme: acme_client.ClientV2, deadline: float, name: str, timeout_s: float) -> None:
    asked = _retry_after(acme)
    pause = min(max(_POLL_S, asked or 0.0), 5.0)
    if time.monotonic() + pause > deadline:
        raise IssuanceError(f"the order for {name} was not done in {timeout_s:g}s")
    time.sleep(pause)


def _typ(chall: messages.ChallengeBody) -> str:
    inner = chall.chall
    if isinstance(inner, challenges.UnrecognizedChallenge):
        return str(inner.jobj.get("type"))  # TLS-ALPN-01: the library no longer knows it
    return str(inner.typ)


def _token(chall: messages.ChallengeBody) -> str:
    inner = chall.chall
    if isinstance(inner, challenges.UnrecognizedChallenge):
        return str(inner.jobj["token"])  # already base64url, as the CA sent it
    return str(inner.encode("token"))


def _retry_after(acme: acme_client.ClientV2) -> float | None:
    net = acme.net
    return net.retry_after_s if isinstance(net, _Network) else None


def _thumbprint(acme: acme_client.ClientV2) -> str:
    from josepy.json_util import encode_b64jose

    key = acme.net.key
    assert key is not None
    return str(encode_b64jose(key.thumbprint(hash_function=hashes.SHA256)))


def _write_http01(home: Home, host: str, token: str, key_authorization: str) -> None:
    root = home.certs_dir / CHALLENGES
    root.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    write_atomic(root / token, f"{host}\n{key_authorization}\n".encode(), PRIVATE_FILE_MODE)


def tlsalpn01_pem(host: str, key_authorization: str) -> bytes:
    """RFC 8737's challenge certificate for `host`, after its key: self-signed, naming
    `host` alone, with the key authorization's digest in a critical acmeIdentifier."""
    key = ec.generate_private_key(ec.SECP256R1())
    digest = hashlib.sha256(key_authorization.encode()).digest()
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            # DER: an OCTET STRING of the 32-byte digest.
            .add_extension(x509.UnrecognizedExtension(ACME_IDENTIFIER,
                                                      b"\x04\x20" + digest), critical=True)
            .sign(key, hashes.SHA256()))
    return (key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
            + cert.public_bytes(serialization.Encoding.PEM))


def _write_tlsalpn01(home: Home, host: str, key_authorization: str) -> None:
    root = home.certs_dir / CHALLENGES / TLSALPN_DIR
    root.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    write_atomic(root / f"{host}.pem", tlsalpn01_pem(host, key_authorization),
                 PRIVATE_FILE_MODE)


def _expiry(chain_pem: bytes) -> str:
    leaf = x509.load_pem_x509_certificate(chain_pem)
    return f"valid until {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _said(exc: Exception) -> str:
    """What an error of the library or of requests says, one line, never a key."""
    if isinstance(exc, messages.Error):
        return exc.detail or exc.description or str(exc.typ)
    if isinstance(exc, requests.RequestException):
        return f"cannot reach it ({type(exc).__name__})"
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
