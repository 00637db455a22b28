"""The in-memory store's journal (OperationStore): operations and their steps,
idempotency keys and events. An operation is stored without its steps; every read
that returns one attaches them, ordered by number, as the SQLite store's reads do."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

import msgspec

from keelway.journal import OpKind, StepKind
from keelway.store.errors import Conflict, NotFound
from keelway.store.lifecycle import OpState, RequestState, StepState, check
from keelway.store.records import (
    DurationCounts,
    Event,
    Operation,
    OperationCount,
    ReleaseAttempt,
    Request,
    Step,
)
from keelway.testing.memory_tables import MemoryDb, MemoryTables, own


class MemoryOps:
    def __init__(self, db: MemoryDb) -> None:
        self._db = db

    # -- operations ----------------------------------------------------------------------

    def begin_operation(self, app: str, instance: str, kind: OpKind, owner: str,
                        key: str | None = None, request_digest: str | None = None,
                        schedule_rev: int = 0) -> Operation:
        with self._db.write() as t:
            if key is not None and any(o.instance == instance and o.key == key
                                       for o in t.operations.values()):
                raise Conflict(f"an operation on {instance} already has key {key!r}")
            t.last_operation += 1
            op = Operation(t.last_operation, app, instance, kind, key, request_digest,
                           OpState.RUNNING, None, [], owner, self._db.clock.now(), None, 1,
                           schedule_rev=schedule_rev)
            t.operations[op.id] = op
            return own(op)

    def get_operation(self, op_id: int) -> Operation | None:
        op = self._db.tables.operations.get(op_id)
        return with_steps(self._db.tables, op) if op else None

    def find_operation_by_key(self, instance: str, key: str) -> Operation | None:
        t = self._db.tables
        return next((with_steps(t, o) for o in t.operations.values()
                     if o.instance == instance and o.key == key), None)

    def latest_operation(self, instance: str) -> Operation | None:
        return latest_operation(self._db.tables, instance)

    def unfinished_runs(self) -> list[Operation]:
        t = self._db.tables
        return [with_steps(t, o) for _, o in sorted(t.operations.items())
                if o.kind.one_off and o.state is OpState.RUNNING]

    def keyed_operations(self, kind: OpKind, since: float,
                         app: str | None = None) -> list[Operation]:
        return [own(o) for _, o in sorted(self._db.tables.operations.items())
                if o.kind is kind and o.created_at >= since and o.key is not None
                and (app is None or o.app == app)]

    def latest_operation_of(self, instance: str,
                            kinds: Collection[OpKind]) -> Operation | None:
        op = max((o for o in self._db.tables.operations.values()
                  if o.instance == instance and o.kind in kinds),
                 key=lambda o: o.id, default=None)
        return own(op) if op else None

    def latest_operations_of(self, kinds: Collection[OpKind]) -> list[Operation]:
        newest: dict[str, Operation] = {}
        for o in self._db.tables.operations.values():
            if o.kind in kinds and (o.instance not in newest or o.id > newest[o.instance].id):
                newest[o.instance] = o
        return [own(o) for o in sorted(newest.values(), key=lambda o: o.id)]

    def release_attempts(self, app: str, kinds: Collection[OpKind]) -> list[ReleaseAttempt]:
        t = self._db.tables
        newest: dict[tuple[str, int, str], int] = {}
        for _, g in sorted(t.generations.items()):
            op = t.operations.get(g.op_id) if g.op_id is not None else None
            if g.app != app or op is None or op.kind not in kinds:
                continue
            key = (g.instance, g.release, g.build_digest)
            newest[key] = max(newest.get(key, op.id), op.id)
        return [ReleaseAttempt(inst, release, digest, op_id, t.operations[op_id].state)
                for (inst, release, digest), op_id
                in sorted(newest.items(), key=lambda item: (item[1], item[0]))]

    def list_operations(self, app: str, instance: str | None = None,
                        limit: int = 50) -> list[Operation]:
        t = self._db.tables
        found = [o for _, o in sorted(t.operations.items(), reverse=True)
                 if o.app == app and (instance is None or o.instance == instance)]
        return [with_steps(t, o) for o in (found if limit < 0 else found[:limit])]

    def operation_counts(self) -> list[OperationCount]:
        counted = Counter((o.app, o.kind, o.state) for o in self._db.tables.operations.values())
        return [OperationCount(app, kind, state, n)
                for (app, kind, state), n in sorted(counted.items())]

    def duration_counts(self, kind: OpKind,
                        bounds_s: Sequence[float]) -> dict[str, DurationCounts]:
        took: dict[str, list[float]] = {}
        for o in self._db.tables.operations.values():
            if o.kind is kind and o.state is OpState.SUCCEEDED and o.finished_at is not None:
                took.setdefault(o.app, []).append(o.finished_at - o.created_at)
        return {app: DurationCounts(tuple(sum(1 for s in spans if s <= b) for b in bounds_s),
                                    len(spans), sum(spans))
                for app, spans in sorted(took.items())}

    def finish_operation(self, op: Operation, state: OpState, error: str | None = None,
                         warnings: list[str] | None = None) -> Operation:
        check(op.state, state)
        with self._db.write() as t:
            have = t.operations.get(op.id)
            if have is None or have.version != op.version:
                raise Conflict(f"operation {op.id} changed under us")
            t.operations[op.id] = msgspec.structs.replace(
                have, state=state, error=error,
                warnings=list(warnings if warnings is not None else op.warnings),
                finished_at=self._db.clock.now(), version=have.version + 1)
            return with_steps(t, t.operations[op.id])

    def add_warnings(self, op: Operation, warnings: list[str]) -> Operation:
        with self._db.write() as t:
            fresh = t.operations.get(op.id)
            if fresh is None:
                raise NotFound(f"operation {op.id}")
            merged = fresh.warnings + [w for w in warnings if w not in fresh.warnings]
            t.operations[op.id] = msgspec.structs.replace(fresh, warnings=merged,
                                                          version=fresh.version + 1)
            return with_steps(t, t.operations[op.id])

    def unfinished_operations(self) -> list[int]:
        t = self._db.tables
        return [i for i, o in sorted(t.operations.items())
                if o.state is OpState.RUNNING and o.instance not in t.instances]

    # -- steps -----------------------------------------------------------------------------

    def begin_step(self, op_id: int, kind: StepKind, *, service: str | None = None,
                   before_gen: int | None = None, after_gen: int | None = None,
                   detail: str | None = None) -> int:
        with self._db.write() as t:
            if op_id not in t.operations:
                raise NotFound(f"begin a step of operation {op_id}: no operation {op_id}")
            seq = max((s for (o, s) in t.steps if o == op_id), default=0) + 1
            t.steps[(op_id, seq)] = Step(op_id, seq, kind, service, before_gen, after_gen,
                                         StepState.PENDING, None, detail,
                                         self._db.clock.now(), None)
            return seq

    def finish_step(self, op_id: int, seq: int, state: StepState, *,
                    error: str | None = None, detail: str | None = None,
                    after_gen: int | None = None) -> None:
        with self._db.write() as t:
            have = _step(t, op_id, seq)
            check(have.state, state)
            t.steps[(op_id, seq)] = msgspec.structs.replace(
                have, state=state, error=error if error is not None else have.error,
                detail=detail if detail is not None else have.detail,
                after_gen=after_gen if after_gen is not None else have.after_gen,
                finished_at=self._db.clock.now())

    def converge_step(self, op_id: int, seq: int, detail: str,
                      fail_with: str | None = None) -> None:
        with self._db.write() as t:
            if fail_with is not None:
                have = _step(t, op_id, seq)
                if have.state is not StepState.FAILED:
                    check(have.state, StepState.FAILED)
                t.steps[(op_id, seq)] = msgspec.structs.replace(
                    have, state=StepState.FAILED, error=fail_with,
                    finished_at=(have.finished_at if have.finished_at is not None
                                 else self._db.clock.now()))
            if (have_now := t.steps.get((op_id, seq))) is not None:
                t.steps[(op_id, seq)] = msgspec.structs.replace(have_now, converged=True,
                                                                detail=detail)

    def steps(self, op_id: int) -> list[Step]:
        return steps_of(self._db.tables, op_id)

    # -- idempotency keys ------------------------------------------------------------------

    def begin_request(self, key: str, app: str, kind: str, digest: str,
                      owner: str) -> tuple[Request, bool]:
        with self._db.write() as t:
            if (existing := t.requests.get(key)) is not None:
                return existing, False
            t.requests[key] = Request(key, app, kind, digest, RequestState.RUNNING, None,
                                      owner, self._db.clock.now(), None)
            return t.requests[key], True

    def finish_request(self, key: str, state: RequestState, result: str) -> None:
        with self._db.write() as t:
            have = t.requests.get(key)
            if have is not None and have.state is RequestState.RUNNING:
                t.requests[key] = msgspec.structs.replace(
                    have, state=state, result=result, finished_at=self._db.clock.now())

    def get_request(self, key: str) -> Request | None:
        return self._db.tables.requests.get(key)

    def running_requests(self) -> list[Request]:
        return [r for r in self._db.tables.requests.values()
                if r.state is RequestState.RUNNING]

    # -- events ------------------------------------------------------------------------------

    def add_event(self, kind: str, message: str, *, app: str | None = None,
                  instance: str | None = None) -> None:
        with self._db.write() as t:
            t.last_event += 1
            t.events[t.last_event] = Event(t.last_event, self._db.clock.now(), app,
                                           instance, kind, message)

    def list_events(self, app: str | None = None, limit: int = 100,
                    after: int = 0) -> list[Event]:
        newest = [e for i, e in sorted(self._db.tables.events.items(), reverse=True)
                  if i > after and (app is None or e.app == app)]
        return list(reversed(newest if limit < 0 else newest[:limit]))


def steps_of(t: MemoryTables, op_id: int) -> list[Step]:
    return [s for (o, _), s in sorted(t.steps.items()) if o == op_id]


def with_steps(t: MemoryTables, op: Operation) -> Operation:
    """`op` as a read returns it: its steps attached, its containers its own."""
    return msgspec.structs.replace(op, steps=steps_of(t, op.id), warnings=list(op.warnings))


def latest_operation(t: MemoryTables, instance: str) -> Operation | None:
    """The newest operation convergence reads: a one-off run is never the latest."""
    op = max((o for o in t.operations.values()
              if o.instance == instance and not o.kind.one_off),
             key=lambda o: o.id, default=None)
    return with_steps(t, op) if op else None


def _step(t: MemoryTables, op_id: int, seq: int) -> Step:
    have = t.steps.get((op_id, seq))
    if have is None:
        raise NotFound(f"step {seq} of op {op_id}")
    return have
