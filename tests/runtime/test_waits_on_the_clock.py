"""Settle windows and drain bounds are measured on the injected clock: with a FakeClock a
test's hour-long window passes at once (keelway/clock.py), with real processes and a
real store."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from keelway.clock import SystemClock
from keelway.deploy.publisher import Publisher
from keelway.home import Home
from keelway.runtime import process
from keelway.runtime.supervisor import SettleOutcome, Supervisor
from keelway.store import Store
from keelway.store.records import Generation
from keelway.testing.clock import FakeClock

HOUR_S = 3600.0


async def _no_restart(_gen: Generation, _code: int | None) -> None:
    return None


def test_a_settle_window_passes_on_the_injected_clock_not_in_real_time(
    store: Store, home: Home, clock: FakeClock, tmp_path: Path
) -> None:
    async def settle_an_hour() -> tuple[SettleOutcome, float]:
        supervisor = Supervisor(store, home, clock, _no_restart)
        gen = store.plan_generation(app="hello", instance="one.test", service="worker",
                                                release=1, build_digest="d" * 64, op_id=None,
                                                port=None)
        gen = await supervisor.spawn(gen, "sleep 60", tmp_path,
                                     {"PATH": os.environ["PATH"]})
        leader = store.local.presence(gen.id).leader
        assert leader is not None
        start = time.monotonic()
        try:
            outcome = await asyncio.wait_for(supervisor.settle(gen, HOUR_S), timeout=10)
        finally:
            await process.stop(*leader, grace_s=0.0, clock=SystemClock())
            for _ in range(500):  # its watcher reaps and buries it, on the loop
                if not supervisor.is_watched(gen.id):
                    break
                await asyncio.sleep(0.01)
            await supervisor.shutdown()
        return outcome, time.monotonic() - start

    outcome, took_s = asyncio.run(settle_an_hour())
    assert outcome is SettleOutcome.GOOD
    assert clock.monotonic() >= HOUR_S
    assert took_s < 5


def test_a_drain_bound_passes_on_the_injected_clock_when_no_router_answers(
    store: Store, clock: FakeClock, tmp_path: Path
) -> None:
    publisher = Publisher(store, tmp_path / "no-router.sock")
    start = time.monotonic()
    # A minute, polled every 20 ms: 3,000 polls, each a refused connect.
    drained = asyncio.run(asyncio.wait_for(publisher.drained(8080, 60.0), timeout=10))
    assert drained is False  # no router to ask: the bound is waited out, conservatively
    assert clock.monotonic() >= 60.0
    assert time.monotonic() - start < 5
