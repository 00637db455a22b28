"""The store's view of what runs: generations and their port claims, ACTIVE,
inhibitions, crash-restart backoff, and routes."""

from __future__ import annotations

import sqlite3

from keelway.journal import Inhibition
from keelway.store.base import Conflict, NotFound, StoreBase
from keelway.store.hosts import mirror_aliases
from keelway.store.lifecycle import GenState, RouteState, check
from keelway.store.records import Active, CrashRetry, Generation, Route


class Processes(StoreBase):
    """Generations, port claims, ACTIVE, inhibitions and routes."""

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

    def record_spawn(self, gen: Generation, pid: int, start_ticks: int) -> Generation:
        """PLANNED -> RUNNING with its pid and start time. `gen` is the record the caller
        read: one written since is left as it is (`Conflict`)."""
        with self.tx() as c:
            self._refuse_stale(gen, GenState.RUNNING)
            c.execute("UPDATE generations SET state=?, pid=?, start_ticks=?, version=version+1"
                      " WHERE id=? AND version=?",
                      (GenState.RUNNING.value, pid, start_ticks, gen.id, gen.version))
        return self._gen_for_update(gen.id)

    def set_generation_state(self, gen: Generation, state: GenState) -> Generation:
        """Move `gen` (the record the caller read) to `state`: `Conflict` if it was
        written since, `IllegalTransition` if its lifecycle forbids the move."""
        with self.tx() as c:
            self._refuse_stale(gen, state)
            c.execute("UPDATE generations SET state=?, version=version+1"
                      " WHERE id=? AND version=?", (state.value, gen.id, gen.version))
        return self._gen_for_update(gen.id)

    def _refuse_stale(self, gen: Generation, state: GenState) -> None:
        """The compare of a generation's compare-and-swap, inside the writer's transaction
        (so nothing can write between it and the swap). A stale record is refused before
        its move is judged, so the error names the cause: someone wrote first."""
        if self._gen_for_update(gen.id).version != gen.version:
            raise Conflict(f"generation {gen.id} changed under us")
        check(gen.state, state)

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

    def generation_ids(self, instance: str) -> set[int]:
        """The ids of every generation recorded of `instance`, gone ones too."""
        return {int(r[0]) for r in self._all("SELECT id FROM generations WHERE instance=?",
                                             instance)}

    def claimed_ports(self) -> set[int]:
        return {int(r[0]) for r in self._all("SELECT port FROM port_claims")}

    def get_active(self, instance: str, service: str) -> Active | None:
        row = self._one("SELECT * FROM active WHERE instance=? AND service=?", instance, service)
        return _active(row) if row else None

    def active_generations(self) -> list[Generation]:
        """The generation ACTIVE names for every (instance, service), gone ones too."""
        rows = self._all("SELECT g.* FROM generations g JOIN active a ON a.generation_id = g.id"
                         " ORDER BY a.instance, a.service != 'web', a.service")
        return [_generation(r) for r in rows]

    def list_active(self, instance: str | None = None) -> list[Active]:
        if instance is None:
            rows = self._all("SELECT * FROM active ORDER BY instance, service")
        else:
            rows = self._all("SELECT * FROM active WHERE instance=? ORDER BY service", instance)
        return [_active(r) for r in rows]

    def set_active(self, instance: str, service: str, generation_id: int, *,
                   expected: Active | None) -> Active:
        """Name the ACTIVE generation of one service. `expected` is the row the caller
        read (None: there was none); `Conflict` if ACTIVE moved since."""
        with self.tx() as c:
            if expected is None:
                try:
                    c.execute("INSERT INTO active(instance, service, generation_id)"
                              " VALUES (?, ?, ?)", (instance, service, generation_id))
                except sqlite3.IntegrityError as exc:
                    raise Conflict(f"ACTIVE {service} of {instance} was set under us") from exc
            else:
                cur = c.execute(
                    "UPDATE active SET generation_id=?, version=version+1"
                    " WHERE instance=? AND service=? AND version=?",
                    (generation_id, instance, service, expected.version))
                if cur.rowcount != 1:
                    raise Conflict(f"ACTIVE {service} of {instance} changed under us")
        active = self.get_active(instance, service)
        assert active is not None
        return active

    def _put_active(self, c: sqlite3.Connection, instance: str, service: str,
                    generation_id: int) -> None:
        """ACTIVE, inside an intent's transaction: what it read is what it replaces."""
        c.execute(
            "INSERT INTO active(instance, service, generation_id) VALUES (?, ?, ?)"
            " ON CONFLICT(instance, service) DO UPDATE SET"
            " generation_id=excluded.generation_id, version=active.version+1",
            (instance, service, generation_id),
        )

    def add_inhibition(self, generation_id: int, reason: Inhibition,
                       op_id: int | None) -> None:
        with self.tx() as c:
            c.execute(
                "INSERT INTO inhibitions(generation_id, reason, op_id, created_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (generation_id, reason.value, op_id, self.clock.now()),
            )

    def remove_inhibition(self, generation_id: int, reason: Inhibition) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM inhibitions WHERE generation_id=? AND reason=?",
                      (generation_id, reason.value))

    def inhibitions(self, generation_id: int) -> list[Inhibition]:
        rows = self._all("SELECT reason FROM inhibitions WHERE generation_id=?", generation_id)
        return [Inhibition(r[0]) for r in rows]

    def all_inhibitions(self) -> dict[int, frozenset[Inhibition]]:
        marks: dict[int, set[Inhibition]] = {}
        for r in self._all("SELECT generation_id, reason FROM inhibitions"):
            marks.setdefault(r[0], set()).add(Inhibition(r[1]))
        return {gen_id: frozenset(found) for gen_id, found in marks.items()}

    # -- crash-restart backoff ---------------------------------------------------------

    def record_crash(self, retry: CrashRetry, *, gate_waiting: bool = False) -> bool:
        """Persist a crash and when its restart is due (one row per instance+service),
        and gate, in the same write, a route that served the crashed generation: a route
        never stays on the port of a process recorded dead. True if it gated one.
        `gate_waiting`: the caller is the operation whose route waits for this web (a
        wake's `parked`, a restore's `holding`), whose start failed: that route is gated
        too, so requests get 503 + Retry-After instead of waiting for a web that will not
        come before the retry.

        Crash before the write: boot restarts the service at once. Crash after: boot
        waits for the recorded retry time, the route gated until the restart publishes."""
        with self.tx() as c:
            c.execute(
                "INSERT INTO backoff(instance, service, generation_id, failures, crashed_at,"
                " retry_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(instance, service) DO UPDATE"
                " SET generation_id=excluded.generation_id, failures=excluded.failures,"
                " crashed_at=excluded.crashed_at, retry_at=excluded.retry_at",
                (retry.instance, retry.service, retry.generation_id, retry.failures,
                 retry.crashed_at, retry.retry_at),
            )
            route = self.get_route(retry.instance)
            gate = (retry.service == "web" and route is not None
                    and ((route.state is RouteState.SERVING
                          and route.generation_id == retry.generation_id)
                         or (gate_waiting and route.state in (RouteState.PARKED,
                                                              RouteState.HOLDING))))
            if gate:
                self._put_route(c, retry.instance, RouteState.GATED, None, None)
        return gate

    def get_crash_retry(self, instance: str, service: str) -> CrashRetry | None:
        row = self._one("SELECT * FROM backoff WHERE instance=? AND service=?", instance,
                        service)
        return _crash_retry(row) if row else None

    def pending_retries(self, instance: str | None = None) -> list[CrashRetry]:
        """Backoffs still waiting to restart what ACTIVE names: the crashed generation is
        still the ACTIVE one (anything newer made the row stale) and is recorded gone."""
        sql = ("SELECT b.* FROM backoff b JOIN active a ON a.instance=b.instance AND"
               " a.service=b.service AND a.generation_id=b.generation_id JOIN generations g"
               " ON g.id=b.generation_id WHERE g.state='gone'")
        rows = (self._all(sql + " ORDER BY b.instance, b.service") if instance is None else
                self._all(sql + " AND b.instance=? ORDER BY b.service", instance))
        return [_crash_retry(r) for r in rows]

    # -- routes ----------------------------------------------------------------------

    def set_route(
        self, host: str, instance: str, state: RouteState, port: int | None,
        generation_id: int | None, *, expected: Route | None,
    ) -> Route:
        """Write a host's route. `expected` is the route the caller read (None: there
        was none); `Conflict` if it changed since."""
        with self.tx() as c:
            if expected is None:
                try:
                    c.execute("INSERT INTO routes(host, instance, state, port, generation_id)"
                              " VALUES (?, ?, ?, ?, ?)",
                              (host, instance, state.value, port, generation_id))
                except sqlite3.IntegrityError as exc:
                    raise Conflict(f"the route of {host} was written under us") from exc
            else:
                check(expected.state, state)
                cur = c.execute(
                    "UPDATE routes SET instance=?, state=?, port=?, generation_id=?,"
                    " version=version+1 WHERE host=? AND version=?",
                    (instance, state.value, port, generation_id, host, expected.version))
                if cur.rowcount != 1:
                    raise Conflict(f"the route of {host} changed under us")
            if host == instance:  # an instance's own row: its aliases say the same
                mirror_aliases(c, instance)
        route = self.get_route(host)
        assert route is not None
        return route

    def _put_route(self, c: sqlite3.Connection, host: str, state: RouteState,
                   port: int | None, generation_id: int | None) -> None:
        """A host's own route, inside an intent's transaction."""
        c.execute(
            "INSERT INTO routes(host, instance, state, port, generation_id)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT(host) DO UPDATE SET"
            " instance=excluded.instance, state=excluded.state, port=excluded.port,"
            " generation_id=excluded.generation_id, version=routes.version+1",
            (host, host, state.value, port, generation_id),
        )
        mirror_aliases(c, host)

    def get_route(self, host: str) -> Route | None:
        row = self._one("SELECT * FROM routes WHERE host=?", host)
        return _route(row) if row else None

    def list_routes(self) -> list[Route]:
        return [_route(r) for r in self._all("SELECT * FROM routes ORDER BY host")]


def _generation(r: sqlite3.Row) -> Generation:
    return Generation(
        id=r["id"], app=r["app"], instance=r["instance"], service=r["service"],
        release=r["release"], build_digest=r["build_digest"], op_id=r["op_id"],
        state=GenState(r["state"]), pid=r["pid"], start_ticks=r["start_ticks"], port=r["port"],
        created_at=r["created_at"], exited_at=r["exited_at"], exit_code=r["exit_code"],
        version=r["version"],
    )


def _crash_retry(r: sqlite3.Row) -> CrashRetry:
    return CrashRetry(r["instance"], r["service"], r["generation_id"], r["failures"],
                      r["crashed_at"], r["retry_at"])


def _active(r: sqlite3.Row) -> Active:
    return Active(r["instance"], r["service"], r["generation_id"], r["version"])


def _route(r: sqlite3.Row) -> Route:
    return Route(r["host"], r["instance"], RouteState(r["state"]), r["port"],
                 r["generation_id"], r["version"])
