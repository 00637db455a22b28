"""What the dashboard shows, as JSON its page polls (keelway/api/dashboard_assets.py).

Rules:
- Read-only: every handler here reads; none changes a record, a process or a file.
- No rule of its own: states, releases, operations and events are the API's views
  (keelway/api/status.py `status_json`, keelway/api/views.py), called in-process, so
  the dashboard says what `keelway status`, `releases`, `ops` and `events` say.
- Bounded: the overview is one page of each app's instances (the summary still counts
  every one), so polling it every two seconds at 10,000 instances reads a page, not
  the fleet; the app's journal, events and log tail are its newest few.
- Snapshots and the replica's position are read only when an instance is opened (the
  replica's takes a litestream run), never by the poll.
- No secrets: these views never read an instance's env file or config values.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from keelway.api.http import app_name, encoded_response
from keelway.api.server import log_files
from keelway.api.snapshots import snapshot_view
from keelway.api.status import Page, status_json
from keelway.api.views import (
    event_view,
    operation_view,
    releases_view,
    router_view,
    unreleased_failures,
)
from keelway.data.replicas import ReplicaError, Replicas
from keelway.deploy.errors import NotFoundError
from keelway.deploy.snapshots import Snapshots
from keelway.home import Home
from keelway.runtime.logs import tail_lines
from keelway.runtime.router_supervisor import RouterSupervisor
from keelway.store import Store

# Each app's instances per page of the overview.
PER_PAGE = 50
OPERATIONS_SHOWN = 15
EVENTS_SHOWN = 40
LOG_LINES_SHOWN = 60


@dataclass
class Dashboard:
    """The dashboard's JSON: `/api/overview`, `/api/apps/{app}`, `/api/instances/{host}`."""

    store: Store
    home: Home
    router: RouterSupervisor | None
    http_port: int
    live_ops: Callable[[], set[int]]
    snapshots: Snapshots | None = None
    replicas: Replicas | None = None

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/api/overview", self.overview),
                web.get("/api/apps/{app}", self.app),
                web.get("/api/instances/{host}", self.instance)]

    async def overview(self, request: web.Request) -> web.Response:
        """Every app's summary and page `page` of its instances, as `status --page`
        answers them, with the router's health."""
        page = Page.parse(request.query.get("page", "1"), str(PER_PAGE))
        extra: dict[str, object] = {"generated_at": time.time()}
        if self.router is not None:
            extra["router"] = router_view(self.router.health())
        return encoded_response(await self.store.read_aside(
            status_json, self.http_port, None, self.live_ops(), extra, self.home.root, page))

    async def app(self, request: web.Request) -> web.Response:
        """The app's releases, its newest operations step by step, events and a tail
        of its instances' logs."""
        name = app_name(self.store, request)
        ops = self.store.ops.list_operations(name, None, OPERATIONS_SHOWN)
        events = self.store.ops.list_events(name, EVENTS_SHOWN)
        files = log_files(self.store, self.home, name, request.query.get("instance"), None)
        logs = await asyncio.to_thread(_tail, files)
        return encoded_response(msgspec.json.encode({
            "app": name,
            "releases": releases_view(self.store, name),
            "unreleased_failures": unreleased_failures(self.store, name),
            "operations": [operation_view(op) for op in ops],
            "events": [event_view(e) for e in events],
            "logs": logs}))

    async def instance(self, request: web.Request) -> web.Response:
        """One instance's snapshots and where its replica stands (each read on ask)."""
        host = request.match_info["host"]
        if self.store.instances.get_instance(host) is None:
            raise NotFoundError(f"no instance named {host}")
        out: dict[str, Any] = {"host": host, "snapshots": None, "replica": None}
        if self.snapshots is not None:
            out["snapshots"] = [snapshot_view(m) for m in await self.snapshots.stored(host)]
        if self.replicas is not None and self.replicas.enabled:
            try:
                out["replica"] = (await self.replicas.position(host)).view()
            except ReplicaError as exc:
                out["replica"] = {"error": str(exc)}
        return web.json_response(out)


def _tail(files: list[tuple[str, str, int, Any]]) -> list[dict[str, Any]]:
    """The last lines of each file, newest generations last, at most LOG_LINES_SHOWN."""
    lines: list[dict[str, Any]] = []
    for host, service, gen_id, path in files:
        text, _end = tail_lines(path, LOG_LINES_SHOWN)
        lines += [{"instance": host, "service": service, "generation": gen_id, "line": line}
                  for line in text]
    return lines[-LOG_LINES_SHOWN:]
