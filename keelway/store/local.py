"""The SQLite store's box-local facts (`BoxLocalStore`): what only the box that runs a
generation observes of it, its presence (the port claimed for it, its leader's pid and
start ticks), and so the ports claimed on this box. A fleet shares generations as
records (keelway/store/generations.py); `presences` stays with the box, so it names a
generation by its id alone: no join and no foreign key into the shared records, and a
later box-local file holds it unchanged."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable

from keelway.store.db import Db
from keelway.store.errors import Conflict
from keelway.store.records import Presence


class SqliteLocal:
    """Presences and the port claims they hold (`BoxLocalStore`)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def add_presence(self, generation_id: int, port: int | None) -> Presence:
        with self.db.tx(f"record the presence of generation {generation_id}") as c:
            if port is not None and c.execute(
                    "SELECT 1 FROM presences WHERE port=? AND claimed_at IS NOT NULL",
                    (port,)).fetchone():
                raise Conflict(f"port {port} is already claimed")
            c.execute("INSERT INTO presences(generation_id, port, claimed_at) VALUES (?, ?, ?)",
                      (generation_id, port, None if port is None else self.db.clock.now()))
        return self.presence(generation_id)

    def record_process(self, generation_id: int, pid: int, start_ticks: int) -> Presence:
        with self.db.tx(f"record the process of generation {generation_id}") as c:
            c.execute("INSERT INTO presences(generation_id, pid, start_ticks) VALUES (?, ?, ?)"
                      " ON CONFLICT(generation_id) DO UPDATE SET pid=excluded.pid,"
                      " start_ticks=excluded.start_ticks", (generation_id, pid, start_ticks))
        return self.presence(generation_id)

    def free_port(self, generation_id: int) -> None:
        with self.db.tx(f"free the port of generation {generation_id}") as c:
            c.execute("UPDATE presences SET claimed_at=NULL WHERE generation_id=?",
                      (generation_id,))

    def presence(self, generation_id: int) -> Presence:
        found = self.db.first(_presence, "SELECT * FROM presences WHERE generation_id=?",
                              generation_id)
        return found if found is not None else Presence(generation_id)

    def presences(self, generation_ids: Iterable[int]) -> dict[int, Presence]:
        wanted = set(generation_ids)
        rows = self.db.rows("SELECT * FROM presences WHERE generation_id IN"
                            " (SELECT value FROM json_each(?))", _ids(wanted))
        found = {p.generation_id: p for p in map(_presence, rows)}
        return {gen_id: found.get(gen_id) or Presence(gen_id) for gen_id in sorted(wanted)}

    def claimed_ports(self) -> set[int]:
        return {int(r[0]) for r in self.db.rows(
            "SELECT port FROM presences WHERE claimed_at IS NOT NULL")}

    def port_claimed(self, port: int) -> bool:
        return self.db.row("SELECT 1 FROM presences WHERE port=? AND claimed_at IS NOT NULL",
                           port) is not None


def _ids(generation_ids: Iterable[int]) -> str:
    """Ids bound as one JSON array: one statement whatever their count, so a thousand
    generations are neither a thousand reads nor past SQLite's limit on parameters."""
    return json.dumps(sorted(set(generation_ids)))


def _presence(r: sqlite3.Row) -> Presence:
    return Presence(r["generation_id"], r["port"], r["pid"], r["start_ticks"])
