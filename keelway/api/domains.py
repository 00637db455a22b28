"""The API of domains, the aliases of an instance (keelway/deploy/domains.py).

    GET  /v1/instances/{host}/domains                      -> 200 {"instance","app","aliases"}
    POST /v1/instances/{host}/domains         {"aliases"}  -> 200 {"instance","aliases"}
    POST /v1/instances/{host}/domains/remove  {"aliases"}  -> 200 {"instance","aliases"}
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from keelway.api import bodies
from keelway.api.http import read_body, route
from keelway.deploy import instances
from keelway.deploy.domains import Domains
from keelway.store import Store
from keelway.store.records import Alias


@dataclass(frozen=True)
class DomainsApi:
    store: Store
    domains: Domains


    @route("GET", "/v1/instances/{host}/domains")
    async def list_aliases(self, request: web.Request) -> web.Response:
        inst = instances.named(self.store, request.match_info["host"])
        return web.json_response({"instance": inst.host, "app": inst.app,
                                  "aliases": [a.host for a in
                                              self.store.instances.list_aliases(inst.host)]})

    @route("POST", "/v1/instances/{host}/domains")
    async def add_aliases(self, request: web.Request) -> web.Response:
        return await self._changed(request, self.domains.add_aliases)

    @route("POST", "/v1/instances/{host}/domains/remove")
    async def remove_aliases(self, request: web.Request) -> web.Response:
        return await self._changed(request, self.domains.remove_aliases)

    async def _changed(self, request: web.Request,
                       change: Callable[[str, Sequence[str]], Awaitable[list[Alias]]],
                       ) -> web.Response:
        """An add and a removal read one body and answer alike: the instance and the
        aliases the change answered."""
        body: bodies.AliasesBody = await read_body(request, bodies.AliasesBody)
        host = request.match_info["host"]
        found = await change(host, body.aliases)
        return web.json_response({"instance": host, "aliases": [a.host for a in found]})
