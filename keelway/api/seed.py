"""The API of seed imports (keelway/deploy/seeding.py), per instance:

    POST /v1/instances/{host}/seed/import    {"source": PATH|SNAP, "dry_run": bool,
                                              "allow_empty": bool} -> 200 report
    POST /v1/instances/{host}/seed/rollback  {"dry_run": bool}  -> 200 report
    GET  /v1/instances/{host}/seed                              -> 200 status
    report = {"host", "seed", "outcome", "reason", "plan", "contents"}
    contents = {"tables": [{"name", "rows"}], "wal", "need_bytes", "apparent_bytes"}
        (what an import and its dry run bring; null for a rollback)

SOURCE is an absolute path to an SQLite file on this box, or a stored snapshot: `SNAPID`
(of whichever instance holds it) or `HOST/SNAPID` (names.seed_snapshot). A refused
import (bad name, a damaged seed or snapshot, an ambiguous snapshot id, an import
already journaled, a fence) is a 4xx and changes nothing. A rollback that holds
or defers answers 200 with its outcome: the journal keeps the rest for a later pass.
The journal's `env_before` values (an instance key) are never in an answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec
from aiohttp import web

from keelway import names
from keelway.api import bodies
from keelway.api.http import read_body, route
from keelway.deploy.errors import UserError, refused_name
from keelway.deploy.seeding import Seeding, SnapshotSource


class ImportBody(msgspec.Struct, forbid_unknown_fields=True):
    source: str
    dry_run: bool = False
    allow_empty: bool = False

    def seed(self) -> Path | SnapshotSource:
        if not self.source or "\0" in self.source:
            raise UserError("the seed's path is empty or holds a NUL")
        try:
            snapshot = names.seed_snapshot(self.source)
        except names.InvalidName as exc:
            raise refused_name(exc) from None
        if snapshot is not None:
            return SnapshotSource(*snapshot)
        return Path(self.source)


@dataclass(frozen=True)
class SeedApi:
    seeding: Seeding


    @route("POST", "/v1/instances/{host}/seed/import")
    async def import_seed(self, request: web.Request) -> web.Response:
        body: ImportBody = await read_body(request, ImportBody)
        report = await self.seeding.import_seed(request.match_info["host"], body.seed(),
                                                dry_run=body.dry_run,
                                                allow_empty=body.allow_empty)
        return web.json_response(report.view())

    @route("POST", "/v1/instances/{host}/seed/rollback")
    async def rollback(self, request: web.Request) -> web.Response:
        body: bodies.DryRunBody = await read_body(request, bodies.DryRunBody)
        report = await self.seeding.rollback(request.match_info["host"], dry_run=body.dry_run)
        return web.json_response(report.view())

    @route("GET", "/v1/instances/{host}/seed")
    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(self.seeding.status(request.match_info["host"]))
