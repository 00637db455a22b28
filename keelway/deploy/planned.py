"""The runner (keelway/deploy/operation.py) with the two hooks the data and membership
operations need and its seam does not have yet (/work/briefs/dataops-needs.md 2-4), so
their lock, convergence and fence check are written here once, not in each part:

- `prelude`: work under the lock, after convergence and the fence check, before the
  plan is read and the operation begins: an intent the next boot carries on from
  (`instances remove` marks the instance `removing`), or a verified copy staged (a
  restore refuses a bad copy with nothing journaled).
- `after`: async work under the same lock once the operation ended, seeing how (a
  failed seed import rolled back at once, the instance started again on its data).
- an operation of no instance (`host == ""`: the app's own operation of `apps
  destroy`) takes the lock of that empty name and converges nothing.

Sequence: the name check → the lock (`spec.locks`) → converge (Pass.MUTATION) → the
fence (`spec.fence_verb`) → `prelude` → `Runner.run_held` (plan, journal, steps, finish,
`converge_after`, `epilogue`) → `after`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from keelway import names
from keelway.deploy import fences, targets
from keelway.deploy.errors import checked
from keelway.deploy.operation import Locking, Ran, Request, Runner, Spec
from keelway.reconcile.plan import Pass

Req = TypeVar("Req", bound=Request)
Parts = TypeVar("Parts")


async def run(runner: Runner, spec: Spec[Req, Parts], parts: Parts, request: Req, *,
              prelude: Callable[[], Awaitable[None]] | None = None,
              after: Callable[[Ran], Awaitable[None]] | None = None,
              converge: bool = True) -> Ran:
    """`Runner.run` with `prelude` and `after` (module header). After return the
    operation, if any, is terminal and the lock released; a refusal raises with nothing
    journaled (what `prelude` wrote stays: it is an intent). `converge` False: an
    operation that must not converge first (the lay-down of instances just recorded,
    under the app lock its caller holds)."""
    host = request.host
    async with contextlib.AsyncExitStack() as held:
        if host:
            # An instance's operation; the instance itself may be gone (a seed import's
            # journal outlives it), unless its app's lock is taken.
            checked(names.HOST, host)
            if spec.locks is Locking.APP:
                inst = targets.instance_named(runner.store, host)
                await held.enter_async_context(runner.locks.app(inst.app))
            await held.enter_async_context(runner.locks.instance(host))
            if converge:
                await runner.converger.converge(host, Pass.MUTATION)
            if spec.fence_verb is not None:
                fences.refuse_if_fenced(runner.store, host, spec.fence_verb)
        else:
            await held.enter_async_context(runner.locks.instance(host))
        if prelude is not None:
            await prelude()
        ran = await runner.run_held(spec, parts, request)
        if after is not None:
            await after(ran)
    return ran

