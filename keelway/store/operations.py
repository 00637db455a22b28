"""The SQLite store's operations and their steps, idempotency keys and events: the
journal every operation is planned and recovered from."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Sequence

from keelway.journal import ONE_OFFS, OpKind, StepKind
from keelway.store.db import Db, swap
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

# The one-off kinds, as SQL: never an instance's latest operation.
_ONE_OFFS = ", ".join(f"'{k.value}'" for k in sorted(ONE_OFFS))


class SqliteOperations:
    """Operations, steps, idempotency keys and events (`OperationStore`)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    # -- operations and steps --------------------------------------------------------

    def begin_operation(
        self,
        app: str,
        instance: str,
        kind: OpKind,
        owner: str,
        key: str | None = None,
        request_digest: str | None = None,
        schedule_rev: int = 0,
    ) -> Operation:
        with self.db.tx(f"begin a {kind.value} operation on {instance}") as c:
            try:
                cur = c.execute(
                    "INSERT INTO operations(app, instance, kind, key, request_digest, state,"
                    " owner, created_at, schedule_rev) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (app, instance, kind.value, key, request_digest, OpState.RUNNING.value,
                     owner, self.db.clock.now(), schedule_rev),
                )
            except sqlite3.IntegrityError as exc:
                # Only the (instance, key) unique index can refuse this row: a caller
                # that did not look the key up first, or lost a race to another.
                raise Conflict(f"an operation on {instance} already has key {key!r}") from exc
            op_id = int(cur.lastrowid or 0)
        op = self.get_operation(op_id)
        assert op is not None
        return op

    def get_operation(self, op_id: int) -> Operation | None:
        return self.db.first(self._operation, "SELECT * FROM operations WHERE id=?", op_id)

    def find_operation_by_key(self, instance: str, key: str) -> Operation | None:
        return self.db.first(self._operation,
                             "SELECT * FROM operations WHERE instance=? AND key=?", instance, key)

    def latest_operation(self, instance: str) -> Operation | None:
        return self.db.first(
            self._operation,
            f"SELECT * FROM operations WHERE instance=? AND kind NOT IN ({_ONE_OFFS})"
            " ORDER BY id DESC LIMIT 1", instance)

    def latest_operation_of(self, instance: str, kinds: Collection[OpKind]) -> Operation | None:
        """The instance's newest operation of one of `kinds` (its steps not read)."""
        marks = ", ".join("?" for _ in kinds)
        row = self.db.row(f"SELECT * FROM operations WHERE instance=? AND kind IN ({marks})"
                        " ORDER BY id DESC LIMIT 1", instance, *(k.value for k in kinds))
        return self._operation(row, []) if row else None

    def latest_operations_of(self, kinds: Collection[OpKind]) -> list[Operation]:
        marks = ", ".join("?" for _ in kinds)
        rows = self.db.rows(
            "SELECT * FROM operations WHERE id IN (SELECT MAX(id) FROM operations"
            f" WHERE kind IN ({marks}) GROUP BY instance) ORDER BY id",
            *(k.value for k in kinds))
        return [self._operation(row, []) for row in rows]

    def release_attempts(self, app: str, kinds: Collection[OpKind]) -> list[ReleaseAttempt]:
        """Each (instance, release, build) that an operation of `kinds` started
        processes of, with the newest such operation's id and state, oldest first."""
        marks = ", ".join("?" for _ in kinds)
        rows = self.db.rows(
            "SELECT g.instance, g.release, g.build_digest, MAX(o.id) AS op_id FROM"
            " generations g JOIN operations o ON o.id = g.op_id WHERE g.app=? AND"
            f" o.kind IN ({marks}) GROUP BY g.instance, g.release, g.build_digest"
            " ORDER BY op_id", app, *(k.value for k in kinds))
        attempts = []
        for r in rows:
            op = self.db.row("SELECT state FROM operations WHERE id=?", r["op_id"])
            assert op is not None  # the join found it
            attempts.append(ReleaseAttempt(r["instance"], r["release"], r["build_digest"],
                                           r["op_id"], OpState(op["state"])))
        return attempts

    def latest_operations(self) -> dict[str, Operation]:
        """Each instance's latest operation, in two queries however many instances there
        are (boot, the periodic pass and `status` read every instance); its steps unless
        it succeeded (records.InstanceView says why)."""
        # A one-off is never an instance's latest operation (as latest_operation).
        latest = ("SELECT MAX(id) FROM operations"
                  f" WHERE kind NOT IN ({_ONE_OFFS}) GROUP BY instance")
        unsettled = (f"SELECT id FROM operations WHERE id IN ({latest})"
                     f" AND state!='{OpState.SUCCEEDED.value}'")
        steps: dict[int, list[Step]] = {}
        for r in self.db.rows(
                f"SELECT * FROM steps WHERE op_id IN ({unsettled}) ORDER BY op_id, seq"):
            steps.setdefault(r["op_id"], []).append(_step(r))
        return {r["instance"]: self._operation(r, steps.get(r["id"], []))
                for r in self.db.rows(f"SELECT * FROM operations WHERE id IN ({latest})")}

    def unfinished_runs(self) -> list[Operation]:
        rows = self.db.rows(f"SELECT * FROM operations WHERE kind IN ({_ONE_OFFS}) AND state=?"
                            " ORDER BY id", OpState.RUNNING.value)
        return [self._operation(r) for r in rows]

    def keyed_operations(self, kind: OpKind, since: float,
                         app: str | None = None) -> list[Operation]:
        rows = self.db.rows(
            "SELECT * FROM operations WHERE kind=? AND created_at>=? AND key IS NOT NULL"
            + (" AND app=?" if app is not None else "") + " ORDER BY id",
            kind.value, since, *((app,) if app is not None else ()))
        return [self._operation(r, []) for r in rows]

    def list_operations(
        self, app: str, instance: str | None = None, limit: int = 50
    ) -> list[Operation]:
        return [self._operation(r) for r in self.db.select(
            "operations", order="id DESC", limit=limit, app=app, instance=instance)]

    def operation_counts(self) -> list[OperationCount]:
        return [OperationCount(r["app"], OpKind(r["kind"]), OpState(r["state"]), r["n"])
                for r in self.db.rows("SELECT app, kind, state, COUNT(*) AS n FROM operations"
                                      " GROUP BY app, kind, state ORDER BY app, kind, state")]

    def duration_counts(self, kind: OpKind,
                        bounds_s: Sequence[float]) -> dict[str, DurationCounts]:
        # One pass whatever the bounds: a SUM of comparisons per bound.
        within = "".join(f", SUM(finished_at - created_at <= ?) AS b{i}"
                         for i in range(len(bounds_s)))
        rows = self.db.rows(
            f"SELECT app, COUNT(*) AS n, TOTAL(finished_at - created_at) AS s{within}"
            " FROM operations WHERE kind=? AND state=? AND finished_at IS NOT NULL"
            " GROUP BY app ORDER BY app",
            *bounds_s, kind.value, OpState.SUCCEEDED.value)
        return {r["app"]: DurationCounts(tuple(int(r[f"b{i}"]) for i in range(len(bounds_s))),
                                         r["n"], float(r["s"]))
                for r in rows}

    def finish_operation(
        self, op: Operation, state: OpState, error: str | None = None,
        warnings: list[str] | None = None,
    ) -> Operation:
        check(op.state, state)
        with self.db.tx(f"finish operation {op.id}") as c:
            swap(c, "operations", {"id": op.id}, op.version, f"operation {op.id} changed under us",
                 state=state.value, error=error,
                 warnings=json.dumps(warnings if warnings is not None else op.warnings),
                 finished_at=self.db.clock.now())
        new = self.get_operation(op.id)
        assert new is not None
        return new

    def begin_step(
        self, op_id: int, kind: StepKind, *, service: str | None = None,
        before_gen: int | None = None, after_gen: int | None = None, detail: str | None = None,
    ) -> int:
        with self.db.tx(f"begin a step of operation {op_id}", missing=f"no operation {op_id}") as c:
            row = self.db.row("SELECT MAX(seq) AS s FROM steps WHERE op_id=?", op_id)
            seq = int(row["s"] or 0) + 1 if row else 1
            c.execute(
                "INSERT INTO steps(op_id, seq, kind, service, before_gen, after_gen, state,"
                " detail, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (op_id, seq, kind.value, service, before_gen, after_gen, StepState.PENDING.value,
                 detail, self.db.clock.now()),
            )
        return seq

    def finish_step(
        self, op_id: int, seq: int, state: StepState, *, error: str | None = None,
        detail: str | None = None, after_gen: int | None = None,
    ) -> None:
        with self.db.tx(f"finish step {seq} of operation {op_id}") as c:
            row = self.db.row("SELECT state FROM steps WHERE op_id=? AND seq=?", op_id, seq)
            if row is None:
                raise NotFound(f"step {seq} of op {op_id}")
            check(StepState(row["state"]), state)
            c.execute(
                "UPDATE steps SET state=?, error=COALESCE(?, error), detail=COALESCE(?, detail),"
                " after_gen=COALESCE(?, after_gen), finished_at=? WHERE op_id=? AND seq=?",
                (state.value, error, detail, after_gen, self.db.clock.now(), op_id, seq),
            )

    def converge_step(self, op_id: int, seq: int, detail: str,
                      fail_with: str | None = None) -> None:
        """Mark a step's candidate dealt with; `fail_with` also marks the step failed."""
        with self.db.tx(f"converge step {seq} of operation {op_id}") as c:
            if fail_with is not None:
                row = self.db.row("SELECT state FROM steps WHERE op_id=? AND seq=?", op_id, seq)
                if row is None:
                    raise NotFound(f"step {seq} of op {op_id}")
                old = StepState(row["state"])
                if old is not StepState.FAILED:
                    check(old, StepState.FAILED)
                c.execute("UPDATE steps SET state=?, error=?, finished_at=COALESCE(finished_at, ?)"
                          " WHERE op_id=? AND seq=?",
                          (StepState.FAILED.value, fail_with, self.db.clock.now(), op_id, seq))
            c.execute("UPDATE steps SET converged=1, detail=? WHERE op_id=? AND seq=?",
                      (detail, op_id, seq))

    def add_warnings(self, op: Operation, warnings: list[str]) -> Operation:
        with self.db.tx(f"add warnings to operation {op.id}") as c:
            fresh = self.get_operation(op.id)
            if fresh is None:
                raise NotFound(f"operation {op.id}")
            merged = fresh.warnings + [w for w in warnings if w not in fresh.warnings]
            c.execute("UPDATE operations SET warnings=?, version=version+1 WHERE id=?",
                      (json.dumps(merged), op.id))
        new = self.get_operation(op.id)
        assert new is not None
        return new

    def steps(self, op_id: int) -> list[Step]:
        rows = self.db.rows("SELECT * FROM steps WHERE op_id=? ORDER BY seq", op_id)
        return [_step(r) for r in rows]

    def unfinished_operations(self) -> list[int]:
        """Ids of operations not yet terminal whose instance no longer exists (a
        removal that crashed after its records were deleted): nothing else finds them."""
        rows = self.db.rows(
            "SELECT id FROM operations WHERE state='running' AND instance NOT IN"
            " (SELECT host FROM instances) ORDER BY id")
        return [int(r[0]) for r in rows]

    def _operation(self, row: sqlite3.Row, steps: list[Step] | None = None) -> Operation:
        return Operation(
            id=row["id"], app=row["app"], instance=row["instance"],
            kind=OpKind(row["kind"]),
            key=row["key"], request_digest=row["request_digest"], state=OpState(row["state"]),
            error=row["error"], warnings=json.loads(row["warnings"]), owner=row["owner"],
            created_at=row["created_at"], finished_at=row["finished_at"],
            version=row["version"], steps=self.steps(row["id"]) if steps is None else steps,
            schedule_rev=row["schedule_rev"],
        )

    # -- idempotency keys --------------------------------------------------------------

    def begin_request(self, key: str, app: str, kind: str, digest: str,
                      owner: str) -> tuple[Request, bool]:
        """Claim `key` for a request; (the existing request, False) if it was claimed."""
        with self.db.tx(f"begin request {key}") as c:
            existing = self.get_request(key)
            if existing is not None:
                return existing, False
            c.execute(
                "INSERT INTO requests(key, app, kind, digest, state, owner, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, app, kind, digest, RequestState.RUNNING.value, owner, self.db.clock.now()),
            )
        request = self.get_request(key)
        assert request is not None
        return request, True

    def finish_request(self, key: str, state: RequestState, result: str) -> None:
        with self.db.tx(f"finish request {key}") as c:
            c.execute(
                "UPDATE requests SET state=?, result=?, finished_at=? WHERE key=? AND state=?",
                (state.value, result, self.db.clock.now(), key, RequestState.RUNNING.value),
            )

    def get_request(self, key: str) -> Request | None:
        row = self.db.row("SELECT * FROM requests WHERE key=?", key)
        if row is None:
            return None
        return Request(row["key"], row["app"], row["kind"], row["digest"],
                       RequestState(row["state"]), row["result"], row["owner"],
                       row["created_at"], row["finished_at"])

    def running_requests(self) -> list[Request]:
        rows = self.db.rows("SELECT key FROM requests WHERE state='running'")
        return [r for r in (self.get_request(row[0]) for row in rows) if r is not None]

    # -- events ----------------------------------------------------------------------

    def add_event(self, kind: str, message: str, *, app: str | None = None,
                  instance: str | None = None) -> None:
        with self.db.tx(f"add a {kind} event") as c:
            c.execute(
                "INSERT INTO events(at, app, instance, kind, message) VALUES (?, ?, ?, ?, ?)",
                (self.db.clock.now(), app, instance, kind, message),
            )

    def list_events(self, app: str | None = None, limit: int = 100,
                    after: int = 0) -> list[Event]:
        if app is None:
            rows = self.db.rows("SELECT * FROM events WHERE id>? ORDER BY id DESC LIMIT ?",
                             after, limit)
        else:
            rows = self.db.rows(
                "SELECT * FROM events WHERE app=? AND id>? ORDER BY id DESC LIMIT ?",
                app, after, limit
            )
        return [_event(r) for r in reversed(rows)]


def _step(r: sqlite3.Row) -> Step:
    return Step(r["op_id"], r["seq"], StepKind(r["kind"]), r["service"], r["before_gen"],
                r["after_gen"], StepState(r["state"]), r["error"], r["detail"],
                r["started_at"], r["finished_at"], bool(r["converged"]))


def _event(r: sqlite3.Row) -> Event:
    return Event(r["id"], r["at"], r["app"], r["instance"], r["kind"], r["message"])
