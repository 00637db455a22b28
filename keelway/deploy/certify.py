"""Certificates by ACME as operations (issue #21): one name's certificate ordered,
validated, finalized and installed as a journaled `certify` operation on the instance
that name serves, through the one runner, so a crash at any step is ended by the boot
pass and the next `certify` of the name carries the same order on (keelway/issuance.py
keeps it in files) rather than placing another.

Who asks for one:
- the keeper (`Certifier.keep`), every SWEEP_S: each host and alias of every instance
  with no certificate yet, or two thirds through its certificate's life (`due`), and
  not backing off, one at a time;
- the router, at the first handshake naming a served host that has none (`demand`:
  `POST /v1/certs/HOST/demand`, the handshake waiting, bounded by DEMAND_WAIT_S). A
  name keelway does not serve is refused before anything is asked of the CA;
- a person: `keelway certs renew HOST` (`renew=True`: now, whatever the back-off).

Rules it keeps:
- One certify at a time on the box (`_one`): the CA's client and its nonces are one
  account's, and a CA's rate limits are per account anyway.
- The operation holds its instance's lock only to journal: while the CA is waited on
  the lock is lent out (Runner.lent), so a wake or a deploy never waits for a CA.
- A failure backs off: 1 min after the first, doubling to a day, and never sooner
  than the CA's own Retry-After. The back-off is kept in `acme/backoff/NAME.json`
  (the error, when the next try is), read by `status`, `certs list` and `doctor`; a
  success removes it. The certificate served meanwhile stays served.
- Nothing but the CA's answer decides a name's certificate is good: a name whose
  certificate a person imported is renewed like any other once due.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from acme import client as acme_client

from keelway import certs, failpoints, issuance, names
from keelway.deploy.errors import NotFoundError, UserError
from keelway.deploy.operation import Bound, Plan, PlannedStep, Ran, Runner, Spec
from keelway.deploy.steps import Done, Failed
from keelway.deploy.targets import instance_named
from keelway.durable import PRIVATE_FILE_MODE, write_atomic
from keelway.home import PRIVATE_DIR_MODE, Home
from keelway.journal import OpKind, StepKind
from keelway.store import Store
from keelway.store.records import Operation

log: Final = logging.getLogger("keelway.certify")

SWEEP_S: Final = float(os.environ.get("KEELWAY_CERT_SWEEP_S", "60"))
RENEW_AT: Final = 2 / 3
BACKOFF_FIRST_S: Final = 60.0
BACKOFF_MAX_S: Final = 86400.0
DEMAND_WAIT_S: Final = 20.0

failpoints.declare("certify.order.before", "certify.order.after",
                   "certify.authorize.before", "certify.authorize.after",
                   "certify.finalize.before", "certify.finalize.after",
                   "certify.install.before", "certify.install.after")


@dataclass(frozen=True)
class CertifyRequest:
    host: str  # the instance
    name: str  # its host or one of its aliases
    directory: str  # the CA's, as the plan says it
    challenge: str


def plan_certify(store: Store, request: CertifyRequest) -> Plan:
    inst = instance_named(store, request.host)
    name, ca = request.name, request.directory
    return Plan(OpKind.CERTIFY, inst.app, inst.host, (
        PlannedStep(StepKind.ORDER, f"order a certificate for {name} from {ca} (or find "
                    "the order a crash left under way)", "order",
                    before=("certify.order.before",), after=("certify.order.after",),
                    detail=name),
        PlannedStep(StepKind.AUTHORIZE, f"answer the CA's {request.challenge} challenge "
                    f"for {name} from the router", "authorize",
                    before=("certify.authorize.before",),
                    after=("certify.authorize.after",)),
        PlannedStep(StepKind.FINALIZE, "wait for the CA to validate it, finalize the order "
                    "and fetch the certificate", "finalize",
                    before=("certify.finalize.before",), after=("certify.finalize.after",)),
        PlannedStep(StepKind.INSTALL, f"install it for {name} (the router serves it from "
                    "its next handshake)", "install",
                    before=("certify.install.before",), after=("certify.install.after",))))


def next_delay(failures: int, retry_after_s: float | None) -> float:
    """How long after its `failures`th failure in a row a name is tried again."""
    delay = min(BACKOFF_FIRST_S * float(2 ** max(0, failures - 1)), BACKOFF_MAX_S)
    return max(delay, retry_after_s or 0.0)


def due(not_before: float, not_after: float, now: float) -> bool:
    """Whether a certificate valid over [not_before, not_after] is renewed at `now`."""
    return now >= not_before + (not_after - not_before) * RENEW_AT


def challenge_for(ca: issuance.CertificateAuthority, http_port: int | None,
                  https_port: int | None) -> str:
    """The challenge `auto` answers: TLS-ALPN-01 where only HTTPS is on its standard
    port (a CA validates HTTP-01 on port 80 alone), else HTTP-01."""
    if ca.challenge != "auto":
        return ca.challenge
    if https_port == 443 and http_port != 80:
        return issuance.TLSALPN01
    return issuance.HTTP01


@dataclass(eq=False)
class Certifier:
    """The certify operations of one control plane (see the module header)."""

    store: Store
    home: Home
    runner: Runner
    authority: issuance.CertificateAuthority | None
    http_port: int | None = None
    https_port: int | None = None
    clock: Callable[[], float] = time.time
    _one: asyncio.Lock = field(default_factory=asyncio.Lock)
    _client: acme_client.ClientV2 | None = None
    # A failure's Retry-After, from the effect that met it to the back-off.
    _asked_wait: dict[str, float | None] = field(default_factory=dict)
    _sweeping: bool = False

    @property
    def on(self) -> bool:
        return self.authority is not None and self.https_port is not None

    def owner_of(self, name: str) -> str | None:
        """The instance `name` serves (its host or an alias), if any: the store's one
        claim of a host, not a listing of every alias."""
        if not names.HOST.accepts(name):
            return None
        claim = self.store.instances.claim(name)
        return None if claim is None else claim.instance

    def request(self, name: str) -> CertifyRequest:
        """What a certify of `name` would run, or UserError / NotFoundError saying why
        none can."""
        if self.authority is None:
            raise UserError("ACME is off on this box (`keelway up --acme-directory "
                            "off`): import a certificate with `keelway certs import`")
        host = self.owner_of(name)
        if host is None:
            raise NotFoundError(f"keelway serves no host {name}",
                                hint="a certificate is for an instance's host or alias")
        if not self.authority.orders_for(name):
            raise UserError(f"{name} is a special-use name no public CA issues for; "
                            "import one (`keelway certs import`) or use a private CA "
                            "(`keelway up --acme-directory URL`)")
        return CertifyRequest(host, name, self.authority.directory,
                              challenge_for(self.authority, self.http_port,
                                            self.https_port))

    def dry_run(self, name: str) -> Plan:
        return self.runner.dry_run(CERTIFY, self.request(name))

    async def certify(self, name: str, *, renew: bool = False) -> Ran:
        """A certificate for `name` now (`renew`), or if it has none or is due; the
        operation's outcome, its failure backed off."""
        request = self.request(name)
        async with self._one:
            if not renew and not self.wanted(name):
                return Ran(Plan(OpKind.CERTIFY, "", request.host,
                                nothing=f"{name}'s certificate is not due"), None)
            ran = await self.runner.run(CERTIFY, self, request)
        if ran.result is not None:
            self._settle(name, ran)
        return ran

    async def demand(self, name: str) -> bool:
        """The router's ask at a handshake: True once `name` has a certificate to
        serve. Only a served name, with ACME on and not backing off, is ordered."""
        if not self.on or self.owner_of(name) is None:
            return False
        if certs.not_after(self.home.certs_dir, name) is not None:
            return True
        held = certs.backoffs(self.home).get(name)
        if held is not None and held.retry_at > self.clock():
            return False
        try:
            ran = await asyncio.wait_for(self.certify(name), DEMAND_WAIT_S)
        except (UserError, NotFoundError, TimeoutError):
            return False
        return ran.done and certs.not_after(self.home.certs_dir, name) is not None

    def wanted(self, name: str) -> bool:
        """Whether `name` has no certificate, or one due for renewal."""
        found = certs.validity(self.home.certs_dir, name)
        return found is None or due(*found, self.clock())

    def names(self) -> list[str]:
        return sorted({i.host for i in self.store.instances.list_instances()}
                      | {a.host for a in self.store.instances.list_aliases()})

    async def keep(self) -> None:
        """Forever: every name that wants a certificate, not backing off, certified,
        one at a time (the daemon's task)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                await self.sweep()
            except Exception:  # the keeper must outlive one bad pass
                log.exception("certificate keeper: a pass failed; the next one tries again")

    async def sweep(self) -> list[str]:
        """One pass of the keeper; the names it certified (or tried to)."""
        if not self.on or self._sweeping:
            return []
        assert self.authority is not None
        self._sweeping = True
        try:
            names = [n for n in self.names() if self.authority.orders_for(n)]
            wanting = await asyncio.to_thread(self._wanting, names)
            tried = []
            for name in wanting:
                if self.owner_of(name) is None:
                    continue  # removed meanwhile
                try:
                    await self.certify(name)
                except (UserError, NotFoundError) as exc:
                    log.info("certificate keeper: %s: %s", name, exc)
                    continue
                tried.append(name)
            return tried
        finally:
            self._sweeping = False

    def _wanting(self, names: Iterable[str]) -> list[str]:
        now = self.clock()
        held = certs.backoffs(self.home)
        return [n for n in names
                if (n not in held or held[n].retry_at <= now) and self.wanted(n)]

    # -- the effects (in a thread, the instance's lock lent out) ------------------------

    def acme(self) -> acme_client.ClientV2:
        assert self.authority is not None
        if self._client is None:
            self._client = issuance.client(self.home, self.authority)
        return self._client

    def _settle(self, name: str, ran: Ran) -> None:
        """The back-off after an outcome: gone after a success, grown after a failure."""
        path = certs.backoff_dir(self.home) / f"{name}.json"
        asked = self._asked_wait.pop(name, None)
        if ran.done:
            path.unlink(missing_ok=True)
            return
        before = certs.backoffs(self.home).get(name)
        failures = (before.failures if before is not None else 0) + 1
        reason = ran.result.reason if ran.result is not None else None
        retry_at = self.clock() + next_delay(failures, asked)
        path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"name": name, "error": reason or "failed",
                                       "failures": failures, "retry_at": retry_at}).encode(),
                     PRIVATE_FILE_MODE)
        self.store.ops.add_event(
            "certificate", f"no certificate for {name} yet: {reason}; tried again after "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(retry_at))}",
            instance=ran.plan.host, app=ran.plan.app)


def _at_the_ca(phase: Callable[[Certifier, CertifyRequest], str]) -> Callable[
        [Certifier, CertifyRequest, PlannedStep], Bound]:
    """An effect that talks to the CA: in a thread, with the instance's lock lent out;
    the CA's refusal fails the step with what it said."""
    def bind(parts: Certifier, request: CertifyRequest, _step: PlannedStep) -> Bound:
        async def run(_op: Operation) -> Done | Failed:
            async with parts.runner.lent(request.host):
                try:
                    said = await asyncio.to_thread(phase, parts, request)
                except issuance.IssuanceError as exc:
                    parts._asked_wait[request.name] = exc.retry_after_s
                    if "reach" in str(exc) or "the CA at" in str(exc):
                        parts._client = None  # signed in again next time
                    return Failed(str(exc))
            return Done(said)
        return run
    return bind


def _order(parts: Certifier, request: CertifyRequest) -> str:
    assert parts.authority is not None
    return issuance.place_order(parts.home, parts.acme(), parts.authority, request.name)


def _authorize(parts: Certifier, request: CertifyRequest) -> str:
    return issuance.answer_challenges(parts.home, parts.acme(),
                                      request.name, request.challenge)


def _finalize(parts: Certifier, request: CertifyRequest) -> str:
    return issuance.finish_order(parts.home, parts.acme(), request.name)


def _install(parts: Certifier, request: CertifyRequest, _step: PlannedStep) -> Bound:
    async def run(_op: Operation) -> Done | Failed:
        def lay() -> str:
            got = issuance.take(parts.home, request.name)
            if got is None:
                raise issuance.IssuanceError(f"no certificate was fetched for {request.name}")
            chain, key = got
            try:
                info = certs.check_pair(request.name, chain, key)
            except certs.CertificateError as exc:
                issuance.discard(parts.home, request.name)
                raise issuance.IssuanceError(f"the CA's certificate for {request.name}: {exc}") \
                    from None
            certs.lay_down(parts.home, request.name, chain, key)
            issuance.discard(parts.home, request.name)
            return (f"{request.name} served with the certificate from {info.issuer}, valid "
                    f"until {time.strftime('%Y-%m-%d', time.gmtime(info.not_after))}")
        try:
            return Done(await asyncio.to_thread(lay))
        except issuance.IssuanceError as exc:
            return Failed(str(exc))
    return run


CERTIFY: Spec[CertifyRequest, Certifier] = Spec(
    OpKind.CERTIFY, plan_certify,
    {"order": _at_the_ca(_order), "authorize": _at_the_ca(_authorize),
     "finalize": _at_the_ca(_finalize), "install": _install},
    converge_first=False, orphaned=True)
