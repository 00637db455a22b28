"""The one way a step of an operation is carried out: its journal write first, then its
failpoints around its effect, then its outcome written.

A crash or an exception anywhere between the first write and the last leaves the step
PENDING, which is what convergence reads as "interrupted" (keelway/reconcile/plan.py);
an effect that did not do its part says so as a value (`Failed`), and its step is
written failed with that reason. The failpoints named `before` are hit after the step is
journaled and before its effect, those named `after` once the effect is done and before
its outcome is written, so the crash matrix crashes each window a step has.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import assert_never

from keelway import failpoints
from keelway.durable import sync_deferred, sync_is_deferred
from keelway.journal import StepKind
from keelway.pacing import take_turn
from keelway.store import Store
from keelway.store.lifecycle import StepState


@dataclass(frozen=True)
class Done:
    detail: str | None = None


@dataclass(frozen=True)
class Failed:
    """A step did not do its part (a start, a publish, the settle); its step is
    journaled failed, and the attempt falls back."""

    reason: str


Effect = Callable[[], Awaitable[Done | Failed]]


async def nothing() -> Done:
    """The effect of a step that is its own record (the execution evidence)."""
    return Done()


@dataclass(frozen=True)
class Steps:
    """The steps of one operation."""

    store: Store
    op_id: int

    async def run(self, kind: StepKind, effect: Effect, *, before: tuple[str, ...] = (),
                  after: tuple[str, ...] = (), service: str | None = None,
                  before_gen: int | None = None, after_gen: int | None = None,
                  detail: str | None = None) -> Failed | None:
        """Journal the step, run `effect` between the failpoints, write its outcome.

        `after_gen` names the candidate the step starts: convergence keeps it if ACTIVE
        names it and removes it otherwise, so it is written before the effect."""
        await take_turn()  # a rollout's hundreds of steps begin a few a loop turn
        with sync_deferred(sync_is_deferred() and kind.ends_with_the_box):
            seq = self.store.ops.begin_step(self.op_id, kind, service=service,
                                            before_gen=before_gen, after_gen=after_gen,
                                            detail=detail)
        for point in before:
            failpoints.hit(point)
        end = await effect()
        for point in after:
            failpoints.hit(point)
        match end:
            case Done(detail=said):
                self.store.ops.finish_step(self.op_id, seq, StepState.SUCCEEDED, detail=said)
                return None
            case Failed(reason=reason):
                self.store.ops.finish_step(self.op_id, seq, StepState.FAILED, error=reason)
                return end
            case _:
                assert_never(end)
