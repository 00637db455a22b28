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
