"""The in-memory store's tables and its one kind of transaction (keelway/testing/memory_store.py).

Every table is a plain dict of immutable records (msgspec Structs, replaced, never
mutated) keyed as SQLite keys the same table, with no container nested inside another:
so a shallow copy of each dict is a full snapshot, and `write()` takes one at the start
of an intent and puts it back if the intent raises. A failed write leaves nothing half
done, as a rolled-back BEGIN IMMEDIATE does.

Ids are counters kept in the tables, so a rolled-back write gives its id back (as
SQLite's AUTOINCREMENT does: `sqlite_sequence` rolls back with the insert) and a
committed one is never handed out again, even after its row is deleted.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

from keelway.clock import Clock
from keelway.journal import Inhibition
from keelway.store.errors import StaleOwner
from keelway.store.imports import ImportJournal, SeedState
from keelway.store.records import (
    Active,
    Alias,
    App,
    Build,
    CrashRetry,
    Event,
    Fence,
    Generation,
    Instance,
    Operation,
    Presence,
    Release,
    Request,
    Route,
    Step,
)
from keelway.store.rollouts import RolloutJournal


@dataclass(frozen=True)
class Mark:
    """An inhibition's row beyond its key (generation, reason)."""

    op_id: int | None
    created_at: float


@dataclass(frozen=True)
class SeedOf:
    """The seed an instance record names (SQLite: `instances.seed`, `seed_state`)."""

    seed: str | None
    state: SeedState | None


@dataclass
class MemoryTables:
    """Everything one in-memory store holds. Several `MemoryStore`s over one
    `MemoryTables` are one store opened several times, as a restarted control plane
    opens the same file."""

    # The owner token of the one writer (SPEC §8): taken by each store opened over
    # these tables, checked by every write.
    lease_owner: str | None = None
    route_table_version: int = 0
    apps: dict[str, App] = field(default_factory=dict)
    instances: dict[str, Instance] = field(default_factory=dict)
    seeds: dict[str, SeedOf] = field(default_factory=dict)          # by instance host
    aliases: dict[str, Alias] = field(default_factory=dict)         # by alias host
    identities: dict[tuple[str, str], int] = field(default_factory=dict)  # (space, name)
    fences: dict[str, Fence] = field(default_factory=dict)
    builds: dict[tuple[str, str], Build] = field(default_factory=dict)    # (app, digest)
    releases: dict[tuple[str, int], Release] = field(default_factory=dict)  # (app, n)
    operations: dict[int, Operation] = field(default_factory=dict)  # steps kept apart
    steps: dict[tuple[int, int], Step] = field(default_factory=dict)  # (op, seq)
    requests: dict[str, Request] = field(default_factory=dict)
    events: dict[int, Event] = field(default_factory=dict)
    generations: dict[int, Generation] = field(default_factory=dict)
    presences: dict[int, Presence] = field(default_factory=dict)  # by generation id
    # The ports claimed, each by the generation it names (SQLite: a presence's
    # `claimed_at`, which no read returns).
    port_claims: dict[int, int] = field(default_factory=dict)
    active: dict[tuple[str, str], Active] = field(default_factory=dict)  # (inst, service)
    inhibitions: dict[tuple[int, Inhibition], Mark] = field(default_factory=dict)
    backoff: dict[tuple[str, str], CrashRetry] = field(default_factory=dict)
    routes: dict[str, Route] = field(default_factory=dict)
    route_seeds: dict[str, str] = field(default_factory=dict)  # the import's row's seed
    imports: dict[str, ImportJournal] = field(default_factory=dict)
    rollouts: dict[int, RolloutJournal] = field(default_factory=dict)
    last_operation: int = 0
    last_generation: int = 0
    last_event: int = 0
    last_rollout: int = 0

    def snapshot(self) -> MemoryTables:
        saved = dataclasses.replace(self)
        for f in dataclasses.fields(self):
            setattr(saved, f.name, _copied(getattr(self, f.name)))
        return saved

    def restore(self, saved: MemoryTables) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(saved, f.name))


def _copied(value: object) -> object:
    return dict(value) if isinstance(value, dict) else value


_R = TypeVar("_R", bound=msgspec.Struct)

# The fields of records that hold a container: a record handed out gets its own.
_CONTAINERS: dict[type, tuple[str, ...]] = {
    App: ("config",), Instance: ("config",), Build: ("source",),
    Release: ("config", "source"), Operation: ("warnings", "steps"),
    ImportJournal: ("env_before",),
}


def own(record: _R) -> _R:
    """`record` with containers of its own: a caller who changes a dict or list it read
    changes nothing stored (as a row read from SQLite is the caller's), and the
    snapshot a write restores is never changed under it."""
    fields = _CONTAINERS.get(type(record), ())
    copies = {f: type(v)(v) for f in fields if (v := getattr(record, f)) is not None}
    return msgspec.structs.replace(record, **copies) if copies else record


def own_or_none(record: _R | None) -> _R | None:
    """A read of one record: the caller's own copy, or None when there is none."""
    return own(record) if record is not None else None


def owned_where(table: Mapping[Any, _R], keep: Callable[[_R], bool],
                order: Callable[[_R], Any]) -> list[_R]:
    """A filtered list read: the records `keep` takes, each the caller's own, in `order`
    (the SQLite store's ORDER BY)."""
    return sorted((own(record) for record in table.values() if keep(record)), key=order)


def owned_by_key(table: Mapping[Any, _R]) -> list[_R]:
    """A read of a whole table in its key order (SQLite's primary-key order)."""
    return [own(record) for _, record in sorted(table.items())]


class MemoryDb:
    """The tables, the clock, the writer's owner token and `write()`: what every noun
    of the memory store holds."""

    def __init__(self, tables: MemoryTables, clock: Clock, owner: str) -> None:
        self.tables = tables
        self.clock = clock
        self.owner = owner
        self._depth = 0
        # Opening takes the lease: a handle opened before, by another owner, is stale.
        tables.lease_owner = owner

    @contextlib.contextmanager
    def write(self) -> Iterator[MemoryTables]:
        """One atomic write of the lease's owner (`StaleOwner`, nothing written, once
        another owner took it); nested calls join the outer one (an intent composing
        the nouns' writes), and only the outermost restores the snapshot on an error."""
        if self._depth:
            self._depth += 1
            try:
                yield self.tables
            finally:
                self._depth -= 1
            return
        if self.tables.lease_owner != self.owner:
            raise StaleOwner(self.owner, self.tables.lease_owner)
        saved = self.tables.snapshot()
        self._depth = 1
        try:
            yield self.tables
        except BaseException:
            self.tables.restore(saved)
            raise
        finally:
            self._depth = 0
