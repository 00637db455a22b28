"""The router's listening socket, bound the one way: by the router itself, or by the
control plane before any router starts (so a busy port is its clear error). A leaf: the
control plane imports it without the proxy behind it."""

from __future__ import annotations

import socket
from typing import Final

LISTEN_BACKLOG: Final = 1024


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port. Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock
