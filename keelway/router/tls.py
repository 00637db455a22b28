"""The router's HTTPS: which context a handshake is given, from the home's store of
certificates (keelway/certs.py lays it down), built into TLS contexts lazily. The
handshake's ClientHello is read before the handshake begins (keelway/router/
handshakes.py), so the context is chosen with its name (SNI) and protocols (ALPN) known.

Rules it keeps:
- A handshake gets the certificate of the name it asks for (SNI), and only of a name
  the route table serves (an instance's host or alias, in any state). A name keelway
  does not serve, a name it serves with no certificate (unless the router gets one on
  demand, keelway/router/on_demand.py), and a handshake naming nothing are refused: no
  tenant's certificate is ever shown for another's name, nor for an IP.
- Contexts are built on a name's first handshake and kept, at most `capacity` of them,
  the least recently used going first: 10,000 hosts cost their files on disk, not 10,000
  contexts in every worker. A kept context is used while its certificate file is the
  same file (inode and modification time, one stat a handshake): a renewal or an
  import is picked up by the next handshake in every worker, with no message.
- Every context handed out encrypts session tickets with the router's one ticket key
  (keelway/router/tickets.py), so a session resumes on any worker and under any name's
  context: the key is set on each context as it is built, and on every kept one when
  it changes.
- ACME's TLS-ALPN-01 (RFC 8737): a hello offering exactly ["acme-tls/1"] for a name the
  table serves gets the challenge certificate the control plane wrote for that name
  (CHALLENGES/TLS_ALPN/NAME.pem: its key, then its certificate, 0600), and that ALPN
  only; without such a file it is refused. A hello offering anything else never gets
  a challenge certificate, and the answer wakes nothing.
- TLS 1.2 and up, HTTP/1.1 by ALPN (the request path is HTTP/1.1's).
"""

from __future__ import annotations

import collections
import logging
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Final

from keelway.router.tickets import set_keys

log: Final = logging.getLogger("keelway.router.tls")

CHAIN: Final = "fullchain.pem"
KEY: Final = "privkey.pem"
CAPACITY: Final = 1000
CHALLENGES_KEPT: Final = 64  # TLS-ALPN-01 contexts kept (names being validated at once)
# Under the store: ACME's HTTP-01 challenges the router answers, one file per token
# holding the host it is for and its key authorization (router/proxy.py).
CHALLENGES: Final = ".acme-challenges"
# Under CHALLENGES: the TLS-ALPN-01 challenge certificates, one NAME.pem per name.
TLS_ALPN: Final = "tls-alpn-01"
ACME_TLS_ALPN: Final = "acme-tls/1"
# A client that opens a connection must send its hello, and then finish its handshake,
# within this each.
HANDSHAKE_TIMEOUT_S: Final = 10.0
ALPN: Final = ["http/1.1"]


def cert_dir(root: Path, name: str) -> Path:
    """Where the certificate of `name` lives under the store `root`."""
    return root / name


class Certificates:
    """The contexts of the names the router serves over TLS, built from `root`.

    `served(name)` says whether the route table has the name now (an instance's host or
    alias, in any state: a parked instance's name handshakes too).
    """

    def __init__(self, root: Path, served: Callable[[str], bool],
                 capacity: int = CAPACITY) -> None:
        self.root = root
        self._root = str(root)  # paths as strings: pathlib costs more than the stat
        self.served = served
        self.capacity = capacity
        self._contexts: collections.OrderedDict[str, tuple[tuple[int, int], ssl.SSLContext]]
        self._contexts = collections.OrderedDict()
        self.built = 0  # contexts built since start (a measure of the cache's worth)
        self._challenges: dict[str, tuple[tuple[int, int], ssl.SSLContext]] = {}
        self._ticket_keys: bytes | None = None

    def context_for(self, name: str) -> ssl.SSLContext | None:
        """The context for a handshake naming `name`, or None to refuse it."""
        if not self.served(name):
            return None
        try:
            seen = os.stat(f"{self._root}/{name}/{CHAIN}")
        except OSError:
            self._contexts.pop(name, None)
            return None
        stamp = (seen.st_ino, seen.st_mtime_ns)
        kept = self._contexts.get(name)
        if kept is not None and kept[0] == stamp:
            self._contexts.move_to_end(name)
            return kept[1]
        where = cert_dir(self.root, name)
        try:
            context = server_context()
            context.load_cert_chain(where / CHAIN, where / KEY)
        except (OSError, ssl.SSLError) as exc:
            log.warning("the certificate of %s could not be loaded: %s", name, exc)
            self._contexts.pop(name, None)
            return None
        if self._ticket_keys is not None:
            set_keys(context, self._ticket_keys)
        self.built += 1
        self._contexts[name] = (stamp, context)
        self._contexts.move_to_end(name)
        while len(self._contexts) > self.capacity:
            self._contexts.popitem(last=False)
        return context

    def has_certificate(self, name: str) -> bool:
        """Whether the store holds a certificate file for `name` (loadable or not)."""
        return os.path.exists(cert_dir(self.root, name) / CHAIN)

    def challenge_context(self, name: str) -> ssl.SSLContext | None:
        """The context answering a TLS-ALPN-01 validation of `name`, or None to refuse
        it: the table does not serve the name, or no challenge is laid down for it."""
        if not self.served(name):
            return None
        where = self.root / CHALLENGES / TLS_ALPN / f"{name}.pem"
        try:
            seen = os.stat(where)
        except OSError:
            self._challenges.pop(name, None)
            return None
        stamp = (seen.st_ino, seen.st_mtime_ns)
        kept = self._challenges.get(name)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        context = server_context([ACME_TLS_ALPN])
        try:
            context.load_cert_chain(where)  # the key and the certificate, in one file
        except (OSError, ssl.SSLError) as exc:
            log.warning("the TLS-ALPN-01 challenge of %s could not be loaded: %s", name, exc)
            self._challenges.pop(name, None)
            return None
        # Kept only while the file is there: a validation asks a few times, then the
        # control plane removes the file.
        self._challenges[name] = (stamp, context)
        while len(self._challenges) > CHALLENGES_KEPT:
            del self._challenges[next(iter(self._challenges))]
        return context

    def take_ticket_keys(self, keys: bytes) -> bool:
        """Make `keys` the ticket key of every context handed out from now on, kept ones
        included; False where this Python and OpenSSL do not allow it."""
        self._ticket_keys = keys
        shared = True
        for _stamp, context in self._contexts.values():
            shared = set_keys(context, keys) and shared
        return shared


def server_context(alpn: list[str] = ALPN) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(alpn)
    # One TLS 1.3 session ticket per full handshake, as nginx and Go's TLS send, not
    # OpenSSL's two: each costs the handshake an encryption and a record, and a second
    # serves only a client that opens parallel connections from one resumption.
    context.num_tickets = 1
    return context
