"""The API of tenants whole (keelway/deploy/tenants.py): apps created and destroyed,
instances added, removed and listed, an instance's own config, and its aliases.

Every request is checked by the one rule of each name before anything changes; adding
500 hosts is this one request. Config values are shown only by the config endpoint.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from keelway.api import bodies
from keelway.api.http import app_name, read_body
from keelway.api.instance_state import label
from keelway.api.views import instance_status
from keelway.deploy.errors import UserError
from keelway.deploy.tenants import Tenants
from keelway.store import Store
from keelway.store.lifecycle import Removal
from keelway.store.records import Instance


def _removal(purge: bool) -> Removal:
    return Removal.PURGE_DATA if purge else Removal.KEEP_DATA


class TenantsApi:
    def __init__(self, store: Store, tenants: Tenants, http_port: int | None) -> None:
        self.store = store
        self.tenants = tenants
        self.http_port = http_port

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/apps", self.create_app),
            web.post("/v1/apps/{app}/destroy", self.destroy_app),
            web.get("/v1/apps/{app}/instances", self.list_instances),
            web.post("/v1/apps/{app}/instances", self.add_instances),
            web.post("/v1/apps/{app}/instances/{host}/remove", self.remove_instance),
            web.get("/v1/apps/{app}/instances/{host}/config", self.instance_config),
            web.post("/v1/apps/{app}/instances/{host}/config", self.set_instance_config),
            web.get("/v1/instances/{host}/domains", self.list_aliases),
            web.post("/v1/instances/{host}/domains", self.add_aliases),
            web.post("/v1/instances/{host}/domains/remove", self.remove_aliases),
        ]

    def _view(self, inst: Instance, aliases: list[str]) -> dict[str, Any]:
        port = f":{self.http_port}" if self.http_port else ""
        status = instance_status(self.store, inst)
        return {"host": inst.host, "app": inst.app, "state": status.state.value,
                "label": label(status), "desired": inst.state.value,
                "adding": inst.adding, "aliases": aliases,
                "config": sorted(inst.config), "url": f"http://{inst.host}{port}/"}

    async def create_app(self, request: web.Request) -> web.Response:
        body: bodies.CreateAppBody = await read_body(request, bodies.CreateAppBody)
        body.check()
        app = self.tenants.create_app(body.app)
        return web.json_response({"app": app.name, "created": True})

    async def destroy_app(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        body: bodies.DestroyBody = await read_body(request, bodies.DestroyBody)
        if body.dry_run:
            plans = self.tenants.plan_destroy_app(name, _removal(body.purge_data))
            return web.json_response({
                "app": name, "dry_run": True,
                "plan": [f"{scope or name}: {line}" for scope, plan in plans
                         for line in plan.lines()],
                "operations": [{"instance": scope or None, **plan.dry_run()}
                               for scope, plan in plans]})
        if not body.yes:
            raise UserError(f"destroying {name} stops and removes every instance, its "
                            "routes, builds and records"
                            + (" and its data" if body.purge_data else
                               " (data dirs stay)"),
                            hint=f"repeat with --yes: `keelway apps destroy {name} --yes`")
        removed = await self.tenants.destroy_app(name, _removal(body.purge_data))
        return web.json_response({"app": name, "destroyed": True, "instances": removed,
                                  "purged_data": body.purge_data})

    async def list_instances(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        by_instance: dict[str, list[str]] = {}
        for alias in self.store.list_aliases():
            by_instance.setdefault(alias.instance, []).append(alias.host)
        return web.json_response({"app": name, "instances": [
            self._view(i, by_instance.get(i.host, [])) for i in self.store.list_instances(name)]})

    async def add_instances(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        body: bodies.AddInstancesBody = await read_body(request, bodies.AddInstancesBody)
        if body.dry_run:
            plan = self.tenants.plan_add_instances(name, body.hosts, body.config,
                                                   parked=body.parked)
            return web.json_response({"app": name, **plan.dry_run()})
        began = time.monotonic()
        added = await self.tenants.add_instances(name, body.hosts, body.config,
                                                 parked=body.parked)
        return web.json_response({
            "app": name, "added": [i.host for i in added.instances],
            "started": [{"host": r.host, "release": f"v{r.release}", "outcome": r.outcome}
                        for r in added.started],
            "seconds": round(time.monotonic() - began, 3)})

    async def remove_instance(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        host = request.match_info["host"]
        body: bodies.RemoveInstanceBody = await read_body(request, bodies.RemoveInstanceBody)
        if body.dry_run:
            plan = self.tenants.plan_removal(name, host, _removal(body.purge_data))
            return web.json_response({"app": name, "instance": host, **plan.dry_run()})
        await self.tenants.remove_instance(name, host, _removal(body.purge_data))
        return web.json_response({"app": name, "removed": host,
                                  "purged_data": body.purge_data})

    async def instance_config(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        inst = self.tenants.instance_of(name, request.match_info["host"])
        app = self.tenants.app(name)
        return web.json_response({"app": name, "instance": inst.host, "config": inst.config,
                                  "app_config": app.config,
                                  "effective": {**app.config, **inst.config}})

    async def set_instance_config(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        host = request.match_info["host"]
        body: bodies.InstanceConfigBody = await read_body(request, bodies.InstanceConfigBody)
        changes = body.changes()
        if not changes:
            raise UserError("nothing to change", hint="give K=V to set or K to unset")
        results = await self.tenants.set_instance_config(name, host, changes)
        # A parked instance is not restarted: it takes the config at its next wake.
        return web.json_response({"app": name, "instance": host, "changed": sorted(changes),
                                  "restarted": [r.host for r in results
                                                if r.outcome not in ("parked", "deferred")],
                                  "parked": [r.host for r in results
                                             if r.outcome in ("parked", "deferred")]})

    async def list_aliases(self, request: web.Request) -> web.Response:
        inst = self.tenants.instance(request.match_info["host"])
        return web.json_response({"instance": inst.host, "app": inst.app,
                                  "aliases": [a.host for a in
                                              self.store.list_aliases(inst.host)]})

    async def add_aliases(self, request: web.Request) -> web.Response:
        body: bodies.AliasesBody = await read_body(request, bodies.AliasesBody)
        host = request.match_info["host"]
        found = await self.tenants.add_aliases(host, body.aliases)
        return web.json_response({"instance": host, "aliases": [a.host for a in found]})

    async def remove_aliases(self, request: web.Request) -> web.Response:
        body: bodies.AliasesBody = await read_body(request, bodies.AliasesBody)
        host = request.match_info["host"]
        found = await self.tenants.remove_aliases(host, body.aliases)
        return web.json_response({"instance": host, "aliases": [a.host for a in found]})
