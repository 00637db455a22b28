"""Pacing work that holds the event loop: at most so many callers begin in one turn.

The control plane is one event loop. Work that runs for milliseconds without awaiting
(an attempt's journal commits, plan and lay-down before its spawn) is harmless one at a
time and harmful by the hundred: 200 attempts begun by one `gather` all run their
synchronous start in the same turn, and every request that arrives meanwhile (a
`status`, a wake, a ping) waits behind all of them. A TurnGate lets `per_turn` callers
through in a turn and the rest in the turns after, in arrival order, so what else is
ready runs between. Uncontended it never yields: a lone caller passes at once.

Work is paced by the scope it runs in (`paced`): a rollout's attempts begin, and each
of their journaled steps begins (keelway/deploy/steps.py), through the rollouts' gate;
what runs outside such a scope (a wake, a `status`) is never held by it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterator
from contextvars import ContextVar

# The gate the current task's work is paced by (None: not paced); a task begun inside a
# scope inherits it.
_gate: ContextVar[TurnGate | None] = ContextVar("keelway_turn_gate", default=None)


@contextlib.contextmanager
def paced(gate: TurnGate) -> Iterator[None]:
    """Within: `take_turn` waits for `gate`."""
    token = _gate.set(gate)
    try:
        yield
    finally:
        _gate.reset(token)


async def take_turn() -> None:
    """Wait for a turn of the current scope's gate (`paced`); at once outside any."""
    gate = _gate.get()
    if gate is not None:
        await gate.turn()


class TurnGate:
    def __init__(self, per_turn: int) -> None:
        if per_turn < 1:
            raise ValueError("a turn gate lets at least one caller through a turn")
        self.per_turn = per_turn
        self._passed = 0  # callers let through in the current turn
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._turning = False  # a call_soon of _next_turn is pending

    async def turn(self) -> None:
        """Return in a turn of the loop in which fewer than `per_turn` callers have
        passed; the first `per_turn` callers of a turn return without yielding."""
        if not self._waiting and self._passed < self.per_turn:
            self._passed += 1
            self._start_turning()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._start_turning()
        # A cancelled waiter is skipped when its turn comes (done() is true), so it
        # takes no caller's place.
        await waiter

    def _start_turning(self) -> None:
        if not self._turning:
            self._turning = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        # Runs once a turn while anyone passed or waits: the woken callers resume in
        # the turn after this one, `per_turn` of them, then this runs again.
        self._turning = False
        self._passed = 0
        while self._waiting and self._passed < self.per_turn:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._passed += 1
        if self._waiting or self._passed:
            self._start_turning()
