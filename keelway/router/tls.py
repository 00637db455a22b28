"""The router's HTTPS: which certificate a handshake gets (SNI), from the home's store
of certificates (keelway/certs.py lays it down), built into TLS contexts lazily.

Rules it keeps:
- A handshake gets the certificate of the name it asks for (SNI), and only of a name
  the route table serves (an instance's host or alias). A name keelway does not serve,
  a name it serves with no certificate yet, and a handshake naming nothing fail the
  handshake: no tenant's certificate is ever shown for another's name, nor for an IP.
- Contexts are built on a name's first handshake and kept, at most `capacity` of them,
  the least recently used going first: 10,000 hosts cost their files on disk, not 10,000
  contexts in every worker. A kept context is used while its certificate file is the
  same file (inode and modification time, one stat a handshake): a renewal or an
  import is picked up by the next handshake in every worker, with no message.
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

log: Final = logging.getLogger("keelway.router.tls")

CHAIN: Final = "fullchain.pem"
KEY: Final = "privkey.pem"
CAPACITY: Final = 1000
# Under the store: ACME's HTTP-01 challenges the router answers, one file per token
# holding the host it is for and its key authorization (router/proxy.py).
CHALLENGES: Final = ".acme-challenges"
# A client that opens a connection must finish its handshake within this.
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
        self.served = served
        self.capacity = capacity
        self._contexts: collections.OrderedDict[str, tuple[tuple[int, int], ssl.SSLContext]]
        self._contexts = collections.OrderedDict()
        self.built = 0  # contexts built since start (a measure of the cache's worth)

    def context_for(self, name: str) -> ssl.SSLContext | None:
        """The context for a handshake naming `name`, or None to refuse it."""
        if not self.served(name):
            return None
        where = cert_dir(self.root, name)
        try:
            seen = os.stat(where / CHAIN)
        except OSError:
            self._contexts.pop(name, None)
            return None
        stamp = (seen.st_ino, seen.st_mtime_ns)
        kept = self._contexts.get(name)
        if kept is not None and kept[0] == stamp:
            self._contexts.move_to_end(name)
            return kept[1]
        try:
            context = server_context()
            context.load_cert_chain(where / CHAIN, where / KEY)
        except (OSError, ssl.SSLError) as exc:
            log.warning("the certificate of %s could not be loaded: %s", name, exc)
            self._contexts.pop(name, None)
            return None
        self.built += 1
        self._contexts[name] = (stamp, context)
        self._contexts.move_to_end(name)
        while len(self._contexts) > self.capacity:
            self._contexts.popitem(last=False)
        return context

    def listening_context(self) -> ssl.SSLContext:
        """The context the listener starts every handshake with: no certificate of its
        own; its SNI callback hands over the named one, or fails the handshake."""
        context = server_context()
        context.sni_callback = self._pick
        return context

    def _pick(self, conn: ssl.SSLObject, name: str | None,
              _initial: ssl.SSLContext) -> int | None:
        if name is None:
            return ssl.ALERT_DESCRIPTION_HANDSHAKE_FAILURE  # no name: whose certificate?
        context = self.context_for(name.lower().rstrip("."))
        if context is None:
            return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
        conn.context = context
        return None


def server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(ALPN)
    return context
