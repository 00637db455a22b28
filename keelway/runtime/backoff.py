"""Restart backoff for crashed published generations (pure, clock passed in).

Three quick tries, then 1, 2, 4, 8 and at most 15 minutes between tries; a generation
that stayed up for 5 minutes resets the count, so a rare crash is retried at once.
Times are wall-clock seconds: the count and the retry time are persisted (store table
`backoff`) and must mean the same thing to the next control plane.
"""

from __future__ import annotations

from dataclasses import dataclass, field

QUICK_DELAYS_S = (0.5, 1.0, 2.0)
SLOW_DELAYS_S = (60.0, 120.0, 240.0, 480.0, 900.0)
STABLE_RESET_S = 300.0


@dataclass
class Backoff:
    failures: int = 0
    last_start: float | None = field(default=None)

    def started(self, now: float) -> None:
        self.last_start = now

    def delay_after_crash(self, now: float) -> float:
        """Seconds to wait before the next restart, given a crash at `now`."""
        if self.last_start is not None and now - self.last_start >= STABLE_RESET_S:
            self.failures = 0
        schedule = QUICK_DELAYS_S + SLOW_DELAYS_S
        delay = schedule[min(self.failures, len(schedule) - 1)]
        self.failures += 1
        return delay


def next_retry(failures_before: int, *, started_at: float, now: float,
               same_generation: bool) -> tuple[int, float]:
    """The crash count and the delay after a generation that started at `started_at`
    crashed at `now`, given the persisted count of the crashes before it.

    `same_generation`: the crash counted last was this very generation's, i.e. the
    restart that should have replaced it failed; that never resets the count, however
    long ago the generation first started.
    """
    backoff = Backoff(failures_before, None if same_generation else started_at)
    delay = backoff.delay_after_crash(now)
    return backoff.failures, delay
