"""pacing.TurnGate: at most so many callers pass in one turn of the loop, the rest in
the turns after, in arrival order; under asyncio's loop and under uvloop, the control
plane's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from keelway.pacing import TurnGate

Run = Callable[[Coroutine[Any, Any, Any]], Any]
LOOPS: dict[str, Run] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


class Turns:
    """Counts the loop's turns: a callback that schedules itself again each turn."""

    def __init__(self) -> None:
        self.now = 0
        self._on = True
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.now += 1
        if self._on:
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._on = False


@pytest.mark.parametrize("loop", LOOPS)
def test_a_crowd_passes_a_few_a_turn_in_arrival_order(loop: str) -> None:
    async def scenario() -> list[tuple[int, int]]:
        turns, gate = Turns(), TurnGate(4)
        passed: list[tuple[int, int]] = []

        async def caller(n: int) -> None:
            await gate.turn()
            passed.append((n, turns.now))

        await asyncio.gather(*(caller(n) for n in range(30)))
        turns.stop()
        return passed

    passed = LOOPS[loop](scenario())
    assert [n for n, _ in passed] == list(range(30))  # first come, first through
    per_turn: dict[int, int] = {}
    for _, turn in passed:
        per_turn[turn] = per_turn.get(turn, 0) + 1
    assert max(per_turn.values()) == 4
    # Nobody waits longer than the crowd needs: 30 callers, 4 a turn, about 8 turns
    # (a turn in between for the gate's own bookkeeping at most).
    assert len(per_turn) == 8
    assert max(per_turn) - min(per_turn) <= 2 * len(per_turn)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_lone_caller_passes_without_yielding(loop: str) -> None:
    async def scenario() -> bool:
        gate, others_ran = TurnGate(1), False

        def other() -> None:
            nonlocal others_ran
            others_ran = True

        asyncio.get_running_loop().call_soon(other)
        await gate.turn()
        return others_ran

    assert LOOPS[loop](scenario()) is False


@pytest.mark.parametrize("loop", LOOPS)
def test_a_request_arriving_meanwhile_is_answered_between_two_turns(loop: str) -> None:
    """What the gate is for: work begun by the hundred does not hold back what else is
    ready (a `status` the control plane answers) until all of it has run."""
    async def scenario() -> tuple[int, int]:
        gate, begun = TurnGate(8), 0

        async def attempt() -> None:
            nonlocal begun
            await gate.turn()
            begun += 1

        crowd = [asyncio.ensure_future(attempt()) for _ in range(200)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # a request's turn, once the crowd has begun
        seen = begun
        await asyncio.gather(*crowd)
        return seen, begun

    seen, begun = LOOPS[loop](scenario())
    assert begun == 200 and 0 < seen <= 16


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cancelled_waiter_takes_nobodys_place(loop: str) -> None:
    async def scenario() -> list[int]:
        gate, passed = TurnGate(1), []

        async def caller(n: int) -> None:
            await gate.turn()
            passed.append(n)

        tasks = [asyncio.ensure_future(caller(n)) for n in range(4)]
        await asyncio.sleep(0)  # caller 0 passes; 1, 2 and 3 wait
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return passed

    assert LOOPS[loop](scenario()) == [0, 2, 3]


def test_a_gate_lets_someone_through() -> None:
    with pytest.raises(ValueError, match="at least one"):
        TurnGate(0)
