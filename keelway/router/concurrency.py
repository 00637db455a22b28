"""The per-instance bound on requests in flight, as one router process keeps to it.

An instance has at most its bound (the smallest `max_concurrency` its routes name, else
the router's `--max-concurrency`) requests in flight through the router at once: counted
from when a request's head is routed to it until its exchange ends, however it ends
(answered, failed, timed out, its client gone), a tunnel (WebSocket) until it closes, a
held request from when its route serves again. A client that only half-closes is still
owed its answer (downstream.py), so its request counts until answered, which
`upstream_timeout_s` bounds. Past the bound a request gets 503 with
Retry-After (responses.AT_LIMIT) and other instances are served as before: one tenant's
slow upstream takes no more than its bound of the router's connections.

Counting is per process, on `InFlight` (exchange.py, compiled: the hot path's share is a
comparison and an add). A router of one process counts against the whole bound. A
worker counts against what its main process has lent it of the bound (leases.py), so
the bound holds across workers, never multiplied by their number:

- a worker spends what it holds without asking; a request past that waits while the
  worker asks for more (`lease I N B` on its slot channel, workers.py), one round trip,
  for what waits or a chunk (an eighth of the bound, 1 to LEASE_CHUNK), whichever is
  more, so a burst costs one ask and a small bound is not all taken by one worker;
- it keeps what it was lent, so an instance's steady traffic asks nothing after its
  first requests in each worker; it gives back what it does not use when asked
  (`reclaim I`, answered `spare I N`): an ask the free slots cannot fill waits while the
  main process asks the other holders for their spare (leases.py), so slots idle in one
  worker serve another's requests, two more hops later, and a request is refused only
  when its instance's bound is in use, not merely lent;
- a grant that still falls short answers what waits 503, and for FULL_HOLDOFF_S that
  worker refuses past its own slots without asking, so an instance flooded at its bound
  costs the main process an ask per worker per holdoff, not one per request.
  The price: for that holdoff, a slot freed in another worker serves none of its
  requests.

Measured (2 workers, wrk for 5 s, each request its instance's): at 50 connections
under the default bound, 5 asks for 281,770 requests; at 150, past the bound, 1,062
asks (604 of them waiting on a reclaim) for 298,857 requests, 114,228 refused.

Why not the obvious designs: an ask per request (how hold slots work, hold_slots.py)
puts the main process, one event loop for every worker, on every request's path; a
fixed share per worker (bound / workers) needs no messages, but connections do not
spread evenly over workers (each lands where an accept wins), so an instance under its
bound would get 503s in whichever worker its clients' connections are in, and a bound
smaller than the number of workers could not be shared at all.

Invariants: `InFlight.count` grows only by `InFlight.take` and shrinks only when that
exchange ends (`Exchange.leave_in_flight`, once); in a worker, `limit` never passes what
it holds (`leased`) nor the bound, and it gives back only slots it does not use. A
worker that dies frees what it held (its main process forgets it); its main process
dying closes the channel and what waits is answered 503 (`lost`). Two routers during a
takeover (server.py) count apart: for that handoff an instance may have up to twice
its bound in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from keelway.router.exchange import InFlight
from keelway.router.responses import AT_LIMIT

if TYPE_CHECKING:
    from keelway.router.exchange import Exchange
    from keelway.router.route_table import CompiledRoute, Routing
    from keelway.router.upstream import UpstreamPool

# What a worker asks for when fewer wait: an eighth of the bound, at most this many.
LEASE_CHUNK: Final = 8
# After a grant fell short, how long a worker refuses past its own slots without asking.
FULL_HOLDOFF_S: Final = 0.05
# An ask unanswered this long (the main process stalled) answers its waiters 503.
LEASE_WAIT_S: Final = 2.0


class Lender(Protocol):
    """The main process, as a worker sees it (workers.SlotChannel)."""

    def lease(self, instance: str, want: int, bound: int) -> None:
        """Ask for `want` more slots of `instance`; the answer comes to `Concurrency.lent`."""

    def unlease(self, instance: str, n: int) -> None:
        """Give back `n` slots of `instance` unasked."""

    def spare(self, instance: str, n: int) -> None:
        """Answer a reclaim of `instance`: `n` unused slots go back (0: none unused)."""


class _Account:
    """One instance's bound in this process: its count, what a worker holds of the
    bound, and the requests waiting for more."""

    __slots__ = ("ask_timer", "asked", "bound", "full_until", "in_flight", "leased", "stalled",
                 "waiters")

    def __init__(self, instance: str, bound: int) -> None:
        self.in_flight: Final = InFlight(instance)
        self.bound = bound
        self.leased = 0
        self.asked = 0  # slots asked for and not answered yet (one ask at a time)
        self.ask_timer: asyncio.TimerHandle | None = None
        self.stalled = False  # that ask is older than LEASE_WAIT_S
        self.full_until = 0.0
        # In the order they came; one whose client left stays until it comes up (it is
        # no longer in Concurrency._waiting), which `in_flight.waiting` does not count.
        self.waiters: deque[tuple[Exchange, CompiledRoute]] = deque()


class Concurrency:
    """Every instance's count in this process, and (in a worker) its leases."""

    def __init__(self, default_bound: int,
                 pool_for: Callable[[CompiledRoute], UpstreamPool]) -> None:
        self.default_bound: Final = default_bound
        self._pool_for = pool_for
        # Per instance ever routed here; kept, like its tally, so a request in flight
        # across a swap is counted where the next table's routes count.
        self._accounts: dict[str, _Account] = {}
        self._waiting: dict[Exchange, str] = {}  # the waiters still waiting
        self._lender: Lender | None = None
        self._lost = False

    def lend_from(self, lender: Lender) -> None:
        """This process is a worker: from now on it spends only what `lender` lends."""
        self._lender = lender
        for account in self._accounts.values():
            self._refit(account)

    def fit(self, routing: Routing) -> None:
        """Bound every instance of `routing` as it says and give each of its routes its
        instance's count, before it serves."""
        accounts = self._accounts
        for instance in routing.instances:
            bound = routing.max_concurrency.get(instance, self.default_bound)
            account = accounts.get(instance)
            if account is None:
                account = accounts[instance] = _Account(instance, bound)
            account.bound = bound
            self._refit(account)
        for target in routing.by_host.values():
            target.in_flight = accounts[target.instance].in_flight
        if self._lender is not None and len(accounts) > len(routing.instances):
            for instance, account in accounts.items():
                if instance not in routing.instances:
                    self._give_back_spare(account)

    def wait(self, ex: Exchange, target: CompiledRoute) -> bool:
        """`ex`, for `target`, found its instance at this process's limit. True: it now
        waits for more of the bound (the caller marks it held; it is resumed or answered
        from here); False: there is none to be had, and it is to be answered AT_LIMIT."""
        account = self._accounts.get(target.instance)
        lender = self._lender
        if account is None or lender is None or self._lost or account.stalled:
            return False
        in_flight = account.in_flight
        # Each waiter must be one the rest of the bound could take.
        if in_flight.waiting >= account.bound - account.leased:
            return False
        if not account.asked and time.monotonic() < account.full_until:
            return False
        account.waiters.append((ex, target))
        self._waiting[ex] = target.instance
        in_flight.waiting += 1
        if not account.asked:
            self._ask(lender, account)
        return True

    def lent(self, instance: str, granted: int) -> None:
        """The main process's answer to this worker's ask for `instance`."""
        lender = self._lender
        account = self._accounts.get(instance)
        if lender is None or account is None or not account.asked:
            if lender is not None and granted > 0:
                lender.unlease(instance, granted)  # nothing asked: not ours to keep
            return
        asked, account.asked = account.asked, 0
        account.stalled = False
        if account.ask_timer is not None:
            account.ask_timer.cancel()
            account.ask_timer = None
        account.leased += granted
        self._refit(account)
        self._admit_waiting(account)
        if not account.in_flight.waiting:
            return
        if granted >= asked and account.leased < account.bound:
            self._ask(lender, account)  # more came while it asked; the rest may be free
        else:
            account.full_until = time.monotonic() + FULL_HOLDOFF_S
            self._refuse_waiting(account)

    def freed(self, in_flight: InFlight) -> None:
        """A slot of `in_flight` came back while requests wait for one: the oldest
        takes it."""
        account = self._accounts.get(in_flight.instance)
        if account is not None:
            self._admit_waiting(account)

    def reclaim(self, instance: str) -> None:
        """Another worker's ask for `instance` waits on this one: answer with what of it
        is unused (every reclaim gets its answer, 0 included: the ask waits for it)."""
        lender = self._lender
        if lender is None:
            return
        account = self._accounts.get(instance)
        spare = 0 if account is None else self._take_spare(account)
        lender.spare(instance, spare)

    def forget(self, ex: Exchange) -> None:
        """Waiting `ex` is gone (its client left): it waits no more."""
        instance = self._waiting.pop(ex, None)
        if instance is not None:
            account = self._accounts[instance]
            account.in_flight.waiting -= 1
            if not account.in_flight.waiting:
                account.waiters.clear()

    def lost(self) -> None:
        """The main process is gone: nobody lends any more. What waits is answered now;
        this process keeps spending what it holds while it drains."""
        self._lost = True
        self.refuse_waiting()

    def refuse_waiting(self) -> int:
        """Answer every waiting request AT_LIMIT now; returns how many."""
        answered = 0
        for account in self._accounts.values():
            answered += self._refuse_waiting(account)
        return answered

    def counts(self) -> dict[str, int]:
        """Requests in flight per instance in this process (tests and the bound's checks)."""
        return {instance: account.in_flight.count
                for instance, account in self._accounts.items() if account.in_flight.count}

    def _ask(self, lender: Lender, account: _Account) -> None:
        in_flight = account.in_flight
        chunk = min(LEASE_CHUNK, max(1, account.bound // 8))
        want = min(max(chunk, in_flight.waiting), account.bound - account.leased)
        account.asked = want
        account.ask_timer = asyncio.get_running_loop().call_later(
            LEASE_WAIT_S, self._ask_stalled, account)
        lender.lease(in_flight.instance, want, account.bound)

    def _ask_stalled(self, account: _Account) -> None:
        """No answer in LEASE_WAIT_S: what waits is answered, and until the answer comes
        (it still counts when it does) requests past this worker's slots get 503."""
        account.ask_timer = None
        account.stalled = True
        self._refuse_waiting(account)

    def _refit(self, account: _Account) -> None:
        """Set `limit` from the bound and (in a worker) what it holds; of a lowered
        bound, what it holds past it and does not use goes back now."""
        in_flight = account.in_flight
        lender = self._lender
        if lender is None:
            in_flight.limit = account.bound
            return
        over = account.leased - max(in_flight.count, account.bound)
        if over > 0:
            account.leased -= over
            lender.unlease(in_flight.instance, over)
        in_flight.limit = min(account.leased, account.bound)

    def _give_back_spare(self, account: _Account) -> None:
        lender = self._lender
        spare = self._take_spare(account)
        if lender is not None and spare > 0:
            lender.unlease(account.in_flight.instance, spare)

    @staticmethod
    def _take_spare(account: _Account) -> int:
        """Drop what this worker holds of the bound and does not use; returns how much
        (to be given back). Requests waiting mean there is none."""
        in_flight = account.in_flight
        spare = account.leased - in_flight.count
        if spare <= 0 or in_flight.waiting:
            return 0
        account.leased -= spare
        in_flight.limit = min(account.leased, account.bound)
        return spare

    def _admit_waiting(self, account: _Account) -> None:
        in_flight = account.in_flight
        waiters = account.waiters
        while waiters and in_flight.waiting and in_flight.count < in_flight.limit:
            ex, target = waiters.popleft()
            if self._waiting.pop(ex, None) is None:
                continue  # its client left
            in_flight.waiting -= 1
            in_flight.take(ex)
            ex.resume(self._pool_for(target))

    def _refuse_waiting(self, account: _Account) -> int:
        waiters, account.waiters = account.waiters, deque()
        answered = 0
        for ex, _target in waiters:
            if self._waiting.pop(ex, None) is not None:
                account.in_flight.waiting -= 1
                ex.answer_instead(AT_LIMIT)
                answered += 1
        return answered
