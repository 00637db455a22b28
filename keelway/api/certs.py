"""The API of the certificates the router's HTTPS serves (keelway/certs.py):

    GET  /v1/certs                                  -> 200 {"certificates":[cert]}
    POST /v1/certs/{host} {"certificate","key"}     -> 200 cert
    cert = {"name","names","issuer","not_before","not_after","served"}

An import names a host keelway serves (an instance's host or alias); the pair is
checked (it parses, covers the host, has not expired, the key is the certificate's)
before anything is written, and laid down whole. The key crosses the API once, into
its file: no answer, error or log line holds it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import msgspec
from aiohttp import web

from keelway import certs, names
from keelway.api.http import read_body, route
from keelway.deploy.errors import NotFoundError, UserError, checked
from keelway.home import Home
from keelway.store import Store

MAX_PEM_CHARS = 64 * 1024


class CertBody(msgspec.Struct, forbid_unknown_fields=True):
    certificate: str
    key: str


@dataclass(frozen=True)
class CertsApi:
    store: Store
    home: Home

    def served(self) -> set[str]:
        return ({i.host for i in self.store.instances.list_instances()}
                | {a.host for a in self.store.instances.list_aliases()})

    @route("GET", "/v1/certs")
    async def listing(self, _request: web.Request) -> web.Response:
        found = await asyncio.to_thread(certs.certificates, self.home)
        served = self.served()
        return web.json_response({"certificates": [
            c.view() | {"served": c.name in served} for c in found]})

    @route("POST", "/v1/certs/{host}")
    async def import_pair(self, request: web.Request) -> web.Response:
        host = checked(names.HOST, request.match_info["host"])
        body: CertBody = await read_body(request, CertBody)
        if host not in self.served():
            raise NotFoundError(f"keelway serves no host {host}",
                                hint="import a certificate for an instance's host or alias "
                                     "(`keelway status`, `keelway domains list`)")
        if len(body.certificate) > MAX_PEM_CHARS or len(body.key) > MAX_PEM_CHARS:
            raise UserError(f"a certificate or key over {MAX_PEM_CHARS // 1024} KiB is not "
                            "a PEM certificate chain or key")
        chain, key = body.certificate.encode(), body.key.encode()
        try:
            info = certs.check_pair(host, chain, key)
        except certs.CertificateError as exc:
            raise UserError(f"cannot import a certificate for {host}: {exc}") from None
        await asyncio.to_thread(certs.lay_down, self.home, host, chain, key)
        return web.json_response(info.view() | {"served": True})
