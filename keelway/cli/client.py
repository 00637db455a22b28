"""The CLI's client of the control-plane API: stdlib http.client over the unix socket.

No aiohttp here: the CLI must start fast, and it only needs a request and a response.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class ApiUnavailable(Exception):
    """No control plane answers on the socket: nothing was sent."""


class ApiLost(ConnectionError):
    """The connection was lost (or went unanswered) after the request was on its way:
    the control plane may or may not have done what was asked. A ConnectionError, as
    what it replaces was, so that a caller that treats any lost connection alike (a
    test polling a daemon it crashes) still does."""

    def __init__(self, why: str, method: str) -> None:
        super().__init__(why)
        self.why = why
        self.method = method


# What a control plane that dies mid-request looks like from here: the connection reset
# or closed before a whole answer (RemoteDisconnected is a ConnectionResetError), a
# broken pipe while sending, or an answer cut short.
_LOST = (ConnectionError, http.client.IncompleteRead, http.client.BadStatusLine)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, hint: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.hint = hint


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout_s: float | None) -> None:
        super().__init__("keelway", timeout=timeout_s)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client:
    def __init__(self, socket_path: Path, timeout_s: float | None = 30.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    @contextlib.contextmanager
    def _open(self, method: str, path: str, body: dict[str, Any] | None,
              timeout_s: float | None) -> Iterator[http.client.HTTPResponse]:
        """The response, its connection closed on the way out (a long-lived caller, a
        test or a tool, would otherwise keep one socket per request).

        Raises ApiUnavailable when nothing listens (nothing was sent), and ApiLost when
        the connection is lost or unanswered once connected, here or while the caller
        reads the response inside the block."""
        conn = _UnixConnection(self.socket_path, timeout_s)
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        try:
            try:
                conn.connect()
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                raise ApiUnavailable(str(exc)) from exc
            try:
                conn.request(method, path, body=payload, headers=headers)
                yield conn.getresponse()
            except _LOST as exc:
                raise ApiLost("the control plane went away during the request", method) from exc
            except TimeoutError as exc:
                raise ApiLost(f"the control plane did not answer within {timeout_s:g}s",
                              method) from exc
        finally:
            conn.close()

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        with self._open(method, path, body, self.timeout_s) as response:
            status = response.status
            data = response.read()
        try:
            decoded = json.loads(data or b"{}")
        except json.JSONDecodeError as exc:
            raise ApiError(response.status, "bad-response", "the API answered garbage",
                           None) from exc
        if status >= 400:
            err = decoded.get("error", {}) if isinstance(decoded, dict) else {}
            raise ApiError(status, err.get("code", "error"),
                           err.get("message", f"HTTP {status}"), err.get("hint"))
        return decoded

    def stream(self, method: str, path: str,
               body: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """NDJSON lines of a streaming endpoint, as they arrive (no timeout: may be long)."""
        with self._open(method, path, body, None) as response:
            if response.status >= 400:
                decoded = json.loads(response.read() or b"{}")
                err = decoded.get("error", {})
                raise ApiError(response.status, err.get("code", "error"),
                               err.get("message", f"HTTP {response.status}"),
                               err.get("hint"))
            while True:
                line = response.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
