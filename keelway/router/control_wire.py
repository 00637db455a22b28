"""The control protocol's messages: newline-delimited JSON over a unix socket.

Shared by the router's control server and its clients, so both sides read one
definition. One request per line, one reply per line, in order:

    {"op":"set","table":{...}}  -> {"ok":true,"version":N}, plus "refused":{host:why}
                                   for entries refused alone (the rest apply)
    {"op":"get"}                -> {"ok":true,"table":{...}}
    {"op":"ping"}               -> {"ok":true,"pid":PID,"table_format":F}: F is the
                                   table format it reads (route_table.TABLE_FORMAT;
                                   absent from a router of format 1)
    {"op":"handoff"}            -> {"ok":true,"pid":PID} with the listening socket
                                   attached (SCM_RIGHTS) to that same reply line
    {"op":"inflight"}           -> {"ok":true,"inflight":{"127.0.0.1:PORT":N,...}}
    {"op":"retire"}             -> {"ok":true,"pid":PID}; then it stops accepting,
                                   drains and exits
    {"op":"activity"}           -> {"ok":true,"activity":{"HOST":{"idle_s":F,"open":N},...}}
                                   over every worker: idle_s is the least any worker
                                   saw (0.0 while open), open the sum; every host of
                                   the current table is named
    {"op":"responses"}          -> {"ok":true,"responses":{"incarnation":"HEX",
                                   "started_at":F,"worker_restarts":N,"instances":
                                   {"HOST":{"app":{"2xx":N,...},"router":{"503":N,...}}}}}
                                   per instance (its primary host), cumulative since
                                   started_at over every worker (counts.ResponseCounts)
    anything refused            -> {"ok":false,"error":"..."}
"""

from __future__ import annotations

from typing import Final

import msgspec

from keelway.router.counts import ResponseCounts
from keelway.router.route_table import RouteTable, TableOffer

MAX_LINE_BYTES: Final = 16 * 1024 * 1024


class SetTable(msgspec.Struct, tag_field="op", tag="set", frozen=True):
    table: TableOffer


class GetTable(msgspec.Struct, tag_field="op", tag="get", frozen=True):
    """The table the router serves now."""


class Ping(msgspec.Struct, tag_field="op", tag="ping", frozen=True):
    """Is a router there: its pid and the route table format it reads (an older
    router, kept across an upgrade, is replaced before anything is pushed to it)."""


class Handoff(msgspec.Struct, tag_field="op", tag="handoff", frozen=True):
    """The listening socket, passed back over the control socket (SCM_RIGHTS): to a
    successor taking over, or to the control plane keeping a copy so that it can
    start a router on that same socket if this one dies."""


class RetireRouter(msgspec.Struct, tag_field="op", tag="retire", frozen=True):
    """Stop accepting; finish what is in flight and exit (after a handoff)."""


class Inflight(msgspec.Struct, tag_field="op", tag="inflight", frozen=True):
    """Requests in flight per upstream, over every worker: a deploy stops an old web
    process only once none are left to it."""


class GetActivity(msgspec.Struct, tag_field="op", tag="activity", frozen=True):
    """Per host, seconds since its last request and its connections open now, over
    every worker (keelway/activator counts idleness from it)."""


class GetResponses(msgspec.Struct, tag_field="op", tag="responses", frozen=True):
    """Per instance, the responses sent to clients so far by status class, the router's
    own answers apart, over every worker (a rollout judges a cohort on them)."""


class HostActivity(msgspec.Struct, frozen=True):
    """One host's traffic as the router saw it: seconds since its last request or
    open connection (precise to the interval between activity requests), and its
    requests open now (streaming responses, WebSocket tunnels, held requests)."""

    idle_s: float
    open: int


ControlRequest = (SetTable | GetTable | Ping | Handoff | RetireRouter | Inflight | GetActivity
                  | GetResponses)


class Reply(msgspec.Struct, frozen=True, omit_defaults=True):
    ok: bool
    version: int | None = None
    table: RouteTable | None = None
    pid: int | None = None
    table_format: int | None = None
    inflight: dict[str, int] | None = None
    activity: dict[str, HostActivity] | None = None
    responses: ResponseCounts | None = None
    refused: dict[str, str] | None = None
    error: str | None = None


request_decoder: Final = msgspec.json.Decoder(ControlRequest)
reply_decoder: Final = msgspec.json.Decoder(Reply)


def encode_line(message: msgspec.Struct) -> bytes:
    return msgspec.json.encode(message) + b"\n"
