"""The in-memory store's seed imports (ImportStore): the import journal, the import's
row at the host (a route whose seed names it) and the instance record's seed. The rules
are keelway/store/imports.py's, each kept inside one write: one journal row per instance
(the import gate), moves only along its table, route writes only on the import's own
row, fence generations from the fences, the record's seed by compare-and-swap."""

from __future__ import annotations

from typing import assert_never

import msgspec

from keelway.store.errors import Conflict, NotFound
from keelway.store.imports import (
    ImportJournal,
    ImportState,
    RowAt,
    SeedRecord,
    SeedState,
    check_move,
    journaled,
    record_key,
)
from keelway.store.lifecycle import InstanceState, RouteState, check
from keelway.store.records import Route
from keelway.testing.memory_instances import bump_fence
from keelway.testing.memory_routes import delete_route, mirror_aliases
from keelway.testing.memory_tables import (
    MemoryDb,
    MemoryTables,
    SeedOf,
    own,
    own_or_none,
    owned_by_key,
)


class MemoryImports:
    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    def get_import(self, instance: str) -> ImportJournal | None:
        return own_or_none(self._db.tables.imports.get(instance))

    def list_imports(self) -> list[ImportJournal]:
        return owned_by_key(self._db.tables.imports)

    def row_at(self, host: str) -> RowAt | None:
        return row_at(self._db.tables, host)

    def seed_record(self, host: str) -> SeedRecord | None:
        t = self._db.tables
        inst = t.instances.get(host)
        if inst is None:
            return None
        of = t.seeds.get(host, SeedOf(None, None))
        return SeedRecord(inst.app, host, of.seed, of.state)

    def begin_import(self, instance: str, seed: str, *, env_before: dict[str, str | None],
                     sha256: str) -> ImportJournal:
        now = self._db.clock.now()
        with self._db.write() as t:
            inst = t.instances.get(instance)
            if inst is None:
                raise NotFound(f"instance {instance}")
            if (held := t.imports.get(instance)) is not None:
                raise Conflict(f"{instance} has import {held.seed} journaled ({held.state})")
            route = row_at(t, instance)
            t.imports[instance] = ImportJournal(
                instance, seed, ImportState.IMPORTING.value, None, dict(env_before),
                record_key(inst.app, instance), route is not None, inst.state, sha256,
                now, now, 1)
            check(inst.state, InstanceState.STOPPED)
            t.instances[instance] = msgspec.structs.replace(
                inst, state=InstanceState.STOPPED, down_reason=f"seed import {seed}",
                version=inst.version + 1)
            t.seeds[instance] = SeedOf(seed, SeedState.IMPORTING)
            if route is not None:
                check(route.state, RouteState.GATED)
            have = t.routes.get(instance)
            t.routes[instance] = (
                msgspec.structs.replace(have, state=RouteState.GATED, port=None,
                                        generation_id=None, version=have.version + 1)
                if have is not None else
                Route(instance, instance, RouteState.GATED, None, None, 1))
            t.route_seeds[instance] = seed
            mirror_aliases(t, instance)
            return own(t.imports[instance])

    def fence_import(self, instance: str, seed: str) -> ImportJournal:
        with self._db.write() as t:
            journal = _journal_in(t, instance, seed, ImportState.IMPORTING,
                                  ImportState.ROLLING_BACK)
            fence = t.fences.get(instance)
            if fence is not None and fence.held and fence.generation == journal.fence_gen:
                return own(journal)
            self._fence(t, instance, seed)
            return own(t.imports[instance])

    def open_import_gate(self, instance: str, seed: str) -> ImportJournal:
        with self._db.write() as t:
            journal = _to_move(t, instance, seed, ImportState.IMPORTING, ImportState.SWAPPED)
            if journal is not None:
                self._move(t, journal, ImportState.SWAPPED)
                _seed_to(t, instance, seed, SeedState.IMPORTED)
                _reinstate(t, instance, journal.instance_before)
            return own(t.imports[instance])

    def close_import_gate(self, instance: str, seed: str) -> ImportJournal:
        with self._db.write() as t:
            journal = _journal_in(t, instance, seed, ImportState.IMPORTING,
                                  ImportState.SWAPPED)
            self._move(t, journal, ImportState.ROLLING_BACK)
            self._fence(t, instance, seed)
            row = row_at(t, instance)
            if row is not None and row.seed == seed:
                have = t.routes[instance]
                t.routes[instance] = msgspec.structs.replace(
                    have, state=RouteState.GATED, port=None, generation_id=None,
                    version=have.version + 1)
                mirror_aliases(t, instance)
                _set_state(t, instance, InstanceState.STOPPED, f"seed rollback {seed}")
            of = t.seeds.get(instance)
            if of is not None and of.seed == seed and of.state is not SeedState.ROLLED_BACK:
                _seed_to(t, instance, seed, SeedState.ABORTED)
            return own(t.imports[instance])

    def restore_import_route(self, instance: str, seed: str) -> ImportJournal:
        with self._db.write() as t:
            journal = _to_move(t, instance, seed, ImportState.ROLLING_BACK,
                               ImportState.CLEANUP_PENDING)
            if journal is None:
                return own(t.imports[instance])
            row = row_at(t, instance)
            if row is not None and row.seed != seed:
                raise Conflict(f"the route at {instance} is not import {seed}'s")
            if row is not None:
                if journal.had_route:
                    have = t.routes[instance]
                    t.routes[instance] = msgspec.structs.replace(
                        have, state=RouteState.GATED, port=None, generation_id=None,
                        version=have.version + 1)
                    t.route_seeds.pop(instance, None)
                else:
                    delete_route(t, instance)
                mirror_aliases(t, instance)
                _reinstate(t, instance, journal.instance_before)
            self._move(t, journal, ImportState.CLEANUP_PENDING)
            return own(t.imports[instance])

    def delete_import(self, instance: str, seed: str) -> bool:
        with self._db.write() as t:
            journal = t.imports.get(instance)
            if (journal is None or journal.seed != seed
                    or journal.state != ImportState.CLEANUP_PENDING.value):
                return False
            del t.imports[instance]
            return True

    def cas_seed_record(self, record: str, seed: str, expected: frozenset[SeedState],
                        state: SeedState) -> bool:
        app, _, host = record.partition("/")
        with self._db.write() as t:
            inst = t.instances.get(host)
            of = t.seeds.get(host)
            if (inst is None or inst.app != app or of is None or of.seed != seed
                    or of.state not in expected):
                return False
            _seed_to(t, host, seed, state)
            return True

    # -- inside a write ------------------------------------------------------------------

    def _move(self, t: MemoryTables, journal: ImportJournal, to: ImportState) -> None:
        check_move(journal, to)
        stored = t.imports.get(journal.instance)
        if stored is None or stored.version != journal.version:
            raise Conflict(f"the import journal of {journal.instance} changed under us")
        t.imports[journal.instance] = msgspec.structs.replace(
            stored, state=to.value, updated_at=self._db.clock.now(),
            version=stored.version + 1)

    def _fence(self, t: MemoryTables, instance: str, seed: str) -> None:
        """A new fence generation held, and the journal storing it, in one write. With
        the instance gone there is nothing to fence: the journal keeps what it had."""
        if instance in t.instances:
            bump_fence(t, instance, f"seed {seed}", self._db.clock.now())
        journal = t.imports[instance]
        fence = t.fences.get(instance)
        t.imports[instance] = msgspec.structs.replace(
            journal, fence_gen=fence.generation if fence else None,
            version=journal.version + 1)


def row_at(t: MemoryTables, host: str) -> RowAt | None:
    """The host's primary route row (its instance's own) and the seed it names."""
    route = t.routes.get(host)
    if route is None or route.instance != host:
        return None
    return RowAt(route.state, t.route_seeds.get(host))


def _journal_in(t: MemoryTables, instance: str, seed: str,
                *states: ImportState) -> ImportJournal:
    return journaled(t.imports.get(instance), instance, seed, states)


def _to_move(t: MemoryTables, instance: str, seed: str, at: ImportState,
             to: ImportState) -> ImportJournal | None:
    """The journal naming `seed` still `at`, for the move to `to`; None when a repeat of
    the move finds it done (the moves that are idempotent)."""
    journal = _journal_in(t, instance, seed, at, to)
    return None if journal.known is to else journal


def _seed_to(t: MemoryTables, host: str, seed: str, state: SeedState) -> None:
    """The record's seed to `state`, with a version bump of the instance."""
    inst = t.instances.get(host)
    of = t.seeds.get(host)
    if inst is None or of is None or of.seed != seed:
        return
    t.seeds[host] = SeedOf(seed, state)
    t.instances[host] = msgspec.structs.replace(inst, version=inst.version + 1)


def _set_state(t: MemoryTables, instance: str, state: InstanceState,
               reason: str | None) -> None:
    inst = t.instances.get(instance)
    if inst is None:
        return
    check(inst.state, state)
    t.instances[instance] = msgspec.structs.replace(inst, state=state, down_reason=reason,
                                                    version=inst.version + 1)


def _reinstate(t: MemoryTables, instance: str, before: InstanceState) -> None:
    """The instance as it was before the import, as far as one without processes can
    be: running (the caller starts it) or stopped."""
    match before:
        case InstanceState.RUNNING | InstanceState.PARKED:
            _set_state(t, instance, InstanceState.RUNNING, None)
        case InstanceState.STOPPED | InstanceState.DOWN:
            _set_state(t, instance, InstanceState.STOPPED, None)
        case _:
            assert_never(before)
