"""Who may touch an instance now: the per-instance and per-app locks, and the operations
this control plane runs (live), which the reconciler leaves alone.

Every mutation of an instance holds its lock; a rollout holds its app's lock, so two
rollouts of one app never interleave their release numbers. An operation is live exactly
while this process runs it: `Journaled` adds it at its begin and drops it before its
outcome is written, and nothing else writes this set.
"""

from __future__ import annotations

import asyncio


class Locks:
    def __init__(self) -> None:
        self.live_ops: set[int] = set()
        self._instances: dict[str, asyncio.Lock] = {}
        self._apps: dict[str, asyncio.Lock] = {}

    def instance(self, host: str) -> asyncio.Lock:
        return self._instances.setdefault(host, asyncio.Lock())

    def app(self, app: str) -> asyncio.Lock:
        return self._apps.setdefault(app, asyncio.Lock())
