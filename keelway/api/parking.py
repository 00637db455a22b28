"""The API of scale to zero and fences, per instance:

    POST /v1/instances/{host}/park     {}                  -> 200 {"host","state":"parked",
                                                                "parked":bool,"stopped":[gen],
                                                                "processes_stopped":N}
    POST /v1/instances/{host}/freeze   {"dry_run"}         -> 200 {"host","state":"frozen",
                                                                "frozen":bool}
    POST /v1/instances/{host}/wake     {}                  -> 202 {"host","accepted":true}
                                       {"wait":true}       -> 200 {"host","state":"running",
                                                                "woke":bool,"generations":{}}
    POST /v1/instances/{host}/fence    {"reason":R|null}   -> 200 fence
    POST /v1/instances/{host}/unfence  {"generation":N}    -> 200 fence + {"lifted":bool}
    GET  /v1/instances/{host}/fence                        -> 200 fence
    fence = {"host","generation","held","reason"}

A wake without `wait` is the router's: it is answered as soon as the wake is started
(or joined: one wake per instance however many ask), and the router learns the rest
from the route table. A fenced instance's wake is refused 409 `fenced` at once; a parked
one whose web waits out a crash backoff, 503 `crash-backoff` (with Retry-After) until
the retry is due. `wait` (an operator's wake) tries such an instance now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from keelway.api import bodies
from keelway.api.http import error_response, read_body, route
from keelway.api.plans import plan_response
from keelway.deploy import fences, targets
from keelway.deploy.errors import UserError
from keelway.deploy.freezing import Freezing
from keelway.deploy.parking import CrashBackoff, Parking
from keelway.journal import OpKind, StepKind
from keelway.store.lifecycle import StepState
from keelway.store.records import Fence


class WakeBody(msgspec.Struct, forbid_unknown_fields=True):
    wait: bool = False
    dry_run: bool = False


class FenceBody(msgspec.Struct, forbid_unknown_fields=True):
    reason: str | None = None


class UnfenceBody(msgspec.Struct, forbid_unknown_fields=True):
    generation: int


def fence_view(host: str, fence: Fence | None) -> dict[str, Any]:
    if fence is None:
        return {"host": host, "generation": 0, "held": False, "reason": None}
    return {"host": host, "generation": fence.generation, "held": fence.held,
            "reason": fence.reason}


@dataclass(frozen=True)
class ParkingApi:
    parking: Parking
    freezing: Freezing | None = None

    @route("POST", "/v1/instances/{host}/freeze")
    async def freeze(self, request: web.Request) -> web.Response:
        body: bodies.DryRunBody = await read_body(request, bodies.DryRunBody)
        if self.freezing is None:
            raise UserError("this control plane does not freeze instances")
        host = request.match_info["host"]
        if body.dry_run:
            return plan_response(self.freezing.dry_freeze(host))
        froze = await self.freezing.freeze(host)
        return web.json_response({"host": host, "state": "frozen", "frozen": froze})


    @route("POST", "/v1/instances/{host}/park")
    async def park(self, request: web.Request) -> web.Response:
        body: bodies.DryRunBody = await read_body(request, bodies.DryRunBody)
        if body.dry_run:
            return plan_response(self.parking.dry_park(request.match_info["host"]))
        done = await self.parking.park(request.match_info["host"])
        return web.json_response({"host": done.host, "state": "parked", "parked": done.parked,
                                  "stopped": list(done.stopped),
                                  "processes_stopped": len(done.stopped)
                                  + self._replicators_stopped(done.host, done.parked)})

    def _replicators_stopped(self, host: str, parked: bool) -> int:
        """The replicator the park stopped (after the app, a step of the same
        operation: ReplicaKeeper.keep_replica), so the count says every process it stopped."""
        store = self.parking.store
        op = store.ops.latest_operation_of(host, (OpKind.PARK,)) if parked else None
        return sum(1 for step in (store.ops.steps(op.id) if op is not None else [])
                   if step.kind is StepKind.REPLICA_STOP and step.state is StepState.SUCCEEDED)

    @route("POST", "/v1/instances/{host}/wake")
    async def wake(self, request: web.Request) -> web.Response:
        body: WakeBody = await read_body(request, WakeBody)
        host = request.match_info["host"]
        if body.dry_run:
            return plan_response(self.parking.dry_wake(host))
        if not body.wait:
            try:
                self.parking.wake_soon(host)
            except CrashBackoff as exc:
                # The router answers its held requests 503 now and asks again later.
                refused = error_response(503, exc.code, exc.message, exc.hint)
                refused.headers["Retry-After"] = str(
                    max(1, math.ceil(exc.retry_at - self.parking.clock.now())))
                return refused
            return web.json_response({"host": host, "accepted": True}, status=202)
        woken = await self.parking.wake(host)
        return web.json_response({"host": woken.host, "state": "running", "woke": woken.woke,
                                  "generations": woken.generations})

    @route("POST", "/v1/instances/{host}/fence")
    async def fence(self, request: web.Request) -> web.Response:
        body: FenceBody = await read_body(request, FenceBody)
        host = request.match_info["host"]
        held = fences.fence(self.parking.store, host, body.reason)
        return web.json_response(fence_view(host, held))

    @route("POST", "/v1/instances/{host}/unfence")
    async def unfence(self, request: web.Request) -> web.Response:
        body: UnfenceBody = await read_body(request, UnfenceBody)
        host = request.match_info["host"]
        fence, lifted = fences.unfence(self.parking.store, host, body.generation)
        return web.json_response(fence_view(host, fence) | {"lifted": lifted})

    @route("GET", "/v1/instances/{host}/fence")
    async def get_fence(self, request: web.Request) -> web.Response:
        host = request.match_info["host"]
        targets.instance_named(self.parking.store, host)
        return web.json_response(fence_view(host, self.parking.store.instances.get_fence(host)))
