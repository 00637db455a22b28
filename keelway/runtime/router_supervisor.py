"""Router supervision: the control plane keeps one router serving its address.

Owns the router's life as the control plane sees it: boot (adopt the router that
answers, or start one), noticing its death, starting a successor, `router restart`, and
stop. The process verbs it uses are keelway.runtime.router's; nothing here blocks the
event loop (the API and the app supervisor keep running through a respawn). Rules:

- The listening socket is bound once and held here for as long as this control plane
  runs (for an adopted router, a copy is borrowed over its control socket). A successor
  inherits that same socket, so the address never changes and a connection that
  arrives while no router runs waits in the kernel's backlog instead of being refused.
- Death is a signal, not a poll: a pidfd of the router's main process (Linux >= 5.3;
  it works on an adopted router too, which is not our child) is watched by the event
  loop and turns readable when the process exits (keelway.runtime.death_watch).
- A dead router is started again at once. One that dies again (or fails to start)
  within STABLE_S of its start waits by RESPAWN_DELAYS_S, bounded, so a router that
  cannot start never spins; the log and `status` say why and when the next try is.
- One change of router at a time (a lock): a death, a restart and a stop never race
  for the socket, and a router replaced on purpose is no longer watched.

Crash windows: a death is known only in memory. Killed after `router.respawn.before`,
nothing was started: the next boot finds no router and starts one on the same address
(it waits for the port while the dead router's workers drain). Killed after the spawn,
before it was recorded, the next boot finds the new router by its control socket, or
waits for the port it holds until it answers, and adopts it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from keelway import failpoints
from keelway.clock import Clock
from keelway.home import Home
from keelway.runtime import process, router
from keelway.runtime.death_watch import DeathWatch
from keelway.runtime.router import (
    RouterHandle,
    RouterPortBusy,
    RouterRestartFailed,
    RouterSettings,
    RouterStartFailed,
)

log: Final = logging.getLogger("keelway.router_supervisor")

failpoints.declare("router.respawn.before", "router.respawn.after")

RESPAWN_DELAYS_S: Final = (0.0, 1.0, 5.0, 15.0, 30.0, 60.0)
# A router that ran this long before dying was healthy: its death is retried at once.
STABLE_S: Final = 30.0
# A worker may take 30 s to start on a starved box (router.workers), and the router
# answers only once every worker serves.
START_TIMEOUT_S: Final = 40.0
# How long boot waits for the port of a router of ours that died (its workers drain)
# or that a crashed control plane started and never recorded (it will answer).
PORT_WAIT_S: Final = 10.0


class RouterState(Enum):
    SERVING = "serving"
    STARTING = "starting"
    DOWN = "down"


@dataclass(frozen=True)
class RouterHealth:
    """What `status` shows of the router. Restarts count since this control plane
    started; `up_since` is the process's own start time, so it is right when adopted."""

    state: RouterState
    pid: int | None
    addr: str
    workers: int
    adopted: bool
    up_since: float | None
    down_since: float | None
    restarts: int
    last_restart_reason: str | None
    last_restart_at: float | None
    next_retry_at: float | None
    last_error: str | None
    death_watch: str


def _started_at(handle: RouterHandle) -> float | None:
    """Wall time at which the process started, from its start ticks since boot."""
    try:
        with open("/proc/stat", "rb") as stat:
            btime = next(int(line.split()[1]) for line in stat if line.startswith(b"btime"))
    except (OSError, StopIteration, ValueError):
        return None
    return btime + handle.start_ticks / os.sysconf("SC_CLK_TCK")


class RouterSupervisor:
    """The router of this control plane: its handle, the socket it listens on, and
    the watch on its life. Made by `boot`; `watch` starts supervision."""

    def __init__(self, home: Home, addr: str, settings: RouterSettings, clock: Clock,
                 handle: RouterHandle, listeners: router.Listeners | None) -> None:
        # What the router runs as: the home it serves, where it listens and with what.
        self.home, self.addr, self.settings = home, addr, settings
        self._clock = clock
        self._handle = handle  # the router process running now (replaced by a restart)
        self._listeners = listeners  # held for as long as this control plane runs
        self._lock = asyncio.Lock()
        self._watch: DeathWatch | None = None
        self._death_kind = "pidfd"
        self._tasks: set[asyncio.Task[None]] = set()
        self._retry: asyncio.Task[None] | None = None
        self._on_serving: Callable[[], Awaitable[str | None]] | None = None
        self._stopping = self._starting = False
        # The bounded respawn: tries since a router last stayed up STABLE_S, and when the
        # current one started.
        self._streak = 0
        self._started_mono = clock.monotonic()
        # What `status` reports of the router's life.
        self.restarts = 0
        self._down_since: float | None = None
        self._next_retry_at: float | None = None
        self._last_error: str | None = None
        self._last_reason: str | None = None
        self._last_restart_at: float | None = None

    @property
    def handle(self) -> RouterHandle:
        return self._handle

    # -- boot ---------------------------------------------------------------------------

    @classmethod
    async def boot(cls, home: Home, addr: str, settings: RouterSettings,
                   clock: Clock) -> RouterSupervisor:
        """The router for this home, serving `addr` with `settings`: the running one,
        adopted, if it matches; restarted without a gap if only its settings differ or
        it reads an older route table format (an upgrade kept it serving); else (a new
        address, or none running) a new one on a socket bound here.

        Raises RouterPortBusy (someone else has the port), RouterStartFailed,
        RouterRestartFailed, or OSError/ValueError for an address we cannot bind."""
        ours_recorded = home.router_pidfile.exists()
        deadline = clock.monotonic() + (PORT_WAIT_S if ours_recorded else 0.0)
        while True:
            running = await asyncio.to_thread(router.running_router, home)
            if running is not None:
                recorded = router.recorded_settings(home)
                if recorded is not None and recorded[0] == addr:
                    current = await asyncio.to_thread(router.reads_current_tables, home)
                    if recorded[1] == settings and current:
                        listeners = await asyncio.to_thread(router.borrow_listeners, home)
                        log.info("adopted the running router (pid %s)", running.pid)
                        return cls(home, addr, settings, clock, running, listeners)
                    log.info("restarting the router (pid %s) with %s", running.pid,
                             "new settings" if current else "this keelway's code: it "
                             "reads an older route table format")
                    handle = await router.restart(home, running, clock, settings, addr)
                    # Borrowed from the new one: its HTTPS socket may be new.
                    listeners = await asyncio.to_thread(router.borrow_listeners, home)
                    return cls(home, addr, settings, clock, handle, listeners)
                await router.stop(home, running, clock)
                # Its workers let go of the port as they finish draining: ours, so wait
                # for them (a crash before the first record left no pidfile to say so).
                deadline = max(deadline, clock.monotonic() + PORT_WAIT_S)
            try:
                listeners = router.bind_listeners(addr, settings.https)
                break
            except RouterPortBusy:
                # A router of ours that died may still have workers draining on the
                # port, or one a crashed control plane started may be about to answer.
                if clock.monotonic() >= deadline:
                    raise
                await clock.sleep(0.1)
        try:
            handle = await router.spawn(home, listeners, settings)
            await router.wait_answering(home, handle, START_TIMEOUT_S, clock)
        except BaseException:
            listeners.close()
            raise
        await asyncio.to_thread(router.record_settings, home, addr, settings)
        return cls(home, addr, settings, clock, handle, listeners)

    # -- supervision --------------------------------------------------------------------

    def watch(self, on_serving: Callable[[], Awaitable[str | None]]) -> None:
        """Start supervising; `on_serving` runs after every new router answers (to push
        the store's routes: the router starts with the table it last saved). It returns
        None once they are pushed, else why not (an expected outcome, not an exception:
        the routes are the control plane's business, so the caller words the reason)."""
        self._on_serving = on_serving
        self._arm(self._handle)

    def _arm(self, handle: RouterHandle) -> None:
        self._disarm()
        self._watch = DeathWatch(handle, lambda: self._spawn_task(self._died(handle)))
        self._death_kind = self._watch.kind

    def _disarm(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def _spawn_task(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _died(self, handle: RouterHandle) -> None:
        async with self._lock:
            if self._stopping or handle != self._handle:
                return  # replaced or stopped on purpose meanwhile
            code = await router.reap(handle)
            reason = f"router pid {handle.pid} died ({router.describe_exit(code)})"
            self._down_since = self._clock.now()
            log.error("%s", reason)
            await self._start_or_retry(reason)

    async def _start_or_retry(self, reason: str) -> None:
        """Start a router now, or after the backoff its recent deaths earned; a failed
        start schedules the next try. Called with the lock held."""
        if self._clock.monotonic() - self._started_mono >= STABLE_S:
            self._streak = 0
        delay_s = RESPAWN_DELAYS_S[min(self._streak, len(RESPAWN_DELAYS_S) - 1)]
        self._streak += 1
        if delay_s == 0:
            log.info("starting a new router on %s", self.addr)
            await self._try_start(reason)
            return
        self._next_retry_at = self._clock.now() + delay_s
        log.error("the router failed again within %.0f s of its start; next try in %.0f s "
                  "(`keelway router restart` tries now)", STABLE_S, delay_s)
        self._retry = self._spawn_task(self._retry_after(delay_s, reason))

    async def _retry_after(self, delay_s: float, reason: str) -> None:
        await self._clock.sleep(delay_s)
        async with self._lock:
            self._retry = None
            if not self._stopping:
                await self._try_start(reason)

    async def _try_start(self, reason: str) -> None:
        try:
            await self._start(reason)
        except RouterStartFailed:
            await self._start_or_retry(reason)

    async def _start(self, reason: str) -> RouterHandle:
        """A new router on our socket, answering, recorded and watched. Called with the
        lock held; raises RouterStartFailed and leaves no process behind."""
        self._next_retry_at = None
        self._started_mono = self._clock.monotonic()
        self._starting = True
        try:
            failpoints.hit("router.respawn.before")
            listeners = self._listeners
            if listeners is None:
                # An adopted router that would not lend its sockets: bind the addresses
                # again, once its workers let go of them.
                listeners = await self._bind_when_free()
                self._listeners = listeners
            handle = await router.spawn(self.home, listeners, self.settings)
            await router.wait_answering(self.home, handle, START_TIMEOUT_S, self._clock)
            await asyncio.to_thread(router.record_settings, self.home, self.addr, self.settings)
            failpoints.hit("router.respawn.after")
            log.info("the router serves again on %s (pid %s)", self.addr, handle.pid)
            await self._publish()
        except RouterStartFailed as exc:
            self._last_error = str(exc)
            log.error("%s", exc)
            raise
        finally:
            self._starting = False
        # Watched from here; a death since it answered is seen at once when armed.
        self._serving(handle, reason)
        return handle

    async def _bind_when_free(self) -> router.Listeners:
        deadline = self._clock.monotonic() + PORT_WAIT_S
        while True:
            try:
                return router.bind_listeners(self.addr, self.settings.https)
            except RouterPortBusy as exc:
                if self._clock.monotonic() >= deadline:
                    raise RouterStartFailed(str(exc)) from exc
            except (OSError, ValueError) as exc:
                raise RouterStartFailed(f"cannot listen on {self.addr}: {exc}") from exc
            await self._clock.sleep(0.1)

    def _serving(self, handle: RouterHandle, reason: str) -> None:
        """`handle` is the router now; note why it changed and watch it."""
        self._handle = handle
        self.restarts += 1
        self._last_reason = reason
        self._last_restart_at = self._clock.now()
        self._down_since = None
        self._last_error = None
        if not self._stopping:
            self._arm(handle)

    async def _publish(self) -> None:
        if self._on_serving is None:
            return
        refused = await self._on_serving()
        if refused is not None:
            # The periodic pass republishes; the router serves its saved table till then.
            log.warning("the new router did not take the routes yet: %s", refused)

    # -- on request ---------------------------------------------------------------------

    async def restart(self) -> dict[str, object]:
        """`router restart`: a gapless handoff from a live router; a dead one (waiting
        out its backoff, say) is started at once. Raises RouterRestartFailed or
        RouterStartFailed with a message for the operator."""
        async with self._lock:
            old = self._handle
            if self._retry is not None:
                self._retry.cancel()
                self._retry = None
            if process.is_alive(old.pid, old.start_ticks):
                self._disarm()  # the old one exits on purpose: not a death to act on
                try:
                    new = await router.restart(self.home, old, self._clock, self.settings,
                                               self.addr)
                except RouterRestartFailed:
                    await self._adopt_whoever_answers(old)
                    if process.is_alive(self._handle.pid, self._handle.start_ticks):
                        raise
                    old = self._handle  # it died under the handoff: start one below
                else:
                    self._serving(new, "router restart (asked for)")
                    await self._publish()
                    return {"old_pid": old.pid, "new_pid": new.pid, "was_dead": False}
            # Asked for: try now, whatever the backoff said; a failure keeps the backoff.
            reason = f"router restart (asked for; pid {old.pid} was dead)"
            self._down_since = self._down_since or self._clock.now()
            try:
                new = await self._start(reason)
            except RouterStartFailed:
                self._streak = max(self._streak, 1)  # the next try waits, never spins
                await self._start_or_retry(reason)
                raise
            return {"old_pid": old.pid, "new_pid": new.pid, "was_dead": True}

    async def _adopt_whoever_answers(self, old: RouterHandle) -> None:
        """After a failed handoff the router may be the old one, the new one (it took
        over but the old did not exit in time), or none: watch the one that answers."""
        current = await asyncio.to_thread(router.running_router, self.home)
        self._handle = current or old
        self._arm(self._handle)

    def health(self) -> RouterHealth:
        handle = self._handle
        alive = process.is_alive(handle.pid, handle.start_ticks)
        state = (RouterState.STARTING if self._starting else
                 RouterState.SERVING if alive else RouterState.DOWN)
        return RouterHealth(
            state=state, pid=handle.pid if alive else None, addr=self.addr,
            workers=self.settings.workers, adopted=handle.adopted,
            up_since=_started_at(handle) if alive else None,
            down_since=None if alive else self._down_since,
            restarts=self.restarts, last_restart_reason=self._last_reason,
            last_restart_at=self._last_restart_at, next_retry_at=self._next_retry_at,
            last_error=self._last_error, death_watch=self._death_kind,
        )

    async def stop(self, keep_serving: bool) -> bool:
        """Stop supervising; stop the router too unless `keep_serving` (`down
        --keep-apps`: an upgrade of keelway must not stop traffic). True unless the
        router would not die."""
        async with self._lock:
            self._stopping = True
            self._disarm()
            if self._retry is not None:
                self._retry.cancel()
            if self._listeners is not None:
                self._listeners.close()  # the router has its own copy
                self._listeners = None
            handle = self._handle
            if keep_serving:
                if not process.is_alive(handle.pid, handle.start_ticks):
                    log.warning("the router is down; the next `keelway up` starts it")
                return True
            return await router.stop(self.home, handle, self._clock)

