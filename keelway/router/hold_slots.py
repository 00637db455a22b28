"""Hold slots: the router's bound on held requests, one count for all its workers.

A worker holds a request only with a slot its main process granted (keelway/router/
workers.py carries the asks), so the bound is per instance (the "host" here is the
instance's own name, whichever of its hosts the requests used) and per router, however
many workers the requests land in: at most `max_held_per_host` for one instance and
`max_held` in all. The main process serves no client when it has workers (server.py), so these
counts are every held request of the router.

Invariants: a holder's count of a host only grows by `take` and shrinks by `give_back`
or `forget`; a holder that is gone (its channel closed: the worker died or is being
replaced) is forgotten whole, so a dead worker's slots never stay taken. No I/O here.
"""

from __future__ import annotations

from typing import Final


class HoldSlots:
    """Held requests per holder (a worker's channel) and per host, with the bounds."""

    def __init__(self, max_held: int, max_held_per_host: int) -> None:
        self.max_held: Final = max_held
        self.max_held_per_host: Final = max_held_per_host
        self._by_holder: dict[int, dict[str, int]] = {}
        self._per_host: dict[str, int] = {}
        self._total = 0

    def take(self, holder: int, host: str) -> bool:
        """A slot for one more held request of `host`; False when a bound is reached."""
        count = self._per_host.get(host, 0)
        if count >= self.max_held_per_host or self._total >= self.max_held:
            return False
        self._per_host[host] = count + 1
        self._total += 1
        mine = self._by_holder.setdefault(holder, {})
        mine[host] = mine.get(host, 0) + 1
        return True

    def give_back(self, holder: int, host: str) -> None:
        """A held request of `host` ended (released, answered, or its client left)."""
        mine = self._by_holder.get(holder)
        if mine is None or host not in mine:
            return  # forgotten already, or never granted: nothing to give back
        self._drop(mine, host, 1)

    def forget(self, holder: int) -> None:
        """`holder` is gone: every slot it had is free again."""
        mine = self._by_holder.pop(holder, None)
        if mine is not None:
            for host, n in list(mine.items()):
                self._drop(mine, host, n)

    def held(self) -> dict[str, int]:
        """Slots taken per host (tests, logs)."""
        return dict(self._per_host)

    def _drop(self, mine: dict[str, int], host: str, n: int) -> None:
        left = mine.get(host, 0) - n
        if left > 0:
            mine[host] = left
        else:
            mine.pop(host, None)
        total_left = self._per_host.get(host, 0) - n
        if total_left > 0:
            self._per_host[host] = total_left
        else:
            self._per_host.pop(host, None)
        self._total -= n
