"""The SQLite store's box-local facts: what only the box that runs a generation can
observe of it (its pid and start ticks, a process proven dead) and the ports claimed on
this box. A fleet shares generations as records (keelway/store/generations.py); these
facts stay with the box."""

from __future__ import annotations

from keelway.store.db import Db
from keelway.store.generations import SqliteGenerations
from keelway.store.lifecycle import GenState, check
from keelway.store.records import Generation


class SqliteLocal:
    """Spawns, deaths and port claims (`BoxLocalStore`) of the generations it is given."""

    def __init__(self, db: Db, generations: SqliteGenerations) -> None:
        self.db = db
        self._generations = generations

    def record_spawn(self, gen: Generation, pid: int, start_ticks: int) -> Generation:
        """PLANNED -> RUNNING with its pid and start time. `gen` is the record the caller
        read: one written since is left as it is (`Conflict`)."""
        with self.db.tx(f"record the spawn of generation {gen.id}") as c:
            self._generations.refuse_stale(gen, GenState.RUNNING)
            c.execute("UPDATE generations SET state=?, pid=?, start_ticks=?, version=version+1"
                      " WHERE id=? AND version=?",
                      (GenState.RUNNING.value, pid, start_ticks, gen.id, gen.version))
        return self._generations.for_update(gen.id)

    def record_gone(self, gen_id: int, exit_code: int | None) -> Generation:
        """Record a generation proven dead, and free its port claim in the same write."""
        with self.db.tx(f"record generation {gen_id} gone") as c:
            gen = self._generations.for_update(gen_id)
            if gen.state is not GenState.GONE:
                check(gen.state, GenState.GONE)
                c.execute(
                    "UPDATE generations SET state=?, exit_code=?, exited_at=?,"
                    " version=version+1 WHERE id=?",
                    (GenState.GONE.value, exit_code, self.db.clock.now(), gen_id),
                )
            c.execute("DELETE FROM port_claims WHERE generation_id=?", (gen_id,))
            c.execute("DELETE FROM inhibitions WHERE generation_id=?", (gen_id,))
        return self._generations.for_update(gen_id)

    def claimed_ports(self) -> set[int]:
        return {int(r[0]) for r in self.db.rows("SELECT port FROM port_claims")}
