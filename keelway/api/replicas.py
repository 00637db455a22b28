"""The API of replicas (keelway/deploy/replication.py):

    GET  /v1/instances/{host}/replica                -> 200 position
    POST /v1/instances/{host}/restore-replica {"at": T|null, "dry_run": bool}
        -> 200 the restore's view (keelway/deploy/restore.py Restored.view), or a dry
        run's (keelway/api/snapshots.py)
    POST /v1/drill {"host": H|null}                  -> 200 {"results": [...], "ok": bool}
    result = {"host","ok": bool|null,"skipped"?: str,
              "snapshot": {"ok","skipped"?|"reason","id","size_bytes"},
              "replica": {"ok","skipped"?|"reason","size_bytes","txid"}}
    position = {"host","app","url","files":{level:count},"latest_txid","latest_at",
                "local_txid","behind_txids","replicating"}
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from aiohttp import web

from keelway.api.http import read_body, route
from keelway.api.plans import plan_response
from keelway.deploy.replication import Replication


class ReplicaRestoreBody(msgspec.Struct, forbid_unknown_fields=True):
    at: str | None = None
    dry_run: bool = False


class DrillBody(msgspec.Struct, forbid_unknown_fields=True):
    host: str | None = None


@dataclass(frozen=True)
class ReplicasApi:
    replication: Replication


    @route("GET", "/v1/instances/{host}/replica")
    async def position(self, request: web.Request) -> web.Response:
        return web.json_response(await self.replication.position(request.match_info["host"]))

    @route("POST", "/v1/instances/{host}/restore-replica")
    async def restore(self, request: web.Request) -> web.Response:
        body: ReplicaRestoreBody = await read_body(request, ReplicaRestoreBody)
        host = request.match_info["host"]
        if body.dry_run:
            plan = await self.replication.restorer.plan(host, None, body.at)
            return plan_response(plan)
        done = await self.replication.restore(host, body.at)
        return web.json_response(done.view())

    @route("POST", "/v1/drill")
    async def drill(self, request: web.Request) -> web.Response:
        body: DrillBody = await read_body(request, DrillBody)
        results = await self.replication.drill(body.host)
        return web.json_response({"results": results,
                                  "ok": all(r["ok"] is not False for r in results)})
