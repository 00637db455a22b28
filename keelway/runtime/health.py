"""Readiness probes: the health path over raw HTTP/1.1 on the claimed loopback port."""

from __future__ import annotations

import asyncio


async def probe_http(port: int, path: str, timeout_s: float = 2.0) -> int | None:
    """The status code the app answers on `path`, or None if it does not answer in time."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: keelway-health\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
            )
            line = await reader.readline()
    except (OSError, TimeoutError):
        return None
    finally:
        if writer is not None:
            writer.close()
    parts = line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    return int(parts[1])
