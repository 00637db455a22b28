"""The store's protocols: one per noun, and `Store`, which holds one of each and the
intents that span nouns. The rules every implementation keeps are here.

Every module outside this package holds a `Store`, never an implementation, so the
SQLite store (keelway/store/sqlite.py), the in-memory one (keelway/testing) and a later
PostgreSQL one are interchangeable; tests/store/contract/ is the one suite all pass,
every method of every protocol exercised there (tests/store/contract/test_coverage.py).

A caller names the noun: `store.apps.get_app(name)`, `store.generations.set_active(...)`;
a write that spans nouns is an intent of `Store` itself (`store.install(...)`).

Rules every implementation keeps:
- Each write is one transaction that keeps one invariant; it happens whole or not at
  all, and an error leaves nothing changed. No caller opens a transaction: an effect
  that needs several rows written together is an intent (`install`, `fall_back`,
  `activate_and_route`, `record_crash`, ...).
- Errors are keelway's: every failure is a `StoreError` of one of the kinds in
  keelway/store/errors.py (`NotFound`, `Conflict` and its `StaleSchedule` and
  `HostTaken`, `IllegalTransition`, `StaleOwner`, `DiskFull`), never the driver's.
- A write of a mutable record takes the record (or its version) the caller read and
  compares and swaps on `version`: a lost race raises `Conflict` and writes nothing.
  `install` compares the instance's schedule revision instead (`StaleSchedule`).
  Writes of observed facts (`record_gone`: a process proven dead; `add_warnings`,
  which merges) read and write inside their own transaction: they must land whatever
  version the caller saw.
- Every write carries the owner token the store was opened with and is refused
  (`StaleOwner`, nothing written) once another owner has taken the store's lease: the
  seam a fleet's lease uses. One box has one fixed token.
- Lifecycle moves are checked where they are written (keelway.store.lifecycle).
- A generation's port claim is written with the generation and released with the
  record that proves it gone: a claim never outlives the proof its process is dead.
- What only this box observes (`store.local`: ports, pids, start ticks) is never in a
  shared record: a `Generation` says which release of which service of which instance,
  its state and exit; its `Presence` is read by generation id, in bulk where a survey
  reads many.
- `ensure_*`, `record_build`, `add_inhibition` and `finish_request` are idempotent:
  a repeat changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from keelway.clock import Clock
from keelway.journal import Cause, Inhibition, OpKind, StepKind
from keelway.store.hosts import Claim
from keelway.store.identities import IdSpace
from keelway.store.imports import ImportJournal, RowAt, SeedRecord, SeedState
from keelway.store.lifecycle import (
    GenState,
    InstanceState,
    OpState,
    Removal,
    RequestState,
    RolloutState,
    RouteState,
    StepState,
)
from keelway.store.records import (
    Active,
    Alias,
    App,
    Build,
    CrashRetry,
    DurationCounts,
    Event,
    Fence,
    Generation,
    Instance,
    InstanceView,
    Operation,
    OperationCount,
    Presence,
    Release,
    ReleaseAttempt,
    ReleaseDraft,
    Request,
    Route,
    Step,
)
from keelway.store.rollouts import Figures, HostState, RolloutCohort, RolloutJournal

T = TypeVar("T")

__all__ = ["NOUNS", "AppStore", "BoxLocalStore", "BuildStore", "GenerationStore",
           "ImportStore", "InstanceStore", "OperationStore", "RolloutStore", "RouteStore",
           "Store", "protocol_methods"]


class AppStore(Protocol):
    """Apps and their config: created, destroyed, forgotten."""

    def get_app(self, name: str) -> App | None: ...

    def list_apps(self) -> list[App]: ...

    def ensure_app(self, name: str) -> App:
        """The app, created if missing (idempotent)."""
        ...

    def set_app_config(self, app: App, config: dict[str, str]) -> App:
        """Compare-and-swap on `app.version`."""
        ...

    def create_app(self, name: str) -> App:
        """A new app; `Conflict` if the name is taken."""
        ...

    def mark_destroying(self, name: str, removal: Removal) -> None:
        """The durable intent of a destroy, before its first effect (a purge stays)."""
        ...

    def destroying_apps(self) -> list[App]: ...

    def forget_app(self, name: str) -> None:
        """Delete the app's releases, builds and row; `Conflict` while it has instances.
        Journal, events and idempotency keys stay."""
        ...


class InstanceStore(Protocol):
    """Instances and their domains (aliases), fences and identity numbers."""

    def get_instance(self, host: str) -> Instance | None: ...

    def list_instances(self, app: str | None = None) -> list[Instance]: ...

    def ensure_instance(self, host: str, app: str) -> Instance:
        """The instance, created RUNNING if missing (idempotent)."""
        ...

    def set_instance_state(self, inst: Instance, state: InstanceState,
                           down_reason: str | None = None) -> Instance:
        """Compare-and-swap on `inst.version`."""
        ...

    def bump_schedule(self, host: str) -> int:
        """Advance the instance's schedule revision; attempts holding an older one are
        stale. `NotFound` if there is no such instance."""
        ...

    def add_instances(self, app: str, hosts: Sequence[str],
                      config: Mapping[str, str], parked: bool = False) -> list[Instance]:
        """New instances, all or none, each `adding`; `HostTaken` if a host names
        anything already, `NotFound` without the app (or while it is destroyed).
        `parked`: PARKED, routes parked, the latest release deferred to their wake."""
        ...

    def adding_instances(self) -> list[Instance]: ...

    def finish_adding(self, hosts: Sequence[str]) -> None: ...

    def set_instance_config(self, inst: Instance, config: Mapping[str, str]) -> Instance:
        """Compare-and-swap on `inst.version`."""
        ...

    def mark_removing(self, host: str, removal: Removal) -> None:
        """A removal's durable intent, before its operation begins (a purge stays)."""
        ...

    def withdraw_instance(self, host: str, removal: Removal) -> bool:
        """A removal's intent, the instance STOPPED and its routes (aliases too) gated,
        in one write; True if it had a route."""
        ...

    def removing_instances(self) -> list[Instance]: ...

    def forget_instance(self, host: str) -> None:
        """Delete the instance's records; `Conflict` while a generation is not gone."""
        ...

    def claim(self, host: str) -> Claim | None:
        """What `host` names now, if anything."""
        ...

    def add_aliases(self, instance: str, hosts: Sequence[str]) -> list[Alias]:
        """Aliases routed as the instance's primary host, in the same write."""
        ...

    def remove_aliases(self, instance: str, hosts: Sequence[str]) -> list[Alias]: ...

    def list_aliases(self, instance: str | None = None) -> list[Alias]: ...

    def identity_number(self, space: IdSpace, name: str) -> int:
        """The number of `name` in `space`, allocated once and never given to another
        name (keelway/store/identities.py)."""
        ...

    def get_fence(self, instance: str) -> Fence | None: ...

    def fenced(self, instance: str) -> bool:
        """Whether a fence is held on `instance` now."""
        ...

    def fence(self, instance: str, reason: str | None) -> Fence:
        """A new, held fence generation (one more than any before); `NotFound` if there
        is no such instance."""
        ...

    def unfence(self, instance: str, generation: int) -> tuple[Fence | None, bool]:
        """Lift the fence if `generation` is the held one; (the fence now, whether this
        lifted it). A stale generation changes nothing."""
        ...

    def fenced_instances(self) -> set[str]:
        """Every instance a fence holds."""
        ...

    def list_fences(self) -> list[Fence]:
        """Every instance's fence record, held or lifted, by instance (status reads them
        in bulk)."""
        ...

    def instance_views(self) -> list[InstanceView]:
        """Every instance as convergence reads it (`gather`'s records), in bulk."""
        ...


class BuildStore(Protocol):
    """Builds and the releases made of them."""

    def record_build(self, app: str, digest: str, path: str,
                     source: dict[str, str] | None = None) -> Build:
        """The build, recorded if new (idempotent); a `source` given replaces the one
        recorded (the latest staging says where it came from; releases written before
        keep theirs)."""
        ...

    def mark_build_good(self, app: str, digest: str) -> None: ...

    def list_builds(self, app: str | None = None) -> list[Build]: ...

    def forget_build(self, app: str, digest: str) -> None: ...

    def pinned_builds(self, keep: Mapping[str, int] | None = None) -> set[tuple[str, str]]:
        """Builds that gc must keep: those of releases (with `keep`, each app's newest
        `keep[app]`, its last good ones and the deferred ones), of ACTIVE and of every
        generation not gone."""
        ...

    def create_release(self, app: str, build_digest: str, config: dict[str, str],
                       description: str) -> Release:
        """The app's next release: numbers only grow, per app."""
        ...

    def next_release_number(self, app: str) -> int: ...

    def list_releases(self, app: str) -> list[Release]:
        """Newest first."""
        ...

    def get_release(self, app: str, number: int) -> Release | None: ...


class OperationStore(Protocol):
    """Operations and their steps, idempotency keys, events."""

    def begin_operation(self, app: str, instance: str, kind: OpKind, owner: str,
                        key: str | None = None, request_digest: str | None = None,
                        schedule_rev: int = 0) -> Operation:
        """A RUNNING operation; an idempotency `key` names one operation per instance."""
        ...

    def get_operation(self, op_id: int) -> Operation | None: ...

    def find_operation_by_key(self, instance: str, key: str) -> Operation | None: ...

    def latest_operation(self, instance: str) -> Operation | None:
        """The newest operation that convergence reads: a one-off (a run, a job's run:
        `OpKind.one_off`) changes nothing of the instance's state, so it is never the
        latest."""
        ...

    def unfinished_runs(self) -> list[Operation]:
        """One-offs (runs and jobs' runs) not yet terminal, oldest first: after a crash,
        the ones no live control plane owns are finalized (keelway/deploy/runs.py)."""
        ...

    def keyed_operations(self, kind: OpKind, since: float,
                         app: str | None = None) -> list[Operation]:
        """Operations of `kind` with a key, begun at or after `since` (of `app` when
        given), oldest first, their steps not read: the runs of scheduled jobs
        (keyed by job and scheduled time) the scheduler and `keelway jobs` read."""
        ...

    def latest_operation_of(self, instance: str, kinds: Collection[OpKind]) -> Operation | None:
        """The instance's newest operation of one of `kinds`, a run included if asked
        for (its steps are not read)."""
        ...

    def latest_operations_of(self, kinds: Collection[OpKind]) -> list[Operation]:
        """`latest_operation_of` for every instance any operation names at once (its
        instance there or not), oldest first, their steps not read: one read for boot."""
        ...

    def release_attempts(self, app: str, kinds: Collection[OpKind]) -> list[ReleaseAttempt]:
        """Each (instance, release, build) an operation of `kinds` started processes
        of, with the newest such operation and its state, oldest first: whether a
        release failed where it was tried (`keelway releases`)."""
        ...

    def list_operations(self, app: str, instance: str | None = None,
                        limit: int = 50) -> list[Operation]: ...

    def operation_counts(self) -> list[OperationCount]:
        """Every app's operations counted by kind and state, in one grouped read
        (operations are never deleted, so within a store each count only grows)."""
        ...

    def duration_counts(self, kind: OpKind,
                        bounds_s: Sequence[float]) -> dict[str, DurationCounts]:
        """Per app, its succeeded operations of `kind` by how long each took, counted at
        or under each of `bounds_s` (ascending), in one read: a histogram from the
        journal, which a restart of the control plane does not reset."""
        ...

    def finish_operation(self, op: Operation, state: OpState, error: str | None = None,
                         warnings: list[str] | None = None) -> Operation:
        """Compare-and-swap on `op.version`; a terminal operation stays terminal."""
        ...

    def begin_step(self, op_id: int, kind: StepKind, *, service: str | None = None,
                   before_gen: int | None = None, after_gen: int | None = None,
                   detail: str | None = None) -> int:
        """Append a PENDING step; returns its number (1, 2, ... per operation)."""
        ...

    def finish_step(self, op_id: int, seq: int, state: StepState, *,
                    error: str | None = None, detail: str | None = None,
                    after_gen: int | None = None) -> None: ...

    def converge_step(self, op_id: int, seq: int, detail: str,
                      fail_with: str | None = None) -> None:
        """Mark a step's candidate dealt with; `fail_with` also marks the step failed."""
        ...

    def add_warnings(self, op: Operation, warnings: list[str]) -> Operation:
        """Merge `warnings` into the operation's (a fact: no compare)."""
        ...

    def steps(self, op_id: int) -> list[Step]: ...

    def unfinished_operations(self) -> list[int]:
        """Operations not terminal whose instance no longer exists."""
        ...

    def begin_request(self, key: str, app: str, kind: str, digest: str,
                      owner: str) -> tuple[Request, bool]:
        """Claim `key` for a request; (the existing request, False) if it was claimed."""
        ...

    def finish_request(self, key: str, state: RequestState, result: str) -> None:
        """Record a running request's outcome; one already over keeps its own."""
        ...

    def get_request(self, key: str) -> Request | None: ...

    def running_requests(self) -> list[Request]: ...

    def add_event(self, kind: str, message: str, *, app: str | None = None,
                  instance: str | None = None) -> None: ...

    def list_events(self, app: str | None = None, limit: int = 100,
                    after: int = 0) -> list[Event]:
        """The newest `limit` events with an id above `after`, oldest first."""
        ...


class RouteStore(Protocol):
    """Routes: what each host is served by, and the route table's version."""

    def set_route(self, host: str, instance: str, state: RouteState, port: int | None,
                  generation_id: int | None, *, expected: Route | None) -> Route:
        """Compare-and-swap on the route the caller read (None: there was none)."""
        ...

    def get_route(self, host: str) -> Route | None: ...

    def list_routes(self) -> list[Route]: ...

    def next_route_table_version(self, at_least: int = 0) -> int:
        """Bump and return the route table version: it only grows (never below
        `at_least` + 1)."""
        ...


class ImportStore(Protocol):
    """Seed imports: the journal that is the import gate, the import's row, the record's seed."""

    def get_import(self, instance: str) -> ImportJournal | None: ...

    def list_imports(self) -> list[ImportJournal]: ...

    def row_at(self, host: str) -> RowAt | None:
        """The host's primary route row: its state and the seed it names, if any."""
        ...

    def seed_record(self, host: str) -> SeedRecord | None: ...

    def begin_import(self, instance: str, seed: str, *, env_before: dict[str, str | None],
                     sha256: str) -> ImportJournal:
        """The journal row (IMPORTING) and the gate closed (the host's row gated and
        named the import's, the instance STOPPED, the record naming the seed), in one
        write; `Conflict` while an import is journaled at the host."""
        ...

    def fence_import(self, instance: str, seed: str) -> ImportJournal:
        """The journal's fence generation held (a new one bumped and stored if not)."""
        ...

    def open_import_gate(self, instance: str, seed: str) -> ImportJournal:
        """IMPORTING -> SWAPPED, the record imported, the instance reinstated."""
        ...

    def close_import_gate(self, instance: str, seed: str) -> ImportJournal:
        """Rollback step 1: ROLLING_BACK under a new fence generation, the import's row
        gated, the record aborted, in one write."""
        ...

    def restore_import_route(self, instance: str, seed: str) -> ImportJournal:
        """Rollback step 4: the original route back and CLEANUP_PENDING in one write;
        `Conflict` while the row at the host is not the import's."""
        ...

    def delete_import(self, instance: str, seed: str) -> bool:
        """Rollback step 7: the row gone if it names `seed` in CLEANUP_PENDING."""
        ...

    def cas_seed_record(self, record: str, seed: str, expected: frozenset[SeedState],
                        state: SeedState) -> bool:
        """The record to `state` only if it names `seed` in one of `expected`."""
        ...


class GenerationStore(Protocol):
    """Generations as records, ACTIVE, inhibitions, crash retries."""

    def plan_generation(self, *, app: str, instance: str, service: str, release: int,
                        build_digest: str, op_id: int | None) -> Generation:
        """A PLANNED generation (`Store.plan_generation` writes it with this box's
        presence of it, its port claim)."""
        ...

    def set_generation_state(self, gen: Generation, state: GenState) -> Generation:
        """Compare-and-swap on `gen.version`; the move is checked."""
        ...

    def record_exit(self, gen_id: int, exit_code: int | None,
                    cause: str | None = None) -> Generation:
        """The generation proven gone, with its exit code and `cause` (why the kernel
        ended it, when it did), and its inhibitions freed in the same write (a fact: no
        compare; repeating it changes nothing). The port claim is this box's:
        `Store.record_gone` frees both."""
        ...

    def get_generation(self, gen_id: int) -> Generation | None: ...

    def live_generations(self, instance: str | None = None) -> list[Generation]: ...

    def recent_generations(self, instance: str, limit: int = 20) -> list[Generation]: ...

    def generation_ids(self, instance: str) -> set[int]:
        """The ids of every generation recorded of `instance`, gone ones too (forgotten
        with the instance: a log file none of them names is not this instance's)."""
        ...

    def active_generations(self) -> list[Generation]:
        """What ACTIVE names, every instance and service (web first per instance)."""
        ...

    def get_active(self, instance: str, service: str) -> Active | None: ...

    def list_active(self, instance: str | None = None) -> list[Active]: ...

    def set_active(self, instance: str, service: str, generation_id: int, *,
                   expected: Active | None) -> Active:
        """Compare-and-swap on the ACTIVE row the caller read (None: there was none)."""
        ...

    def add_inhibition(self, generation_id: int, reason: Inhibition,
                       op_id: int | None) -> None:
        """Idempotent."""
        ...

    def remove_inhibition(self, generation_id: int, reason: Inhibition) -> None: ...

    def inhibitions(self, generation_id: int) -> list[Inhibition]: ...

    def get_crash_retry(self, instance: str, service: str) -> CrashRetry | None: ...

    def pending_retries(self, instance: str | None = None) -> list[CrashRetry]:
        """Backoffs still waiting to restart the generation ACTIVE names."""
        ...


class BoxLocalStore(Protocol):
    """Facts only this box observes of the generations it runs, each a `Presence` keyed
    by the generation's id: the port claimed for it, its leader's pid and start ticks.
    No method takes or returns a shared record, so a fleet can keep these in a file of
    the box while the generations live in a shared database."""

    def add_presence(self, generation_id: int, port: int | None) -> Presence:
        """The presence of a generation just planned, holding the claim on `port`;
        `Conflict` (nothing written) if the port is claimed or the presence exists."""
        ...

    def record_process(self, generation_id: int, pid: int, start_ticks: int) -> Presence:
        """The pid and start ticks of the generation's spawned leader."""
        ...

    def free_port(self, generation_id: int) -> None:
        """Release the generation's port claim (its port stays recorded); idempotent."""
        ...

    def presence(self, generation_id: int) -> Presence:
        """What this box observes of it: all None if nothing (never spawned here)."""
        ...

    def presences(self, generation_ids: Iterable[int]) -> dict[int, Presence]:
        """`presence` of each of `generation_ids`, in one read: the bulk form every
        survey uses (the reconciler's, the route table's, `status`)."""
        ...

    def claimed_ports(self) -> set[int]: ...

    def port_claimed(self, port: int) -> bool:
        """Whether a live generation claims `port`: one index lookup, where
        `claimed_ports` reads every claim (a spawn at a thousand instances asks)."""
        ...


class RolloutStore(Protocol):
    """Rollouts: one release's journaled way across an app's instances, in cohorts
    (keelway/store/rollouts.py)."""

    def begin_rollout(self, app: str, release: int, previous: int | None, kind: OpKind,
                      cohorts: Sequence[RolloutCohort],
                      overrides: Sequence[tuple[str, str]] = ()) -> RolloutJournal:
        """A RUNNING rollout at its first cohort, every host PENDING, with the release's
        own `--rollout` `overrides`; every rollout of the app that has not ended is
        SUPERSEDED in the same write."""
        ...

    def get_rollout(self, rollout_id: int) -> RolloutJournal | None: ...

    def latest_rollout(self, app: str) -> RolloutJournal | None: ...

    def running_rollouts(self) -> list[RolloutJournal]:
        """Every RUNNING rollout, oldest first: what a boot after a crash carries on."""
        ...

    def rollout_counts(self) -> list[tuple[str, RolloutState, int]]:
        """How many rollouts each app has had in each state, (app, state, count) in one
        grouped read (/metrics: rollouts by outcome)."""
        ...

    def mark_rollout_hosts(self, rollout_id: int, hosts: Sequence[str], state: HostState,
                           reason: str | None = None) -> None:
        """`hosts` of the rollout in `state`, in one write (a fact: no compare, and the
        rollout's version stays); `NotFound` if there is no such rollout."""
        ...

    def move_rollout(self, rollout: RolloutJournal, state: RolloutState, *,
                     cohort: int | None = None, reason: str | None = None,
                     figures: Figures | None = None) -> RolloutJournal:
        """Where the rollout stands: compare-and-swap on `rollout.version`, the move
        checked; `cohort` None keeps it, `reason` and `figures` are written as given."""
        ...


class Store(Protocol):
    """One store: a handle on each noun, and the intents whose rows span nouns."""

    clock: Clock

    # Read-only, so an implementation may hold its own classes (each one of these).
    @property
    def apps(self) -> AppStore: ...
    @property
    def instances(self) -> InstanceStore: ...
    @property
    def builds(self) -> BuildStore: ...
    @property
    def ops(self) -> OperationStore: ...
    @property
    def routes(self) -> RouteStore: ...
    @property
    def imports(self) -> ImportStore: ...
    @property
    def generations(self) -> GenerationStore: ...
    @property
    def local(self) -> BoxLocalStore: ...
    @property
    def rollouts(self) -> RolloutStore: ...

    def close(self) -> None: ...

    async def sync(self) -> None:
        """Every write committed before the call survives power loss once it returns
        (keelway/durable.py: writes in a deferred scope wait for this or for the next
        durable commit), without holding the event loop for the fsync."""
        ...

    async def read_aside(self, read: Callable[..., T], *args: Any) -> T:
        """`read(store, *args)` over one consistent picture, in a process of its own
        where the backend can (SQLite: keelway/store/aside.py), so a busy event loop
        does not slow it nor it the loop: `read` is a module-level function, and its
        arguments and result cross a process boundary (pickled)."""
        ...

    async def read_apart(self, read: Callable[[Store], T]) -> T:
        """`read` over one consistent picture of the store, away from the event loop
        where the backend can (SQLite: a read-only connection in a worker thread); what
        it returns. For the big reads (`status` of a thousand instances) that would
        otherwise hold every request behind them."""
        ...

    def plan_generation(self, *, app: str, instance: str, service: str, release: int,
                        build_digest: str, op_id: int | None,
                        port: int | None) -> Generation:
        """A PLANNED generation and this box's presence of it, with its port claim, in
        one write (`Conflict`, and no generation, if the port is claimed)."""
        ...

    def record_spawn(self, gen: Generation, pid: int, start_ticks: int) -> Generation:
        """PLANNED -> RUNNING (compare-and-swap on `gen.version`) and the spawn's pid and
        start ticks on its presence, in one write."""
        ...

    def record_gone(self, gen_id: int, exit_code: int | None,
                    cause: str | None = None) -> Generation:
        """A generation proven dead (`record_exit`) and its port claim freed, in one
        write (a fact: no compare; repeating it changes nothing)."""
        ...

    def install(self, instance: str, *, schedule_rev: int,
                candidates: Mapping[str, Generation], retiring: Iterable[int],
                retire_reason: Inhibition, op_id: int,
                release: ReleaseDraft | None) -> Release | None:
        """Release row, ACTIVE, retirement marks, route and instance RUNNING in one
        write; `StaleSchedule` (nothing written) if the schedule moved past
        `schedule_rev`. Returns the release it wrote."""
        ...

    def park(self, inst: Instance) -> Instance:
        """The instance PARKED and its route `parked` (no upstream) in one write;
        compare-and-swap on `inst.version`, the move checked."""
        ...

    def begin_with(self, intent: Callable[[], object], app: str, instance: str,
                   kind: OpKind, owner: str, *, key: str | None = None,
                   request_digest: str | None = None, schedule_rev: int = 0) -> Operation:
        """`intent` (its writes) and the operation begun, in one write."""
        ...

    def finish_with(self, intent: Callable[[], object], op: Operation, state: OpState,
                    error: str | None = None) -> None:
        """`intent` (its writes) and the operation finished, in one write."""
        ...

    def take_out_of_service(self, instance: str, state: InstanceState,
                            reason: str | None = None) -> bool:
        """The instance in `state` and its route gated, in one write; True if the route
        changed (publish). `NotFound` if there is no such instance."""
        ...

    def defer_release(self, instance: str, *, schedule_rev: int, number: int, cause: Cause,
                      release: ReleaseDraft | None) -> Release | None:
        """For a parked instance: release `number` becomes its pending release (its next
        wake runs it, falling back by `cause`), with the release row when `release` is
        given (the rollout's first instance writes it), in one write. `StaleSchedule`
        (nothing written) if the schedule moved past `schedule_rev`."""
        ...

    def defer_releases(self, deferrals: Sequence[tuple[str, int]], *, app: str, kind: OpKind,
                       owner: str, number: int, cause: Cause, key: str | None = None,
                       request_digest: str | None = None) -> list[Operation]:
        """A rollout's deferrals to many parked instances (host, schedule revision), each
        journaled as its own operation with its DEFER step, in one write; an instance
        not parked or rescheduled is passed over. The operations written."""
        ...

    def clear_pending(self, instance: str, number: int) -> None:
        """Forget the pending release if it is still `number` (a newer one stays)."""
        ...

    def activate_and_route(self, instance: str, generations: Mapping[str, int]) -> None:
        """ACTIVE for `generations`, and the route to the ACTIVE web if not gone."""
        ...

    def fall_back(self, instance: str, *, active: Mapping[str, int], unmark: Iterable[int],
                  unmark_reason: Inhibition, web: Generation | None) -> bool:
        """Put back ACTIVE, lift marks, route to `web` (gated if None), in one write.
        True if the route changed."""
        ...

    def record_crash(self, retry: CrashRetry, *, gate_waiting: bool = False) -> bool:
        """Persist a crash and its retry time, and gate a route that served the crashed
        generation in the same write (with `gate_waiting`, a parked or holding route
        too). True if it gated one."""
        ...


# The noun attributes of `Store` and their protocols: what the contract suite's coverage
# check reads, and where each flat name lives.
NOUNS: dict[str, type[Any]] = {
    "apps": AppStore, "instances": InstanceStore, "builds": BuildStore,
    "ops": OperationStore, "routes": RouteStore, "imports": ImportStore,
    "generations": GenerationStore, "local": BoxLocalStore, "rollouts": RolloutStore,
}


def protocol_methods(protocol: type[Any]) -> list[str]:
    """The public methods a protocol declares, in declaration order."""
    return [name for name, value in vars(protocol).items()
            if callable(value) and not name.startswith("_")]
