"""The wake gate (keelway/deploy/wake_gate.py): at most `slots` boots at once, the rest let
in round-robin across apps, a turn always given back."""

from __future__ import annotations

import asyncio

import pytest

from keelway.deploy.wake_gate import WakeGate


async def _storm(gate: WakeGate, wakes: list[tuple[str, str]]) -> tuple[list[str], int]:
    order: list[str] = []
    most = 0
    release = asyncio.Event()

    async def wake(app: str, host: str) -> None:
        nonlocal most
        async with gate.turn(app):
            order.append(host)
            most = max(most, gate.busy)
            await release.wait()
            await asyncio.sleep(0)

    tasks = [asyncio.ensure_future(wake(app, host)) for app, host in wakes]
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.gather(*tasks)
    return order, most


def test_no_more_than_its_slots_boot_at_once_and_apps_take_turns() -> None:
    gate = WakeGate(slots=2)
    wakes = [("big", f"b{i}") for i in range(6)] + [("small", "s0"), ("tiny", "t0")]
    order, most = asyncio.run(_storm(gate, wakes))
    assert most == 2 and gate.busy == 0 and gate.waiting == 0
    # The first two took the free slots; then big, small, tiny in turn, then big's rest.
    assert order[:2] == ["b0", "b1"]
    assert order[2:5] == ["b2", "s0", "t0"]
    assert order[5:] == ["b3", "b4", "b5"]


def test_a_cancelled_wake_gives_its_turn_back() -> None:
    async def scenario() -> None:
        gate = WakeGate(slots=1)
        held = asyncio.Event()
        done = asyncio.Event()

        async def first() -> None:
            async with gate.turn("a"):
                held.set()
                await done.wait()

        async def second() -> None:
            async with gate.turn("b"):
                pass

        one = asyncio.ensure_future(first())
        await held.wait()
        two = asyncio.ensure_future(second())
        await asyncio.sleep(0)
        two.cancel()
        with pytest.raises(asyncio.CancelledError):
            await two
        assert gate.waiting == 0
        done.set()
        await one
        assert gate.busy == 0
        async with gate.turn("c"):
            assert gate.busy == 1

    asyncio.run(scenario())
