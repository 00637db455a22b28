"""The journal's edges: an operation begins, runs its work, and its outcome is written
once, after its work.

An operation is live (`Locks.live_ops`: the reconciler leaves it alone) exactly while
this control plane runs it. An exception an operation raises is journaled as what it is
(a `fault` step with the error), and the operation is then converged at once as after a
crash: its effects are in an unknown state, and that path removes unpublished
candidates and keeps a hold release that executed down. Expected failures are values:
`work` returns a `Result`, or raises `OperationError` when it cannot go on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from keelway import failpoints
from keelway.deploy.errors import OperationError
from keelway.deploy.locks import Locks
from keelway.deploy.outcome import Outcome, Result
from keelway.journal import OpKind, StepKind
from keelway.reconcile.plan import Pass
from keelway.store import Store
from keelway.store.lifecycle import OpState, StepState
from keelway.store.records import Operation

log = logging.getLogger("keelway.deployer")

failpoints.declare("finish.before")

# What an operation does once journaled: its outcome as a value.
OpWork = Callable[[Operation], Awaitable[Result]]


class Converger(Protocol):
    """Reconcile one instance under the lock its caller holds (`Recovery.converge`)."""

    async def converge(self, host: str, mode: Pass) -> None: ...

    async def keep_replica(self, op: Operation, host: str) -> str | None:
        """Start or sync-and-stop `host`'s replicator as the instance now wants, as steps
        of `op`; what failed there (already a warning of `op`), if anything."""
        ...


class Journaled:
    def __init__(self, store: Store, locks: Locks, owner: str, converger: Converger) -> None:
        self.store = store
        self.locks = locks
        self.owner = owner
        # The one cycle of the parts: a fault converges, converging may restart what
        # ACTIVE names, and that restart is itself a journaled operation.
        self.converger = converger

    async def run(self, app: str, host: str, kind: OpKind, work: OpWork, *,
                  key: str | None = None, request_digest: str | None = None,
                  schedule_rev: int = 0, converge_after: bool = False) -> Result:
        """Run `work` as one journaled operation owned by this control plane. A crash
        inside `work` leaves it unfinished, for the reconciler to converge; an exception
        is journaled as a fault and converged at once. `converge_after` reconciles once
        more after an outcome that was written (a fault has converged already). Run
        under `host`'s lock."""
        op = self.store.ops.begin_operation(app, host, kind, self.owner, key=key,
                                            request_digest=request_digest,
                                            schedule_rev=schedule_rev)
        self.locks.live_ops.add(op.id)
        faulted = False
        try:
            result = await work(op)
            # The one hook of replication (keelway/data/replicas.py): after any operation,
            # the replicator follows what the instance now is (running: started once its
            # web is; parked or stopped: synced and stopped, proven gone), as steps of
            # this same operation, so every place that brings an instance up or down is
            # covered without a call of its own. It changes the outcome of a `replicate`
            # operation only (its whole work): what any other did to traffic is done,
            # and the reconciler keeps the replicator.
            failed = await self.converger.keep_replica(op, host)
            if failed is not None and kind is OpKind.REPLICATE and (
                    result.outcome is Outcome.DONE):
                result = Result(Outcome.FAILED, failed)
        except OperationError as exc:
            result = Result(Outcome.FAILED, exc.message)
        except Exception as exc:
            result, faulted = Result(Outcome.FAILED, self._record_fault(op, exc)), True
        finally:
            self.locks.live_ops.discard(op.id)
        if faulted:
            await self._converge_fault(host)
        else:
            self._finish(op, result)
            if converge_after:
                await self.converger.converge(host, Pass.MUTATION)
        return result

    def _finish(self, op: Operation, result: Result) -> None:
        failpoints.hit("finish.before")
        latest = self.store.ops.get_operation(op.id) or op
        if not latest.terminal:
            if result.outcome is Outcome.DONE:
                self.store.ops.finish_operation(latest, OpState.SUCCEEDED)
            else:
                self.store.ops.finish_operation(latest, OpState.FAILED, error=result.reason)
        message = f"{op.kind} {'succeeded' if result.outcome is Outcome.DONE else 'failed'}"
        if result.reason:
            message += f": {result.reason}"
        self.store.ops.add_event("op", message, app=op.app, instance=op.instance)

    def _record_fault(self, op: Operation, exc: Exception) -> str:
        """Journal an exception raised inside `op` as a failed `fault` step; returns the
        error as the operation's outcome will say it. Call from the `except` block.

        `except Exception` around an operation is the journal's edge, like the top of a
        loop: whatever went wrong, the journal must say it, never "a crash". The op stays
        unfinished, not live: the reconciler converges it (`_converge_fault`).
        """
        log.exception("op %d %s on %s raised", op.id, op.kind, op.instance)
        error = f"{type(exc).__name__}: {exc}"
        try:
            latest = self.store.ops.get_operation(op.id) or op
            pending = [s.name for s in latest.steps if s.state is StepState.PENDING]
            if pending:
                error = f"{pending[-1]}: {error}"  # where it happened, then what
            seq = self.store.ops.begin_step(op.id, StepKind.FAULT)
            self.store.ops.finish_step(op.id, seq, StepState.FAILED, error=error)
        except Exception:
            # The store itself fails (a full disk, say): the op converges as interrupted,
            # and the caller still hears the real error.
            log.exception("op %d: could not journal its fault", op.id)
        return error

    async def _converge_fault(self, host: str) -> None:
        """Converge a faulted operation now, under the lock the caller holds, so it is
        terminal when the caller answers; a failure here is left to the next pass (the
        op stays unfinished and not live), and the caller still answers the fault."""
        try:
            await self.converger.converge(host, Pass.MUTATION)
        except OperationError as exc:
            log.warning("after a fault on %s: %s", host, exc.message)
        except Exception:
            # Whatever raised inside the operation may well raise here too (a full disk).
            log.exception("after a fault on %s: could not converge it yet", host)
