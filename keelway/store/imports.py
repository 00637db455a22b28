"""The SQLite store's seed imports: the import journal (table `seed_imports`), the import's row
at the instance's host (`routes.seed`), and the instance record's seed (`instances.seed`,
`instances.seed_state`). SPEC §4 Seed import; the steps that call these are
keelway/deploy/seeding.py.

Rules, each kept inside one transaction:
- One journal row per instance: it is the import gate. `begin_import` refuses while a
  row exists, so no second import (and no second import row) is minted at a host whose
  import is still in effect or being undone.
- The journal moves only along `ImportState`'s table (`_MOVES`), from the state the
  caller names; a row in a state this keelway does not know is never moved or deleted
  (the rollback reports it and leaves it alone).
- Every route write acts only on the import's own row: the host's primary route row
  whose `seed` names the journal's seed. Any other row at the host is someone else's and
  is not touched; no row at all stays no row.
- Fence generations come from the fences table (keelway/store/instances.py): the journal
  stores the one its writer holds, in the same write that bumps it, so no crash can
  leave a held fence whose generation the journal does not know.
- The record's seed moves by compare-and-swap on (app, host, seed, state): a record that
  names another seed, or is gone, is left as it is.
"""

from __future__ import annotations

import enum
import json
import sqlite3
from collections.abc import Iterable
from typing import assert_never

import msgspec

from keelway.store.db import Db, swap
from keelway.store.errors import Conflict, NotFound
from keelway.store.hosts import mirror_aliases
from keelway.store.lifecycle import InstanceState, RouteState, check


class ImportState(enum.StrEnum):
    """Where an import (or its undoing) stands; the rollback resumes from here."""

    # Journaled, gate closed; the database and key are being laid down under the fence.
    IMPORTING = "importing"
    # The import is in effect: its row serves the host on the seeded database.
    SWAPPED = "swapped"
    # The gate is closed again under a new fence generation; local data coming off.
    ROLLING_BACK = "rolling-back"
    # The original route is back; the seed's copy, the replica and the row remain.
    CLEANUP_PENDING = "cleanup-pending"


_MOVES: dict[ImportState, frozenset[ImportState]] = {
    ImportState.IMPORTING: frozenset({ImportState.SWAPPED, ImportState.ROLLING_BACK}),
    ImportState.SWAPPED: frozenset({ImportState.ROLLING_BACK}),
    ImportState.ROLLING_BACK: frozenset({ImportState.CLEANUP_PENDING}),
    ImportState.CLEANUP_PENDING: frozenset(),
}


class SeedState(enum.StrEnum):
    """The seed as the instance record names it."""

    IMPORTING = "importing"
    IMPORTED = "imported"
    # A rollback has begun: the import is abandoned, its replica the import's to delete.
    ABORTED = "aborted"
    ROLLED_BACK = "rolled-back"


ABANDONED = frozenset({SeedState.ABORTED, SeedState.ROLLED_BACK})


class ImportJournal(msgspec.Struct, frozen=True):
    """One import's journal row. `state` is the raw word: `known` is None for a word
    this keelway never wrote (a newer one did, or a restored store), which nothing
    acts on. `env_before`: the env file's values, before the import, of the names it
    writes (None: absent); secrets, never shown."""

    instance: str
    seed: str
    state: str
    fence_gen: int | None
    env_before: dict[str, str | None]
    record: str
    had_route: bool
    instance_before: InstanceState
    sha256: str
    created_at: float
    updated_at: float
    version: int

    @property
    def known(self) -> ImportState | None:
        try:
            return ImportState(self.state)
        except ValueError:
            return None


class RowAt(msgspec.Struct, frozen=True):
    """The primary route row at a host as the rollback judges it."""

    state: RouteState
    seed: str | None


class SeedRecord(msgspec.Struct, frozen=True):
    app: str
    host: str
    seed: str | None
    state: SeedState | None


def record_key(app: str, host: str) -> str:
    return f"{app}/{host}"


def journaled(journal: ImportJournal | None, instance: str, seed: str,
              states: Iterable[ImportState]) -> ImportJournal:
    """`journal` (the row at `instance`) if it names `seed` in one of `states`: what
    every write of an import checks first, on every backend; `Conflict` otherwise."""
    states = tuple(states)
    if journal is None or journal.seed != seed:
        raise Conflict(f"no import {seed} is journaled at {instance}")
    if journal.known not in states:
        raise Conflict(f"import {seed} at {instance} is {journal.state}, not "
                       + " or ".join(s.value for s in states))
    return journal


def check_move(journal: ImportJournal, to: ImportState) -> None:
    """`Conflict` unless `to` is a move of the journal's table from where it is."""
    have = journal.known
    if have is None or to not in _MOVES[have]:
        raise Conflict(f"import {journal.seed} at {journal.instance}: {journal.state}"
                       f" -> {to.value} is not a move of the journal")


class SqliteImports:
    """Import journals, import rows and the records' seeds (`ImportStore`)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def get_import(self, instance: str) -> ImportJournal | None:
        return self.db.first(_journal, "SELECT * FROM seed_imports WHERE instance=?",
                             instance)

    def list_imports(self) -> list[ImportJournal]:
        return [_journal(r) for r in self.db.rows("SELECT * FROM seed_imports ORDER BY instance")]

    def row_at(self, host: str) -> RowAt | None:
        row = self.db.row("SELECT state, seed FROM routes WHERE host=? AND instance=?",
                        host, host)
        return RowAt(RouteState(row["state"]), row["seed"]) if row else None

    def seed_record(self, host: str) -> SeedRecord | None:
        row = self.db.row("SELECT app, host, seed, seed_state FROM instances WHERE host=?",
                        host)
        if row is None:
            return None
        return SeedRecord(row["app"], row["host"], row["seed"],
                          SeedState(row["seed_state"]) if row["seed_state"] else None)

    def begin_import(self, instance: str, seed: str, *, env_before: dict[str, str | None],
                     sha256: str) -> ImportJournal:
        """Journal the import and close its gate, in one write: the row (IMPORTING), the
        host's route gated and named the import's (one gated row is inserted if the host
        had none), the instance STOPPED (so nothing restarts it and no pass reopens the
        route), the record naming the seed as importing. `Conflict` (nothing written)
        while another import is journaled at the host; `NotFound` without the instance.

        One write and not two: a journal with its gate still open would be a row the
        rollback must call someone else's, and hold on forever."""
        with self.db.tx(f"begin import {seed} at {instance}") as c:
            inst = self.db.row("SELECT app, state FROM instances WHERE host=?", instance)
            if inst is None:
                raise NotFound(f"instance {instance}")
            held = self.get_import(instance)
            if held is not None:
                raise Conflict(f"{instance} has import {held.seed} journaled ({held.state})")
            before = InstanceState(inst["state"])
            route = self.row_at(instance)
            now = self.db.clock.now()
            c.execute(
                "INSERT INTO seed_imports(instance, seed, state, fence_gen, env_before,"
                " record, had_route, instance_before, sha256, created_at, updated_at)"
                " VALUES (?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?)",
                (instance, seed, ImportState.IMPORTING.value, json.dumps(env_before),
                 record_key(inst["app"], instance), int(route is not None), before.value,
                 sha256, now, now))
            check(before, InstanceState.STOPPED)
            c.execute("UPDATE instances SET state=?, down_reason=?, seed=?, seed_state=?,"
                      " version=version+1 WHERE host=?",
                      (InstanceState.STOPPED.value, f"seed import {seed}", seed,
                       SeedState.IMPORTING.value, instance))
            if route is not None:
                check(route.state, RouteState.GATED)
            c.execute(
                "INSERT INTO routes(host, instance, state, port, generation_id, seed)"
                " VALUES (?, ?, ?, NULL, NULL, ?) ON CONFLICT(host) DO UPDATE SET"
                " state=excluded.state, port=NULL, generation_id=NULL, seed=excluded.seed,"
                " version=routes.version+1",
                (instance, instance, RouteState.GATED.value, seed))
            mirror_aliases(c, instance)
            journal = self.get_import(instance)
        assert journal is not None
        return journal

    def fence_import(self, instance: str, seed: str) -> ImportJournal:
        """The import's fence held, in one write: kept when the fence held now is the
        journal's generation, else a new generation bumped, held and stored in the
        journal. `Conflict` unless the row names `seed` in IMPORTING or ROLLING_BACK."""
        with self.db.tx(f"fence import {seed} at {instance}") as c:
            journal = self._journal_in(instance, seed, ImportState.IMPORTING,
                                       ImportState.ROLLING_BACK)
            fence = self.db.row("SELECT generation, held FROM fences WHERE instance=?",
                              instance)
            if (fence is not None and fence["held"]
                    and fence["generation"] == journal.fence_gen):
                return journal
            self._bump_fence(c, instance, seed)
            self._set_fence_gen(c, instance)
            fresh = self.get_import(instance)
        assert fresh is not None
        return fresh

    def open_import_gate(self, instance: str, seed: str) -> ImportJournal:
        """The import in effect, in one write: the journal SWAPPED, the record naming the
        seed as imported, and the instance back in the state it had (RUNNING for one
        that was running or parked, whose processes the caller starts through the
        verified start path; STOPPED otherwise). The route stays gated until that start
        publishes it. Idempotent on a row already SWAPPED."""
        with self.db.tx(f"open the gate of import {seed} at {instance}") as c:
            journal = self._journal_in(instance, seed, ImportState.IMPORTING,
                                       ImportState.SWAPPED)
            if journal.known is ImportState.SWAPPED:
                return journal
            self._move(c, journal, ImportState.SWAPPED)
            c.execute("UPDATE instances SET seed_state=?, version=version+1 WHERE host=?"
                      " AND seed=?", (SeedState.IMPORTED.value, instance, seed))
            self._reinstate(c, instance, journal.instance_before)
            fresh = self.get_import(instance)
        assert fresh is not None
        return fresh

    def close_import_gate(self, instance: str, seed: str) -> ImportJournal:
        """Rollback step 1, in one write: the journal ROLLING_BACK under a new fence
        generation (bumped, held and stored), the import's row gated, the instance
        STOPPED, the record's seed aborted. A row at the host that is not the import's
        is not written. `Conflict` unless the journal names `seed` in IMPORTING or
        SWAPPED (an interrupted import is undone from here too)."""
        with self.db.tx(f"close the gate of import {seed} at {instance}") as c:
            journal = self._journal_in(instance, seed, ImportState.IMPORTING,
                                       ImportState.SWAPPED)
            self._move(c, journal, ImportState.ROLLING_BACK)
            self._bump_fence(c, instance, seed)
            self._set_fence_gen(c, instance)
            row = self.row_at(instance)
            if row is not None and row.seed == seed:
                c.execute("UPDATE routes SET state=?, port=NULL, generation_id=NULL,"
                          " version=version+1 WHERE host=? AND seed=?",
                          (RouteState.GATED.value, instance, seed))
                mirror_aliases(c, instance)
                self._set_state(c, instance, InstanceState.STOPPED, f"seed rollback {seed}")
            c.execute("UPDATE instances SET seed_state=?, version=version+1 WHERE host=?"
                      " AND seed=? AND seed_state IS NOT ?",
                      (SeedState.ABORTED.value, instance, seed, SeedState.ROLLED_BACK.value))
            fresh = self.get_import(instance)
        assert fresh is not None
        return fresh

    def restore_import_route(self, instance: str, seed: str) -> ImportJournal:
        """Rollback step 4, in one write: the original route back and the journal
        CLEANUP_PENDING. The import's row loses its seed (the original row again: gated,
        with no upstream, since its processes were stopped under the fence; the caller's
        verified start publishes it), or goes when the host had no row before the
        import; the instance is back in the state it had. With no row at the host,
        nothing is put back. `Conflict` while the row at the host is someone else's, or
        unless the journal names `seed` in ROLLING_BACK (idempotent in CLEANUP_PENDING)."""
        with self.db.tx(f"restore the route under import {seed} at {instance}") as c:
            journal = self._journal_in(instance, seed, ImportState.ROLLING_BACK,
                                       ImportState.CLEANUP_PENDING)
            if journal.known is ImportState.CLEANUP_PENDING:
                return journal
            row = self.row_at(instance)
            if row is not None and row.seed != seed:
                raise Conflict(f"the route at {instance} is not import {seed}'s")
            if row is not None:
                if journal.had_route:
                    c.execute("UPDATE routes SET seed=NULL, state=?, port=NULL,"
                              " generation_id=NULL, version=version+1 WHERE host=?",
                              (RouteState.GATED.value, instance))
                else:
                    c.execute("DELETE FROM routes WHERE host=?", (instance,))
                mirror_aliases(c, instance)
                self._reinstate(c, instance, journal.instance_before)
            self._move(c, journal, ImportState.CLEANUP_PENDING)
            fresh = self.get_import(instance)
        assert fresh is not None
        return fresh

    def delete_import(self, instance: str, seed: str) -> bool:
        """Rollback step 7: the journal row gone, if it names `seed` in CLEANUP_PENDING;
        True if this deleted it."""
        with self.db.tx(f"delete import {seed} at {instance}") as c:
            cur = c.execute("DELETE FROM seed_imports WHERE instance=? AND seed=? AND state=?",
                            (instance, seed, ImportState.CLEANUP_PENDING.value))
            return cur.rowcount == 1

    def cas_seed_record(self, record: str, seed: str, expected: frozenset[SeedState],
                        state: SeedState) -> bool:
        """The record `record` (app/host) to `state` if it still names `seed` in one of
        `expected`; True if this moved it. The seed's id is never reused, so naming it
        is naming this import."""
        app, _, host = record.partition("/")
        with self.db.tx(f"move the seed of {record} to {state.value}") as c:
            cur = c.execute(
                "UPDATE instances SET seed_state=?, version=version+1 WHERE host=? AND app=?"
                f" AND seed=? AND seed_state IN ({','.join('?' * len(expected))})",
                (state.value, host, app, seed, *sorted(s.value for s in expected)))
            return cur.rowcount == 1

    # -- inside a transaction ----------------------------------------------------------

    def _journal_in(self, instance: str, seed: str, *states: ImportState) -> ImportJournal:
        return journaled(self.get_import(instance), instance, seed, states)

    def _move(self, c: sqlite3.Connection, journal: ImportJournal, to: ImportState) -> None:
        check_move(journal, to)
        swap(c, "seed_imports", {"instance": journal.instance}, journal.version,
             f"the import journal of {journal.instance} changed under us", state=to.value,
             updated_at=self.db.clock.now())

    def _bump_fence(self, c: sqlite3.Connection, instance: str, seed: str) -> None:
        if self.db.row("SELECT 1 FROM instances WHERE host=?", instance) is None:
            # Fences are per instance; with the instance gone there is nothing to fence
            # (and nothing can wake it), so the journal keeps the generation it had.
            return
        c.execute(
            "INSERT INTO fences(instance, generation, held, reason, updated_at)"
            " VALUES (?, 1, 1, ?, ?) ON CONFLICT(instance) DO UPDATE SET"
            " generation=fences.generation+1, held=1, reason=excluded.reason,"
            " updated_at=excluded.updated_at",
            (instance, f"seed {seed}", self.db.clock.now()))

    def _set_fence_gen(self, c: sqlite3.Connection, instance: str) -> None:
        c.execute("UPDATE seed_imports SET fence_gen=(SELECT generation FROM fences WHERE"
                  " instance=?), version=version+1 WHERE instance=?", (instance, instance))

    def _set_state(self, c: sqlite3.Connection, instance: str, state: InstanceState,
                   reason: str | None) -> None:
        row = self.db.row("SELECT state FROM instances WHERE host=?", instance)
        if row is None:
            return
        check(InstanceState(row["state"]), state)
        c.execute("UPDATE instances SET state=?, down_reason=?, version=version+1"
                  " WHERE host=?", (state.value, reason, instance))

    def _reinstate(self, c: sqlite3.Connection, instance: str,
                   before: InstanceState) -> None:
        """The instance in the state it had before the import, as far as one without
        processes can be: running (the caller starts it) or stopped."""
        match before:
            case InstanceState.RUNNING | InstanceState.PARKED:
                self._set_state(c, instance, InstanceState.RUNNING, None)
            case InstanceState.STOPPED | InstanceState.DOWN:
                self._set_state(c, instance, InstanceState.STOPPED, None)
            case _:
                assert_never(before)


def _journal(r: sqlite3.Row) -> ImportJournal:
    return ImportJournal(
        instance=r["instance"], seed=r["seed"], state=r["state"], fence_gen=r["fence_gen"],
        env_before=json.loads(r["env_before"]), record=r["record"],
        had_route=bool(r["had_route"]), instance_before=InstanceState(r["instance_before"]),
        sha256=r["sha256"], created_at=r["created_at"], updated_at=r["updated_at"],
        version=r["version"])
