"""The router's half of a wake: ask the control plane to wake a parked instance.

One `Waker` per router, in its main process; every worker's notes of a parked instance
with requests waiting come to it (keelway/router/workers.py), so a router has at most one
wake request per instance open at a time, however many requests and workers wait, and
through however many of its hosts (an alias's route names its instance: what is asked
awake is always the instance, by its own name, never an alias the API does not wake).

The request is `POST /v1/instances/INSTANCE/wake` with body `{}`, raw HTTP/1.1 over the
control plane's API unix socket (`--wake-socket`, keelway/router/api_socket.py). Its
answer:

- 2xx: accepted, nothing more. The held requests are released by the table that names
  the route `serving` (Proxy.swap), never by this answer or by a timer;
- 4xx or 503: refused (fenced, unknown host, a crash backoff): the held requests get
  503 now, and new ones for WAKE_REFUSED_HOLDOFF_S (keelway/router/proxy.py), with the
  page of what the refusal means (`refusal_page`): a 503 is a crash backoff
  ("restarting", with the answer's own Retry-After), anything else "maintenance";
- no answer (socket missing, connection refused or cut, any other status): the control
  plane is down or restarting; asked again every WAKE_RETRY_S.

It keeps at it while the host is still parked and requests may still be held: until the
last note plus the hold bound. An accepted wake is asked again only if the control
plane's socket was replaced since (it restarted, and may have lost the wake before
journaling it) or WAKE_REASK_S passed with the host still parked, so the control plane's
wake must be idempotent: a wake of an instance already waking is a no-op answered 2xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, assert_never

from keelway.router.api_socket import post, post_request, status_of
from keelway.router.proxy import WAKE_NOTE_S, WAKE_REFUSED_HOLDOFF_S, Proxy
from keelway.router.route_table import Handling

log: Final = logging.getLogger("keelway.router")

WAKE_RETRY_S: Final = 0.1
WAKE_REASK_S: Final = 5.0


class WakeAnswer(enum.Enum):
    ACCEPTED = "accepted"
    REFUSED = "refused"
    UNREACHABLE = "unreachable"


def refusal_page(status: int, retry_after_s: int | None) -> tuple[Handling, int | None]:
    """The page state and Retry-After (None: the route's own) for the requests of a
    refused wake: the API answers 503 only for a crash backoff (with Retry-After: until
    the retry), 409 for a fence, 404 for an instance it no longer has."""
    if status == 503:
        return Handling.CRASHED, retry_after_s
    return Handling.GATED, None


def wake_request(host: str) -> bytes:
    """The whole request; `host` follows the host rule, so it needs no escaping."""
    return post_request(wake_path(host))


def wake_path(host: str) -> str:
    return f"/v1/instances/{host}/wake"


def outcome_of(status_line: bytes) -> tuple[WakeAnswer, int]:
    status = status_of(status_line)
    return answer_of(status), status


def answer_of(status: int) -> WakeAnswer:
    if 200 <= status < 300:
        return WakeAnswer.ACCEPTED
    if 400 <= status < 500 or status == 503:
        return WakeAnswer.REFUSED
    return WakeAnswer.UNREACHABLE


async def post_wake(socket_path: Path, host: str, timeout_s: float,
                    ) -> tuple[WakeAnswer, int, int | None]:
    """One wake request: the outcome, the status of its answer (0: none) and its
    Retry-After in seconds, if it said one."""
    status, retry_after_s = await post(socket_path, wake_path(host), timeout_s)
    outcome = answer_of(status)
    return outcome, status, retry_after_s if outcome is WakeAnswer.REFUSED else None


def socket_identity(path: Path) -> tuple[int, int, int] | None:
    """Which socket file is there now: a restarted control plane binds a new one. The
    inode alone does not tell (a file system reuses a freed inode number at once); its
    change time, in nanoseconds, with it does."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class Waker:
    """Wakes parked instances of `proxy`'s table, one request at a time per instance
    (the hosts it is given are instances' own names: `CompiledRoute.instance`)."""

    def __init__(self, proxy: Proxy, socket_path: Path,
                 refuse_elsewhere: Callable[[str, Handling, int | None], Awaitable[None]]
                 | None = None) -> None:
        self._proxy = proxy
        self._socket_path = socket_path
        self._refuse_elsewhere = refuse_elsewhere
        self._loop = asyncio.get_running_loop()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._until: dict[str, float] = {}
        # A refused host is not asked again before this (a worker may note it once
        # more before its own hold-off begins).
        self._refused_until: dict[str, float] = {}
        # Set by every table swap, so a task sees its host unparked at once.
        self._changed: dict[str, asyncio.Event] = {}
        self.posts: dict[str, int] = {}  # wake requests sent per host (tests, logs)
        proxy.wake_hook = self.need
        proxy.swap_hook = self.table_changed

    def need(self, host: str) -> None:
        """A process holds requests for parked `host` (or just turned one away)."""
        now = self._loop.time()
        refused_until = self._refused_until.get(host)
        if refused_until is not None:
            if now < refused_until:
                return
            del self._refused_until[host]
        until = now + self._proxy.options.hold_timeout_s + WAKE_NOTE_S
        if until > self._until.get(host, 0.0):
            self._until[host] = until
        if host not in self._tasks and self._parked(host):
            self._changed[host] = asyncio.Event()
            self._tasks[host] = self._loop.create_task(self._wake(host))

    def table_changed(self) -> None:
        for event in self._changed.values():
            event.set()

    def waking(self) -> frozenset[str]:
        return frozenset(self._tasks)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _parked(self, instance: str) -> bool:
        return instance in self._proxy.routing.parked

    async def _wake(self, host: str) -> None:
        try:
            await self._wake_loop(host)
        finally:
            del self._tasks[host]
            del self._changed[host]
            self._until.pop(host, None)

    async def _wake_loop(self, host: str) -> None:
        changed = self._changed[host]
        accepted_by: tuple[int, int, int] | None = None
        reask_at = 0.0
        unreachable_since: float | None = None
        while self._parked(host):
            now = self._loop.time()
            until = self._until.get(host, 0.0)
            if now >= until:
                if accepted_by is None:
                    log.warning("wake of %s: the control plane did not take it before the "
                                "hold bound; its requests got 503", host)
                return
            if accepted_by is None or now >= reask_at or (
                    socket_identity(self._socket_path) != accepted_by):
                # Taken before asking: a restart during the request changes it after.
                identity = socket_identity(self._socket_path)
                changed.clear()
                self.posts[host] = self.posts.get(host, 0) + 1
                outcome, status, retry_after_s = await post_wake(
                    self._socket_path, host, until - now)
                match outcome:
                    case WakeAnswer.ACCEPTED:
                        if unreachable_since is not None:
                            log.info("wake of %s: the control plane is back and took it", host)
                        else:
                            log.info("wake of %s: asked, and the control plane took it", host)
                        accepted_by = identity
                        unreachable_since = None
                        reask_at = self._loop.time() + WAKE_REASK_S
                    case WakeAnswer.REFUSED:
                        log.warning("wake of %s refused by the control plane (HTTP %d): "
                                    "its requests get 503", host, status)
                        self._refused_until[host] = (self._loop.time()
                                                     + WAKE_REFUSED_HOLDOFF_S)
                        page, page_retry_s = refusal_page(status, retry_after_s)
                        self._proxy.refuse_wake(host, page, page_retry_s)
                        if self._refuse_elsewhere is not None:
                            await self._refuse_elsewhere(host, page, page_retry_s)
                        return
                    case WakeAnswer.UNREACHABLE:
                        if unreachable_since is None:
                            unreachable_since = now
                            log.warning("wake of %s: no answer from the control plane on %s "
                                        "(HTTP %d); asking again every %.1f s", host,
                                        self._socket_path, status, WAKE_RETRY_S)
                        accepted_by = None
                    case _:
                        assert_never(outcome)
            if not self._parked(host):
                return
            # Woken at once by a swap; else it looks again after WAKE_RETRY_S.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WAKE_RETRY_S):
                    await changed.wait()
            changed.clear()
