"""Loopback port choice for web generations.

The kernel picks a free port (bind to port 0); the caller then claims it in the store
in the same write that journals the generation, so two generations never share one.
A port the store already claims is skipped even if the kernel offers it again.
"""

from __future__ import annotations

import socket
from collections.abc import Callable


def pick_free_port(claimed: Callable[[int], bool], attempts: int = 50) -> int:
    """A port the kernel offers that `claimed` says no generation holds."""
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if not claimed(port):
            return port
    raise RuntimeError(f"no free loopback port after {attempts} attempts")
