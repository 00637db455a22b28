"""The API of instances (keelway/deploy/instances.py): added, removed and listed, and
an instance's own config. Every request is checked by the one rule of each name before
anything changes; adding 500 hosts is this one request. Config values are shown only by
the config endpoint. `dry_run` on an add or a removal answers the plan it would run
(keelway/deploy/planned.py Plan.dry_run) and changes nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from keelway.api import bodies
from keelway.api.apps import removal
from keelway.api.http import app_name, encoded_response, read_body, route
from keelway.api.plans import plan_response
from keelway.api.status import Page, instances_json
from keelway.deploy import apps, instances
from keelway.deploy.errors import UserError
from keelway.deploy.instances import AddRequest, Instances, starts_after_add
from keelway.store import Store


@dataclass(frozen=True)
class InstancesApi:
    store: Store
    instances: Instances
    http_port: int | None
    # Where the home's certificates are, for the attention an instance needs.
    home_root: Path | None = None

    @route("GET", "/v1/apps/{app}/instances")
    async def list_instances(self, request: web.Request) -> web.Response:
        """Every instance of the app, or with `page` (and `per_page`) that page of them,
        after a summary that counts them all (keelway/api/status.py)."""
        name = app_name(self.store, request)
        page = Page.parse(request.query.get("page"), request.query.get("per_page"))
        # Read aside, as `status` is: 10,000 instances' read is not this loop's to wait on.
        return encoded_response(await self.store.read_aside(
            instances_json, name, self.http_port, page, self.home_root))

    @route("POST", "/v1/apps/{app}/instances")
    async def add_instances(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        body: bodies.AddInstancesBody = await read_body(request, bodies.AddInstancesBody)
        if body.dry_run:
            plan = self.instances.plan_add_instances(name, body.hosts, body.config,
                                                   parked=body.parked)
            # What follows the operation: each instance's start, an attempt of its own.
            starts = starts_after_add(self.store, AddRequest(
                body.hosts[0], name, tuple(body.hosts), body.parked))
            return web.json_response({"dry_run": True, "plans": [plan.as_json()],
                                      "lines": plan.lines() + starts})
        began = time.monotonic()
        added = await self.instances.add_instances(name, body.hosts, body.config,
                                                 parked=body.parked)
        return web.json_response({
            "app": name, "added": [i.host for i in added.instances],
            "started": [{"host": r.host, "release": f"v{r.release}", "outcome": r.outcome}
                        for r in added.started],
            "seconds": round(time.monotonic() - began, 3)})

    @route("POST", "/v1/apps/{app}/instances/{host}/remove")
    async def remove_instance(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        host = request.match_info["host"]
        body: bodies.RemoveInstanceBody = await read_body(request, bodies.RemoveInstanceBody)
        if body.dry_run:
            plan = self.instances.plan_removal(name, host, removal(body.purge_data))
            return plan_response(plan)
        await self.instances.remove_instance(name, host, removal(body.purge_data))
        return web.json_response({"app": name, "removed": host,
                                  "purged_data": body.purge_data})

    @route("GET", "/v1/apps/{app}/instances/{host}/config")
    async def instance_config(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        inst = instances.of_app(self.store, name, request.match_info["host"])
        app = apps.named(self.store, name)
        return web.json_response({"app": name, "instance": inst.host, "config": inst.config,
                                  "app_config": app.config,
                                  "effective": {**app.config, **inst.config}})

    @route("POST", "/v1/apps/{app}/instances/{host}/config")
    async def set_instance_config(self, request: web.Request) -> web.Response:
        name = app_name(self.store, request)
        host = request.match_info["host"]
        body: bodies.InstanceConfigBody = await read_body(request, bodies.InstanceConfigBody)
        changes = body.changes()
        if not changes:
            raise UserError("nothing to change", hint="give K=V to set or K to unset")
        results = await self.instances.set_instance_config(name, host, changes)
        # A parked instance is not restarted: it takes the config at its next wake.
        return web.json_response({"app": name, "instance": host, "changed": sorted(changes),
                                  "restarted": [r.host for r in results
                                                if r.outcome not in ("parked", "deferred")],
                                  "parked": [r.host for r in results
                                             if r.outcome in ("parked", "deferred")]})
