"""The in-memory store's generations as records (GenerationStore): planned, moved
along keelway/store/lifecycle.py's table (proven gone included), ACTIVE, inhibitions
and crash retries. What only this box observes of a generation (its port claim, pid,
start ticks) is keelway/testing/memory_local.py."""

from __future__ import annotations

import msgspec

from keelway.journal import Inhibition
from keelway.store.errors import Conflict, NotFound
from keelway.store.lifecycle import GenState, check
from keelway.store.records import Active, CrashRetry, Generation
from keelway.testing.memory_tables import Mark, MemoryDb, MemoryTables


class MemoryGenerations:
    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    def plan_generation(self, *, app: str, instance: str, service: str, release: int,
                        build_digest: str, op_id: int | None) -> Generation:
        with self._db.write() as t:
            t.last_generation += 1
            gen = Generation(t.last_generation, app, instance, service, release,
                             build_digest, op_id, GenState.PLANNED, self._db.clock.now(),
                             None, None, 1)
            t.generations[gen.id] = gen
            return gen

    def set_generation_state(self, gen: Generation, state: GenState) -> Generation:
        with self._db.write() as t:
            have = refuse_stale(t, gen, state)
            t.generations[gen.id] = msgspec.structs.replace(have, state=state,
                                                            version=have.version + 1)
            return t.generations[gen.id]

    def record_exit(self, gen_id: int, exit_code: int | None,
                    cause: str | None = None) -> Generation:
        """A fact: no compare, and a repeat changes nothing; the marks go with it."""
        with self._db.write() as t:
            gen = _known(t, gen_id)
            if gen.state is not GenState.GONE:
                check(gen.state, GenState.GONE)
                t.generations[gen_id] = msgspec.structs.replace(
                    gen, state=GenState.GONE, exit_code=exit_code, exit_cause=cause,
                    exited_at=self._db.clock.now(), version=gen.version + 1)
            for key in [k for k in t.inhibitions if k[0] == gen_id]:
                del t.inhibitions[key]
            return t.generations[gen_id]

    def get_generation(self, gen_id: int) -> Generation | None:
        return self._db.tables.generations.get(gen_id)

    def live_generations(self, instance: str | None = None) -> list[Generation]:
        return [g for _, g in sorted(self._db.tables.generations.items())
                if g.state is not GenState.GONE and (instance is None or g.instance == instance)]

    def recent_generations(self, instance: str, limit: int = 20) -> list[Generation]:
        newest = [g for _, g in sorted(self._db.tables.generations.items(), reverse=True)
                  if g.instance == instance]
        return newest if limit < 0 else newest[:limit]

    def generation_ids(self, instance: str) -> set[int]:
        return {g.id for g in self._db.tables.generations.values() if g.instance == instance}

    def active_generations(self) -> list[Generation]:
        t = self._db.tables
        rows = sorted(t.active.values(),
                      key=lambda a: (a.instance, a.service != "web", a.service))
        return [t.generations[a.generation_id] for a in rows
                if a.generation_id in t.generations]

    def get_active(self, instance: str, service: str) -> Active | None:
        return self._db.tables.active.get((instance, service))

    def list_active(self, instance: str | None = None) -> list[Active]:
        return [a for _, a in sorted(self._db.tables.active.items())
                if instance is None or a.instance == instance]

    def set_active(self, instance: str, service: str, generation_id: int, *,
                   expected: Active | None) -> Active:
        with self._db.write() as t:
            have = t.active.get((instance, service))
            if expected is None and have is not None:
                raise Conflict(f"ACTIVE {service} of {instance} was set under us")
            if expected is not None and (have is None or have.version != expected.version):
                raise Conflict(f"ACTIVE {service} of {instance} changed under us")
            put_active(t, instance, service, generation_id)
            return t.active[(instance, service)]

    def add_inhibition(self, generation_id: int, reason: Inhibition,
                       op_id: int | None) -> None:
        with self._db.write() as t:
            _named(t, generation_id, f"mark generation {generation_id} {reason.value}")
            t.inhibitions.setdefault((generation_id, reason),
                                     Mark(op_id, self._db.clock.now()))

    def remove_inhibition(self, generation_id: int, reason: Inhibition) -> None:
        with self._db.write() as t:
            t.inhibitions.pop((generation_id, reason), None)

    def inhibitions(self, generation_id: int) -> list[Inhibition]:
        return sorted((r for g, r in self._db.tables.inhibitions if g == generation_id),
                      key=lambda r: r.value)

    def get_crash_retry(self, instance: str, service: str) -> CrashRetry | None:
        return self._db.tables.backoff.get((instance, service))

    def pending_retries(self, instance: str | None = None) -> list[CrashRetry]:
        """Backoffs whose crashed generation ACTIVE still names and is recorded gone."""
        t = self._db.tables
        found = []
        for key, retry in sorted(t.backoff.items()):
            active = t.active.get(key)
            gen = t.generations.get(retry.generation_id)
            if (active is not None and active.generation_id == retry.generation_id
                    and gen is not None and gen.state is GenState.GONE
                    and (instance is None or retry.instance == instance)):
                found.append(retry)
        return found


def put_active(t: MemoryTables, instance: str, service: str, generation_id: int) -> None:
    """ACTIVE of one service, inside a write; the generation must exist."""
    _named(t, generation_id, f"set active of {service} on {instance}")
    have = t.active.get((instance, service))
    t.active[(instance, service)] = Active(instance, service, generation_id,
                                           have.version + 1 if have else 1)


def refuse_stale(t: MemoryTables, gen: Generation, state: GenState) -> Generation:
    """The compare of a generation's compare-and-swap; a stale record is refused before
    its move is judged, so the error names the cause (someone wrote first)."""
    have = _known(t, gen.id)
    if have.version != gen.version:
        raise Conflict(f"generation {gen.id} changed under us")
    check(gen.state, state)
    return have


def _named(t: MemoryTables, gen_id: int, what: str) -> None:
    """A write that names a generation refuses one that does not exist, as a foreign
    key refuses it: the record must not name nothing."""
    if gen_id not in t.generations:
        raise NotFound(f"{what}: no generation {gen_id}")


def _known(t: MemoryTables, gen_id: int) -> Generation:
    gen = t.generations.get(gen_id)
    if gen is None:
        raise NotFound(f"generation {gen_id}")
    return gen
