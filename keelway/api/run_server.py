"""The run socket: where `keelway run` lends the daemon its terminal (keelway/run_wire.py).

A second unix socket beside the API's (Home.run_socket, 0600, in the 0700 home), served
on the daemon's loop. Not through `asyncio.start_unix_server`: its transports read with
recv(), and the kernel closes descriptors sent with SCM_RIGHTS to a reader that gives
no room for them, so the lent terminal would be lost before a handler saw it. The first
message is read with recvmsg (`socket.recv_fds`) when the socket is readable; the rest
with the loop's sock_recv, which drops (closes) any descriptor sent later.

Each connection is one run (keelway/deploy/runs.py). Only the daemon's own user may
connect (SO_PEERCRED), as only it can reach the socket's directory anyway. The daemon
keeps its copies of the lent descriptors only until the spawn: a pipe the child writes
must see its end when the child exits, not when the daemon closes a forgotten copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct

import msgspec
from aiohttp import web

from keelway import run_wire
from keelway.api.http import read_body, route
from keelway.api.plans import plan_response
from keelway.deploy.errors import OperationError
from keelway.deploy.runs import Runs, Signals
from keelway.home import Home
from keelway.run_wire import Exited, Forward, Lines, Refused, RunRequest, Started, WireError

log = logging.getLogger("keelway.runs")

REQUEST_TIMEOUT_S = 10.0
# How long a shutdown waits for the runs it hangs up to be proven gone and journaled.
CLOSE_TIMEOUT_S = 15.0
_UCRED = struct.Struct("3i")


class RunServer:
    def __init__(self, home: Home, runs: Runs) -> None:
        self.home = home
        self.runs = runs
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._sessions: dict[asyncio.Task[None], Signals] = {}
        self._attending: set[asyncio.Task[None]] = set()  # past their request

    async def start(self) -> None:
        path = self.home.run_socket
        path.unlink(missing_ok=True)  # stale: the caller holds the home lock
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o077)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._accepting = asyncio.get_running_loop().create_task(self._accept_forever())

    async def close(self) -> None:
        """Stop accepting, hang up every run (its process is stopped, its outcome
        journaled) and wait for them, boundedly."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
            self.home.run_socket.unlink(missing_ok=True)
        for task, signals in list(self._sessions.items()):
            if task in self._attending:
                signals.put_nowait(None)
            else:
                task.cancel()  # nothing started yet; it must not hold the shutdown
        if self._sessions:
            _done, pending = await asyncio.wait(list(self._sessions), timeout=CLOSE_TIMEOUT_S)
            for task in pending:
                log.warning("a run did not end in %ss of the shutdown", CLOSE_TIMEOUT_S)
                task.cancel()

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        while True:
            conn, _ = await loop.sock_accept(self._listener)
            conn.setblocking(False)
            signals: Signals = asyncio.Queue()
            task = loop.create_task(self._serve(conn, signals))
            self._sessions[task] = signals
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._sessions.pop(task, None)
        self._attending.discard(task)

    async def _serve(self, conn: socket.socket, signals: Signals) -> None:
        fds: list[int] = []
        try:
            with conn:
                try:
                    request, fds, lines, early = await asyncio.wait_for(
                        self._request(conn), REQUEST_TIMEOUT_S)
                except (WireError, TimeoutError) as exc:
                    await _send(conn, Refused("bad-request", f"not a run request: {exc}",
                                              "use `keelway run APP -- CMD...`"))
                    return
                current = asyncio.current_task()
                assert current is not None
                self._attending.add(current)  # a shutdown hangs it up from here on
                for forward in early:
                    signals.put_nowait(forward.signum)
                await self._run(conn, request, fds, lines, signals)
        except Exception:
            # Protects the daemon's loop: one run's failure is logged, and its CLI sees
            # the socket close (it says the control plane went away).
            log.exception("a run failed")
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    async def _request(self, conn: socket.socket
                       ) -> tuple[RunRequest, list[int], Lines, list[Forward]]:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        _pid, uid, _gid = _UCRED.unpack(creds)
        if uid != os.getuid():
            raise WireError(f"uid {uid} may not run here")
        data, fds = await _recv_fds(conn)
        try:
            first, lines, early = await self._request_line(conn, data)
            if len(fds) != run_wire.STDIO_FDS:
                raise WireError(f"expected {run_wire.STDIO_FDS} descriptors (stdin, stdout, "
                                f"stderr), got {len(fds)}")
        except BaseException:
            for fd in fds:  # a refused or timed-out request keeps nothing of its sender's
                os.close(fd)
            raise
        return first, fds, lines, early

    async def _request_line(self, conn: socket.socket, data: bytes
                            ) -> tuple[RunRequest, Lines, list[Forward]]:
        lines = Lines()
        loop = asyncio.get_running_loop()
        while True:
            messages = list(lines.feed(data))
            if messages:
                break
            if not data:
                raise WireError("the connection closed before a request")
            data = await loop.sock_recv(conn, 65536)
        first, *later = messages
        if not isinstance(first, RunRequest):
            raise WireError(f"expected a run request, got {type(first).__name__}")
        # The user may press Ctrl-C before the command runs: those reach it once it does.
        early = [m for m in later if isinstance(m, Forward)]
        if len(early) != len(later):
            raise WireError("only signals may follow the request")
        return first, lines, early

    async def _run(self, conn: socket.socket, request: RunRequest, fds: list[int],
                   lines: Lines, signals: Signals) -> None:
        loop = asyncio.get_running_loop()
        reader: asyncio.Task[None] | None = None

        async def started(spawned: Started) -> None:
            nonlocal reader
            for fd in fds:  # the child has its own copies now
                os.close(fd)
            fds.clear()
            await _send(conn, spawned)
            reader = loop.create_task(_read_signals(conn, lines, signals))

        stdio = (fds[0], fds[1], fds[2])
        try:
            code = await self.runs.run(request.app, request.instance, request.argv,
                                       stdio=stdio, term=request.term if request.tty else None,
                                       started=started, signals=signals)
        except OperationError as exc:
            await _send(conn, Refused(exc.code, exc.message,
                                      exc.hint))
            return
        finally:
            if reader is not None:
                reader.cancel()
        await _send(conn, Exited(code))


async def _recv_fds(conn: socket.socket) -> tuple[bytes, list[int]]:
    """The first bytes of a connection with the descriptors sent along with them."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            # close-on-exec as they arrive: they become the run's stdio by dup2, and
            # must reach no other child (keelway.runtime.process)
            data, fds, flags, _ = socket.recv_fds(conn, 65536, run_wire.STDIO_FDS,
                                                  socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            await _readable(loop, conn)
            continue
        if flags & socket.MSG_CTRUNC:
            for fd in fds:
                os.close(fd)
            raise WireError(f"more than {run_wire.STDIO_FDS} descriptors were sent")
        return data, fds


async def _readable(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(conn.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(conn.fileno())


async def _read_signals(conn: socket.socket, lines: Lines, signals: Signals) -> None:
    """Signals from the CLI into `signals` until it closes the socket: then a hangup."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            data = await loop.sock_recv(conn, 4096)
            if not data:
                break
            for message in lines.feed(data):
                if not isinstance(message, Forward):
                    raise WireError(f"unexpected {type(message).__name__} during a run")
                signals.put_nowait(message.signum)
    except (OSError, WireError) as exc:
        log.warning("a run's terminal connection: %s; hanging up", exc)
    signals.put_nowait(None)


async def _send(conn: socket.socket, message: Started | Refused | Exited) -> None:
    """Send, or let it go when the CLI is gone (its reader hangs up the run)."""
    with contextlib.suppress(OSError):
        await asyncio.get_running_loop().sock_sendall(conn, run_wire.encode(message))



class RunPlanBody(msgspec.Struct, forbid_unknown_fields=True):
    instance: str | None = None
    argv: list[str] = []


class RunPlanApi:
    """`keelway run --dry-run`: the plan a run would run, over HTTP (the run socket
    lends a terminal; a dry run needs none).

        POST /v1/apps/{app}/run-plan  {"instance": H|null, "argv": [...]}  -> 200 plan
    """

    def __init__(self, runs: Runs) -> None:
        self.runs = runs


    @route("POST", "/v1/apps/{app}/run-plan")
    async def plan(self, request: web.Request) -> web.Response:
        body: RunPlanBody = await read_body(request, RunPlanBody)
        return plan_response(self.runs.dry_run(request.match_info["app"], body.instance,
                                               body.argv))
