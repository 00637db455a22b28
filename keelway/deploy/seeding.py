"""Seed import and its rollback (SPEC §4 Seed import): operations under the instance lock,
every effect a journaled step with failpoints around it (keelway/deploy/steps.py), the
import journal (keelway/store/imports.py) the one record that says where an import stands.

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
from keelway.data.objects import ObjectNotFound, ObjectStore, ObjectStoreError, manifest_key
from keelway.data.verify import Damaged
from keelway.deploy import instances, targets
from keelway.deploy.crash_restarts import CrashRestarts
from keelway.deploy.errors import OperationError, UserError, checked
from keelway.deploy.fences import refuse_if_fenced
from keelway.deploy.locks import Locks
from keelway.deploy.operation import (
    Bound,
    Ended,
    Plan,
    PlannedStep,
    Ran,
    Runner,
    Spec,
    stop_generation,
)
from keelway.deploy.outcome import Outcome, Result
from keelway.deploy.publisher import Publisher
from keelway.deploy.replica_keeper import ReplicaKeeper
from keelway.deploy.steps import Done, Effect, Failed, Steps
from keelway.durable import TEMP_PREFIX, sqlite_side_paths
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.reconcile.apply import end_interrupted
from keelway.reconcile.plan import Verdict, by_steps
from keelway.runtime.supervisor import Supervisor
from keelway.store import Conflict, Store
from keelway.store.imports import (
    ABANDONED,
    ImportJournal,
    ImportState,
    SeedRecord,
    SeedState,
    record_key,
)
from keelway.store.lifecycle import OpState, RouteState
from keelway.store.records import Generation, Operation

log = logging.getLogger("keelway.seeding")

_POINTS = ("store", "journal", "fence", "sync", "lay-down", "key", "open", "unfence", "close",
           "retire-key", "remove-data", "restore", "delete-copy", "delete-replica",
           "forget", "record")
failpoints.declare(*(f"seed.{p}.{w}" for p in _POINTS for w in ("before", "after")))

# Deletes a seed import's own replica of an instance (host, seed) in the object store
# (keelway/data/replicas.py Replicas.delete); None: this box keeps no replicas.
DeleteReplica = Callable[[str, str], Awaitable[object]]
# A line of an import's progress, awaited: the API streams it before the next step.
AsyncProgress = Callable[[str], Awaitable[None]]


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
                "steps": [step.as_json() for step in self.steps],
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


@dataclass(eq=False)
class Seeding:
    store: Store
    home: Home
    supervisor: Supervisor
    publisher: Publisher
    locks: Locks
    restarts: CrashRestarts
    keeper: ReplicaKeeper
    runner: Runner
    delete_replica: DeleteReplica | None = None
    objects: ObjectStore | None = None
    limits: SeedLimits = SeedLimits()

    # -- import ------------------------------------------------------------------------

    def _refuse_journaled(self, host: str) -> None:
        held = self.store.imports.get_import(host)
        if held is not None:
            raise UserError(f"{host} has import {held.seed} journaled ({held.state}); a "
                            "second import waits until it is rolled back",
                            hint=f"`keelway seed rollback {host}` first")

    def refuse_import(self, host: str, source: Path,
                       allow_empty: bool) -> files.Contents:
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
            files.check_seed(source)
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
        return contents

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
            except ObjectNotFound:
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
            for path in (dest, *sqlite_side_paths(dest)):
                path.unlink(missing_ok=True)

    async def import_seed(self, host: str, source: Path | SnapshotSource, *,
                          dry_run: bool = False, allow_empty: bool = False,
                          progress: AsyncProgress = _quiet) -> SeedReport:
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
                           allow_empty: bool, progress: AsyncProgress) -> SeedReport:
        instances.named(self.store, host)
        contents = self.refuse_import(host, source, allow_empty)
        if dry_run:
            plan = self.runner.dry_run(IMPORT, self._import_request(host, said))
            return SeedReport(host, None, SeedOutcome.DRY_RUN, contents=contents,
                              plan=tuple(step.describe for step in plan.steps),
                              steps=plan.steps)
        request = self._import_request(host, said, seed=files.mint_seed_id(), source=source,
                                       progress=progress, allow_empty=allow_empty)
        await self.runner.run(IMPORT, self, request)
        return SeedReport(host, request.seed, SeedOutcome.IMPORTED, contents=contents)

    def _import_request(self, host: str, said: str, *, seed: str = "",
                        source: Path | None = None, progress: AsyncProgress = _quiet,
                        allow_empty: bool = False) -> ImportRequest:
        return ImportRequest(host, said, self.home.seed_db_path(host),
                             replicating=self.keeper.replicas is not None, seed=seed,
                             source=source, progress=progress, allow_empty=allow_empty)

    async def after_import(self, request: ImportRequest, ran: Ran) -> None:
        """Under the lock, once the import's operation ended: one that failed before its
        gate opened is rolled back now (an import always rolls back); one in effect
        starts the instance on the seed."""
        host = request.host
        reason = ran.result.reason if ran.result is not None else None
        journal = self.store.imports.get_import(host)
        app = ran.plan.app
        if journal is not None and journal.seed == request.seed and (
                journal.known is ImportState.IMPORTING):
            undone = await self._roll_back_held(host)
            raise OperationError(f"{host}: seed import failed ({reason}); "
                                 f"rolled back: {undone.outcome.value}",
                                 hint=f"see `keelway ops {app} --instance {host}`")
        if not ran.done:
            raise OperationError(f"{host}: seed import failed: {reason}")
        self.store.ops.add_event("seed", f"seed {request.seed} imported", app=app, instance=host)
        await self.restarts.restart_active(host)
        targets.link_current(self.store, self.home, host)

    # -- rollback ----------------------------------------------------------------------

    async def rollback(self, host: str, *, dry_run: bool = False) -> SeedReport:
        """Roll back the import journaled at `host`, from whatever state its journal is
        in, under the instance lock; then start the instance on its own data if it was
        running. The report says how far it got (HELD, DEFERRED: the journal keeps the
        rest for a later pass; UNKNOWN_STATE: nothing was done)."""
        checked(names.HOST, host)
        if self.store.imports.get_import(host) is None:
            instances.named(self.store, host)  # NotFoundError for a host that is nothing at all
        if dry_run:
            return self._plan(host)
        request = RollbackRequest(host)
        await self.runner.run(ROLLBACK, self, request)
        assert request.state.said is not None
        return request.state.said

    async def after_rollback(self, request: RollbackRequest, ran: Ran) -> None:
        """Under the lock, once the rollback's operation ended: its report, and a rolled
        back instance started on its own data."""
        said = request.state.said = self._rolled(request, ran)
        if said.outcome is SeedOutcome.ROLLED_BACK:
            await self.restarts.restart_active(request.host)
            targets.link_current(self.store, self.home, request.host)

    def _plan(self, host: str) -> SeedReport:
        """The dry run: the plan the rollback would run now, from the records, one line
        per numbered step of the module header."""
        journal = self.store.imports.get_import(host)
        if journal is None:
            return SeedReport(host, None, SeedOutcome.DRY_RUN, "no import is journaled")
        plan = plan_rollback(self.store, RollbackRequest(host))
        if plan.nothing is not None:
            return SeedReport(host, journal.seed, SeedOutcome.DRY_RUN, plan.nothing)
        return SeedReport(host, journal.seed, SeedOutcome.DRY_RUN,
                          f"would roll back from {journal.state}", rollback_lines(plan),
                          plan.steps)

    async def _roll_back_held(self, host: str) -> SeedReport:
        """The rollback under the lock the caller holds (a failed import's)."""
        request = RollbackRequest(host)
        request.state.origin = self.store.imports.get_import(host)
        return self._rolled(request, await self.runner.run_held(ROLLBACK, self, request))

    def _rolled(self, request: RollbackRequest, ran: Ran) -> SeedReport:
        """What a run of the rollback comes to, as its report."""
        host, origin = request.host, request.state.origin
        if origin is None:
            return SeedReport(host, None, SeedOutcome.NOTHING, "no import is journaled")
        if ran.result is None:
            return self._unknown(origin)
        if request.state.report is not None:
            return request.state.report
        if ran.done:
            return SeedReport(host, origin.seed, SeedOutcome.ROLLED_BACK)
        return SeedReport(host, origin.seed, SeedOutcome.DEFERRED, ran.result.reason)

    def _unknown(self, journal: ImportJournal) -> SeedReport:
        why = (f"import {journal.seed} is journaled in an unknown state "
               f"{journal.state!r}; it is left alone")
        log.warning("%s: %s", journal.instance, why)
        self.store.ops.add_event("seed", why, app=journal.record.partition("/")[0],
                                 instance=journal.instance)
        return SeedReport(journal.instance, journal.seed, SeedOutcome.UNKNOWN_STATE, why)

    def before_data(self, journal: ImportJournal) -> SeedReport | bool:
        """Step 3's guard, the row at the host read again under the fence: False when
        the import's data goes (the row is the import's gated one, or there is none and
        the marker names this seed), True when it is left and the rollback goes on (no
        row, and the marker names another seed or none), a report when the rollback
        stops here (the row changed under the fence; a marker that cannot be read, or a
        row that appeared: deferred), its fence lifted."""
        host, seed = journal.instance, journal.seed
        db = self.home.seed_db_path(host)
        row = self.store.imports.row_at(host)
        if row is not None:
            if row.seed != seed or row.state is not RouteState.GATED:
                self.lift(journal)
                return self.held(journal, "the route changed under the fence, so nothing "
                                          "there is touched")
            return False
        try:
            named = files.local_seed_id(db)
        except OSError as exc:
            self.lift(journal)
            return SeedReport(host, seed, SeedOutcome.DEFERRED,
                              f"the seed marker beside {db} cannot be read: {exc}")
        if named != seed:
            log.info("%s: import %s has no route; %s is left: its marker names %r",
                     host, seed, db, named)
            return True
        if self.store.imports.row_at(host) is not None:
            self.lift(journal)
            return SeedReport(host, seed, SeedOutcome.DEFERRED,
                              "a route appeared at the host; its data is left")
        return False

    # -- boot ----------------------------------------------------------------------------

    async def resume(self) -> list[SeedReport]:
        """Every import journal carried on from its state alone, whatever its operation
        says: an import interrupted before its gate opened, and every rollback under
        way, carried through to rolled back; an import in effect keeps going (its fence
        lifted if a crash kept it); an unknown state is reported. Copies of seeds no
        journal names (a crash before the journal row) are removed. Boot carries on
        each interrupted operation by its kind instead (`recover_import`,
        `recover_rollback`), from the same journal."""
        reports = []
        for journal in self.store.imports.list_imports():
            try:
                reports.append(await self._resume_one(journal))
            except OperationError as exc:
                log.warning("boot: seed import at %s: %s", journal.instance, exc.message)
        self._sweep_copies()
        return reports

    async def recover_import(self, op: Operation) -> None:
        """At boot: an interrupted import carried on from the import journal at its
        host, then ended. None journaled (a crash before its journal row, whose copy
        `sweep_copies` removed): nothing took effect. Before its gate opened: rolled
        back (an import always rolls back), as an operation of its own. Its gate open:
        in effect, its fence lifted and the instance started on the seed."""
        journal = self.store.imports.get_import(op.instance)
        if journal is None:
            end_interrupted(self.store, op, by_steps(op))
            return
        report = await self._resume_one(journal)
        if report.outcome is SeedOutcome.IMPORTED:
            end_interrupted(self.store, op, Verdict(OpState.SUCCEEDED),
                            "the import was in effect; carried on at boot")
        else:
            end_interrupted(self.store, op, Verdict(
                OpState.FAILED, f"interrupted by a control-plane crash; rolled back at boot: "
                f"{report.outcome.value}" + (f" ({report.reason})" if report.reason else "")))

    async def recover_rollback(self, op: Operation) -> None:
        """At boot: an interrupted rollback run on in its own operation from the
        journal's state (each step idempotent); with no import journaled any more, it
        ends as its journal says."""
        checked(names.HOST, op.instance)
        await self.runner.run(ROLLBACK, self, RollbackRequest(op.instance), begun=op)

    def sweep_copies(self) -> None:
        """At boot, before anything: copies of seeds no journal names removed."""
        self._sweep_copies()

    async def _resume_one(self, journal: ImportJournal) -> SeedReport:
        state = journal.known
        match state:
            case None:
                return self._unknown(journal)
            case ImportState.SWAPPED:
                host = journal.instance

                async def lift() -> None:
                    if journal.fence_gen is not None:
                        self.store.instances.unfence(host, journal.fence_gen)
                    await self.restarts.restart_active(host)

                async with self.locks.instance(host):
                    await lift()
                return SeedReport(host, journal.seed, SeedOutcome.IMPORTED)
            case (ImportState.IMPORTING | ImportState.ROLLING_BACK
                  | ImportState.CLEANUP_PENDING):
                return await self.rollback(journal.instance)
            case _:
                assert_never(state)

    def _sweep_copies(self) -> None:
        """At boot, under the home lock and before the API serves: only this control
        plane writes seeds' copies, so no temp file here has a live writer."""
        named = {j.seed for j in self.store.imports.list_imports()}
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
        inst = self.store.instances.get_instance(host)
        journal = self.store.imports.get_import(host)
        if inst is None and journal is None:
            instances.named(self.store, host)
        record = self.store.imports.seed_record(host)
        db = self.home.seed_db_path(host)
        try:
            marker: str | None = files.local_seed_id(db)
        except OSError:
            marker = "unreadable"
        row = self.store.imports.row_at(host)
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
            "fenced": self.store.instances.fenced(host) if inst is not None else False,
        }

    # -- shared steps --------------------------------------------------------------------

    def lift(self, journal: ImportJournal) -> None:
        if journal.fence_gen is not None:
            self.store.instances.unfence(journal.instance, journal.fence_gen)

    def held(self, journal: ImportJournal, why: str) -> SeedReport:
        log.warning("%s: import %s is not rolled back: %s", journal.instance,
                    journal.seed, why)
        return SeedReport(journal.instance, journal.seed, SeedOutcome.HELD, why)

    async def publish(self, host: str) -> None:
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

def _seed_step(kind: StepKind, point: str, describe: str, *,
               journals_own: bool = False) -> PlannedStep:
    """A seed step of its own failpoints (`seed.<point>.before|after`); `point` is the
    name of its effect too."""
    return PlannedStep(kind, describe, point, before=(f"seed.{point}.before",),
                       after=(f"seed.{point}.after",), journals_own=journals_own)


def _stop_step(gen: Generation) -> PlannedStep:
    return PlannedStep(StepKind.STOP, f"stop {gen.service} generation {gen.id}", "stop",
                       service=gen.service, before_gen=gen.id)


@dataclass
class ImportRun:
    """What one run of an import learns as it goes (its steps hand it on)."""

    checked: files.Contents | None = None  # the seed's, as refuse_import found it
    stored: files.Verified | None = None
    env_before: dict[str, str | None] = field(default_factory=dict)
    fenced: ImportJournal | None = None


@dataclass(frozen=True)
class ImportRequest:
    host: str
    said: str  # the seed as the operator named it (a path, a snapshot)
    seed_db: Path  # where the seeded database is laid down
    # Whether this box replicates: the host's own replica is synced and stopped first.
    replicating: bool
    # What a run carries out (empty for a dry run).
    seed: str = ""
    source: Path | None = None
    progress: AsyncProgress = _quiet
    allow_empty: bool = False
    state: ImportRun = field(default_factory=ImportRun, compare=False)


def plan_import(store: Store, request: ImportRequest) -> Plan:
    """The steps of a seed import into `request.host`, from its records (reads only):
    the header's sequence, a STOP for each live generation. The start on the seed
    follows the operation (the verified start path, `Recovery.restart_active`)."""
    host = request.host
    inst = targets.instance_named(store, host)
    steps = [
        _seed_step(StepKind.SEED_STORE, "store", f"verify and store a copy of {request.said}"),
        _seed_step(StepKind.SEED_JOURNAL, "journal",
                   f"journal the import and close {host}'s gate"),
        _seed_step(StepKind.SEED_FENCE, "fence", f"fence {host}"),
        *(_stop_step(gen) for gen in store.generations.live_generations(host)),
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
    ]
    return Plan(OpKind.SEED_IMPORT, inst.app, host, tuple(steps))


def _copy_of(seeding: Seeding, request: ImportRequest) -> Path:
    return seeding.home.seed_copy(request.seed)


def _store(seeding: Seeding, request: ImportRequest, _step: PlannedStep) -> Bound:
    async def store_copy(_op: Operation) -> Done | Failed:
        run = request.state
        assert request.source is not None and run.checked is not None
        try:
            run.stored = files.store_copy(request.source, _copy_of(seeding, request))
        except files.SeedRefused as exc:
            return Failed(exc.message)
        await request.progress("stored")
        return Done(f"{request.seed}: {run.checked.apparent_bytes} bytes verified")

    return store_copy


def _journal(seeding: Seeding, request: ImportRequest, _step: PlannedStep) -> Bound:
    async def begin(_op: Operation) -> Done:
        run, host = request.state, request.host
        assert run.stored is not None
        run.env_before = files.env_before(seeding.home.env_file(host))
        seeding.store.imports.begin_import(host, request.seed, env_before=run.env_before,
                                           sha256=run.stored.sha256)
        await seeding.publish(host)
        return Done(request.seed)

    return begin


def _fence_import(seeding: Seeding, request: ImportRequest, _step: PlannedStep) -> Bound:
    async def fence(_op: Operation) -> Done:
        request.state.fenced = seeding.store.imports.fence_import(request.host, request.seed)
        await request.progress("fenced")
        return Done(f"generation {request.state.fenced.fence_gen}")

    return fence


def _stop(seeding: Seeding, _request: object, step: PlannedStep) -> Bound:
    return stop_generation(seeding.store, seeding.supervisor, step)


def _sync(seeding: Seeding, request: ImportRequest, _step: PlannedStep) -> Bound:
    async def sync(_op: Operation) -> Done | Failed:
        # H's own database, every process of H gone: its replica is current and then
        # left alone until the rollback (the import's goes elsewhere).
        replicas = seeding.keeper.replicas
        assert replicas is not None
        failed = await replicas.stop(request.host, sync=True)
        return Done("synced") if failed is None else Failed(failed)

    return sync


def _lay_down(seeding: Seeding, request: ImportRequest, _step: PlannedStep) -> Bound:
    async def lay_down(_op: Operation) -> Done | Failed:
        assert request.state.stored is not None
        try:
            files.lay_down(_copy_of(seeding, request), request.seed_db, request.seed,
                           request.state.stored.sha256)
        except files.SeedRefused as exc:
            return Failed(exc.message)
        return Done(str(request.seed_db))

    return lay_down


def _key(seeding: Seeding, request: ImportRequest, _step: PlannedStep) -> Bound:
    async def key(_op: Operation) -> Done:
        minted = files.write_import_env(seeding.home.env_file(request.host), request.seed_db,
                                        request.state.env_before)
        return Done("minted" if minted else "kept")

    return key


def _open(seeding: Seeding, request: ImportRequest, _step: PlannedStep) -> Bound:
    async def open_gate(_op: Operation) -> Done:
        seeding.store.imports.open_import_gate(request.host, request.seed)
        return Done()

    return open_gate


def _unfence(seeding: Seeding, host: str, generation: int | None) -> Done:
    if generation is None:
        return Done("no fence")
    _, lifted = seeding.store.instances.unfence(host, generation)
    return Done(f"generation {generation} " + ("lifted" if lifted else "not held"))


def _unfence_import(seeding: Seeding, request: ImportRequest, _step: PlannedStep) -> Bound:
    async def unfence(_op: Operation) -> Done:
        fenced = request.state.fenced
        done = _unfence(seeding, request.host, fenced.fence_gen if fenced else None)
        await request.progress("open")
        return done

    return unfence


async def _refuse_again(seeding: Seeding, request: ImportRequest) -> None:
    # Again under the lock, converged: what was checked before may have moved.
    assert request.source is not None
    request.state.checked = seeding.refuse_import(request.host, request.source,
                                                  request.allow_empty)


async def _after_import(seeding: Seeding, request: ImportRequest, ran: Ran) -> None:
    await seeding.after_import(request, ran)


async def _recover_import(seeding: Seeding, op: Operation) -> None:
    await seeding.recover_import(op)


def _sweep(seeding: Seeding) -> None:
    seeding.sweep_copies()


IMPORT: Spec[ImportRequest, Seeding] = Spec(
    OpKind.SEED_IMPORT, plan_import,
    {"store": _store, "journal": _journal, "fence": _fence_import, "stop": _stop,
     "sync": _sync, "lay-down": _lay_down, "key": _key, "open": _open,
     "unfence": _unfence_import},
    fence_verb="take a seed import", prelude=_refuse_again, after=_after_import,
    recover=_recover_import, first=_sweep)


@dataclass
class RollbackRun:
    """What one run of a rollback learns as it goes: the journal as it began (read
    under the lock), the journal once fenced again, the report of a run that stopped
    short, and whether the import's local data is left (not the import's)."""

    origin: ImportJournal | None = None
    fenced: ImportJournal | None = None
    report: SeedReport | None = None
    data_left: bool = False
    # What the whole run came to (`Seeding.after_rollback`).
    said: SeedReport | None = None

    def journal(self) -> ImportJournal:
        found = self.fenced or self.origin
        assert found is not None, "read under the lock before the first step"
        return found


@dataclass(frozen=True)
class RollbackRequest:
    host: str
    state: RollbackRun = field(default_factory=RollbackRun, compare=False)


# The module header's numbered steps of the rollback, each step's number: a dry run
# prints one line per number.
PHASES = {StepKind.SEED_CLOSE: 1, StepKind.SEED_FENCE: 2, StepKind.STOP: 2,
          StepKind.SEED_RETIRE_KEY: 3, StepKind.SEED_REMOVE_DATA: 3,
          StepKind.SEED_RESTORE: 4, StepKind.SEED_UNFENCE: 5, StepKind.SEED_DELETE_COPY: 6,
          StepKind.SEED_DELETE_REPLICA: 6, StepKind.SEED_FORGET: 7, StepKind.SEED_RECORD: 8}


def rollback_lines(plan: Plan) -> tuple[str, ...]:
    """The rollback's dry run: its planned steps, one line per numbered step."""
    lines: list[str] = []
    last = 0
    for step in plan.steps:
        phase = PHASES.get(step.kind, 0)
        if phase and phase == last:
            lines[-1] += f"; {step.describe}"
        else:
            lines.append(step.describe)
        last = phase
    return tuple(lines)


def plan_rollback(store: Store, request: RollbackRequest) -> Plan:
    """The steps of the rollback of the import journaled at `request.host`, from its
    journal's state (reads only), numbered as the module header numbers them. Nothing
    to do when no import is journaled or its state is unknown. When the route at the
    host is someone else's, one step that holds: it touches nothing there and lifts
    only the rollback's own fence generation."""
    host = request.host
    journal = store.imports.get_import(host)
    inst = store.instances.get_instance(host)
    app = journal.record.partition("/")[0] if journal else (inst.app if inst else "")
    if journal is None:
        return Plan(OpKind.SEED_ROLLBACK, app, host, nothing="no import is journaled")
    state = journal.known
    seed = journal.seed
    steps: list[PlannedStep] = []
    match state:
        case None:
            return Plan(OpKind.SEED_ROLLBACK, app, host,
                        nothing=f"unknown journal state {journal.state!r}: left alone")
        case ImportState.IMPORTING | ImportState.SWAPPED | ImportState.ROLLING_BACK:
            row = store.imports.row_at(host)
            if row is not None and row.seed != seed:
                return Plan(OpKind.SEED_ROLLBACK, app, host, (PlannedStep(
                    StepKind.SEED_CLOSE, "hold: the route at the host is not the "
                    "import's, so nothing there is touched", "hold", journals_own=True),))
            if state is not ImportState.ROLLING_BACK:
                steps.append(_seed_step(StepKind.SEED_CLOSE, "close",
                                        "close the gate under a new fence generation"))
            steps.append(_seed_step(StepKind.SEED_FENCE, "fence", f"fence {host}"))
            steps += [_stop_step(gen) for gen in store.generations.live_generations(host)]
            # Each of these two reads the row again under the fence, and is journaled
            # only when the import's data is to go (`Seeding.before_data`).
            steps += [
                _seed_step(StepKind.SEED_RETIRE_KEY, "retire-key", "retire the import's key",
                           journals_own=True),
                _seed_step(StepKind.SEED_REMOVE_DATA, "remove-data",
                           "remove the import's local data", journals_own=True),
                _seed_step(StepKind.SEED_RESTORE, "restore", "restore the original route"),
            ]
        case ImportState.CLEANUP_PENDING:
            pass
        case _:
            assert_never(state)
    # Again from CLEANUP_PENDING: a crash between the restore and the lift leaves the
    # journal's generation held, and only that generation is lifted.
    steps.append(_seed_step(StepKind.SEED_UNFENCE, "unfence", "lift the fence"))
    if names.SEED_ID.accepts(seed):
        steps.append(_seed_step(StepKind.SEED_DELETE_COPY, "delete-copy",
                                "delete the seed's copy"))
        # Whether the replica is the import's is read when the step comes (the
        # rollback's own close aborts the record): journaled only when it is.
        steps.append(_seed_step(StepKind.SEED_DELETE_REPLICA, "delete-replica",
                                "delete the import's replica, if its record still names "
                                "this seed abandoned", journals_own=True))
    steps += [_seed_step(StepKind.SEED_FORGET, "forget", "delete the journal row"),
              _seed_step(StepKind.SEED_RECORD, "record", "mark the record rolled back")]
    return Plan(OpKind.SEED_ROLLBACK, app, host, tuple(steps))


def _stopped(request: RollbackRequest, report: SeedReport) -> Ended:
    """The rollback stops here, saying why; the journal keeps the rest for later."""
    request.state.report = report
    return Ended(Result(Outcome.FAILED, f"{report.outcome.value}: {report.reason}"))


def _hold(seeding: Seeding, request: RollbackRequest, _step: PlannedStep) -> Bound:
    async def hold(_op: Operation) -> Ended:
        journal = request.state.journal()
        # A fence an earlier pass kept for this rollback must not hold the host for
        # whoever owns it now: only our generation is lifted.
        if journal.known is ImportState.ROLLING_BACK and journal.fence_gen:
            seeding.store.instances.unfence(request.host, journal.fence_gen)
        return _stopped(request, seeding.held(journal, "the route at the host is not the "
                                                       "import's, so nothing there is "
                                                       "touched"))

    return hold


def _close(seeding: Seeding, request: RollbackRequest, _step: PlannedStep) -> Bound:
    async def close(_op: Operation) -> Done:
        seeding.store.imports.close_import_gate(request.host, request.state.journal().seed)
        await seeding.publish(request.host)
        return Done()

    return close


def _fence_again(seeding: Seeding, request: RollbackRequest, _step: PlannedStep) -> Bound:
    async def fence(_op: Operation) -> Done:
        run = request.state
        run.fenced = seeding.store.imports.fence_import(request.host, run.journal().seed)
        return Done(f"generation {run.fenced.fence_gen}")

    return fence


def _stop_or_defer(seeding: Seeding, request: RollbackRequest, step: PlannedStep) -> Bound:
    stop = _stop(seeding, request, step)

    async def stop_or_defer(op: Operation) -> Done | Failed | Ended:
        end = await stop(op)
        if isinstance(end, Failed):
            # Under the fence still: the next pass finds it its own and resumes.
            request.state.report = SeedReport(request.host, request.state.journal().seed,
                                              SeedOutcome.DEFERRED, end.reason)
        return end

    return stop_or_defer


def _retire_key(seeding: Seeding, request: RollbackRequest, step: PlannedStep) -> Bound:
    async def retire_key(op: Operation) -> Done | Ended:
        run = request.state
        journal = run.journal()
        verdict = seeding.before_data(journal)
        if isinstance(verdict, SeedReport):
            return _stopped(request, verdict)
        run.data_left = verdict
        if verdict:
            return Done()

        async def retire() -> Done:
            changed = files.retire_import_env(seeding.home.env_file(request.host),
                                              journal.env_before)
            return Done("restored" if changed else "was restored")

        # The key before the database: the marker that proves the installation is the
        # import's is removed with the database, last.
        await _journal_own(seeding, op, step, retire)
        return Done()

    return retire_key


def _remove_data(seeding: Seeding, request: RollbackRequest, step: PlannedStep) -> Bound:
    async def remove_data(op: Operation) -> Done:
        if request.state.data_left:
            return Done()

        async def remove() -> Done:
            removed = files.remove_local(seeding.home.seed_db_path(request.host))
            return Done(", ".join(removed) or "nothing left")

        await _journal_own(seeding, op, step, remove)
        return Done()

    return remove_data


def _restore(seeding: Seeding, request: RollbackRequest, _step: PlannedStep) -> Bound:
    async def restore(_op: Operation) -> Done | Failed:
        journal = request.state.journal()
        try:
            seeding.store.imports.restore_import_route(request.host, journal.seed)
        except Conflict as exc:
            seeding.lift(journal)
            request.state.report = seeding.held(journal, str(exc))
            return Failed(str(exc))
        await seeding.publish(request.host)
        return Done()

    return restore


def _unfence_rollback(seeding: Seeding, request: RollbackRequest,
                      _step: PlannedStep) -> Bound:
    async def unfence(_op: Operation) -> Done:
        return _unfence(seeding, request.host, request.state.journal().fence_gen)

    return unfence


def _delete_copy(seeding: Seeding, request: RollbackRequest, _step: PlannedStep) -> Bound:
    async def delete_copy(_op: Operation) -> Done:
        copy = seeding.home.seed_copy(request.state.journal().seed)
        existed = copy.exists()
        copy.unlink(missing_ok=True)
        return Done("deleted" if existed else "gone already")

    return delete_copy


def _delete_replica(seeding: Seeding, request: RollbackRequest, step: PlannedStep) -> Bound:
    async def delete_replica(op: Operation) -> Done | Failed:
        host, journal = request.host, request.state.journal()
        # Read again right before the replica: the replica is keyed by host, not seed.
        ours, why = replica_is_the_imports(journal, seeding.store.imports.seed_record(host))
        if not ours:
            log.info("%s: import %s: the replica is left alone: %s", host, journal.seed, why)
            return Done()

        async def delete() -> Done | Failed:
            if seeding.delete_replica is None:
                return Done("no replicas on this box")
            try:
                # The import's own replica (replicas/<host>/<seed>), never the host's:
                # that one stayed as it was through the import.
                await seeding.delete_replica(host, journal.seed)
            except ObjectStoreError as exc:
                return Failed(f"the import's replica could not be deleted: {exc}")
            return Done("deleted")

        failed = await _journal_own(seeding, op, step, delete)
        if failed is not None:
            # CLEANUP_PENDING still: the next pass deletes it and goes on.
            request.state.report = SeedReport(host, journal.seed, SeedOutcome.DEFERRED,
                                              failed.reason)
            return failed
        return Done()

    return delete_replica


def _forget(seeding: Seeding, request: RollbackRequest, _step: PlannedStep) -> Bound:
    async def forget(_op: Operation) -> Done:
        deleted = seeding.store.imports.delete_import(request.host, request.state.journal().seed)
        return Done("deleted" if deleted else "gone")

    return forget


def _record(seeding: Seeding, request: RollbackRequest, _step: PlannedStep) -> Bound:
    async def cas(_op: Operation) -> Done:
        journal = request.state.journal()
        moved = seeding.store.imports.cas_seed_record(journal.record, journal.seed,
                                                      frozenset({SeedState.ABORTED}),
                                                      SeedState.ROLLED_BACK)
        seeding.store.ops.add_event("seed", f"seed {journal.seed} rolled back",
                                    app=journal.record.partition("/")[0], instance=request.host)
        return Done("rolled back" if moved else "the record names another seed or is done")

    return cas


async def _journal_own(seeding: Seeding, op: Operation, step: PlannedStep,
                       effect: Effect) -> Failed | None:
    """A dynamic step journaled by its effect, once its guard said so, between the
    planned step's own failpoints."""
    return await Steps(seeding.store, op.id).run(step.kind, effect, before=step.before,
                                                 after=step.after)


async def _origin(seeding: Seeding, request: RollbackRequest) -> None:
    # The journal as the rollback begins, read under the lock, converged.
    request.state.origin = seeding.store.imports.get_import(request.host)


async def _after_rollback(seeding: Seeding, request: RollbackRequest, ran: Ran) -> None:
    await seeding.after_rollback(request, ran)


async def _recover_rollback(seeding: Seeding, op: Operation) -> None:
    await seeding.recover_rollback(op)


ROLLBACK: Spec[RollbackRequest, Seeding] = Spec(
    OpKind.SEED_ROLLBACK, plan_rollback,
    {"hold": _hold, "close": _close, "fence": _fence_again, "stop": _stop_or_defer,
     "retire-key": _retire_key, "remove-data": _remove_data, "restore": _restore,
     "unfence": _unfence_rollback, "delete-copy": _delete_copy,
     "delete-replica": _delete_replica, "forget": _forget, "record": _record},
    prelude=_origin, after=_after_rollback, recover=_recover_rollback)
