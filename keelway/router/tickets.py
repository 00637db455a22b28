"""TLS session tickets any router worker can read: one key for every process of the
router, kept in the certificate store and rotated daily (issue #21).

A client that resumes a session skips the handshake's costly half. OpenSSL encrypts a
ticket with a key of the process that issued it; with a key of its own per worker, a
client whose next connection lands on another worker (they share one listening socket)
resumes nothing. So the key is the store's: `.ticket-keys` (80 random bytes: name, HMAC
and AES keys, 0600), read by every process, written only by the one that owns the
control socket (the router's main process, or a router of one process), and replaced
once it is a day old; each process looks at it every minute. A ticket issued under the
key before a rotation (or within a minute of one, by a process that has not looked yet)
is not accepted, and that client does a full handshake: nothing worse.

Python's ssl has no call for ticket keys, so they are set through OpenSSL's
SSL_CTX_ctrl on the context's SSL_CTX, found where CPython keeps it (right after the
object header). Each set is read back and compared: where that does not hold (another
Python or OpenSSL), nothing is shared, said once, and each process keeps OpenSSL's own
key, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from keelway.durable import PRIVATE_FILE_MODE, write_atomic

log: Final = logging.getLogger("keelway.router.tickets")

KEYS_FILE: Final = ".ticket-keys"
KEY_BYTES: Final = 80  # OpenSSL's: a 16-byte name, a 32-byte HMAC key, a 32-byte AES key
ROTATE_S: Final = 24 * 3600.0
LOOK_EVERY_S: Final = 60.0
_SET: Final = 59  # SSL_CTRL_SET_TLSEXT_TICKET_KEYS
_GET: Final = 58  # SSL_CTRL_GET_TLSEXT_TICKET_KEYS


def _libssl() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("ssl")
    for candidate in ("libssl.so.3", name):
        if candidate is None:
            continue
        try:
            lib = ctypes.CDLL(candidate)
        except OSError:
            continue
        lib.SSL_CTX_ctrl.restype = ctypes.c_long
        lib.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long,
                                     ctypes.c_void_p]
        return lib
    return None


_LIB: Final = _libssl()


def set_keys(context: ssl.SSLContext, keys: bytes) -> bool:
    """Make `keys` the ticket keys of `context`; False (nothing changed that matters)
    where this Python and OpenSSL do not allow it."""
    if _LIB is None or len(keys) != KEY_BYTES:
        return False
    # CPython's PySSLContext: the object header, then its SSL_CTX pointer.
    pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    if not pointer:
        return False
    given = ctypes.create_string_buffer(keys, KEY_BYTES)
    read = ctypes.create_string_buffer(KEY_BYTES)
    if _LIB.SSL_CTX_ctrl(pointer, _SET, KEY_BYTES, given) != 1:
        return False
    return bool(_LIB.SSL_CTX_ctrl(pointer, _GET, KEY_BYTES, read) == 1
                and read.raw == keys)


class TicketKeys:
    """The store's ticket key as one router process uses it: `writer` (the process that
    owns the control socket) rotates it; every process hands it to `take` (the TLS
    contexts it serves with: Certificates.take_ticket_keys), which says whether it
    could be used."""

    def __init__(self, certs: Path, take: Callable[[bytes], bool] | None,
                 writer: bool) -> None:
        self.path = certs / KEYS_FILE
        self.take = take
        self.writer = writer
        self._stamp: tuple[int, int] | None = None
        self.shared = False
        self._said = False

    def look(self, now: float | None = None) -> None:
        """Rotate the key if this process writes it and it is due; take it up if it
        changed. Errors are logged: tickets are an optimisation, never a failure."""
        now = time.time() if now is None else now
        try:
            if self.writer:
                self._rotate_if_due(now)
            seen = os.stat(self.path)
            stamp = (seen.st_ino, seen.st_mtime_ns)
            if stamp == self._stamp or self.take is None:
                return
            keys = self.path.read_bytes()
        except OSError as exc:
            log.warning("TLS session ticket key: %s", exc)
            return
        self._stamp = stamp
        self.shared = self.take(keys)
        if not self.shared and not self._said:
            self._said = True
            log.warning("TLS session tickets cannot be shared between router processes "
                        "here: a resumed session works only on the process that issued it")

    def _rotate_if_due(self, now: float) -> None:
        try:
            age = now - os.stat(self.path).st_mtime
        except FileNotFoundError:
            age = float("inf")
        if age >= ROTATE_S:
            write_atomic(self.path, os.urandom(KEY_BYTES), PRIVATE_FILE_MODE)
