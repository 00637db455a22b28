"""How many cold wakes boot at once (issue #22, wake storms): a burst of requests to 50
parked instances must not start 50 boots on two cores, each slowing every other (and
the box) until none is ready in time; nor may one app's burst starve another's.

Rules it keeps:
- At most `slots` wakes boot at once (default two per core: a boot is mostly CPU, with
  some waiting on the disk and the app's own sockets).
- Waiting wakes are let in round-robin across apps, in arrival order within an app: an
  app with 40 tenants waking does not hold back the one tenant of another app for 40
  turns.
- Each held request waits only for its own instance's wake (the router holds per
  host); a thaw (keelway/deploy/freezing.py) takes no slot: it boots nothing.
- A turn is given back however its wake ends (a failure, a cancellation).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

PER_CORE = 2


def default_slots() -> int:
    return max(2, PER_CORE * (os.cpu_count() or 1))


@dataclass(eq=False)
class WakeGate:
    slots: int = field(default_factory=default_slots)
    _busy: int = 0
    # Apps with wakes waiting, in the order they are next served; each app's own queue.
    _apps: collections.OrderedDict[str, collections.deque[asyncio.Future[None]]] = field(
        default_factory=collections.OrderedDict)

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._apps.values())

    @contextlib.asynccontextmanager
    async def turn(self, app: str) -> AsyncIterator[None]:
        """Hold one of the slots while the body runs (a wake's boot)."""
        if self._busy < self.slots and not self._apps:
            self._busy += 1
        else:
            turn = asyncio.get_running_loop().create_future()
            self._apps.setdefault(app, collections.deque()).append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release()  # granted as it was cancelled: pass it on
                else:
                    self._forget(app, turn)
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        """A slot given back: to the next app in turn, or free."""
        while self._apps:
            app, queue = next(iter(self._apps.items()))
            turn = queue.popleft()
            if queue:
                self._apps.move_to_end(app)  # its next wake waits for the other apps'
            else:
                del self._apps[app]
            if not turn.done():
                turn.set_result(None)  # the slot passes over: `_busy` stays
                return
        self._busy -= 1

    def _forget(self, app: str, turn: asyncio.Future[None]) -> None:
        queue = self._apps.get(app)
        if queue is None:
            return
        with contextlib.suppress(ValueError):
            queue.remove(turn)
        if not queue:
            del self._apps[app]
