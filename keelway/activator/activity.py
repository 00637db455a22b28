"""Asking the router how active each route is: the `activity` control op.

    {"op":"activity"} -> {"ok":true,"activity":{"HOST":{"idle_s":FLOAT,"open":INT}}}

`idle_s` is how long since the route last had a request, `open` how many connections
(a WebSocket, an SSE stream, a request in flight) it holds now, counted across all the
router's workers. A router older than the op answers `ok: false`: that is
`ActivityUnknown`, and the sweep then parks nothing (without the router's counts no
instance is known to be idle).

One request per connection over the control socket, bounded by `timeout_s`, like every
control op (keelway/router/client.py); its own small message types here until the
router's wire module carries the op.
"""

from __future__ import annotations

import asyncio
import os
from typing import Final

import msgspec

MAX_REPLY_BYTES: Final = 16 * 1024 * 1024


class Activity(msgspec.Struct, frozen=True):
    idle_s: float
    open: int


class _Reply(msgspec.Struct, frozen=True):
    ok: bool
    activity: dict[str, Activity] | None = None
    error: str | None = None


_decoder: Final = msgspec.json.Decoder(_Reply)


class ActivityUnknown(Exception):
    """The router did not say (unreachable, an older router, an unreadable reply)."""


async def fetch_activity(sock_path: str | os.PathLike[str],
                         timeout_s: float = 2.0) -> dict[str, Activity]:
    """Activity per host as the router counts it; raises ActivityUnknown."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_unix_connection(
                os.fspath(sock_path), limit=MAX_REPLY_BYTES)
            try:
                writer.write(b'{"op":"activity"}\n')
                await writer.drain()
                line = await reader.readline()
            finally:
                writer.close()
    except TimeoutError as exc:
        raise ActivityUnknown(f"no answer on {sock_path} within {timeout_s} s") from exc
    except (OSError, ValueError) as exc:  # ValueError: a reply longer than the limit
        raise ActivityUnknown(f"ask {sock_path}: {exc}") from exc
    try:
        reply = _decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise ActivityUnknown(f"unreadable reply from the router: {exc}") from exc
    if not reply.ok or reply.activity is None:
        raise ActivityUnknown(f"the router did not say: {reply.error or 'no activity'}")
    return reply.activity
