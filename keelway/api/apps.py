"""The API of apps whole (keelway/deploy/apps.py): created and destroyed.

    POST /v1/apps                 {"app"} -> 200 {"app","created"}
    POST /v1/apps/{app}/destroy   {"yes","purge_data","dry_run"} -> 200 {"app","destroyed",
        "instances","purged_data"}; a dry run: keelway/api/plans.py (one plan per
        instance removed, then the app's own)
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from keelway.api import bodies
from keelway.api.http import app_name, read_body, route
from keelway.api.plans import plan_response
from keelway.deploy.apps import Apps
from keelway.deploy.errors import UserError
from keelway.store import Store
from keelway.store.lifecycle import Removal


def removal(purge: bool) -> Removal:
    return Removal.PURGE_DATA if purge else Removal.KEEP_DATA


@dataclass(frozen=True)
class AppsApi:
    store: Store
    apps: Apps


    @route("POST", "/v1/apps")
    async def create_app(self, request: web.Request) -> web.Response:
        body: bodies.CreateAppBody = await read_body(request, bodies.CreateAppBody)
        body.check()
        app = self.apps.create_app(body.app)
        return web.json_response({"app": app.name, "created": True})

    @route("POST", "/v1/apps/{app}/destroy")
    async def destroy_app(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        body: bodies.DestroyBody = await read_body(request, bodies.DestroyBody)
        if body.dry_run:
            plans = self.apps.plan_destroy_app(name, removal(body.purge_data))
            return plan_response(*(plan for _, plan in plans))
        if not body.yes:
            raise UserError(f"destroying {name} stops and removes every instance, its "
                            "routes, builds and records"
                            + (" and its data" if body.purge_data else
                               " (data dirs stay)"),
                            hint=f"repeat with --yes: `keelway apps destroy {name} --yes`")
        removed = await self.apps.destroy_app(name, removal(body.purge_data))
        return web.json_response({"app": name, "destroyed": True, "instances": removed,
                                  "purged_data": body.purge_data})
