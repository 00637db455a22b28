"""The one restore of an instance's database, from a snapshot or from its replica, and
the copies restores keep.

A part beside `Deployer` and `Parking`, on the same `Locks` and `Recovery` (wired in
keelway/api/daemon.py); taking, listing and verifying snapshots is
keelway/deploy/snapshots.py. What it holds:
- restore (`db restore H SNAP`, OpKind.RESTORE; `db restore H --from-replica [--at]`,
  OpKind.RESTORE_REPLICA: one code path, the kind names the source), under the instance
  lock, after convergence:
  a verified copy staged beside the database first (`.tmp-restore-*`: a snapshot
  fetched, or the replica restored by litestream; its integrity checked, a snapshot's
  sha256 too; fsynced): a copy that fails is refused and nothing changed. Then one
  journaled operation: HOLD_ROUTE (a running instance's route holding, published:
  requests wait) → STOP every generation, the replicator too, proven gone → SWAP_DB
  (keelway/data/swap.py: the commit point; the replaced database kept in
  `kept/`, keelway/data/kept.py) → REPLICA_RESET, before the swap (the replica set aside) and one
  sync after it (REPLICA_STOP: a fresh replica started from the restored file, below)
  → a running instance respawned from ACTIVE (the verified
  start path, as start and wake do: ACTIVE and the route serving in one write,
  published). A parked or stopped instance has nothing to hold, stop or start: its file
  is swapped and it stays as it was.
- why REPLICA_RESET after every restore, a snapshot's too: the replica holds the old
  database's later transactions, so a `--from-replica` restore (or a parked instance's
  replica, which no replicator updates until its wake) would bring back what the
  restore replaced. A file replica is renamed `<dir>_replaced-<ms>` (kept, as the
  database is: neither is ever replaced by a later restore), then one `replicate
  -once` writes the restored file as the start of a new one. An S3 replica cannot be
  renamed: litestream 0.5.17, finding no local state beside the swapped-in file
  (swap.py removes it) and a replica ahead of it, writes the file as a new snapshot
  after the replica's last transaction, so its latest restore is the restored
  database (tests/data/test_swap.py proves it against a file replica and a real S3
  server).
- kept copies (`db kept H`, `db forget H COPY`, and `gc` for those past the
  retention): under the instance lock, so no restore is keeping one meanwhile.

Crash windows: before SWAP_DB begins → the old database is untouched; boot adopts or
restarts what ACTIVE names and puts the held route back (keelway/reconcile/plan.py
RESTORE_ROUTE); the staged copy is swept. Once the swap committed → boot finishes it
before anything of the instance respawns (`swap.finish_all`, keelway/api/daemon.py), so
the instance comes back on the restored database, whole. The replica is set aside
before the swap, so after a crash anywhere no file replica holds what was replaced: a
crash before the swap leaves the old database with no replica (the next replicator
starts one from it; the old one is kept aside), one after it the restored database with
none until its next replicator (a parked one's wake) starts one. Never a replica that
restores what the restore replaced.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keelway import failpoints
from keelway.builds.manifest import REPLICA
from keelway.data import kept, snapshots, swap
from keelway.data.kept import KeptCopy
from keelway.data.objects import ObjectNotFound, ObjectStore, ObjectStoreError
from keelway.data.replicas import ReplicaError, Replicas, replica_url
from keelway.data.snapshots import SnapshotManifest
from keelway.data.verify import Damaged, verify_file
from keelway.deploy import instances, targets
from keelway.deploy.crash_restarts import CrashRestarts
from keelway.deploy.errors import NotFoundError, OperationError, UserError
from keelway.deploy.locks import Locks
from keelway.deploy.operation import (
    Bound,
    EffectOf,
    Ended,
    Plan,
    PlannedStep,
    Ran,
    Runner,
    Spec,
    stop_generation,
)
from keelway.deploy.outcome import Outcome
from keelway.deploy.publisher import Publisher
from keelway.deploy.replica_keeper import ReplicaKeeper
from keelway.deploy.snapshots import ObjectStoreFailed, SnapshotRefused, check_id
from keelway.deploy.steps import Done, Failed
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import InstanceState, RouteState
from keelway.store.records import Operation

failpoints.declare("restore.hold.before", "restore.hold.after", "restore.swap.before",
                   "restore.swap.after", "restore.replica.before", "restore.replica.after")


log = logging.getLogger("keelway.restore")


class ImportInEffect(UserError):
    code = "import-in-effect"


@dataclass(frozen=True)
class Restored:
    host: str
    snapshot: SnapshotManifest | None  # None: restored from the replica
    state: InstanceState
    source: str  # "snapshot" or "replica"
    op_id: int | None
    size_bytes: int
    # Every copy kept at the host after this restore (the one it replaced among them),
    # oldest first: what an operator may still want back.
    kept: list[KeptCopy]
    retention_s: float

    def view(self) -> dict[str, Any]:
        """What `db restore` answers, whichever the source (the API's JSON)."""
        return {"host": self.host, "state": self.state.value, "source": self.source,
                "op": self.op_id, "size_bytes": self.size_bytes,
                "kept": [c.view() for c in self.kept], "retention_s": self.retention_s,
                "snapshot": dataclasses.asdict(self.snapshot) if self.snapshot else None}


@dataclass(eq=False)
class Restore:
    store: Store
    home: Home
    supervisor: Supervisor
    publisher: Publisher
    locks: Locks
    restarts: CrashRestarts
    keeper: ReplicaKeeper
    runner: Runner
    objects: ObjectStore

    async def restore(self, host: str, snap_id: str) -> Restored:
        """Replace `host`'s database with snapshot `snap_id`, verified first. After
        return the instance is in the state it was (a running one serves again, on the
        restored data). A snapshot that fails verification changes nothing."""
        instances.named(self.store, host)
        check_id(snap_id)

        async def stage(staged: Path) -> tuple[SnapshotManifest | None, int]:
            found = await self._stage_snapshot(host, snap_id, staged)
            return found, found.size

        return await self._restore(host, OpKind.RESTORE, snap_id, stage)

    async def restore_replica(self, host: str, at: str | None = None) -> Restored:
        """Replace `host`'s database with its replica (as of `at`, ISO 8601), restored
        and verified first; otherwise as `restore`."""
        instances.named(self.store, host)
        when = parse_time(at) if at is not None else None
        replicas = self.keeper.required()

        async def stage(staged: Path) -> tuple[SnapshotManifest | None, int]:
            try:
                await replicas.restore(host, staged, when)
            except ReplicaError as exc:
                raise UserError(f"{exc}; nothing was changed", hint=f"`keelway db replicas "
                                f"{host}` shows what the replica holds") from None
            try:
                await asyncio.to_thread(self._check_staged, staged)
            except Damaged as exc:
                raise SnapshotRefused(f"the replica of {host} restored to a copy that "
                                      f"failed verification ({exc.message}); nothing was "
                                      "changed", hint="restore a snapshot instead") from None
            return None, staged.stat().st_size

        return await self._restore(host, OpKind.RESTORE_REPLICA,
                                   f"replica-{os.urandom(4).hex()}", stage)

    async def plan(self, host: str, snap_id: str | None, at: str | None = None) -> Plan:
        """The dry run of a restore from snapshot `snap_id` (None: from the replica, as
        of `at`): every refusal the restore itself makes before it stages anything,
        then the plan it would run now. Nothing is fetched or changed; the copy is
        staged and verified only by the restore."""
        instances.named(self.store, host)
        if snap_id is None:
            if at is not None:
                parse_time(at)
            self.keeper.required()
        else:
            check_id(snap_id)
            try:
                listed = await asyncio.to_thread(snapshots.list_snapshots, self.objects, host)
            except ObjectStoreError as exc:
                raise ObjectStoreFailed(str(exc), hint="check the object store") from None
            if snap_id not in {m.id for m in listed}:
                raise NotFoundError(f"{host} has no snapshot {snap_id}",
                                    hint=f"see `keelway db snapshots {host}`")
        return self.runner.dry_run(self._spec(snap_id is None), self._request(host, None))

    def _spec(self, from_replica: bool) -> Spec[RestoreRequest, Restore]:
        return RESTORE_REPLICA if from_replica else RESTORE

    def _request(self, host: str, staged: Path | None) -> RestoreRequest:
        return RestoreRequest(host, replicating=self._replicating() is not None,
                              staged=staged)

    async def _restore(self, host: str, kind: OpKind, tag: str, stage: Stage) -> Restored:
        """The one restore: `stage` writes a verified copy at the staged path under the
        lock (or raises, nothing journaled); then the operation of the module header,
        run by the runner (`RESTORE`, `RESTORE_REPLICA`)."""
        inst = instances.named(self.store, host)
        staged = swap.staged_path(self.home.db_path(host), tag)
        request = RestoreRequest(host, replicating=self._replicating() is not None,
                                 staged=staged, stage=stage)
        try:
            ran = await self.runner.run(self._spec(kind is OpKind.RESTORE_REPLICA), self,
                                         request)
        finally:
            for side in swap.SIDES:
                Path(f"{staged}{side}").unlink(missing_ok=True)
        found, size = request.staged_as[0]
        source = f"snapshot {found.id}" if found is not None else "its replica"
        if ran.result is not None and ran.result.outcome is not Outcome.DONE:
            raise OperationError(f"{host}: restore from {source} failed: {ran.result.reason}",
                                 hint=f"see `keelway ops {inst.app} --instance {host}`")
        op = self.store.ops.latest_operation_of(host, {kind})
        copies = await asyncio.to_thread(self._kept, host)
        self.store.ops.add_event("restore", f"restored from {source}; kept: "
                                 f"{', '.join(c.id for c in copies) or 'nothing'}",
                                 app=inst.app, instance=host)
        now = self.store.instances.get_instance(host) or inst
        return Restored(host, found, now.state, "snapshot" if found else "replica",
                        op.id if op is not None else None, size, copies, kept.retention_s())

    # -- kept copies -----------------------------------------------------------------

    def _kept(self, host: str) -> list[KeptCopy]:
        """Every copy a restore kept at `host`: replaced databases, set-aside file
        replicas; oldest first."""
        copies = kept.databases(self.home.db_path(host))
        replicas = self.keeper.replicas
        if replicas is not None:
            # The host's own replica, also while an import replicates elsewhere.
            path = _file_path(replica_url(self.home, host, replicas.objects))
            if path is not None:
                copies += kept.replicas(
                    path, {i.host for i in self.store.instances.list_instances()})
        return sorted(copies, key=lambda c: (c.kept_at, c.id))

    async def kept(self, host: str) -> list[KeptCopy]:
        """`db kept H`: what `_kept` lists."""
        instances.named(self.store, host)
        return await asyncio.to_thread(self._kept, host)

    async def forget(self, host: str, copy_id: str) -> KeptCopy:
        """`db forget H COPY`: remove one kept copy, named by its id exactly as listed
        (never a path: nothing else of the data dir can be named)."""
        instances.named(self.store, host)
        async with self.locks.instance(host):
            copies = {c.id: c for c in await asyncio.to_thread(self._kept, host)}
            copy = copies.get(copy_id)
            if copy is None:
                raise NotFoundError(f"{host} keeps no copy {copy_id!r}; nothing was changed",
                                    hint=f"`keelway db kept {host}` lists them")
            await asyncio.to_thread(kept.forget, copy)
        inst = instances.named(self.store, host)
        self.store.ops.add_event("restore", f"kept copy {copy.id} removed", app=inst.app,
                                 instance=host)
        return copy

    async def prune_kept(self, dry_run: bool,
                         now_s: float | None = None) -> list[tuple[str, str]]:
        """`gc`: every kept copy older than the retention at `now_s` (default: now, by
        the wall clock its name was stamped with) removed, unless `dry_run`; returns
        (host, copy id) of each."""
        now = time.time() if now_s is None else now_s
        keep_s = kept.retention_s()
        removed: list[tuple[str, str]] = []
        for inst in self.store.instances.list_instances():
            async with self.locks.instance(inst.host):
                old = kept.aged(await asyncio.to_thread(self._kept, inst.host), now, keep_s)
                if not dry_run:
                    for copy in old:
                        await asyncio.to_thread(kept.forget, copy)
            removed += [(inst.host, c.id) for c in old]
        return removed

    async def _stage_snapshot(self, host: str, snap_id: str, staged: Path) -> SnapshotManifest:
        """The snapshot fetched beside the database, verified, in WAL mode (as every
        instance database is), fsynced; refused with nothing changed otherwise."""
        try:
            return await asyncio.to_thread(self._fetch_staged, host, snap_id, staged)
        except ObjectNotFound:
            raise NotFoundError(f"{host} has no snapshot {snap_id}",
                                hint=f"see `keelway db snapshots {host}`") from None
        except Damaged as exc:
            raise SnapshotRefused(f"snapshot {snap_id} of {host} failed verification: "
                                  f"{exc.message}; nothing was changed",
                                  hint="restore another snapshot") from None
        except ObjectStoreError as exc:
            raise ObjectStoreFailed(str(exc), hint="check the object store") from None

    def _fetch_staged(self, host: str, snap_id: str, staged: Path) -> SnapshotManifest:
        try:
            found = snapshots.fetch(self.objects, host, snap_id, staged)
            swap.to_wal(staged)
        except BaseException:
            for side in swap.SIDES:
                Path(f"{staged}{side}").unlink(missing_ok=True)
            raise
        return found

    @staticmethod
    def _check_staged(staged: Path) -> None:
        """A replica's restore: checked as a snapshot is (no sha256 to compare), in WAL
        mode, fsynced beside the check."""
        with ThreadPoolExecutor(1) as pool:
            flushed = pool.submit(_fsync, staged)
            try:
                verify_file(staged)
            finally:
                flushed.result()
        swap.to_wal(staged)

    def _replicating(self) -> Replicas | None:
        replicas = self.keeper.replicas
        return replicas if replicas is not None and replicas.enabled else None

    def replicas_on(self) -> Replicas:
        replicas = self._replicating()
        assert replicas is not None, "planned only when this box replicates"
        return replicas


Stage = Callable[[Path], Awaitable[tuple[SnapshotManifest | None, int]]]


@dataclass(frozen=True)
class RestoreRequest:
    host: str
    # Whether this box replicates: the replica is set aside before the swap and a new
    # one begun after it (module header).
    replicating: bool
    # The verified copy the swap puts in (None: a dry run, nothing staged), how it is
    # staged (under the lock, before the operation begins: a copy that fails is refused
    # with nothing journaled), and what was staged (the snapshot, its size).
    staged: Path | None = None
    stage: Stage | None = None
    staged_as: list[tuple[SnapshotManifest | None, int]] = field(default_factory=list,
                                                                 compare=False)


def refuse_import(store: Store, host: str) -> None:
    """A restore replaces the instance's own database, which an import's rollback must
    find exactly as it was (SPEC §4 Seed import): refused while one is journaled."""
    if (journal := store.imports.get_import(host)) is not None:
        raise ImportInEffect(
            f"{host} has a seed import in effect ({journal.seed}); nothing was "
            "changed", hint=f"roll it back first: `keelway seed rollback {host}`")


def plan_restore(store: Store, request: RestoreRequest) -> Plan:
    """The steps of a restore of `request.host`, from its records (reads only): a
    running instance's route held, every live generation (the replicator too) stopped,
    the replica set aside, the swap, a new replica begun, and a running instance's
    ACTIVE services started again through the verified start path (one dynamic step:
    it journals its own spawn and ready steps). A parked or stopped instance has
    nothing to hold, stop or start. The same for a snapshot's restore and the
    replica's: only what is staged differs. Refused while an import is in effect."""
    host = request.host
    inst = targets.instance_named(store, host)
    refuse_import(store, host)
    running = inst.state is InstanceState.RUNNING
    steps: list[PlannedStep] = []
    if running:
        steps.append(PlannedStep(StepKind.HOLD_ROUTE, f"hold {host}'s route (requests "
                                 "wait) and publish it", "hold",
                                 before=("restore.hold.before",),
                                 after=("restore.hold.after",)))
    steps += [PlannedStep(StepKind.STOP, f"stop {gen.service} generation {gen.id}, proven "
                          "gone", "stop", service=gen.service, before_gen=gen.id)
              for gen in store.generations.live_generations(host)]
    if request.replicating:
        steps.append(PlannedStep(StepKind.REPLICA_RESET, f"set {host}'s replica aside",
                                 "aside", before=("restore.replica.before",),
                                 after=("restore.replica.after",)))
    steps.append(PlannedStep(StepKind.SWAP_DB, "swap the verified copy in for the "
                             f"database, the old one kept in {kept.KEPT}/", "swap",
                             before=("restore.swap.before",), after=("restore.swap.after",)))
    if request.replicating:
        steps.append(PlannedStep(StepKind.REPLICA_STOP, "begin a new replica from the "
                                 "restored file", "begin-replica", service=REPLICA))
    if running and store.generations.list_active(host):
        steps.append(PlannedStep(StepKind.SPAWN, "start what ACTIVE names again ("
                                 + ", ".join(a.service for a in store.generations.list_active(host))
                                 + ") through the verified start path", "start",
                                 journals_own=True))
    return Plan(OpKind.RESTORE, inst.app, host, tuple(steps))


def _hold(restore: Restore, request: RestoreRequest, _step: PlannedStep) -> Bound:
    host = request.host

    async def hold(_op: Operation) -> Done | Failed:
        route = restore.store.routes.get_route(host)
        if route is not None and route.state is not RouteState.HOLDING:
            restore.store.routes.set_route(host, host, RouteState.HOLDING, route.port,
                                           route.generation_id, expected=route)
        try:
            await restore.publisher.publish(host)
        except OperationError as exc:
            return Failed(exc.message)
        return Done()

    return hold


def _stop(restore: Restore, _request: RestoreRequest, step: PlannedStep) -> Bound:
    return stop_generation(restore.store, restore.supervisor, step)


def _aside(restore: Restore, request: RestoreRequest, _step: PlannedStep) -> Bound:
    async def aside(_op: Operation) -> Done:
        # Before the swap: from here on no replica holds what is being replaced, so no
        # crash window leaves one that would bring it back (module header).
        replicas = restore.replicas_on()
        await asyncio.to_thread(_set_replica_aside, replicas.url(request.host))
        return Done("the replica set aside (it holds the database being replaced)")

    return aside


def _swap(restore: Restore, request: RestoreRequest, _step: PlannedStep) -> Bound:
    async def swapped(_op: Operation) -> Done:
        assert request.staged is not None, "a dry run runs nothing"
        await asyncio.to_thread(swap.swap, restore.home.db_path(request.host), request.staged)
        return Done(f"database replaced; the old one kept in {kept.KEPT}/")

    return swapped


def _begin_replica(restore: Restore, request: RestoreRequest, _step: PlannedStep) -> Bound:
    async def begin(_op: Operation) -> Done:
        why = await restore.replicas_on().stop(request.host, sync=True)
        if why is None:
            return Done("a new replica begun from the restored file")
        # The database is restored; a replicator started later begins the new replica
        # anyway (module header). Said, not undone: the restore goes on.
        log.warning("restore of %s: no replica begun from it yet: %s", request.host, why)
        return Done(f"no replica begun yet: {why}")

    return begin


def _start(restore: Restore, request: RestoreRequest, _step: PlannedStep) -> Bound:
    async def start(op: Operation) -> Ended:
        current = instances.named(restore.store, request.host)
        return Ended(await restore.restarts.respawn_active(op, current))

    return start


async def _stage(restore: Restore, request: RestoreRequest) -> None:
    assert request.stage is not None and request.staged is not None
    # The plan refuses an import in effect; so must the stage, before it fetches.
    refuse_import(restore.store, request.host)
    restore.home.db_path(request.host).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    request.staged_as.append(await request.stage(request.staged))


async def _link_current(restore: Restore, request: RestoreRequest, ran: Ran) -> None:
    inst = restore.store.instances.get_instance(request.host)
    if ran.result is not None and inst is not None and (
            inst.state is InstanceState.RUNNING):
        targets.link_current(restore.store, restore.home, request.host)


_EFFECTS: dict[str, EffectOf[Restore, RestoreRequest]] = {
    "hold": _hold, "stop": _stop, "aside": _aside, "swap": _swap,
    "begin-replica": _begin_replica, "start": _start}
def finish_swaps(restore: Restore) -> None:
    """At boot, before anything respawns: a restore that committed its swap is carried
    through, so the instance comes back on the restored database (keelway/data/swap.py),
    whichever source it had; its operation is then finalized from its journal."""
    for host in swap.finish_all(restore.home.root / "data"):
        log.info("boot: finished the database swap of a restore of %s", host)


RESTORE: Spec[RestoreRequest, Restore] = Spec(
    OpKind.RESTORE, plan_restore, _EFFECTS, fence_verb="be restored", converge_after=True,
    prelude=_stage, after=_link_current, first=finish_swaps)
RESTORE_REPLICA: Spec[RestoreRequest, Restore] = Spec(
    OpKind.RESTORE_REPLICA, plan_restore, _EFFECTS, fence_verb="be restored",
    converge_after=True, prelude=_stage, after=_link_current)


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _file_path(url: str) -> Path | None:
    parsed = urllib.parse.urlparse(url)
    return Path(urllib.parse.unquote(parsed.path)) if parsed.scheme == "file" else None


def _set_replica_aside(url: str) -> None:
    """A file replica renamed aside, beside the ones earlier restores set aside
    (keelway/data/kept.py). An S3 replica is left in place (see the module header)."""
    path = _file_path(url)
    if path is not None:
        kept.set_replica_aside(path)


def parse_time(text: str) -> datetime.datetime:
    """`--at TIME`: ISO 8601 (`2026-12-01T12:00:00Z`); a time without a zone is UTC."""
    try:
        at = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"{text!r} is not a time", hint="give ISO 8601, for example "
                        "2026-12-01T12:00:00Z") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=datetime.UTC)
