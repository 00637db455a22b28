"""Snapshots of an instance's database: taken and checked, listed, verified, taken on
a schedule and pruned to `keep`; the drill of the newest one.

A snapshot is taken under the instance lock (so no restore swaps the file under the
copy), the copy and its checks in a thread (keelway/data/snapshots.py). It is not an
operation of the instance: it changes nothing convergence reads, and a crash leaves
only a temp file (swept at boot) or an unlisted copy (pruned). A drill fetches the
newest snapshot to a temp file and verifies it, touching nothing else
(keelway/deploy/replication.py drills both copies and records the events). Restoring
one is keelway/deploy/restore.py.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from keelway import names
from keelway.builds.manifest import DataSpec
from keelway.clock import Clock
from keelway.data import snapshots
from keelway.data.objects import ObjectNotFound, ObjectStore, ObjectStoreError
from keelway.data.replicas import in_effect
from keelway.data.snapshots import NoDatabase, SnapshotManifest
from keelway.data.verify import Damaged
from keelway.deploy import instances, targets
from keelway.deploy.errors import NotFoundError, OperationError, UserError, checked
from keelway.deploy.locks import Locks
from keelway.home import Home
from keelway.store import Store
from keelway.store.records import Generation

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


def check_id(snap_id: str) -> str:
    return checked(names.SNAPSHOT_ID, snap_id)


@dataclass(eq=False)
class Snapshots:
    store: Store
    home: Home
    locks: Locks
    clock: Clock
    objects: ObjectStore

    def __post_init__(self) -> None:
        # When each instance's newest snapshot was taken, as the schedule last saw it
        # (read from the object store once per instance, then kept up by the schedule).
        self._last: dict[str, float] = {}
        self._specs: dict[tuple[str, str], DataSpec] = {}

    def _release(self, host: str) -> int | None:
        for active in self.store.generations.list_active(host):
            gen = self.store.generations.get_generation(active.generation_id)
            if gen is not None:
                return gen.release
        return None

    async def snapshot(self, host: str) -> SnapshotManifest:
        """Take a verified snapshot of `host`'s database (running or parked)."""
        instances.named(self.store, host)
        async with self.locks.instance(host):
            release = self._release(host)
            try:
                # The database the app uses now: the seed's while an import is in
                # effect (one rule, replicas.in_effect), so a snapshot is what it served.
                made = await asyncio.to_thread(
                    snapshots.take, self.objects, self.home, host,
                    now_s=self.clock.now(), release=release,
                    db=in_effect(self.store, self.home, host).db)
            except NoDatabase as exc:
                raise NotFoundError(str(exc), hint="the instance has no database yet") from None
            except Damaged as exc:
                raise OperationError(f"the copy of {host} failed its check: {exc.message}",
                                     hint="run `keelway db snapshot` again; if it fails "
                                          "again the database itself may be damaged") from None
            except ObjectStoreError as exc:
                raise ObjectStoreFailed(str(exc), hint="check the object store") from None
        self.store.ops.add_event("snapshot", f"snapshot {made.id} taken ({made.size} bytes)",
                                 app=instances.named(self.store, host).app, instance=host)
        return made

    async def stored(self, host: str) -> list[SnapshotManifest]:
        instances.named(self.store, host)
        try:
            return await asyncio.to_thread(snapshots.list_snapshots, self.objects, host)
        except ObjectStoreError as exc:
            raise ObjectStoreFailed(str(exc), hint="check the object store") from None

    async def verify(self, host: str, snap_id: str) -> SnapshotManifest:
        """Fetch snapshot `snap_id` and check it; SnapshotRefused if it fails."""
        instances.named(self.store, host)
        check_id(snap_id)
        try:
            return await asyncio.to_thread(snapshots.verify_stored, self.objects, host,
                                           snap_id, self.home.data_dir(host))
        except ObjectNotFound:
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
        gens = [g for g in self.store.generations.active_generations() if g.instance == host]
        return self._spec_of(gens[0]) if gens else DataSpec()

    def _spec_of(self, gen: Generation) -> DataSpec:
        key = (gen.app, gen.build_digest)
        if key not in self._specs:  # a build's manifest never changes: read it once
            target = targets.target_of(self.store, gen)
            if target is None:
                return DataSpec()
            self._specs[key] = target.manifest.data
        return self._specs[key]

    def specs_by_host(self) -> dict[str, DataSpec]:
        """Every instance's `[data]` table from one bulk read of ACTIVE (web first)."""
        found: dict[str, DataSpec] = {}
        for gen in self.store.generations.active_generations():
            if gen.instance not in found:
                found[gen.instance] = self._spec_of(gen)
        return found

    async def prune_all(self, dry_run: bool) -> list[tuple[str, str]]:
        """Every instance's snapshots beyond its `keep` (and copies without a manifest)
        removed, unless `dry_run`; returns (host, snapshot id) of each one beyond."""
        removed: list[tuple[str, str]] = []
        specs = self.specs_by_host()
        for inst in self.store.instances.list_instances():
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
        now = self.clock.now()
        taken = []
        for host, spec in sorted(self.specs_by_host().items()):
            db = self.home.db_path(host)
            if spec.snapshot_every_s is None or not db.is_file():
                continue
            last = self._last.get(host)
            if last is None:
                newest = await asyncio.to_thread(snapshots.newest, self.objects, host)
                last = self._last[host] = newest.taken_at if newest else 0.0
            if not due(now, last, spec.snapshot_every_s) or unchanged_since(db, last):
                continue
            inst = self.store.instances.get_instance(host)
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
            await self.clock.sleep(SCHEDULE_S)
            try:
                await self.take_due()
            except Exception:
                # The loop outlives any one pass: a store or disk error is logged, and
                # the next pass tries again.
                log.exception("snapshot schedule pass failed")

    # -- drill -----------------------------------------------------------------------

    async def drill_snapshot(self, host: str) -> SnapshotDrill:
        """Fetch the newest snapshot of `host` to a temp file and verify it (sha256 and
        integrity); nothing else is touched. `snapshot` None: there is none yet."""
        try:
            newest = await asyncio.to_thread(snapshots.newest, self.objects, host)
        except ObjectStoreError as exc:
            return SnapshotDrill(host, None, False, f"the object store: {exc}")
        if newest is None:
            return SnapshotDrill(host, None, None, "no snapshot yet")
        scratch = self.home.data_dir(host)
        if not scratch.is_dir():
            scratch = self.home.root
        try:
            await asyncio.to_thread(snapshots.verify_stored, self.objects, host, newest.id,
                                    scratch)
        except ObjectNotFound:
            return SnapshotDrill(host, newest, False, f"snapshot {newest.id} is gone")
        except Damaged as exc:
            return SnapshotDrill(host, newest, False, exc.message)
        except (ObjectStoreError, OSError) as exc:
            return SnapshotDrill(host, newest, False, f"snapshot {newest.id}: {exc}")
        return SnapshotDrill(host, newest, True, None)


@dataclass(frozen=True)
class SnapshotDrill:
    host: str
    snapshot: SnapshotManifest | None  # the one checked; None: none yet (or unreadable)
    ok: bool | None  # None: skipped
    reason: str | None
