"""The SQLite store's generations as records: planned, moved along their lifecycle
(proven gone included), named ACTIVE, marked (inhibitions), and their crash-restart
backoff: what a fleet would share. What only this box observes of them (ports claimed,
pids, start ticks) is keelway/store/local.py."""

from __future__ import annotations

import sqlite3

from keelway.journal import Inhibition
from keelway.store.db import Db, is_foreign_key, swap
from keelway.store.errors import Conflict, NotFound
from keelway.store.lifecycle import GenState, check
from keelway.store.records import Active, CrashRetry, Generation


class SqliteGenerations:
    """Generations, ACTIVE, inhibitions and backoff (`GenerationStore`)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def plan_generation(
        self, *, app: str, instance: str, service: str, release: int, build_digest: str,
        op_id: int | None,
    ) -> Generation:
        """Journal a generation before its spawn (`Store.plan_generation` adds this box's
        presence, its port claim, in the same write).

        Crash after this commit, before the spawn: the reconciler finds a PLANNED row with
        no pid, so there is no process to look for; it marks it gone and frees the claim.
        """
        with self.db.tx(f"plan a {service} generation of {instance}") as c:
            cur = c.execute(
                "INSERT INTO generations(app, instance, service, release, build_digest, op_id,"
                " state, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (app, instance, service, release, build_digest, op_id, GenState.PLANNED.value,
                 self.db.clock.now()),
            )
            gen_id = int(cur.lastrowid or 0)
        return self.for_update(gen_id)

    def set_generation_state(self, gen: Generation, state: GenState) -> Generation:
        """Move `gen` (the record the caller read) to `state`: `Conflict` if it was
        written since, `IllegalTransition` if its lifecycle forbids the move."""
        with self.db.tx(f"set generation {gen.id} {state.value}") as c:
            self.refuse_stale(gen, state)
            c.execute("UPDATE generations SET state=?, version=version+1"
                      " WHERE id=? AND version=?", (state.value, gen.id, gen.version))
        return self.for_update(gen.id)

    def record_exit(self, gen_id: int, exit_code: int | None,
                    cause: str | None = None) -> Generation:
        """The generation proven gone, with its exit code and why the kernel ended it
        (`cause`, if it did), and its marks freed: a fact, written whatever version the
        caller saw; a repeat changes nothing."""
        with self.db.tx(f"record generation {gen_id} gone") as c:
            gen = self.for_update(gen_id)
            if gen.state is not GenState.GONE:
                check(gen.state, GenState.GONE)
                c.execute("UPDATE generations SET state=?, exit_code=?, exited_at=?,"
                          " exit_cause=?, version=version+1 WHERE id=?",
                          (GenState.GONE.value, exit_code, self.db.clock.now(), cause,
                           gen_id))
            c.execute("DELETE FROM inhibitions WHERE generation_id=?", (gen_id,))
        return self.for_update(gen_id)

    def refuse_stale(self, gen: Generation, state: GenState) -> None:
        """The compare of a generation's compare-and-swap, inside the writer's transaction
        (so nothing can write between it and the swap). A stale record is refused before
        its move is judged, so the error names the cause: someone wrote first."""
        if self.for_update(gen.id).version != gen.version:
            raise Conflict(f"generation {gen.id} changed under us")
        check(gen.state, state)

    def get_generation(self, gen_id: int) -> Generation | None:
        return self.db.first(generation_of, "SELECT * FROM generations WHERE id=?", gen_id)

    def for_update(self, gen_id: int) -> Generation:
        gen = self.get_generation(gen_id)
        if gen is None:
            raise NotFound(f"generation {gen_id}")
        return gen

    def live_generations(self, instance: str | None = None) -> list[Generation]:
        """Every generation not proven gone: the records that may name a live process."""
        return [generation_of(r) for r in self.db.select(
            "generations", where="state != 'gone'", order="id", instance=instance)]

    def recent_generations(self, instance: str, limit: int = 20) -> list[Generation]:
        return [generation_of(r) for r in self.db.select("generations", order="id DESC",
                                                          limit=limit, instance=instance)]

    def generation_ids(self, instance: str) -> set[int]:
        """The ids of every generation recorded of `instance`, gone ones too."""
        return {int(r[0]) for r in self.db.rows("SELECT id FROM generations WHERE instance=?",
                                             instance)}

    def get_active(self, instance: str, service: str) -> Active | None:
        return self.db.first(_active, "SELECT * FROM active WHERE instance=? AND service=?",
                             instance, service)

    def active_generations(self) -> list[Generation]:
        """The generation ACTIVE names for every (instance, service), gone ones too."""
        rows = self.db.rows("SELECT g.* FROM generations g JOIN active a ON a.generation_id = g.id"
                         " ORDER BY a.instance, a.service != 'web', a.service")
        return [generation_of(r) for r in rows]

    def list_active(self, instance: str | None = None) -> list[Active]:
        return [_active(r) for r in self.db.select("active", order="instance, service",
                                                    instance=instance)]

    def set_active(self, instance: str, service: str, generation_id: int, *,
                   expected: Active | None) -> Active:
        """Name the ACTIVE generation of one service. `expected` is the row the caller
        read (None: there was none); `Conflict` if ACTIVE moved since."""
        with self.db.tx(f"set active of {service} on {instance}",
                        missing=f"no generation {generation_id}") as c:
            if expected is None:
                try:
                    c.execute("INSERT INTO active(instance, service, generation_id)"
                              " VALUES (?, ?, ?)", (instance, service, generation_id))
                except sqlite3.IntegrityError as exc:
                    if is_foreign_key(exc):
                        raise  # the transaction says which record is missing
                    raise Conflict(f"ACTIVE {service} of {instance} was set under us") from exc
            else:
                swap(c, "active", {"instance": instance, "service": service}, expected.version,
                     f"ACTIVE {service} of {instance} changed under us",
                     generation_id=generation_id)
        active = self.get_active(instance, service)
        assert active is not None
        return active

    def add_inhibition(self, generation_id: int, reason: Inhibition,
                       op_id: int | None) -> None:
        with self.db.tx(f"mark generation {generation_id} {reason.value}",
                        missing=f"no generation {generation_id}") as c:
            c.execute(
                "INSERT INTO inhibitions(generation_id, reason, op_id, created_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (generation_id, reason.value, op_id, self.db.clock.now()),
            )

    def remove_inhibition(self, generation_id: int, reason: Inhibition) -> None:
        with self.db.tx(f"unmark generation {generation_id} {reason.value}") as c:
            c.execute("DELETE FROM inhibitions WHERE generation_id=? AND reason=?",
                      (generation_id, reason.value))

    def inhibitions(self, generation_id: int) -> list[Inhibition]:
        rows = self.db.rows("SELECT reason FROM inhibitions WHERE generation_id=?", generation_id)
        return [Inhibition(r[0]) for r in rows]

    def all_inhibitions(self) -> dict[int, frozenset[Inhibition]]:
        marks: dict[int, set[Inhibition]] = {}
        for r in self.db.rows("SELECT generation_id, reason FROM inhibitions"):
            marks.setdefault(r[0], set()).add(Inhibition(r[1]))
        return {gen_id: frozenset(found) for gen_id, found in marks.items()}

    def save_crash_retry(self, retry: CrashRetry) -> None:
        """The backoff row of (instance, service): one crash and when its restart is due
        (the `record_crash` intent writes it with the route it gates)."""
        with self.db.tx(f"record a crash of {retry.service} on {retry.instance}") as c:
            c.execute(
                "INSERT INTO backoff(instance, service, generation_id, failures, crashed_at,"
                " retry_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(instance, service) DO UPDATE"
                " SET generation_id=excluded.generation_id, failures=excluded.failures,"
                " crashed_at=excluded.crashed_at, retry_at=excluded.retry_at",
                (retry.instance, retry.service, retry.generation_id, retry.failures,
                 retry.crashed_at, retry.retry_at),
            )

    def get_crash_retry(self, instance: str, service: str) -> CrashRetry | None:
        return self.db.first(_crash_retry, "SELECT * FROM backoff WHERE instance=? AND"
                             " service=?", instance, service)

    def pending_retries(self, instance: str | None = None) -> list[CrashRetry]:
        """Backoffs still waiting to restart what ACTIVE names: the crashed generation is
        still the ACTIVE one (anything newer made the row stale) and is recorded gone."""
        sql = ("SELECT b.* FROM backoff b JOIN active a ON a.instance=b.instance AND"
               " a.service=b.service AND a.generation_id=b.generation_id JOIN generations g"
               " ON g.id=b.generation_id WHERE g.state='gone'")
        rows = (self.db.rows(sql + " ORDER BY b.instance, b.service") if instance is None else
                self.db.rows(sql + " AND b.instance=? ORDER BY b.service", instance))
        return [_crash_retry(r) for r in rows]


def generation_of(r: sqlite3.Row) -> Generation:
    return Generation(
        id=r["id"], app=r["app"], instance=r["instance"], service=r["service"],
        release=r["release"], build_digest=r["build_digest"], op_id=r["op_id"],
        state=GenState(r["state"]), created_at=r["created_at"], exited_at=r["exited_at"],
        exit_code=r["exit_code"],
        version=r["version"],
        exit_cause=r["exit_cause"],
    )


def _crash_retry(r: sqlite3.Row) -> CrashRetry:
    return CrashRetry(r["instance"], r["service"], r["generation_id"], r["failures"],
                      r["crashed_at"], r["retry_at"])


def _active(r: sqlite3.Row) -> Active:
    return Active(r["instance"], r["service"], r["generation_id"], r["version"])

