"""The in-memory store's box-local facts (BoxLocalStore): what only this box observes
of its processes, the pid and start ticks of a spawn, the proof one is gone, and the
ports its generations claim."""

from __future__ import annotations

import msgspec

from keelway.store.errors import NotFound
from keelway.store.lifecycle import GenState, check
from keelway.store.records import Generation
from keelway.testing.memory_generations import refuse_stale
from keelway.testing.memory_tables import MemoryDb


class MemoryLocal:
    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    def record_spawn(self, gen: Generation, pid: int, start_ticks: int) -> Generation:
        with self._db.write() as t:
            have = refuse_stale(t, gen, GenState.RUNNING)
            t.generations[gen.id] = msgspec.structs.replace(
                have, state=GenState.RUNNING, pid=pid, start_ticks=start_ticks,
                version=have.version + 1)
            return t.generations[gen.id]

    def record_gone(self, gen_id: int, exit_code: int | None) -> Generation:
        """A fact: no compare, and a repeat changes nothing; the claim and the marks
        go in the same write."""
        with self._db.write() as t:
            gen = t.generations.get(gen_id)
            if gen is None:
                raise NotFound(f"generation {gen_id}")
            if gen.state is not GenState.GONE:
                check(gen.state, GenState.GONE)
                t.generations[gen_id] = msgspec.structs.replace(
                    gen, state=GenState.GONE, exit_code=exit_code,
                    exited_at=self._db.clock.now(), version=gen.version + 1)
            for port in [p for p, c in t.port_claims.items() if c.generation_id == gen_id]:
                del t.port_claims[port]
            for key in [k for k in t.inhibitions if k[0] == gen_id]:
                del t.inhibitions[key]
            return t.generations[gen_id]

    def claimed_ports(self) -> set[int]:
        return set(self._db.tables.port_claims)
