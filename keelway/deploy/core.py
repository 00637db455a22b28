"""The ground every instance operation stands on: locks, journaling, reconciliation,
and bringing ACTIVE generations back.

Owns the per-instance locks (every mutation of an instance holds its lock) and the
journal's edges: an operation is live, so the reconciler leaves it alone, exactly while
this control plane runs it, and its outcome is written once, after its work. An
exception an operation raises is journaled as what it is (a `fault` step with the
error), and the operation is then converged by the reconciler as after a crash: its
effects are in an unknown state, and that path removes unpublished candidates and keeps
a hold release that executed down. Layers:
`DeployerCore` here, `Recovery` (crashes, boot, periodic passes) on it, and `Deployer`
(the operations users ask for) on that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from keelway import failpoints
from keelway.clock import Clock
from keelway.deploy import targets
from keelway.deploy.attempt import Outcome, Result
from keelway.deploy.errors import OperationError
from keelway.deploy.instances import StartFailed, start_generation
from keelway.deploy.publisher import Publisher
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.reconcile.apply import FailedClosed, Reconciler
from keelway.reconcile.plan import Pass
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import GenState, InstanceState, OpState, StepState
from keelway.store.records import Generation, Instance, Operation

log = logging.getLogger("keelway.deployer")

failpoints.declare("finish.before")


class DeployerCore:
    """Locks, the journal's edges, reconciliation under a lock, and respawning ACTIVE."""

    def __init__(self, store: Store, home: Home, supervisor: Supervisor, publisher: Publisher,
                 clock: Clock, owner: str) -> None:
        self.store = store
        self.home = home
        self.supervisor = supervisor
        self.publisher = publisher
        self.clock = clock
        self.owner = owner
        self.reconciler = Reconciler(store, supervisor, home, self._restart_active_locked,
                                     self.stop_grace)
        self.live_ops: set[int] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._app_locks: dict[str, asyncio.Lock] = {}
        self._restarts: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.closing = False

    def lock(self, host: str) -> asyncio.Lock:
        return self._locks.setdefault(host, asyncio.Lock())

    def _finish(self, op: Operation, result: Result) -> None:
        failpoints.hit("finish.before")
        latest = self.store.get_operation(op.id) or op
        if not latest.terminal:
            if result.outcome is Outcome.DONE:
                self.store.finish_operation(latest, OpState.SUCCEEDED)
            else:
                self.store.finish_operation(latest, OpState.FAILED, error=result.reason)
        message = f"{op.kind} {'succeeded' if result.outcome is Outcome.DONE else 'failed'}"
        if result.reason:
            message += f": {result.reason}"
        self.store.add_event("op", message, app=op.app, instance=op.instance)

    async def _reconcile_locked(self, host: str, mode: Pass) -> None:
        try:
            outcome = await self.reconciler.reconcile(host, mode, self.live_ops)
        except FailedClosed as exc:
            raise OperationError(
                f"{host} is failed closed: {exc.leftover}",
                hint="the process must go before anything else runs here: stop it, then "
                     "`keelway reconcile`; `keelway status` shows it") from exc
        if outcome.republish and mode is not Pass.MUTATION:
            await self.publisher.publish()

    async def _journaled(self, app: str, host: str, kind: OpKind,
                         work: Callable[[Operation], Awaitable[None]]) -> Result:
        """Run `work` as one journaled operation owned by this control plane: the
        operation is live (the reconciler leaves it to us) until its outcome is written.
        A crash inside `work` leaves it unfinished, for the reconciler to converge; an
        exception is journaled as a fault and converged at once. Run under `host`'s lock."""
        op = self.store.begin_operation(app, host, kind, self.owner)
        self.live_ops.add(op.id)
        faulted = False
        try:
            await work(op)
            result = Result(Outcome.DONE)
        except OperationError as exc:
            result = Result(Outcome.FAILED, exc.message)
        except Exception as exc:
            result, faulted = Result(Outcome.FAILED, self._record_fault(op, exc)), True
        finally:
            self.live_ops.discard(op.id)
        if faulted:
            await self._converge_fault(host)
        else:
            self._finish(op, result)
        return result

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
            latest = self.store.get_operation(op.id) or op
            pending = [s.name for s in latest.steps if s.state is StepState.PENDING]
            if pending:
                error = f"{pending[-1]}: {error}"  # where it happened, then what
            seq = self.store.begin_step(op.id, StepKind.FAULT)
            self.store.finish_step(op.id, seq, StepState.FAILED, error=error)
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
            await self._reconcile_locked(host, Pass.MUTATION)
        except OperationError as exc:
            log.warning("after a fault on %s: %s", host, exc.message)
        except Exception:
            # Whatever raised inside the operation may well raise here too (a full disk).
            log.exception("after a fault on %s: could not converge it yet", host)

    async def _respawn_active(self, op: Operation, inst: Instance,
                              waiting: frozenset[str] = frozenset()) -> None:
        """Bring every ACTIVE service back (the verified start path), keeping live ones
        and those `waiting` out a crash backoff, then publish the route of the ACTIVE
        web."""
        fresh: dict[str, Generation] = {}
        for active in self.store.list_active(inst.host):
            gen = self.store.get_generation(active.generation_id)
            if gen is None or gen.service in waiting:
                continue
            if gen.state is not GenState.GONE and (
                    self.supervisor.is_watched(gen.id) or self.supervisor.adopt(gen)):
                continue
            # Its leader is dead; its tree (a daemonized child) may not be: it must be
            # proven gone before a successor takes its key.
            if not await self.supervisor.stop(gen, self.stop_grace(gen)):
                raise OperationError(f"{gen.service} generation {gen.id} (pid {gen.pid}) "
                                     "left processes that could not be stopped")
            target = targets.target_of(self.store, gen)
            spec = target.manifest.services.get(gen.service) if target else None
            if target is None or spec is None:
                continue
            started = await start_generation(
                store=self.store, home=self.home, supervisor=self.supervisor, op_id=op.id,
                instance=inst.host, target=target, spec=spec, before_gen=gen.id)
            if isinstance(started, StartFailed):
                # `work`'s contract with _journaled: a failure it cannot go on from
                # raises OperationError, which _journaled records as the outcome.
                raise OperationError(str(started))
            fresh[gen.service] = started
        self.store.activate_and_route(inst.host, {s: g.id for s, g in fresh.items()})
        await self.publisher.publish(inst.host)

    async def _restart_active_locked(self, host: str,
                                     waiting: frozenset[str] = frozenset()) -> None:
        """The reconciler's RESTART_ACTIVE, run under the instance lock it already holds.
        Services `waiting` out a crash backoff, or whose crash restart is already
        scheduled, are left to that restart."""
        inst = self.store.get_instance(host)
        if inst is None or inst.state is not InstanceState.RUNNING:
            return
        waiting = waiting | {s for (h, s), task in self._restarts.items()
                             if h == host and not task.done()}
        if all(a.service in waiting or self._running(a.generation_id)
               for a in self.store.list_active(host)):
            return
        await self._journaled(inst.app, host, OpKind.RECOVER,
                              lambda op: self._respawn_active(op, inst, waiting))

    def _running(self, gen_id: int) -> bool:
        gen = self.store.get_generation(gen_id)
        return gen is not None and gen.state is not GenState.GONE and (
            self.supervisor.is_watched(gen.id) or self.supervisor.adopt(gen))

    def stop_grace(self, gen: Generation) -> float:
        """The service's stop_grace: SIGTERM its tree, SIGKILL what is left after this."""
        return targets.stop_grace_s(self.store, gen)
