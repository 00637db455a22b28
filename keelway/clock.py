"""Time, injectable: wall time for records, monotonic time for deadlines.

Tests replace the clock with keelway.testing.FakeClock so that a 15-minute backoff
runs instantly.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch, for records a person reads."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, for deadlines and intervals."""

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class ShiftedClock:
    """`base` with its wall time `shift_s` ahead (monotonic time untouched): the one
    seam of the scheduled-jobs tests (`KEELWAY_JOBS_CLOCK_SHIFT_S`, read by the daemon
    for its job scheduler only), so a schedule's minute turns when a test needs it
    rather than up to a minute later. Never set in production."""

    def __init__(self, base: Clock, shift_s: float) -> None:
        self.base = base
        self.shift_s = shift_s

    def now(self) -> float:
        return self.base.now() + self.shift_s

    def monotonic(self) -> float:
        return self.base.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self.base.sleep(seconds)


def jobs_clock(base: Clock, environ: dict[str, str]) -> Clock:
    """The job scheduler's clock: `base`, shifted where a test asks (see ShiftedClock)."""
    shift = environ.get("KEELWAY_JOBS_CLOCK_SHIFT_S")
    return ShiftedClock(base, float(shift)) if shift else base
