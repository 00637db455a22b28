"""The in-memory store's box-local facts (BoxLocalStore): what only this box observes
of its generations, their presences (the port claimed, the spawn's pid and start
ticks), by generation id alone, as keelway/store/local.py keeps them."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from keelway.store.errors import Conflict
from keelway.store.records import Presence
from keelway.testing.memory_tables import MemoryDb


class MemoryLocal:
    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    def add_presence(self, generation_id: int, port: int | None) -> Presence:
        with self._db.write() as t:
            if port is not None and port in t.port_claims:
                raise Conflict(f"port {port} is already claimed")
            if generation_id in t.presences:
                raise Conflict(f"the presence of generation {generation_id} is taken")
            t.presences[generation_id] = Presence(generation_id, port)
            if port is not None:
                t.port_claims[port] = generation_id
            return t.presences[generation_id]

    def record_process(self, generation_id: int, pid: int, start_ticks: int) -> Presence:
        with self._db.write() as t:
            t.presences[generation_id] = msgspec.structs.replace(
                self.presence(generation_id), pid=pid, start_ticks=start_ticks)
            return t.presences[generation_id]

    def free_port(self, generation_id: int) -> None:
        with self._db.write() as t:
            for port in [p for p, g in t.port_claims.items() if g == generation_id]:
                del t.port_claims[port]

    def presence(self, generation_id: int) -> Presence:
        return self._db.tables.presences.get(generation_id) or Presence(generation_id)

    def presences(self, generation_ids: Iterable[int]) -> dict[int, Presence]:
        return {gen_id: self.presence(gen_id) for gen_id in sorted(set(generation_ids))}

    def claimed_ports(self) -> set[int]:
        return set(self._db.tables.port_claims)

    def port_claimed(self, port: int) -> bool:
        return port in self._db.tables.port_claims
