"""Recovery: what runs without a user asking, and bringing back what ACTIVE names.
Crash restarts with backoff, the boot pass that converges every instance after a
control-plane start, `keelway reconcile`, and the periodic pass that only ever tries a
lock, never waits behind an operation. It owns the reconciler, which reaches back only
through the narrow `ActiveRestarts` (restart what ACTIVE names), and `converge`, the one
way any part reconciles an instance under its lock.

The backoff of a crashed service is persisted with its crash (`backoff.before/after`),
so a control-plane restart neither resets it nor restarts early: boot leaves a service
whose retry is not yet due to a restart scheduled for that time. Meanwhile its route is
gated (503 + Retry-After until the retry), not left on a dead port (502).
A start of what ACTIVE names that fails (a wake, `start`, a restore, the periodic pass or
a crash restart bringing it back) is a crash like any other, counted by the same rule
(`next_retry`) in the same write: nothing that finds the service dead respawns it sooner
than its backoff says, however many requests or passes find it.
Every pass also removes process trees that no live record names (invariant 5).
"""

from __future__ import annotations

import asyncio

from keelway import failpoints
from keelway.builds.manifest import WEB, ServiceKind
from keelway.clock import Clock
from keelway.data.replicas import ReplicaError, Replicas
from keelway.deploy import targets
from keelway.deploy.errors import OperationError
from keelway.deploy.instances import StartFailed, start_generation
from keelway.deploy.locks import Locks
from keelway.deploy.operation import Runner, log
from keelway.deploy.outcome import Outcome, Result
from keelway.deploy.publisher import Publisher
from keelway.deploy.steps import Done, Failed, Steps
from keelway.durable import disk_full, disk_full_message
from keelway.home import Home
from keelway.journal import REPLICA, OpKind, StepKind
from keelway.reconcile.apply import FailedClosed, Reconciler
from keelway.reconcile.plan import Pass
from keelway.runtime.backoff import Backoff, next_retry
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import GenState, InstanceState, OpState, RequestState
from keelway.store.records import CrashRetry, Generation, Instance, Operation

PERIODIC_S = 5.0

failpoints.declare("backoff.before", "backoff.after", "replica.start.before",
                   "replica.start.after", "replica.stop.before", "replica.stop.after")


class Recovery:
    """Boot, periodic and on-demand passes, crash restarts, and respawning ACTIVE."""

    def __init__(self, store: Store, home: Home, supervisor: Supervisor, publisher: Publisher,
                 clock: Clock, locks: Locks, owner: str,
                 replicas: Replicas | None = None) -> None:
        self.store = store
        self.home = home
        self.supervisor = supervisor
        self.publisher = publisher
        self.clock = clock
        self.locks = locks
        self.journal = Runner(store, locks, owner, self)
        self.reconciler = Reconciler(store, supervisor, home, self,
                                     lambda gen: targets.stop_grace_s(store, gen))
        self._restarts: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.closing = False
        # None, or no litestream binary: nothing is replicated, and nothing plans to.
        self.replicas = replicas if replicas is not None and replicas.enabled else None
        self.reconciler.replicate = self.replicas is not None
        self._replica_backoff: dict[str, Backoff] = {}
        self._replica_retry_at: dict[str, float] = {}

    async def converge(self, host: str, mode: Pass) -> None:
        """Reconcile `host` under the lock the caller holds; a failed-closed instance
        refuses whatever the caller was about to do."""
        try:
            outcome = await self.reconciler.reconcile(host, mode, self.locks.live_ops)
        except FailedClosed as exc:
            raise OperationError(
                f"{host} is failed closed: {exc.leftover}",
                hint="the process must go before anything else runs here: stop it, then "
                     "`keelway reconcile`; `keelway status` shows it") from exc
        if outcome.republish and mode is not Pass.MUTATION:
            await self.publisher.publish()

    async def on_exit(self, gen: Generation, code: int | None) -> None:
        """A watched generation exited on its own: restart it (with backoff) if published.

        A worker that exits 0 has completed (a one-shot) and is not restarted; web is.
        """
        active = self.store.get_active(gen.instance, gen.service)
        inst = self.store.get_instance(gen.instance)
        self.store.add_event("exit", f"{gen.service} generation {gen.id} exited (code {code})",
                             app=gen.app, instance=gen.instance)
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
        prior = self.store.get_crash_retry(gen.instance, gen.service)
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
        self.store.add_event("backoff", f"{gen.service} restarts in {delay:g}s (crash "
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
        inst = self.store.get_instance(host)
        if inst is None or inst.state is not InstanceState.RUNNING:
            return  # stopped or down by the attempt: nothing restarts it
        waiting = {r.service for r in self.store.pending_retries(host)}
        for active in self.store.list_active(host):
            gen = self.store.get_generation(active.generation_id)
            if (gen is not None and gen.state is GenState.GONE and gen.service not in waiting
                    and not self._running(gen.id)):
                await self._count_failed_start(gen)

    def retry_due(self, host: str) -> float | None:
        """When the next restart of a service of `host` waiting out its crash backoff is
        due (wall clock), or None if none waits."""
        return min((r.retry_at for r in self.store.pending_retries(host)), default=None)

    async def restart_active(self, host: str, waiting: frozenset[str] = frozenset()) -> None:
        """The reconciler's RESTART_ACTIVE, run under the instance lock it already holds.
        It honours the persisted backoff: a service whose retry is not yet due gets a
        restart scheduled for then. Services `waiting` out a crash backoff, or whose crash
        restart is already scheduled, are left to that restart."""
        now = self.clock.now()
        later = [r for r in self.store.pending_retries(host) if r.retry_at > now]
        for retry in later:
            task = self._restarts.get((host, retry.service))
            gen = self.store.get_generation(retry.generation_id)
            if (task is None or task.done()) and gen is not None:
                self._schedule_restart(gen, retry.retry_at - now)
        waiting = waiting | frozenset(r.service for r in later)
        inst = self.store.get_instance(host)
        if inst is None or inst.state is not InstanceState.RUNNING or self.store.fenced(host):
            return
        waiting = waiting | {s for (h, s), task in self._restarts.items()
                             if h == host and not task.done()}
        if all(a.service in waiting or self._running(a.generation_id)
               for a in self.store.list_active(host)):
            return
        await self.journal.journaled(inst.app, host, OpKind.RECOVER,
                               lambda op: self.respawn_active(op, inst, waiting))

    async def start_replica(self, host: str) -> None:
        """The reconciler's START_REPLICA, under the lock the pass holds: an operation of
        its own whose only work is the replication hook (`keep_replica`)."""
        inst = self.store.get_instance(host)
        if inst is None or self.replicas is None:
            return
        # A replicator that keeps dying (a bad S3 URL, say) is retried with the crash
        # backoff, counted here in memory, not by a new operation every pass.
        backoff = self._replica_backoff.setdefault(host, Backoff())
        now = self.clock.now()
        if host not in self._replica_retry_at and backoff.last_start is not None:
            self._replica_retry_at[host] = now + backoff.delay_after_crash(now)
        if now < self._replica_retry_at.get(host, now):
            return
        self._replica_retry_at.pop(host, None)
        backoff.started(now)
        await self.journal.journaled(inst.app, host, OpKind.REPLICATE, lambda _op: _done())

    async def sync_replica(self, host: str) -> None:
        """The reconciler's last sync, under the lock the pass holds, once it stopped the
        replicator of an instance that does not run, or found it dead: a crash, a
        failure or a killed replicator between the
        operation's stop of the app and its own last sync must not leave the replica
        lagging the parked or stopped database until the next wake. A sync is a copy
        that changes nothing keelway reads, so it is not journaled; one a crash cuts
        short is not owed again (the next wake replicates from the database)."""
        inst = self.store.get_instance(host)
        if (self.replicas is None or inst is None or inst.state is InstanceState.RUNNING
                or self.replicas.live(host)):
            return
        try:
            failed = await self.replicas.stop(host, sync=True)
        except (OSError, ReplicaError) as exc:
            failed = str(exc)
        if failed is not None:
            self.store.add_event("replica", failed, app=inst.app, instance=host)

    async def keep_replica(self, op: Operation, host: str) -> str | None:
        """Make `host`'s replicator what the instance now wants, as steps of `op` after
        its work: running with an alive ACTIVE web, not fenced: one replicator (spawned
        if none runs); not running: every replicator stopped and proven gone, then one
        last sync.

        The operation's effect on traffic has happened by then (a deploy published, a
        park stopped its apps), so nothing here fails it: a replicator that does not
        start or stop is a failed step, an event and a warning of the operation, and the
        reconciler's replicator rules (keelway/reconcile/plan.py) try again at the next
        pass. A crash inside either step leaves the step pending, and the reconciler
        finalizes the operation by its other steps (plan.py: a replicator step decides
        only a `replicate` operation). Returns what failed, which fails only a
        `replicate` operation (whose whole work this is)."""
        replicas = self.replicas
        inst = self.store.get_instance(host)
        if replicas is None or inst is None:
            return None
        steps = Steps(self.store, op.id)
        if inst.state is InstanceState.RUNNING:
            web_active = self.store.get_active(host, WEB)
            web = self.store.get_generation(web_active.generation_id) if web_active else None
            if (web is None or self.store.fenced(host) or not self._running(web.id)
                    or replicas.running(host) is not None):
                return None

            async def spawn() -> Done | Failed:
                assert web is not None
                try:
                    gen = await replicas.spawn(host, op.id, web)
                except (OSError, ReplicaError) as exc:
                    return Failed(f"the replicator did not start: {exc}")
                return Done(f"generation {gen.id} pid {gen.pid}")

            failed = await steps.run(StepKind.REPLICA_START, spawn, service=REPLICA,
                                     before=("replica.start.before",),
                                     after=("replica.start.after",))
        else:
            if not replicas.live(host):
                return None

            async def stop() -> Done | Failed:
                try:
                    unstopped = await replicas.stop(host, sync=True)
                except (OSError, ReplicaError) as exc:
                    unstopped = f"the replicator could not be stopped and synced: {exc}"
                return Done("synced; gone") if unstopped is None else Failed(unstopped)

            failed = await steps.run(StepKind.REPLICA_STOP, stop, service=REPLICA,
                                     before=("replica.stop.before",),
                                     after=("replica.stop.after",))
        if failed is None:
            return None
        # A replicator still alive of an instance that does not run is named by its
        # record (invariant 5 holds) and stopped by the reconciler's STOP_REPLICA.
        self.store.add_event("replica", failed.reason, app=inst.app, instance=host)
        self.store.add_warnings(self.store.get_operation(op.id) or op,
                                [f"replicator: {failed.reason}"])
        return failed.reason

    def _running(self, gen_id: int) -> bool:
        gen = self.store.get_generation(gen_id)
        return gen is not None and gen.state is not GenState.GONE and (
            self.supervisor.is_watched(gen.id) or self.supervisor.adopt(gen))

    async def respawn_active(self, op: Operation, inst: Instance,
                             waiting: frozenset[str] = frozenset()) -> Result:
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
            if not await self.supervisor.stop(gen, targets.stop_grace_s(self.store, gen)):
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
        if self.closing:
            return
        async with self.locks.instance(gen.instance):
            self._restarts.pop((gen.instance, gen.service), None)
            inst = self.store.get_instance(gen.instance)
            active = self.store.get_active(gen.instance, gen.service)
            if (inst is None or inst.state is not InstanceState.RUNNING or active is None
                    or active.generation_id != gen.id or self.store.fenced(gen.instance)):
                # Something newer took over while we waited; or a fence holds it: the
                # crash stays recorded (its route gated), and once the fence is lifted
                # the periodic pass restarts it (RESTART_ACTIVE).
                return
            result = await self.journal.journaled(gen.app, gen.instance, OpKind.RESTART_CRASHED,
                                            lambda op: self.respawn_active(op, inst))
            try:
                await self.converge(gen.instance, Pass.MUTATION)
            except OperationError as exc:
                log.warning("after a crash restart: %s", exc.message)
        if result.outcome is not Outcome.DONE:
            pending = self._restarts.get((gen.instance, gen.service))
            if pending is not None and not pending.done():
                return  # its failed start was counted and its retry scheduled
            fresh = self.store.get_active(gen.instance, gen.service)
            latest = self.store.get_generation(fresh.generation_id) if fresh else None
            if latest is not None:
                await self.on_exit(latest, latest.exit_code)

    async def boot(self) -> None:
        """After a control-plane start: remove trees no record names, reconcile every
        instance (adopt survivors, remove candidates of interrupted operations, restart
        what should run), settle keyed requests that a crash interrupted, and publish
        the whole route table.

        A router that does not answer in time (alive, but starved or stopped) does not
        stop the boot: the router keeps serving its last table, and the periodic pass
        republishes once it answers and differs from the store."""
        began = self.clock.monotonic()
        await self._remove_strays()
        # Planned from one bulk read; only an instance with work is locked and
        # reconciled, from a fresh read under its lock.
        hosts, _ = self.reconciler.survey(Pass.BOOT, self.locks.live_ops)
        for host in hosts:
            async with self.locks.instance(host):
                try:
                    await self.reconciler.reconcile(host, Pass.BOOT, self.locks.live_ops)
                except FailedClosed as exc:
                    log.warning("%s", exc)
                except OperationError as exc:
                    log.warning("boot: %s: %s; the periodic pass retries", host, exc.message)
        # The interrupted operations no instance's plan sees (a run, whose process was a
        # stray of the pass above), each ended by its kind's finalizer.
        self.reconciler.finalize_orphans(self.locks.live_ops)
        targets.link_every_current(self.store, self.home)
        log.info("boot: %d instances reconciled (%d with work) in %.3f s",
                 len(self.store.list_instances()), len(hosts),
                 self.clock.monotonic() - began)
        for request in self.store.running_requests():
            self.settle_request_from_journal(request.key)
        try:
            await self.publisher.publish()
        except OperationError as exc:
            log.warning("boot: %s; the periodic pass republishes", exc.message)

    def settle_request_from_journal(self, key: str) -> None:
        ops = [op for i in self.store.list_instances()
               if (op := self.store.find_operation_by_key(i.host, key)) is not None]
        ok = bool(ops) and all(op.state is OpState.SUCCEEDED for op in ops)
        self.store.finish_request(
            key, RequestState.SUCCEEDED if ok else RequestState.FAILED,
            '{"replayed": "journal", "ok": %s}' % ("true" if ok else "false"))

    async def _remove_strays(self) -> list[int]:
        try:
            strays = await self.supervisor.remove_strays()
        except OSError as exc:
            log.warning("could not sweep stray process trees: %s", exc)
            return []
        for gen_id in strays:
            log.warning("removed the process tree of generation %s, which no live record "
                        "names", gen_id)
        return strays

    def _stray_report(self, strays: list[int]) -> list[dict[str, object]]:
        """Strays as `reconcile` reports them: under their instance when a record says."""
        by_host: dict[str, list[str]] = {}
        for gen_id in strays:
            gen = self.store.get_generation(gen_id)
            by_host.setdefault(gen.instance if gen else "(unknown)", []).append(
                f"remove-tree generation {gen_id} (no live record names it)")
        return [{"instance": host, "actions": actions, "error": None}
                for host, actions in sorted(by_host.items())]

    async def reconcile_all(self, dry_run: bool) -> list[dict[str, object]]:
        """`keelway reconcile`: what boot does, on demand; --dry-run only plans."""
        strays = self.supervisor.strays() if dry_run else await self._remove_strays()
        report: list[dict[str, object]] = self._stray_report(strays)
        republish = False
        for inst in self.store.list_instances():
            async with self.locks.instance(inst.host):
                if dry_run:
                    actions = self.reconciler.plan_for(inst.host, Pass.BOOT, self.locks.live_ops)
                    error = None
                else:
                    try:
                        outcome = await self.reconciler.reconcile(inst.host, Pass.BOOT,
                                                                  self.locks.live_ops)
                        actions, error = outcome.actions, None
                        republish = republish or outcome.republish
                    except FailedClosed as exc:
                        actions, error = [], str(exc)
            shown = [a.describe() for a in actions if a.kind.value != "republish"]
            report.append({"instance": inst.host, "actions": shown, "error": error})
        if republish and not dry_run:
            await self.publisher.publish()
        return report

    async def periodic(self) -> None:
        """The background pass: only *tries* each lock, never waits behind an operation."""
        while not self.closing:
            await self.clock.sleep(PERIODIC_S)
            try:
                await self._periodic_pass()
            except Exception as exc:
                # Protects the loop: a pass that fails (a full disk, say) is tried again
                # next time, and the loop never ends because of it.
                _log_pass_failure("periodic pass", exc)

    async def _periodic_pass(self) -> None:
        await self._remove_strays()
        hosts, republish = self.reconciler.survey(Pass.PERIODIC, self.locks.live_ops)
        for host in hosts:
            lock = self.locks.instance(host)
            if lock.locked():
                continue
            async with lock:
                try:
                    outcome = await self.reconciler.reconcile(host, Pass.PERIODIC,
                                                              self.locks.live_ops)
                    republish = republish or outcome.republish
                except FailedClosed as exc:
                    log.warning("periodic pass: %s", exc)
                except Exception as exc:
                    # One bad instance must not stop the pass for the others.
                    _log_pass_failure(f"periodic pass for {host}", exc)
        if republish:
            try:
                if not await self.publisher.in_sync():
                    await self.publisher.publish()
            except OperationError as exc:
                log.warning("periodic republish: %s", exc.message)

    async def close(self) -> None:
        self.closing = True
        for task in list(self._restarts.values()):
            task.cancel()


async def _done() -> Result:
    return Result(Outcome.DONE)


def _log_pass_failure(what: str, exc: Exception) -> None:
    """A full disk is expected weather, said in one line every pass until there is room;
    anything else is a bug, logged with its traceback."""
    if disk_full(exc):
        log.warning("%s: %s", what, disk_full_message(exc))
    else:
        log.error("%s failed", what, exc_info=exc)
