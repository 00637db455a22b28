"""Crash restarts: a published generation that exits on its own is restarted after its
backoff, and what ACTIVE names is brought back through the verified start path.

The backoff of a crashed service is persisted with its crash (`backoff.before/after`),
so a control-plane restart neither resets it nor restarts early: boot leaves a service
whose retry is not yet due to a restart scheduled for that time. Meanwhile its route is
gated (503 + Retry-After until the retry), not left on a dead port (502).
A start of what ACTIVE names that fails (a wake, `start`, a restore, the periodic pass or
a crash restart bringing it back) is a crash like any other, counted by the same rule
(`next_retry`) in the same write: nothing that finds the service dead respawns it sooner
than its backoff says, however many requests or passes find it.
The one map here (`_restarts`) holds the restart scheduled per service, so a second
crash replaces the first's restart, never runs beside it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from keelway import failpoints
from keelway.builds.manifest import ServiceKind
from keelway.clock import Clock
from keelway.deploy import targets
from keelway.deploy.errors import OperationError
from keelway.deploy.generation_start import StartFailed, start_generation
from keelway.deploy.locks import Locks
from keelway.deploy.operation import Bound, Ended, Plan, PlannedStep, Ran, Runner, Spec, log
from keelway.deploy.outcome import Outcome, Result
from keelway.deploy.publisher import Publisher
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.reconcile.plan import Pass
from keelway.runtime.backoff import next_retry
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import GenState, InstanceState
from keelway.store.records import CrashRetry, Generation, Instance, Operation

failpoints.declare("backoff.before", "backoff.after")


@dataclass(eq=False)
class CrashRestarts:
    """Restarts after a crash, with backoff, and respawning what ACTIVE names."""

    store: Store
    home: Home
    supervisor: Supervisor
    publisher: Publisher
    clock: Clock
    locks: Locks
    runner: Runner

    def __post_init__(self) -> None:
        self._restarts: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.closing = False

    async def on_exit(self, gen: Generation, code: int | None) -> None:
        """A watched generation exited on its own: restart it (with backoff) if published.

        A worker that exits 0 has completed (a one-shot) and is not restarted; web is.
        """
        active = self.store.generations.get_active(gen.instance, gen.service)
        inst = self.store.instances.get_instance(gen.instance)
        # The kernel's reason first, when it ended the tree: "web generation 12 killed:
        # out of memory at its 512M limit (code -9)".
        said = gen.exit_cause or "exited"
        self.store.ops.add_event("exit", f"{gen.service} generation {gen.id} {said} "
                                 f"(code {code})", app=gen.app, instance=gen.instance)
        if (self.closing or active is None or active.generation_id != gen.id or inst is None
                or inst.state is not InstanceState.RUNNING):
            return
        if gen.op_id in self.locks.live_ops:
            return  # it died while its own operation watches it settle: that op decides
        target = targets.target_of(self.store, gen)
        spec = target.manifest.services.get(gen.service) if target else None
        if code == 0 and spec is not None and spec.kind is ServiceKind.WORKER:
            return
        delay = await self._record_crash(gen)
        self._schedule_restart(gen, delay)

    async def _record_crash(self, gen: Generation, *, start_failed: bool = False) -> float:
        """Persist the crash and its retry time, and gate a route that served the dead
        web, in one write; returns the delay until the retry. `start_failed`: the
        caller's operation could not bring `gen`'s service back, and the route it holds
        waiting (parked, holding) is gated too.

        Crash before the write: boot restarts the service at once (the one crash it
        never saw is not counted). Crash after: boot waits for the recorded retry time,
        and the route stays gated until the restart publishes it again."""
        now = self.clock.now()
        prior = self.store.generations.get_crash_retry(gen.instance, gen.service)
        # "Stable" is measured from the crashed generation's own start, so a long-lived
        # generation's crash is retried quickly however the previous loop ended.
        failures, delay = next_retry(
            prior.failures if prior else 0, started_at=gen.created_at, now=now,
            same_generation=prior is not None and prior.generation_id == gen.id)
        failpoints.hit("backoff.before")
        gate = self.store.record_crash(CrashRetry(gen.instance, gen.service, gen.id,
                                                  failures, now, now + delay),
                                       gate_waiting=start_failed)
        failpoints.hit("backoff.after")
        self.store.ops.add_event("backoff", f"{gen.service} restarts in {delay:g}s (crash "
                                 f"{failures} in a row)", app=gen.app,
                                 instance=gen.instance)
        if gate or gen.service == "web":
            # Also when the route was gated already: its page says when the retry is due
            # (Retry-After), and that just changed.
            try:
                await self.publisher.publish()
            except OperationError as exc:
                log.warning("gating %s after a crash: %s", gen.instance, exc.message)
        return delay

    def _schedule_restart(self, gen: Generation, delay_s: float) -> None:
        """The one restart of `gen`'s service, `delay_s` from now; one scheduled before
        (an operator tried now, and that failed too) is replaced, never run as well."""
        key = (gen.instance, gen.service)
        earlier = self._restarts.get(key)
        if earlier is not None and earlier is not asyncio.current_task():
            earlier.cancel()
        self._restarts[key] = asyncio.get_running_loop().create_task(
            self._restart_later(gen, delay_s))

    async def _count_failed_start(self, gen: Generation) -> None:
        """ACTIVE `gen`'s service could not be started again: count it as a crash of
        `gen` (the count grows, since `gen` is the one counted last) and schedule its
        retry. Crash before the write: the next pass restarts it once; after: boot
        waits for the recorded retry."""
        delay = await self._record_crash(gen, start_failed=True)
        if not self.closing:
            self._schedule_restart(gen, delay)

    async def count_dead_active(self, host: str) -> None:
        """After an attempt whose fallback could not start what it went back to (the
        instance still running, ACTIVE naming a dead generation): count each such
        service as a failed start, so that the next pass does not respawn it at once."""
        inst = self.store.instances.get_instance(host)
        if inst is None or inst.state is not InstanceState.RUNNING:
            return  # stopped or down by the attempt: nothing restarts it
        waiting = {r.service for r in self.store.generations.pending_retries(host)}
        for active in self.store.generations.list_active(host):
            gen = self.store.generations.get_generation(active.generation_id)
            if (gen is not None and gen.state is GenState.GONE and gen.service not in waiting
                    and not self._running(gen.id)):
                await self._count_failed_start(gen)

    def retry_due(self, host: str) -> float | None:
        """When the next restart of a service of `host` waiting out its crash backoff is
        due (wall clock), or None if none waits."""
        return min((r.retry_at for r in self.store.generations.pending_retries(host)), default=None)

    async def restart_active(self, host: str, waiting: frozenset[str] = frozenset()) -> None:
        """The reconciler's RESTART_ACTIVE, run under the instance lock it already holds.
        It honours the persisted backoff: a service whose retry is not yet due gets a
        restart scheduled for then. Services `waiting` out a crash backoff, or whose crash
        restart is already scheduled, are left to that restart."""
        now = self.clock.now()
        later = [r for r in self.store.generations.pending_retries(host) if r.retry_at > now]
        for retry in later:
            task = self._restarts.get((host, retry.service))
            gen = self.store.generations.get_generation(retry.generation_id)
            if (task is None or task.done()) and gen is not None:
                self._schedule_restart(gen, retry.retry_at - now)
        waiting = waiting | frozenset(r.service for r in later)
        inst = self.store.instances.get_instance(host)
        if inst is None or inst.state is not InstanceState.RUNNING or self.store.instances.fenced(
            host):
            return
        waiting = waiting | {s for (h, s), task in self._restarts.items()
                             if h == host and not task.done()}
        if all(a.service in waiting or self._running(a.generation_id)
               for a in self.store.generations.list_active(host)):
            return
        await self.runner.run_held(RECOVER, self, Respawn(host, waiting))

    def _running(self, gen_id: int) -> bool:
        gen = self.store.generations.get_generation(gen_id)
        return gen is not None and gen.state is not GenState.GONE and (
            self.supervisor.is_watched(gen.id) or self.supervisor.adopt(gen))

    async def respawn_active(self, op: Operation, inst: Instance,
                             waiting: frozenset[str] = frozenset()) -> Result:
        """Bring every ACTIVE service back (the verified start path), keeping live ones
        and those `waiting` out a crash backoff, then publish the route of the ACTIVE
        web."""
        fresh: dict[str, Generation] = {}
        for active in self.store.generations.list_active(inst.host):
            gen = self.store.generations.get_generation(active.generation_id)
            if gen is None or gen.service in waiting:
                continue
            if gen.state is not GenState.GONE and (
                    self.supervisor.is_watched(gen.id) or self.supervisor.adopt(gen)):
                continue
            # Its leader is dead; its tree (a daemonized child) may not be: it must be
            # proven gone before a successor takes its key.
            if not await self.supervisor.stop(gen, targets.stop_grace_s(self.store, gen)):
                pid = self.store.local.presence(gen.id).pid
                raise OperationError(f"{gen.service} generation {gen.id} (pid {pid}) "
                                     "left processes that could not be stopped")
            target = targets.target_of(self.store, gen)
            spec = target.manifest.services.get(gen.service) if target else None
            if target is None or spec is None:
                continue
            started = await start_generation(
                store=self.store, home=self.home, supervisor=self.supervisor, op_id=op.id,
                instance=inst.host, target=target, spec=spec, before_gen=gen.id)
            if isinstance(started, StartFailed):
                # Counted before the raise: whoever called (a wake the router asked for,
                # the periodic pass) must not find it dead and respawn it at once again.
                # A failure it cannot go on from raises OperationError, which
                # Journaled.run records as the outcome.
                await self._count_failed_start(gen)
                raise OperationError(str(started))
            fresh[gen.service] = started
        self.store.activate_and_route(inst.host, {s: g.id for s, g in fresh.items()})
        await self.publisher.publish(inst.host)
        return Result(Outcome.DONE)

    async def _restart_later(self, gen: Generation, delay_s: float) -> None:
        await self.clock.sleep(delay_s)
        if self.closing or self.store.instances.get_instance(gen.instance) is None:
            return
        ran = await self.runner.run(RESTART_CRASHED, self,
                                    Respawn(gen.instance, crashed=(gen.service, gen.id)))
        if ran.result is None or ran.result.outcome is Outcome.DONE:
            return
        pending = self._restarts.get((gen.instance, gen.service))
        if pending is not None and not pending.done():
            return  # its failed start was counted and its retry scheduled
        fresh = self.store.generations.get_active(gen.instance, gen.service)
        latest = self.store.generations.get_generation(fresh.generation_id) if fresh else None
        if latest is not None:
            await self.on_exit(latest, latest.exit_code)

    def forget_scheduled(self, host: str, service: str) -> None:
        self._restarts.pop((host, service), None)

    async def close(self) -> None:
        self.closing = True
        for task in list(self._restarts.values()):
            task.cancel()


# -- the respawn operations: RECOVER (the reconciler's RESTART_ACTIVE) and
# RESTART_CRASHED (a published generation's restart after its backoff) -------------


@dataclass(frozen=True)
class Respawn:
    host: str
    # Services waiting out a crash backoff, left to their own restart.
    waiting: frozenset[str] = frozenset()
    # RESTART_CRASHED: the (service, generation) that crashed, which must still be what
    # ACTIVE names when the restart is due.
    crashed: tuple[str, int] | None = None


def plan_respawn(store: Store, request: Respawn) -> Plan:
    """Bring back what ACTIVE names (the verified start path), then publish. A crash
    restart has nothing to do once something newer took over while it waited, or a
    fence holds the instance: the crash stays recorded (its route gated), and once the
    fence is lifted the periodic pass restarts it (RESTART_ACTIVE)."""
    inst = targets.instance_named(store, request.host)
    kind = OpKind.RECOVER if request.crashed is None else OpKind.RESTART_CRASHED
    if request.crashed is not None:
        service, gen_id = request.crashed
        active = store.generations.get_active(inst.host, service)
        if (inst.state is not InstanceState.RUNNING or active is None
                or active.generation_id != gen_id or store.instances.fenced(inst.host)):
            return Plan(kind, inst.app, inst.host,
                        nothing="something newer took over, or a fence holds it")
    waiting = (f" ({', '.join(sorted(request.waiting))} left to their backoff)"
               if request.waiting else "")
    return Plan(kind, inst.app, inst.host, (PlannedStep(
        StepKind.SPAWN, f"start what ACTIVE names that is not alive{waiting}, and "
        "publish its route", "respawn", journals_own=True),))


def _respawn(restarts: CrashRestarts, request: Respawn, _step: PlannedStep) -> Bound:
    async def respawn(op: Operation) -> Ended:
        inst = targets.instance_named(restarts.store, request.host)
        return Ended(await restarts.respawn_active(op, inst, request.waiting))

    return respawn


async def _forget_scheduled(restarts: CrashRestarts, request: Respawn) -> None:
    if request.crashed is not None:
        restarts.forget_scheduled(request.host, request.crashed[0])


async def _converge_after(restarts: CrashRestarts, request: Respawn, _ran: Ran) -> None:
    try:
        await restarts.runner.converger.converge(request.host, Pass.MUTATION)
    except OperationError as exc:
        log.warning("after a crash restart: %s", exc.message)


# Run by the reconciler's pass under the lock it holds (`run_held`).
RECOVER: Spec[Respawn, CrashRestarts] = Spec(OpKind.RECOVER, plan_respawn,
                                             {"respawn": _respawn})
# Its own lock; no convergence first (what it restarts is what the pass would), and
# once more after, a failure of which is left to the next pass.
RESTART_CRASHED: Spec[Respawn, CrashRestarts] = Spec(
    OpKind.RESTART_CRASHED, plan_respawn, {"respawn": _respawn}, converge_first=False,
    prelude=_forget_scheduled, after=_converge_after)
