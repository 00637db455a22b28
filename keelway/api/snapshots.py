"""The API of an instance's snapshots:

    POST /v1/instances/{host}/snapshots               {} -> 200 snapshot
    GET  /v1/instances/{host}/snapshots                  -> 200 {"host","snapshots":[snapshot]}
    POST /v1/instances/{host}/snapshots/{id}/verify   {} -> 200 snapshot + {"ok":true}
    POST /v1/instances/{host}/snapshots/{id}/restore  {"dry_run": bool} -> 200 {"host",
        "state","source","op","size_bytes","kept":[copy],"retention_s","snapshot"}
        (Restored.view); a dry run: keelway/api/plans.py
    GET    /v1/instances/{host}/kept                 -> 200 {"host","kept":[copy],
        "retention_s"}
    POST /v1/instances/{host}/kept/{copy}/forget   {} -> 200 copy (it is removed)
    copy = {"id","kind","path","kept_at","disk_bytes"} (keelway/data/kept.py)
    snapshot = {"instance","id","taken_at","size","sha256","release","schema_version"}

A snapshot that fails verification is answered 400 `snapshot-refused` and nothing is
changed; an unknown one 404.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import msgspec
from aiohttp import web

from keelway.api import bodies
from keelway.api.http import read_body, route
from keelway.api.plans import plan_response
from keelway.data import kept
from keelway.data.snapshots import SnapshotManifest
from keelway.deploy.restore import Restore
from keelway.deploy.snapshots import Snapshots


class Empty(msgspec.Struct, forbid_unknown_fields=True):
    pass


def snapshot_view(found: SnapshotManifest) -> dict[str, Any]:
    return asdict(found)


@dataclass(frozen=True)
class SnapshotsApi:
    snapshots: Snapshots
    restorer: Restore


    @route("POST", "/v1/instances/{host}/snapshots")
    async def take(self, request: web.Request) -> web.Response:
        await read_body(request, Empty)
        made = await self.snapshots.snapshot(request.match_info["host"])
        return web.json_response(snapshot_view(made))

    @route("GET", "/v1/instances/{host}/snapshots")
    async def list(self, request: web.Request) -> web.Response:
        host = request.match_info["host"]
        found = await self.snapshots.stored(host)
        return web.json_response({"host": host,
                                  "snapshots": [snapshot_view(m) for m in found]})

    @route("POST", "/v1/instances/{host}/snapshots/{id}/verify")
    async def verify(self, request: web.Request) -> web.Response:
        await read_body(request, Empty)
        found = await self.snapshots.verify(request.match_info["host"], request.match_info["id"])
        return web.json_response(snapshot_view(found) | {"ok": True})

    @route("POST", "/v1/instances/{host}/snapshots/{id}/restore")
    async def restore(self, request: web.Request) -> web.Response:
        body: bodies.DryRunBody = await read_body(request, bodies.DryRunBody)
        host, snap_id = request.match_info["host"], request.match_info["id"]
        if body.dry_run:
            plan = await self.restorer.plan(host, snap_id)
            return plan_response(plan)
        done = await self.restorer.restore(host, snap_id)
        return web.json_response(done.view())

    @route("GET", "/v1/instances/{host}/kept")
    async def kept(self, request: web.Request) -> web.Response:
        host = request.match_info["host"]
        copies = await self.restorer.kept(host)
        return web.json_response({"host": host, "kept": [c.view() for c in copies],
                                  "retention_s": kept.retention_s()})

    @route("POST", "/v1/instances/{host}/kept/{copy}/forget")
    async def forget(self, request: web.Request) -> web.Response:
        await read_body(request, Empty)
        gone = await self.restorer.forget(request.match_info["host"],
                                           request.match_info["copy"])
        return web.json_response(gone.view())
