"""Router workers: more processes accepting on the one listening socket.

The router process started by the control plane is the main process and the only one
with a control socket. With `--workers N` above 1 it spawns N workers as subprocesses
(not forks: forking under a running event loop is unsafe), each inheriting the
listening socket and one end of a socketpair, its channel, and it serves no client
itself: every client connection lives in a worker, so the main process holds no request
a SIGKILL of it could close unanswered. The worker's first line is `ready` (it
accepts); then, one line each way:

    reload   -> ok V        the worker re-read the table file and serves version V
    inflight -> {...}       its requests in flight per upstream, as JSON
    activity -> {...}       per instance [idle_s, open], as JSON (Proxy.activity)
    responses -> {...}      per instance its responses so far, as JSON (Proxy.response_counts,
                            keelway/router/counts.py): {"I":{"app":{"2xx":N,...},
                            "router":{"503":N,...}},...}
    refuse I S R -> ok N    the control plane refused to wake parked instance I: the
                            worker answered its N held requests for I with 503 and
                            the page of route state S, Retry-After R (both optional:
                            a fence's page, the route's own Retry-After)
    stop                    drain and exit (no reply; the parent reaps it)

A second socketpair carries the worker's asks, one line each, each naming an instance
(its primary host, whichever of its hosts the requests used: `CompiledRoute.instance`):

    wake I                  a parked instance has requests waiting in that worker
                            (Proxy.want_wake rate-limits it); no reply
    hold I     -> 1 | 0     a hold slot for one request of I (hold_slots.py),
                            granted or not; answered in the order asked
    unhold I                a held request of I ended: its slot is free; no reply
    lease I N B -> lease I G  N more slots of I's bound B of requests in flight
                            (concurrency.py, leases.py), G of them granted (0..N);
                            answered once, after the reclaims it needed
    unlease I N             N slots of I's bound given back unasked; no reply
    spare I N               the answer to a reclaim: N unused slots of I given back

and, unasked, from the parent:

    reclaim I   -> spare I N  an ask for I's slots waits on this worker: what of them
                            it does not use goes back (N may be 0)

The parent's waker dedupes the wake notes, so a router sends one wake at a time per
instance however many workers hold requests for it; its HoldSlots bound the held
requests per instance across the workers, its Leases the requests in flight.

Rules: a table push is acknowledged only once every worker serves it, so a deploy never
stops a process some worker still routes to. A worker whose channel closes (its parent
died) drains and exits: it must not serve a table nobody can update, and it answers its
held requests 503 + Retry-After at once (Proxy.drain), since nobody would release them.
A worker that dies is spawned again by its parent, and the slots it held (hold slots
and leases) are freed;
the parent keeps the response counts it last reported (every `responses` report asks
each worker), so the router's counts never go down with a worker.
The router opens its control socket only once its workers are ready, so "the router
answers" means every worker serves.

Crash windows: the main process SIGKILLed during a wake: its workers see their channels
close and answer what they hold (and what asks a slot) 503 + Retry-After, then drain
what is in flight; the control plane starts a successor on the same listening socket.
A worker SIGKILLed: the requests it holds close with it (no other process has their
sockets); its slots are freed when its channel closes, and it is spawned again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, assert_never, cast

import msgspec

from keelway import names
from keelway.router import counts
from keelway.router.counts import InstanceCounts
from keelway.router.hold_slots import HoldSlots
from keelway.router.leases import Grant, Leases, Reclaim
from keelway.router.proxy import Proxy
from keelway.router.route_table import Handling
from keelway.router.table_file import TableFileError, load_table

log: Final = logging.getLogger("keelway.router")

CHANNEL_TIMEOUT_S: Final = 5.0
# How long a new worker may take to import and start accepting (a starved box is slow).
WORKER_START_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True)
class WorkerLaunch:
    """What every worker of a router is started with: the one listening socket, the
    table file, its drain bound and the rest of the router's argv; where its wakes go,
    and the main process's books of held-request slots and of leases of the bounds on
    requests in flight (None: no bound across workers; a lease ask gets what it asks)."""

    listener: socket.socket
    state_path: Path | None
    drain_timeout_s: float
    extra_argv: tuple[str, ...] = ()
    on_wake: Callable[[str], None] | None = None
    slots: HoldSlots | None = None
    leases: Leases | None = None
    # The HTTPS listening socket, accepted on by every worker too (None: no HTTPS).
    https_listener: socket.socket | None = None


class Worker:
    """The parent's handle on one worker subprocess and its channel."""

    def __init__(self, index: int, launch: WorkerLaunch,
                 peers: dict[int, asyncio.StreamWriter]) -> None:
        self.index = index
        self._launch = launch
        # Every worker's open slot channel by holder, this one's too (shared by the
        # WorkerSet): where a short lease grant asks the others for their spare.
        self._peers = peers
        self._channels = 0  # numbers this worker's channels, each a holder of slots
        self._wakes: asyncio.Task[None] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()
        # Its responses as this life of it last reported them; `life` counts its starts,
        # so a report of a life that ended is never taken for the next one's.
        self.responses: dict[str, InstanceCounts] = {}
        self.life = 0

    async def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        wakes_ours, wakes_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        argv = [sys.executable, "-m", "keelway.router",
                "--listen-fd", str(self._launch.listener.fileno()),
                "--channel-fd", str(theirs.fileno()),
                "--wake-fd", str(wakes_theirs.fileno()),
                "--drain-timeout", str(self._launch.drain_timeout_s)]
        if self._launch.state_path is not None:
            argv += ["--state", str(self._launch.state_path)]
        https = self._launch.https_listener
        if https is not None:
            argv += ["--https-fd", str(https.fileno())]
        argv += self._launch.extra_argv
        try:
            self.proc = subprocess.Popen(
                argv, pass_fds=(self._launch.listener.fileno(), theirs.fileno(),
                                wakes_theirs.fileno(),
                                *((https.fileno(),) if https is not None else ())),
                stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
            wakes_theirs.close()
        if self._wakes is not None:
            self._wakes.cancel()
        self._wakes = asyncio.get_running_loop().create_task(self._read_wakes(wakes_ours))
        reader, writer = await asyncio.open_connection(sock=ours)
        # The worker says "ready" once it accepts: the router answers on its control
        # socket (and so counts as up) only after its workers serve, so a table pushed
        # right after start is never waiting on a worker that is still importing. Read
        # before the channel is published, so no request can take this line as a reply.
        try:
            async with asyncio.timeout(WORKER_START_TIMEOUT_S):
                ready = await reader.readline()
        except TimeoutError:
            ready = b""
        if ready.strip() != b"ready":
            log.warning("worker %d (pid %d) did not say ready in %.0f s", self.index,
                        self.proc.pid, WORKER_START_TIMEOUT_S)
        self._reader, self._writer = reader, writer
        log.info("worker %d started (pid %d)", self.index, self.proc.pid)

    async def ask(self, line: str) -> str | None:
        """One request line, one reply line; None if the worker did not answer."""
        async with self._lock:
            if self._writer is None or self._reader is None:
                return None
            try:
                self._writer.write(line.encode() + b"\n")
                await self._writer.drain()
                async with asyncio.timeout(CHANNEL_TIMEOUT_S):
                    reply = await self._reader.readline()
            except (OSError, RuntimeError, TimeoutError):
                # RuntimeError: uvloop's word for a write to a channel already closed
                # (the worker died and is not spawned again yet).
                return None
            return reply.decode().strip() or None

    async def _read_wakes(self, sock: socket.socket) -> None:
        """The worker's wake notes, to the waker, and its hold slots, granted here."""
        self._channels += 1
        holder = self.index << 32 | self._channels
        reader, writer = await asyncio.open_connection(sock=sock)
        slots = self._launch.slots
        leases = self._launch.leases
        self._peers[holder] = writer
        try:
            while line := await reader.readline():
                verb, _, host = line.decode(errors="replace").strip().partition(" ")
                if verb == "hold":
                    # Every ask gets its one answer, in order: the worker pairs them so.
                    ok = slots is None or (names.HOST.accepts(host) and slots.take(holder, host))
                    writer.write(b"1\n" if ok else b"0\n")
                elif verb == "unhold":
                    if slots is not None:
                        slots.give_back(holder, host)
                elif verb == "lease":
                    self._lend(holder, host)
                elif verb in ("unlease", "spare"):
                    given = slot_words(host, 1)
                    if leases is not None and given is not None:
                        if verb == "spare":
                            self._answer(leases.spare(holder, given[0], given[1][0]))
                        else:
                            leases.give_back(holder, given[0], given[1][0])
                elif (verb == "wake" and self._launch.on_wake is not None
                      and names.HOST.accepts(host)):
                    self._launch.on_wake(host)
        except (OSError, RuntimeError, ValueError):
            pass  # the worker is gone (it is respawned with a new pair) or misbehaved
        finally:
            self._peers.pop(holder, None)
            if slots is not None:
                slots.forget(holder)
            if leases is not None:
                self._answer(leases.forget(holder))
            writer.close()

    def _lend(self, holder: int, words: str) -> None:
        """A worker's `lease I N B`: answered now, or once the other workers holding
        some of I have said what of it they do not use (leases.Reclaim)."""
        ask = slot_words(words, 2)
        if ask is None:
            return  # not one of ours; its waiters are answered when the ask goes stale
        instance, (want, bound) = ask
        leases = self._launch.leases
        if leases is None:
            self._answer([Grant(holder, instance, want)])
            return
        match leases.ask(holder, instance, want, bound):
            case Grant() as grant:
                self._answer([grant])
            case Reclaim() as reclaim:
                for other in reclaim.holders:
                    self._write(other, f"reclaim {instance}\n")
            case unknown:
                assert_never(unknown)

    def _answer(self, grants: list[Grant]) -> None:
        for grant in grants:
            self._write(grant.holder, f"lease {grant.instance} {grant.granted}\n")

    def _write(self, holder: int, line: str) -> None:
        """To `holder`'s channel, if it is still open (a closed one's holder is being
        forgotten, and what waited on it answered)."""
        peer = self._peers.get(holder)
        if peer is not None and not peer.is_closing():
            peer.write(line.encode())

    async def stop(self) -> None:
        if self._wakes is not None:
            self._wakes.cancel()
            self._wakes = None
        if self._writer is not None:
            with contextlib.suppress(OSError, RuntimeError):  # a dead worker's channel
                self._writer.write(b"stop\n")
                await self._writer.drain()
            self._writer.close()
            self._writer = None
        if self.proc is not None:
            proc = self.proc
            try:
                await asyncio.wait_for(asyncio.to_thread(proc.wait),
                                       timeout=self._launch.drain_timeout_s + 5)
            except TimeoutError:
                proc.kill()
                await asyncio.to_thread(proc.wait)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class WorkerSet:
    """Workers 1..count of this router; empty when it runs alone."""

    def __init__(self, count: int, launch: WorkerLaunch) -> None:
        peers: dict[int, asyncio.StreamWriter] = {}
        self.workers = [Worker(i, launch, peers) for i in range(1, count + 1)]
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        # What workers that died had last reported, and how many died.
        self._departed: dict[str, InstanceCounts] = {}
        self.restarts = 0

    async def start(self) -> None:
        for worker in self.workers:
            await worker.start()
        if self.workers:
            self._watch = asyncio.get_running_loop().create_task(self._respawn_dead())

    async def reload(self) -> bool:
        """Make every worker serve the table file's version; False if one did not."""
        replies = await asyncio.gather(*(w.ask("reload") for w in self.workers))
        return all(r is not None and r.startswith("ok") for r in replies)

    async def inflight(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for reply in await asyncio.gather(*(w.ask("inflight") for w in self.workers)):
            if reply:
                for key, n in json.loads(reply).items():
                    counts[key] = counts.get(key, 0) + int(n)
        return counts

    async def activity(self) -> dict[str, tuple[float, int]]:
        """Per host over the workers: the least idle time any saw, the sum open."""
        seen: dict[str, tuple[float, int]] = {}
        for reply in await asyncio.gather(*(w.ask("activity") for w in self.workers)):
            if reply:
                for host, (idle_s, n) in json.loads(reply).items():
                    mine = seen.get(host)
                    seen[host] = (float(idle_s), int(n)) if mine is None else (
                        min(mine[0], float(idle_s)), mine[1] + int(n))
        return seen

    async def responses(self) -> dict[str, InstanceCounts]:
        """Per instance, the responses of every worker, alive or dead: a worker that does
        not answer counts as it last reported (counts never go down)."""
        await asyncio.gather(*(self._ask_responses(w) for w in self.workers))
        return counts.summed(self._departed, *(w.responses for w in self.workers))

    @staticmethod
    async def _ask_responses(worker: Worker) -> None:
        life = worker.life
        reply = await worker.ask("responses")
        if reply and worker.life == life:
            try:
                worker.responses = counts.report_decoder.decode(reply)
            except msgspec.DecodeError:
                log.warning("worker %d sent an unreadable responses report", worker.index)

    async def refuse(self, host: str, state: Handling, retry_after_s: int | None) -> None:
        """Every worker answers its held requests for `host` with 503 and the page of
        `state` (a refused wake); Retry-After `retry_after_s`, or the route's own."""
        retry = "" if retry_after_s is None else f" {retry_after_s}"
        line = f"refuse {host} {state.value}{retry}"
        await asyncio.gather(*(w.ask(line) for w in self.workers))

    async def stop(self) -> None:
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers))

    async def _respawn_dead(self) -> None:
        while not self._stopping:
            await asyncio.sleep(1.0)
            for worker in self.workers:
                if not worker.alive() and not self._stopping:
                    code = worker.proc.returncode if worker.proc else None
                    log.warning("worker %d exited (%s); starting it again", worker.index, code)
                    # Its counts stay, as last reported; the next life counts from zero.
                    self._departed = counts.summed(self._departed, worker.responses)
                    worker.responses = {}
                    worker.life += 1
                    self.restarts += 1
                    await worker.start()
                    await worker.ask("reload")


class SlotChannel(asyncio.Protocol):
    """A worker's side of its second socketpair: wake notes, hold slots and lease asks
    out; the slots' answers in (to Proxy.granted, in the order asked), and the lease
    answers and reclaims (to Proxy.concurrency, by instance). It is the worker's lender
    (concurrency.Lender). Closed (the main process died): Proxy.slots_lost answers what
    waits."""

    def __init__(self, proxy: Proxy) -> None:
        self._proxy = proxy
        self._transport: asyncio.Transport | None = None
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def note_wake(self, host: str) -> None:
        self._send(b"wake " + host.encode() + b"\n")

    def slot(self, host: str, take: bool) -> None:
        self._send((b"hold " if take else b"unhold ") + host.encode() + b"\n")

    def lease(self, instance: str, want: int, bound: int) -> None:
        self._send(f"lease {instance} {want} {bound}\n".encode())

    def unlease(self, instance: str, n: int) -> None:
        self._send(f"unlease {instance} {n}\n".encode())

    def spare(self, instance: str, n: int) -> None:
        self._send(f"spare {instance} {n}\n".encode())

    def _send(self, line: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(line)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        *answers, self._buffer = self._buffer.split(b"\n")
        for answer in answers:
            verb, _, words = answer.decode(errors="replace").partition(" ")
            if verb == "lease":
                lent = slot_words(words, 1)
                if lent is not None:
                    self._proxy.concurrency.lent(lent[0], lent[1][0])
            elif verb == "reclaim":
                if names.HOST.accepts(words):
                    self._proxy.concurrency.reclaim(words)
            else:  # the hold slots' answers, in the order asked
                self._proxy.granted(answer == b"1")

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._proxy.slots_lost()


def slot_words(words: str, numbers: int) -> tuple[str, list[int]] | None:
    """An instance and `numbers` counts, as the lease lines carry them (`I N B`, `I G`,
    `I N`); None for anything else, which is then ignored."""
    parts = words.split()
    if len(parts) != numbers + 1 or not names.HOST.accepts(parts[0]):
        return None
    if not all(part.isascii() and part.isdigit() for part in parts[1:]):
        return None
    return parts[0], [int(part) for part in parts[1:]]


def refusal_of(words: bytes) -> tuple[str, Handling, int | None]:
    """`I [STATE [RETRY]]` of a `refuse` line; what it leaves out or garbles is a fence's
    page (gated, the route's own Retry-After), what the line meant when it named only I."""
    instance, *rest = words.decode(errors="replace").split()
    state = Handling.GATED
    retry_after_s: int | None = None
    with contextlib.suppress(ValueError):
        if rest:
            state = Handling(rest[0])
        if len(rest) > 1:
            retry_after_s = max(0, int(rest[1]))
    return instance, state, retry_after_s


async def serve_channel(channel_fd: int, proxy: Proxy, state_path: Path | None,
                        stop: asyncio.Event) -> None:
    """A worker's side of its channel: answer the parent until told to stop or orphaned."""
    sock = socket.socket(fileno=channel_fd)
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b"ready\n")  # this worker accepts already (serve made its server first)
    try:
        await writer.drain()
        while True:
            line = (await reader.readline()).strip()
            if not line or line == b"stop":
                return  # told to stop, or the parent is gone: drain either way
            if line == b"reload":
                version = proxy.routing.table.version
                if state_path is not None:
                    try:
                        table = load_table(state_path)
                    except TableFileError as exc:
                        log.error("worker %d: %s", os.getpid(), exc)
                        table = None
                    if table is not None and table.version >= version:
                        proxy.swap(table)
                        version = table.version
                writer.write(f"ok {version}\n".encode())
            elif line == b"inflight":
                writer.write(json.dumps(proxy.inflight()).encode() + b"\n")
            elif line == b"activity":
                writer.write(json.dumps(proxy.activity()).encode() + b"\n")
            elif line == b"responses":
                writer.write(counts.report_encoder.encode(proxy.response_counts()) + b"\n")
            elif line.startswith(b"refuse "):
                answered = proxy.refuse_wake(*refusal_of(line[len(b"refuse "):]))
                writer.write(f"ok {answered}\n".encode())
            await writer.drain()
    finally:
        stop.set()
        writer.close()
