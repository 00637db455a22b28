"""The in-memory store's rollouts (RolloutStore): the same rules as
keelway/store/rollouts.py, each write atomic in `MemoryDb.write`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from keelway.journal import OpKind
from keelway.store import rollouts as kept
from keelway.store.errors import Conflict, NotFound
from keelway.store.lifecycle import RolloutState, check
from keelway.testing.memory_tables import MemoryDb, owned_where


@dataclass(eq=False)
class MemoryRollouts:
    """Each rollout one record, its hosts inside it (SQLite: `rollout_hosts`)."""

    _db: MemoryDb

    def begin_rollout(self, app: str, release: int, previous: int | None, kind: OpKind,
                      cohorts: Sequence[kept.RolloutCohort],
                      overrides: Sequence[tuple[str, str]] = ()) -> kept.RolloutJournal:
        now = self._db.clock.now()
        with self._db.write() as t:
            for old in list(t.rollouts.values()):
                if old.app == app and old.state in kept.OPEN:
                    t.rollouts[old.id] = msgspec.structs.replace(
                        old, state=RolloutState.SUPERSEDED,
                        reason=f"release {release} superseded it", updated_at=now,
                        version=old.version + 1)
            t.last_rollout += 1
            hosts = tuple(kept.RolloutHost(host, n, kept.HostState.PENDING)
                          for n, cohort in enumerate(cohorts) for host in cohort.hosts)
            journal = kept.RolloutJournal(t.last_rollout, app, release, previous, kind,
                                     RolloutState.RUNNING, tuple(cohorts),
                                     tuple((k, v) for k, v in overrides), 0, hosts, None,
                                     None, now, now, 1)
            t.rollouts[journal.id] = journal
            return journal

    def get_rollout(self, rollout_id: int) -> kept.RolloutJournal | None:
        return self._db.tables.rollouts.get(rollout_id)

    def latest_rollout(self, app: str) -> kept.RolloutJournal | None:
        mine = owned_where(self._db.tables.rollouts, lambda r: r.app == app, lambda r: r.id)
        return mine[-1] if mine else None

    def running_rollouts(self) -> list[kept.RolloutJournal]:
        return owned_where(self._db.tables.rollouts,
                           lambda r: r.state is RolloutState.RUNNING, lambda r: r.id)

    def rollout_counts(self) -> list[tuple[str, RolloutState, int]]:
        counted = Counter((r.app, r.state) for r in self._db.tables.rollouts.values())
        return [(app, state, n) for (app, state), n in sorted(counted.items())]

    def mark_rollout_hosts(self, rollout_id: int, hosts: Sequence[str], state: kept.HostState,
                           reason: str | None = None) -> None:
        with self._db.write() as t:
            have = t.rollouts.get(rollout_id)
            if have is None:
                raise NotFound(f"no rollout {rollout_id}")
            marked = set(hosts)
            t.rollouts[rollout_id] = msgspec.structs.replace(have, hosts=tuple(
                msgspec.structs.replace(h, state=state, reason=reason) if h.host in marked
                else h for h in have.hosts))

    def move_rollout(self, rollout: kept.RolloutJournal, state: RolloutState, *,
                     cohort: int | None = None, reason: str | None = None,
                     figures: kept.Figures | None = None) -> kept.RolloutJournal:
        check(rollout.state, state)
        with self._db.write() as t:
            have = t.rollouts.get(rollout.id)
            if have is None or have.version != rollout.version:
                raise Conflict(f"rollout {rollout.id} changed under us")
            moved = msgspec.structs.replace(
                have, state=state, cohort=have.cohort if cohort is None else cohort,
                reason=reason, figures=figures, updated_at=self._db.clock.now(),
                version=have.version + 1)
            t.rollouts[rollout.id] = moved
            return moved
