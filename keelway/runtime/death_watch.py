"""A death watch: one call, soon after a process exits, whether it is our child or not.

Death is a signal, not a poll: a pidfd of the process (Linux >= 5.3; it works on a
process that is not our child, such as a router adopted after a control-plane restart)
is watched by the event loop and turns readable when the process exits. Where pidfds
are missing, a check every POLL_S stands in. A pid may be reused, so the process is
named by pid and start time together (keelway.runtime.process).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Final, Protocol

from keelway.runtime import process

POLL_S: Final = 0.5


class Watched(Protocol):
    """A process by pid and start time (a RouterHandle, say)."""

    @property
    def pid(self) -> int: ...

    @property
    def start_ticks(self) -> int: ...


class DeathWatch:
    """Calls `on_death` once, soon after the process `handle` names has exited (our
    child or not). `pidfd=False` is the fallback where the kernel has none."""

    def __init__(self, handle: Watched, on_death: Callable[[], object],
                 pidfd: bool = True) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_death = on_death
        self._fd: int | None = None
        self._poll: asyncio.Task[None] | None = None
        self.kind = "pidfd"
        try:
            if not pidfd:
                raise OSError("pidfds not wanted")
            self._fd = os.pidfd_open(handle.pid)
        except ProcessLookupError:
            self._loop.call_soon(self._fire)
            return
        except (AttributeError, OSError):  # no pidfd on this kernel or platform
            self.kind = "poll"
            self._poll = self._loop.create_task(self._poll_until_dead(handle))
            return
        # The pid may have been reused before the pidfd was opened: it must still be the
        # process the handle names, else that one is already gone.
        if not process.is_alive(handle.pid, handle.start_ticks):
            self._loop.call_soon(self._fire)
            return
        self._loop.add_reader(self._fd, self._fire)

    async def _poll_until_dead(self, handle: Watched) -> None:
        while process.is_alive(handle.pid, handle.start_ticks):
            await asyncio.sleep(POLL_S)
        self._fire()

    def _fire(self) -> None:
        on_death = self._on_death
        if self.cancel():
            on_death()

    def cancel(self) -> bool:
        """Stop watching; False if it already fired or was cancelled."""
        if self._on_death is _fired:
            return False
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        if self._poll is not None and self._poll is not asyncio.current_task():
            self._poll.cancel()
        self._on_death = _fired
        return True


def _fired() -> None:
    pass
