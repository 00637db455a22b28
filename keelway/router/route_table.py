"""The route table: which hostname goes where, as data, with no I/O.

Owns the wire/disk format of a table (JSON via msgspec), its validation, and the decision
a request's Host header leads to. Invariants:

- a `RouteTable` that exists is valid: decoding and construction both run the same checks
  (`__post_init__`), so the router never holds a table it could not have accepted; a
  route's host follows the one host rule (keelway/names.py), the same the API applies;
- a table offered to the router (`TableOffer`, what a push or the file on disk carries)
  is accepted entry by entry (`accept`): a bad entry is refused alone, with its reason,
  and every other entry applies, so one tenant's bad route never takes another's down;
- a table is never mutated after construction; the router swaps a whole `Routing` in one
  attribute assignment, so a request sees either the old table or the new one, never a mix;
- host keys are lowercase names without a port; `host_key` maps any Host header onto that
  form, so matching is case-insensitive and ignores the port;
- a route names the instance it serves (`instance`; absent: the route's own host, as a
  primary host's route and every table of an older keelway have it), and the router
  wakes, holds and counts activity per instance, whichever of its hosts a request used;
- an instance's bound on requests in flight is the smallest `max_concurrency` any of its
  routes names, or the router's default when none names one (keelway/router/
  concurrency.py enforces it);
- a route may ask for HTTPS (format 4): `force_https` redirects its plain-HTTP requests
  (308) to HTTPS, but ACME's HTTP-01 challenges; `hsts_s` adds Strict-Transport-Security
  to its HTTPS responses;
- a route may name the generation behind its upstream (format 5: `generation`), which
  only the access log reads (keelway/router/access_log.py); it changes no decision.

The format grows only by optional fields and new states, each entry judged alone, so a
router reads every table an older keelway wrote. A router older than a table's format
would refuse the entries it does not know: `TABLE_FORMAT` says which format a router
reads (its `ping` answers it), and the control plane replaces an older router before it
pushes to it (keelway/runtime/router_supervisor.py).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Annotated, Final, assert_never

import msgspec

from keelway import names

if TYPE_CHECKING:
    from keelway.router.exchange import InFlight, Tally
    from keelway.router.upstream import UpstreamPool


# The table format this router reads: 1 had no `instance` and no `stopped`,
# `no-release` or `crashed` state; 2 had no `max_concurrency`; 3 no `force_https` or
# `hsts_s`; 4 no `generation`.
TABLE_FORMAT: Final = 5


class Handling(enum.Enum):
    """What the router does with a request for one host: a route's state as the table
    carries it (the store's `RouteState` is the record it is published from).

    `serving` proxies to the upstream; `gated` answers 503 + Retry-After (an import or
    a fence holds it). `holding` (requests wait, bounded, for the next table: a
    hold-mode swap); `parked` (the instance is scaled to zero) holds exactly like
    `holding` and also asks the control plane to wake it (keelway/router/waker.py);
    `draining` (in-flight requests finish, new ones go to the successor) proxies like
    `serving`: the successor is simply the upstream the newest table names. `stopped`
    (its user stopped it), `no-release` (nothing deployed to it yet) and `crashed` (its
    web waits out a crash backoff; Retry-After: until the retry) answer 503 at once,
    each with its own page (keelway/router/responses.py).
    """

    SERVING = "serving"
    GATED = "gated"
    HOLDING = "holding"
    DRAINING = "draining"
    PARKED = "parked"
    STOPPED = "stopped"
    NO_RELEASE = "no-release"
    CRASHED = "crashed"


class Decision(enum.Enum):
    """The router's decision for a request whose host has a route."""

    PROXY = "proxy"
    UNAVAILABLE = "unavailable"


def decide(state: Handling) -> Decision:
    """The one place a route state becomes behaviour."""
    match state:
        case Handling.SERVING | Handling.DRAINING:
            return Decision.PROXY
        case (Handling.GATED | Handling.HOLDING | Handling.PARKED
              | Handling.STOPPED | Handling.NO_RELEASE | Handling.CRASHED):
            return Decision.UNAVAILABLE
        case _:
            assert_never(state)


NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]


def parse_upstream(address: str) -> tuple[str, int]:
    """Split `"127.0.0.1:34567"` (or `"[::1]:34567"`) into host and port.

    Raises ValueError naming what is wrong; never returns a port outside 1..65535.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"upstream {address!r} is not HOST:PORT")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"upstream {address!r} has a port outside 1..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


class RouteEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One host's route. `upstream` is required when the state proxies. `instance` is
    the instance the host belongs to when that is another host (an alias);
    `max_concurrency` bounds the instance's requests in flight (None: the router's
    default); `generation` is the generation its upstream runs, for the access log.
    Fields at their defaults are left out of the encoding, so a table that uses nothing
    new reads in a router of the format before."""

    state: Handling
    upstream: str | None = None
    retry_after_s: NonNegative = 5
    instance: str | None = None
    max_concurrency: Positive | None = None
    force_https: bool = False
    hsts_s: Positive | None = None
    generation: NonNegative | None = None

    def __post_init__(self) -> None:
        if self.instance is not None:
            names.HOST.check(self.instance)
        if decide(self.state) is Decision.PROXY:
            if self.upstream is None:
                raise ValueError(f"a {self.state.value} route needs an upstream")
            parse_upstream(self.upstream)
        elif self.upstream is not None:
            parse_upstream(self.upstream)


class RouteTable(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A versioned, complete set of routes. Versions only grow (the control server
    refuses a lower one); equal versions are accepted so a republish is harmless."""

    version: NonNegative
    routes: dict[str, RouteEntry] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for host in self.routes:
            names.HOST.check(host)


class TableOffer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A table as it is pushed or saved, each entry still to be checked on its own by
    `accept`. Only its frame (the version, a map of hosts) must be right as a whole."""

    version: NonNegative
    routes: dict[str, msgspec.Raw] = msgspec.field(default_factory=dict)

    @classmethod
    def of(cls, table: RouteTable) -> TableOffer:
        return cls(version=table.version, routes={
            host: msgspec.Raw(_route_encoder.encode(route))
            for host, route in table.routes.items()})


def accept(offer: TableOffer) -> tuple[RouteTable, dict[str, str]]:
    """The valid part of `offer` as a table, and each refused host with the reason.

    A refused host is left out of the table (no route: 404), never kept on what it had:
    an older route there could send traffic to a generation ACTIVE no longer names.
    """
    routes: dict[str, RouteEntry] = {}
    refused: dict[str, str] = {}
    for host, raw in offer.routes.items():
        try:
            names.HOST.check(host)
            routes[host] = _route_decoder.decode(raw)
        except (names.InvalidName, msgspec.DecodeError) as exc:
            refused[host] = str(exc)
    return RouteTable(version=offer.version, routes=routes), refused


EMPTY_TABLE: Final = RouteTable(version=0)

_table_decoder: Final = msgspec.json.Decoder(RouteTable)
_offer_decoder: Final = msgspec.json.Decoder(TableOffer)
_route_decoder: Final = msgspec.json.Decoder(RouteEntry)
_route_encoder: Final = msgspec.json.Encoder()


def decode_table(data: bytes) -> RouteTable:
    """Decode and validate a JSON table; raises `msgspec.ValidationError` or
    `msgspec.DecodeError` (both `msgspec.DecodeError`) with a message that says why."""
    return _table_decoder.decode(data)


def decode_offer(data: bytes) -> TableOffer:
    """Decode the frame of a table; raises `msgspec.DecodeError` only when the frame is
    wrong (not JSON, no version, routes not a map): entries are `accept`'s to judge."""
    return _offer_decoder.decode(data)


def encode_table(table: RouteTable) -> bytes:
    return msgspec.json.encode(table)


def host_key(raw: bytes) -> bytes:
    """Map a Host header value onto a table key: lowercase, port and trailing dot removed.

    `Blog.Test:8080` -> `blog.test`; `[::1]:8080` -> `[::1]`. Pure and cheap: it runs
    once per request, so it checks nothing itself: headers.py has refused a malformed
    Host before. For every host the host rule accepts, each spelling of it (any case, a
    port, a trailing dot) maps back onto it, and a key the rule accepts is always the
    header's own name before its port (tests/test_names.py).
    """
    raw = raw.lower()
    if raw[:1] == b"[":
        end = raw.find(b"]")
        return raw[: end + 1] if end > 0 else raw
    colon = raw.find(b":")
    if colon >= 0:
        raw = raw[:colon]
    if raw[-1:] == b".":
        raw = raw.rstrip(b".")
    return raw


class Traffic:
    """One instance's traffic in this process (through any of its hosts), kept across
    table swaps by the proxy. The hot path only marks the host's `CompiledRoute`
    (`hit`): no clock is read per request.
    `sample` folds the marks into an idle time on the caller's clock, so the idle time
    is as fine as the interval between samples (the activity op's callers) and never
    longer than the truth: a mark since the last sample means "active now"."""

    __slots__ = ("last_active", "pending")

    def __init__(self, now: float) -> None:
        self.pending = False  # a request was marked since the last sample
        self.last_active = now

    def sample(self, now: float, open_now: int) -> float:
        """Seconds idle at `now`, given `open_now` exchanges or tunnels still open."""
        if open_now or self.pending:
            self.pending = False
            self.last_active = now
        return max(0.0, now - self.last_active)


class CompiledRoute:
    """A compiled route: what the hot path needs, precomputed once per table."""

    __slots__ = ("force_https", "generation", "hit", "holding", "host", "hsts", "in_flight",
                 "instance", "parked", "pool", "proxied", "retry_after_s", "state", "tally",
                 "upstream_host", "upstream_key", "upstream_port")

    def __init__(self, host: str, route: RouteEntry) -> None:
        self.host: Final = host
        # What is woken, held and counted: the instance, whichever of its hosts this is.
        self.instance: Final = route.instance or host
        self.state: Final = route.state
        # A request came for this host since the proxy last looked (Proxy.activity).
        self.hit = False
        self.proxied: Final = decide(route.state) is Decision.PROXY
        # Requests wait (bounded) for the next table instead of getting 503 at once;
        # a parked route's also make the router ask for a wake.
        self.parked: Final = route.state is Handling.PARKED
        self.holding: Final = self.parked or route.state is Handling.HOLDING
        self.retry_after_s: Final = route.retry_after_s
        self.force_https: Final = route.force_https
        # The generation behind its upstream, for the access log (None: not named).
        self.generation: Final = route.generation
        # The header line its HTTPS responses carry, made once per table.
        self.hsts: Final = (None if route.hsts_s is None else
                            b"Strict-Transport-Security: max-age=%d\r\n" % route.hsts_s)
        self.upstream_key: Final = route.upstream or ""
        host, port = parse_upstream(route.upstream) if route.upstream else ("", 0)
        self.upstream_host: Final = host
        self.upstream_port: Final = port
        # The proxy's pool for upstream_key, remembered on first use. A target lives as
        # long as its table is current, and a swap retires only pools no target names.
        self.pool: UpstreamPool | None = None
        # Its instance's responses, the same for every alias and across tables: set by
        # the proxy before the table serves (None only in a table no proxy serves).
        self.tally: Tally | None = None
        # Its instance's requests in flight, shared the same way (Proxy sets it too).
        self.in_flight: InFlight | None = None


class Routing:
    """A table compiled for lookup by raw Host header bytes. Immutable after init."""

    __slots__ = ("by_host", "instances", "max_concurrency", "parked", "table")

    def __init__(self, table: RouteTable) -> None:
        self.table: Final = table
        # By the host as a route names it: a Host header that is already a bare
        # lowercase name (the common case) finds its target with one dict lookup.
        self.by_host: Final = {host.encode(): CompiledRoute(host, r)
                               for host, r in table.routes.items()}
        targets = self.by_host.values()
        self.instances: Final = frozenset(t.instance for t in targets)
        # Instances with a parked route (any of their hosts): the ones a request wakes.
        self.parked: Final = frozenset(t.instance for t in targets if t.parked)
        # Per instance whose routes name a bound, the smallest: aliases published apart
        # may disagree for a moment, and the tighter bound is the one that protects.
        bounds: dict[str, int] = {}
        for host, route in table.routes.items():
            if route.max_concurrency is not None:
                instance = route.instance or host
                named = bounds.get(instance)
                if named is None or route.max_concurrency < named:
                    bounds[instance] = route.max_concurrency
        self.max_concurrency: Final = bounds

    def lookup(self, raw_host: bytes) -> CompiledRoute | None:
        """The target for a Host header value, or None when no route names that host."""
        targets = self.by_host
        found = targets.get(raw_host)
        if found is None:
            found = targets.get(host_key(raw_host))
        return found

    def upstream_keys(self) -> frozenset[str]:
        return frozenset(t.upstream_key for t in self.by_host.values() if t.upstream_key)
