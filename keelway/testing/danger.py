"""A fake of danger: generations that refuse to die, for the fail-closed tests.

`unkillable({3, 7})` is a `refuses_to_die` for the supervisor
(keelway/runtime/supervisor.py): it reports generations 3 and 7 as not removable for as
long as their process is alive, as a process stuck in the kernel would be. A daemon
gets it only through keelway/testing/daemon.py, which the test harness starts; the
daemon keelway ships never reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def unkillable(generation_ids: Iterable[int]) -> Callable[[int], bool]:
    stuck = frozenset(generation_ids)

    def refuses_to_die(generation_id: int) -> bool:
        return generation_id in stuck

    return refuses_to_die
