"""Readiness probes: the health path over raw HTTP/1.1 on the claimed loopback port, and
what a probe saw, said so that a person can fix the app.

A probe asks as the router will: `GET <health path>` with the instance's Host (an app
that checks its Host, as Django's ALLOWED_HOSTS does, answers the probe as it answers
traffic). Its outcome is a value (`Answered`, `NotListening`, `NoAnswer`); `describe` turns
the last one into the reason a start failed, and for a refused connection it says where
the process tree does listen (`listening_on`), the usual mistake being a fixed port
instead of $PORT.

Nothing here holds state: the supervisor probes, keeps the last outcome and decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# How much of a failing answer's body the reason quotes: enough for a one-line error
# ("ImproperlyConfigured: ...", "database is locked"), not a whole error page.
BODY_HEAD_BYTES = 200
_MAX_HEADER_BYTES = 16 * 1024


@dataclass(frozen=True)
class Answered:
    """The app answered with `status`; `head` is the start of the body of a 5xx answer
    (of other answers nothing is read: they make the process ready)."""

    status: int
    head: bytes = b""

    @property
    def healthy(self) -> bool:
        return self.status < 500


@dataclass(frozen=True)
class NotListening:
    """Nothing accepts connections on the port yet."""


@dataclass(frozen=True)
class NoAnswer:
    """A connection was accepted but no HTTP status line came back (`why`)."""

    why: str


Probe = Answered | NotListening | NoAnswer


async def probe_http(port: int, path: str, host: str, timeout_s: float = 2.0) -> Probe:
    """Ask `GET path` on 127.0.0.1:`port` with `Host: host`, once."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except ConnectionRefusedError:
                return NotListening()
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: keelway-health\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
            )
            return await _read_answer(reader)
    except TimeoutError:
        return NoAnswer(f"no answer within {timeout_s:g}s")
    except OSError as exc:
        return NoAnswer(f"the connection failed ({exc.strerror or exc})")
    finally:
        if writer is not None:
            writer.close()


async def _read_answer(reader: asyncio.StreamReader) -> Probe:
    line = await reader.readline()
    parts = line.split()
    if not line:
        return NoAnswer("the connection was closed without an answer")
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        return NoAnswer(f"the answer is not HTTP: {_quote(line)}")
    status = int(parts[1])
    if status < 500:
        return Answered(status)
    length: int | None = None
    chunked = False
    seen = 0
    while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
        seen += len(header)
        if seen > _MAX_HEADER_BYTES:
            return Answered(status)
        name, _, value = header.partition(b":")
        name = name.strip().lower()
        if name == b"content-length" and value.strip().isdigit():
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        size = (await reader.readline()).split(b";")[0].strip()
        try:
            length = int(size, 16)
        except ValueError:
            return Answered(status)
    want = BODY_HEAD_BYTES if length is None else min(length, BODY_HEAD_BYTES)
    head = b""
    with contextlib.suppress(asyncio.IncompleteReadError):
        head = await reader.readexactly(want)
    return Answered(status, head)


def _quote(data: bytes) -> str:
    """A body's start as one printable line, quoted."""
    text = data.decode("utf-8", errors="replace")
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    if len(data) >= BODY_HEAD_BYTES:
        text += " …"
    return f'"{text}"'


def describe(seen: Probe | None, *, port: int, path: str, host: str,
             listening: list[tuple[str, int]]) -> str:
    """What the probe last saw, as the reason a web was not ready. `listening`: where the
    process tree listens (read when the connection was refused)."""
    match seen:
        case None:
            return "it was never probed"
        case Answered(status=status, head=head):
            said = f"GET {path} (Host: {host}) answered {status}"
            return f"{said}: {_quote(head)}" if head else said
        case NoAnswer(why=why):
            return f"GET {path} on port {port}: {why}"
        case NotListening():
            if listening:
                where = ", ".join(f"{addr}:{lport}" for addr, lport in listening)
                return f"it is listening on {where}, not $PORT (127.0.0.1:{port})"
            return f"connection to 127.0.0.1:{port} ($PORT) refused: nothing listens there"


# /proc/net/tcp{,6}: the `st` column of a listening socket.
_TCP_LISTEN = "0A"


def listening_on(pids: Iterable[int], proc: Path = Path("/proc")) -> list[tuple[str, int]]:
    """The TCP addresses the processes `pids` listen on, sorted: their socket inodes
    (/proc/PID/fd) matched against the listening sockets of /proc/net/tcp and tcp6."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.scandir(proc / str(pid) / "fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(fd.path)
                    if target.startswith("socket:["):
                        inodes.add(target[len("socket:["):-1])
    found: set[tuple[str, int]] = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _TCP_LISTEN or fields[9] not in inodes:
                continue
            found.add(_address(fields[1], family))
    return sorted(found)


def _address(hex_addr: str, family: socket.AddressFamily) -> tuple[str, int]:
    """`0100007F:1388` -> ("127.0.0.1", 5000): the kernel prints the address as 32-bit
    words in host byte order, the port as a number."""
    addr_hex, _, port_hex = hex_addr.partition(":")
    words = (bytes.fromhex(addr_hex[i:i + 8]) for i in range(0, len(addr_hex), 8))
    raw = b"".join(w[::-1] if sys.byteorder == "little" else w for w in words)
    text = socket.inet_ntop(family, raw)
    return (f"[{text}]" if family is socket.AF_INET6 else text), int(port_hex, 16)
