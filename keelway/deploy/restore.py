"""Snapshots of an instance's database, taken and checked, and its restore.

A part beside `Deployer` and `Parking`, on the same `Locks` and `Recovery` (wired in
keelway/api/daemon.py). What each holds:
- snapshot: under the instance lock (so no restore swaps the file under the copy), the
  copy and its checks run in a thread (keelway/data/snapshots.py). Not an operation of
  the instance: it changes nothing convergence reads, and a crash leaves only a temp
  file (swept at boot) or an unlisted copy (pruned).
- restore, a journaled operation under the instance lock, after convergence:
  fetch + verify the snapshot first (a damaged or unknown one is refused: nothing
  changed) → HOLD_ROUTE (a running instance's route holding, published: requests wait)
  → STOP every generation, proven gone → SWAP_DB (commit point, keelway/data/swap.py)
  → a running instance is respawned from ACTIVE (the verified start path, as start and
  wake do: ACTIVE and the route serving in one write, published). A parked or stopped
  instance has nothing to hold, stop or start: its file is swapped and it stays as it was.

Crash windows: before SWAP_DB begins → the old database is untouched; boot adopts or
restarts what ACTIVE names and puts the held route back (keelway/reconcile/plan.py
RESTORE_ROUTE); the staged copy is swept. Once the swap committed → boot finishes it
before anything of the instance respawns (`swap.finish_all`, keelway/api/daemon.py), so
the instance comes back on the restored database, whole.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from keelway import failpoints, names
from keelway.builds.manifest import DataSpec
from keelway.data import snapshots, swap
from keelway.data.objects import NotFound, ObjectStore, ObjectStoreError
from keelway.data.snapshots import Manifest, NoDatabase
from keelway.data.verify import Damaged
from keelway.deploy import targets
from keelway.deploy.errors import NotFoundError, OperationError, UserError
from keelway.deploy.locks import Locks
from keelway.deploy.outcome import Outcome, Result
from keelway.deploy.parking import refuse_if_fenced
from keelway.deploy.publisher import Publisher
from keelway.deploy.recovery import Recovery
from keelway.deploy.steps import Done, Effect, Failed, Steps
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.reconcile.plan import Pass
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import InstanceState, RouteState
from keelway.store.records import Generation, Instance, Operation

failpoints.declare("restore.hold.before", "restore.hold.after", "restore.swap.before",
                   "restore.swap.after")


log = logging.getLogger("keelway.snapshots")

# How often the schedule looks for due snapshots; the shortest `snapshot_every` is 1m.
SCHEDULE_S = 30.0


def due(now_s: float, last_s: float, every_s: float) -> bool:
    """Whether a snapshot taken at `last_s` (0: never) is `every_s` old at `now_s`."""
    return now_s - last_s >= every_s


def unchanged_since(db: Path, last_s: float) -> bool:
    """Whether nothing wrote `db` (nor its -wal) after a snapshot taken at `last_s`: a
    parked instance's database is not copied again every period for nothing."""
    if last_s <= 0:
        return False
    wal = Path(f"{db}-wal")
    newest = max(db.stat().st_mtime, wal.stat().st_mtime if wal.exists() else 0.0)
    return newest < last_s


class SnapshotRefused(UserError):
    """The snapshot failed verification (or is unknown): nothing was changed."""

    code = "snapshot-refused"


class ObjectStoreFailed(OperationError):
    code = "object-store-failed"


@dataclass(frozen=True)
class Restored:
    host: str
    snapshot: Manifest
    state: InstanceState


class Snapshots:
    def __init__(self, store: Store, home: Home, supervisor: Supervisor, publisher: Publisher,
                 locks: Locks, recovery: Recovery, objects: ObjectStore) -> None:
        self.store = store
        self.home = home
        self.supervisor = supervisor
        self.publisher = publisher
        self.locks = locks
        self.recovery = recovery
        self.objects = objects
        self.journal = recovery.journal
        # When each instance's newest snapshot was taken, as the schedule last saw it
        # (read from the object store once per instance, then kept up by the schedule).
        self._last: dict[str, float] = {}
        self._specs: dict[tuple[str, str], DataSpec] = {}

    def instance(self, host: str) -> Instance:
        return targets.instance_named(self.store, host)

    @staticmethod
    def check_id(snap_id: str) -> str:
        try:
            return names.SNAPSHOT_ID.check(snap_id)
        except names.InvalidName as exc:
            raise UserError(exc.message, hint=exc.hint) from None

    def _release(self, host: str) -> int | None:
        for active in self.store.list_active(host):
            gen = self.store.get_generation(active.generation_id)
            if gen is not None:
                return gen.release
        return None

    async def snapshot(self, host: str) -> Manifest:
        """Take a verified snapshot of `host`'s database (running or parked)."""
        self.instance(host)
        async with self.locks.instance(host):
            release = self._release(host)
            try:
                made = await asyncio.to_thread(
                    snapshots.take, self.objects, self.home, host,
                    now_s=self.recovery.clock.now(), release=release)
            except NoDatabase as exc:
                raise NotFoundError(str(exc), hint="the instance has no database yet") from None
            except Damaged as exc:
                raise OperationError(f"the copy of {host} failed its check: {exc.message}",
                                     hint="run `keelway db snapshot` again; if it fails "
                                          "again the database itself may be damaged") from None
            except ObjectStoreError as exc:
                raise ObjectStoreFailed(str(exc), hint="check the object store") from None
        self.store.add_event("snapshot", f"snapshot {made.id} taken ({made.size} bytes)",
                             app=self.instance(host).app, instance=host)
        return made

    async def stored(self, host: str) -> list[Manifest]:
        self.instance(host)
        try:
            return await asyncio.to_thread(snapshots.list_snapshots, self.objects, host)
        except ObjectStoreError as exc:
            raise ObjectStoreFailed(str(exc), hint="check the object store") from None

    async def verify(self, host: str, snap_id: str) -> Manifest:
        """Fetch snapshot `snap_id` and check it; SnapshotRefused if it fails."""
        self.instance(host)
        self.check_id(snap_id)
        try:
            return await asyncio.to_thread(snapshots.verify_stored, self.objects, host,
                                           snap_id, self.home.data_dir(host))
        except NotFound:
            raise NotFoundError(f"{host} has no snapshot {snap_id}",
                                hint=f"see `keelway db snapshots {host}`") from None
        except Damaged as exc:
            raise SnapshotRefused(f"snapshot {snap_id} of {host} failed verification: "
                                  f"{exc.message}", hint="restore another snapshot") from None
        except ObjectStoreError as exc:
            raise ObjectStoreFailed(str(exc), hint="check the object store") from None

    # -- schedule and gc ------------------------------------------------------------

    def data_spec(self, host: str) -> DataSpec:
        """The `[data]` table of the build the instance runs (the default if none)."""
        gens = [g for g in self.store.active_generations() if g.instance == host]
        return self._spec_of(gens[0]) if gens else DataSpec()

    def _spec_of(self, gen: Generation) -> DataSpec:
        key = (gen.app, gen.build_digest)
        if key not in self._specs:  # a build's manifest never changes: read it once
            target = targets.target_of(self.store, gen)
            if target is None:
                return DataSpec()
            self._specs[key] = target.manifest.data
        return self._specs[key]

    def _specs_by_host(self) -> dict[str, DataSpec]:
        """Every instance's `[data]` table from one bulk read of ACTIVE (web first)."""
        found: dict[str, DataSpec] = {}
        for gen in self.store.active_generations():
            if gen.instance not in found:
                found[gen.instance] = self._spec_of(gen)
        return found

    async def prune_all(self, dry_run: bool) -> list[tuple[str, str]]:
        """Every instance's snapshots beyond its `keep` (and copies without a manifest)
        removed, unless `dry_run`; returns (host, snapshot id) of each one beyond."""
        removed: list[tuple[str, str]] = []
        specs = self._specs_by_host()
        for inst in self.store.list_instances():
            keep = specs.get(inst.host, DataSpec()).keep
            async with self.locks.instance(inst.host):
                try:
                    if dry_run:
                        listed = await asyncio.to_thread(snapshots.list_snapshots,
                                                         self.objects, inst.host)
                        ids = [m.id for m in listed[: max(0, len(listed) - keep)]]
                    else:
                        ids = await asyncio.to_thread(snapshots.prune, self.objects,
                                                      inst.host, keep)
                except ObjectStoreError as exc:
                    raise ObjectStoreFailed(str(exc), hint="check the object store") from None
            removed += [(inst.host, snap_id) for snap_id in ids]
        return removed

    async def take_due(self) -> list[str]:
        """One pass of the schedule: snapshot every instance whose `[data]
        snapshot_every` has passed since its newest snapshot, then prune it to `keep`.
        Returns the hosts snapshotted. A failure is logged and left to the next pass."""
        now = self.recovery.clock.now()
        taken = []
        for host, spec in sorted(self._specs_by_host().items()):
            db = self.home.db_path(host)
            if spec.snapshot_every_s is None or not db.is_file():
                continue
            last = self._last.get(host)
            if last is None:
                newest = await asyncio.to_thread(snapshots.newest, self.objects, host)
                last = self._last[host] = newest.taken_at if newest else 0.0
            if not due(now, last, spec.snapshot_every_s) or unchanged_since(db, last):
                continue
            inst = self.store.get_instance(host)
            if inst is None:
                continue
            try:
                made = await self.snapshot(inst.host)
                await self.prune_one(inst.host, spec.keep)
            except OperationError as exc:
                log.warning("scheduled snapshot of %s: %s", inst.host, exc.message)
                continue
            self._last[inst.host] = made.taken_at
            taken.append(inst.host)
        return taken

    async def prune_one(self, host: str, keep: int) -> list[str]:
        async with self.locks.instance(host):
            try:
                return await asyncio.to_thread(snapshots.prune, self.objects, host, keep)
            except ObjectStoreError as exc:
                raise ObjectStoreFailed(str(exc), hint="check the object store") from None

    async def schedule(self) -> None:
        """The one loop that takes due snapshots (the daemon runs it; the clock is
        injected, so a test's hour passes at once)."""
        while True:
            await self.recovery.clock.sleep(SCHEDULE_S)
            try:
                await self.take_due()
            except Exception:
                # The loop outlives any one pass: a store or disk error is logged, and
                # the next pass tries again.
                log.exception("snapshot schedule pass failed")

    # -- restore ---------------------------------------------------------------------

    async def restore(self, host: str, snap_id: str) -> Restored:
        """Replace `host`'s database with snapshot `snap_id`, verified first. After
        return the instance is in the state it was (a running one serves again, on the
        restored data). A snapshot that fails verification changes nothing."""
        self.instance(host)
        self.check_id(snap_id)
        async with self.locks.instance(host):
            await self.recovery.converge(host, Pass.MUTATION)
            inst = self.instance(host)
            if inst.state is InstanceState.RUNNING:
                refuse_if_fenced(self.store, host, "be restored (it would restart)")
            db = self.home.db_path(host)
            staged = swap.staged_path(db, snap_id)
            found = await self._stage(host, snap_id, staged)
            try:
                result = await self.journal.run(inst.app, host, OpKind.RESTORE,
                                                lambda op: self._work(op, inst, staged))
                await self.recovery.converge(host, Pass.MUTATION)
            finally:
                staged.unlink(missing_ok=True)
            if inst.state is InstanceState.RUNNING:
                targets.link_current(self.store, self.home, host)
        if result.outcome is not Outcome.DONE:
            raise OperationError(f"{host}: restore failed: {result.reason}",
                                 hint=f"see `keelway ops {inst.app} --instance {host}`")
        self.store.add_event("restore", f"restored snapshot {snap_id}", app=inst.app,
                             instance=host)
        now = self.store.get_instance(host) or inst
        return Restored(host, found, now.state)

    async def _stage(self, host: str, snap_id: str, staged: Path) -> Manifest:
        """The snapshot fetched beside the database, verified, in WAL mode (as every
        instance database is), fsynced; refused with nothing changed otherwise."""
        try:
            return await asyncio.to_thread(self._fetch_staged, host, snap_id, staged)
        except NotFound:
            raise NotFoundError(f"{host} has no snapshot {snap_id}",
                                hint=f"see `keelway db snapshots {host}`") from None
        except Damaged as exc:
            raise SnapshotRefused(f"snapshot {snap_id} of {host} failed verification: "
                                  f"{exc.message}; nothing was changed",
                                  hint="restore another snapshot") from None
        except ObjectStoreError as exc:
            raise ObjectStoreFailed(str(exc), hint="check the object store") from None

    def _fetch_staged(self, host: str, snap_id: str, staged: Path) -> Manifest:
        staged.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            found = snapshots.fetch(self.objects, host, snap_id, staged)
            swap.to_wal(staged)
        except BaseException:
            for side in swap.SIDES:
                Path(f"{staged}{side}").unlink(missing_ok=True)
            raise
        return found

    async def _work(self, op: Operation, inst: Instance, staged: Path) -> Result:
        steps = Steps(self.store, op.id)
        host = inst.host
        running = inst.state is InstanceState.RUNNING
        if running:
            async def hold() -> Done | Failed:
                route = self.store.get_route(host)
                if route is not None and route.state is not RouteState.HOLDING:
                    self.store.set_route(host, host, RouteState.HOLDING, route.port,
                                         route.generation_id, expected=route)
                try:
                    await self.publisher.publish(host)
                except OperationError as exc:
                    return Failed(exc.message)
                return Done()

            held = await steps.run(StepKind.HOLD_ROUTE, hold, before=("restore.hold.before",),
                                   after=("restore.hold.after",))
            if held is not None:
                return Result(Outcome.FAILED, held.reason)
        for gen in self.store.live_generations(host):
            failed = await steps.run(StepKind.STOP, self._stop(gen), service=gen.service,
                                     before_gen=gen.id)
            if failed is not None:
                raise OperationError(failed.reason)
        db = self.home.db_path(host)

        async def swapped() -> Done:
            await asyncio.to_thread(swap.swap, db, staged)
            return Done(f"database replaced by {staged.name}")

        await steps.run(StepKind.SWAP_DB, swapped, before=("restore.swap.before",),
                        after=("restore.swap.after",))
        if not running:
            return Result(Outcome.DONE)
        current = self.store.get_instance(host) or inst
        return await self.recovery.respawn_active(op, current)

    def _stop(self, gen: Generation) -> Effect:
        async def stop() -> Done | Failed:
            if await self.supervisor.stop(gen, targets.stop_grace_s(self.store, gen)):
                return Done(f"generation {gen.id} gone")
            return Failed(f"{gen.service} generation {gen.id} (pid {gen.pid}) did not stop")

        return stop

