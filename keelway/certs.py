"""The home's certificates: what the router's HTTPS serves (keelway/router/tls.py reads
them), laid down by `keelway certs import` (and, later, by ACME issuance, issue #21).

Layout: `certs/NAME` is a symlink to a directory `.NAME.<token>` holding
`fullchain.pem` (the certificate, then its chain) and `privkey.pem` (0600), the
directories 0700 like the rest of the home.

Rules:
- A certificate is replaced whole: the new pair is written and synced in a directory of
  its own, then `NAME` is pointed at it by renaming a new symlink over it. A crash leaves
  the old pair or the new one, never one file of each; the router picks the new one up
  at its next handshake (the chain's file is another file). Directories no link names
  any more are removed by the next change of that name.
- Refused with nothing written: a name keelway does not serve, a certificate that does
  not parse or does not cover the name, a key that is not the certificate's, one
  already expired.
- The key never leaves this module but into its file: not in an error, a log line or an
  answer. What is shown of a certificate is its names, issuer and validity.

Also here, as a leaf every reader can import: the names the ACME CA has not issued for
yet and when each is tried again (`backoffs`), written by keelway/deploy/certify.py.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from keelway import failpoints
from keelway.durable import PRIVATE_FILE_MODE, fsync_dir
from keelway.home import PRIVATE_DIR_MODE, Home

CHAIN = "fullchain.pem"
KEY = "privkey.pem"

failpoints.declare("certs.write.before", "certs.swap.before", "certs.swap.after")


class CertificateError(ValueError):
    """A certificate or key that cannot be served for a name; says what to fix."""


@dataclass(frozen=True)
class CertificateInfo:
    name: str
    names: tuple[str, ...]  # every DNS name it covers
    issuer: str
    not_before: float
    not_after: float

    def view(self) -> dict[str, object]:
        return {"name": self.name, "names": list(self.names), "issuer": self.issuer,
                "not_before": self.not_before, "not_after": self.not_after}


def check_pair(name: str, chain_pem: bytes, key_pem: bytes,
               now: float | None = None) -> CertificateInfo:
    """What the pair is, or CertificateError: it must parse, be the key's, cover `name`
    and not have expired."""
    try:
        leaf = x509.load_pem_x509_certificate(chain_pem)
    except ValueError:
        raise CertificateError("the certificate is not a PEM certificate") from None
    info = _info(name, leaf)
    if not covers(info.names, name):
        raise CertificateError(f"the certificate does not cover {name} (it covers "
                               f"{', '.join(info.names) or 'no DNS name'})")
    if info.not_after <= (now if now is not None else datetime.datetime.now(
            datetime.UTC).timestamp()):
        raise CertificateError("the certificate has expired")
    with tempfile.TemporaryDirectory() as scratch:
        chain, key = Path(scratch) / CHAIN, Path(scratch) / KEY
        chain.write_bytes(chain_pem)
        key.touch(mode=PRIVATE_FILE_MODE)
        key.write_bytes(key_pem)
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(chain, key)
        except ssl.SSLError:
            # Not the key's text, never: only that the two do not go together.
            raise CertificateError("the key is not this certificate's key (or is not a "
                                   "PEM private key without a passphrase)") from None
    return info


def lay_down(home: Home, name: str, chain_pem: bytes, key_pem: bytes) -> None:
    """Make (`chain_pem`, `key_pem`) the certificate the router serves for `name`, whole
    or not at all (the module header); `check_pair` first."""
    root = home.certs_dir
    root.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    failpoints.hit("certs.write.before")
    target = root / f".{name}.{secrets.token_hex(6)}"
    target.mkdir(mode=PRIVATE_DIR_MODE)
    for part, data in ((KEY, key_pem), (CHAIN, chain_pem)):
        fd = os.open(target / part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                     PRIVATE_FILE_MODE)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    fsync_dir(target)
    link = root / f".{name}.link.{secrets.token_hex(6)}"
    os.symlink(target.name, link)
    failpoints.hit("certs.swap.before")
    os.replace(link, root / name)
    fsync_dir(root)
    failpoints.hit("certs.swap.after")
    _sweep(root, name)


def certificates(home: Home) -> list[CertificateInfo]:
    """Every certificate the store holds, by name (unreadable ones left out)."""
    found = []
    root = home.certs_dir
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        try:
            leaf = x509.load_pem_x509_certificate((entry / CHAIN).read_bytes())
        except (OSError, ValueError):
            continue
        found.append(_info(entry.name, leaf))
    return found


# What `validity` read of each certificate file, by its identity: `status` and the
# certificate keeper ask of every host each time, and a file is parsed again only once
# it changed.
_VALIDITY: dict[tuple[str, int, int], tuple[float, float]] = {}


def validity(certs_dir: Path, name: str) -> tuple[float, float] | None:
    """When the certificate HTTPS serves `name` with begins and ends; None: it has none
    (or it does not parse)."""
    chain = certs_dir / name / CHAIN
    try:
        seen = os.stat(chain)
        key = (str(chain), seen.st_ino, seen.st_mtime_ns)
        if key not in _VALIDITY:
            if len(_VALIDITY) > 100_000:
                _VALIDITY.clear()
            leaf = x509.load_pem_x509_certificate(chain.read_bytes())
            _VALIDITY[key] = (leaf.not_valid_before_utc.timestamp(),
                              leaf.not_valid_after_utc.timestamp())
        return _VALIDITY[key]
    except (OSError, ValueError):
        return None


def not_after(certs_dir: Path, name: str) -> float | None:
    """When the certificate HTTPS serves `name` with expires; None: it has none."""
    found = validity(certs_dir, name)
    return None if found is None else found[1]


@dataclass(frozen=True)
class CertBackoff:
    """A name's last failure and when the keeper may try it again."""

    name: str
    error: str
    failures: int
    retry_at: float

    def view(self) -> dict[str, object]:
        return {"name": self.name, "error": self.error, "failures": self.failures,
                "retry_at": self.retry_at}


def backoff_dir(home: Home) -> Path:
    return home.root / "acme" / "backoff"


def backoffs(home: Home) -> dict[str, CertBackoff]:
    """Every name backing off now, by name (one listing, a file per failing name)."""
    found: dict[str, CertBackoff] = {}
    try:
        entries = list(os.scandir(backoff_dir(home)))
    except FileNotFoundError:
        return found
    for entry in entries:
        if not entry.name.endswith(".json"):
            continue
        try:
            kept = json.loads(Path(entry.path).read_text())
            found[kept["name"]] = CertBackoff(kept["name"], kept["error"], int(kept["failures"]),
                                          float(kept["retry_at"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def covers(names: tuple[str, ...], name: str) -> bool:
    """Whether a certificate for `names` serves `name` (a wildcard covers one label)."""
    for pattern in names:
        if pattern == name:
            return True
        if pattern.startswith("*.") and name.count(".") >= 2 and (
                name.split(".", 1)[1] == pattern[2:]):
            return True
    return False


def _info(name: str, leaf: x509.Certificate) -> CertificateInfo:
    try:
        alt = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names = tuple(str(n).lower() for n in alt.value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        names = ()
    issuer = leaf.issuer.get_attributes_for_oid(NameOID.COMMON_NAME)
    return CertificateInfo(
        name, names, str(issuer[0].value) if issuer else leaf.issuer.rfc4514_string(),
        leaf.not_valid_before_utc.timestamp(), leaf.not_valid_after_utc.timestamp())


def _sweep(root: Path, name: str) -> None:
    """Remove `name`'s directories and links the link no longer names (by their exact
    shape: `.a.test.` begins another name's too)."""
    current = os.readlink(root / name) if (root / name).is_symlink() else None
    ours = re.compile(rf"\.{re.escape(name)}\.(link\.)?[0-9a-f]{{12}}")
    for entry in root.iterdir():
        if ours.fullmatch(entry.name) and entry.name != current:
            if entry.is_symlink() or entry.is_file():
                entry.unlink(missing_ok=True)
            else:
                shutil.rmtree(entry, ignore_errors=True)
