"""The store: every durable record of keelway in one embedded SQLite file.

Rules it keeps:
- One writer: every write runs inside `tx()`, a BEGIN IMMEDIATE transaction, so a
  write either happens whole or not at all, across a SIGKILL at any instruction.
- Lifecycle moves are checked (keelway.store.lifecycle.check) where they are written.
- Mutable records compare-and-swap on `version`; a lost race raises `Conflict`.
- A generation's port claim is written in the same transaction as the generation, and
  released in the same transaction that records it gone: a claim never outlives the
  proof that its process is dead.

The methods are the interface a later PostgreSQL store implements too; nothing outside
this package writes SQL.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from keelway.clock import Clock, SystemClock
from keelway.store import schema
from keelway.store.lifecycle import (
    GenState,
    InstanceState,
    OpState,
    RequestState,
    RouteState,
    StepState,
    check,
)
from keelway.store.records import (
    Active,
    App,
    Build,
    Event,
    Generation,
    Instance,
    Operation,
    Release,
    Request,
    Route,
    Step,
)


class StoreError(Exception):
    """The store could not do what was asked (I/O, corruption): not the caller's fault."""


class Conflict(StoreError):
    """A compare-and-swap lost: someone else changed the record first."""


class NotFound(StoreError):
    pass


class Store:
    def __init__(self, path: Path, clock: Clock | None = None) -> None:
        self.path = Path(path)
        self.clock: Clock = clock or SystemClock()
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        # FULL: a committed operation step survives power loss, not just a process crash.
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._depth = 0
        schema.migrate(self._conn)

    def close(self) -> None:
        self._conn.close()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction; nested calls join the outer one."""
        if self._depth:
            self._depth += 1
            try:
                yield self._conn
            finally:
                self._depth -= 1
            return
        self._conn.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield self._conn
        except BaseException:
            self._depth = 0
            self._conn.execute("ROLLBACK")
            raise
        self._depth = 0
        self._conn.execute("COMMIT")

    def _one(self, sql: str, *args: Any) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self._conn.execute(sql, args).fetchone()
        return row

    def _all(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        return list(self._conn.execute(sql, args).fetchall())

    # -- meta ------------------------------------------------------------------------

    def next_route_table_version(self, at_least: int = 0) -> int:
        """Bump and return the route table version (never below `at_least` + 1)."""
        with self.tx() as c:
            row = self._one("SELECT value FROM meta WHERE key='route_table_version'")
            current = int(row["value"]) if row else 0
            new = max(current, at_least) + 1
            c.execute(
                "INSERT INTO meta(key, value) VALUES ('route_table_version', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(new),),
            )
        return new

    # -- apps and instances ----------------------------------------------------------

    def get_app(self, name: str) -> App | None:
        row = self._one("SELECT * FROM apps WHERE name=?", name)
        return _app(row) if row else None

    def list_apps(self) -> list[App]:
        return [_app(r) for r in self._all("SELECT * FROM apps ORDER BY name")]

    def ensure_app(self, name: str) -> App:
        with self.tx() as c:
            c.execute(
                "INSERT INTO apps(name, created_at) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
                (name, self.clock.now()),
            )
            app = self.get_app(name)
        assert app is not None  # just inserted inside this transaction
        return app

    def set_app_config(self, app: App, config: dict[str, str]) -> App:
        with self.tx() as c:
            cur = c.execute(
                "UPDATE apps SET config=?, version=version+1 WHERE name=? AND version=?",
                (json.dumps(config, sort_keys=True), app.name, app.version),
            )
            if cur.rowcount != 1:
                raise Conflict(f"app {app.name} changed under us")
            new = self.get_app(app.name)
        assert new is not None
        return new

    def get_instance(self, host: str) -> Instance | None:
        row = self._one("SELECT * FROM instances WHERE host=?", host)
        return _instance(row) if row else None

    def list_instances(self, app: str | None = None) -> list[Instance]:
        if app is None:
            rows = self._all("SELECT * FROM instances ORDER BY app, host")
        else:
            rows = self._all("SELECT * FROM instances WHERE app=? ORDER BY host", app)
        return [_instance(r) for r in rows]

    def ensure_instance(self, host: str, app: str) -> Instance:
        with self.tx() as c:
            c.execute(
                "INSERT INTO instances(host, app, state, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(host) DO NOTHING",
                (host, app, InstanceState.RUNNING.value, self.clock.now()),
            )
            inst = self.get_instance(host)
        assert inst is not None
        return inst

    def set_instance_state(self, inst: Instance, state: InstanceState,
                           down_reason: str | None = None) -> Instance:
        with self.tx() as c:
            cur = c.execute(
                "UPDATE instances SET state=?, down_reason=?, version=version+1"
                " WHERE host=? AND version=?",
                (state.value, down_reason, inst.host, inst.version),
            )
            if cur.rowcount != 1:
                raise Conflict(f"instance {inst.host} changed under us")
            new = self.get_instance(inst.host)
        assert new is not None
        return new

    def bump_schedule(self, host: str) -> int:
        """Advance the instance's schedule revision; attempts holding an older one are stale."""
        with self.tx() as c:
            c.execute(
                "UPDATE instances SET schedule_rev=schedule_rev+1 WHERE host=?",
                (host,),
            )
            row = self._one("SELECT schedule_rev FROM instances WHERE host=?", host)
        if row is None:
            raise NotFound(f"instance {host}")
        return int(row["schedule_rev"])

    # -- builds and releases ---------------------------------------------------------

    def record_build(self, app: str, digest: str, path: str) -> Build:
        with self.tx() as c:
            c.execute(
                "INSERT INTO builds(app, digest, path, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(app, digest) DO NOTHING",
                (app, digest, path, self.clock.now()),
            )
            row = self._one("SELECT * FROM builds WHERE app=? AND digest=?", app, digest)
        assert row is not None
        return _build(row)

    def mark_build_good(self, app: str, digest: str) -> None:
        with self.tx() as c:
            c.execute("UPDATE builds SET good=1 WHERE app=? AND digest=?", (app, digest))

    def list_builds(self, app: str | None = None) -> list[Build]:
        if app is None:
            rows = self._all("SELECT * FROM builds ORDER BY app, created_at")
        else:
            rows = self._all("SELECT * FROM builds WHERE app=? ORDER BY created_at", app)
        return [_build(r) for r in rows]

    def forget_build(self, app: str, digest: str) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM builds WHERE app=? AND digest=?", (app, digest))

    def pinned_builds(self) -> set[tuple[str, str]]:
        """Builds that gc must keep: named by a release, or by any generation not gone."""
        rows = self._all(
            "SELECT app, build_digest FROM releases "
            "UNION SELECT app, build_digest FROM generations WHERE state != 'gone'"
        )
        return {(r[0], r[1]) for r in rows}

    def create_release(
        self, app: str, build_digest: str, config: dict[str, str], description: str
    ) -> Release:
        with self.tx() as c:
            row = self._one("SELECT MAX(number) AS n FROM releases WHERE app=?", app)
            number = (row["n"] or 0) + 1 if row else 1
            c.execute(
                "INSERT INTO releases(app, number, build_digest, config, description, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (app, number, build_digest, json.dumps(config), description, self.clock.now()),
            )
        return Release(app, number, build_digest, config, description, self.clock.now())

    def next_release_number(self, app: str) -> int:
        row = self._one("SELECT MAX(number) AS n FROM releases WHERE app=?", app)
        return int(row["n"] or 0) + 1 if row else 1

    def list_releases(self, app: str) -> list[Release]:
        rows = self._all("SELECT * FROM releases WHERE app=? ORDER BY number DESC", app)
        return [_release(r) for r in rows]

    def get_release(self, app: str, number: int) -> Release | None:
        row = self._one("SELECT * FROM releases WHERE app=? AND number=?", app, number)
        return _release(row) if row else None

    # -- operations and steps --------------------------------------------------------

    def begin_operation(
        self,
        app: str,
        instance: str,
        kind: str,
        owner: str,
        key: str | None = None,
        request_digest: str | None = None,
        schedule_rev: int = 0,
    ) -> Operation:
        with self.tx() as c:
            cur = c.execute(
                "INSERT INTO operations(app, instance, kind, key, request_digest, state, owner,"
                " created_at, schedule_rev) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (app, instance, kind, key, request_digest, OpState.RUNNING.value, owner,
                 self.clock.now(), schedule_rev),
            )
            op_id = int(cur.lastrowid or 0)
        op = self.get_operation(op_id)
        assert op is not None
        return op

    def get_operation(self, op_id: int) -> Operation | None:
        row = self._one("SELECT * FROM operations WHERE id=?", op_id)
        return self._operation(row) if row else None

    def find_operation_by_key(self, instance: str, key: str) -> Operation | None:
        row = self._one("SELECT * FROM operations WHERE instance=? AND key=?", instance, key)
        return self._operation(row) if row else None

    def latest_operation(self, instance: str) -> Operation | None:
        row = self._one(
            "SELECT * FROM operations WHERE instance=? ORDER BY id DESC LIMIT 1", instance
        )
        return self._operation(row) if row else None

    def list_operations(
        self, app: str, instance: str | None = None, limit: int = 50
    ) -> list[Operation]:
        if instance is None:
            rows = self._all(
                "SELECT * FROM operations WHERE app=? ORDER BY id DESC LIMIT ?", app, limit
            )
        else:
            rows = self._all(
                "SELECT * FROM operations WHERE app=? AND instance=? ORDER BY id DESC LIMIT ?",
                app, instance, limit,
            )
        return [self._operation(r) for r in rows]

    def finish_operation(
        self, op: Operation, state: OpState, error: str | None = None,
        warnings: list[str] | None = None,
    ) -> Operation:
        check(op.state, state)
        with self.tx() as c:
            cur = c.execute(
                "UPDATE operations SET state=?, error=?, warnings=?, finished_at=?,"
                " version=version+1 WHERE id=? AND version=?",
                (state.value, error, json.dumps(warnings if warnings is not None else op.warnings),
                 self.clock.now(), op.id, op.version),
            )
            if cur.rowcount != 1:
                raise Conflict(f"operation {op.id} changed under us")
        new = self.get_operation(op.id)
        assert new is not None
        return new

    def begin_step(
        self, op_id: int, name: str, *, service: str | None = None,
        before_gen: int | None = None, after_gen: int | None = None, detail: str | None = None,
    ) -> int:
        with self.tx() as c:
            row = self._one("SELECT MAX(seq) AS s FROM steps WHERE op_id=?", op_id)
            seq = int(row["s"] or 0) + 1 if row else 1
            c.execute(
                "INSERT INTO steps(op_id, seq, name, service, before_gen, after_gen, state,"
                " detail, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (op_id, seq, name, service, before_gen, after_gen, StepState.PENDING.value,
                 detail, self.clock.now()),
            )
        return seq

    def finish_step(
        self, op_id: int, seq: int, state: StepState, *, error: str | None = None,
        detail: str | None = None, after_gen: int | None = None,
    ) -> None:
        with self.tx() as c:
            row = self._one("SELECT state FROM steps WHERE op_id=? AND seq=?", op_id, seq)
            if row is None:
                raise NotFound(f"step {seq} of op {op_id}")
            check(StepState(row["state"]), state)
            c.execute(
                "UPDATE steps SET state=?, error=COALESCE(?, error), detail=COALESCE(?, detail),"
                " after_gen=COALESCE(?, after_gen), finished_at=? WHERE op_id=? AND seq=?",
                (state.value, error, detail, after_gen, self.clock.now(), op_id, seq),
            )

    def converge_step(self, op_id: int, seq: int, detail: str,
                      fail_with: str | None = None) -> None:
        """Mark a step's candidate dealt with; `fail_with` also marks the step failed."""
        with self.tx() as c:
            if fail_with is not None:
                row = self._one("SELECT state FROM steps WHERE op_id=? AND seq=?", op_id, seq)
                if row is None:
                    raise NotFound(f"step {seq} of op {op_id}")
                old = StepState(row["state"])
                if old is not StepState.FAILED:
                    check(old, StepState.FAILED)
                c.execute("UPDATE steps SET state=?, error=?, finished_at=COALESCE(finished_at, ?)"
                          " WHERE op_id=? AND seq=?",
                          (StepState.FAILED.value, fail_with, self.clock.now(), op_id, seq))
            c.execute("UPDATE steps SET converged=1, detail=? WHERE op_id=? AND seq=?",
                      (detail, op_id, seq))

    def add_warnings(self, op: Operation, warnings: list[str]) -> Operation:
        with self.tx() as c:
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
        rows = self._all("SELECT * FROM steps WHERE op_id=? ORDER BY seq", op_id)
        return [_step(r) for r in rows]

    def _operation(self, row: sqlite3.Row) -> Operation:
        return Operation(
            id=row["id"], app=row["app"], instance=row["instance"], kind=row["kind"],
            key=row["key"], request_digest=row["request_digest"], state=OpState(row["state"]),
            error=row["error"], warnings=json.loads(row["warnings"]), owner=row["owner"],
            created_at=row["created_at"], finished_at=row["finished_at"],
            version=row["version"], steps=self.steps(row["id"]),
            schedule_rev=row["schedule_rev"],
        )

    # -- generations, ports, ACTIVE ----------------------------------------------------

    def plan_generation(
        self, *, app: str, instance: str, service: str, release: int, build_digest: str,
        op_id: int | None, port: int | None,
    ) -> Generation:
        """Journal a generation before its spawn, with its port claim in the same write.

        Crash after this commit, before the spawn: the reconciler finds a PLANNED row with
        no pid, so there is no process to look for; it marks it gone and frees the claim.
        """
        with self.tx() as c:
            cur = c.execute(
                "INSERT INTO generations(app, instance, service, release, build_digest, op_id,"
                " state, port, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (app, instance, service, release, build_digest, op_id, GenState.PLANNED.value,
                 port, self.clock.now()),
            )
            gen_id = int(cur.lastrowid or 0)
            if port is not None:
                try:
                    c.execute(
                        "INSERT INTO port_claims(port, generation_id, claimed_at) VALUES (?, ?, ?)",
                        (port, gen_id, self.clock.now()),
                    )
                except sqlite3.IntegrityError as exc:
                    raise Conflict(f"port {port} is already claimed") from exc
        gen = self.get_generation(gen_id)
        assert gen is not None
        return gen

    def record_spawn(self, gen_id: int, pid: int, start_ticks: int) -> Generation:
        with self.tx() as c:
            gen = self._gen_for_update(gen_id)
            check(gen.state, GenState.RUNNING)
            c.execute(
                "UPDATE generations SET state=?, pid=?, start_ticks=?, version=version+1"
                " WHERE id=?",
                (GenState.RUNNING.value, pid, start_ticks, gen_id),
            )
        return self._gen_for_update(gen_id)

    def set_generation_state(self, gen_id: int, state: GenState) -> Generation:
        with self.tx() as c:
            gen = self._gen_for_update(gen_id)
            check(gen.state, state)
            c.execute(
                "UPDATE generations SET state=?, version=version+1 WHERE id=?",
                (state.value, gen_id),
            )
        return self._gen_for_update(gen_id)

    def record_gone(self, gen_id: int, exit_code: int | None) -> Generation:
        """Record a generation proven dead, and free its port claim in the same write."""
        with self.tx() as c:
            gen = self._gen_for_update(gen_id)
            if gen.state is not GenState.GONE:
                check(gen.state, GenState.GONE)
                c.execute(
                    "UPDATE generations SET state=?, exit_code=?, exited_at=?,"
                    " version=version+1 WHERE id=?",
                    (GenState.GONE.value, exit_code, self.clock.now(), gen_id),
                )
            c.execute("DELETE FROM port_claims WHERE generation_id=?", (gen_id,))
            c.execute("DELETE FROM inhibitions WHERE generation_id=?", (gen_id,))
        return self._gen_for_update(gen_id)

    def get_generation(self, gen_id: int) -> Generation | None:
        row = self._one("SELECT * FROM generations WHERE id=?", gen_id)
        return _generation(row) if row else None

    def _gen_for_update(self, gen_id: int) -> Generation:
        gen = self.get_generation(gen_id)
        if gen is None:
            raise NotFound(f"generation {gen_id}")
        return gen

    def live_generations(self, instance: str | None = None) -> list[Generation]:
        """Every generation not proven gone: the records that may name a live process."""
        if instance is None:
            rows = self._all("SELECT * FROM generations WHERE state != 'gone' ORDER BY id")
        else:
            rows = self._all(
                "SELECT * FROM generations WHERE state != 'gone' AND instance=? ORDER BY id",
                instance,
            )
        return [_generation(r) for r in rows]

    def recent_generations(self, instance: str, limit: int = 20) -> list[Generation]:
        rows = self._all(
            "SELECT * FROM generations WHERE instance=? ORDER BY id DESC LIMIT ?", instance, limit
        )
        return [_generation(r) for r in rows]

    def claimed_ports(self) -> set[int]:
        return {int(r[0]) for r in self._all("SELECT port FROM port_claims")}

    def get_active(self, instance: str, service: str) -> Active | None:
        row = self._one("SELECT * FROM active WHERE instance=? AND service=?", instance, service)
        return _active(row) if row else None

    def list_active(self, instance: str | None = None) -> list[Active]:
        if instance is None:
            rows = self._all("SELECT * FROM active ORDER BY instance, service")
        else:
            rows = self._all("SELECT * FROM active WHERE instance=? ORDER BY service", instance)
        return [_active(r) for r in rows]

    def set_active(self, instance: str, service: str, generation_id: int) -> Active:
        with self.tx() as c:
            c.execute(
                "INSERT INTO active(instance, service, generation_id) VALUES (?, ?, ?)"
                " ON CONFLICT(instance, service) DO UPDATE SET"
                " generation_id=excluded.generation_id, version=active.version+1",
                (instance, service, generation_id),
            )
        active = self.get_active(instance, service)
        assert active is not None
        return active

    def add_inhibition(self, generation_id: int, reason: str, op_id: int | None) -> None:
        with self.tx() as c:
            c.execute(
                "INSERT INTO inhibitions(generation_id, reason, op_id, created_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (generation_id, reason, op_id, self.clock.now()),
            )

    def remove_inhibition(self, generation_id: int, reason: str) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM inhibitions WHERE generation_id=? AND reason=?",
                      (generation_id, reason))

    def inhibitions(self, generation_id: int) -> list[str]:
        rows = self._all("SELECT reason FROM inhibitions WHERE generation_id=?", generation_id)
        return [r[0] for r in rows]

    # -- routes ----------------------------------------------------------------------

    def set_route(
        self, host: str, instance: str, state: RouteState, port: int | None,
        generation_id: int | None,
    ) -> Route:
        with self.tx() as c:
            c.execute(
                "INSERT INTO routes(host, instance, state, port, generation_id)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT(host) DO UPDATE SET"
                " instance=excluded.instance, state=excluded.state, port=excluded.port,"
                " generation_id=excluded.generation_id, version=routes.version+1",
                (host, instance, state.value, port, generation_id),
            )
        route = self.get_route(host)
        assert route is not None
        return route

    def get_route(self, host: str) -> Route | None:
        row = self._one("SELECT * FROM routes WHERE host=?", host)
        return _route(row) if row else None

    def list_routes(self) -> list[Route]:
        return [_route(r) for r in self._all("SELECT * FROM routes ORDER BY host")]

    # -- idempotency keys --------------------------------------------------------------

    def begin_request(self, key: str, app: str, kind: str, digest: str,
                      owner: str) -> tuple[Request, bool]:
        """Claim `key` for a request; (the existing request, False) if it was claimed."""
        with self.tx() as c:
            existing = self.get_request(key)
            if existing is not None:
                return existing, False
            c.execute(
                "INSERT INTO requests(key, app, kind, digest, state, owner, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, app, kind, digest, RequestState.RUNNING.value, owner, self.clock.now()),
            )
        request = self.get_request(key)
        assert request is not None
        return request, True

    def finish_request(self, key: str, state: RequestState, result: str) -> None:
        with self.tx() as c:
            c.execute(
                "UPDATE requests SET state=?, result=?, finished_at=? WHERE key=? AND state=?",
                (state.value, result, self.clock.now(), key, RequestState.RUNNING.value),
            )

    def get_request(self, key: str) -> Request | None:
        row = self._one("SELECT * FROM requests WHERE key=?", key)
        if row is None:
            return None
        return Request(row["key"], row["app"], row["kind"], row["digest"],
                       RequestState(row["state"]), row["result"], row["owner"],
                       row["created_at"], row["finished_at"])

    def running_requests(self) -> list[Request]:
        rows = self._all("SELECT key FROM requests WHERE state='running'")
        return [r for r in (self.get_request(row[0]) for row in rows) if r is not None]

    # -- events ----------------------------------------------------------------------

    def add_event(self, kind: str, message: str, *, app: str | None = None,
                  instance: str | None = None) -> None:
        with self.tx() as c:
            c.execute(
                "INSERT INTO events(at, app, instance, kind, message) VALUES (?, ?, ?, ?, ?)",
                (self.clock.now(), app, instance, kind, message),
            )

    def list_events(self, app: str | None = None, limit: int = 100) -> list[Event]:
        if app is None:
            rows = self._all("SELECT * FROM events ORDER BY id DESC LIMIT ?", limit)
        else:
            rows = self._all(
                "SELECT * FROM events WHERE app=? ORDER BY id DESC LIMIT ?", app, limit
            )
        return [_event(r) for r in reversed(rows)]

    def dump(self) -> dict[str, list[dict[str, Any]]]:
        """Every row of every table except events and the journal: what tests compare."""
        out: dict[str, list[dict[str, Any]]] = {}
        for table in ("apps", "instances", "builds", "releases", "active", "inhibitions",
                      "port_claims", "routes", "fences"):
            out[table] = [dict(r) for r in self._all(f"SELECT * FROM {table} ORDER BY 1, 2")]
        return out


def _app(r: sqlite3.Row) -> App:
    return App(r["name"], json.loads(r["config"]), r["created_at"], r["version"])


def _instance(r: sqlite3.Row) -> Instance:
    return Instance(r["host"], r["app"], InstanceState(r["state"]), r["fence"],
                    r["schedule_rev"], r["created_at"], r["version"], r["down_reason"])


def _build(r: sqlite3.Row) -> Build:
    return Build(r["app"], r["digest"], r["path"], bool(r["good"]), r["created_at"])


def _release(r: sqlite3.Row) -> Release:
    return Release(r["app"], r["number"], r["build_digest"], json.loads(r["config"]),
                   r["description"], r["created_at"])


def _step(r: sqlite3.Row) -> Step:
    return Step(r["op_id"], r["seq"], r["name"], r["service"], r["before_gen"], r["after_gen"],
                StepState(r["state"]), r["error"], r["detail"], r["started_at"],
                r["finished_at"], bool(r["converged"]))


def _generation(r: sqlite3.Row) -> Generation:
    return Generation(
        id=r["id"], app=r["app"], instance=r["instance"], service=r["service"],
        release=r["release"], build_digest=r["build_digest"], op_id=r["op_id"],
        state=GenState(r["state"]), pid=r["pid"], start_ticks=r["start_ticks"], port=r["port"],
        created_at=r["created_at"], exited_at=r["exited_at"], exit_code=r["exit_code"],
        version=r["version"],
    )


def _active(r: sqlite3.Row) -> Active:
    return Active(r["instance"], r["service"], r["generation_id"], r["version"])


def _route(r: sqlite3.Row) -> Route:
    return Route(r["host"], r["instance"], RouteState(r["state"]), r["port"],
                 r["generation_id"], r["version"])


def _event(r: sqlite3.Row) -> Event:
    return Event(r["id"], r["at"], r["app"], r["instance"], r["kind"], r["message"])
