"""Asking the router how active each route is: the `activity` control op.

    {"op":"activity"} -> {"ok":true,"activity":{"HOST":{"idle_s":FLOAT,"open":INT}}}

`idle_s` is how long since the route last had a request, `open` how many connections
(a WebSocket, an SSE stream, a request in flight) it holds now, counted across all the
router's workers. A router older than the op answers `ok: false`: that is
`ActivityUnknown`, and the sweep then parks nothing (without the router's counts no
instance is known to be idle).

The op goes through the router's one control client (keelway/router/client.py), one
request per connection bounded by `timeout_s`; the messages are the wire's own
(keelway/router/control_wire.py).
"""

from __future__ import annotations

import os

from keelway.router import client
from keelway.router.control_wire import HostActivity as Activity  # one host's counts

__all__ = ["Activity", "ActivityUnknown", "fetch_activity"]


class ActivityUnknown(Exception):
    """The router did not say (unreachable, an older router, an unreadable reply)."""


async def fetch_activity(sock_path: str | os.PathLike[str],
                         timeout_s: float = 2.0) -> dict[str, Activity]:
    """Activity per host as the router counts it; raises ActivityUnknown."""
    try:
        return await client.activity(sock_path, timeout_s)
    except client.RouterControlError as exc:
        raise ActivityUnknown(f"the router did not say: {exc}") from exc
