"""The proxy's shared state in one process: the live routing, upstream pools, connections.

Owns the swap of the route table and the lifetime of upstream pools. Invariants:

- `routing` changes only by `swap`, one attribute assignment: a request reads it once,
  when its head completes, and is served entirely by what it read;
- a pool exists per upstream address some route names; a swap retires pools no route
  names any more (idle connections close now, busy ones when their exchange ends), which
  is what lets a draining upstream finish its in-flight requests and then be let go;
- `drain` stops nothing by force until its deadline: idle client connections close at
  once, busy ones after their current answer;
- running out of file descriptors is answered, never silent: a client connection whose
  descriptor lands in the last `open_files_reserve` of the limit gets 503 at once, and an
  upstream connect that fails for lack of descriptors gets its client a 503; both are
  reported by one rate-limited log line (`DescriptorShortage`). The reserve exists
  because the kernel's own EMFILE on accept is handled inside libuv, which accepts and
  closes the waiting connections without telling the application (no busy loop, but
  no word either): keeping clients out of the reserve makes that the last resort.

Holding, waking and activity are per instance (`CompiledRoute.instance`), whichever of its
hosts a request named: one bound of held requests, one wake, one idle time for an
instance and its aliases. A held request keeps its own host, so the table that releases
it serves it by that host's route.

Holding, in a worker (`slot_hook` set): a request is held only with a slot the main
process granted (keelway/router/hold_slots.py), asked for when its head completes and
answered in order on the worker's channel; until the answer it waits in `_asking`. A
granted slot is given back whenever the request stops being held, however it ends. When
this process drains (told to stop, or its main process died and nobody will release
them), every held or asking request is answered 503 + Retry-After at once: never closed
without an answer.

Requests in flight are bounded per instance (`concurrency`, keelway/router/
concurrency.py): a request the table proxies, or a held one its route serves again,
goes upstream only with a slot of its instance's bound; in a worker, one past what the
main process lent waits (marked held, like a held request) for more, or is answered 503.
"""

from __future__ import annotations

import asyncio
import logging
import re
import resource
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from keelway.router import responses
from keelway.router.access_log import AccessLog
from keelway.router.concurrency import Concurrency
from keelway.router.counts import APP_CLASSES, OTHER, InstanceCounts
from keelway.router.downstream import ClientConnection
from keelway.router.exchange import Exchange, InFlight, Tally
from keelway.router.route_table import CompiledRoute, Handling, RouteTable, Routing, Traffic
from keelway.router.upstream import UpstreamPool

# An ACME token: base64url (RFC 8555 §8.3), of a sane length.
_TOKEN: Final = re.compile(rb"[A-Za-z0-9_-]{16,128}")

log: Final = logging.getLogger("keelway.router")


IDLE_GRACE_S = 1.0
HOLD_SWEEP_S = 0.25
SHORTAGE_REPORT_S = 5.0
# A process says a parked host needs waking at most this often: the waker (one per
# router, keelway/router/waker.py) dedupes, and each note extends how long it keeps
# trying, so notes must keep coming while new requests are held, but not one a request.
WAKE_NOTE_S: Final = 0.1
# After the control plane refused a wake (fenced, unknown), new requests to that host
# get 503 at once for this long instead of each asking again.
WAKE_REFUSED_HOLDOFF_S: Final = 1.0


class DescriptorShortage:
    """Reports running out of file descriptors: one log line per `SHORTAGE_REPORT_S` at
    most, with how many more happened since the last, so a flood of refused connections
    costs a counter, not a line each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._last_report = -SHORTAGE_REPORT_S
        self._unreported = 0

    def note(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last_report < SHORTAGE_REPORT_S:
            self._unreported += 1
            return
        more = f" ({self._unreported} more since the last report)" if self._unreported else ""
        self._last_report = now
        self._unreported = 0
        log.warning("out of file descriptors (open-files limit %d): %s, answered 503%s",
                    self.limit, what, more)


def open_files_limit() -> int:
    """This process's soft RLIMIT_NOFILE (a very large number when unlimited)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if 0 <= soft < 1 << 31 else 1 << 31


@dataclass(frozen=True)
class ProxyOptions:
    """Limits and timings of the data plane, with their defaults in one place.

    Client-side timeouts: a request head must arrive whole within `header_timeout_s` of
    its first byte (a new connection: of connecting, else it is closed silently); a body
    may pause at most `body_timeout_s` between reads; a keep-alive connection may idle
    `idle_timeout_s` between requests; `close_linger_s` bounds how long a refused
    client's remaining bytes are read and dropped before closing. An upstream must start
    its response within `upstream_timeout_s` of the request being complete (else 504).
    `trusted_proxies` are client IPs (as the socket reports them) whose X-Forwarded-*
    headers are kept and appended to; everyone else's are replaced.
    """

    max_header_bytes: int = 64 * 1024
    max_header_count: int = 128
    max_body_bytes: int = 100 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 60.0
    upstream_timeout_s: float = 60.0
    close_linger_s: float = 2.0
    trusted_proxies: frozenset[str] = frozenset()
    # A holding route's requests wait this long for the next table, at most this many
    # at once in this process; past either bound they get 503 with Retry-After.
    hold_timeout_s: float = 30.0
    max_held: int = 1024
    # And at most this many for one instance (all its hosts), so a flood to one
    # parked instance leaves room for requests to the others.
    max_held_per_host: int = 512
    # Requests in flight at once to one instance (all its hosts, across the workers)
    # when its routes name no `max_concurrency`; past it 503 with Retry-After.
    max_concurrency: int = 100
    upstream_connect_timeout_s: float = 5.0
    upstream_max_idle: int = 64
    upstream_idle_s: float = 30.0
    pool_sweep_interval_s: float = 5.0
    drain_timeout_s: float = 10.0
    # Descriptors kept free for upstream connections and the router's own files: a client
    # connection landing in them is answered 503 (at least this many, or 1/64 of the limit).
    open_files_reserve: int = 16


class Proxy:
    """What every client connection of this process shares."""

    def __init__(self, table: RouteTable, options: ProxyOptions | None = None) -> None:
        self.options: Final = options or ProxyOptions()
        # Per instance of the routes, across swaps: what `activity` reports.
        self._activity: dict[str, Traffic] = {}
        # Per instance ever routed by this process: what `responses` reports. Never
        # dropped, so an instance's counts only grow while this process lives.
        self._tallies: dict[str, Tally] = {}
        self.concurrency: Final = Concurrency(self.options.max_concurrency, self.pool_for)
        self.routing = Routing(table)
        self._count(self.routing)
        self.concurrency.fit(self.routing)
        self._track(self.routing, time.monotonic())
        self.connections: set[ClientConnection] = set()
        self.draining = False
        self._pools: dict[str, UpstreamPool] = {}
        self._retiring: set[UpstreamPool] = set()
        # Exchanges waiting on a holding route: its host, its instance and the monotonic
        # deadline; and how many are held per instance.
        self._held: dict[Exchange, tuple[str, str, float]] = {}
        self._held_per_host: dict[str, int] = {}
        # Called with a parked instance's name when it needs waking (rate-limited per
        # instance by WAKE_NOTE_S); the router's main process wires it to its waker, a
        # worker to its channel to the main process. After each swap, `swap_hook` runs.
        self.wake_hook: Callable[[str], None] | None = None
        self.swap_hook: Callable[[], None] | None = None
        self._wake_noted: dict[str, float] = {}
        # In a worker: asks the main process for a hold slot of an instance (True) or
        # gives one back (False); None in a router of one process, which counts its own.
        self.slot_hook: Callable[[str, bool], None] | None = None
        self._slots_lost = False
        # Asked for a slot, in the order asked (the answers come in that order), and
        # those of them still waiting (a client that left is dropped from the set only).
        self._asking: deque[tuple[Exchange, str, str, float]] = deque()
        self._asking_live: set[Exchange] = set()
        # Per instance whose wake the control plane refused: until when, and the page
        # its requests get meanwhile (what the refusal said: fenced, crashed, ...).
        self._wake_refused: dict[str, tuple[float, responses.Canned]] = {}
        self._hold_sweeper: asyncio.TimerHandle | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        limit = open_files_limit()
        self.fd_shortage = DescriptorShortage(limit)
        # A descriptor is the lowest free number, so one at or past this means every
        # lower one is in use: only the reserve is left.
        self.fd_ceiling = limit - max(self.options.open_files_reserve, limit // 64)
        # HTTPS (router/tls.py): the port it is served on (None: not served), so a route
        # that asks for it is redirected there; and where ACME challenges are kept.
        self.https_port: int | None = None
        self.challenges: Path | None = None
        # This process's access log (keelway/router/access_log.py), set before it
        # accepts; None: off. Connections read it once, when they open.
        self.access_log: AccessLog | None = None

    def protocol(self) -> ClientConnection:
        """The protocol factory for the listening socket."""
        return ClientConnection(self)

    def plain_http_answer(self, target: CompiledRoute, host: bytes,
                          url: bytes) -> responses.Canned | None:
        """What a plain-HTTP request to a route is answered here, if anything: an ACME
        HTTP-01 challenge of the store (404 for a token it does not hold: a parked
        instance is never woken for one), else the route's redirect to HTTPS when it
        asks for one and this router serves HTTPS (None: routed as usual)."""
        if url.startswith(responses.ACME_CHALLENGE):
            if self.challenges is None:
                return None
            token = url[len(responses.ACME_CHALLENGE):]
            if not _TOKEN.fullmatch(token):
                return responses.NOT_FOUND
            try:
                said = (self.challenges / token.decode()).read_text()
            except (OSError, UnicodeDecodeError):
                return responses.NOT_FOUND
            # The store's file names the host it was asked for: another host's is not
            # this one's to answer.
            asked_for, _sep, key_authorization = said.partition("\n")
            if asked_for != target.host:
                return responses.NOT_FOUND
            return responses.challenge(key_authorization.strip())
        if target.force_https and self.https_port is not None:
            name = target.host if host.startswith(b"[") else host.split(b":")[0].decode()
            port = b"" if self.https_port == 443 else b":%d" % self.https_port
            return responses.to_https(b"https://" + name.encode() + port + url)
        return None

    def swap(self, table: RouteTable) -> None:
        """Make `table` the one new requests see; retire pools it no longer names."""
        routing = Routing(table)
        self._count(routing)
        self.concurrency.fit(routing)
        old, self.routing = self.routing, routing
        self._fold_hits(old)  # after the assignment: no request marks `old` from here
        self._track(routing, time.monotonic())
        live = routing.upstream_keys()
        for key in [k for k in self._pools if k not in live]:
            pool = self._pools.pop(key)
            pool.retire()
            self._retiring.add(pool)
        parked = routing.parked
        for marks in (self._wake_noted, self._wake_refused):
            for instance in [i for i in marks if i not in parked]:
                del marks[instance]
        if self._held:
            self._release_held()
        if self.swap_hook is not None:
            self.swap_hook()

    def _track(self, routing: Routing, now: float) -> None:
        """Give every instance of `routing` its activity (kept if it had one), drop the
        activity of instances it does not name."""
        activity = self._activity
        instances = routing.instances
        for instance in instances:
            if instance not in activity:
                activity[instance] = Traffic(now)
        if len(activity) > len(instances):
            for instance in [i for i in activity if i not in instances]:
                del activity[instance]

    def _count(self, routing: Routing) -> None:
        """Give every route of `routing` its instance's tally, before it serves."""
        tallies = self._tallies
        for target in routing.by_host.values():
            tally = tallies.get(target.instance)
            if tally is None:
                tally = tallies[target.instance] = Tally()
            target.tally = tally

    def response_counts(self) -> dict[str, InstanceCounts]:
        """Per instance this process ever routed, its responses to clients so far
        (keelway/router/counts.py)."""
        report: dict[str, InstanceCounts] = {}
        for instance, tally in self._tallies.items():
            by_class = (tally.s1xx, tally.s2xx, tally.s3xx, tally.s4xx, tally.s5xx, tally.other)
            app = {name: n for name, n in zip((*APP_CLASSES, OTHER), by_class, strict=True)
                   if n}
            report[instance] = InstanceCounts(
                app=app, router={str(status): n for status, n in tally.router.items()})
        return report

    def _fold_hits(self, routing: Routing) -> None:
        activity = self._activity
        for target in routing.by_host.values():
            if target.hit:
                target.hit = False
                found = activity.get(target.instance)
                if found is not None:
                    found.pending = True

    # -- holding ------------------------------------------------------------------------

    def hold(self, ex: Exchange, target: CompiledRoute) -> bool:
        """Park `ex` until a table decides its route; False when already full (or a
        wake of its parked instance was just refused). A parked instance is asked awake.
        In a worker it waits for its slot first (`granted`)."""
        now = time.monotonic()
        instance = target.instance
        if target.parked and not self.want_wake(target, now):
            return False
        options = self.options
        if len(self._held) + len(self._asking_live) >= options.max_held:
            return False
        if self._held_per_host.get(instance, 0) >= options.max_held_per_host:
            return False
        deadline = now + options.hold_timeout_s
        hook = self.slot_hook
        if hook is None:
            self._add_held(ex, target.host, instance, deadline)
            return True
        if self._slots_lost:
            return False  # no main process to grant one: 503 now
        self._asking.append((ex, target.host, instance, deadline))
        self._asking_live.add(ex)
        hook(instance, True)
        return True

    def granted(self, ok: bool) -> None:
        """The main process's answer to the oldest slot asked for."""
        if not self._asking:
            return  # answers to asks made before a `slots_lost` (none are left)
        ex, host, instance, deadline = self._asking.popleft()
        if ex not in self._asking_live:  # its client left, or it was answered already
            if ok and self.slot_hook is not None:
                self.slot_hook(instance, False)
            return
        self._asking_live.discard(ex)
        if not ok:
            ex.answer_instead(self._unavailable(host))
            return
        self._add_held(ex, host, instance, deadline)
        # The table may have changed, or the wake been refused, while it asked.
        refused = self._wake_refused.get(instance)
        if refused is not None and time.monotonic() < refused[0]:
            self._drop_held(ex, instance)
            ex.answer_instead(refused[1])
            return
        target = self.routing.by_host.get(host.encode())
        if target is None or not target.holding:
            self._settle(ex, instance, target)

    def slots_lost(self) -> None:
        """The channel to the main process closed: nobody grants or releases any more.
        What waits is answered 503 now; new requests to a holding route get 503 too, and
        new ones past what this worker holds of an instance's bound (concurrency.py)."""
        self._slots_lost = True
        self.concurrency.lost()
        self.answer_held()

    def answer_held(self) -> int:
        """Answer every held or asking request 503 + Retry-After now (a drain: no table
        will come to release them). Returns how many were answered."""
        answered = 0
        asking = [(ex, host) for ex, host, _, _ in self._asking if ex in self._asking_live]
        self._asking_live.clear()
        for ex, host in asking:
            ex.answer_instead(self._unavailable(host))
            answered += 1
        for ex, (host, instance, _deadline) in list(self._held.items()):
            self._drop_held(ex, instance)
            ex.answer_instead(self._unavailable(host))
            answered += 1
        return answered + self.concurrency.refuse_waiting()

    def _add_held(self, ex: Exchange, host: str, instance: str, deadline: float) -> None:
        self._held_per_host[instance] = self._held_per_host.get(instance, 0) + 1
        self._held[ex] = (host, instance, deadline)
        if self._hold_sweeper is None:
            self._hold_sweeper = asyncio.get_running_loop().call_later(
                HOLD_SWEEP_S, self._sweep_held)

    def _unavailable(self, host: str) -> responses.Canned:
        """The page for a request of `host` that cannot wait any longer: its route's
        own (busy, while its route still holds)."""
        target = self.routing.by_host.get(host.encode())
        if target is None:
            return responses.unavailable(5)
        return self.page_for(target)

    def want_wake(self, target: CompiledRoute, now: float | None = None) -> bool:
        """Note that parked `target`'s instance has a request waiting (or turned away:
        an upgrade, or one past the bounds): the waker is told, at most every
        WAKE_NOTE_S. False while a refusal of its wake holds (its requests get 503 at
        once)."""
        if now is None:
            now = time.monotonic()
        instance = target.instance
        refused = self._wake_refused.get(instance)
        if refused is not None:
            if now < refused[0]:
                return False
            del self._wake_refused[instance]
        noted = self._wake_noted.get(instance)
        if noted is None or now - noted >= WAKE_NOTE_S:
            self._wake_noted[instance] = now
            hook = self.wake_hook
            if hook is not None:
                hook(instance)
        return True

    def refuse_wake(self, instance: str, state: Handling = Handling.GATED,
                    retry_after_s: int | None = None) -> int:
        """The control plane refused to wake `instance`: its held requests (through any
        of its hosts) get 503 now, and new ones for WAKE_REFUSED_HOLDOFF_S, with the
        page of `state` (what the refusal means: `gated` for a fence, `crashed` for a
        crash backoff, due in `retry_after_s`; None: the route's own Retry-After).
        Returns how many were answered."""
        if retry_after_s is None:
            own = self.routing.by_host.get(instance.encode())
            retry_after_s = own.retry_after_s if own is not None else 5
        page = responses.refusal(state, retry_after_s)
        self._wake_refused[instance] = (time.monotonic() + WAKE_REFUSED_HOLDOFF_S, page)
        self._wake_noted.pop(instance, None)
        answered = 0
        for ex, (_host, held_instance, _deadline) in list(self._held.items()):
            if held_instance == instance:
                self._drop_held(ex, instance)
                ex.answer_instead(page)
                answered += 1
        return answered

    def page_for(self, target: CompiledRoute) -> responses.Canned:
        """What a request of `target` gets when it is neither proxied nor held: its
        route's page, or for a parked one whose wake was just refused, the refusal's."""
        if target.parked:
            refused = self._wake_refused.get(target.instance)
            if refused is not None and time.monotonic() < refused[0]:
                return refused[1]
        return responses.refusal(target.state, target.retry_after_s)

    def _drop_held(self, ex: Exchange, instance: str) -> None:
        del self._held[ex]
        left = self._held_per_host.get(instance, 1) - 1
        if left > 0:
            self._held_per_host[instance] = left
        else:
            self._held_per_host.pop(instance, None)
        if self.slot_hook is not None and not self._slots_lost:
            self.slot_hook(instance, False)

    def held_counts(self) -> dict[str, int]:
        """Requests held per instance in this process (tests, and the hostile bounds)."""
        return dict(self._held_per_host)

    def unhold(self, ex: Exchange) -> None:
        found = self._held.get(ex)
        if found is not None:
            self._drop_held(ex, found[1])
        else:
            self._asking_live.discard(ex)
            self.concurrency.forget(ex)

    def wait_for_slot(self, ex: Exchange, target: CompiledRoute) -> bool:
        """`ex` found its instance at this process's limit: True when it waits for more
        of the bound (the caller marks it held), False when it is to be answered 503."""
        return self.concurrency.wait(ex, target)

    def slot_freed(self, in_flight: InFlight) -> None:
        self.concurrency.freed(in_flight)

    def _release_held(self) -> None:
        """A new table: resume what it serves, answer what it refuses, keep the rest."""
        by_host = self.routing.by_host
        for ex, (host, instance, _deadline) in list(self._held.items()):
            target = by_host.get(host.encode())
            if target is not None and target.holding:
                continue
            self._settle(ex, instance, target)

    def _settle(self, ex: Exchange, instance: str, target: CompiledRoute | None) -> None:
        """Held `ex`'s route no longer holds: serve it by `target`, or answer it."""
        self._drop_held(ex, instance)
        if target is None:
            ex.answer_instead(responses.NOT_FOUND)
        elif target.proxied:
            # Its route is now the one that serves it (the same instance, so its counts
            # do not move), which names the generation its access-log line gives.
            ex.target = target
            # Through its instance's bound like a request that was never held.
            in_flight = target.in_flight
            if in_flight is None or in_flight.take(ex):
                ex.resume(self.pool_for(target))
            elif not self.concurrency.wait(ex, target):  # else it waits on, held
                ex.answer_instead(responses.AT_LIMIT)
        else:
            ex.answer_instead(responses.refusal(target.state, target.retry_after_s))

    def _sweep_held(self) -> None:
        """Answer what waited too long; let go of what its client gave up on, so that a
        client that left does not keep a place from one that waits."""
        self._hold_sweeper = None
        now = time.monotonic()
        for ex, (host, instance, deadline) in list(self._held.items()):
            if deadline <= now:
                self._drop_held(ex, instance)
                ex.answer_instead(self._unavailable(host))
            elif ex.client.peer_gone():
                self._drop_held(ex, instance)
                ex.client.close()
        if self._held:
            self._hold_sweeper = asyncio.get_running_loop().call_later(
                HOLD_SWEEP_S, self._sweep_held)

    def activity(self) -> dict[str, tuple[float, int]]:
        """Per instance of the routes (its primary host), through any of its hosts:
        seconds since its last request or open exchange, as far as this process can
        tell (see Traffic.sample), and its exchanges open now (a connection's current
        one: a response still streaming, a tunnel, a held one)."""
        self._fold_hits(self.routing)
        open_now: dict[str, int] = {}
        for conn in self.connections:
            ex = conn.current
            if ex is not None:
                target = ex.target
                if target is not None:
                    open_now[target.instance] = open_now.get(target.instance, 0) + 1
        now = time.monotonic()
        report: dict[str, tuple[float, int]] = {}
        for instance, found in self._activity.items():
            n = open_now.pop(instance, 0)
            report[instance] = (found.sample(now, n), n)
        for instance, n in open_now.items():  # a tunnel outliving its route
            report[instance] = (0.0, n)
        return report

    def inflight(self) -> dict[str, int]:
        """Requests in flight per upstream, retired pools included, until they reach 0."""
        counts: dict[str, int] = {}
        for pool in list(self._retiring):
            if pool.inflight <= 0:
                self._retiring.discard(pool)
        for pool in [*self._pools.values(), *self._retiring]:
            counts[pool.key] = counts.get(pool.key, 0) + pool.inflight
        return counts

    def pool_for(self, target: CompiledRoute) -> UpstreamPool:
        pool = target.pool
        if pool is not None:
            return pool
        pool = self._pools.get(target.upstream_key)
        if pool is None:
            options = self.options
            pool = UpstreamPool(
                target.upstream_host,
                target.upstream_port,
                target.upstream_key,
                max_idle=options.upstream_max_idle,
                connect_timeout_s=options.upstream_connect_timeout_s,
            )
            self._pools[target.upstream_key] = pool
            self._schedule_sweep()
        target.pool = pool
        return pool

    def _schedule_sweep(self) -> None:
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(self.options.pool_sweep_interval_s, self._sweep)

    def _sweep(self) -> None:
        """One timer for all pools (not one per connection) closes long-idle ones."""
        self._sweeper = None
        for pool in self._pools.values():
            pool.sweep(self.options.upstream_idle_s)
        if self._pools and not self.draining:
            self._schedule_sweep()

    async def drain(self) -> bool:
        """Let in-flight exchanges finish, up to `drain_timeout_s`; then abort the rest.

        The caller has stopped accepting already. Returns True when every connection
        ended on its own, False when some had to be aborted at the deadline.
        """
        self.draining = True
        deadline = time.monotonic() + self.options.drain_timeout_s
        # Nothing releases a held request from here (no table comes to a draining
        # process): waiting would only end in an abort at the deadline, an empty close.
        self.answer_held()
        # From here every answer carries `Connection: close`. A busy keep-alive client
        # gets one more answer and a clean close; closing its idle connection at once
        # instead would race the request it may be sending right now (it would see a
        # reset, not a response). Only what is still idle after the grace is closed.
        grace_end = time.monotonic() + min(IDLE_GRACE_S, self.options.drain_timeout_s)
        while self.connections and time.monotonic() < grace_end:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.drain()
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        clean = not self.connections
        for conn in list(self.connections):
            conn.transport.abort()
        if self.access_log is not None:
            await asyncio.sleep(0)  # the aborted connections' records: their callbacks
            self.access_log.close()  # every answer given is written before the exit
        for pool in self._pools.values():
            pool.retire()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        return clean
