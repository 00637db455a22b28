"""The SQLite store's rollouts: the journal of one release's way across an app's
instances (issue #19; SPEC §4 Deployer), tables `rollouts` and `rollout_hosts`. The
steps that write them are keelway/deploy/rollouts.py.

Rules, each kept inside one transaction:
- A rollout's cohorts are fixed when it begins; what moves is where it stands (its
  state, its cohort, the figures its last bake was judged on) and each host's state.
- Beginning a rollout supersedes, in the same write, every rollout of the app that has
  not ended: one app has at most one rollout that may still act, so a newer release's
  analysis never reads an older one's figures, and nothing resumes a superseded one.
- The rollout's state moves along `RolloutState`'s table (keelway/store/lifecycle.py)
  by compare-and-swap on its version; a host's state is a fact its attempt reports
  (one write for many hosts: a cohort begins in one write), and never bumps the version.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Sequence

import msgspec

from keelway.journal import OpKind
from keelway.store.db import Db, swap
from keelway.store.errors import NotFound
from keelway.store.lifecycle import RolloutState, check


class HostState(enum.StrEnum):
    """One instance's place in a rollout."""

    PENDING = "pending"  # its cohort has not begun
    # Its attempt began; a crash here leaves its operation's journal to say how it
    # ended (the instance's release then tells rolled from failed).
    ROLLING = "rolling"
    ROLLED = "rolled"  # on the release (a parked one: the release pending for its wake)
    FAILED = "failed"  # its attempt failed: it fell back as its mode says
    REVERTED = "reverted"  # taken back to the release before, by `rollout abort`


# A rollout that may still act: superseded by the next one the app begins.
OPEN = frozenset({RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.HALTED})


class RolloutCohort(msgspec.Struct, frozen=True):
    """Hosts that take the release together; `judged`: a bake follows (not for parked
    instances, which serve nothing until their wake)."""

    hosts: tuple[str, ...]
    judged: bool = True


class HostFigures(msgspec.Struct, frozen=True):
    host: str
    responses: int
    errors: int


class Figures(msgspec.Struct, frozen=True):
    """What a cohort's bake was judged on (keelway/deploy/cohorts.py `judge`), as
    `rollout status` shows it."""

    cohort: int
    verdict: str
    responses: int
    errors: int
    budget: str
    said: str
    by_host: tuple[HostFigures, ...] = ()


class RolloutHost(msgspec.Struct, frozen=True):
    host: str
    cohort: int
    state: HostState
    reason: str | None = None


class RolloutJournal(msgspec.Struct, frozen=True):
    """One rollout: release `release` of `app` (by a deploy, config or rollback:
    `kind`), over `cohorts`; `previous` is the release an abort takes rolled instances
    back to (None: there was none). `cohort` is the one under way, or where it stopped;
    `reason` why it stopped; `hosts` in cohort order."""

    id: int
    app: str
    release: int
    previous: int | None
    kind: OpKind
    state: RolloutState
    cohorts: tuple[RolloutCohort, ...]
    # The release's own `--rollout KEY=VALUE` over the app's [rollout], as given: a
    # resume judges by them again.
    overrides: tuple[tuple[str, str], ...]
    cohort: int
    hosts: tuple[RolloutHost, ...]
    reason: str | None
    figures: Figures | None
    created_at: float
    updated_at: float
    version: int

    def in_state(self, *states: HostState) -> list[str]:
        return [h.host for h in self.hosts if h.state in states]

    def host(self, name: str) -> RolloutHost | None:
        return next((h for h in self.hosts if h.host == name), None)


_cohorts = msgspec.json.Decoder(tuple[RolloutCohort, ...])
_figures = msgspec.json.Decoder(Figures)
_overrides = msgspec.json.Decoder(tuple[tuple[str, str], ...])


class SqliteRollouts:
    """Rollouts and their hosts (`RolloutStore`)."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def begin_rollout(self, app: str, release: int, previous: int | None, kind: OpKind,
                      cohorts: Sequence[RolloutCohort],
                      overrides: Sequence[tuple[str, str]] = ()) -> RolloutJournal:
        now = self.db.clock.now()
        with self.db.tx(f"begin the rollout of release {release} of {app}") as c:
            open_ = ", ".join("?" for _ in OPEN)
            c.execute(f"UPDATE rollouts SET state=?, reason=?, updated_at=?, "
                      f"version=version+1 WHERE app=? AND state IN ({open_})",
                      (RolloutState.SUPERSEDED.value, f"release {release} superseded it",
                       now, app, *(s.value for s in OPEN)))
            cur = c.execute(
                "INSERT INTO rollouts(app, release, previous, kind, state, cohorts, overrides, "
                "cohort, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
                (app, release, previous, kind.value, RolloutState.RUNNING.value,
                 msgspec.json.encode(tuple(cohorts)).decode(),
                 msgspec.json.encode(tuple(overrides)).decode(), now, now))
            rollout_id = int(cur.lastrowid or 0)
            c.executemany(
                "INSERT INTO rollout_hosts(rollout_id, host, cohort, seq, state) "
                "VALUES (?, ?, ?, ?, ?)",
                [(rollout_id, host, n, seq, HostState.PENDING.value)
                 for seq, (n, host) in enumerate(
                     (n, host) for n, cohort in enumerate(cohorts) for host in cohort.hosts)])
        journal = self.get_rollout(rollout_id)
        assert journal is not None
        return journal

    def get_rollout(self, rollout_id: int) -> RolloutJournal | None:
        row = self.db.row("SELECT * FROM rollouts WHERE id=?", rollout_id)
        return self._journal(row) if row else None

    def latest_rollout(self, app: str) -> RolloutJournal | None:
        row = self.db.row("SELECT * FROM rollouts WHERE app=? ORDER BY id DESC LIMIT 1", app)
        return self._journal(row) if row else None

    def running_rollouts(self) -> list[RolloutJournal]:
        return [self._journal(r) for r in self.db.rows(
            "SELECT * FROM rollouts WHERE state=? ORDER BY id", RolloutState.RUNNING.value)]

    def rollout_counts(self) -> list[tuple[str, RolloutState, int]]:
        return [(r["app"], RolloutState(r["state"]), r["n"]) for r in self.db.rows(
            "SELECT app, state, COUNT(*) AS n FROM rollouts GROUP BY app, state"
            " ORDER BY app, state")]

    def mark_rollout_hosts(self, rollout_id: int, hosts: Sequence[str], state: HostState,
                           reason: str | None = None) -> None:
        with self.db.tx(f"mark {len(hosts)} hosts {state} in rollout {rollout_id}",
                        missing=f"no rollout {rollout_id}") as c:
            if c.execute("SELECT 1 FROM rollouts WHERE id=?", (rollout_id,)).fetchone() is None:
                raise NotFound(f"no rollout {rollout_id}")
            c.executemany("UPDATE rollout_hosts SET state=?, reason=? "
                          "WHERE rollout_id=? AND host=?",
                          [(state.value, reason, rollout_id, host) for host in hosts])

    def move_rollout(self, rollout: RolloutJournal, state: RolloutState, *,
                     cohort: int | None = None, reason: str | None = None,
                     figures: Figures | None = None) -> RolloutJournal:
        check(rollout.state, state)
        with self.db.tx(f"move rollout {rollout.id} to {state}") as c:
            swap(c, "rollouts", {"id": rollout.id}, rollout.version,
                 f"rollout {rollout.id} changed under us", state=state.value,
                 cohort=rollout.cohort if cohort is None else cohort, reason=reason,
                 figures=(msgspec.json.encode(figures).decode() if figures is not None
                          else None), updated_at=self.db.clock.now())
        moved = self.get_rollout(rollout.id)
        assert moved is not None
        return moved

    def _journal(self, r: sqlite3.Row) -> RolloutJournal:
        hosts = tuple(
            RolloutHost(h["host"], h["cohort"], HostState(h["state"]), h["reason"])
            for h in self.db.rows("SELECT * FROM rollout_hosts WHERE rollout_id=? "
                                  "ORDER BY seq", r["id"]))
        return RolloutJournal(
            r["id"], r["app"], r["release"], r["previous"], OpKind(r["kind"]),
            RolloutState(r["state"]), _cohorts.decode(r["cohorts"]),
            _overrides.decode(r["overrides"]), r["cohort"], hosts,
            r["reason"], _figures.decode(r["figures"]) if r["figures"] else None,
            r["created_at"], r["updated_at"], r["version"])
