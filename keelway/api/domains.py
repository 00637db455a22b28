"""The API of domains, the aliases of an instance (keelway/deploy/domains.py).

    GET  /v1/instances/{host}/domains                      -> 200 {"instance","app","aliases"}
    POST /v1/instances/{host}/domains         {"aliases"}  -> 200 {"instance","aliases"}
    POST /v1/instances/{host}/domains/remove  {"aliases"}  -> 200 {"instance","aliases"}
"""

from __future__ import annotations

from aiohttp import web

from keelway.api import bodies
from keelway.api.http import read_body
from keelway.deploy import instances
from keelway.deploy.domains import Domains
from keelway.store import Store


class DomainsApi:
    def __init__(self, store: Store, domains: Domains) -> None:
        self.store = store
        self.domains = domains

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/instances/{host}/domains", self.list_aliases),
            web.post("/v1/instances/{host}/domains", self.add_aliases),
            web.post("/v1/instances/{host}/domains/remove", self.remove_aliases),
        ]

    async def list_aliases(self, request: web.Request) -> web.Response:
        inst = instances.named(self.store, request.match_info["host"])
        return web.json_response({"instance": inst.host, "app": inst.app,
                                  "aliases": [a.host for a in
                                              self.store.instances.list_aliases(inst.host)]})

    async def add_aliases(self, request: web.Request) -> web.Response:
        body: bodies.AliasesBody = await read_body(request, bodies.AliasesBody)
        host = request.match_info["host"]
        found = await self.domains.add_aliases(host, body.aliases)
        return web.json_response({"instance": host, "aliases": [a.host for a in found]})

    async def remove_aliases(self, request: web.Request) -> web.Response:
        body: bodies.AliasesBody = await read_body(request, bodies.AliasesBody)
        host = request.match_info["host"]
        found = await self.domains.remove_aliases(host, body.aliases)
        return web.json_response({"instance": host, "aliases": [a.host for a in found]})
