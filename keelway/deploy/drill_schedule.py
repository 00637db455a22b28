"""Restore drills without anyone asking (issue #22, drills at density): every instance's
newest snapshot and replica restored to a temp file and verified on a schedule, by the
drill of keelway/deploy/replication.py (its results are events; a failure shows in
`status`, `doctor` and the metrics).

Rules it keeps:
- Each instance is drilled once per its app's `[data] drill_every` (default daily;
  `KEELWAY_DRILL_EVERY` seconds overrides it for every app, for tests and benches),
  counted from its last drill (the newest drill event, read once at start).
- Spread over the period: an instance never drilled starts at an offset of the period
  fixed by its name (a hash), so 10,000 instances are not all drilled at once after a
  boot, and a restart does not move them.
- Bounded: one drill at a time, at most DRILLS_PER_TICK a tick, each restore and check
  in a thread (the drill's own), the loop itself doing only arithmetic.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import Final

from keelway.clock import Clock
from keelway.deploy.errors import OperationError
from keelway.deploy.replication import Replication
from keelway.deploy.snapshots import Snapshots
from keelway.store import Store

log: Final = logging.getLogger("keelway.drills")

TICK_S: Final = 5.0
DRILLS_PER_TICK: Final = 4
DRILL_EVENTS: Final = ("drill", "drill-failed")


def every_override() -> float | None:
    """`KEELWAY_DRILL_EVERY` (seconds), if set: every app's period."""
    raw = os.environ.get("KEELWAY_DRILL_EVERY")
    return float(raw) if raw else None


def offset_s(host: str, every_s: float) -> float:
    """Where in the period an instance never drilled is first due: fixed by its name."""
    digest = hashlib.sha256(host.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * every_s


def due_at(host: str, every_s: float, last: float | None, started: float) -> float:
    """When `host` is next drilled: a period after its last drill, or its place in the
    first period after the schedule started."""
    if last is not None:
        return last + every_s
    return started + offset_s(host, every_s)


@dataclass(eq=False)
class DrillSchedule:
    store: Store
    replication: Replication
    snapshots: Snapshots
    clock: Clock
    _last: dict[str, float] = field(default_factory=dict)
    _started: float | None = None

    def _read_last(self) -> None:
        """Each instance's newest drill, from the events (once, at start)."""
        for event in self.store.ops.list_events(limit=100_000):
            if event.kind in DRILL_EVENTS and event.instance is not None:
                self._last.setdefault(event.instance, event.at)

    def due(self, now: float) -> list[str]:
        """The instances whose drill is due at `now`, the most overdue first."""
        if self._started is None:
            self._started = now
            self._read_last()
        override = every_override()
        specs = self.snapshots.specs_by_host()
        due: list[tuple[float, str]] = []
        for inst in self.store.instances.list_instances():
            spec = specs.get(inst.host)
            if spec is None:
                continue  # nothing ever ran there: no data to drill
            every = override if override is not None else spec.drill_every_s
            at = due_at(inst.host, every, self._last.get(inst.host), self._started)
            if at <= now:
                due.append((at, inst.host))
        return [host for _, host in sorted(due)]

    async def once(self) -> list[str]:
        """One tick: the most overdue drilled (at most DRILLS_PER_TICK); the hosts."""
        now = self.clock.now()
        drilled = []
        for host in self.due(now)[:DRILLS_PER_TICK]:
            try:
                await self.replication.drill(host)
            except OperationError as exc:
                log.warning("scheduled drill of %s: %s", host, exc.message)
            # Tried, whatever came of it (skipped: nothing to drill yet): next period.
            self._last[host] = self.clock.now()
            drilled.append(host)
        return drilled

    async def run(self) -> None:
        while True:
            await self.clock.sleep(TICK_S)
            try:
                await self.once()
            except Exception:
                # The loop outlives a bad pass (a store or disk error): the next tries again.
                log.exception("drill schedule pass failed")
