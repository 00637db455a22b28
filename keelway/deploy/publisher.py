"""Publishing routes: the store's route rows, pushed whole to the router.

The route row is written to the store first (the journal), then the whole table is
pushed with a fresh version. Crash between the two: the row names the new generation,
the router still the old one; boot republishes the whole table, so the router converges
to the store. The router refuses a table older than the one it has, so a slow push can
never undo a newer one.

A web waiting out its crash backoff has its route gated; its Retry-After says when the
retry is due (rounded up to a whole second), not the default.
"""

from __future__ import annotations

import asyncio
import logging
import math
from pathlib import Path

from keelway import failpoints
from keelway.deploy.errors import RouterUnavailable
from keelway.router import route_table as rt
from keelway.router.client import (
    RouterControlError,
    RouterRefused,
    get_table,
    inflight,
    push_table,
)
from keelway.store import Store
from keelway.store.records import Route

log = logging.getLogger("keelway.publisher")

failpoints.declare("publish.before", "publish.after")

RETRY_AFTER_S = 5


def table_of(routes: list[Route], version: int,
             retry_in_s: dict[str, float] | None = None) -> rt.RouteTable:
    """The router's table for the store's routes; `retry_in_s` maps a host whose web
    waits out a crash backoff to the seconds until its retry."""
    entries: dict[str, rt.Route] = {}
    for route in routes:
        state = rt.RouteState(route.state.value)
        upstream = f"127.0.0.1:{route.port}" if route.port is not None else None
        if state is rt.RouteState.SERVING and upstream is None:
            state = rt.RouteState.GATED  # nothing to serve with: answer 503, never guess
        retry_after_s = RETRY_AFTER_S
        if state is rt.RouteState.GATED and retry_in_s and route.host in retry_in_s:
            retry_after_s = max(1, math.ceil(retry_in_s[route.host]))
        entries[route.host] = rt.Route(state=state, upstream=upstream,
                                       retry_after_s=retry_after_s)
    return rt.RouteTable(version=version, routes=entries)


class Publisher:
    def __init__(self, store: Store, control_socket: Path) -> None:
        self.store = store
        self.control_socket = control_socket

    def _table(self, version: int) -> rt.RouteTable:
        now = self.store.clock.now()
        retry_in_s = {r.instance: r.retry_at - now for r in self.store.pending_retries()
                      if r.service == "web"}
        return table_of(self.store.list_routes(), version, retry_in_s)

    async def publish(self) -> int:
        """Push the store's whole route table; returns the version the router applied."""
        version = self.store.next_route_table_version()
        failpoints.hit("publish.before")
        try:
            try:
                applied = await push_table(self.control_socket, self._table(version))
            except RouterRefused:
                # The router kept a table from a store we no longer have (a new home
                # database, a restored backup): jump past its version and push again.
                served = await get_table(self.control_socket)
                version = self.store.next_route_table_version(at_least=served.version)
                applied = await push_table(self.control_socket, self._table(version))
        except RouterControlError as exc:
            raise RouterUnavailable(
                f"could not push routes to the router: {exc}",
                hint="check `keelway status`; the router restarts with `keelway up`",
            ) from exc
        failpoints.hit("publish.after")
        return applied

    async def in_sync(self) -> bool:
        """Whether the router serves exactly the store's routes (any version)."""
        try:
            served = await get_table(self.control_socket)
        except RouterControlError:
            return False
        return served.routes == self._table(served.version).routes

    async def drained(self, port: int, bound_s: float, poll_s: float = 0.02) -> bool:
        """Wait until the router carries no request to 127.0.0.1:`port`, up to `bound_s`.

        The route already sends new requests elsewhere; this is the bounded drain of the
        ones in flight. True when drained, False at the bound (or with no router to ask,
        after waiting the bound out, the conservative answer).
        """
        key = f"127.0.0.1:{port}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound_s
        while loop.time() < deadline:
            try:
                counts = await inflight(self.control_socket, timeout_s=1.0)
            except RouterControlError:
                await asyncio.sleep(poll_s)
                continue
            if counts.get(key, 0) <= 0:
                return True
            await asyncio.sleep(poll_s)
        return False
