"""Fences (SPEC §1, §5.6): a held generation that keeps an instance down.

`fence` writes a new, held generation, one more than any before; `unfence` lifts only
the generation it names, so a stale holder never lifts a newer fence. While fenced,
wake, start and restart are refused (`Fenced`, each kind's `Spec.fence_verb`) and crash
restarts do not run; parking and stopping still may. A fence is written without the
instance lock: it must take effect while an operation runs; an operation already past
its fence check finishes (its own steps are journaled), and nothing new starts after
the fence is written.
"""

from __future__ import annotations

from keelway import names
from keelway.deploy import targets
from keelway.deploy.errors import Fenced, UserError, checked
from keelway.store import Store
from keelway.store.records import Fence


def refuse_if_fenced(store: Store, host: str, verb: str) -> None:
    """Raise `Fenced` if a fence is held on `host`: nothing wakes, starts or restarts it."""
    fence = store.instances.get_fence(host)
    if fence is not None and fence.held:
        why = f" ({fence.reason})" if fence.reason else ""
        raise Fenced(f"{host} is fenced at generation {fence.generation}{why}: "
                     f"it cannot {verb}",
                     hint=f"the fence's holder lifts it; by hand: `keelway unfence {host}`")


def fence(store: Store, host: str, reason: str | None) -> Fence:
    """Hold a new fence generation on `host` (one more than any before)."""
    inst = targets.instance_named(store, host)
    if reason is not None:
        checked(names.FENCE_REASON, reason)
    held = store.instances.fence(host, reason)
    store.ops.add_event("fence", f"fenced at generation {held.generation}"
                        + (f" ({reason})" if reason else ""), app=inst.app, instance=host)
    return held


def unfence(store: Store, host: str, generation: int) -> tuple[Fence | None, bool]:
    """Lift fence `generation` of `host` if it is the one held; (the fence now, whether
    this lifted it). A stale generation changes nothing."""
    inst = targets.instance_named(store, host)
    if generation < 1:
        raise UserError("a fence generation is a whole number from 1")
    now, lifted = store.instances.unfence(host, generation)
    if lifted:
        store.ops.add_event("fence", f"fence generation {generation} lifted",
                            app=inst.app, instance=host)
    return now, lifted
