"""The store's fences: one row per instance that was ever fenced (table `fences`).

Rules: a fence's generation only grows (each `fence` bumps it, in SQL, so two writers
never hand out one generation twice); `unfence` lifts only the generation it names, so a
lift from a holder whose fence was superseded by a newer one changes nothing. The
`instances.fence` column of migration 1 is not used: the row here is the one record.
"""

from __future__ import annotations

import sqlite3

from keelway.store.base import NotFound, StoreBase
from keelway.store.records import Fence


class Fences(StoreBase):
    """Fences of instances."""

    def get_fence(self, instance: str) -> Fence | None:
        row = self._one("SELECT * FROM fences WHERE instance=?", instance)
        return _fence(row) if row else None

    def fenced(self, instance: str) -> bool:
        row = self._one("SELECT held FROM fences WHERE instance=?", instance)
        return bool(row and row["held"])

    def fenced_instances(self) -> set[str]:
        """Every instance a fence holds, in one query (the bulk view reads it)."""
        return {r[0] for r in self._all("SELECT instance FROM fences WHERE held=1")}

    def fence(self, instance: str, reason: str | None) -> Fence:
        with self.tx() as c:
            if self._one("SELECT 1 FROM instances WHERE host=?", instance) is None:
                raise NotFound(f"instance {instance}")
            c.execute(
                "INSERT INTO fences(instance, generation, held, reason, updated_at)"
                " VALUES (?, 1, 1, ?, ?) ON CONFLICT(instance) DO UPDATE SET"
                " generation=fences.generation+1, held=1, reason=excluded.reason,"
                " updated_at=excluded.updated_at",
                (instance, reason, self.clock.now()))
            fence = self.get_fence(instance)
        assert fence is not None  # written inside this transaction
        return fence

    def unfence(self, instance: str, generation: int) -> tuple[Fence | None, bool]:
        with self.tx() as c:
            cur = c.execute(
                "UPDATE fences SET held=0, updated_at=? WHERE instance=? AND generation=?"
                " AND held=1", (self.clock.now(), instance, generation))
            lifted = cur.rowcount == 1
            fence = self.get_fence(instance)
        return fence, lifted


def _fence(r: sqlite3.Row) -> Fence:
    return Fence(r["instance"], r["generation"], bool(r["held"]), r["reason"], r["updated_at"])
