"""The API of the certificates the router's HTTPS serves (keelway/certs.py):

    GET  /v1/certs                                  -> 200 {"certificates":[cert],
                                                            "acme": ca|null,
                                                            "failing":[backoff]}
    POST /v1/certs/{host} {"certificate","key"}     -> 200 cert
    POST /v1/certs/{host}/renew {"dry_run"}         -> 200 {"plan"} | {"op","certificate"}
    POST /v1/certs/{host}/demand {}                 -> 200 | 404 | 503 (the router's ask)
    cert = {"name","names","issuer","not_before","not_after","served"}
    backoff = {"name","error","failures","retry_at"}

`renew` orders a certificate for the host from the ACME CA now, as a `certify`
operation (keelway/deploy/certify.py), whatever its back-off; a CA's refusal is an
error naming what it said, the old certificate still served. `demand` is the router's
at a handshake naming a served host with no certificate: it answers once there is one
(200), or at once when there cannot be (404: not served, or ACME off; 503: backing off
or the CA failed), bounded by the certifier's wait.

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
from keelway.api.plans import plan_response
from keelway.deploy.certify import Certifier
from keelway.deploy.errors import AppFailed, NotFoundError, UserError, checked
from keelway.home import Home
from keelway.store import Store

MAX_PEM_CHARS = 64 * 1024


class CertBody(msgspec.Struct, forbid_unknown_fields=True):
    certificate: str
    key: str


class RenewBody(msgspec.Struct, forbid_unknown_fields=True):
    dry_run: bool = False


class CertificateFailed(AppFailed):
    """The CA did not issue: what it said; the certificate served (if any) still is."""

    code = "certificate-failed"


@dataclass(frozen=True)
class CertsApi:
    store: Store
    home: Home
    certifier: Certifier | None = None

    def served(self) -> set[str]:
        return ({i.host for i in self.store.instances.list_instances()}
                | {a.host for a in self.store.instances.list_aliases()})

    @route("GET", "/v1/certs")
    async def listing(self, _request: web.Request) -> web.Response:
        found = await asyncio.to_thread(certs.certificates, self.home)
        served = self.served()
        ca = self.certifier.authority if self.certifier is not None else None
        failing = await asyncio.to_thread(certs.backoffs, self.home)
        return web.json_response({"certificates": [
            c.view() | {"served": c.name in served} for c in found],
            "acme": ca.view() if ca is not None and self.certifier is not None
            and self.certifier.on else None,
            "failing": [b.view() for _, b in sorted(failing.items())]})

    @route("POST", "/v1/certs/{host}/renew")
    async def renew(self, request: web.Request) -> web.Response:
        host = checked(names.HOST, request.match_info["host"])
        body: RenewBody = await read_body(request, RenewBody)
        certifier = self._certifier()
        if body.dry_run:
            return plan_response(certifier.dry_run(host))
        ran = await certifier.certify(host, renew=True)
        if not ran.done:
            reason = ran.result.reason if ran.result is not None else "failed"
            raise CertificateFailed(f"no new certificate for {host}: {reason}",
                                    hint="the certificate served before (if any) still is; "
                                         "`keelway certs list` says when it is tried again")
        info = next((c for c in await asyncio.to_thread(certs.certificates, self.home)
                     if c.name == host), None)
        return web.json_response({"plan": ran.plan.as_json(),
                                  "certificate": info.view() if info else None})

    @route("POST", "/v1/certs/{host}/demand")
    async def demand(self, request: web.Request) -> web.Response:
        host = request.match_info["host"].lower().rstrip(".")
        certifier = self.certifier
        if certifier is None or not certifier.on or certifier.owner_of(host) is None:
            return web.json_response({"ok": False}, status=404)
        if await certifier.demand(host):
            return web.json_response({"ok": True})
        return web.json_response({"ok": False}, status=503)

    def _certifier(self) -> Certifier:
        if self.certifier is None or not self.certifier.on:
            raise UserError("keelway orders no certificates here: HTTPS is off "
                            "(`keelway up --https ADDR`) or ACME is (`--acme-directory`)")
        return self.certifier

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
