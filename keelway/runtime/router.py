"""The router as a process of its own: bind, spawn, reap, stop, kill, the gapless
restart, and its records. Keeping it alive is keelway.runtime.router_supervisor's; this
module has the verbs, built on keelway.runtime.process (one spawn path for every process
keelway starts detached). Every verb is a coroutine that never blocks the event loop:
the fork happens on the loop, which reaps the child; pings and fsyncs run in a thread.

The control plane binds the listening socket itself, so a port already in use is a
clear error before anything else starts, and hands the bound fd to the router (keeping
a copy, so that a successor can start on the very same socket). The router runs in its
own session and is not our child in spirit: it survives a crash of the control plane
and keeps serving its last route table. Its pid and start time are kept in a pidfile so
that the next control plane adopts it instead of fighting it for the port.

Which router is *the* router is decided by the control socket: the process that
answers there owns it (a successor renames its socket over its predecessor's only once
it serves). The pidfile and the settings file are records of that process, written
after it answers, so a control plane killed between starting a router and recording it
finds it again by asking the socket, and never binds a second one.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Final

import msgspec

from keelway import failpoints
from keelway.clock import Clock
from keelway.durable import write_atomic
from keelway.home import Home
from keelway.router.client import (
    RouterControlError,
    ping_sync,
    table_format_sync,
    take_listener,
)
from keelway.router.listen import bind_tcp
from keelway.router.route_table import TABLE_FORMAT
from keelway.runtime import process

failpoints.declare(
    "router.spawn.before", "router.spawn.after", "router.recorded",
    "router.restart.before", "router.restart.after", "router.restart.took_over",
)

# The router's own stop grace, not a service's: SIGTERM makes it finish in-flight
# requests within its drain timeout (router.proxy, 10 s) and close; this covers that.
STOP_GRACE_S: Final = 15.0
# How long a successor of a gapless restart has to take the socket over and answer.
TAKEOVER_TIMEOUT_S: Final = 10.0
# How long the retired router has to drain after the handover before it is reported.
RETIRE_WAIT_S: Final = 20.0


class RouterPortBusy(Exception):
    """Someone else listens on the router's address (the message names it)."""


@dataclass(frozen=True)
class RouterHandle:
    pid: int
    start_ticks: int
    adopted: bool


def parse_addr(addr: str) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"{addr!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def bind_listener(addr: str) -> socket.socket:
    host, port = parse_addr(addr)
    try:
        return bind_tcp(host, port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise RouterPortBusy(f"the router address {addr} is already in use") from exc
        raise


@dataclass
class Listeners:
    """The sockets the router accepts on, held by the control plane so a router that
    dies is replaced on the same ones: HTTP, and HTTPS when it is served."""

    http: socket.socket
    https: socket.socket | None = None

    def argv(self) -> list[str]:
        https = [] if self.https is None else ["--https-fd", str(self.https.fileno())]
        return ["--listen-fd", str(self.http.fileno()), *https]

    def fds(self) -> tuple[int, ...]:
        return (self.http.fileno(), *(() if self.https is None else (self.https.fileno(),)))

    def close(self) -> None:
        self.http.close()
        if self.https is not None:
            self.https.close()


def bind_listeners(addr: str, https: str | None) -> Listeners:
    """Both addresses bound, or neither (RouterPortBusy names the one taken)."""
    http = bind_listener(addr)
    try:
        return Listeners(http, bind_listener(https) if https is not None else None)
    except BaseException:
        http.close()
        raise


def running_router(home: Home) -> RouterHandle | None:
    """The router serving this home, if any: the one answering on its control socket
    (recorded again if the records name another, e.g. after a crash mid-restart), else
    the one the pidfile names, if it is still alive."""
    try:
        answering = ping_sync(home.router_socket, timeout_s=1.0)
    except RouterControlError:
        answering = None
    recorded = _pidfile(home)
    if answering is not None:
        stat = process.read_stat(answering)
        if stat is not None and stat.state != "Z":
            handle = RouterHandle(answering, stat.start_ticks, adopted=True)
            if recorded != (handle.pid, handle.start_ticks):
                _record_pid(home, handle)
            return handle
    if recorded is not None and process.is_alive(*recorded):
        return RouterHandle(*recorded, adopted=True)
    return None


def reads_current_tables(home: Home) -> bool:
    """Whether the router serving this home reads the table format this keelway
    publishes. One from before it (an upgrade kept it serving, `down --keep-apps`)
    would refuse the entries it does not know, leaving their hosts unrouted, so it is
    replaced, without a gap, before anything is pushed to it. No answer (a router too
    busy or stopped to answer now): True, it is adopted as before; a handoff from it
    could not succeed either, and the periodic pass catches it up once it answers."""
    try:
        return table_format_sync(home.router_socket, timeout_s=1.0) >= TABLE_FORMAT
    except RouterControlError:
        return True


def _pidfile(home: Home) -> tuple[int, int] | None:
    try:
        pid_s, ticks_s = home.router_pidfile.read_text().split()
        return int(pid_s), int(ticks_s)
    except (FileNotFoundError, ValueError):
        return None


def _record_pid(home: Home, handle: RouterHandle) -> None:
    write_atomic(home.router_pidfile, f"{handle.pid} {handle.start_ticks}\n".encode())
    failpoints.hit("router.recorded")


def default_workers() -> int:
    """One router worker per core (SPEC §4), the way nginx's `auto` counts them, and at
    least two: with workers the router's main process serves no client, so a SIGKILL of
    it closes no held request unanswered (keelway/router/workers.py)."""
    return max(2, len(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class RouterSettings:
    """How the control plane runs the router; defaults in one place."""

    workers: int = 1
    trusted_proxies: tuple[str, ...] = ()
    # How long a request to a holding or parked route waits (for a wake, a hold-mode
    # swap) before 503 + Retry-After; None: the router's own default.
    hold_timeout_s: float | None = None
    # Requests in flight to one instance at once where its route names no bound of its
    # own (keelway/router/concurrency.py); None: the router's own default.
    max_concurrency: int | None = None
    # Where it serves HTTPS (keelway/router/tls.py), from the home's certificate store;
    # None: HTTP only.
    https: str | None = None
    # A handshake naming a served host with no certificate yet asks the control plane
    # for one and waits (router/on_demand.py): on where ACME is (keelway/deploy/certify.py).
    on_demand: bool = False
    # A line per answered request in each instance's logs dir (router/access_log.py),
    # where the service logs are, so it is rotated with them and outlives deploys.
    access_log: bool = True

    def argv(self, home: Home) -> list[str]:
        hold = [] if self.hold_timeout_s is None else [f"--hold-timeout={self.hold_timeout_s}"]
        bound = ([] if self.max_concurrency is None
                 else [f"--max-concurrency={self.max_concurrency}"])
        certs = [] if self.https is None else ["--certs", str(home.certs_dir),
                                               *(["--on-demand"] if self.on_demand else [])]
        access = ([f"--access-log={home.log_dir('-').parent}"] if self.access_log else [])
        return ["--workers", str(self.workers),
                *(f"--trusted-proxy={ip}" for ip in self.trusted_proxies), *hold, *bound,
                *certs, *access]


class _SettingsRecord(msgspec.Struct, frozen=True):
    addr: str
    workers: int
    trusted_proxies: list[str]
    hold_timeout_s: float | None = None
    max_concurrency: int | None = None
    https: str | None = None
    on_demand: bool = False
    access_log: bool = True


def record_settings(home: Home, addr: str, settings: RouterSettings) -> None:
    """Note what the running router serves and how, once it answers with them."""
    record = _SettingsRecord(addr, settings.workers, list(settings.trusted_proxies),
                             settings.hold_timeout_s, settings.max_concurrency,
                             settings.https, settings.on_demand, settings.access_log)
    write_atomic(home.router_settings, msgspec.json.encode(record))


def recorded_settings(home: Home) -> tuple[str, RouterSettings | None] | None:
    """The running router's address and settings as last recorded; None if unknown.
    A home from before settings were recorded has only the address (`router/addr`)."""
    try:
        record = msgspec.json.decode(home.router_settings.read_bytes(), type=_SettingsRecord)
    except (FileNotFoundError, msgspec.DecodeError, msgspec.ValidationError):
        try:
            return (home.router_dir / "addr").read_text().strip(), None
        except FileNotFoundError:
            return None
    return record.addr, RouterSettings(record.workers, tuple(record.trusted_proxies),
                                       record.hold_timeout_s, record.max_concurrency,
                                       record.https, record.on_demand, record.access_log)


# The routers this process started, kept to reap them (and read how they ended) once
# they exit: the event loop reaps them as they exit, and nothing waits on one in the
# foreground, because the router outlives us.
_children: dict[int, process.Reapable] = {}


async def _spawn(home: Home, source: list[str],
                 pass_fds: tuple[int, ...] = ()) -> process.Spawned:
    """Start a router process in a session of its own (it outlives us), its output
    appended to the router log; `source` says where its listening socket comes from."""
    spawned = await process.spawn(
        [sys.executable, "-m", "keelway.router", *source,
         "--control", str(home.router_socket), "--state", str(home.router_state),
         "--wake-socket", str(home.api_socket)],
        log_path=home.router_log, pass_fds=pass_fds,
    )
    _children[spawned.pid] = spawned.proc
    return spawned


async def spawn(home: Home, listeners: Listeners,
                settings: RouterSettings) -> RouterHandle:
    """A router on `listeners` (their fds are inherited), recorded in the pidfile."""
    failpoints.hit("router.spawn.before")
    spawned = await _spawn(home, [*listeners.argv(), *settings.argv(home)], listeners.fds())
    failpoints.hit("router.spawn.after")
    handle = RouterHandle(spawned.pid, spawned.start_ticks, adopted=False)
    await asyncio.to_thread(_record_pid, home, handle)  # an fsync: off the loop
    return handle


def poll(handle: RouterHandle) -> int | None:
    """The exit status of `handle` if it is a router we started that has exited
    (negative: the signal that killed it), forgetting it; None if it runs or is not our
    child (an adopted router's status goes to whoever its parent is now)."""
    proc = _children.get(handle.pid)
    if proc is None or proc.returncode is None:
        return None
    del _children[handle.pid]
    return proc.returncode


async def reap(handle: RouterHandle, timeout_s: float = 1.0) -> int | None:
    """`poll` for a router known to have exited (its pidfd fired, or its session was
    proven gone): the loop may learn of the exit a moment after the kernel says so, so
    this waits up to `timeout_s` for it. None if not our child or still not reaped."""
    proc = _children.get(handle.pid)
    if proc is not None and proc.returncode is None:
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), timeout=timeout_s)
        except TimeoutError:
            return None
    return poll(handle)


async def kill(handle: RouterHandle, clock: Clock) -> bool:
    """SIGKILL the router's session (one that never answered: nothing to drain) and
    prove it gone, reaping it if it is ours."""
    process.signal_session(handle.pid, handle.start_ticks, signal.SIGKILL)
    gone = await process.wait_gone(handle.pid, handle.start_ticks, clock, 5.0,
                                   _children.get(handle.pid))
    poll(handle)
    return gone


class RouterStartFailed(Exception):
    """A router we started exited or did not answer; the message says which."""


async def wait_answering(home: Home, handle: RouterHandle, timeout_s: float,
                         clock: Clock) -> None:
    """Until the router `handle` answers on the control socket (which it opens only once
    every worker serves). Raises RouterStartFailed if it exits first or stays silent
    for `timeout_s`; a silent one is killed, so a failed start leaves nothing behind."""
    deadline = clock.monotonic() + timeout_s
    while True:
        code = poll(handle)
        if code is not None:
            raise RouterStartFailed(f"the router exited at start ({describe_exit(code)}); "
                                    f"see {home.router_log}")
        try:
            if await asyncio.to_thread(ping_sync, home.router_socket, 0.5) == handle.pid:
                return
        except RouterControlError:
            pass
        if clock.monotonic() > deadline:
            await kill(handle, clock)
            raise RouterStartFailed(f"the router did not answer in {timeout_s:.0f} s; "
                                    f"see {home.router_log}")
        await clock.sleep(0.02)


def describe_exit(code: int | None) -> str:
    """How a router ended, for the log and `status`."""
    if code is None:
        return "exit status unknown: not our child"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def borrow_listeners(home: Home) -> Listeners | None:
    """Copies of the listening sockets of the router serving this home, asked for over
    its control socket (the handoff a gapless restart uses, without the retire: the
    router serves on). Holding them lets us start a successor on the same sockets if
    that router dies; None if it would not hand them over."""
    try:
        listener, conn, https = take_listener(home.router_socket, timeout_s=2.0)
    except RouterControlError:
        return None
    conn.close()
    return Listeners(listener, https)


async def stop(home: Home, handle: RouterHandle, clock: Clock) -> bool:
    """SIGTERM the router (it finishes in-flight requests), prove it gone."""
    gone = await process.stop(handle.pid, handle.start_ticks, grace_s=STOP_GRACE_S,
                              clock=clock, proc=_children.get(handle.pid))
    poll(handle)
    if gone:
        home.router_pidfile.unlink(missing_ok=True)
    return gone


class RouterRestartFailed(Exception):
    pass


async def restart(home: Home, old: RouterHandle, clock: Clock,
                  settings: RouterSettings, addr: str) -> RouterHandle:
    """A gapless restart: a new router takes the listening socket from the old one over
    its control socket, takes over the control path, and retires it; the old one drains
    in-flight requests and exits. If the new one fails to start, the old keeps serving.
    The new one is recorded (pidfile, then `addr` and `settings`) once it answers.
    """
    failpoints.hit("router.restart.before")
    # HTTPS the old router does not serve (or serves elsewhere) is a socket of its own,
    # bound here; one it serves comes over with the handoff.
    recorded = recorded_settings(home)
    served = recorded[1].https if recorded is not None and recorded[1] is not None else None
    fresh = None
    if settings.https is not None and settings.https != served:
        try:
            fresh = bind_listener(settings.https)
        except (RouterPortBusy, OSError, ValueError) as exc:
            raise RouterRestartFailed(f"cannot serve HTTPS on {settings.https}: {exc}; "
                                      "the old router keeps serving") from exc
    https = [] if fresh is None else ["--https-fd", str(fresh.fileno())]
    try:
        spawned = await _spawn(home, ["--takeover", str(home.router_socket), *https,
                                      *settings.argv(home)],
                               () if fresh is None else (fresh.fileno(),))
    finally:
        if fresh is not None:
            fresh.close()  # the new router has its own copy
    failpoints.hit("router.restart.after")
    new = RouterHandle(spawned.pid, spawned.start_ticks, adopted=False)
    try:
        await wait_answering(home, new, TAKEOVER_TIMEOUT_S, clock)
    except RouterStartFailed as exc:
        raise RouterRestartFailed(f"{exc}; the old one keeps serving") from exc
    failpoints.hit("router.restart.took_over")
    await asyncio.to_thread(_record_pid, home, new)
    await asyncio.to_thread(record_settings, home, addr, settings)
    # The old router drains and exits on its own; prove it, reaping it if it is ours.
    gone = await process.wait_gone(old.pid, old.start_ticks, clock, RETIRE_WAIT_S,
                                   _children.get(old.pid))
    poll(old)
    if not gone:
        raise RouterRestartFailed(f"the old router (pid {old.pid}) did not exit after "
                                  "handing over; it still drains")
    return new
