"""A clock that tests move by hand; `sleep` returns at once after advancing time."""

from __future__ import annotations

import asyncio


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._mono = 0.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(seconds)
        await asyncio.sleep(0)
