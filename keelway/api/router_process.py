"""The router as a process of its own: bind, spawn, adopt, stop.

The control plane binds the listening socket itself, so a port already in use is a
clear error before anything else starts, and hands the bound fd to the router. The
router runs in its own session and is not our child in spirit: it survives a crash of
the control plane and keeps serving its last route table. Its pid and start time are
kept in a pidfile so that the next control plane adopts it instead of fighting it for
the port.

Which router is *the* router is decided by the control socket: the process that
answers there owns it (a successor renames its socket over its predecessor's only once
it serves). The pidfile and the settings file are records of that process, written
after it answers, so a control plane killed between starting a router and recording it
finds it again by asking the socket, and never binds a second one.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from dataclasses import dataclass

import msgspec

from keelway import failpoints
from keelway.clock import Clock
from keelway.durable import write_atomic
from keelway.home import Home
from keelway.router.client import RouterControlError, ping_sync
from keelway.router.server import bind_tcp
from keelway.runtime import logs, process

failpoints.declare(
    "router.spawn.before", "router.spawn.after", "router.recorded",
    "router.restart.before", "router.restart.after", "router.restart.took_over",
)


class RouterPortBusy(Exception):
    def __init__(self, addr: str) -> None:
        super().__init__(f"the router address {addr} is already in use")
        self.addr = addr


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
            raise RouterPortBusy(addr) from exc
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
    """One router worker per core (SPEC §4), the way nginx's `auto` counts them."""
    return max(1, len(os.sched_getaffinity(0)))


@dataclass(frozen=True)
class RouterSettings:
    """How the control plane runs the router; defaults in one place."""

    workers: int = 1
    trusted_proxies: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        return ["--workers", str(self.workers),
                *(f"--trusted-proxy={ip}" for ip in self.trusted_proxies)]


class _SettingsRecord(msgspec.Struct, frozen=True):
    addr: str
    workers: int
    trusted_proxies: list[str]


def record_settings(home: Home, addr: str, settings: RouterSettings) -> None:
    """Note what the running router serves and how, once it answers with them."""
    record = _SettingsRecord(addr, settings.workers, list(settings.trusted_proxies))
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
    return record.addr, RouterSettings(record.workers, tuple(record.trusted_proxies))


def spawn_router(home: Home, listener: socket.socket,
                 settings: RouterSettings) -> RouterHandle:
    failpoints.hit("router.spawn.before")
    log_fd = logs.open_for_append(home.router_log)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "keelway.router", "--listen-fd", str(listener.fileno()),
             "--control", str(home.router_socket), "--state", str(home.router_state),
             *settings.argv()],
            pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL, stdout=log_fd,
            stderr=log_fd, start_new_session=True, close_fds=True,
        )
    finally:
        os.close(log_fd)
    failpoints.hit("router.spawn.after")
    stat = process.read_stat(proc.pid)
    ticks = stat.start_ticks if stat else 0
    _record_pid(home, RouterHandle(proc.pid, ticks, adopted=False))
    # The Popen object is dropped on purpose: the router outlives us. Python's
    # subprocess module would warn about an unreaped child; reap it in the background
    # if it exits while we run.
    _keep_for_reaping.append(proc)
    return RouterHandle(proc.pid, ticks, adopted=False)


_keep_for_reaping: list[subprocess.Popen[bytes]] = []


def router_exited() -> bool:
    return any(p.poll() is not None for p in _keep_for_reaping)


async def stop_router(home: Home, handle: RouterHandle, clock: Clock) -> bool:
    """SIGTERM the router (it finishes in-flight requests), prove it gone."""
    proc = next((p for p in _keep_for_reaping if p.pid == handle.pid), None)
    if proc is not None:
        proc.terminate()
    gone = await process.stop(handle.pid, handle.start_ticks, grace_s=15.0, clock=clock)
    if proc is not None:
        proc.wait()
        _keep_for_reaping.remove(proc)
    if gone:
        home.router_pidfile.unlink(missing_ok=True)
    return gone


class RouterRestartFailed(Exception):
    pass


async def restart_router(home: Home, old: RouterHandle, clock: Clock,
                         settings: RouterSettings, addr: str) -> RouterHandle:
    """A gapless restart: a new router takes the listening socket from the old one over
    its control socket, takes over the control path, and retires it; the old one drains
    in-flight requests and exits. If the new one fails to start, the old keeps serving.
    The new one is recorded (pidfile, then `addr` and `settings`) once it answers.
    """
    failpoints.hit("router.restart.before")
    log_fd = logs.open_for_append(home.router_log)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "keelway.router", "--takeover", str(home.router_socket),
             "--control", str(home.router_socket), "--state", str(home.router_state),
             *settings.argv()],
            stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(log_fd)
    failpoints.hit("router.restart.after")
    deadline = clock.monotonic() + 10
    while True:
        if proc.poll() is not None:
            raise RouterRestartFailed(
                f"the new router exited ({proc.returncode}); the old one keeps serving; "
                f"see {home.router_log}")
        try:
            if ping_sync(home.router_socket, timeout_s=0.5) == proc.pid:
                break
        except RouterControlError:
            pass
        if clock.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RouterRestartFailed("the new router did not take over in 10 s; the old "
                                      "one keeps serving")
        await clock.sleep(0.05)
    failpoints.hit("router.restart.took_over")
    stat = process.read_stat(proc.pid)
    handle = RouterHandle(proc.pid, stat.start_ticks if stat else 0, adopted=False)
    _record_pid(home, handle)
    record_settings(home, addr, settings)
    _keep_for_reaping.append(proc)
    # The old router drains and exits on its own; prove it, reaping it if it is ours.
    old_proc = next((p for p in _keep_for_reaping if p.pid == old.pid), None)
    gone = await process.wait_gone(old.pid, old.start_ticks, clock, 20.0)
    if old_proc is not None:
        old_proc.wait()
        _keep_for_reaping.remove(old_proc)
    if not gone:
        raise RouterRestartFailed(f"the old router (pid {old.pid}) did not exit after "
                                  "handing over; it still drains")
    return handle
