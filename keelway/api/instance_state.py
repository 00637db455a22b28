"""What state an instance is in, as `status` and `instances list` say it: the one rule,
decided from the records alone (no I/O), so that every view says the same thing.

The instance record's own state is what its user asked for (running, stopped, parked)
or what a hold-mode failure left (down); what `status` shows is what is true:

    running     it should run, and what ACTIVE names is alive
    parked      scaled to zero; its next request wakes it
    stopped     stopped by its user
    crashed     a process ACTIVE names died; the backoff says when it is restarted
    failed      its last release (deploy, rollback, config) failed: it serves the
                release it fell back to, or nothing
    no release  nothing to run yet: never released, nothing pending

A failed release stays the instance's state until a release succeeds or its user
stops, starts, parks or wakes it (each a newer operation than the failure).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import assert_never

from keelway.journal import OpKind
from keelway.store.lifecycle import GenState, InstanceState, OpState
from keelway.store.records import CrashRetry, Generation, Instance, Operation

# The operations that run a new release: their failure is the instance's.
RELEASING = (OpKind.DEPLOY, OpKind.ROLLBACK, OpKind.CONFIG)
# Its user's say on whether it runs: newer than a failure, it is what holds.
SERVICE = (OpKind.STOP, OpKind.START, OpKind.PARK, OpKind.WAKE)


class Shown(enum.StrEnum):
    RUNNING = "running"
    # Running, its processes stopped in place by the frozen tier (its route `frozen`):
    # awake as far as memory goes, thawed by its next request.
    FROZEN = "frozen"
    PARKED = "parked"
    STOPPED = "stopped"
    CRASHED = "crashed"
    FAILED = "failed"
    NO_RELEASE = "no release"


@dataclass(frozen=True)
class InstanceStatus:
    state: Shown
    # The release ACTIVE names, alive or not (what a parked, crashed or stopped
    # instance runs again); None when ACTIVE names nothing.
    release: int | None
    # The release its alive web serves (an alive process, for an app with no web);
    # None when nothing is.
    serving: int | None
    # CRASHED: when the earliest restart is due (None: no restart is scheduled), and
    # the retries that make it crashed.
    next_retry_at: float | None = None
    crashed: tuple[CrashRetry, ...] = ()
    # FAILED: the kind of the operation that failed.
    failed: OpKind | None = None


def decide(inst: Instance, active: Mapping[str, Generation], retries: Sequence[CrashRetry],
           last_release: Operation | None, last_service: Operation | None,
           now: float, frozen: bool = False) -> InstanceStatus:
    """The instance's state from its record, the generations ACTIVE names, its pending
    crash retries (`Store.pending_retries`), its newest releasing operation and its
    newest stop/start/park/wake."""
    ordered = sorted(active.values(), key=lambda g: g.service != "web")
    alive = [g for g in ordered if g.state is not GenState.GONE]
    release = ordered[0].release if ordered else None
    # What answers requests: the web when there is one (a worker alive serves nobody).
    serving = (alive[0].release if alive and ("web" not in active or alive[0].service == "web")
               else None)
    failed = (last_release.kind
              if last_release is not None and last_release.state is OpState.FAILED
              and (last_service is None or last_service.id < last_release.id) else None)
    # A parked instance's retry that is due is no crash any more: its next request
    # wakes it (keelway/deploy/parking.py refuses a wake only inside the backoff).
    waiting = tuple(r for r in retries if inst.state is InstanceState.RUNNING
                    or (inst.state is InstanceState.PARKED and r.retry_at > now))
    due = min((r.retry_at for r in waiting), default=None)

    shown = InstanceStatus(Shown.RUNNING, release, serving)

    def show(state: Shown, *, next_retry_at: float | None = None,
             crashed: tuple[CrashRetry, ...] = (), failed: OpKind | None = None,
             ) -> InstanceStatus:
        return replace(shown, state=state, next_retry_at=next_retry_at, crashed=crashed,
                       failed=failed)

    never_released = not ordered and inst.pending_release is None and failed is None
    if never_released and inst.state is not InstanceState.STOPPED:
        return show(Shown.NO_RELEASE)
    match inst.state:
        case InstanceState.DOWN:
            # A hold-mode release failed after it executed: nothing runs on purpose.
            return show(Shown.FAILED, failed=failed or (
                last_release.kind if last_release is not None else OpKind.DEPLOY))
        case InstanceState.STOPPED:
            # A failed release with nothing to fall back to stops its instance.
            return show(Shown.FAILED, failed=failed) if failed else show(Shown.STOPPED)
        case InstanceState.PARKED:
            # A wake that failed leaves it parked with a retry: a request wakes it only
            # once the retry is due, so until then it is crashed, not merely parked.
            if waiting:
                return show(Shown.CRASHED, next_retry_at=due, crashed=waiting)
            return show(Shown.PARKED)
        case InstanceState.RUNNING:
            if waiting:
                return show(Shown.CRASHED, next_retry_at=due, crashed=waiting)
            if failed is not None:
                return show(Shown.FAILED, failed=failed)
            # Died, and no restart is scheduled (a worker that exited 0 has completed).
            if any(g.state is GenState.GONE and (g.service == "web" or g.exit_code != 0)
                   for g in ordered):
                return show(Shown.CRASHED)
            return show(Shown.FROZEN if frozen else Shown.RUNNING)
        case _:
            assert_never(inst.state)


def label(status: InstanceStatus) -> str:
    """The state as one phrase: `failed (last deploy failed; serving v3)`,
    `crashed (next retry at 22:41:07)` (this box's local time, as `date` says it)."""
    match status.state:
        case Shown.CRASHED:
            if status.next_retry_at is None:
                return "crashed (no restart scheduled)"
            at = time.strftime("%H:%M:%S", time.localtime(status.next_retry_at))
            return f"crashed (next retry at {at})"
        case Shown.FAILED:
            serving = f"serving v{status.serving}" if status.serving else "serving nothing"
            kind = (status.failed or OpKind.DEPLOY).value
            return f"failed (last {kind} failed; {serving})"
        case Shown.RUNNING | Shown.FROZEN | Shown.PARKED | Shown.STOPPED | Shown.NO_RELEASE:
            return status.state.value
        case _:
            assert_never(status.state)
