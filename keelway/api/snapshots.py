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

from dataclasses import asdict
from typing import Any

import msgspec
from aiohttp import web

from keelway.api.http import read_body
from keelway.api.plans import plan_response
from keelway.data import kept
from keelway.data.snapshots import SnapshotManifest
from keelway.deploy.restore import Restore
from keelway.deploy.snapshots import Snapshots


class Empty(msgspec.Struct, forbid_unknown_fields=True):
    pass


class SnapshotRestoreBody(msgspec.Struct, forbid_unknown_fields=True):
    dry_run: bool = False


def snapshot_view(found: SnapshotManifest) -> dict[str, Any]:
    return asdict(found)


class SnapshotsApi:
    def __init__(self, snapshots: Snapshots, restorer: Restore) -> None:
        self.snapshots = snapshots
        self.restorer = restorer

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/instances/{host}/snapshots", self.take),
            web.get("/v1/instances/{host}/snapshots", self.list),
            web.post("/v1/instances/{host}/snapshots/{id}/verify", self.verify),
            web.post("/v1/instances/{host}/snapshots/{id}/restore", self.restore),
            web.get("/v1/instances/{host}/kept", self.kept),
            web.post("/v1/instances/{host}/kept/{copy}/forget", self.forget),
        ]

    async def take(self, request: web.Request) -> web.Response:
        await read_body(request, Empty)
        made = await self.snapshots.snapshot(request.match_info["host"])
        return web.json_response(snapshot_view(made))

    async def list(self, request: web.Request) -> web.Response:
        host = request.match_info["host"]
        found = await self.snapshots.stored(host)
        return web.json_response({"host": host,
                                  "snapshots": [snapshot_view(m) for m in found]})

    async def verify(self, request: web.Request) -> web.Response:
        await read_body(request, Empty)
        found = await self.snapshots.verify(request.match_info["host"], request.match_info["id"])
        return web.json_response(snapshot_view(found) | {"ok": True})

    async def restore(self, request: web.Request) -> web.Response:
        body: SnapshotRestoreBody = await read_body(request, SnapshotRestoreBody)
        host, snap_id = request.match_info["host"], request.match_info["id"]
        if body.dry_run:
            plan = await self.restorer.plan(host, snap_id)
            return plan_response(plan)
        done = await self.restorer.restore(host, snap_id)
        return web.json_response(done.view())

    async def kept(self, request: web.Request) -> web.Response:
        host = request.match_info["host"]
        copies = await self.restorer.kept(host)
        return web.json_response({"host": host, "kept": [c.view() for c in copies],
                                  "retention_s": kept.retention_s()})

    async def forget(self, request: web.Request) -> web.Response:
        await read_body(request, Empty)
        gone = await self.restorer.forget(request.match_info["host"],
                                           request.match_info["copy"])
        return web.json_response(gone.view())
