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

from typing import Any

from keelway.store.base import Conflict, NotFound, StoreError
from keelway.store.catalog import Catalog
from keelway.store.journal import Journal
from keelway.store.processes import Processes

__all__ = ["Conflict", "NotFound", "Store", "StoreError"]


class Store(Catalog, Journal, Processes):
    """The whole store: one SQLite connection, its parts' methods side by side."""

    def dump(self) -> dict[str, list[dict[str, Any]]]:
        """Every row of every table except events and the journal: what tests compare."""
        out: dict[str, list[dict[str, Any]]] = {}
        for table in ("apps", "instances", "builds", "releases", "active", "inhibitions",
                      "port_claims", "routes", "fences"):
            out[table] = [dict(r) for r in self._all(f"SELECT * FROM {table} ORDER BY 1, 2")]
        return out
