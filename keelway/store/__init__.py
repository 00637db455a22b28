"""Durable records: schema, lifecycles, the `Store` protocol and its SQLite store."""

from keelway.store.sqlite import SqliteStore
from keelway.store.store import Conflict, DiskFull, NotFound, StaleSchedule, Store, StoreError

__all__ = ["Conflict", "DiskFull", "NotFound", "SqliteStore", "StaleSchedule", "Store",
           "StoreError"]
