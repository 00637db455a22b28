"""READY=1 on $NOTIFY_SOCKET, the systemd convention: a process may say it is ready.

One unix datagram socket per starting generation, read with the event loop's reader
callback (works on uvloop and asyncio alike). It lives only while keelway waits for
readiness; a message sent after that, or while the control plane is down, is lost, and
readiness then falls back to the health probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path


class NotifyListener:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.ready = asyncio.Event()
        self._sock: socket.socket | None = None

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._sock = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data = self._sock.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                return
            if b"READY=1" in data.split(b"\n"):
                self.ready.set()

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        self.path.unlink(missing_ok=True)
