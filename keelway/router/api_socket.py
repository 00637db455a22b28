"""The router's calls to the control plane: one raw HTTP/1.1 `POST PATH` with body `{}`
on the control plane's API unix socket (`--wake-socket`), and the status of its answer.

The router imports nothing of the control plane and needs no HTTP client for one line
each way: the paths it asks for (a wake, waker.py; a certificate on demand,
on_demand.py) are made of names that follow the host rule, so nothing needs escaping.
An answer is read only as far as its head, bounded in bytes and lines.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

_STATUS_LINE_MAX: Final = 1024
_HEAD_LINES_MAX: Final = 64
NO_ANSWER: Final = 0  # the status of a call that got no HTTP answer


def post_request(path: str) -> bytes:
    """The whole request for `path` (which needs no escaping)."""
    return (f"POST {path} HTTP/1.1\r\n"
            "Host: keelway\r\nContent-Type: application/json\r\n"
            "Content-Length: 2\r\nConnection: close\r\n\r\n{}").encode()


def status_of(status_line: bytes) -> int:
    """The status of an HTTP/1.x status line; NO_ANSWER for anything else."""
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        return NO_ANSWER
    return int(parts[1])


async def post(socket_path: Path, path: str, timeout_s: float) -> tuple[int, int | None]:
    """POST `path` and read the answer within `timeout_s`: its status (NO_ANSWER if none
    came: no socket, refused, cut, late, not HTTP) and, for a status of 400 and up, its
    Retry-After in seconds, if it said one."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(max(timeout_s, 0.01)):
            reader, writer = await asyncio.open_unix_connection(
                str(socket_path), limit=_STATUS_LINE_MAX)
            writer.write(post_request(path))
            await writer.drain()
            status = status_of(await reader.readline())
            retry_after_s = None
            if status >= 400:  # only a refusal's Retry-After means anything
                for _ in range(_HEAD_LINES_MAX):
                    line = await reader.readline()
                    name, _, value = line.partition(b":")
                    if not line.strip():
                        break
                    if name.strip().lower() == b"retry-after" and value.strip().isdigit():
                        retry_after_s = int(value.strip())
            return status, retry_after_s
    except (OSError, TimeoutError, ValueError):
        return NO_ANSWER, None
    finally:
        if writer is not None:
            writer.close()
