"""Leases: the main process's book of each instance's concurrency bound, lent to workers.

A worker takes a request upstream only within what it holds of that instance's bound
(keelway/router/concurrency.py says how it spends, asks and gives back); this book is
what each worker holds, so the slots lent for an instance never pass its bound, however
many workers the requests land in. The instance is the one a route names (`instance`,
whichever of its hosts the requests used), as for hold slots.

An ask the free slots cannot fill is not refused at once: other workers may hold slots
they do not use. It waits (`Reclaim`) while each of them is asked for its spare, and is
answered (`Grant`) once all of them have said what they give back (`spare`) or are
gone; so an ask falls short only when the bound is in use, not merely lent.

Invariants: what a holder has of an instance grows only by a grant and shrinks only by
`give_back`, `spare` or `forget`; no grant takes the sum over holders past the bound
its ask names (a bound lowered meanwhile is reached again as holders give back: nothing
is taken from a holder, whose slots may be carrying requests); every ask gets exactly
one `Grant`, unless its holder is forgotten first; a holder that is gone (its channel
closed: the worker died or is being replaced) is forgotten whole, so a dead worker's
slots never stay lent and no ask waits on it. No I/O here: the caller sends what the
values say.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Grant:
    """The answer due to `holder`'s ask: `granted` more slots of `instance` (0 or more,
    never more than it asked)."""

    holder: int
    instance: str
    granted: int


@dataclass(frozen=True)
class Reclaim:
    """The ask waits: each of `holders` is to be asked for its spare of `instance`."""

    instance: str
    holders: tuple[int, ...]


@dataclass
class _Waiting:
    """An ask that waits on the spare of `awaiting`."""

    holder: int
    want: int
    bound: int
    granted: int
    awaiting: set[int] = field(default_factory=set)


class Leases:
    """Slots lent per holder (a worker's channel) and per instance, and the asks that
    wait on other holders' spare."""

    def __init__(self) -> None:
        self._by_holder: dict[int, dict[str, int]] = {}
        self._lent: dict[str, int] = {}
        self._waiting: dict[str, list[_Waiting]] = {}

    def ask(self, holder: int, instance: str, want: int, bound: int) -> Grant | Reclaim:
        """`holder` asks for `want` more slots of `instance`, whose bound is `bound`.
        A `Grant` answers it now; a `Reclaim` names whom to ask for their spare first
        (the `Grant` then comes from `spare` or `forget`)."""
        granted = self._lend(holder, instance, want, bound)
        others = tuple(other for other, mine in self._by_holder.items()
                       if other != holder and mine.get(instance, 0) > 0)
        if granted == want or not others:
            return Grant(holder, instance, granted)
        self._waiting.setdefault(instance, []).append(
            _Waiting(holder, want, bound, granted, set(others)))
        return Reclaim(instance, others)

    def spare(self, holder: int, instance: str, n: int) -> list[Grant]:
        """`holder`'s answer to a reclaim: it gives back `n` unused slots of `instance`.
        Returns the answers now due to the asks that waited on it."""
        self.give_back(holder, instance, n)
        return self._settle(instance, holder)

    def give_back(self, holder: int, instance: str, n: int) -> None:
        """`holder` returns `n` slots of `instance` unasked (never more than it has: a
        return after `forget` is a no-op)."""
        mine = self._by_holder.get(holder)
        if mine is None:
            return
        n = min(n, mine.get(instance, 0))
        if n > 0:
            self._drop(mine, instance, n)

    def forget(self, holder: int) -> list[Grant]:
        """`holder` is gone: every slot it had is free to lend again, its own asks are
        dropped, and the asks that waited on it are answered (returned, to send)."""
        mine = self._by_holder.pop(holder, None)
        if mine is not None:
            for instance, n in list(mine.items()):
                self._drop(mine, instance, n)
        due: list[Grant] = []
        for instance in list(self._waiting):
            asks = [w for w in self._waiting[instance] if w.holder != holder]
            self._waiting[instance] = asks
            due += self._settle(instance, holder)
        return due

    def lent(self) -> dict[str, int]:
        """Slots lent per instance (tests, logs)."""
        return dict(self._lent)

    def _settle(self, instance: str, replied: int) -> list[Grant]:
        """`replied` has said its spare of `instance` (or is gone): every ask that waited
        only on it now takes what is free, in the order asked, and is answered."""
        asks = self._waiting.get(instance)
        if not asks:
            self._waiting.pop(instance, None)
            return []
        due: list[Grant] = []
        for waiting in list(asks):
            waiting.awaiting.discard(replied)
            if not waiting.awaiting:
                asks.remove(waiting)
                waiting.granted += self._lend(waiting.holder, instance,
                                              waiting.want - waiting.granted, waiting.bound)
                due.append(Grant(waiting.holder, instance, waiting.granted))
        if not asks:
            del self._waiting[instance]
        return due

    def _lend(self, holder: int, instance: str, want: int, bound: int) -> int:
        lent = self._lent.get(instance, 0)
        granted = max(0, min(want, bound - lent))
        if granted:
            self._lent[instance] = lent + granted
            mine = self._by_holder.setdefault(holder, {})
            mine[instance] = mine.get(instance, 0) + granted
        return granted

    def _drop(self, mine: dict[str, int], instance: str, n: int) -> None:
        left = mine[instance] - n
        if left > 0:
            mine[instance] = left
        else:
            del mine[instance]
        total_left = self._lent[instance] - n
        if total_left > 0:
            self._lent[instance] = total_left
        else:
            del self._lent[instance]
