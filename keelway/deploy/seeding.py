"""Seed import and its rollback (SPEC §4 Seed import): operations under the instance lock,
every effect a journaled step with failpoints around it (keelway/deploy/steps.py), the
import journal (keelway/store/seeds.py) the one record that says where an import stands.

Refused before anything changes: a seed that fails verification, an empty one (no
tables, or 0 bytes: unless `allow_empty`), one whose views or triggers name what its
schema lacks, one larger than `SeedLimits.max_bytes` or than the free space allows (a
copy and the laid-down database, each its used pages, plus a reserve). What it brings
(tables and row counts, and whether a -wal beside it was read) is in every report.

Import of a verified SQLite file into instance H:
    store the seed's copy (verified where it lands) → journal + gate closed (one write:
    the row, H's route gated and named the import's, H STOPPED) → fence H (the journal
    holds the generation) → stop H's processes, proven gone → lay the database down at
    home.seed_db_path(H) with its `<db>.seed` marker → the import's key and database
    in H's env file (what was there is in the journal's `env_before`) → open the gate
    (SWAPPED) → lift the import's fence → H started through the verified start path.
A failure or a crash before the gate opens leaves the journal IMPORTING, and an
IMPORTING import is rolled back (now, or by the next boot): it always rolls back.

Rollback, driven by the journal alone; each step idempotent, the journal's state where
a later pass resumes:
    importing | swapped → 1. close the gate (ROLLING_BACK, a new fence generation)
    rolling-back        → 2. fence (again, if someone lifted it) and stop H
                          3. retire the import's key against `env_before`, then remove
                             the import's local data (database, side files, marker last)
                          4. the original route back (CLEANUP_PENDING, one write)
                          5. lift that fence generation
    cleanup-pending     → 6. delete the seed's copy, and H's replica if it is the import's
                          7. delete the journal row
                          8. the record's seed from aborted to rolled back (its CAS)
Only the import's own row (the route at H naming the seed) is acted on. Any other row
at H is someone else's: the rollback holds there, touching nothing, and lifts only its
own fence generation. With no row at H, the local data is removed only when its marker
names this seed (and H still has no row); otherwise it is left. A journal state this
keelway does not know is left alone and reported.

Crash windows: each step is journaled before its effect and the store's own writes are
one transaction each, so a crash between any two leaves a journal state from which the
next pass redoes the interrupted step (all of them are idempotent) and goes on. The
seed's copy is stored before the journal row exists: a crash there leaves a copy no
journal names, which `resume` removes at boot.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import assert_never

from keelway import failpoints, names
from keelway.data import seed as files
from keelway.data import snapshots
from keelway.data.objects import NotFound, ObjectStore, ObjectStoreError, manifest_key
from keelway.data.verify import Damaged
from keelway.deploy import instances, planned, targets
from keelway.deploy.errors import OperationError, UserError, checked
from keelway.deploy.fences import refuse_if_fenced
from keelway.deploy.locks import Locks
from keelway.deploy.outcome import Outcome, Result
from keelway.deploy.planned import Plan, PlannedStep
from keelway.deploy.publisher import Publisher
from keelway.deploy.recovery import Recovery
from keelway.deploy.steps import Done, Effect, Failed, Steps
from keelway.durable import TEMP_PREFIX
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.reconcile.plan import Pass
from keelway.runtime.supervisor import Supervisor
from keelway.store import Conflict, Store
from keelway.store.lifecycle import RouteState
from keelway.store.records import Instance, Operation
from keelway.store.seeds import (
    ABANDONED,
    ImportJournal,
    ImportState,
    SeedRecord,
    SeedState,
    record_key,
)

log = logging.getLogger("keelway.seeding")

_POINTS = ("store", "journal", "fence", "sync", "lay-down", "key", "open", "unfence", "close",
           "retire-key", "remove-data", "restore", "delete-copy", "delete-replica",
           "forget", "record")
failpoints.declare(*(f"seed.{p}.{w}" for p in _POINTS for w in ("before", "after")))

# Deletes a seed import's own replica of an instance (host, seed) in the object store
# (keelway/data/replicas.py Replicas.delete); None: this box keeps no replicas.
DeleteReplica = Callable[[str, str], Awaitable[object]]
Progress = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class SeedLimits:
    # The largest seed an import takes, by its used pages (what laying it down writes).
    max_bytes: int = 32 << 30
    # What must stay free on a filesystem after the seed's copy and its database.
    reserve_bytes: int = 256 << 20


class SeedTooLarge(UserError):
    code = "seed-too-large"


class SeedOutcome(enum.StrEnum):
    IMPORTED = "imported"
    ROLLED_BACK = "rolled-back"
    # Someone else's row at the host, or one that changed under the fence: untouched.
    HELD = "held"
    # A step could not be done now (a stop, a read); the journal resumes it later.
    DEFERRED = "deferred"
    UNKNOWN_STATE = "unknown-state"
    NOTHING = "nothing"  # no import journaled at the host
    DRY_RUN = "dry-run"


@dataclass(frozen=True)
class SeedReport:
    host: str
    seed: str | None
    outcome: SeedOutcome
    reason: str | None = None
    plan: tuple[str, ...] = field(default=())
    # The planned steps the lines of `plan` are (a dry run's).
    steps: tuple[PlannedStep, ...] = field(default=())
    # What the import brings (an import and its dry run), None for a rollback.
    contents: files.Contents | None = None

    def view(self) -> dict[str, object]:
        return {"host": self.host, "seed": self.seed, "outcome": self.outcome.value,
                "reason": self.reason, "plan": list(self.plan),
                "steps": [step.view() for step in self.steps],
                "contents": self.contents.view() if self.contents else None}


async def _quiet(_step: str) -> None:
    return None


@dataclass(frozen=True)
class SnapshotSource:
    """A seed given as a stored snapshot (names.seed_snapshot): `host` None means
    whichever instance holds a snapshot of that id, which must be exactly one."""

    host: str | None
    snap_id: str

    def __str__(self) -> str:
        return f"{self.host}/{self.snap_id}" if self.host else self.snap_id


class Seeding:
    def __init__(self, store: Store, home: Home, supervisor: Supervisor, publisher: Publisher,
                 locks: Locks, recovery: Recovery,
                 delete_replica: DeleteReplica | None = None,
                 objects: ObjectStore | None = None,
                 limits: SeedLimits = SeedLimits()) -> None:
        self.store = store
        self.home = home
        self.supervisor = supervisor
        self.publisher = publisher
        self.locks = locks
        self.recovery = recovery
        self.journal = recovery.journal
        self.objects = objects
        self.delete_replica = delete_replica
        self.limits = limits

    # -- import ------------------------------------------------------------------------

    def _refuse_journaled(self, host: str) -> None:
        held = self.store.get_import(host)
        if held is not None:
            raise UserError(f"{host} has import {held.seed} journaled ({held.state}); a "
                            "second import waits until it is rolled back",
                            hint=f"`keelway seed rollback {host}` first")

    def _refuse_import(self, host: str, source: Path,
                       allow_empty: bool) -> tuple[files.Verified, files.Contents]:
        """Every reason to refuse, checked before anything changes; what the seed is
        and brings."""
        if not source.is_absolute():
            raise UserError(f"{source} is not an absolute path",
                            hint="give the seed's path from / (the CLI does this)")
        self._refuse_journaled(host)
        refuse_if_fenced(self.store, host, "take a seed import")
        nested = self.home.seed_db_path(host)
        if nested.exists() or files.marker_of(nested).exists():
            raise UserError(f"{nested} holds a database no import journal names",
                            hint="move it away; keelway does not remove data it cannot "
                                 "prove is an import's")
        try:
            verified = files.verify_sqlite(source)
            contents = files.inspect(source)
        except files.SeedRefused as exc:
            raise UserError(f"seed refused: {exc.message}; nothing was changed",
                            hint="give a copy that opens, passes `PRAGMA "
                                 "integrity_check` and whose views and triggers name "
                                 "only what it holds") from None
        if contents.empty and not allow_empty:
            what = "0 bytes" if contents.apparent_bytes == 0 else "no tables"
            raise UserError(f"seed refused: {source} is empty ({what}): the instance "
                            "would serve an empty database; nothing was changed",
                            hint="give --allow-empty to import an empty database on "
                                 "purpose")
        self._refuse_size(host, source, contents)
        return verified, contents

    def _refuse_size(self, host: str, source: Path, contents: files.Contents) -> None:
        """Over the largest seed, or more than the free space allows: the stored copy
        and the laid-down database each take the seed's used pages."""
        need = contents.need_bytes
        if need > self.limits.max_bytes:
            raise SeedTooLarge(f"seed refused: {source} holds {need} bytes of data, over "
                               f"the largest seed an import takes ({self.limits.max_bytes} "
                               "bytes); nothing was changed")
        wanted: dict[int, tuple[Path, int]] = {}
        for place in (self.home.seeds_dir, self.home.seed_db_path(host).parent):
            while not place.exists():
                place = place.parent
            device = place.stat().st_dev
            wanted[device] = (place, wanted.get(device, (place, 0))[1] + need)
        for place, total in wanted.values():
            stat = os.statvfs(place)
            free = stat.f_bavail * stat.f_frsize
            if total + self.limits.reserve_bytes > free:
                raise SeedTooLarge(
                    f"seed refused: importing {source} takes {total} bytes on the "
                    f"filesystem of {place} (its copy and its database, {need} bytes "
                    f"each) and {self.limits.reserve_bytes} must stay free, but {free} "
                    "are; nothing was changed", hint="free some space, or give a "
                    "smaller seed")

    # -- a snapshot as the seed ----------------------------------------------------------

    def _holder(self, objects: ObjectStore, source: SnapshotSource) -> str:
        """The instance whose snapshot `source` names; UserError when none or (with no
        host given) more than one holds a snapshot of that id."""
        if source.host is not None:
            return source.host
        holders = sorted({
            parts[1] for key in objects.list("instances/")
            if len(parts := key.split("/")) == 4
            and key == manifest_key(parts[1], source.snap_id)})
        if not holders:
            raise UserError(f"no snapshot {source.snap_id} is stored; nothing was changed",
                            hint="`keelway db snapshots HOST` lists an instance's")
        if len(holders) > 1:
            raise UserError(f"snapshot id {source.snap_id} is stored for "
                            f"{', '.join(holders)}; nothing was changed",
                            hint=f"name the instance: `{holders[0]}/{source.snap_id}`")
        return holders[0]

    @contextlib.asynccontextmanager
    async def _fetched(self, source: SnapshotSource) -> AsyncIterator[Path]:
        """The snapshot downloaded beside the seeds' copies and verified against its
        manifest (sha256, size) and by SQLite; removed after. A temp file a crash
        leaves is swept at boot (`_sweep_copies`). Refusals change nothing."""
        objects = self.objects
        if objects is None:
            raise UserError("this box has no object store, so no snapshot can be a seed")
        try:
            holder = self._holder(objects, source)
            self.home.seeds_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            dest = self.home.seeds_dir / (
                f"{TEMP_PREFIX}snapshot-{source.snap_id}-{os.urandom(4).hex()}.db")
            try:
                await asyncio.to_thread(snapshots.fetch, objects, holder, source.snap_id,
                                        dest)
            except NotFound:
                raise UserError(f"no snapshot {source.snap_id} of {holder} is stored; "
                                "nothing was changed",
                                hint=f"`keelway db snapshots {holder}` lists them") from None
            except Damaged as exc:
                raise UserError(f"seed refused: snapshot {holder}/{source.snap_id} failed "
                                f"verification ({exc.message}); nothing was changed",
                                hint="take another snapshot, or give an SQLite file") from None
        except ObjectStoreError as exc:
            raise OperationError(f"the object store: {exc}; nothing was changed") from None
        try:
            yield dest
        finally:
            # Opening a WAL-mode file for the copy leaves its -wal and -shm beside it.
            for suffix in ("", "-wal", "-shm", "-journal"):
                Path(f"{dest}{suffix}").unlink(missing_ok=True)

    async def import_seed(self, host: str, source: Path | SnapshotSource, *,
                          dry_run: bool = False, allow_empty: bool = False,
                          progress: Progress = _quiet) -> SeedReport:
        """Import `source`, an SQLite file or a stored snapshot (fetched and verified
        first), into `host`. After return the import is in effect (IMPORTED) with
        `host` started on it if it was running or parked, or, when it failed past its
        journal, rolled back (and the error raised). A refusal (bad name, damaged seed
        or snapshot, a journaled import, a fence) changes nothing."""
        if isinstance(source, Path):
            return await self._import_file(host, source, str(source), dry_run,
                                           allow_empty, progress)
        instances.named(self.store, host)
        self._refuse_journaled(host)
        async with self._fetched(source) as path:
            return await self._import_file(host, path, f"snapshot {source}", dry_run,
                                           allow_empty, progress)

    async def _import_file(self, host: str, source: Path, said: str, dry_run: bool,
                           allow_empty: bool, progress: Progress) -> SeedReport:
        inst = instances.named(self.store, host)
        _, contents = self._refuse_import(host, source, allow_empty)
        if dry_run:
            plan = plan_import(self.store, self._import_request(host, said))
            return SeedReport(host, None, SeedOutcome.DRY_RUN, contents=contents,
                              plan=plan.lines(), steps=plan.steps)
        seed = files.mint_seed_id()
        async with self.locks.instance(host):
            await self.recovery.converge(host, Pass.MUTATION)
            inst = instances.named(self.store, host)
            verified, contents = self._refuse_import(host, source, allow_empty)
            plan = plan_import(self.store, self._import_request(host, said))

            async def work(op: Operation) -> Result:
                return await self._import(op, inst, seed, source, verified, progress, plan)

            result = await self.journal.journaled(inst.app, host, OpKind.SEED_IMPORT, work)
            journal = self.store.get_import(host)
            if journal is not None and journal.seed == seed and (
                    journal.known is ImportState.IMPORTING):
                # It failed before its gate opened: an import always rolls back.
                undone = await self._rollback_locked(host)
                raise OperationError(f"{host}: seed import failed ({result.reason}); "
                                     f"rolled back: {undone.outcome.value}",
                                     hint=f"see `keelway ops {inst.app} --instance {host}`")
            if result.outcome is not Outcome.DONE:
                raise OperationError(f"{host}: seed import failed: {result.reason}")
            await self.recovery.restart_active(host)
            targets.link_current(self.store, self.home, host)
        return SeedReport(host, seed, SeedOutcome.IMPORTED, contents=contents)

    async def _import(self, op: Operation, inst: Instance, seed: str, source: Path,
                      verified: files.Verified, progress: Progress, plan: Plan) -> Result:
        """Run `plan` (`plan_import`): each step's effect bound by its kind."""
        host = inst.host
        steps = Steps(self.store, op.id)
        copy = self.home.seed_copy(seed)
        db = self.home.seed_db_path(host)
        stored: list[files.Verified] = []
        fenced: list[ImportJournal] = []
        before: dict[str, str | None] = {}
        replicas = self.recovery.replicas

        async def store_copy() -> Done | Failed:
            try:
                stored.append(files.store_copy(source, copy))
            except files.SeedRefused as exc:
                return Failed(exc.message)
            return Done(f"{seed}: {verified.size_bytes} bytes verified")

        async def begin() -> Done:
            self.store.begin_import(host, seed, env_before=before, sha256=stored[0].sha256)
            await self._publish(host)
            return Done(seed)

        async def fence() -> Done:
            fenced.append(self.store.fence_import(host, seed))
            return Done(f"generation {fenced[0].fence_gen}")

        async def sync() -> Done | Failed:
            # H's own database, every process of H gone: its replica is current and
            # then left alone until the rollback (the import's goes elsewhere).
            assert replicas is not None
            failed = await replicas.stop(host, sync=True)
            return Done("synced") if failed is None else Failed(failed)

        async def lay_down() -> Done | Failed:
            try:
                files.lay_down(copy, db, seed, stored[0].sha256)
            except files.SeedRefused as exc:
                return Failed(exc.message)
            return Done(str(db))

        async def key() -> Done:
            minted = files.write_import_env(self.home.env_file(host), db, before)
            return Done("minted" if minted else "kept")

        async def open_gate() -> Done:
            self.store.open_import_gate(host, seed)
            return Done()

        for step in plan.steps:
            if step.delegated:
                continue  # the start, after the operation (`_import_file`)
            match step.kind:
                case StepKind.SEED_STORE:
                    effect: Effect = store_copy
                case StepKind.SEED_JOURNAL:
                    before.update(files.env_before(self.home.env_file(host)))
                    effect = begin
                case StepKind.SEED_FENCE:
                    effect = fence
                case StepKind.STOP:
                    effect = self._stop_effect(step)
                case StepKind.REPLICA_STOP:
                    effect = sync
                case StepKind.SEED_LAY_DOWN:
                    effect = lay_down
                case StepKind.SEED_KEY:
                    effect = key
                case StepKind.SEED_OPEN:
                    effect = open_gate
                case StepKind.SEED_UNFENCE:
                    effect = self._unfence_effect(host, fenced[0].fence_gen)
                case _:
                    raise AssertionError(f"an import plans no {step.kind} step")
            if (failed := await planned.run(steps, step, effect)) is not None:
                return Result(Outcome.FAILED, failed.reason)
            match step.kind:
                case StepKind.SEED_STORE:
                    await progress("stored")
                case StepKind.SEED_FENCE:
                    await progress("fenced")
                case StepKind.SEED_UNFENCE:
                    await progress("open")
                case _:
                    pass
        self.store.add_event("seed", f"seed {seed} imported", app=inst.app, instance=host)
        return Result(Outcome.DONE)

    def _import_request(self, host: str, said: str) -> ImportRequest:
        return ImportRequest(host, said, self.home.seed_db_path(host),
                             replicating=self.recovery.replicas is not None)

    # -- rollback ----------------------------------------------------------------------

    async def rollback(self, host: str, *, dry_run: bool = False) -> SeedReport:
        """Roll back the import journaled at `host`, from whatever state its journal is
        in, under the instance lock; then start the instance on its own data if it was
        running. The report says how far it got (HELD, DEFERRED: the journal keeps the
        rest for a later pass; UNKNOWN_STATE: nothing was done)."""
        checked(names.HOST, host)
        if self.store.get_import(host) is None:
            instances.named(self.store, host)  # NotFoundError for a host that is nothing at all
        if dry_run:
            return self._plan(host)
        async with self.locks.instance(host):
            await self.recovery.converge(host, Pass.MUTATION)
            report = await self._rollback_locked(host)
            if report.outcome is SeedOutcome.ROLLED_BACK:
                await self.recovery.restart_active(host)
                targets.link_current(self.store, self.home, host)
        return report

    def _plan(self, host: str) -> SeedReport:
        """The dry run: the plan the rollback would run now, from the records."""
        journal = self.store.get_import(host)
        if journal is None:
            return SeedReport(host, None, SeedOutcome.DRY_RUN, "no import is journaled")
        if journal.known is None:
            return SeedReport(host, journal.seed, SeedOutcome.DRY_RUN,
                              f"unknown journal state {journal.state!r}: left alone")
        plan = plan_rollback(self.store, host)
        if plan.refused is not None:
            return SeedReport(host, journal.seed, SeedOutcome.DRY_RUN, plan.refused)
        return SeedReport(host, journal.seed, SeedOutcome.DRY_RUN,
                          f"would roll back from {journal.state}", plan.lines(), plan.steps)

    async def _rollback_locked(self, host: str) -> SeedReport:
        journal = self.store.get_import(host)
        if journal is None:
            return SeedReport(host, None, SeedOutcome.NOTHING, "no import is journaled")
        if journal.known is None:
            return self._unknown(journal)
        app = journal.record.partition("/")[0]
        reports: list[SeedReport] = []

        plan = plan_rollback(self.store, host)

        async def work(op: Operation) -> Result:
            reports.append(await self._roll_back(op, journal, plan))
            report = reports[0]
            if report.outcome is SeedOutcome.ROLLED_BACK:
                return Result(Outcome.DONE)
            return Result(Outcome.FAILED, f"{report.outcome.value}: {report.reason}")

        result = await self.journal.journaled(app, host, OpKind.SEED_ROLLBACK, work)
        if reports:
            return reports[0]
        return SeedReport(host, journal.seed, SeedOutcome.DEFERRED, result.reason)

    def _unknown(self, journal: ImportJournal) -> SeedReport:
        why = (f"import {journal.seed} is journaled in an unknown state "
               f"{journal.state!r}; it is left alone")
        log.warning("%s: %s", journal.instance, why)
        self.store.add_event("seed", why, app=journal.record.partition("/")[0],
                             instance=journal.instance)
        return SeedReport(journal.instance, journal.seed, SeedOutcome.UNKNOWN_STATE, why)

    async def _roll_back(self, op: Operation, journal: ImportJournal,
                         plan: Plan) -> SeedReport:
        """Run `plan` (`plan_rollback`). The plan is what the journal's state calls for
        when nothing moves under the fence; the records are read again where the header
        says so (the row at the host before its data goes, the record before the
        replica goes), and what they say then stops or narrows the run."""
        steps = Steps(self.store, op.id)
        host, seed = journal.instance, journal.seed
        if journal.known is None:
            return self._unknown(journal)
        row = self.store.row_at(host)
        if journal.known is not ImportState.CLEANUP_PENDING and (
                row is not None and row.seed != seed):
            # A fence an earlier pass kept for this rollback must not hold the host for
            # whoever owns it now: only our generation is lifted.
            if journal.known is ImportState.ROLLING_BACK and journal.fence_gen:
                self.store.unfence(host, journal.fence_gen)
            return self._held(journal, "the route at the host is not the import's, so "
                                       "nothing there is touched")
        db = self.home.seed_db_path(host)
        env_file = self.home.env_file(host)
        current = [journal]

        async def close() -> Done:
            self.store.close_import_gate(host, seed)
            await self._publish(host)
            return Done()

        async def fence() -> Done:
            current[0] = self.store.fence_import(host, seed)
            return Done(f"generation {current[0].fence_gen}")

        async def retire() -> Done:
            changed = files.retire_import_env(env_file, journal.env_before)
            return Done("restored" if changed else "was restored")

        async def remove() -> Done:
            removed = files.remove_local(db)
            return Done(", ".join(removed) or "nothing left")

        async def restore() -> Done | Failed:
            try:
                self.store.restore_import_route(host, seed)
            except Conflict as exc:
                return Failed(str(exc))
            await self._publish(host)
            return Done()

        async def delete_copy() -> Done:
            copy = self.home.seed_copy(seed)
            existed = copy.exists()
            copy.unlink(missing_ok=True)
            return Done("deleted" if existed else "gone already")

        async def delete_replica() -> Done | Failed:
            if self.delete_replica is None:
                return Done("no replicas on this box")
            try:
                # The import's own replica (replicas/<host>/<seed>), never the host's:
                # that one stayed as it was through the import.
                await self.delete_replica(host, seed)
            except ObjectStoreError as exc:
                return Failed(f"the import's replica could not be deleted: {exc}")
            return Done("deleted")

        async def forget() -> Done:
            return Done("deleted" if self.store.delete_import(host, seed) else "gone")

        async def cas() -> Done:
            moved = self.store.cas_seed_record(journal.record, seed,
                                               frozenset({SeedState.ABORTED}),
                                               SeedState.ROLLED_BACK)
            return Done("rolled back" if moved else "the record names another seed "
                        "or is done")

        skip: set[StepKind] = set()
        for step in plan.steps:
            if step.kind in skip:
                continue
            match step.kind:
                case StepKind.SEED_CLOSE:
                    effect: Effect = close
                case StepKind.SEED_FENCE:
                    effect = fence
                case StepKind.STOP:
                    effect = self._stop_effect(step)
                case StepKind.SEED_RETIRE_KEY:
                    # The row again, under the fence and with every process gone.
                    stopped = await self._before_data(current[0], db)
                    if isinstance(stopped, SeedReport):
                        return stopped
                    if stopped:
                        skip |= {StepKind.SEED_RETIRE_KEY, StepKind.SEED_REMOVE_DATA}
                        continue
                    effect = retire
                case StepKind.SEED_REMOVE_DATA:
                    effect = remove
                case StepKind.SEED_RESTORE:
                    effect = restore
                case StepKind.SEED_UNFENCE:
                    effect = self._unfence_effect(host, current[0].fence_gen)
                case StepKind.SEED_DELETE_COPY:
                    effect = delete_copy
                case StepKind.SEED_DELETE_REPLICA:
                    # Read again right before the replica: it is keyed by host, not seed.
                    ours, why = replica_is_the_imports(journal, self.store.seed_record(host))
                    if not ours:
                        log.info("%s: import %s: the replica is left alone: %s", host,
                                 seed, why)
                        continue
                    effect = delete_replica
                case StepKind.SEED_FORGET:
                    effect = forget
                case StepKind.SEED_RECORD:
                    effect = cas
                case _:
                    raise AssertionError(f"a rollback plans no {step.kind} step")
            if (failed := await planned.run(steps, step, effect)) is None:
                continue
            match step.kind:
                case StepKind.STOP | StepKind.SEED_DELETE_REPLICA:
                    # Under the fence still (a stop), or CLEANUP_PENDING (the replica):
                    # the next pass finds it its own and resumes.
                    return SeedReport(host, seed, SeedOutcome.DEFERRED, failed.reason)
                case StepKind.SEED_RESTORE:
                    self._lift(current[0])
                    return self._held(current[0], failed.reason)
                case _:
                    raise OperationError(failed.reason)
        self.store.add_event("seed", f"seed {seed} rolled back",
                             app=journal.record.partition("/")[0], instance=host)
        return SeedReport(host, seed, SeedOutcome.ROLLED_BACK)

    async def _before_data(self, journal: ImportJournal, db: Path) -> SeedReport | bool:
        """Step 3's guard, the row at the host read again under the fence: False when
        the import's data goes (the row is the import's gated one, or there is none and
        the marker names this seed), True when it is left and the rollback goes on (no
        row, and the marker names another seed or none), a report when the rollback
        stops here (the row changed under the fence; a marker that cannot be read, or a
        row that appeared: deferred), its fence lifted."""
        host, seed = journal.instance, journal.seed
        row = self.store.row_at(host)
        if row is not None:
            if row.seed != seed or row.state is not RouteState.GATED:
                self._lift(journal)
                return self._held(journal, "the route changed under the fence, so nothing "
                                           "there is touched")
            return False
        try:
            named = files.local_seed_id(db)
        except OSError as exc:
            self._lift(journal)
            return SeedReport(host, seed, SeedOutcome.DEFERRED,
                              f"the seed marker beside {db} cannot be read: {exc}")
        if named != seed:
            log.info("%s: import %s has no route; %s is left: its marker names %r",
                     host, seed, db, named)
            return True
        if self.store.row_at(host) is not None:
            self._lift(journal)
            return SeedReport(host, seed, SeedOutcome.DEFERRED,
                              "a route appeared at the host; its data is left")
        return False

    # -- boot ----------------------------------------------------------------------------

    async def resume(self) -> list[SeedReport]:
        """At boot, after the reconciler's pass: an import interrupted before its gate
        opened, and every rollback under way, are carried through to rolled back; an
        import in effect keeps going (its fence lifted if a crash kept it); an unknown
        state is reported. Copies of seeds no journal names (a crash before the journal
        row) are removed."""
        reports = []
        for journal in self.store.list_imports():
            try:
                reports.append(await self._resume_one(journal))
            except OperationError as exc:
                log.warning("boot: seed import at %s: %s", journal.instance, exc.message)
        self._sweep_copies()
        return reports

    async def _resume_one(self, journal: ImportJournal) -> SeedReport:
        state = journal.known
        match state:
            case None:
                return self._unknown(journal)
            case ImportState.SWAPPED:
                host = journal.instance
                async with self.locks.instance(host):
                    if journal.fence_gen is not None:
                        self.store.unfence(host, journal.fence_gen)
                    await self.recovery.restart_active(host)
                return SeedReport(host, journal.seed, SeedOutcome.IMPORTED)
            case (ImportState.IMPORTING | ImportState.ROLLING_BACK
                  | ImportState.CLEANUP_PENDING):
                return await self.rollback(journal.instance)
            case _:
                assert_never(state)

    def _sweep_copies(self) -> None:
        """At boot, under the home lock and before the API serves: only this control
        plane writes seeds' copies, so no temp file here has a live writer."""
        named = {j.seed for j in self.store.list_imports()}
        with contextlib.suppress(FileNotFoundError):
            for entry in self.home.seeds_dir.iterdir():
                seed = entry.name.removesuffix(".db")
                if entry.name.startswith(TEMP_PREFIX) or (
                        names.SEED_ID.accepts(seed) and entry.suffix == ".db"
                        and seed not in named):
                    entry.unlink(missing_ok=True)

    # -- status --------------------------------------------------------------------------

    def status(self, host: str) -> dict[str, object]:
        """What `seed status` shows; never a value of `env_before`."""
        inst = self.store.get_instance(host)
        journal = self.store.get_import(host)
        if inst is None and journal is None:
            instances.named(self.store, host)
        record = self.store.seed_record(host)
        db = self.home.seed_db_path(host)
        try:
            marker: str | None = files.local_seed_id(db)
        except OSError:
            marker = "unreadable"
        row = self.store.row_at(host)
        return {
            "host": host,
            "journal": None if journal is None else {
                "seed": journal.seed, "state": journal.state,
                "known": journal.known is not None, "fence_generation": journal.fence_gen,
                "record": journal.record, "sha256": journal.sha256,
                "env_before": sorted(n for n, v in journal.env_before.items() if v is not None),
            },
            "record": None if record is None else {
                "seed": record.seed, "state": record.state.value if record.state else None},
            "route": None if row is None else {"state": row.state.value, "seed": row.seed},
            "marker": marker, "database": str(db) if db.exists() else None,
            "fenced": self.store.fenced(host) if inst is not None else False,
        }

    # -- shared steps --------------------------------------------------------------------

    def _unfence_effect(self, host: str, generation: int | None) -> Effect:
        async def unfence() -> Done:
            if generation is None:
                return Done("no fence")
            _, lifted = self.store.unfence(host, generation)
            return Done(f"generation {generation} " + ("lifted" if lifted else "not held"))

        return unfence

    def _stop_effect(self, step: PlannedStep) -> Effect:
        gen = self.store.get_generation(step.before_gen or 0)
        if gen is None:
            async def gone() -> Done:
                return Done("gone already")

            return gone
        return targets.stop_effect(self.store, self.supervisor, gen)

    def _lift(self, journal: ImportJournal) -> None:
        if journal.fence_gen is not None:
            self.store.unfence(journal.instance, journal.fence_gen)

    def _held(self, journal: ImportJournal, why: str) -> SeedReport:
        log.warning("%s: import %s is not rolled back: %s", journal.instance,
                    journal.seed, why)
        return SeedReport(journal.instance, journal.seed, SeedOutcome.HELD, why)

    async def _publish(self, host: str) -> None:
        try:
            await self.publisher.publish(host)
        except OperationError as exc:
            # The store's table is the truth: boot and the periodic pass publish it.
            log.warning("%s: publish: %s", host, exc.message)


def replica_is_the_imports(journal: ImportJournal,
                           record: SeedRecord | None) -> tuple[bool, str]:
    """Whether the host's replica is the import's to delete (step 6): only while the
    record under the journal's key, if there is one, names this seed abandoned. A
    record naming another seed or none, or a record of the host under another key,
    means the replica is someone else's."""
    if record is None:
        return True, ""
    if record_key(record.app, record.host) != journal.record:
        return False, f"the record {record_key(record.app, record.host)} holds the host"
    if record.seed != journal.seed:
        return False, "its record no longer names this seed"
    if record.state not in ABANDONED:
        return False, f"its record names this seed as {record.state}, not abandoned"
    return True, ""


# -- plans -------------------------------------------------------------------------------

def _seed_step(kind: StepKind, point: str, says: str, phase: int = 0) -> PlannedStep:
    return PlannedStep(kind, says, before=(f"seed.{point}.before",),
                       after=(f"seed.{point}.after",), phase=phase)


@dataclass(frozen=True)
class ImportRequest:
    host: str
    said: str  # the seed as the operator named it (a path, a snapshot)
    seed_db: Path  # where the seeded database is laid down
    # Whether this box replicates: the host's own replica is synced and stopped first.
    replicating: bool


def plan_import(store: Store, request: ImportRequest) -> Plan:
    """The steps of a seed import into `request.host`, from its records (reads only):
    the header's sequence, a STOP for each live generation, and the start on the seed
    (delegated: the verified start path, after the operation) when ACTIVE names
    something to start."""
    host = request.host
    steps = [
        _seed_step(StepKind.SEED_STORE, "store", f"verify and store a copy of {request.said}"),
        _seed_step(StepKind.SEED_JOURNAL, "journal",
                   f"journal the import and close {host}'s gate"),
        _seed_step(StepKind.SEED_FENCE, "fence", f"fence {host}"),
        *(PlannedStep(StepKind.STOP, f"stop {gen.service} generation {gen.id}, proven gone",
                      service=gen.service, before_gen=gen.id)
          for gen in store.live_generations(host)),
    ]
    if request.replicating:
        steps.append(_seed_step(StepKind.REPLICA_STOP, "sync",
                                f"sync {host}'s own replica and stop its replicator"))
    steps += [
        _seed_step(StepKind.SEED_LAY_DOWN, "lay-down",
                   f"lay down {request.seed_db} with its seed marker"),
        _seed_step(StepKind.SEED_KEY, "key", "mint the import's instance key"),
        _seed_step(StepKind.SEED_OPEN, "open", "open the gate"),
        _seed_step(StepKind.SEED_UNFENCE, "unfence", "lift the import's fence"),
        *(PlannedStep(StepKind.SPAWN, f"start {active.service} on the seed through the "
                      "verified start path", service=active.service, delegated=True)
          for active in store.list_active(host)),
    ]
    return Plan(tuple(steps))


def plan_rollback(store: Store, host: str) -> Plan:
    """The steps of the rollback of the import journaled at `host`, from its journal's
    state (reads only), numbered as the module header numbers them (a dry run prints
    one line per number). Refused, with no steps, when there is no import, its state is
    unknown, or the route at the host is someone else's."""
    journal = store.get_import(host)
    if journal is None:
        return Plan(refused="no import is journaled")
    state = journal.known
    seed = journal.seed
    steps: list[PlannedStep] = []
    match state:
        case None:
            return Plan(refused=f"unknown journal state {journal.state!r}: left alone")
        case ImportState.IMPORTING | ImportState.SWAPPED | ImportState.ROLLING_BACK:
            row = store.row_at(host)
            if row is not None and row.seed != seed:
                return Plan(refused="the route at the host is not the import's, so "
                                    "nothing there is touched")
            if state is not ImportState.ROLLING_BACK:
                steps.append(_seed_step(StepKind.SEED_CLOSE, "close",
                                        "close the gate under a new fence generation", 1))
            steps.append(_seed_step(StepKind.SEED_FENCE, "fence", f"fence {host}", 2))
            steps += [PlannedStep(StepKind.STOP, f"stop {gen.service} generation {gen.id}",
                                  service=gen.service, before_gen=gen.id, phase=2)
                      for gen in store.live_generations(host)]
            steps += [
                _seed_step(StepKind.SEED_RETIRE_KEY, "retire-key",
                           "retire the import's key", 3),
                _seed_step(StepKind.SEED_REMOVE_DATA, "remove-data",
                           "remove the import's local data", 3),
                _seed_step(StepKind.SEED_RESTORE, "restore", "restore the original route", 4),
            ]
        case ImportState.CLEANUP_PENDING:
            pass
        case _:
            assert_never(state)
    # Again from CLEANUP_PENDING: a crash between the restore and the lift leaves the
    # journal's generation held, and only that generation is lifted.
    steps.append(_seed_step(StepKind.SEED_UNFENCE, "unfence", "lift the fence", 5))
    if names.SEED_ID.accepts(seed):
        steps.append(_seed_step(StepKind.SEED_DELETE_COPY, "delete-copy",
                                "delete the seed's copy", 6))
        # Whether the replica is the import's is read when the step comes (the
        # rollback's own close aborts the record): planned always, run when it is.
        steps.append(_seed_step(StepKind.SEED_DELETE_REPLICA, "delete-replica",
                                "delete the import's replica, if its record still names "
                                "this seed abandoned", 6))
    steps += [_seed_step(StepKind.SEED_FORGET, "forget", "delete the journal row", 7),
              _seed_step(StepKind.SEED_RECORD, "record", "mark the record rolled back", 8)]
    return Plan(tuple(steps))
